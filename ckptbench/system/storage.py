"""Storage presets (profiles/storage/*.toml), read and checked in one place: the ceilings and recommended mount
options the checklist holds a source to, the figures `plan --nodes` multiplies out, and which preset applies.

A preset may be a user's own .toml (`plan --storage PATH`): every field is checked as input from elsewhere."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from ckptbench.core.errors import CkptbenchError, printable, shown
from ckptbench.core.paths import PROFILES_DIR, read_toml

FOLDER = os.path.join(PROFILES_DIR, "storage")
EXAMPLE = "compare with profiles/storage/efs.toml"
MAX_FIGURE = 1e12  # beyond any real storage; 1e308 GB/s times the nodes was inf, and --json printed Infinity
MIN_FIGURE = 1e-4  # a rate of 1e-300 (GB/s, opens or GETs per second) made a floor of 10^300 s
PRESET_MAX = 64 << 10  # a preset is a few dozen lines: a larger file is not one (and is never read whole)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")  # a preset's name, a filesystem's, a URL scheme's, an option's
MAX_NAMES = 64
MAX_TEXT = 200  # a description or a mount option's value: a line, printed as it is


@dataclass(frozen=True)
class Preset:
    """A storage's known figures. The checklist's: ceiling_gbps, min_concurrency, small_file_bytes, mount_options,
    min_stripe_count. plan --nodes's: the client, aggregate and request-rate ceilings below."""

    name: str
    path: str
    description: str
    schemes: tuple[str, ...]  # the URL schemes and filesystems this storage is seen as (a run measured on another
    fs_types: tuple[str, ...]  # is not this storage's)
    source_contains: tuple[str, ...]  # hints in a mount's source that break ties between presets of one fs type
    ceiling_gbps: float
    min_concurrency: int
    small_file_bytes: int | None  # files under it cost a metadata round trip each (None: the checklist's default)
    client_gbps: float  # one node's mount or NIC (the ceiling where not given)
    shared: bool  # False: every node reads its own copy, nothing is shared between nodes
    aggregate_gbps: float | None  # the whole file system; None where nothing shared caps it
    metadata_ops_per_s: float | None  # opens and stats per second, file system wide
    per_prefix_get_per_s: float | None  # object stores: GET/HEAD per second per partitioned prefix
    prefixes: int
    part_bytes: int | None  # object stores: bytes per ranged GET
    per_connection_gbps: float | None
    head_per_file: bool  # a FUSE mount of an object store: every open is a HEAD as well
    mount_options: dict = field(default_factory=dict)
    min_stripe_count: int | None = None


def _path(name: str) -> str:
    path = name if name.endswith(".toml") else os.path.join(FOLDER, f"{name}.toml")
    if not os.path.isfile(path):
        known = sorted(n[:-5] for n in os.listdir(FOLDER) if n.endswith(".toml"))
        raise CkptbenchError(f"unknown storage preset {shown(repr(name), 120)}: choose one of {', '.join(known)} or a "
                             ".toml path")
    return path


def _number(doc: dict, path: str, key: str, *, whole: bool = False, default=None):
    """A positive finite number from the preset, or `default` when absent; one line naming file and field else."""
    if key not in doc:
        return default
    v = doc[key]
    least = 1 if whole else MIN_FIGURE
    # the range first: TOML's integers reach past a float's, and math.isfinite(10**400) raised OverflowError
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and least <= v <= MAX_FIGURE and math.isfinite(v)
    if ok and whole and v != int(v):
        ok = False
    if not ok:
        kind = f"a positive {'whole ' if whole else ''}number at most {MAX_FIGURE:g}"
        low = "" if whole else f" (and at least {MIN_FIGURE:g})"
        raise CkptbenchError(f"{printable(path)}: {key} must be {kind}, got {shown(repr(v), 60)}; fix the storage "
                             f"preset{low}")
    return int(v) if whole else float(v)


def _flag(doc: dict, path: str, key: str, default: bool) -> bool:
    v = doc.get(key, default)
    if not isinstance(v, bool):
        raise CkptbenchError(f"{printable(path)}: {key} must be true or false, got {shown(repr(v), 60)}; fix the "
                             "storage preset")
    return v


def _names(doc: dict, path: str, key: str) -> tuple[str, ...]:
    """Filesystem types, URL schemes or source hints: names, never empty (an empty one matched every run whose
    filesystem was not recorded, and every mount's source), never a terminal's escape (they are printed)."""
    v = doc.get(key, [])
    if not isinstance(v, list) or len(v) > MAX_NAMES or not all(isinstance(x, str) and NAME.fullmatch(x) for x in v):
        raise CkptbenchError(f"{printable(path)}: {key} must be a list of names (letters, digits, . _ + -); {EXAMPLE}")
    return tuple(v)


