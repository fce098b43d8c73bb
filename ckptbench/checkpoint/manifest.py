"""The manifest (ckptbench.json): every file's size and digest, its rank and role, and the model it holds.

A manifest comes with the checkpoint, so it is hostile until checked: `parse` checks it whole against its
schema (every field's type and range, below) and refuses it in one line naming the field, before anything
reads a value from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass, field

from ckptbench.checkpoint import confine
from ckptbench.core import jsontext
from ckptbench.core.errors import CkptbenchError, naming
from ckptbench.checkpoint.profiles import DIM_LIMITS, DTYPE_BYTES, FORMATS, MAX_RANK

MANIFEST_NAME = "ckptbench.json"
VERSION = 1
MAX_BYTES = 64 << 20
DIGEST_HEX = {"none": 0, "crc32c": 8, "xxh64": 16, "md5": 32, "sha256": 64}  # fastio.HASHES and their hex lengths
KINDS = ("model", "optimizer", "meta", "small", "pack")
MEMBER_KINDS = ("model", "optimizer", "meta", "small")  # what a pack member may be
# Upper bounds a model shape may reach: generous for real models, small enough that building one is quick.
MAX_TEXT = 1024
MAX_PATH = 64 << 10  # a generous bound on a path's length; where the path lies is confine's check
_INT64 = 1 << 63


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the checkpoint directory, "/"-separated
    bytes: int
    digest: str | None  # lowercase hex of the manifest's hash; None when that hash is "none"
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
        try:
            with naming(path), open(tmp, "w") as f:
                json.dump(self.to_json(), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # no half-written manifest left beside the checkpoint
            raise
        os.replace(tmp, path)

    def by_kind(self, kind: str) -> list[FileEntry]:
        return [f for f in self.files if f.kind == kind]


def read(directory: str) -> Manifest | None:
    """The manifest of a checkpoint, or None when it has none (a checkpoint ckptbench did not write).

    Opened through `confine` (a regular file inside the directory, no blocking open) and refused above
    MAX_BYTES before it is read."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.exists(path):
        return None
    fd = confine.open_member(directory, MANIFEST_NAME)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_BYTES:
            raise _bad(path, f"is {size} bytes, over the {MAX_BYTES}-byte limit for a manifest")
        raw = bytearray()
        while len(raw) <= MAX_BYTES:  # a file that grows while read is still cut off, and refused by parse
            chunk = os.read(fd, min(MAX_BYTES + 1 - len(raw), 16 << 20))
            if not chunk:
                break
            raw += chunk
    except OSError as exc:
        raise CkptbenchError(f"{path}: unreadable manifest ({exc.strerror}); regenerate it or remove it") from None
    finally:
        os.close(fd)
    return parse(bytes(raw), path)


def unlisted(directory: str, man: Manifest | None) -> str | None:
    """The first entry below `directory` that its manifest `man` does not list (nor is a folder on the way to one
    it lists), or None when the folder holds only what it lists: what gen --force and save's --keep may remove whole.
    The walk stops at the first such entry, so it is bounded by the manifest's own entries."""
    listed = {MANIFEST_NAME, *(f.path for f in man.files), *man.packs} if man is not None else {MANIFEST_NAME}
    folders = {rel.rsplit("/", i)[0] for rel in listed for i in range(1, rel.count("/") + 1)}
    stack = [""]
    while stack:
        below = stack.pop()
        with os.scandir(os.path.join(directory, below)) as it:
            for entry in it:
                rel = f"{below}/{entry.name}" if below else entry.name
                if entry.is_dir(follow_symlinks=False) and rel in folders:
                    stack.append(rel)
                elif not (entry.is_file(follow_symlinks=False) and rel in listed):
                    return rel
    return None


def _bad(where: str, what: str, exit_code: int | None = None) -> CkptbenchError:
    return CkptbenchError(f"{where}: manifest {what}; regenerate it (ckptbench gen) or remove it", exit_code=exit_code)


