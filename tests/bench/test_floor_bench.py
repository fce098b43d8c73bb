"""The floor in the peers benchmark: which floor each row is held against, the efficiency targets, and the agreement
checks' pure parts (reading the floor's method lines, pooling, spread) and the C population loop. No timing is
asserted."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time

import pytest

import _floor_agree as agree
import _floor_bench as fb
import _peers_rounds as rounds
from ckptbench.system import floor as fl


def series(key: str, samples: list[float]) -> rounds.PeerSeries:
    cond = key.split("/")[0]
    s = rounds.PeerSeries(key, cond, "s", loader=key.split("/", 1)[1])
    for v in samples:
        s.add(v, 0.0 if cond == "cold" else 1.0)
    return s


def ceiling(gbps: float, method: str, sample: int = 0) -> fl.Ceiling:
    return fl.Ceiling(gbps, gbps, gbps, method, time.time(), sample)


def a_floor(storage_gbps: float = 2.0, sample: int = 1 << 30) -> fl.Floor:
    memory = {"populate_4k": ceiling(3.0, "MADV_POPULATE_WRITE, 4 KiB pages, 2 thread(s) of 1, 2"),
              "populate_thp": ceiling(5.0, "MADV_POPULATE_WRITE, transparent huge pages, 1 thread(s) of 1, 2"),
              "copy": ceiling(8.0, "memmove, 1 thread(s) of 1, 2")}
    return fl.Floor({"cores": 2}, memory,
                    ceiling(storage_gbps, "the source's 4 largest file(s) (1024 MiB) read cold with direct, "
                                          "concurrency 16 of 1, 4, 16", sample), mount="/ (ext4)")


def test_each_row_is_held_against_its_own_floor():
    assert fb.row_model("hot/ckptbench") == "hot" and fb.row_model("cold/runai") == "cold"
    assert fb.row_model("cold/ckptbench/read") == "cold-reused"
    assert fb.row_model("cold/ckptbench/read-stage") == "cold"
    assert fb.row_model("cold/ckptbench/check-stage") is None


def test_the_set_floor_is_the_slowest_resource_fresh_or_reused():
    floors = fb.models(a_floor(), 10 * 10**9)
    # 10 GB populated (THP, 5 GB/s), then copied into (8 GB/s), one after the other
    assert floors["hot"]["binding"] == "fresh memory" and floors["hot"]["floor_s"] == pytest.approx(10 / 5 + 10 / 8)
    assert floors["cold"]["binding"] == "storage" and floors["cold"]["floor_s"] == pytest.approx(5.0)
    assert floors["cold-reused"]["times_s"] == {"storage": pytest.approx(5.0)}
    assert fb.efficiency(floors, "cold/safetensors", 10.0) == pytest.approx(0.5)
    assert fb.efficiency(floors, "cold/ckptbench/check-stage", 1.0) is None


def test_a_storage_sample_too_small_leaves_the_cold_floor_to_memory():
    floors = fb.models(a_floor(sample=1 << 20), 10 * 10**9)
    assert floors["cold"]["binding"] == "fresh memory" and floors["cold-reused"]["floor_s"] is None
    assert any("fresh memory only" in line for line in fb.ceilings_lines(a_floor(sample=1 << 20), floors, 10**10))


@pytest.mark.parametrize("mine, peer, status", [(5.5, 8.0, "met"), (6.0, 8.0, "MISSED"), (5.5, 5.0, "MISSED")])
def test_ckptbench_needs_085_of_the_floor_and_at_least_every_peers_efficiency(mine, peer, status):
    floors = fb.models(a_floor(), 10 * 10**9)  # cold floor 5 s: 5.5 s is 0.91, 6 s is 0.83
    sr = {s.key: s for s in (series("cold/ckptbench", [mine]), series("cold/runai", [peer]))}
    v = fb.targets(sr, floors, ["runai"])
    cold = [x for x in v if x["target"].startswith("cold")]
    assert len(cold) == 2
    assert [x["status"] for x in cold].count("MISSED") == (status == "MISSED")
    assert cold[1]["value"] == pytest.approx(peer / mine)


def test_an_unmeasured_peer_is_not_measured_not_met():
    floors = fb.models(a_floor(), 10**9)
    v = fb.targets({"hot/ckptbench": series("hot/ckptbench", [1.0])}, floors, ["runai"])
    assert v[1]["status"] == "not measured"


def test_the_floors_method_lines_give_the_read_path_and_the_threads():
    f = a_floor()
    assert agree.storage_how(f.storage.method) == ("direct", 16)
    assert agree.storage_how("something else") is None
    assert agree.threads_of(f.ceilings["populate_4k"].method) == 2


def test_fio_replays_the_sweep_the_storage_figure_is_the_best_of(tmp_path, monkeypatch):
    """The storage figure is the best of its sweep's cold reads: fio's side replays that sweep, a read at each
    concurrency it read at, read out of the method line storage_ceiling writes (its reads into reused buffers; those
    into fresh memory apart)."""
    import fastio
    from ckptbench.system import sourcefigures

    path = tmp_path / "shard.bin"
    path.write_bytes(os.urandom(8 << 20))
    swept = []
    real = fastio.read_files

    def counted(specs, **kw):
        if not kw.get("into_memory"):
            swept.append(kw["concurrency"])
        return real(specs, **kw)

    monkeypatch.setattr(fastio, "read_files", counted)
    c, _ = sourcefigures.storage_ceiling([(str(path), 8 << 20)], levels=(1, 4))
    assert sorted(agree.storage_sweep(c.method)) == sorted(swept) and len(swept) >= 3, (c.method, swept)
    assert agree.storage_sweep("read cold with direct, concurrency 8, nothing else said") == [8]
    assert agree.storage_sweep("no sweep said") == [1]


def test_the_sample_is_the_largest_files_up_to_the_floors_sample():
    files = [("a", 100), ("b", fl.STORAGE_SAMPLE), ("c", 5)]
    assert agree.sample(files) == [("b", fl.STORAGE_SAMPLE)]
    assert agree.sample([("a", 1), ("c", 5)]) == [("c", 5), ("a", 1)]


def run(**gbps) -> dict:
    return {"wall_s": 1.0, "rc": 0, "problem": "", "doc": {
        "ceilings": {k: {"gbps": v, "method": "m"} for k, v in gbps.items() if k != "storage"},
        "storage": {"gbps": gbps["storage"], "method": "m"} if "storage" in gbps else None}}


def test_spread_is_max_minus_min_over_the_median_and_storage_is_judged_apart():
    runs = [run(copy=10.0, storage=1.0), run(copy=11.0, storage=2.0), run(copy=10.5, storage=1.5)]
    assert agree.spread_of(runs) == {"copy": pytest.approx(1 / 10.5), "storage": pytest.approx(1 / 1.5)}
    v = agree.box_verdicts(runs)
    assert [x["status"] for x in v] == ["met", "MISSED", "met"]
    assert "wall time" in v[2]["target"]


def test_the_sets_floors_spread_over_the_runs_is_judged():
    def whole(storage_gbps: float) -> dict:
        doc = a_floor(storage_gbps).to_json() | {"restore": {"bytes": 10 * 10**9}}
        return {"wall_s": 1, "rc": 0, "problem": "", "doc": doc}
    v = {x["target"]: x for x in agree.box_verdicts([whole(2.0), whole(2.1), whole(2.0)])}
    cold = next(x for t, x in v.items() if "cold floor" in t)
    assert cold["status"] == "met" and cold["value"] == pytest.approx((5.0 - 10 / 2.1) / 5.0)
    hot = next(x for t, x in v.items() if "hot floor" in t)
    assert hot["status"] == "met" and hot["value"] == 0.0  # the storage figure does not move a hot floor
    apart = {x["target"]: x for x in agree.box_verdicts([whole(2.0), whole(3.0)])}
    assert next(x for t, x in apart.items() if "cold floor" in t)["status"] == "MISSED"


def test_pooled_figures_take_only_runs_measured_the_same_way():
    f = a_floor()
    same = {"wall_s": 1, "rc": 0, "problem": "", "doc": {"ceilings": {}, "storage": {
        "gbps": 4.0, "method": f.storage.method}}}
    other = {"wall_s": 1, "rc": 0, "problem": "", "doc": {"ceilings": {}, "storage": {"gbps": 100.0, "method": "x"}}}
    assert agree.pooled(f, [same, other], "storage").gbps == pytest.approx(3.0)  # median of 2.0 and 4.0
    assert agree.pooled(f, [], "hash_md5") is None


def test_ratio_verdicts_take_the_ten_percent_band():
    assert agree.ratio_verdict("x", 1.1, agree.AGREE_BAND)["status"] == "met"
    assert agree.ratio_verdict("x", 0.89, agree.AGREE_BAND)["status"] == "MISSED"
    assert agree.ratio_verdict("x", None, agree.AGREE_BAND, why_not="no fio")["detail"] == "no fio"


def test_interleaved_checks_alternate_which_side_goes_first_and_settle_before_each(monkeypatch):
    import _harness as h

    events = []
    monkeypatch.setattr(h, "SETTLE_S", 5.0)
    monkeypatch.setattr(h.time, "sleep", lambda s: events.append("settle"))
    sides = {"floor": iter([1.0, None, 3.0]), "c": iter([2.0, 4.0, 6.0])}

    def side(name):
        return lambda: events.append(name) or next(sides[name])

    mine, theirs = agree.interleaved(side("floor"), side("c"), rounds=3)
    assert events == ["settle", "floor", "settle", "c", "settle", "c", "settle", "floor", "settle", "floor",
                      "settle", "c"]
    assert mine == [1.0, 3.0] and theirs == [2.0, 4.0, 6.0]  # a failed sample is left out
    v = agree._interleaved_verdict("x", 4.0, mine, theirs, "C")
    assert v["value"] == pytest.approx(0.5) and v["status"] == "MISSED" and "1.000× the C loop's" in v["detail"]
    assert agree._interleaved_verdict("x", 4.0, [], theirs, "C")["status"] == "not measured"
    events.clear()
    agree.interleaved(side("floor"), side("c"), rounds=0)
    assert agree.interleaved(lambda: 1.0, lambda: 1.0, rounds=2, wait=False) == ([1.0, 1.0], [1.0, 1.0])
    assert events == []


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_floors_code_and_the_c_loop_populate_in_turn(monkeypatch):
    import _harness as h

    monkeypatch.setattr(h, "SETTLE_S", 0.0)  # the settle's order is the test above's
    ceilings = {k: c for k, c in a_floor().ceilings.items() if k.startswith("populate")}
    ceilings["populate_at_1024m"] = ceiling(2.0, "MADV_POPULATE_WRITE, 4 KiB pages (a plain allocation's), one "
                                                 "sample of 1024 MiB (16 MiB of it in the 2.5 s the sample may "
                                                 "take), 2 thread(s), fresh", 1 << 30)
    verdicts, record = agree.c_population(ceilings, 8 << 20, rounds=2)
    assert len(verdicts) == 3 and all(v["value"] > 0 for v in verdicts), verdicts
    assert len(record["populate_4k"]["c_gbps"]) == 2 and len(record["populate_4k"]["floor_code_gbps"]) == 2
    assert record["populate_4k"]["threads"] == 2 and record["populate_thp"]["threads"] == 1
    # the restore-size figure: the floor's own populate_large at its class, the C loop over the bytes it populated
    assert record["populate_at_1024m"]["bytes"] == 16 << 20 and len(record["populate_at_1024m"]["c_gbps"]) == 2


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_page_cache_copy_is_held_against_a_c_pread_loop_at_its_thread_count(tmp_path, monkeypatch):
    from ckptbench.system import sourcefigures

    monkeypatch.setattr(sourcefigures, "HOT_BYTES", 8 << 20)
    monkeypatch.setattr(sourcefigures, "MIN_STORAGE_SAMPLE", 4 << 20)  # a real sample is 64 MiB or more: kept small here
    paths = []
    for i in range(2):
        p = tmp_path / f"shard-{i}.bin"
        p.write_bytes(os.urandom(6 << 20))
        paths.append((str(p), 6 << 20))
    storage, _ = sourcefigures.storage_ceiling(paths, levels=(1, 2), repeats=1)  # the method line the check parses
    assert storage.hot_gbps > 0 and agree.hot_threads(storage.method) in (1, 2)
    # the probe runs in a fresh process, with the module's real HOT_BYTES: 256 MiB asked of 12, whole MiB taken
    verdict, record = agree.c_page_cache(storage, paths, rounds=2)
    assert verdict["value"] > 0 and len(record["c_gbps"]) == 2 and len(record["floor_code_gbps"]) == 2
    assert record["threads"] == agree.hot_threads(storage.method)
    assert all(1 <= n <= record["threads"] for n in record["floor_code_threads"])
    none, _ = agree.c_page_cache(dataclasses.replace(storage, hot_gbps=0.0), paths)
    assert none["status"] == "not measured"


def test_pooled_storage_compares_the_reads_part_of_the_method_and_pools_the_page_cache_copy():
    f = a_floor()
    f.storage.method += "; into fresh memory 1.20 GB/s; from the page cache into populated memory 6.00 GB/s (5.90-6.10, " \
                        "pread, 2 thread(s) of 1, 2)"
    f.storage.hot_gbps = 6.0
    line = lambda fresh, hot, n: (f.storage.method.split(";")[0] + f"; into fresh memory {fresh} GB/s; from the page "
                                  f"cache into populated memory {hot} GB/s (x, pread, {n} thread(s) of 1, 2)")
    runs = [{"wall_s": 1, "rc": 0, "problem": "", "doc": {"ceilings": {}, "storage": {
        "gbps": 4.0, "hot_gbps": hot, "method": line(1.5, hot, n)}}} for hot, n in ((8.0, 2), (100.0, 1))]
    assert agree.pooled(f, runs, "storage").gbps == pytest.approx(4.0)  # median of 2.0, 4.0, 4.0
    assert agree.pooled_hot(f, runs).hot_gbps == pytest.approx(7.0)  # 6 and 8: the 1-thread figure is another way


def test_rows_are_held_to_the_median_of_the_runs_floors_one_that_was_measured():
    floors = [a_floor(storage_gbps=g) for g in (1.0, 4.0, 2.0, 8.0)]
    m = fb.median_models(floors, 8 * 10**9)
    # four cold floors (the fastest storage bound by fresh memory instead): the lower middle one, as measured
    cold = sorted(fl.model(f, bytes_read=8 * 10**9)["floor_s"] for f in floors)
    assert m["cold"]["floor_s"] == pytest.approx(cold[1]) and m["cold"]["of"] == 4
    assert m["cold"]["range_s"] == pytest.approx([cold[0], cold[-1]])
    # one floor: itself, said as one
    one = fb.median_models(floors[:1], 8 * 10**9)
    assert one["cold"]["floor_s"] == pytest.approx(8.0) and one["cold"]["of"] == 1
    lines = fb.ceilings_lines(floors[0], m, 8 * 10**9)
    assert any("the median of 4 floors measured in this run" in line for line in lines)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("mode", ["direct", "populate"])
def test_the_landing_loop_lands_every_byte_and_says_so_by_a_sum_the_bench_can_check(tmp_path, mode):
    import subprocess

    from _floor_c import LAND_C, compile_c, word_sum

    exe = compile_c(str(tmp_path), LAND_C, "land")
    files = []
    for i, size in enumerate(((5 << 20) + 13, 3, 70 << 20)):  # a tail, a file under a word, more than one unit
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(size))
        files.append(str(p))
    out = subprocess.run([exe, "2", mode, *files], capture_output=True, text=True, check=True).stdout.split()
    assert float(out[0]) > 0 and int(out[1]) == sum(os.path.getsize(p) for p in files)
    assert int(out[2]) == word_sum(files)
    with open(files[0], "r+b") as f:  # one byte changed: the sum the loop is checked against moves
        f.seek(7)
        b = f.read(1)
        f.seek(7)
        f.write(bytes([b[0] ^ 1]))
    assert word_sum(files) != int(out[2])


def test_the_c_loop_rows_give_ckptbench_against_it_and_judge_the_floor_by_it():
    floors = {"hot": {"floor_s": 1.0}, "cold": {"floor_s": 2.0}}
    got = {k: series(k, v) for k, v in {"hot/ckptbench": [1.5, 1.6, 1.4], "hot/c-loop": [1.2, 1.2, 1.3],
                                          "cold/ckptbench": [2.2], "cold/c-loop": [2.1]}.items()}
    said, agreed = fb.c_loop_lines(got, floors)
    assert [v["status"] for v in said] == ["info", "info"]
    assert said[0]["value"] == pytest.approx(1.2 / 1.5)
    assert [v["status"] for v in agreed] == ["MISSED", "met"]  # 1.2 / 1.0 is outside ±10 %, 2.1 / 2.0 inside
    assert agreed[0]["value"] == pytest.approx(1.2) and agreed[1]["value"] == pytest.approx(1.05)
    assert fb.c_loop_lines({}, floors) == ([], [])  # no C compiler, no rows: nothing said


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_c_loop_row_is_measured_under_the_cache_state_and_checked(tmp_path):
    from _floor_c import LAND_C, compile_c

    d = tmp_path / "set"
    d.mkdir()
    for i in range(2):
        (d / f"model-{i}.safetensors").write_bytes(os.urandom((3 << 20) + i))
    b = rounds.Bench(str(d), {}, 1, [], str(tmp_path / "r.csv"))
    b.c_loop = compile_c(str(tmp_path), LAND_C, "land")
    for cond in ("cold", "hot"):
        b.plain_c(cond)
        s = b.series[f"{cond}/c-loop"]
        assert s.ok and len(s.samples) == 1 and s.samples[0] > 0, s.problems
    b.c_sum += 1  # what the files sum to is not what it landed: the row fails its check
    b.plain_c("hot")
    assert not b.series["hot/c-loop"].ok and "word sum" in b.series["hot/c-loop"].problems[-1]


def test_the_floor_as_met_scales_fresh_memory_by_the_runs_own_rate_and_holds_every_contender_to_it():
    import _peers_docs

    f = a_floor()
    nbytes = 3 * 10**9
    floors = fb.models(f, nbytes)
    # the 4 KiB figure, 3 GB/s on 2 threads, is 1.5 a core (the like-for-like one: a restore's pages); the hot runs
    # met 0.5 and 1.0 (median 0.75: half of it), and the model's figure (huge pages, 5 GB/s) is halved
    runs = [{"condition": "hot", "fresh_gbps_per_core": r, "rto": 9.0} for r in (0.5, 1.0)] + [
        {"condition": "cold", "fresh_gbps_per_core": None}]
    met = fb.as_met(floors, runs, nbytes)
    assert set(met) == {"hot"}  # the cold runs populated nothing they could time
    hot = met["hot"]
    assert floors["hot"]["times_s"]["fresh memory"] == pytest.approx(nbytes / 5e9)
    assert hot["times_s"]["fresh memory"] == pytest.approx(nbytes / 2.5e9)
    assert hot["times_s"]["page cache"] == floors["hot"]["times_s"]["page cache"]  # the copy is not scaled
    assert hot["floor_s"] == pytest.approx(sum(hot["times_s"].values()))  # from the page cache the parts add up
    assert hot["floor_gbps_per_core"] == pytest.approx(1.5) and hot["of"] == 2
    pc = floors["hot"]["times_s"]["page cache"]
    assert hot["own_efficiency"] == pytest.approx([(pc + nbytes / 5e9 * 3) / 9.0, (pc + nbytes / 5e9 * 1.5) / 9.0])
    s = {"hot/ckptbench": series("hot/ckptbench", [4.0]), "hot/safetensors": series("hot/safetensors", [8.0])}
    (line,) = fb.met_lines(s, met, ["safetensors"])
    assert line["status"] == "info" and line["value"] == pytest.approx(hot["floor_s"] / 4.0)
    assert f"safetensors {hot['floor_s'] / 8.0:.3f}" in line["detail"]
    assert "each against the floor at the rate it met: median" in line["detail"]
    doc = {"repeats": [{"populated": {"bytes": 1 << 30, "cpu_s": 0.5}}, {"populated": {"bytes": 1 << 30, "cpu_s": 1.0}},
                       {"populated": {"bytes": 1 << 20, "cpu_s": 0.001}}, {}]}  # too few bytes to time; none
    assert _peers_docs.met_rate(doc) == pytest.approx(((1 << 30) / 0.5 + (1 << 30) / 1.0) / 2 / 1e9)
    assert _peers_docs.met_rate({"repeats": [{}]}) is None
    # rows held to another floor of the run (median_models) are scaled against that floor's own figure
    other = a_floor()
    other.ceilings["populate_4k"] = dataclasses.replace(other.ceilings["populate_4k"], gbps=6.0)  # 3 a core
    picked = fb.median_models([other], nbytes)
    assert fb.as_met(picked, runs, nbytes)["hot"]["floor_gbps_per_core"] == pytest.approx(3.0)


def test_a_size_class_figure_cut_by_its_budget_is_checked_against_as_many_bytes(monkeypatch):
    """The C sample populates what the floor's populated (its method says so), not the whole class."""
    from ckptbench.system import ceilings as cl

    monkeypatch.setattr(cl, "LARGE_MIN", 16 << 20)
    monkeypatch.setattr(cl, "LARGE_STEP", 4 << 20)
    monkeypatch.setattr(cl, "LARGE_BUDGET_S", 0.0)  # the real words of a cut sample: one step
    cut, held = cl.populate_large(32 << 20, cores=2)
    held.close()
    assert cut.sample_bytes == 32 << 20 and agree.populated_of(cut) == 4 << 20
    monkeypatch.setattr(cl, "LARGE_BUDGET_S", 60.0)
    whole, held = cl.populate_large(32 << 20, cores=2)
    held.close()
    assert agree.populated_of(whole) == 32 << 20


