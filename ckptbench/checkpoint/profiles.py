"""Checkpoint profiles (profiles/checkpoints/*.toml): model shape, dtypes, layout, and their arithmetic."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ckptbench.core.errors import CkptbenchError, printable, shown
from ckptbench.core.options import FORMATS
from ckptbench.core.paths import PROFILES_DIR, read_toml

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAX_SMALL_FILES = 1 << 20
# the bounds a checkpoint's shape is held to, in a profile and in a manifest alike
DIM_LIMITS = {"layers": 4096, "hidden": 1 << 17, "heads": 4096, "vocab": 1 << 22, "seq_len": 1 << 22}
MAX_RANK = 1 << 20
PROFILE_MAX = 64 << 10  # a profile is a few dozen lines: a larger file is not one (and is never read whole)
MAX_NAME, MAX_TEXT = 64, 200  # the name heads plan's first line; the description is a line


@dataclass(frozen=True)
class ModelDims:
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int

    @property
    def param_count(self) -> int:
        """GPT with learned positions and an untied head: embeddings, L blocks, final norm, head."""
        h = self.hidden
        block = 12 * h * h + 13 * h  # qkv + proj + 4h MLP weights and biases, two LayerNorms
        return self.vocab * h + self.seq_len * h + self.layers * block + 2 * h + self.vocab * h


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    reference: bool
    dims: ModelDims
    weights_dtype: str
    optimizer_dtype: str
    format: str
    world_size: int
    small_files: int

    @property
    def weights_bytes(self) -> int:
        return self.dims.param_count * DTYPE_BYTES[self.weights_dtype]

    @property
    def optimizer_bytes(self) -> int:
        # master weights, exp_avg and exp_avg_sq
        return 3 * self.dims.param_count * DTYPE_BYTES[self.optimizer_dtype]

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.optimizer_bytes

    def scaled(self, factor: float) -> "Profile":
        """Resizes the model by about `factor` in bytes (hidden and vocab scale as sqrt; layers stay)."""
        if factor <= 0:
            raise CkptbenchError(f"--scale must be positive, got {factor}")
        r = factor**0.5
        heads = self.dims.heads
        hidden = max(heads * 8, int(round(self.dims.hidden * r / (heads * 8))) * heads * 8)
        vocab = max(256, int(round(self.dims.vocab * r / 64)) * 64)
        return replace(self, dims=replace(self.dims, hidden=hidden, vocab=vocab))


def available() -> list[str]:
    folder = os.path.join(PROFILES_DIR, "checkpoints")
    return sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".toml"))


def _whole(path: str, key: str, v, low: int, high: int) -> int:
    """A count the profile gives: a whole number in low..high (0 heads or ranks divided by zero, -4 layers went
    negative)."""
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        # shown: a 400-digit count was printed whole
        raise CkptbenchError(f"{printable(path)}: {key} must be a whole number {low}..{high}, got "
                             f"{shown(repr(v), 60)}; compare with small.toml")
    return v


def _text(path: str, key: str, v, most: int, least: int = 1) -> str:
    """A string the profile gives, one line of at most `most` characters that a terminal shows as it is (a name
    holding ESC]0;…BEL retitled the terminal from plan's first line)."""
    if not isinstance(v, str) or not least <= len(v) <= most or printable(v) != v:
        raise CkptbenchError(f"{printable(path)}: {key} must be one line of text of {least}..{most} characters, got "
                             f"{shown(repr(v), 60)}; compare with small.toml")
    return v


def _doc(path: str) -> dict:
    """The profile's TOML, read as a storage preset is: a small regular file, never blocking, nested within reason."""
    return read_toml(path, PROFILE_MAX, "checkpoint profile", "compare with small.toml")


def load(name: str) -> Profile:
    """A profile by name, or by path to a .toml file; every field checked as input from elsewhere."""
    path = name if name.endswith(".toml") else os.path.join(PROFILES_DIR, "checkpoints", f"{name}.toml")
    if not os.path.isfile(path):
        import difflib
        import shlex

        if os.path.isdir(name):  # `plan /fsx/ckpt`: sizes are read off a checkpoint on disk by inspect
            raise CkptbenchError(f"{shown(name, 120)}: a directory, not a profile (one of {', '.join(available())} or a "
                                 f".toml path); what a checkpoint on disk holds: `ckptbench inspect "
                                 f"{shlex.quote(printable(name))}`")
        near = difflib.get_close_matches(name.lower(), available(), 1)
        guess = f"; did you mean {near[0]!r}?" if near else ""
        raise CkptbenchError(f"unknown profile {shown(repr(name), 120)}{guess} (choose one of {', '.join(available())} "
                             "or a .toml path)")
    doc = _doc(path)
    try:
        m, d, c = doc["model"], doc["dtypes"], doc["checkpoint"]
        if not all(isinstance(t, dict) for t in (m, d, c)):
            raise TypeError("model, dtypes and checkpoint must be tables")
        reference = doc.get("reference", False)
        if not isinstance(reference, bool):
            raise CkptbenchError(f"{printable(path)}: reference must be true or false, got "
                                 f"{shown(repr(reference), 60)}; compare with small.toml")
        profile = Profile(
            name=_text(path, "name", doc["name"], MAX_NAME),
            description=_text(path, "description", doc.get("description", ""), MAX_TEXT, least=0),
            reference=reference,
            dims=ModelDims(**{k: _whole(path, f"model.{k}", m[k], 1, high) for k, high in DIM_LIMITS.items()}),
            weights_dtype=_choice(path, "dtypes.weights", d["weights"], DTYPE_BYTES),
            optimizer_dtype=_choice(path, "dtypes.optimizer", d["optimizer"], DTYPE_BYTES),
            format=_choice(path, "checkpoint.format", c["format"], FORMATS),
            world_size=_whole(path, "checkpoint.world_size", c["world_size"], 1, MAX_RANK),
            small_files=_whole(path, "checkpoint.small_files", c["small_files"], 0, MAX_SMALL_FILES),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CkptbenchError(f"{printable(path)}: not a valid profile ({type(exc).__name__}: "
                             f"{shown(printable(str(exc)), 120)}); compare with small.toml") from None
    if profile.dims.hidden % profile.dims.heads:
        raise CkptbenchError(f"{path}: hidden {profile.dims.hidden} is not a multiple of heads {profile.dims.heads}")
    return profile


def _choice(path: str, key: str, v, choices) -> str:
    if not isinstance(v, str) or v not in choices:
        what = "format" if key.endswith("format") else "dtype"
        raise CkptbenchError(f"{printable(path)}: {key}: unknown {what} {shown(repr(v), 60)}; use one of "
                             f"{', '.join(choices)}")
    return v