def _show(v) -> str:
    """A value as the error line shows it: short, one line."""
    text = json.dumps(v) if isinstance(v, (int, float, str, bool, type(None))) else type(v).__name__
    return text if len(text) <= 60 else text[:57] + "..."


class _Check:
    """The schema, field by field: each method returns the value checked, or raises naming the field.

    A manifest that is JSON but breaks the schema is content to refuse, as confine refuses a crafted path:
    exit 1, not a usage error."""

    def __init__(self, where: str):
        self.where = where

    def refuse(self, what: str):
        raise _bad(self.where, f"{what} (it may be crafted: check where the checkpoint came from)", exit_code=1)

    def whole(self, name: str, v, low: int = 0, high: int = _INT64 - 1) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
            self.refuse(f"field {name} is {_show(v)}, not a whole number in {low}..{high}")
        return v

    def text(self, name: str, v, choices: tuple[str, ...] | None = None, limit: int = MAX_TEXT) -> str:
        if not isinstance(v, str) or len(v) > limit or (choices is not None and v not in choices):
            expected = f"one of {', '.join(repr(c) for c in choices)}" if choices else f"a string of at most {limit} characters"
            self.refuse(f"field {name} is {_show(v)}, not {expected}")
        return v

    def mapping(self, name: str, v) -> dict:
        if not isinstance(v, dict):
            self.refuse(f"field {name} is {_show(v)}, not an object")
        return v

    def keys(self, name: str, doc: dict, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        missing = [k for k in required if k not in doc]
        unknown = [k for k in doc if k not in required + optional]
        if missing:
            self.refuse(f"{name}lacks field {missing[0]!r}")
        if unknown:
            self.refuse(f"{name}has unknown field {_show(unknown[0])}")

    def dims(self, v) -> dict:
        """{} (shape unknown) or every ModelDims field, in range, hidden a multiple of heads."""
        v = self.mapping("dims", v)
        if not v:
            return v
        self.keys("field dims ", v, tuple(DIM_LIMITS))
        for k, high in DIM_LIMITS.items():
            self.whole(f"dims.{k}", v[k], 1, high)
        if v["hidden"] % v["heads"]:
            self.refuse(f"field dims.hidden is {v['hidden']}, not a multiple of dims.heads ({v['heads']})")
        return v

    def digest(self, name: str, v, alg: str) -> str | None:
        n = DIGEST_HEX[alg]
        if n == 0 and v not in (None, ""):
            self.refuse(f"field {name} is {_show(v)}, not null (the manifest's hash is none)")
        if n and (not isinstance(v, str) or not re.fullmatch(f"[0-9a-f]{{{n}}}", v)):
            self.refuse(f"field {name} is {_show(v)}, not {n} lowercase hex digits (a {alg} digest)")
        return v

    def entry(self, i: int, e, alg: str) -> FileEntry:
        """One file: where it lies is checked where it is opened (confine), so a path here need only be a string."""
        name = f"files[{i}]"
        e = self.mapping(name, e)
        self.keys(f"field {name} ", e, ("path", "bytes", "digest", "kind"), ("rank",))
        rank = e.get("rank")
        return FileEntry(self.text(f"{name}.path", e["path"], limit=MAX_PATH),
                         self.whole(f"{name}.bytes", e["bytes"]), self.digest(f"{name}.digest", e["digest"], alg),
                         self.text(f"{name}.kind", e["kind"], KINDS),
                         None if rank is None else self.whole(f"{name}.rank", rank, 0, MAX_RANK))

    def files(self, v, alg: str) -> tuple[FileEntry, ...]:
        if not isinstance(v, list):
            self.refuse(f"field files is {_show(v)}, not a list")
        files = tuple(self.entry(i, e, alg) for i, e in enumerate(v))
        # one file listed N times was read, hashed and counted N times: 600k entries of one 10 GB shard fit the limit
        seen: set[str] = set()
        for i, f in enumerate(files):
            if f.path in seen:
                self.refuse(f"field files[{i}].path {_show(f.path)} is listed twice")
            seen.add(f.path)
        return files

    def record(self, pack_file: str, rel, rec) -> None:
        """[offset, size, kind, rank] (kind and rank optional); whether it lies inside its pack is packs' check."""
        what = f"pack {pack_file[:80]!r} member {str(rel)[:80]!r}"
        if not isinstance(rel, str) or len(rel) > MAX_PATH:
            self.refuse(f"{what}: the name is not a string")
        if not isinstance(rec, list) or not 2 <= len(rec) <= 4:
            self.refuse(f"{what} has {_show(rec)}, not an [offset, size, kind, rank] record")
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < _INT64 for x in rec[:2]):
            self.refuse(f"{what} has offset {_show(rec[0])} and size {_show(rec[1])}, not whole numbers")
        if len(rec) > 2 and rec[2] not in MEMBER_KINDS:
            self.refuse(f"{what} has kind {_show(rec[2])}, not one of {', '.join(MEMBER_KINDS)}")
        if len(rec) > 3 and rec[3] is not None and not (isinstance(rec[3], int) and not isinstance(rec[3], bool)
                                                         and 0 <= rec[3] <= MAX_RANK):
            self.refuse(f"{what} has rank {_show(rec[3])}, not a whole number in 0..{MAX_RANK}")

    def packs(self, v) -> dict:
        """pack file -> {member: record}: types and ranges here; names, bounds and overlaps in packs."""
        for pack_file, index in self.mapping("packs", v).items():
            if len(pack_file) > MAX_PATH:
                self.refuse(f"field packs names a pack {_show(pack_file)}, longer than a path")
            for rel, rec in self.mapping(f"packs[{_show(pack_file)}]", index).items():
                self.record(pack_file, rel, rec)
        return v


