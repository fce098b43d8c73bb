"""The parts of a distributed restore that need no second process: each rank's share of a checkpoint, where a
DCP chunk's elements lie, the exchanges' deadlines over a real torch store, and rank 0's arithmetic."""

from __future__ import annotations

import io
import os
import time

import pytest
import torch
from safetensors.torch import save_file

from ckptbench.distributed import group
from ckptbench.checkpoint.formats.dcp_items import locate
from ckptbench.distributed.rank import merged, plan_analysis
from ckptbench.checkpoint.shares import Piece, Share, plan_share, rows_of
from ckptbench.distributed.summary import combine
from ckptbench.checkpoint.formats import FormatError
from ckptbench.sources import open_source


@pytest.mark.parametrize("n", [0, 1, 3, 7, 10, 64])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_rows_split_as_torch_chunk_splits(n, world):
    chunks = list(torch.arange(n).chunk(world)) if n else []
    for r in range(world):
        lo, hi = rows_of(n, world, r)
        expect = chunks[r].tolist() if r < len(chunks) else []
        assert list(range(lo, hi)) == expect


@pytest.fixture
def foreign(tmp_path):
    """A safetensors checkpoint nobody here wrote: two shards, uneven rows, a 1-d and a 0-d tensor."""
    g = torch.Generator().manual_seed(0)
    a = {"layers.0.w": torch.randn(10, 6, generator=g), "layers.0.b": torch.randn(5, generator=g).bfloat16()}
    b = {"head.w": torch.randn(3, 4, generator=g).half(), "scale": torch.tensor(2.5)}
    save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"))
    return tmp_path, {**a, **b}


def _bytes_of(root, share: Share, piece: Piece) -> bytes:
    with open(os.path.join(root, piece.rel), "rb") as f:
        f.seek(piece.offset)
        return f.read(piece.length)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_safetensors_share_is_each_ranks_rows_exactly(foreign, world):
    root, full = foreign
    listing = open_source(str(root)).list()
    seen: dict[str, list[tuple[int, int]]] = {}
    for rank in range(world):
        share = plan_share(listing, world, rank)
        assert not share.whole  # no file without tensors here
        for sl in share.slices:
            t = full[sl.key]
            lo, hi = rows_of(t.shape[0], world, rank) if t.dim() else (0, 0)
            assert (sl.lo, sl.hi) == (lo, hi)
            raw = b"".join(_bytes_of(root, share, share.pieces[f.piece]) for f in sl.fills)
            want = (t[lo:hi] if t.dim() else t).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert raw == want
            seen.setdefault(sl.key, []).append((lo, hi))
    # every tensor's rows held by exactly one rank; a 0-d tensor by rank 0 alone
    for key, t in full.items():
        spans = sorted(seen[key])
        if t.dim():
            assert spans[0][0] == 0 and spans[-1][1] == t.shape[0]
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        else:
            assert len(spans) == 1


def test_every_rank_reads_everything_with_all(foreign):
    root, _ = foreign
    listing = open_source(str(root)).list()
    sizes = sorted(os.path.getsize(os.path.join(root, r)) for r in listing.rels)
    for rank in range(3):
        share = plan_share(listing, 3, rank, "all")
        assert sorted(p.length for p in share.pieces) == sizes and all(p.whole for p in share.pieces)


def test_an_unknown_policy_or_rank_is_one_line(foreign):
    root, _ = foreign
    listing = open_source(str(root)).list()
    from ckptbench.core.errors import CkptbenchError

    with pytest.raises(CkptbenchError, match="choose part or all"):
        plan_share(listing, 2, 0, "some")
    with pytest.raises(CkptbenchError, match="outside a world of 2"):
        plan_share(listing, 2, 2)


def _item(t: torch.Tensor, pad: int = 77) -> tuple[bytes, int, int]:
    b = io.BytesIO()
    b.write(b"z" * pad)
    torch.save(t, b)
    raw = b.getvalue()
    return raw, pad, len(raw) - pad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64])
