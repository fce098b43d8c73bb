"""A checkpoint's members, whether they stand alone or sit in a pack: the pack tables a manifest declares, checked,
and a member's bytes read straight from its pack.

Every name, offset and size in a manifest is hostile until checked: names must be plain relative paths, every
record must lie inside its pack's declared size, no two members overlap, and every read goes through `confine`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ckptbench.checkpoint import confine
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.quote import quote
from ckptbench.core.errors import CkptbenchError

FILE_KINDS = ("model", "optimizer", "meta", "small")  # what a file (or a pack member) may be; "pack" is a pack
_CRAFTED = "refusing it (the checkpoint may be crafted: check where it came from)"


def safe_member(name, where: str = "the pack") -> str:
    """A member name that stays inside its directory once joined: relative and canonical ("a/b": no empty, "." or
    ".." part), no NUL or backslash, no drive. One line naming `where` otherwise."""
    if not confine.is_plain(name):
        raise CkptbenchError(f"{where}: member {quote(name)} is not a plain relative path and could land outside its "
                             f"directory; {_CRAFTED}", exit_code=1)
    return name


@dataclass(frozen=True)
class Member:
    """One file inside a pack: bytes [offset, offset + size) of the pack, checked against the pack's size."""

    rel: str
    offset: int
    size: int
    kind: str
    rank: int | None


@dataclass(frozen=True)
class PackTable:
    """A pack file, its declared size, and its members, checked: inside the pack, no two overlapping."""

    name: str
    size: int
    members: tuple[Member, ...]


def whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def refuse(where: str, what: str) -> CkptbenchError:
    return CkptbenchError(f"{where}: {what}; {_CRAFTED}", exit_code=1)


def _member(directory: str, pack_file: str, pack_size: int, rel, record) -> Member:
    """A member record ([offset, size, kind, rank]) checked on its own: whole numbers, inside the pack."""
    where = os.path.join(directory, pack_file)
    if not isinstance(record, (list, tuple)) or not 2 <= len(record) <= 4:
        raise refuse(where, f"member {quote(rel)} has no [offset, size, kind, rank] record")
    off, size = record[0], record[1]
    kind = record[2] if len(record) > 2 else "small"
    rank = record[3] if len(record) > 3 else None
    if not whole(off) or not whole(size):
        raise refuse(where, f"member {quote(rel)} has offset {quote(off)} and size {quote(size)}, not whole numbers "
                            "of bytes")
    if off + size > pack_size:
        raise refuse(where, f"member {quote(rel)} lies at {off}+{size}, past the pack's {pack_size} bytes")
    if kind not in FILE_KINDS or (rank is not None and not whole(rank)):
        raise refuse(where, f"member {quote(rel)} has kind {quote(kind)} and rank {quote(rank)}")
    return Member(safe_member(rel, where), off, size, kind, rank)


def _packs_of(directory: str, man: mf.Manifest) -> dict:
    if not isinstance(man.packs, dict) or not all(isinstance(i, dict) for i in man.packs.values()):
        raise refuse(os.path.join(directory, mf.MANIFEST_NAME), "its packs table is not {pack: {member: record}}")
    return man.packs


_INDEXED: tuple = (None, None)  # (the manifest last looked up, its _Index): a load reads every member of one


@dataclass(frozen=True)
class _Index:
    size: dict  # pack file -> the size its first "pack" entry in the file list declares
    home: dict  # member -> the first pack whose table names it


def _index(man: mf.Manifest) -> _Index:
    """Lookups a scan of the file list or the pack tables answered per call: with a file and a member per manifest
    line, reading every member cost lines squared (10**5 members: 10**10 steps)."""
    global _INDEXED
    cached, index = _INDEXED
    if cached is man:
        return index
    size: dict = {}
    for e in man.files:
        if e.kind == "pack":
            size.setdefault(e.path, e.bytes)
    home: dict = {}
    for pack_file, table in man.packs.items():
        for rel in table:
            home.setdefault(rel, pack_file)
    index = _Index(size, home)
    _INDEXED = (man, index)
    return index


def _pack_size(directory: str, man: mf.Manifest, pack_file) -> int:
    """The size the manifest's file list declares for a pack (packs come first there): an unlisted one is refused."""
    safe_member(pack_file, directory)
    size = _index(man).size.get(pack_file)
    if not whole(size):
        raise refuse(os.path.join(directory, mf.MANIFEST_NAME),
                     f"pack {quote(pack_file)} is not listed with a size among its files")
    return size


def pack_tables(directory: str, man: mf.Manifest) -> list[PackTable]:
    """Every pack of a manifest with its members, all checked before anything is read: names, whole-number offsets
    and sizes inside the pack's declared size, no overlap; a file listed as a pack must have a table. Names across
    packs and files are checked by pack and unpack (packs.py)."""
    packs = _packs_of(directory, man)
    tables = []
    for pack_file, index in packs.items():
        size = _pack_size(directory, man, pack_file)
        members = [_member(directory, pack_file, size, rel, rec) for rel, rec in index.items()]
        end, prev = 0, None
        for m in sorted(members, key=lambda m: (m.offset, m.size)):
            if m.offset < end:
                raise refuse(os.path.join(directory, pack_file),
                             f"members {quote(prev.rel)} and {quote(m.rel)} overlap")
            if m.size:
                end, prev = m.offset + m.size, m
        tables.append(PackTable(pack_file, size, tuple(members)))
    unlisted = [e.path for e in man.files if e.kind == "pack" and (not isinstance(e.path, str) or e.path not in packs)]
    if unlisted:
        raise refuse(os.path.join(directory, mf.MANIFEST_NAME), f"pack {quote(unlisted[0])} has no member table")
    return tables


def read_member(directory: str, man: mf.Manifest | None, rel: str, most: tuple[int, str] | None = None) -> bytes:
    """A file's bytes whether it stands alone or sits in a pack, read through confine: a packed member's record is
    checked against the pack's declared size, and the read never leaves [offset, offset + size); `most` as
    confine.read_member takes it."""
    if man is not None:
        packs = _packs_of(directory, man)
        pack_file = _index(man).home.get(rel)
        if pack_file is not None:
            size = _pack_size(directory, man, pack_file)
            m = _member(directory, pack_file, size, rel, packs[pack_file][rel])
            return confine.read_member(directory, pack_file, size, offset=m.offset, length=m.size, most=most)
    return confine.read_member(directory, rel, most=most)
