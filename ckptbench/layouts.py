"""Which files of a checkpoint directory one restore reads, from the layout a trainer saved it in: DeepSpeed's
step directories with `latest`, Hugging Face's .bin shards with their index, ckptbench's own rank shards.

`latest` and the index are the checkpoint's content, hence hostile: read no further than a small bound, and every
name in them confined to the directory (confine) before it selects anything. Free of torch: the listing uses it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from ckptbench import confine
from ckptbench.errors import CkptbenchError

LATEST = "latest"
MAX_LATEST = 4096  # `latest` holds one directory name
HF_INDEX = "pytorch_model.bin.index.json"
HF_SINGLE = "pytorch_model.bin"
MAX_INDEX = 64 << 20  # a 70B model's index is about 100 KiB
TORCH_EXT = (".pt", ".pth", ".bin")
DS_MODEL = re.compile(r"^(?:bf16_)?(?:zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt$")
DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_STEP_DIR = re.compile(r"^global_step\d+$")
_HF_SHARD = re.compile(r"^pytorch_model(?:-\d+-of-\d+)?\.bin$")
_OWN = re.compile(r"^(model|optim)_rank(\d+)\.pt$")


@dataclass(frozen=True)
class Layout:
    """The files one restore reads (`files`, relative "/"-separated paths) and what they are."""

    name: str  # deepspeed, hf-bin, torch-shards or files (no layout: every file)
    files: tuple[str, ...]
    tag: str | None = None  # DeepSpeed: the step directory restored (None when pointed at it directly)
    ranks: tuple[int, ...] = ()
    model_files: tuple[str, ...] = ()
    optimizer_files: tuple[str, ...] = ()

    def describe(self) -> dict:
        return {"layout": self.name, "tag": self.tag, "ranks": list(self.ranks), "model_files": list(self.model_files),
                "optimizer_files": list(self.optimizer_files)}


def _refuse(where: str, what: str, todo: str) -> CkptbenchError:
    return CkptbenchError(f"{where}: {what}; {todo}")


def _read_small(directory: str, rel: str, limit: int, what: str) -> bytes:
    """At most `limit` bytes of a regular file inside the directory, refused whole when it is larger."""
    fd = confine.open_member(directory, rel)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _refuse(os.path.join(directory, rel), f"{size} bytes, more than {what} holds (at most {limit})",
                          "the file is corrupt or crafted: fix or remove it")
        out = bytearray()
        while len(out) <= limit:  # a file that grows while read is cut at the bound, not followed
            chunk = os.pread(fd, limit + 1 - len(out), len(out))
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    if len(out) > limit:
        raise _refuse(os.path.join(directory, rel), f"more than {limit} bytes, more than {what} holds",
                      "the file is corrupt or crafted: fix or remove it")
    return bytes(out)


def read_latest(directory: str) -> str:
    """The step directory DeepSpeed's `latest` names: one plain name of a directory inside the checkpoint."""
    where = os.path.join(directory, LATEST)
    todo = ("write the name of one step directory (e.g. global_step100) into it, or point at a step "
            "directory instead")
    raw = _read_small(directory, LATEST, MAX_LATEST, "a DeepSpeed `latest` file")
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise _refuse(where, "is not text, so it names no step directory", todo) from None
    if not tag or "/" in tag or not confine.is_plain(tag):
        raise _refuse(where, f"names {tag[:80]!r}, not one directory name inside the checkpoint", todo)
    if not os.path.isdir(confine.resolve(directory, tag)):
        raise _refuse(where, f"names {tag[:80]!r}, which is not a directory in {directory}", todo)
    return tag


def parse_hf_index(raw: bytes, where: str) -> dict[str, str]:
    """The weight map (tensor name -> shard file) of a Hugging Face index, its types checked."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _refuse(where, f"not valid JSON ({str(exc)[:80]})", "re-copy the checkpoint or fix the index") from None
    if not isinstance(doc, dict):
        raise _refuse(where, f"holds a JSON {type(doc).__name__}, not an object", "re-copy or fix the index")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise _refuse(where, "has no weight_map of tensor names to shard files", "re-copy or fix the index")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise _refuse(where, f"maps {name[:80]!r} to {type(shard).__name__} {str(shard)[:40]!r}, not a "
                          "file name", "re-copy or fix the index")
    return weight_map


def read_hf_index(directory: str, rel: str = HF_INDEX) -> dict[str, str]:
    return parse_hf_index(_read_small(directory, rel, MAX_INDEX, "a weight index"), os.path.join(directory, rel))


def _step_dirs(rels: list[str]) -> set[str]:
    """Top-level directories that hold one DeepSpeed step: global_stepN, or DeepSpeed's state files."""
    out = set()
    for r in rels:
        parts = r.split("/")
        if len(parts) >= 2 and _STEP_DIR.match(parts[0]):
            out.add(parts[0])
        elif len(parts) == 2 and (DS_MODEL.match(parts[1]) or DS_OPTIM.match(parts[1])):
            out.add(parts[0])
    return out


