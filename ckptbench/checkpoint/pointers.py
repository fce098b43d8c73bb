"""The checkpoint's own files that say which others a restore reads: DeepSpeed's `latest`, Megatron's
latest_checkpointed_iteration.txt, a Hugging Face weight index; and the sizes past which a member is refused unread.

They are the checkpoint's content, hence hostile: read no further than a small bound, and every name in them
confined to the checkpoint before it selects anything. They are read through a bounded fetch of a small member, so a
directory (read through confine) and an S3 prefix (a ranged GET) share them. Free of torch: the listing uses them.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from ckptbench.checkpoint import confine
from ckptbench.core import jsontext
from ckptbench.core.errors import CkptbenchError

LATEST = "latest"
MAX_LATEST = 4096  # `latest` holds one directory name
HF_INDEX = "pytorch_model.bin.index.json"
MAX_INDEX = 64 << 20  # a 70B model's index is about 100 KiB
MEGATRON_LATEST = "latest_checkpointed_iteration.txt"
ITER_DIGITS = 12  # the most digits of a Megatron iteration taken (iter_%07d: seven, more past 9999999)
MAX_DCP_METADATA = 1 << 30  # a 405B model's .metadata is tens of MB

# fetch(rel, limit, what): a small member's bytes, refused in one line (naming it as `what`) without reading it
# when it holds more than `limit` bytes
Fetch = Callable[[str, int, str], bytes]


def check_sizes(where: str, sizes) -> None:
    """Members whose size alone says the checkpoint is crafted, refused before a byte of them is read: a DCP
    .metadata beyond any real one would cost its size in memory before its pickle is even looked at."""
    for rel, size in sizes:
        if rel.rsplit("/", 1)[-1] == ".metadata" and (size or 0) > MAX_DCP_METADATA:
            raise too_large(f"{where}/{rel}", size, MAX_DCP_METADATA, "DCP metadata")


def refuse(where: str, what: str, todo: str) -> CkptbenchError:
    return CkptbenchError(f"{where}: {what}; {todo}")


def too_large(where: str, size: int | None, limit: int, what: str) -> CkptbenchError:
    """The one line for a member larger than its kind holds (`size` None: it grew past the bound while read)."""
    held = f"{size} bytes, more" if size is not None else f"more than {limit} bytes, more"
    return refuse(where, f"{held} than {what} holds (at most {limit})", "the file is corrupt or crafted: fix or "
                  "remove it")


def _read_small(directory: str, rel: str, limit: int, what: str) -> bytes:
    """At most `limit` bytes of a regular file inside the directory, refused whole when it is larger."""
    fd = confine.open_member(directory, rel)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise too_large(os.path.join(directory, rel), size, limit, what)
        out = bytearray()
        while len(out) <= limit:  # a file that grows while read is cut at the bound, not followed
            chunk = os.pread(fd, limit + 1 - len(out), len(out))
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    if len(out) > limit:
        raise too_large(os.path.join(directory, rel), None, limit, what)
    return bytes(out)


def local_fetch(directory: str) -> Fetch:
    return lambda rel, limit, what: _read_small(directory, rel, limit, what)


def confine_name(where: str, rel, on_disk: bool) -> None:
    """A name the checkpoint's content gives must be a plain path below it; on a filesystem, also after following
    symlinks (confine); in an object store there are none, and the listing says what exists."""
    if on_disk:
        confine.resolve(where, rel)
    elif not confine.is_plain(rel):
        raise CkptbenchError(f"{where}: the checkpoint names {str(rel)[:80]!r}, which is not a plain relative path "
                             "and could point outside the checkpoint directory; refusing it (the checkpoint may be "
                             "crafted: check where it came from)", exit_code=1)


def read_latest(where: str, rels: list[str] | None = None, fetch: Fetch | None = None) -> str:
    """The step directory DeepSpeed's `latest` names: one plain name of a directory inside the checkpoint.
    Without `fetch`, `where` is a directory on disk; with it, `rels` (the listing) says which directories exist."""
    on_disk = fetch is None
    path = os.path.join(where, LATEST)
    todo = ("write the name of one step directory (e.g. global_step100) into it, or point at a step "
            "directory instead")
    raw = (fetch or local_fetch(where))(LATEST, MAX_LATEST, "a DeepSpeed `latest` file")
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise refuse(path, "is not text, so it names no step directory", todo) from None
    if not tag or "/" in tag or not confine.is_plain(tag):
        raise refuse(path, f"names {tag[:80]!r}, not one directory name inside the checkpoint", todo)
    if on_disk:
        is_dir = os.path.isdir(confine.resolve(where, tag))
    else:
        is_dir = any(r.startswith(tag + "/") for r in rels or ())
    if not is_dir:
        raise refuse(path, f"names {tag[:80]!r}, which is not a directory in {where}", todo)
    return tag


def parse_hf_index(raw: bytes, where: str) -> dict[str, str]:
    """The weight map (tensor name -> shard file) of a Hugging Face index, its types checked."""
    try:
        doc = jsontext.loads(raw)  # UTF-8, as transformers reads it
    except (ValueError, RecursionError) as exc:
        raise refuse(where, f"not valid UTF-8 JSON ({str(exc)[:80]})", "re-copy the checkpoint or fix the index") \
            from None
    if not isinstance(doc, dict):
        raise refuse(where, f"holds a JSON {type(doc).__name__}, not an object", "re-copy or fix the index")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise refuse(where, "has no weight_map of tensor names to shard files", "re-copy or fix the index")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise refuse(where, f"maps {name[:80]!r} to {type(shard).__name__} {str(shard)[:40]!r}, not a "
                         "file name", "re-copy or fix the index")
    return weight_map


def read_hf_index(directory: str, rel: str = HF_INDEX, fetch: Fetch | None = None) -> dict[str, str]:
    raw = (fetch or local_fetch(directory))(rel, MAX_INDEX, "a weight index")
    return parse_hf_index(raw, os.path.join(directory, rel))


def one_of(where: str, dirs: set[str], kind: str, pointer: str, what: str, named: Callable[[], str | None],
           on_disk: bool = False) -> str:
    """The directory to restore among `dirs`: the one the pointer file names (`named()`, None without one), else
    the only one, else one line saying the choice is ambiguous (and, on disk, that a pointer the listing leaves out,
    a symlink or a FIFO, is there but never read)."""
    tag = named()
    if tag is not None:
        return tag
    if len(dirs) == 1:
        return next(iter(dirs))
    listed = ", ".join(sorted(dirs)[:3]) + (", ..." if len(dirs) > 3 else "")
    path = os.path.join(where, pointer)
    none = f", and its `{pointer}` is not a regular file (a symlink, FIFO or folder is never read), so nothing says" \
        if on_disk and os.path.lexists(path) else f" and no `{pointer}` file saying"
    raise refuse(where, f"{len(dirs)} {kind} directories ({listed}){none} which to restore",
                 f"point at one {kind.split()[-1]} directory, or write {what} into {path}")


def read_iteration(where: str, rels: list[str], fetch: Fetch | None = None) -> str:
    """The iteration directory Megatron's latest_checkpointed_iteration.txt names: a number (iter_%07d) or
    `release`, the directory inside the checkpoint."""
    path = os.path.join(where, MEGATRON_LATEST)
    todo = "write the iteration to restore into it (e.g. 2000), or point at an iteration directory instead"
    raw = (fetch or local_fetch(where))(MEGATRON_LATEST, MAX_LATEST, f"Megatron's {MEGATRON_LATEST}")
    text = raw.decode("utf-8", "replace").strip()
    # the number as Megatron reads it back (int(): leading zeros taken) and names its folder (iter_%07d: more digits
    # past 9999999, up to ITER_DIGITS)
    tag = "release" if text == "release" else f"iter_{int(text):07d}" if text.isascii() and text.isdigit() \
        and len(text) <= ITER_DIGITS else None
    if tag is None:
        raise refuse(path, f"holds {text[:40]!r}, neither an iteration number nor `release`", todo)
    if not any(r.startswith(tag + "/") for r in rels):
        raise refuse(path, f"names iteration {text!r}, but {tag} is not in {where}", todo)
    return tag


def megatron_iteration(where: str, rels: list[str], top: set[str], iters: set[str], fetch: Fetch | None) -> str:
    """The iteration to restore: the one latest_checkpointed_iteration.txt names, else the only one."""
    return one_of(where, iters, "Megatron iteration", MEGATRON_LATEST, "its number",
                  lambda: read_iteration(where, rels, fetch) if MEGATRON_LATEST in top else None, fetch is None)
