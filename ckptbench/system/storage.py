"""Storage presets (profiles/storage/*.toml): known ceilings and recommended mount options, and which one applies."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field

from ckptbench.core.errors import CkptbenchError
from ckptbench.core.paths import PROFILES_DIR


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    schemes: tuple[str, ...]
    fs_types: tuple[str, ...]
    source_contains: tuple[str, ...]
    ceiling_gbps: float
    min_concurrency: int
    small_file_bytes: int
    mount_options: dict = field(default_factory=dict)
    min_stripe_count: int | None = None


def load_all() -> list[Preset]:
    folder = os.path.join(PROFILES_DIR, "storage")
    out = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".toml"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                d = tomllib.load(f)
            out.append(Preset(d["name"], d.get("description", ""), tuple(d.get("schemes", ())),
                              tuple(d.get("fs_types", ())), tuple(d.get("source_contains", ())),
                              float(d["ceiling_gbps"]), int(d["min_concurrency"]), int(d["small_file_bytes"]),
                              dict(d.get("mount_options", {})), d.get("min_stripe_count")))
        except (OSError, tomllib.TOMLDecodeError, KeyError, ValueError) as exc:
            raise CkptbenchError(f"{path}: not a valid storage preset ({exc})") from None
    return out


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
