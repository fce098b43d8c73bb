"""Checkpoint profiles (profiles/checkpoints/*.toml): model shape, dtypes, layout, and their arithmetic."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, replace

from ckptbench.core.errors import CkptbenchError
from ckptbench.core.options import FORMATS
from ckptbench.core.paths import PROFILES_DIR

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAX_SMALL_FILES = 1 << 20
# the bounds a checkpoint's shape is held to, in a profile and in a manifest alike
DIM_LIMITS = {"layers": 4096, "hidden": 1 << 17, "heads": 4096, "vocab": 1 << 22, "seq_len": 1 << 22}
MAX_RANK = 1 << 20


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
        raise CkptbenchError(f"{path}: {key} must be a whole number {low}..{high}, got {v!r}; compare with small.toml")
    return v


def load(name: str) -> Profile:
    """A profile by name, or by path to a .toml file."""
    path = name if name.endswith(".toml") else os.path.join(PROFILES_DIR, "checkpoints", f"{name}.toml")
    if not os.path.isfile(path):
        raise CkptbenchError(f"unknown profile {name!r}: choose one of {', '.join(available())} or a .toml path")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        m, d, c = doc["model"], doc["dtypes"], doc["checkpoint"]
        profile = Profile(
            name=doc["name"],
            description=doc.get("description", ""),
            reference=bool(doc.get("reference", False)),
            dims=ModelDims(**{k: _whole(path, f"model.{k}", m[k], 1, high) for k, high in DIM_LIMITS.items()}),
            weights_dtype=d["weights"],
            optimizer_dtype=d["optimizer"],
            format=c["format"],
            world_size=_whole(path, "checkpoint.world_size", c["world_size"], 1, MAX_RANK),
            small_files=_whole(path, "checkpoint.small_files", c["small_files"], 0, MAX_SMALL_FILES),
        )
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CkptbenchError(f"{path}: not a valid profile ({type(exc).__name__}: {exc}); compare with small.toml") from None
    if profile.format not in FORMATS:
        raise CkptbenchError(f"{path}: unknown format {profile.format!r}; use one of {', '.join(FORMATS)}")
    for dt in (profile.weights_dtype, profile.optimizer_dtype):
        if dt not in DTYPE_BYTES:
            raise CkptbenchError(f"{path}: unknown dtype {dt!r}; use one of {', '.join(DTYPE_BYTES)}")
    if profile.dims.hidden % profile.dims.heads:
        raise CkptbenchError(f"{path}: hidden {profile.dims.hidden} is not a multiple of heads {profile.dims.heads}")
    return profile