def paired_series(key: str, samples: list[float], probes: list[float]) -> rounds.PeerSeries:
    s = rounds.PeerSeries(key, key.split("/")[0], "s", loader=key.split("/", 1)[1])
    for v, p in zip(samples, probes):
        s.add(v, 1.0, probe=p)
    return s


def test_a_paired_repeat_is_held_to_the_floor_with_the_fresh_memory_its_probe_met():
    """Hot rows, each repeat paired with a probe of fresh memory right before it: the floor's fresh-memory part at
    the probe's rate (the page-cache copy as measured), over the repeat's seconds; the median over the repeats."""
    nbytes = 10 * 10**9
    floors = fb.models(a_floor(), nbytes)  # hot: populate 10 GB at 5 GB/s (THP) + copy at 8 GB/s, added up
    copy = nbytes / 8e9
    s = paired_series("hot/ckptbench", [3.25, 5.0, 4.0], [5.0, 2.5, 4.0])
    pair = fb.paired(floors, s)
    # the repeats' floors: 2 + 1.25, 4 + 1.25, 2.5 + 1.25 s, over 3.25, 5.0 and 4.0 s
    assert [pair["min"], pair["median"], pair["max"]] == pytest.approx(
        sorted([(2 + copy) / 3.25, (4 + copy) / 5.0, (2.5 + copy) / 4.0]))
    assert pair["of"] == 3 and pair["modelled_gbps"] == pytest.approx(5.0) and pair["probe_gbps"] == 4.0
    # rows with no probes (a stage, `ckptbench read`, --no-pair), or not one a repeat, are not paired
    assert fb.paired(floors, series("hot/ckptbench", [3.0])) is None
    assert fb.paired(floors, series("cold/ckptbench", [3.0])) is None
    assert fb.paired(floors, paired_series("cold/ckptbench/read", [3.0], [5.0])) is None  # reused: no fresh memory
    s.samples.append(9.0)
    assert fb.paired(floors, s) is None


