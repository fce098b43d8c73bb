"""Packing a checkpoint's small files into a few large ones, and unpacking them again (members.py reads a member
straight from its pack).

Every name, offset and size in a manifest is hostile until checked: names must be plain relative paths, every
file read goes through `confine`, and `pack` / `unpack` check the whole manifest before they write anything, then
write into a temporary sibling of OUT that is renamed into place only when whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from dataclasses import replace

import fastio

from ckptbench.checkpoint import confine
from ckptbench.checkpoint import layouts
from ckptbench.checkpoint import tree
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.members import FILE_KINDS, pack_tables, refuse, safe_member, whole
from ckptbench.checkpoint.quote import quote
from ckptbench.core.errors import CkptbenchError, naming
from ckptbench.core.paths import require_checkpoint_dir

PACKED_KINDS = ("small",)  # shards and format metadata stay files: loaders such as DCP's open them by path
# a folder holding one of these is a component a loader finds by name (diffusers' tokenizer/, scheduler/)
_CONFIG_SUFFIX = "config.json"
COPY_CHUNK = 8 << 20


def pack_name(i: int, n: int) -> str:
    return f"pack-{i + 1:05d}-of-{n:05d}.ckpack"


def _checked_entry(directory: str, e: mf.FileEntry) -> mf.FileEntry:
    """A manifest file entry a pack or unpack may copy: plain name, whole-number size, known kind and rank."""
    safe_member(e.path, directory)
    if not whole(e.bytes):
        raise refuse(directory, f"file {quote(e.path)} declares {quote(e.bytes)} bytes, not a whole number")
    if e.kind not in FILE_KINDS or (e.rank is not None and not whole(e.rank)):
        raise refuse(directory, f"file {quote(e.path)} has kind {quote(e.kind)} and rank {quote(e.rank)}")
    return e


def _check_names(where: str, names: list[str]) -> None:
    """No name twice, none the manifest's own, none a directory of another: each output file has one source."""
    seen: set[str] = set()
    for n in names:
        if n == mf.MANIFEST_NAME:
            raise refuse(where, f"{quote(n)} is the manifest's own name, not a file to copy")
        if n in seen:
            raise refuse(where, f"{quote(n)} is named twice")
        seen.add(n)
    # sorted with "/" lowest (names hold no NUL), a file's first descendant, if it has one, comes right after it:
    # one pass, where joining every prefix of every name was quadratic in its parts (2000 names of 2048 parts: 65 s)
    ordered = sorted(seen, key=lambda n: n.replace("/", "\0"))
    for n, after in zip(ordered, ordered[1:]):
        if after.startswith(n + "/"):
            raise refuse(where, f"{quote(after)} would sit inside {quote(n)}, which is a file")


def _mode_of(directory: str, rel: str, size: int) -> int:
    """Opens a source through confine (inside, regular, declared size) and gives its permission bits."""
    fd = confine.open_member(directory, rel, size)
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _create(root: str, rel: str, mode: int) -> int:
    """A new file under our own staging directory; never an existing one, never through a symlink."""
    dst = os.path.join(root, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    return os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode & 0o666)


def _copy_range(src: int, offset: int, length: int, dst: int, where: str, into: str) -> None:
    """Bytes [offset, offset + length) of `src` (the file `where`) to `dst` (the file `into`), in chunks."""
    done = 0
    while done < length:
        chunk = os.pread(src, min(COPY_CHUNK, length - done), offset + done)
        if not chunk:
            raise CkptbenchError(f"{where}: shorter than the checkpoint says; it changed while being read",
                                 exit_code=1)
        view = memoryview(chunk)
        with naming(into):
            while view:
                view = view[os.write(dst, view):]
        done += len(chunk)


def _fsync(dst: int, into: str) -> None:
    with naming(into):
        os.fsync(dst)