def test_a_chunks_elements_are_found_inside_its_archive(tmp_path, dtype):
    t = torch.arange(24, dtype=torch.float32).reshape(6, 4).to(dtype)
    raw, off, length = _item(t)
    p = tmp_path / "shard.distcp"
    p.write_bytes(raw)
    fd = os.open(p, os.O_RDONLY)
    try:
        c = locate(fd, off, length, dtype, (6, 4), "shard")
    finally:
        os.close(fd)
    assert raw[c.offset:c.offset + c.nbytes] == t.reshape(-1).view(torch.uint8).numpy().tobytes()
    assert c.index_bytes < length or length < 8192  # a few KiB of directory, not the whole chunk


def test_a_chunk_that_is_not_what_the_metadata_says_is_refused(tmp_path):
    raw, off, length = _item(torch.zeros(6, 4))
    p = tmp_path / "shard.distcp"
    p.write_bytes(raw)
    fd = os.open(p, os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match=r"metadata says torch.float32 \(4, 4\)"):
            locate(fd, off, length, torch.float32, (4, 4), "shard")
        with pytest.raises(FormatError, match="not a torch.save archive"):
            locate(fd, 0, length, torch.float32, (6, 4), "shard")  # the window starts in the padding
    finally:
        os.close(fd)


def test_a_non_contiguous_save_is_refused_for_ranges(tmp_path):
    t = torch.arange(24.0).reshape(4, 6).t()  # a transposed view: storage is 24 elements, strides (1, 6)
    raw, off, length = _item(t)
    p = tmp_path / "shard.distcp"
    p.write_bytes(raw)
    fd = os.open(p, os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match="not stored row-major"):
            locate(fd, off, length, torch.float32, (6, 4), "shard")
    finally:
        os.close(fd)


def test_a_chunk_pickle_naming_anything_else_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    b = io.BytesIO()
    torch.save({"x": Evil()}, b)
    p = tmp_path / "shard.distcp"
    p.write_bytes(b.getvalue())
    fd = os.open(p, os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match="not a plain tensor"):
            locate(fd, 0, len(b.getvalue()), torch.float32, (1,), "shard")
    finally:
        os.close(fd)


def _world(store, rank: int, size: int, timeout: float = 0.5) -> group.World:
    return group.World(rank, size, rank, "h", "gloo", store, timeout, "t")


def test_gather_names_the_ranks_that_never_posted():
    store = torch.distributed.HashStore()
    w0 = _world(store, 0, 4)
    for r in (0, 2):
        _world(store, r, 4).post({"r": r}, "report", r)
    t = time.monotonic()
    with pytest.raises(group.RankFailure, match=r"rank\(s\) 1, 3 did not reach 'report' within 0.5 s"):
        w0.gather("report")
    assert 0.5 <= time.monotonic() - t < 5


def test_gather_returns_every_ranks_post_in_rank_order():
    store = torch.distributed.HashStore()
    for r in (2, 0, 1):
        _world(store, r, 3).post({"r": r}, "x", r)
    assert _world(store, 0, 3).gather("x") == {0: {"r": 0}, 1: {"r": 1}, 2: {"r": 2}}


def test_merged_intervals_and_the_read_plan_shape():
    assert merged([(5, 9), (0, 3), (3, 4), (8, 12)]) == [(0, 4), (5, 12)]
    share = Share(0, 2, "")
    for rel, off, n, item in [("a", 100, 10, (0, 500)), ("a", 0, 10, (0, 500)), ("b", 0, 5, (0, 50))]:
        share.add(Piece(rel, off, n, False, item))
    plan = plan_analysis(share)
    assert plan["ours"] == {"requests": 3, "bytes": 25, "bytes_per_request": 25 / 3, "backward_seeks": 1,
                            "files_touched": 2}
    # torch's reader reads the stored chunk whole for every request touching it
    assert plan["dcp_reader"]["bytes"] == 500 + 500 + 50 and plan["dcp_reader"]["backward_seeks"] == 1


