"""Packing a checkpoint's small files into a few large ones, and reading members straight from the packs."""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import replace

import fastio

from ckptbench import manifest as mf
from ckptbench import tree
from ckptbench.errors import CkptbenchError

PACKED_KINDS = ("small",)  # shards and format metadata stay files: loaders such as DCP's open them by path


def pack_name(i: int, n: int) -> str:
    return f"pack-{i + 1:05d}-of-{n:05d}.ckpack"


def safe_member(name: str) -> str:
    """A member name that stays inside its directory once joined: relative, no '..', no NUL."""
    norm = posixpath.normpath(name)
    if (not name or "\0" in name or name.startswith(("/", "\\")) or norm.startswith("..") or norm == "."
            or os.path.isabs(name) or ":" in name.split("/")[0]):
        raise CkptbenchError(f"pack member {name!r} would land outside its directory; the pack is not trustworthy")
    return norm


def _entries_for(directory: str, man: mf.Manifest | None) -> list[mf.FileEntry]:
    if man is not None:
        return list(man.files)
    entries = []
    for rel in tree.rels(directory):
        n = rel.rsplit("/", 1)[-1]
        if n.endswith((".safetensors", ".pt", ".pth", ".bin", ".distcp")):
            kind = "model"
        elif n == ".metadata" or n.endswith(".index.json"):
            kind = "meta"
        else:
            kind = "small"
        entries.append(mf.FileEntry(rel, os.path.getsize(os.path.join(directory, rel)), "", kind))
    return entries


def pack(directory: str, out: str, target_files: int = 4) -> mf.Manifest:
    """Copies `directory` to `out` with its small files in `target_files` packs and a manifest covering them."""
    if not os.path.isdir(directory):
        raise CkptbenchError(f"{directory}: no such directory; point at a checkpoint directory")
    if not 1 <= target_files <= 10000:
        raise CkptbenchError(f"--target-files must be 1..10000, got {target_files}")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise CkptbenchError(f"{out}: exists and is not empty; choose a new directory")
    man = mf.read(directory)
    if man is not None and man.packs:
        raise CkptbenchError(f"{directory}: already packed")
    entries = [e for e in _entries_for(directory, man) if e.path != mf.MANIFEST_NAME]
    members = [e for e in entries if e.kind in PACKED_KINDS]
    keep = [e for e in entries if e not in members]
    n = max(1, min(target_files, len(members)))
    groups: list[list[mf.FileEntry]] = [[] for _ in range(n)]
    sizes = [0] * n
    for e in sorted(members, key=lambda e: -e.bytes):
        i = sizes.index(min(sizes))
        groups[i].append(e)
        sizes[i] += e.bytes
    target = os.path.abspath(out)
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        packs: dict[str, dict[str, list]] = {}
        for i, group in enumerate(groups):
            name = pack_name(i, n)
            index: dict[str, list] = {}
            with open(os.path.join(tmp, name), "wb") as f:
                for e in sorted(group, key=lambda e: e.path):
                    with open(os.path.join(directory, e.path), "rb") as src:
                        data = src.read()
                    index[e.path] = [f.tell(), len(data), e.kind, e.rank]
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            packs[name] = index
        for e in keep:
            dst = os.path.join(tmp, e.path)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(directory, e.path), dst)
        alg = man.hash if man is not None else "crc32c"
        rels = list(packs) + [e.path for e in keep]
        result = fastio.read_files([os.path.join(tmp, r) for r in rels], hash=alg, concurrency=4)
        kinds = {e.path: e for e in keep}
        files = tuple(
            mf.FileEntry(r, f.bytes, f.digest, kinds[r].kind if r in kinds else "pack",
                         kinds[r].rank if r in kinds else None)
            for r, f in zip(rels, result.files)
        )
        if man is None:
            man = mf.Manifest(format="unknown", profile="", dims={}, param_count=0, weights_dtype="",
                              optimizer_dtype="", world_size=0, seed=0, hash=alg, files=())
        packed = replace(man, files=files, packs=packs)
        packed.write(tmp)
        os.rename(tmp, target)
        return packed
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_member(directory: str, man: mf.Manifest | None, rel: str) -> bytes:
    """A file's bytes whether it stands alone or sits in a pack."""
    if man is not None:
        for pack_file, index in man.packs.items():
            if rel in index:
                off, size = index[rel][0], index[rel][1]
                with open(os.path.join(directory, pack_file), "rb") as f:
                    f.seek(off)
                    data = f.read(size)
                if len(data) != size:
                    raise CkptbenchError(f"{pack_file}: member {rel} is cut short; the pack is truncated")
                return data
    with open(os.path.join(directory, rel), "rb") as f:
        return f.read()


def unpack(directory: str, out: str) -> mf.Manifest:
    """The original layout back under `out`: every member checked to land inside `out` before anything is written."""
    man = mf.read(directory)
    if man is None or not man.packs:
        raise CkptbenchError(f"{directory}: has no packs to unpack")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise CkptbenchError(f"{out}: exists and is not empty; choose a new directory")
    root = os.path.realpath(out)
    plan = []
    for index in man.packs.values():
        for rel, (_, _, kind, rank) in index.items():
            dst = os.path.realpath(os.path.join(root, safe_member(rel)))
            if os.path.commonpath([root, dst]) != root:
                raise CkptbenchError(f"pack member {rel!r} would land outside {out}; refusing to unpack")
            plan.append((rel, dst, kind, rank))
    kept = [e for e in man.files if e.kind != "pack"]
    for e in kept:
        safe_member(e.path)
    os.makedirs(root, exist_ok=True)
    for rel, dst, _, _ in plan:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(read_member(directory, man, rel))
    for e in kept:
        dst = os.path.join(root, e.path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(directory, e.path), dst)
    rels = [p[0] for p in plan] + [e.path for e in kept]
    meta = {p[0]: (p[2], p[3]) for p in plan} | {e.path: (e.kind, e.rank) for e in kept}
    result = fastio.read_files([os.path.join(root, r) for r in rels], hash=man.hash, concurrency=4)
    files = tuple(mf.FileEntry(r, f.bytes, f.digest, *meta[r]) for r, f in zip(rels, result.files))
    unpacked = replace(man, files=files, packs={})
    unpacked.write(root)
    return unpacked
