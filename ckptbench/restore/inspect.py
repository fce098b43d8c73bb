"""`ckptbench inspect`: what a checkpoint holds and what restoring it will do, from headers and metadata only.

Nothing here reads tensor data: safetensors headers, DCP's .metadata, torch.save pickles mapped lazily (the
data pages are never touched). Every header is parsed by the same checked parsers the restore uses.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from ckptbench.checkpoint import confine, layouts
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.quote import quote
from ckptbench.core.errors import CkptbenchError
from ckptbench.core.units import human_bytes
from ckptbench.sources import Listing, Source
from ckptbench.checkpoint.detect import not_a_checkpoint

CONFIG_MAX = 16 << 20  # a model's config.json is a few kB (a multimodal one's tens of kB)
# how trainers name per-rank files (the first group is the rank); DeepSpeed's ranks come from the layout. Hugging
# Face's -0000N-of-0000M shards are not ranks: one process writes them all
_RANK_PATTERNS = (
    re.compile(r"^__(\d+)_\d+\.distcp$"),  # DCP
    re.compile(r"(?:^|_)rank_?(\d+)\.(?:pt|pth|bin)$"),  # ckptbench's own torch shards
)


@dataclass
class Group:
    tensors: int = 0
    bytes: int = 0
    params: int = 0  # elements
    dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> bytes

    def add(self, t: "Tensor") -> None:
        self.tensors += 1
        self.bytes += t.bytes
        self.params += t.numel
        self.dtypes[t.dtype] = self.dtypes.get(t.dtype, 0) + t.bytes


@dataclass(frozen=True)
class Tensor:
    """One row of inspect's tensor table, from a header: nothing of its data is read."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    file: str
    group: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def row(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "bytes": self.bytes,
                "file": self.file, "group": self.group}


def _ranks(names: list[str]) -> int | None:
    found = set()
    for n in names:
        for pat in _RANK_PATTERNS:
            m = pat.search(os.path.basename(n))
            if m:
                found.add(int(m.group(1)))
                break
    return len(found) or None


def _dtype(d) -> str:
    return str(d).removeprefix("torch.")


def _torch_entries(directory: str, rels: list[str]):
    """Tensor rows of torch.save files, mapped lazily (no data read), the count of other entries, and the classes
    their pickles name that are kept as plain data (formats/inert.py); a Trainer's state file is grouped under its
    stem (optimizer.pt → optimizer)."""
    from ckptbench.checkpoint.formats import group_of
    from ckptbench.checkpoint.formats import torch_format as tf
    from ckptbench.checkpoint.formats import trainer_json

    from ckptbench.checkpoint.formats.state import CheckpointState
    from ckptbench.checkpoint.formats.torch_shards import check_complete

    out, others, inert, saved = [], 0, set(), CheckpointState({})
    for rel in rels:
        path = os.path.join(directory, rel)  # a Trainer's trainer_state.json among them: parsed, its entries counted
        state = trainer_json.load_file(path) if os.path.basename(rel) == trainer_json.NAME else tf.peek_file(path)
        inert |= state.inert
        saved.extra.update(state.extra)
        stem = layouts.state_stem(os.path.basename(rel))
        for group, name, t in state.tensors():
            if stem:
                group = group_of(f"{stem}.{name}")
            if stem and not name.startswith(stem + "."):
                name = f"{stem}.{name}"
            out.append(Tensor(name, _dtype(t.dtype), tuple(t.shape),
                              t.numel() * t.element_size(), rel, group))
        others += _other_entries(state.extra)
    check_complete([os.path.join(directory, rel) for rel in rels], saved)  # a step short of a rank: run refuses it
    return out, others, inert


def _other_entries(extra: dict) -> int:
    """The non-tensor entries of a torch.save file, an RNG state counted once, as the 'other' state it is (the
    elements of Python's tuple and numpy's made a Trainer's rng_state_N.pth 631 entries, its key array none)."""
    import torch

    from ckptbench.checkpoint.formats.state import rng_state_of

    plain, states = 0, set()
    for k, v in extra.items():
        if isinstance(v, torch.Tensor):
            continue
        rng = rng_state_of(k)
        if rng is not None:
            states.add(rng)
        elif not hasattr(v, "dtype"):
            plain += 1
    return plain + len(states)


