"""What each rank of a distributed restore reads: its share of the checkpoint at the current world size.

Two policies. `part` (the default) is what a sharded trainer needs: files that carry a rank (ckptbench's rank
shards, DeepSpeed's partitions, per-rank data-loader state) go to that rank when the world size matches the
save; tensors in formats that can be read by byte range (safetensors, DCP) are split along dim 0 as FSDP shards
them (torch.chunk: rank r of W holds rows [r·c, (r+1)·c), c = ceil(rows / W)) and each rank reads exactly those
rows, whatever world size wrote them; everything else goes to rank 0, once. `all` is a replicated (DDP-style)
restore: every rank reads every file.

The share is computed from headers and metadata only, the same on every rank, so rank 0 can analyse every
rank's plan without asking them.
"""

from __future__ import annotations

import collections
import math
import os
import re
from dataclasses import dataclass, field

import torch

from ckptbench.checkpoint import confine
from ckptbench.checkpoint import layouts
from ckptbench.core.errors import CkptbenchError
from ckptbench.core.options import EACH_RANK
from ckptbench.checkpoint.layouts import SHARD_EXT

POLICIES = EACH_RANK  # --each-rank: part (its own share) or all (every rank reads everything)
_DS_TAG = re.compile(r"zero_pp_rank_(\d+)")
_DS_MP = re.compile(r"(?:^|_)mp_rank_(\d+)_model_states\.pt$")


@dataclass(frozen=True)
class Piece:
    """One read request: [offset, offset+length) of a file of the checkpoint (`whole`: the entire file)."""

    rel: str
    offset: int
    length: int
    whole: bool
    item: tuple[int, int] | None = None  # DCP: the stored chunk (offset, length) this range lies in


@dataclass(frozen=True)
class Fill:
    """A piece's bytes are a row-major block of `box` (per-dim (start, length)) in the rank's local tensor."""

    piece: int
    box: tuple[tuple[int, int], ...]


@dataclass
class Slice:
    """The rows [lo, hi) of one tensor that a rank holds, and the pieces that fill them."""

    key: str
    dtype: torch.dtype
    full: tuple[int, ...]
    lo: int
    hi: int
    fills: list[Fill] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.hi - self.lo,) + self.full[1:] if self.full else ()


@dataclass
class Share:
    """One rank's reads and what they become."""

    rank: int
    world: int
    how: str  # what this share is, in words
    pieces: list[Piece] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    whole: list[str] = field(default_factory=list)  # files loaded by their format's own loader
    byte_entries: list[tuple[str, int]] = field(default_factory=list)  # DCP bytes entries: (key, piece)
    index_bytes: int = 0  # headers, .metadata and chunk indexes read to make the plan (not payload)
    state_files: list[str] = field(default_factory=list)  # a Trainer's torch.save state among `whole`
    complete: bool = False  # the share is the whole checkpoint (one rank, or every rank reads everything)

    @property
    def needed(self) -> int:
        return sum(p.length for p in self.pieces)

    def add(self, piece: Piece) -> int:
        self.pieces.append(piece)
        return len(self.pieces) - 1

    def in_file_order(self) -> "Share":
        """The same share with its requests in file and offset order (the engine issues them in list order: a
        file read front to back, no seek backwards), every reference to a piece renumbered."""
        order = sorted(range(len(self.pieces)), key=lambda i: (self.pieces[i].rel, self.pieces[i].offset))
        new_index = {old: new for new, old in enumerate(order)}
        self.pieces = [self.pieces[i] for i in order]
        for sl in self.slices:
            sl.fills = [Fill(new_index[f.piece], f.box) for f in sl.fills]
        self.byte_entries = [(k, new_index[i]) for k, i in self.byte_entries]
        return self