def _report(rank, intervals, end, status="ok", error=None, nbytes=None):
    return {"rank": rank, "host": "h", "status": status, "error": error, "intervals": intervals, "end_s": end,
            "read_start_s": 0.01 * rank, "read_end_s": end - 0.1, "stages": {"read": end - 0.1},
            "bytes_read": nbytes if nbytes is not None else sum(b - a for ivs in intervals.values() for a, b in ivs),
            "index_bytes": 0, "plan": {"ours": {"requests": sum(len(v) for v in intervals.values()),
                                                "backward_seeks": 0, "files_touched": len(intervals)}}}


def test_rank_zero_combines_amplification_skew_and_the_straggler():
    disjoint = combine([_report(0, {"f": [(0, 100)]}, 1.0), _report(1, {"f": [(100, 300)], "g": [(0, 50)]}, 1.5)])
    assert disjoint["amplification"] == 1.0 and disjoint["unique_bytes"] == 350
    assert disjoint["slowest_rank"] == 1 and disjoint["rto_s"] == 1.5 and disjoint["skew_s"] == pytest.approx(0.5)
    assert disjoint["aggregate_gbps"] == pytest.approx(350 / (1.4 - 0.0) / 1e9)
    assert disjoint["read_plan"]["requests"] == 3 and disjoint["read_plan"]["files_touched_per_rank"] == [1, 2]
    assert disjoint["read_plan"]["bytes_per_request"] == pytest.approx(350 / 3)
    same = combine([_report(r, {"f": [(0, 100)]}, 1.0) for r in range(4)])
    assert same["amplification"] == 4.0 and same["unique_bytes"] == 100


def test_a_failed_rank_is_named_in_the_problems():
    rep = combine([_report(0, {"f": [(0, 10)]}, 1.0),
                   _report(1, {}, 0.2, status="failed", error="x.pt: unreadable (open: No such file)")])
    assert rep["status"] == "failed"
    assert rep["problems"] == ["rank 1 (h): x.pt: unreadable (open: No such file)"]
    assert "rto_s" not in rep


def test_a_rank_never_reads_outside_the_checkpoint(tmp_path):
    """A crafted manifest can put any path in a rank's share: the read refuses it before opening anything."""
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.distributed.rank import RankReport, RankRestore
    from ckptbench.restore.stages import StageClock
    from ckptbench.sources import Listing
    from ckptbench.sources.local import LocalSource

    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 100)
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "link.pt").symlink_to(secret)
    for rel in ("../secret", "link.pt"):
        share = Share(0, 1, "")
        share.add(Piece(rel, 0, 100, True))
        rr = RankRestore(LocalSource(str(root)), Listing(str(root), [], None, "torch"), share, concurrency=1,
                         read="pread", hash_alg="none", device="cpu")
        with pytest.raises(CkptbenchError, match="refusing it"):
            rr._read(StageClock(), RankReport(0, "h", 0), time.perf_counter())