def _entries(directory: str, listing: Listing):
    """Tensor rows of every tensor, the count of non-tensor entries, and the classes kept as plain data, from
    headers only."""
    from ckptbench.checkpoint.formats import group_of

    fmt = listing.format
    lay = listing.layout
    out, others = [], 0
    if fmt == "dcp":
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from ckptbench.checkpoint.formats.dcp_metadata import SafeReader

        from ckptbench.restore.load import dcp_roots, refuse_clash

        before: list[str] = []  # the folders read so far, as the restore names them in its line for a clash
        keys: set[str] = set()  # their keys as saved, byte entries too (load.dcp_state refuses one two folders hold)
        for root in dcp_roots(directory, lay):
            first = len(out)
            at = os.path.relpath(root, directory)
            at = "" if at == "." else at + "/"  # FSDP's model and optimizer folders: files named from the checkpoint
            meta = SafeReader(root).read_metadata()
            held: dict[str, set[str]] = {}  # the .distcp files a tensor's chunks lie in
            for idx, info in (meta.storage_data or {}).items():
                held.setdefault(idx.fqn, set()).add(at + str(info.relative_path))
            for fqn, md in meta.state_dict_metadata.items():
                if isinstance(md, TensorStorageMetadata):
                    shape = tuple(md.size)
                    n = 1
                    for d in shape:
                        n *= d
                    group = group_of(fqn)  # named as the restore names it: a model weight without DCP's `model.`
                    out.append(Tensor(fqn.removeprefix("model.") if group == "model" else fqn,
                                      _dtype(md.properties.dtype), shape, n * md.properties.dtype.itemsize,
                                      ",".join(sorted(held.get(fqn, ()))) or at + ".metadata", group))
                else:
                    others += 1
            # a name two parts hold is refused, as the restore's merge_apart refuses it, not counted twice
            refuse_clash({t.name for t in out[:first]}, {t.name for t in out[first:]}, directory,
                         os.path.basename(root), " or ".join(before))
            refuse_clash(keys, set(meta.state_dict_metadata), directory, os.path.basename(root), " or ".join(before))
            keys |= set(meta.state_dict_metadata)
            before.append(os.path.basename(root))
        state_files = list(lay.state_files) if lay is not None else []
        torch_out, more, inert = _torch_entries(directory, state_files)  # Megatron's common.pt, a Trainer's state
        refuse_clash({t.name for t in out}, {t.name for t in torch_out}, directory,
                     ", ".join(os.path.basename(f) for f in state_files[:3]), "its weights")
        return out + torch_out, others + more, inert
    state_files = list(lay.state_files) if lay is not None else []
    if fmt == "safetensors":
        from ckptbench.checkpoint.formats import safetensors_format as st

        for rel in listing.rels:
            if not rel.endswith(".safetensors"):
                continue
            optim, prefix = os.path.basename(rel).startswith("optimizer"), layouts.model_prefix(os.path.basename(rel))
            for key, (dtype, shape, start, end) in st.header_entries(os.path.join(directory, rel)).items():
                key = prefix + key
                out.append(Tensor(key, _dtype(dtype), tuple(shape), end - start, rel,
                                  "optimizer" if optim else group_of(key)))
        torch_out, others, inert = _torch_entries(directory, state_files)
        return out + torch_out, others, inert
    if fmt == "torch":  # and the state files no torch extension names (trainer_state.json), as the restore loads them
        torch_files = [r for r in listing.rels if r.endswith(layouts.TORCH_EXT)]
        return _torch_entries(directory, torch_files + [r for r in state_files if r not in torch_files])
    raise CkptbenchError(f"{directory}: no safetensors, torch or torch.distributed.checkpoint files found; "
                         "point at a checkpoint directory")


def _once(entries: list[Tensor]) -> tuple[list[Tensor], list[tuple[Tensor, Tensor]]]:
    """Each name once, as the restore's merge keeps it: two shards holding one weight (or optimizer part) are one
    tensor where their values agree, and the restore refuses them where not, which headers cannot tell; counted
    twice, inspect gave 12,352 parameters where load had 8.3 K. The pairs (first, again) that were dropped."""
    first: dict[tuple[str, str], Tensor] = {}
    out, twice = [], []
    for t in entries:
        seen = first.setdefault((t.group, t.name), t)
        if seen is t:
            out.append(t)
        else:
            twice.append((seen, t))
    return out, twice


def _twice_note(twice: list[tuple[Tensor, Tensor]]) -> list[str]:
    if not twice:
        return []
    a, b = twice[0]
    more = f" and {len(twice) - 1} more" if len(twice) > 1 else ""
    return [f"{quote(a.name, 80)}{more} held by two files ({quote(a.file, 80)} and {quote(b.file, 80)}): counted once, "
            "as a restore keeps one where their values agree (it refuses them where they do not: `ckptbench load` "
            "compares them)"]


def _notes(lay, entries: list[Tensor]) -> list[str]:
    """What the figures do not say by themselves: ZeRO-3's placeholder weights."""
    notes = []
    empty = [t for t in entries if t.group == "model" and t.numel == 0]
    if lay is not None and lay.name == "deepspeed" and empty:
        notes.append(f"ZeRO-3: {len(empty)} model weight(s) in {', '.join(sorted({t.file for t in empty})[:2])} are "
                     "placeholders (0 elements); the weights live partitioned in the optimizer states "
                     "(zero_pp_rank_N_…_optim_states.pt), counted in the optimizer group")
    return notes


def inspect(source: Source, *, concurrency: int = 8, tensors: str | None = None) -> dict:
    """The inspect document: layout, tensors by group, the read plan, and what the check stage will do."""
    listing = source.list()
    if listing.format == "unknown":
        raise not_a_checkpoint(listing.source, listing.passed)
    if not source.files_on_disk:
        raise CkptbenchError(f"{listing.source}: inspect reads headers from local files; for an object store, "
                             "copy the checkpoint's headers down or run `ckptbench run` against it")
    # no folder swapped for a link since the listing is read through: below the folder named, as fastio reads
    with confine.beneath(getattr(source, "directory", None) or listing.source):
        return _document(source, listing, concurrency, tensors)


