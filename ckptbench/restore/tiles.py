"""A DCP restore that lands every stored chunk's elements in memory of their own, as the ranks of a distributed
restore do, instead of reading each .distcp file whole and copying every chunk out of it.

DCP stores each chunk as a torch.save archive at any offset of its file, so a chunk's elements are never aligned
in a buffer that holds the file: the load copied every chunk into a tensor of its own, populating a second copy of
the state in fresh memory (58 % of a 2.1 GiB restore's RTO here, hot). Read by range, each chunk's elements land
page-aligned in a buffer that becomes the tensor (checkpoint/shares: the plan a rank of one makes), and a tensor
saved in several chunks is copied together once.

Every byte of every file is still read and hashed: the files are tiled (the chunks' elements, and the ranges
between them: archive headers, pickles, byte entries), and with crc32c the tiles' CRCs combine into each file's, which
is checked against the manifest as before. A digest that does not combine (md5, sha256, xxh64), a read mode asked
for by name, a source whose bytes are not on a filesystem, or tiles that would overlap keep the whole-file read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import fastio

from ckptbench.checkpoint.shares import Piece, Share, plan_share
from ckptbench.sources import Listing

COMBINES = ("none", "crc32c")  # digests whose tiles combine into the file's (none: nothing to combine)
WHY = ("byte ranges: pread, so that each DCP chunk's elements land in memory of their own (O_DIRECT needs "
       "4096-aligned ones)")


@dataclass
class Tiling:
    """The plan: `listing`, the tiles as a listing of byte ranges (whole files for those the share reads whole),
    which file of the original listing each tile belongs to, and for each of the share's pieces its tile."""

    share: Share
    listing: Listing
    file_of: list[int]
    tile_of: list[int]


def usable(listing: Listing, alg: str, asked_read: str, fused: bool, on_disk: bool) -> bool:
    """Whether a restore of `listing` lands its chunks by range: a fused DCP restore of files on a filesystem,
    hashed with a digest whose tiles combine, its read mode left to ckptbench (auto) or pread."""
    return listing.format == "dcp" and fused and on_disk and alg in COMBINES and asked_read in ("auto", "pread")


def plan(listing: Listing) -> Tiling | None:
    """The tiling of `listing` (reads each chunk's archive index: a few KiB a chunk); None where the share's
    ranges overlap (a crafted metadata) or two DCP folders name one key (the whole-file read then loads and checks
    it as before)."""
    share = plan_share(listing, 1, 0)
    keys = [sl.key for sl in share.slices] + [key for key, _ in share.byte_entries]
    if len(set(keys)) != len(keys):  # FSDP's model and optimizer folders naming one key: the whole-file load
        return None  # refuses it in one line (load.dcp_state); pieces are keyed by name and would hold only one
    ranged: dict[str, list[int]] = {}
    for i, p in enumerate(share.pieces):
        if not p.whole:
            ranged.setdefault(p.rel, []).append(i)
    specs: list[fastio.FileSpec] = []
    file_of: list[int] = []
    tile_of = [-1] * len(share.pieces)
    for k, (f, rel) in enumerate(zip(listing.files, listing.rels)):
        pieces = sorted(ranged.get(rel, ()), key=lambda i: share.pieces[i].offset)
        if not pieces or f.offset is not None or f.size is None:
            specs.append(f)
            file_of.append(k)
            continue
        at = 0
        for i in pieces:
            p: Piece = share.pieces[i]
            if p.offset < at or p.offset + p.length > f.size:
                return None
            if p.offset > at:  # what lies between: headers, pickles, byte entries' neighbours
                specs.append(fastio.FileSpec(f.path, p.offset - at, offset=at))
                file_of.append(k)
            tile_of[i] = len(specs)
            specs.append(fastio.FileSpec(f.path, p.length, offset=p.offset))
            file_of.append(k)
            at = p.offset + p.length
        if at < f.size:
            specs.append(fastio.FileSpec(f.path, f.size - at, offset=at))
            file_of.append(k)
    whole = {os.path.join(listing.source, p.rel): i for i, p in enumerate(share.pieces) if p.whole}
    for t, spec in enumerate(specs):
        i = whole.get(spec.path)
        if i is not None and spec.offset is None:
            tile_of[i] = t
    if any(t < 0 for t in tile_of):  # a piece of a file the listing lacks (the manifest promises it): not tiled
        return None
    return Tiling(share, replace(listing, files=specs), file_of, tile_of)


def fold(tiling: Tiling, listing: Listing, res: fastio.ReadResult) -> fastio.ReadResult:
    """The tiles' read as the read of `listing`'s files: each file's bytes, its digest (the tiles' CRCs combined in
    order; None when a tile failed or nothing was hashed) and its first error; a file read whole keeps its buffer,
    a tiled one has none (its chunks are the share's)."""
    per_file: list[list[fastio.FileResult]] = [[] for _ in listing.files]
    buffers: list = [None] * len(listing.files)
    for t, (k, r) in enumerate(zip(tiling.file_of, res.files)):
        per_file[k].append(r)
        if tiling.listing.files[t].offset is None and res.buffers:
            buffers[k] = res.buffers[t]
    files = []
    for f, tiles in zip(listing.files, per_file):
        err = next((r.error for r in tiles if r.error is not None), None)
        digest = None
        if err is None and tiles and all(r.digest is not None for r in tiles):
            crc = int(tiles[0].digest, 16)
            for r in tiles[1:]:
                crc = fastio.crc32c_combine(crc, int(r.digest, 16), r.bytes)
            digest = f"{crc:08x}"
        files.append(fastio.FileResult(f.path, sum(r.bytes for r in tiles), digest,
                                       max((r.seconds for r in tiles), default=0.0),
                                       max((r.attempts for r in tiles), default=0), err))
    return replace(res, files=tuple(files), buffers=tuple(buffers))


def piece_buffers(tiling: Tiling, res: fastio.ReadResult) -> list:
    """The read buffer of each of the share's pieces, in the share's order (what shares.tensors_of takes)."""
    return [res.buffers[t] for t in tiling.tile_of]