def rows_of(n: int, world: int, rank: int) -> tuple[int, int]:
    """torch.chunk's split of n rows: chunks of ceil(n / world), the last ranks possibly empty."""
    c = -(-n // world) if n else 0
    return min(n, rank * c), min(n, (rank + 1) * c)


def file_rank(rel: str, ranks: dict[str, int | None]) -> int | None:
    """The rank a file belongs to: the manifest's record (`ranks`), else DeepSpeed's partition tag; None for
    shared files."""
    if rel in ranks:
        return ranks[rel]
    m = _DS_TAG.search(os.path.basename(rel))
    return int(m.group(1)) if m else None


def saved_world(listing) -> int | None:
    """How many ranks wrote the checkpoint, where it says: the manifest, DeepSpeed's partitions, DCP's files."""
    man = listing.manifest
    if man is not None:
        return man.world_size
    rels = listing.rels
    tags = {int(m.group(1)) for r in rels if (m := _DS_TAG.search(os.path.basename(r)))}
    if tags:
        return len(tags)
    if listing.format == "dcp":  # a file per rank in each DCP folder (FSDP's model and optimizer folders: two)
        per = collections.Counter(os.path.dirname(r) for r in rels if r.endswith(".distcp"))
        return max(per.values()) if per else None
    return None


def _row_bytes(full: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(full[1:]) * dtype.itemsize


def _rows_piece(share: Share, rel: str, dtype, full, data_at: int, box_off: tuple[int, ...],
                box_size: tuple[int, ...], sl: Slice, item: tuple[int, int] | None = None) -> None:
    """The part of one stored block (`box_off`/`box_size` in the full tensor, row-major at `data_at` in `rel`)
    that falls in the slice's rows: one contiguous byte range, since whole rows of the block are contiguous."""
    if not full:  # a 0-d tensor is one element
        i = share.add(Piece(rel, data_at, dtype.itemsize, False, item))
        sl.fills.append(Fill(i, ()))
        return
    r0, r1 = max(sl.lo, box_off[0]), min(sl.hi, box_off[0] + box_size[0])
    if r0 >= r1:
        return
    row = _row_bytes(box_size, dtype)
    i = share.add(Piece(rel, data_at + (r0 - box_off[0]) * row, (r1 - r0) * row, False, item))
    sl.fills.append(Fill(i, ((r0 - sl.lo, r1 - r0),) + tuple(zip(box_off[1:], box_size[1:]))))


def _slice_for(key: str, dtype, full: tuple[int, ...], world: int, rank: int) -> Slice | None:
    if not full:  # 0-d tensors (step counters) live with rank 0
        return Slice(key, dtype, full, 0, 0) if rank == 0 else None
    lo, hi = rows_of(full[0], world, rank)
    return Slice(key, dtype, full, lo, hi)


def _safetensors_rows(share: Share, root: str, rels: list[str]) -> None:
    from ckptbench.checkpoint.formats.safetensors_format import header_entries

    for rel in rels:
        path = confine.resolve(root, rel)
        entries = header_entries(path)
        data_len = max((e[3] for e in entries.values()), default=0)
        base = os.stat(path).st_size - data_len  # the tensors tile the data section to the end (checked)
        share.index_bytes += base
        prefix = layouts.model_prefix(os.path.basename(rel))  # Accelerate's second model: its own `weight`
        for key, (dtype, shape, start, _) in sorted(entries.items(), key=lambda kv: kv[1][2]):
            full = tuple(shape)
            sl = _slice_for(prefix + key, dtype, full, share.world, share.rank)
            if sl is None:
                continue
            _rows_piece(share, rel, dtype, full, base + start, (0,) * len(full), full, sl)
            share.slices.append(sl)


def _dcp_rows(share: Share, root: str, sub: str = "") -> None:
    """Rows of every tensor from the DCP chunks that hold them (any world size saved them); byte entries to
    rank 0. Each needed chunk's archive index is read (a few KiB) to find where its elements lie. `sub`: the
    folder below `root` holding the .metadata (FSDP's model or optimizer folder); pieces are named from `root`."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex, TensorStorageMetadata

    from ckptbench.checkpoint.formats.dcp_items import locate
    from ckptbench.checkpoint.formats.dcp_metadata import SafeReader

    at = sub + "/" if sub else ""
    root = os.path.join(root, sub) if sub else root
    reader = SafeReader(root)
    meta = reader.read_metadata()
    share.index_bytes += os.stat(os.path.join(root, ".metadata")).st_size
    storage = meta.storage_data
    fds: dict[str, int] = {}
    try:
        for fqn, md in meta.state_dict_metadata.items():
            if isinstance(md, BytesStorageMetadata):
                if share.rank == 0:
                    info = storage[MetadataIndex(fqn)]  # checked to be there; a scan per entry was quadratic
                    share.byte_entries.append((fqn, share.add(Piece(at + str(info.relative_path), info.offset,
                                                                    info.length, False))))
                continue
            if not isinstance(md, TensorStorageMetadata):
                continue
            full = tuple(md.size)
            sl = _slice_for(fqn, md.properties.dtype, full, share.world, share.rank)
            if sl is None:
                continue
            for c in md.chunks:
                off, size = tuple(c.offsets), tuple(c.sizes)
                if 0 in size or (full and (off[0] >= sl.hi or off[0] + size[0] <= sl.lo or sl.lo == sl.hi)):
                    continue  # an empty chunk (torch.chunk leaves some) or rows this rank does not hold
                info = storage[MetadataIndex(fqn, off)]
                rel = str(info.relative_path)
                if rel not in fds:
                    fds[rel] = confine.open_member(root, rel)
                where = f"{root}/{rel}: entry {fqn[:80]!r} at {info.offset}+{info.length}"
                data = locate(fds[rel], info.offset, info.length, md.properties.dtype, size, where)
                share.index_bytes += data.index_bytes
                _rows_piece(share, at + rel, md.properties.dtype, full, data.offset, off, size, sl,
                            (info.offset, info.length))
            share.slices.append(sl)
    finally:
        for fd in fds.values():
            os.close(fd)


def _sizes(listing) -> dict[str, int]:
    """Every file the restore owes: those listed, and those the manifest records but the listing lacks (a
    missing file stays in its rank's share, so that rank fails naming it)."""
    sizes = {e.path: e.bytes for e in listing.manifest.files} if listing.manifest is not None else {}
    sizes.update(zip(listing.rels, (f.size or 0 for f in listing.files)))
    return sizes


def _manifest_ranks(man) -> dict[str, int | None]:
    return {e.path: e.rank for e in man.files} if man is not None else {}


def _whole_files(share: Share, sizes: dict[str, int], rels: list[str]) -> None:
    for rel in rels:
        share.add(Piece(rel, 0, sizes[rel], True))
        share.whole.append(rel)


def _owner_of_files(fmt: str, sizes: dict[str, int], ranks: dict[str, int | None], world: int,
                    rels: list[str]) -> dict[str, list[int]]:
    """Whole files to ranks: a file with a rank to that rank (mod the world size); DeepSpeed's model states
    (mp_rank_XX) to every rank, as DeepSpeed has each data-parallel rank read them; other tensor files spread
    by size (largest first, to the least loaded rank); small shared files to rank 0."""
    owners: dict[str, list[int]] = {}
    spread = []
    for rel in rels:
        r = file_rank(rel, ranks)
        if r is not None:
            owners[rel] = [r % world]
        elif _DS_MP.search(os.path.basename(rel)):
            owners[rel] = list(range(world))
        elif rel.endswith(SHARD_EXT.get(fmt, ())):
            spread.append(rel)
        else:
            owners[rel] = [0]
    load = [0] * world
    for rel in sorted(spread, key=lambda r: (-sizes[r], r)):
        r = min(range(world), key=lambda i: load[i])
        load[r] += sizes[rel]
        owners[rel] = [r]
    return owners


def plan_share(listing, world: int, rank: int, policy: str = "part") -> Share:
    """Rank `rank`'s share of `listing` (a local checkpoint directory) at world size `world`."""
    if policy not in POLICIES:
        raise CkptbenchError(f"--each-rank {policy!r}: choose part or all")
    if not 0 <= rank < world:
        raise CkptbenchError(f"rank {rank} is outside a world of {world}")
    root, fmt = listing.source, listing.format
    sizes, ranks = _sizes(listing), _manifest_ranks(listing.manifest)
    # the listing holds the files the checkpoint's layout restores already (the source selected them)
    rels = listing.rels + sorted(set(sizes) - set(listing.rels))
    if listing.layout is not None:  # resume.choose's, computed once by the source
        state = set(listing.layout.state_files)
    else:
        top = {r for r in listing.rels if "/" not in r}
        state = set(layouts.trainer_state_files(top)) if layouts.is_trainer(top) else set()
    if policy == "all":
        share = Share(rank, world, "every file, whole (a replicated restore: every rank reads everything)",
                      complete=True)
        _whole_files(share, sizes, rels)
        share.state_files = [r for r in share.whole if r in state]
        return share
    saved = saved_world(listing)
    tensors = [r for r in rels if r.endswith(SHARD_EXT.get(fmt, ()))]
    by_rank = bool(ranks) and saved == world and all(file_rank(r, ranks) is not None for r in tensors)
    if fmt == "dcp" or (fmt == "safetensors" and not by_rank):
        share = Share(rank, world, f"rows {'' if world == 1 else 'r·c..(r+1)·c '}of every tensor along dim 0 "
                                   f"(torch.chunk over {world} rank(s), as FSDP shards), read by byte range",
                      complete=world == 1)
        if fmt == "dcp":
            subs = listing.layout.dcp_dirs if listing.layout is not None and listing.layout.dcp_dirs else ("",)
            for sub in subs:  # the checkpoint's own .metadata, or FSDP's model and optimizer folders'
                _dcp_rows(share, root, sub)
            rest = [r for r in rels if not r.endswith(".distcp") and r.rsplit("/", 1)[-1] != ".metadata"]
        else:
            _safetensors_rows(share, root, tensors)
            rest = [r for r in rels if r not in set(tensors)]
        owners = _owner_of_files(fmt, sizes, ranks, world, rest)
        _whole_files(share, sizes, [r for r in rest if rank in owners[r]])
        share.state_files = [r for r in share.whole if r in state]
        return share.in_file_order()
    owners = _owner_of_files(fmt, sizes, ranks, world, rels)
    how = (f"its own files (rank {rank} of a {saved}-rank save)" if saved == world else
           f"whole files spread over {world} rank(s) (saved by {saved or 'an unknown number of'} rank(s): "
           f"{fmt} shards are not split by range)")
    share = Share(rank, world, how, complete=world == 1)
    _whole_files(share, sizes, [r for r in rels if rank in owners[r]])
    return share


def tensors_of(share: Share, bufs) -> tuple[dict[str, torch.Tensor], dict[str, object], float]:
    """Every slice of `share` from `bufs`, the read buffers of its pieces in order, by key; its DCP byte entries'
    values, loaded safely; the seconds spent copying. A slice one piece fills whole is a view of that buffer, the
    read's memory (no copy); one filled from several stored chunks (another world size saved them) is copied into a
    tensor of its own."""
    import time

    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, object] = {}
    assembling = 0.0
    for sl in share.slices:
        fills = sl.fills
        if len(fills) == 1 and (not sl.full or fills[0].box[1:] == tuple((0, n) for n in sl.full[1:])):
            t = torch.frombuffer(bufs[fills[0].piece], dtype=sl.dtype) if share.pieces[fills[0].piece].length \
                else torch.empty(0, dtype=sl.dtype)
            t = t.reshape(sl.shape)  # the read buffer becomes the tensor's storage: no copy
        else:  # rows from several stored chunks: copied into one tensor
            t0 = time.perf_counter()
            t = torch.empty(sl.shape, dtype=sl.dtype)
            for f in fills:
                view = t
                for dim, (start, n) in enumerate(f.box):
                    view = view.narrow(dim, start, n)
                view.copy_(torch.frombuffer(bufs[f.piece], dtype=sl.dtype).reshape(view.shape))
            assembling += time.perf_counter() - t0
        tensors[sl.key] = t
    if share.byte_entries:
        from ckptbench.checkpoint.formats.dcp_format import load_byte_entry

        for key, i in share.byte_entries:
            entries[key] = load_byte_entry(bytes(bufs[i]))
    return tensors, entries, assembling


def put(state, key: str, t: torch.Tensor, fmt: str) -> None:
    """A slice under the name the single-process loader of its format gives it: DCP's `model.` is the state dict's
    container (dcp_format drops it), a safetensors or torch key's `model.` is part of the weight's own name."""
    from ckptbench.checkpoint.formats import group_of

    if group_of(key) == "model":
        state.model[key.removeprefix("model.") if fmt == "dcp" else key] = t
    else:
        state.extra[key] = t