def test_deepspeed_shares_follow_its_layout_and_are_amplified(tmp_path):
    """DeepSpeed has every data-parallel rank read the model states and its own ZeRO partition: the shares say
    so, and the model-states file read twice makes the amplification above 1."""
    from test_torch_layouts import _ds_step

    root = tmp_path / "ds"
    root.mkdir()
    _ds_step(str(root / "global_step7"), 7, n=16)
    (root / "latest").write_text("global_step7\n")
    listing = open_source(str(root)).list()
    shares = [plan_share(listing, 2, r) for r in range(2)]
    model = "global_step7/mp_rank_00_model_states.pt"
    assert {p.rel for p in shares[0].pieces} == {model, "global_step7/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                                 "latest"}
    assert {p.rel for p in shares[1].pieces} == {model, "global_step7/zero_pp_rank_1_mp_rank_00_optim_states.pt"}
    assert all(p.whole for s in shares for p in s.pieces)
    reports = [_report(s.rank, {p.rel: [(0, p.length)] for p in s.pieces}, 1.0) for s in shares]
    doc = combine(reports)
    size = os.path.getsize(root / model)
    assert doc["bytes_read"] - doc["unique_bytes"] == size  # the model states, read by both
    assert doc["amplification"] > 1


def test_rank_zero_sees_every_ranks_stage_and_the_rank_furthest_behind():
    from ckptbench.distributed import live

    store = torch.distributed.HashStore()
    worlds = [_world(store, r, 3) for r in range(3)]
    posters = [live.Poster(w, ("run", 1)) for w in worlds]
    for p in posters:
        p.on_stage("ready")
    seen = []
    with live.Watcher(worlds[0], ("run", 1), seen.append):
        posters[0].on_stage("read")
        posters[0].on_bytes(800, 1000)
        posters[0].on_stage("read")  # a stage change posts at once, whatever the throttle
        posters[1].on_stage("read")
        posters[1].on_bytes(100, 1000)
        posters[1].on_stage("read")
        posters[2].on_stage("load")
        posters[2].on_bytes(500, 500)
        posters[2].on_stage("load")
        time.sleep(live.SHOW_S * 3)
    last = seen[-1]
    assert last.stages == {"read": 2, "load": 1}
    assert (last.bytes, last.needed) == (1400, 2500)
    assert last.behind == 1 and last.behind_fraction == pytest.approx(0.1)


def test_the_cache_condition_of_every_node_is_in_the_result():
    """One rank per node set and measured the cache: the result says the worst node's residency, and that the
    condition did not hold when one node's did not."""
    a = _report(0, {"f": [(0, 10)]}, 1.0)
    b = _report(1, {"g": [(0, 10)]}, 1.0)
    a["cache"] = {"ok": True, "residency_before": 0.01, "cache_verified": True, "note": ""}
    b["cache"] = {"ok": True, "residency_before": 0.40, "cache_verified": False, "note": "not cold: 40% resident"}
    rep = combine([a, b])
    assert rep["cache"] == {"residency_before": 0.40, "residency_before_min": 0.01, "verified": False,
                            "notes": ["not cold: 40% resident"]}
    b["cache"] = None  # a second rank on the same node reports no cache of its own
    assert combine([a, b])["cache"] == {"residency_before": 0.01, "residency_before_min": 0.01, "verified": True,
                                        "notes": []}


def test_the_digests_line_names_the_ranks_it_is_about():
    """"NOT VERIFIED (… on some rank)" named none: the ranks whose last repeat matched nothing, or that failed."""
    from ckptbench.cli.dist import _ranks_where

    def doc(verified, statuses=None):
        ranks = [{"rank": k, "status": (statuses or {}).get(k, "ok"), "verified": v} for k, v in enumerate(verified)]
        return {"repeats": [{"ranks": ranks}]}, {"ranks": ranks}

    assert _ranks_where(*doc([True, False, True, False])) == " on ranks 1, 3"
    assert _ranks_where(*doc([True, False])) == " on rank 1"
    assert _ranks_where(*doc([False, False])) == " on every rank"
    assert _ranks_where(*doc([False, True, True], {2: "failed"})) == " on rank 2"  # a failure comes first
    assert _ranks_where(*doc([False] * 12 + [True])).endswith("7 and 4 more")


@pytest.mark.parametrize("requested, said", [("hot", "≥ 97 % on every node"), ("cold", "≤ 99 % on every node"),
                                             ("as-is", "97 %–99 % across the nodes")])
def test_the_nodes_residency_is_said_as_the_condition_reads_it(requested, said):
    """A hot run said "residency before ≤ 100 %": true of any run. Hot is held by the least resident node."""
    from ckptbench.cli.dist import _residency

    assert _residency({"requested": requested, "residency_before": 0.99, "residency_before_min": 0.97}) == said


def test_a_local_restore_says_its_page_cache_is_local_and_the_line_reads_it_so():
    """cache_line told an S3 run by its note's wording; the cache document says it in a field."""
    from ckptbench.cli.run import cache_line

    c = {"requested": "cold", "residency_before": 0.0, "verified": True, "notes": [], "local": True}
    assert "cold: evicted first, verified" in cache_line(c, 1)
    assert "cold: nothing local to evict, verified" in cache_line(c | {"local": False}, 1)