def _document(source: Source, listing: Listing, concurrency: int, tensors: str | None) -> dict:
    """inspect's document of a listed checkpoint on local files."""
    from ckptbench.restore import load as restore
    from ckptbench.checkpoint.members import read_member
    from ckptbench.sources import ReadOptions

    directory = listing.source
    man = listing.manifest
    rels = listing.rels
    shard_ext = restore.SHARD_EXT[listing.format]
    shards = [r for r in rels if r.endswith(shard_ext)]
    tail = restore.tail_names(directory, man, rels)
    lay = listing.layout or layouts.Layout("files", tuple(rels))  # resume.choose's, as every command's
    entries, others, inert = _entries(directory, listing)
    entries, twice = _once(entries)
    groups: dict[str, Group] = defaultdict(Group)
    for t in entries:
        groups[t.group].add(t)
    sizes = {listing.rel(f.path): f.size or 0 for f in listing.files}
    total = sum(sizes.values())
    others_sized = {r: b for r, b in sizes.items() if not r.endswith(shard_ext)}  # an index, configs, the tail
    payload = sum(g.bytes for g in groups.values())
    largest = max(sizes.items(), key=lambda kv: kv[1]) if sizes else ("", 0)
    dims, why_not = None, "no model shape is known"
    if man is not None and man.dims or "config.json" in rels:
        # read for the shape only, within a bound: a sparse one claiming 256 GiB was read whole into memory; and
        # before the read mode is chosen, whose page-cache probe walks every page a file claims (4 s of 256 GiB)
        config = ({"config.json": read_member(directory, man, "config.json", most=(CONFIG_MAX, "a model's config"))}
                  if "config.json" in rels else {})
        dims, why = restore.model_dims(man, config, {t.name for t in entries if t.group == "model"})
        why_not = why or why_not
    opts, read_why = source.choose_read(listing, ReadOptions(concurrency=concurrency, read="auto", hash="none"))
    tail_bytes = sum(sizes.get(r, 0) for r in tail)
    floating = sum(b for g in groups.values() for d, b in g.dtypes.items()
                   if d.startswith(("float", "bfloat", "complex")))
    check = ("model step: the manifest (or config.json) gives the model's shape, so the restored model runs one "
             "forward step and its output must be finite" if dims is not None else
             f"structural, no model step ({why_not}): every floating value ({human_bytes(floating)}) is scanned natively "
             "for NaN/Inf" + (" and optimizer parts are checked against their weights" if "optimizer" in groups else ""))
    return {
        "source": listing.source,
        "format": listing.format,
        "layout": {
            "name": lay.name,
            "tag": lay.tag,
            "root": lay.root,  # the checkpoint below the folder given, where it held several
            "why": lay.why,
            "manifest": man is not None,
            "ranks": len(lay.ranks) if lay.ranks else _ranks(shards),
            "shards": len(shards),
            "tail_files": len(tail),
            "tail_bytes": tail_bytes,
            # every file that is not a shard (an index, configs, the tail): the read plan's file count is the two
            "other_files": len(others_sized),
            "other_bytes": sum(others_sized.values()),
            "other_entries": others,
            "kept_as_data": sorted(inert),  # classes its pickles name, never imported or run (formats/inert.py)
            "not_read": [{"path": p, "why": why} for p, why in lay.skipped],  # present, deliberately not read
            "unloaded": [{"path": p, "why": why} for p, why in lay.unloaded],  # read, never deserialized
            "dcp_dirs": list(lay.dcp_dirs),  # FSDP's sharded model and optimizer folders, each a DCP checkpoint
            "notes": list(lay.notes) + _notes(lay, entries) + _twice_note(twice),
        },
        "groups": {name: {"tensors": g.tensors, "params": g.params, "bytes": g.bytes,
                          "dtypes": dict(sorted(g.dtypes.items()))} for name, g in sorted(groups.items())},
        "params": groups["model"].params if "model" in groups else 0,  # the model's parameter count
        "tensor_filter": tensors,
        "tensors": [t.row() for t in entries if tensors is None or fnmatch.fnmatchcase(t.name, tensors)],
        # what its names look like, where the glob matched none: 'model.*' of a checkpoint whose names start
        # blocks.0. read as an empty checkpoint
        "tensor_names_like": [t.name for t in entries[:3]] if tensors is not None and not any(
            fnmatch.fnmatchcase(t.name, tensors) for t in entries) else [],
        "read_plan": {
            "files": len(sizes),
            "bytes": total,
            "largest_file": {"path": largest[0], "bytes": largest[1]},
            "payload_bytes": payload,
            # bytes read per byte of tensors: headers, pickles, per-chunk framing, and files nothing loads
            "amplification": total / payload if payload else None,
            "read": opts.read,
            "read_why": read_why,
            "unreadable_dirs": [{"path": d, "error": w} for d, w in listing.skipped],
        },
        "check": check,
        "manifest_hash": man.hash if isinstance(man, mf.Manifest) else None,
    }