def _name(v, path: str) -> str:
    if not isinstance(v, str) or not NAME.fullmatch(v):
        raise CkptbenchError(f"{printable(path)}: name must be a short name (letters, digits, . _ + -); {EXAMPLE}")
    return v


def _line(v, path: str, key: str) -> str:
    if not isinstance(v, str) or len(v) > MAX_TEXT or printable(v) != v:
        raise CkptbenchError(f"{printable(path)}: {key} must be one line of text of at most {MAX_TEXT} characters; "
                             f"{EXAMPLE}")
    return v


def _options(doc: dict, path: str) -> dict:
    """Mount options, printed by the checklist as the fix: names to a flag, a number or a short word."""
    v = doc.get("mount_options", {})
    ok = isinstance(v, dict) and len(v) <= MAX_NAMES and all(isinstance(k, str) and NAME.fullmatch(k) for k in v)
    if ok:
        for k, x in v.items():
            if isinstance(x, str):
                _line(x, path, f"mount_options.{k}")
            elif not isinstance(x, (bool, int)) or (not isinstance(x, bool) and not 0 <= x <= MAX_FIGURE):
                ok = False
    if not ok:
        raise CkptbenchError(f"{printable(path)}: mount_options must be a table of option names to true/false, a "
                             f"number or a word; {EXAMPLE}")
    return dict(v)


def load(name: str) -> Preset:
    """A storage preset by name, or by path to a .toml file, every field validated."""
    path = _path(name)
    doc = read_toml(path, PRESET_MAX, "storage preset", EXAMPLE)  # small, regular, never blocking, nested in reason
    ceiling = _number(doc, path, "ceiling_gbps")
    if ceiling is None:
        raise CkptbenchError(f"{printable(path)}: ceiling_gbps is missing; {EXAMPLE}")
    preset = Preset(
        name=_name(doc.get("name", os.path.basename(path)[:-5]), path), path=path,
        description=_line(doc.get("description", ""), path, "description"),
        schemes=_names(doc, path, "schemes"), fs_types=_names(doc, path, "fs_types"),
        source_contains=_names(doc, path, "source_contains"),
        ceiling_gbps=ceiling,
        min_concurrency=_number(doc, path, "min_concurrency", whole=True, default=1),
        small_file_bytes=_number(doc, path, "small_file_bytes", whole=True),
        client_gbps=_number(doc, path, "client_gbps", default=ceiling),
        shared=_flag(doc, path, "shared", True),
        aggregate_gbps=_number(doc, path, "aggregate_gbps"),
        metadata_ops_per_s=_number(doc, path, "metadata_ops_per_s"),
        per_prefix_get_per_s=_number(doc, path, "per_prefix_get_per_s"),
        prefixes=_number(doc, path, "prefixes", whole=True, default=1),
        part_bytes=_number(doc, path, "part_bytes", whole=True),
        per_connection_gbps=_number(doc, path, "per_connection_gbps"),
        head_per_file=_flag(doc, path, "head_per_file", False),
        mount_options=_options(doc, path),
        min_stripe_count=_number(doc, path, "min_stripe_count", whole=True),
    )
    if not preset.shared and preset.aggregate_gbps is not None:
        raise CkptbenchError(f"{printable(path)}: aggregate_gbps on a preset with shared = false; remove one of them")
    if preset.per_prefix_get_per_s is not None and preset.part_bytes is None:
        raise CkptbenchError(f"{printable(path)}: per_prefix_get_per_s needs part_bytes (bytes per ranged GET); add it")
    return preset


def load_all() -> list[Preset]:
    """The presets shipped with ckptbench, in name order."""
    return [load(os.path.join(FOLDER, n)) for n in sorted(os.listdir(FOLDER)) if n.endswith(".toml")]


def match(presets: list[Preset], *, scheme: str | None, fs_type: str | None, source: str = "") -> Preset | None:
    """The preset for a source: by URL scheme, else by filesystem type with the source's hints breaking ties."""
    if scheme:
        return next((p for p in presets if scheme in p.schemes), None)
    if not fs_type:
        return None
    candidates = [p for p in presets if fs_type in p.fs_types]
    hinted = [p for p in candidates if p.source_contains and any(h in source for h in p.source_contains)]
    if hinted:
        return hinted[0]
    plain = [p for p in candidates if not p.source_contains]
    return plain[0] if plain else (candidates[0] if candidates else None)
