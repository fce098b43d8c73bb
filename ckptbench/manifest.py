"""The manifest (ckptbench.json): every file's size and digest, its rank and role, and the model it holds."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from ckptbench.errors import CkptbenchError

MANIFEST_NAME = "ckptbench.json"
VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the checkpoint directory, "/"-separated
    bytes: int
    digest: str
    kind: str  # model | optimizer | meta | small | pack
    rank: int | None = None


@dataclass(frozen=True)
class Manifest:
    format: str
    profile: str
    dims: dict
    param_count: int
    weights_dtype: str
    optimizer_dtype: str
    world_size: int
    seed: int
    hash: str
    files: tuple[FileEntry, ...]
    step: int = 1
    packs: dict = field(default_factory=dict)  # pack file -> {member: [offset, size]}
    version: int = VERSION

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["files"] = [asdict(f) for f in self.files]
        return doc

    def write(self, directory: str) -> None:
        path = os.path.join(directory, MANIFEST_NAME)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def by_kind(self, kind: str) -> list[FileEntry]:
        return [f for f in self.files if f.kind == kind]


def read(directory: str) -> Manifest | None:
    """The manifest of a checkpoint, or None when it has none (a checkpoint ckptbench did not write)."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return parse(f.read(), path)
    except OSError as exc:
        raise CkptbenchError(f"{path}: unreadable manifest ({exc.strerror}); regenerate it or remove it") from None


def parse(raw: bytes, where: str) -> Manifest:
    """A manifest from its bytes (a local file's, or an S3 object's)."""
    path = where
    try:
        doc = json.loads(raw)
        files = tuple(FileEntry(**e) for e in doc.pop("files"))
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')}, expected {VERSION}")
        return Manifest(files=files, **doc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CkptbenchError(f"{path}: unreadable manifest ({exc}); regenerate it or remove it") from None