def _deepspeed(directory: str, rels: list[str], top: set[str], steps: set[str]) -> Layout:
    if any(DS_MODEL.match(r) or DS_OPTIM.match(r) for r in top):  # pointed at one step directory
        tag, files, prefix = None, tuple(rels), ""
    else:
        if LATEST in top:
            tag = read_latest(directory)
        elif len(steps) == 1:
            (tag,) = steps
        else:
            named = ", ".join(sorted(steps)[:3]) + (", ..." if len(steps) > 3 else "")
            raise _refuse(directory, f"{len(steps)} DeepSpeed step directories ({named}) and no `latest` file "
                          "saying which to restore", "point at one step directory, or write its name into "
                          f"{os.path.join(directory, LATEST)}")
        prefix = tag + "/"
        if not any(r.startswith(prefix) and r.endswith(TORCH_EXT) for r in rels):
            raise _refuse(os.path.join(directory, LATEST) if LATEST in top else directory,
                          f"the step directory {tag!r} holds no torch files",
                          "point at a step directory that holds DeepSpeed's model and optimizer states")
        files = tuple(r for r in rels if r.startswith(prefix) or r.split("/")[0] not in steps)  # other steps: not read
    names = [(r, r[len(prefix):]) for r in files if r.startswith(prefix) and "/" not in r[len(prefix):]]
    ranks = sorted({int(m.group(1)) for _, n in names if (m := DS_OPTIM.match(n))})
    return Layout("deepspeed", files, tag, tuple(ranks), tuple(r for r, n in names if DS_MODEL.match(n)),
                  tuple(r for r, n in names if DS_OPTIM.match(n)))


def _hf_bin(directory: str, rels: list[str], top: set[str]) -> Layout:
    if HF_INDEX not in top:
        return Layout("hf-bin", tuple(rels), model_files=(HF_SINGLE,))
    where = os.path.join(directory, HF_INDEX)
    shards = sorted(set(read_hf_index(directory).values()))
    listed = set(rels)
    for shard in shards:
        confine.resolve(directory, shard)  # refuses a name that is not plain or leads outside
        if shard not in listed:
            raise _refuse(where, f"names shard {shard[:80]!r}, which is missing from {directory} (or not a "
                          "regular file)", "re-copy the checkpoint with all its shards")
    named = set(shards)
    files = tuple(r for r in rels if r in named or not _HF_SHARD.match(r))  # a stale shard the index drops is not read
    return Layout("hf-bin", files, model_files=tuple(shards))


def select(directory: str, rels: list[str]) -> Layout:
    """The layout of the checkpoint in `directory`, whose files (relative paths) are `rels`, and the files of it a
    restore reads. One line (CkptbenchError) when the layout's own files say something impossible or ambiguous."""
    top = {r for r in rels if "/" not in r}
    steps = _step_dirs(rels)
    if steps or any(DS_MODEL.match(r) or DS_OPTIM.match(r) for r in top) or (
            LATEST in top and any("/" in r and r.endswith(TORCH_EXT) for r in rels)):
        return _deepspeed(directory, rels, top, steps)
    if HF_INDEX in top or HF_SINGLE in top:
        return _hf_bin(directory, rels, top)
    own = [(m.group(1), int(m.group(2)), r) for r in sorted(top) if (m := _OWN.match(r))]
    if own:
        return Layout("torch-shards", tuple(rels), ranks=tuple(sorted({k for _, k, _ in own})),
                      model_files=tuple(r for kind, _, r in own if kind == "model"),
                      optimizer_files=tuple(r for kind, _, r in own if kind == "optim"))
    return Layout("files", tuple(rels))