def test_a_paired_cold_repeat_is_held_to_the_larger_of_storage_and_the_fresh_memory_its_probe_met():
    """Cold rows land in fresh memory too: the floor is storage (5 s here) or fresh memory at the probe's rate,
    whichever is longer (the parts overlap, the cores are not shared). A fast host leaves storage binding; a slow one
    makes fresh memory the floor of that repeat."""
    nbytes = 10 * 10**9
    floors = fb.models(a_floor(), nbytes)
    assert floors["cold"]["times_s"] == {"storage": 5.0, "fresh memory": 2.0}  # modelled at 5 GB/s
    s = paired_series("cold/ckptbench", [6.0, 8.0], [10.0, 1.25])  # the second probe: 8 s to populate 10 GB
    pair = fb.paired(floors, s)
    assert [pair["min"], pair["max"]] == pytest.approx([5.0 / 6.0, 8.0 / 8.0])
    v = [x for x in fb.targets({"cold/ckptbench": s}, floors, []) if x["status"] != "info" and x["target"][:4] == "cold"]
    assert "paired" in v[0]["target"] and v[0]["value"] == pytest.approx((5.0 / 6.0 + 1.0) / 2)


@pytest.mark.parametrize("theirs, status", [(4.0, "met"), (1.5, "MISSED")])
def test_paired_hot_targets_are_judged_paired_and_the_once_measured_floor_is_said(theirs, status):
    nbytes = 10 * 10**9
    floors = fb.models(a_floor(), nbytes)
    # the floor measured once says 3.25 s; a slower host in the rounds (2.5 GB/s) makes 5.25 s the floor there
    sr = {"hot/ckptbench": paired_series("hot/ckptbench", [5.5, 5.5], [2.5, 2.5]),
          "hot/runai": paired_series("hot/runai", [theirs * 2, theirs * 2], [5.0, 5.0])}
    v = [x for x in fb.targets(sr, floors, ["runai"]) if x["target"].startswith("hot")]
    judged = [x for x in v if x["status"] != "info"]
    assert "paired" in judged[0]["target"] and judged[0]["status"] == "met"
    assert judged[0]["value"] == pytest.approx((4 + 1.25) / 5.5)
    once = next(x for x in v if "measured once" in x["target"])
    assert once["value"] == pytest.approx(3.25 / 5.5)  # said, not judged: under 0.85, and not a miss
    assert judged[1]["status"] == status
    assert judged[1]["value"] == pytest.approx(((4 + 1.25) / 5.5) / (3.25 / (theirs * 2)))
    assert len(judged) == 2  # no once-measured peer verdict beside the paired one