_REQUIRED = ("format", "profile", "dims", "param_count", "weights_dtype", "optimizer_dtype", "world_size", "seed",
             "hash", "files", "version")
_OPTIONAL = ("step", "packs")


def parse(raw: bytes, where: str) -> Manifest:
    """A manifest from its bytes (a local file's, or an S3 object's), checked whole against the schema."""
    if len(raw) > MAX_BYTES:
        raise _bad(where, f"is {len(raw)} bytes, over the {MAX_BYTES}-byte limit for a manifest")
    try:
        doc = jsontext.loads(raw)  # UTF-8 as ckptbench writes it: json.loads of bytes also took a BOM, UTF-16, -32
    except (ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else f"not valid JSON ({str(exc)[:80]})"
        raise _bad(where, f"is {why}") from None
    if not isinstance(doc, dict):
        raise _bad(where, f"is a JSON {type(doc).__name__}, not an object")
    if doc.get("version") != VERSION or isinstance(doc.get("version"), bool):
        raise _bad(where, f"version is {_show(doc.get('version'))}, this ckptbench reads version {VERSION}")
    c = _Check(where)
    c.keys("", doc, _REQUIRED, _OPTIONAL)
    alg = c.text("hash", doc["hash"], tuple(DIGEST_HEX))
    dims = c.dims(doc["dims"])
    return Manifest(
        format=c.text("format", doc["format"], (*FORMATS, "unknown")),
        profile=c.text("profile", doc["profile"]),
        dims=dims,
        param_count=c.whole("param_count", doc["param_count"]),
        # the model is built in weights_dtype only when the manifest gives its shape; otherwise it is a label
        weights_dtype=c.text("weights_dtype", doc["weights_dtype"], tuple(DTYPE_BYTES) if dims else None),
        optimizer_dtype=c.text("optimizer_dtype", doc["optimizer_dtype"]),
        world_size=c.whole("world_size", doc["world_size"], 0, MAX_RANK),
        seed=c.whole("seed", doc["seed"], -_INT64, (1 << 64) - 1),
        hash=alg,
        files=c.files(doc["files"], alg),
        step=c.whole("step", doc.get("step", 1)),
        packs=c.packs(doc.get("packs", {})),
        version=VERSION,
    )