def _copy_out(src: int, offset: int, length: int, root: str, rel: str, mode: int, where: str) -> None:
    into = os.path.join(root, rel)
    dst = _create(root, rel, mode)
    try:
        _copy_range(src, offset, length, dst, where, into)
        _fsync(dst, into)
    finally:
        os.close(dst)


def _missing_parents(path: str) -> list[str]:
    made = []
    while not os.path.lexists(path):
        made.append(path)
        path = os.path.dirname(path)
    return made


@contextlib.contextmanager
def _staged(out: str):
    """A temporary sibling of `out` (named with our pid), renamed to `out` when the block ends normally; on any
    failure it is removed, with any parent directory made for it, so nothing half-written is left. A folder already
    under that name (a killed pack's of the same pid, a container's pids repeat, or planted) is left alone: this
    stages under another name, and removes only what it made."""
    target = os.path.abspath(out)
    parent = os.path.dirname(target)
    tmp = os.path.join(parent, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    made = _missing_parents(parent)
    staged = False
    try:
        os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(tmp)
        except FileExistsError:
            tmp = f"{tmp}-{uuid.uuid4().hex[:8]}"
            os.mkdir(tmp)
        staged = True
        yield tmp
        os.rename(tmp, target)
    except BaseException as exc:
        if staged:
            shutil.rmtree(tmp, ignore_errors=True)
        for d in made:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        if isinstance(exc, OSError) and isinstance(exc.filename, str) and (
                exc.filename == tmp or exc.filename.startswith(tmp + os.sep)):
            # named where the user will look: the staging folder is gone, and OUT is what was being written
            raise OSError(exc.errno, exc.strerror, target + exc.filename[len(tmp):]) from None
        raise


def _check_out(directory: str, out: str) -> None:
    real, source = os.path.realpath(out), os.path.realpath(directory)
    if real == source or real.startswith(source.rstrip("/") + "/"):  # writing there changes the checkpoint read
        raise CkptbenchError(f"{out}: inside the checkpoint {directory}; choose a directory outside it")
    if os.path.lexists(out) and (os.path.islink(out) or not os.path.isdir(out) or os.listdir(out)):
        raise CkptbenchError(f"{out}: exists and is not empty; choose a new directory")


def _entries_for(directory: str, man: mf.Manifest | None) -> list[mf.FileEntry]:
    entries, skipped, passed = [], [], []
    rels = tree.rels(directory, skipped, passed)
    if skipped:  # its files would be missing from OUT, which would still verify whole against its own manifest
        where, why = skipped[0]
        raise CkptbenchError(f"{where}: unreadable directory ({why}); its files would be left out of the pack: fix "
                             "its permissions", exit_code=1)
    if man is not None:
        # and the files the manifest does not list (a data loader's state or logs written after it): they were left
        # out of OUT without a word, 300 of 322 files gone from a pack that then verified OK
        listed = {e.path for e in man.files} | {mf.MANIFEST_NAME}
        return list(man.files) + [_unlisted(directory, rel) for rel in rels if rel not in listed]
    if not rels:
        raise tree.nothing_to_read(directory, passed)
    return [_unlisted(directory, rel) for rel in rels]


def _unlisted(directory: str, rel: str) -> mf.FileEntry:
    """A file no manifest lists, its kind told by its name (its digest is taken from its copy)."""
    n = rel.rsplit("/", 1)[-1]
    if n.endswith((".safetensors", ".distcp", *layouts.TORCH_EXT)):
        kind = "model"
    elif n == ".metadata" or n.endswith(".index.json"):
        kind = "meta"
    else:
        kind = "small"
    return mf.FileEntry(rel, os.path.getsize(os.path.join(directory, rel)), "", kind)


def _folder(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def opened_by_name(entries: list[mf.FileEntry]) -> set[str]:
    """The small files a loader opens by their name, which stay files: every file at the top (config.json, tokenizer
    files, generation_config.json, trainer_state.json, DeepSpeed's `latest`, Megatron's iteration file) and every
    file in a folder on the way to weights, shards or format metadata (a Trainer's checkpoint-N, a DeepSpeed step, a
    Megatron iteration) or in a folder holding a *config.json (a pipeline's tokenizer/, scheduler/). Packed,
    from_pretrained and a resume would not find them; only small files in other folders (a data loader's state,
    logs) are packed."""
    folders = {""}
    for e in entries:
        if e.kind not in PACKED_KINDS:
            parts = e.path.split("/")[:-1]
            folders.update("/".join(parts[:i]) for i in range(len(parts) + 1))
        elif e.path.rsplit("/", 1)[-1].endswith(_CONFIG_SUFFIX):
            folders.add(_folder(e.path))
    return {e.path for e in entries if e.kind in PACKED_KINDS and _folder(e.path) in folders}


def _members(entries: list[mf.FileEntry]) -> tuple[list[mf.FileEntry], list[mf.FileEntry]]:
    """The entries pack puts in packs, and those it keeps as files."""
    by_name = opened_by_name(entries)
    members = [e for e in entries if e.kind in PACKED_KINDS and e.path not in by_name]
    return members, [e for e in entries if e not in members]


def packable(directory: str) -> list[str]:
    """The files `pack directory` would put in packs (none for a packed checkpoint): what the checklist's advice to
    pack is worth."""
    man = mf.read(directory)
    if man is not None and man.packs:
        return []
    entries = [e for e in _entries_for(directory, man) if e.path != mf.MANIFEST_NAME]
    return [e.path for e in _members(entries)[0]]


def nothing_why(entries: list[mf.FileEntry]) -> str:
    small = [e.path for e in entries if e.kind in PACKED_KINDS]
    if not small:
        return "it holds only weights, shards and format metadata, which loaders open by path"
    shown = ", ".join(quote(r) for r in small[:3]) + (f" and {len(small) - 3} more" if len(small) > 3 else "")
    return (f"its {len(small)} small file(s) ({shown}) are all ones a loader opens by name (at the top, or beside "
            "weights, shards or a config), and packed, from_pretrained and a resume would not find them")


def _hashed(tmp: str, rels: list[str], alg: str) -> list:
    result = fastio.read_files([os.path.join(tmp, r) for r in rels], hash=alg, concurrency=4)
    if result.failed:
        bad = result.failed[0]
        raise CkptbenchError(f"{bad.path}: could not be read back after writing ({bad.error.message})", exit_code=1)
    return result.files


def pack(directory: str, out: str, target_files: int = 4) -> mf.Manifest:
    """Copies `directory` to `out` with its small files that no loader opens by name (`opened_by_name`) in
    `target_files` packs and a manifest covering them; one line when the directory is empty or has none.

    Every entry is checked, and every source opened through confine, before OUT's staging directory exists."""
    require_checkpoint_dir(directory)
    if not 1 <= target_files <= 10000:
        raise CkptbenchError(f"--target-files must be 1..10000, got {target_files}")
    _check_out(directory, out)
    man = mf.read(directory)
    if man is not None and man.packs:
        raise CkptbenchError(f"{directory}: already packed")
    entries = [_checked_entry(directory, e) for e in _entries_for(directory, man) if e.path != mf.MANIFEST_NAME]
    if not entries:  # an empty pack would then verify "OK: 1 files, 0 B"
        raise tree.nothing_to_read(directory, [])
    members, keep = _members(entries)
    if not members:
        raise CkptbenchError(f"{directory}: nothing to pack: {nothing_why(entries)}; the checkpoint stays loadable as "
                             "it is: leave it unpacked")
    n = max(1, min(target_files, len(members)))
    _check_names(directory, [e.path for e in entries] + [pack_name(i, n) for i in range(n)])
    groups: list[list[mf.FileEntry]] = [[] for _ in range(n)]
    sizes = [0] * n
    for e in sorted(members, key=lambda e: -e.bytes):
        i = sizes.index(min(sizes))
        groups[i].append(e)
        sizes[i] += e.bytes
    modes = {e.path: _mode_of(directory, e.path, e.bytes) for e in entries}
    with _staged(out) as tmp:
        packs: dict[str, dict[str, list]] = {}
        for i, group in enumerate(groups):
            name = pack_name(i, n)
            mode = 0o666
            for e in group:
                mode &= modes[e.path]  # a pack is never readable by more than any of its members
            index: dict[str, list] = {}
            into = os.path.join(tmp, name)
            dst = _create(tmp, name, mode)
            try:
                pos = 0
                for e in sorted(group, key=lambda e: e.path):
                    src = confine.open_member(directory, e.path, e.bytes)
                    try:
                        _copy_range(src, 0, e.bytes, dst, os.path.join(directory, e.path), into)
                    finally:
                        os.close(src)
                    index[e.path] = [pos, e.bytes, e.kind, e.rank]
                    pos += e.bytes
                _fsync(dst, into)
            finally:
                os.close(dst)
            packs[name] = index
        _copywhole(directory, keep, tmp, modes)
        alg = man.hash if man is not None else "crc32c"
        rels = list(packs) + [e.path for e in keep]
        kinds = {e.path: e for e in keep}
        files = tuple(
            mf.FileEntry(r, f.bytes, f.digest, kinds[r].kind if r in kinds else "pack",
                         kinds[r].rank if r in kinds else None)
            for r, f in zip(rels, _hashed(tmp, rels, alg))
        )
        if man is None:
            man = mf.Manifest(format="unknown", profile="", dims={}, param_count=0, weights_dtype="",
                              optimizer_dtype="", world_size=0, seed=0, hash=alg, files=())
        packed = replace(man, files=files, packs=packs)
        packed.write(tmp)
    return packed


def _copywhole(directory: str, entries: list[mf.FileEntry], tmp: str, modes: dict) -> None:
    """Files that stay files, each opened through confine at its declared size and copied into `tmp`."""
    for e in entries:
        src = confine.open_member(directory, e.path, e.bytes)
        try:
            _copy_out(src, 0, e.bytes, tmp, e.path, modes[e.path], os.path.join(directory, e.path))
        finally:
            os.close(src)


def unpack(directory: str, out: str) -> mf.Manifest:
    """The original layout back under `out`. The whole manifest is checked (names, member records, no overlap, no
    name twice) and every source opened through confine before anything is written; the files are written into a
    temporary sibling of `out` that becomes `out` only when whole."""
    man = mf.read(directory)
    if man is None or not man.packs:
        raise CkptbenchError(f"{directory}: has no packs to unpack")
    _check_out(directory, out)
    tables = pack_tables(directory, man)
    kept = [_checked_entry(directory, e) for e in man.files if e.kind != "pack"]
    _check_names(directory, [m.rel for t in tables for m in t.members] + [e.path for e in man.files])
    modes = {t.name: _mode_of(directory, t.name, t.size) for t in tables}
    kept_modes = {e.path: _mode_of(directory, e.path, e.bytes) for e in kept}
    with _staged(out) as tmp:
        for t in tables:
            src = confine.open_member(directory, t.name, t.size)
            try:
                for m in t.members:
                    _copy_out(src, m.offset, m.size, tmp, m.rel, modes[t.name], os.path.join(directory, t.name))
            finally:
                os.close(src)
        _copywhole(directory, kept, tmp, kept_modes)
        rels = [m.rel for t in tables for m in t.members] + [e.path for e in kept]
        meta = {m.rel: (m.kind, m.rank) for t in tables for m in t.members} | {e.path: (e.kind, e.rank) for e in kept}
        files = tuple(mf.FileEntry(r, f.bytes, f.digest, *meta[r]) for r, f in zip(rels, _hashed(tmp, rels, man.hash)))
        unpacked = replace(man, files=files, packs={})
        unpacked.write(tmp)
    return unpacked