def test_the_host_beside_the_box_runs_is_said_with_the_floor_over_it():
    runs = [{"doc": {"ceilings": {"populate_at_4096m": {"gbps": g}}}, "beside_gbps": b}
            for g, b in ((4.0, 2.0), (8.0, 4.0), (6.0, 3.0))]
    line = agree.host_beside(runs + [{"doc": None, "beside_gbps": 9.0}], "populate_at_4096m")
    assert line["status"] == "info" and line["value"] == pytest.approx(2 / 3)  # the host moved 2-4 GB/s
    assert "spread 0.0%" in line["detail"] and "2.000×" in line["detail"]  # the floor followed it exactly
    assert agree.host_beside(runs[:1], "populate_at_4096m") is None
    assert agree.host_beside([dict(r, beside_gbps=None) for r in runs], "populate_at_4096m") is None


def test_cold_rows_are_said_against_storage_then_fresh_memory_added():
    """The serial composition (the storage figure into reused buffers, then fresh memory at each repeat's probe):
    an INFO line, each contender's median over its repeats; none without probes or a usable storage figure."""
    nbytes = 10 * 10**9
    mine, c = series("cold/ckptbench", [10.0, 8.0]), series("cold/c-loop", [6.0, 6.0])
    mine.extra["probe_gbps"], c.extra["probe_gbps"] = [2.0, 5.0], [2.5, 2.5]
    lines = fb.serial_lines({s.key: s for s in (mine, c)}, a_floor(storage_gbps=2.0), nbytes, ["safetensors"])
    assert len(lines) == 1 and lines[0]["status"] == "info"
    # ckptbench: (5 s + 5 s) / 10 s and (5 s + 2 s) / 8 s; the C loop: (5 s + 4 s) / 6 s twice
    assert lines[0]["value"] == pytest.approx((1.0 + 7 / 8) / 2)
    assert lines[0]["detail"] == f"ckptbench {(1.0 + 7 / 8) / 2:.3f}, c-loop {9 / 6:.3f}"
    assert fb.serial_lines({s.key: s for s in (mine, c)}, a_floor(sample=1 << 20), nbytes, []) == []
    unpaired = series("cold/ckptbench", [10.0])
    assert fb.serial_lines({unpaired.key: unpaired}, a_floor(), nbytes, []) == []
