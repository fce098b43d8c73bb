"""`ckptbench inspect`: what a checkpoint holds and what restoring it will do, from headers and metadata only.

Nothing here reads tensor data: safetensors headers, DCP's .metadata, torch.save pickles mapped lazily (the
data pages are never touched). Every header is parsed by the same checked parsers the restore uses.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from ckptbench import layouts, tree
from ckptbench import manifest as mf
from ckptbench.errors import CkptbenchError
from ckptbench.sources import Listing, Source

# how trainers name per-rank files (the first group is the rank); DeepSpeed's ranks come from layouts.select
_RANK_PATTERNS = (
    re.compile(r"^__(\d+)_\d+\.distcp$"),  # DCP
    re.compile(r"(?:^|_)rank_?(\d+)\.(?:pt|pth|bin)$"),  # ckptbench's own torch shards
    re.compile(r"-(\d+)-of-\d+\.(?:safetensors|bin)$"),  # Hugging Face shards (numbered from 1)
)


@dataclass
class Group:
    tensors: int = 0
    bytes: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> bytes

    def add(self, dtype: str, nbytes: int) -> None:
        self.tensors += 1
        self.bytes += nbytes
        self.dtypes[dtype] = self.dtypes.get(dtype, 0) + nbytes


def _ranks(names: list[str]) -> int | None:
    found = set()
    for n in names:
        for pat in _RANK_PATTERNS:
            m = pat.search(os.path.basename(n))
            if m:
                found.add(int(m.group(1)))
                break
    return len(found) or None


def _torch_entries(directory: str, paths: list[str]):
    """(group, name, dtype name, bytes) of the tensors in torch.save files, mapped lazily (no data read), the count of
    other entries, and the classes their pickles name that are kept as plain data (formats/inert.py); a Trainer's
    state file is grouped under its stem (optimizer.pt → optimizer)."""
    from ckptbench.formats import group_of
    from ckptbench.formats import torch_format as tf

    out, others, inert = [], 0, set()
    for path in paths:
        state = tf.peek_file(path)
        inert |= state.inert
        stem = os.path.splitext(os.path.basename(path))[0]
        trainer = bool(layouts.TRAINER_STATE.match(os.path.basename(path)))
        for group, name, t in state.tensors():
            if trainer:
                group = group_of(f"{stem}.{name}")
            out.append((group, name, str(t.dtype).removeprefix("torch."), t.numel() * t.element_size()))
        others += sum(1 for v in state.extra.values() if not hasattr(v, "dtype"))
    return out, others, inert


def _entries(directory: str, listing: Listing):
    """(group, name, dtype name, bytes) of every tensor, the count of non-tensor entries, and the classes kept as
    plain data, from headers only."""
    from ckptbench.formats import group_of

    fmt = listing.format
    out, others = [], 0
    if fmt == "dcp":
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from ckptbench.formats.dcp_metadata import SafeReader

        meta = SafeReader(directory).read_metadata()
        for fqn, md in meta.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                n = 1
                for d in md.size:
                    n *= d
                # named as the restore names a model weight (its `model.` prefix dropped)
                out.append((group_of(fqn), fqn.removeprefix("model."), str(md.properties.dtype).removeprefix("torch."),
                            n * md.properties.dtype.itemsize))
            else:
                others += 1
        return out, others, set()
    if fmt == "safetensors":
        from ckptbench.formats import safetensors_format as st

        inert: set[str] = set()
        for f in listing.files:
            if not f.path.endswith(".safetensors"):
                continue
            optim = os.path.basename(f.path).startswith("optimizer")
            for key, (dtype, _shape, start, end) in st.header_entries(f.path).items():
                out.append(("optimizer" if optim else group_of(key), key, str(dtype).removeprefix("torch."),
                            end - start))
        top = {r for r in listing.rels if "/" not in r}
        if layouts.is_trainer(top):  # a Trainer's optimizer.pt, scheduler.pt, rng_state*.pth beside the weights
            torch_out, others, inert = _torch_entries(directory, [os.path.join(directory, r)
                                                                  for r in layouts.trainer_state_files(sorted(top))])
            out += torch_out
        return out, others, inert
    if fmt == "torch":
        return _torch_entries(directory, [f.path for f in listing.files if f.path.endswith(layouts.TORCH_EXT)])
    raise CkptbenchError(f"{directory}: no safetensors, torch or torch.distributed.checkpoint files found; "
                         "point at a checkpoint directory")


def inspect(source: Source, *, concurrency: int = 8) -> dict:
    """The inspect document: layout, tensors by group, the read plan, and what the check stage will do."""
    from ckptbench import restore
    from ckptbench.packs import read_member
    from ckptbench.sources.base import ReadOptions

    listing = source.list()
    if listing.format == "unknown":
        raise CkptbenchError(f"{listing.source}: no safetensors, torch or torch.distributed.checkpoint files "
                             "found; point at a checkpoint directory")
    if not source.files_on_disk:
        raise CkptbenchError(f"{listing.source}: inspect reads headers from local files; for an object store, "
                             "copy the checkpoint's headers down or run `ckptbench run` against it")
    directory = listing.source
    man = listing.manifest
    rels = listing.rels
    shard_ext = restore.SHARD_EXT[listing.format]
    shards = [r for r in rels if r.endswith(shard_ext)]
    tail = restore.tail_names(directory, man, rels)
    lay = layouts.select(directory, tree.rels(directory))  # the whole directory: which step `latest` names
    entries, others, inert = _entries(directory, listing)
    groups: dict[str, Group] = defaultdict(Group)
    for group, _name, dtype, nbytes in entries:
        groups[group].add(dtype, nbytes)
    sizes = {listing.rel(f.path): f.size or 0 for f in listing.files}
    total = sum(sizes.values())
    payload = sum(g.bytes for g in groups.values())
    largest = max(sizes.items(), key=lambda kv: kv[1]) if sizes else ("", 0)
    opts, why = source.choose_read(listing, ReadOptions(concurrency=concurrency, read="auto", hash="none"))
    tail_bytes = sum(sizes.get(r, 0) for r in tail)
    dims, why_not = None, "no model shape is known"
    if man is not None and man.dims or "config.json" in rels:
        config = {"config.json": read_member(directory, man, "config.json")} if "config.json" in rels else {}
        dims, why = restore.model_dims(man, config, {name for group, name, _, _ in entries if group == "model"})
        why_not = why or why_not
    floating = sum(b for g in groups.values() for d, b in g.dtypes.items()
                   if d.startswith(("float", "bfloat", "complex")))
    check = ("model step: the manifest (or config.json) gives the model's shape, so the restored model runs one "
             "forward step and its output must be finite" if dims is not None else
             f"structural, no model step ({why_not}): every floating value ({floating} bytes) is scanned natively "
             "for NaN/Inf and optimizer parts are checked against their weights")
    return {
        "source": listing.source,
        "format": listing.format,
        "layout": {
            "name": lay.name,
            "tag": lay.tag,
            "manifest": man is not None,
            "ranks": len(lay.ranks) if lay.ranks else _ranks(shards),
            "shards": len(shards),
            "tail_files": len(tail),
            "tail_bytes": tail_bytes,
            "other_entries": others,
            "kept_as_data": sorted(inert),  # classes its pickles name, never imported or run (formats/inert.py)
            "not_read": [{"path": p, "why": why} for p, why in lay.skipped],  # present, deliberately not read
        },
        "groups": {name: {"tensors": g.tensors, "bytes": g.bytes, "dtypes": dict(sorted(g.dtypes.items()))}
                   for name, g in sorted(groups.items())},
        "read_plan": {
            "files": len(sizes),
            "bytes": total,
            "largest_file": {"path": largest[0], "bytes": largest[1]},
            "payload_bytes": payload,
            # bytes read per byte of tensors: headers, pickles, per-chunk framing, and files nothing loads
            "amplification": total / payload if payload else None,
            "read": opts.read,
            "read_why": why,
            "unreadable_dirs": [{"path": d, "error": w} for d, w in listing.skipped],
        },
        "check": check,
        "manifest_hash": man.hash if isinstance(man, mf.Manifest) else None,
    }
