"""The checklist's restore-efficiency item: a short cold restore held against the box's floor. The rules with fixed
ceilings (ok at 85 % of the floor and above, warn below, the binding resource named and its fix), an honest unknown
without a floor, and one real `ckptbench check SOURCE --json` that measures the floor into a temporary cache."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from ckptbench.checklist import efficiency as eff
from ckptbench.checklist.facts import Facts
from ckptbench.checklist.rules import evaluate
from ckptbench.restore.sweep import MeasuredKnee, advice
from ckptbench.system import floor as fl
from ckptbench.system.probes import Unknown
from floorhelp import fixed_floor as _floor

GB = 10**9
NO_KNEE = advice(None, None)
KNEE_16 = advice(MeasuredKnee("/ckpt", 16, 32, {4: 1.0, 16: 2.9, 32: 3.0}, "quick sweep", "2025-01-31 12:00"))


def _facts(floor: fl.Floor, seconds: float, *, nbytes: int = GB, hash_alg: str = "crc32c", read: str = "direct",
           cold: bool = True, concurrency: int = 4, thp: str = "madvise", defrag: str = "madvise") -> eff.FloorFacts:
    probe = eff.RestoreProbe(nbytes, 4, seconds, hash_alg, read, concurrency, cold, 0.0 if cold else 1.0)
    return eff.FloorFacts(floor, probe, thp_enabled=thp, thp_defrag=defrag)


FAST = dict(populate_4k=10.0, populate_thp=10.0, copy=20.0, hash_crc32c=10.0, hash_xxh64=8.0, hash_sha256=0.5,
            scan=10.0)


def test_ok_at_85_percent_of_the_floor_and_above():
    f = _floor(storage=1.0, **FAST)  # 1 GB at 1 GB/s: the floor is 1 s, bound by storage
    for seconds, verdict in ((1.0, "ok"), (1 / 0.85, "ok"), (1 / 0.84, "warn"), (2.0, "warn")):
        it = eff.judge(_facts(f, seconds), NO_KNEE)
        assert it.verdict == verdict, seconds
        assert it.evidence["binding"] == "storage"
        assert it.evidence["floor_s"] == pytest.approx(1.0)
        assert it.evidence["efficiency"] == pytest.approx(1 / seconds, abs=1e-3)
        assert (it.fix == "none") is (verdict == "ok")
    over = eff.judge(_facts(f, 0.9), NO_KNEE)  # 111 %: faster than the box goes, the ceiling read low: said
    assert over.verdict == "ok" and "ran at 111 % of the floor" in over.evidence["over_floor"] and "--remeasure" in over.fix


def test_evidence_carries_every_ceiling_with_rate_method_and_age_and_the_times():
    it = eff.judge(_facts(_floor(storage=1.0, **FAST), 2.0), NO_KNEE)
    ev = it.evidence
    assert ev["times_s"] == pytest.approx({"storage": 1.0, "fresh memory": 0.1, "cpu": 0.05})
    assert ev["gap_s"] == pytest.approx(1.0) and ev["measured_gbps"] == pytest.approx(0.5)
    c = ev["ceilings"]
    assert set(c) == {"storage", "fresh memory", "page cache copy", "cpu"}
    for name in c:
        assert c[name]["gbps"] > 0 and c[name]["method"].startswith("fixed") and 59 <= c[name]["age_s"] <= 70, name
    assert c["storage"]["usable"] is True and c["storage"]["sample_bytes"] == fl.STORAGE_SAMPLE
    assert c["cpu"]["hash"] == "crc32c" and c["cpu"]["kernels_gbps"]["sha256"] == 0.5 and c["cpu"]["cores"] == 2
    assert c["fresh memory"]["populate_4k_gbps"] == 10.0
    json.dumps(it.to_json(), allow_nan=False)


def test_storage_bound_fix_raises_concurrency_to_the_knee_and_asks_for_o_direct():
    f = _floor(storage=1.0, **FAST)
    it = eff.judge(_facts(f, 2.0, read="pread", concurrency=4), KNEE_16)
    assert it.verdict == "warn" and it.fix.startswith("at 50 % of the floor, bound by storage (1.00 GB/s read into reused buffers): ")
    assert "raise --concurrency from 4 to 16, the measured knee 16" in it.fix
    assert "O_DIRECT" in it.fix and "mount" in it.fix
    at_knee = eff.judge(_facts(f, 2.0, read="direct", concurrency=16), KNEE_16).fix
    assert "at or past the knee already (measured knee 16" in at_knee and "O_DIRECT" not in at_knee
    unmeasured = eff.judge(_facts(f, 2.0), NO_KNEE).fix
    assert "--quick-sweep" in unmeasured


def test_fresh_memory_bound_fix_names_the_population_rate_and_the_thp_setting():
    f = _floor(storage=10.0, populate_4k=1.0, populate_thp=2.0, copy=20.0, hash_crc32c=10.0)
    it = eff.judge(_facts(f, 1.0, thp="never", defrag="defer"), NO_KNEE)
    assert it.verdict == "warn" and it.evidence["binding"] == "fresh memory"
    assert it.evidence["floor_s"] == pytest.approx(0.5)  # the faster of 4 KiB and THP
    assert "1.00 GB/s with 4 KiB pages, 2.00 GB/s with huge pages" in it.fix
    assert "limits every loader" in it.fix and "pre-populate" in it.fix
    assert "transparent_hugepage is never (defrag defer)" in it.fix and "echo madvise >" in it.fix
    slow_thp = _floor(storage=10.0, populate_4k=2.0, populate_thp=1.0, hash_crc32c=10.0)
    fix = eff.judge(_facts(slow_thp, 1.0), NO_KNEE).fix
    assert "huge pages measured no faster here" in fix and "transparent_hugepage is madvise" in fix


def test_cpu_bound_fix_names_the_faster_kernel_measured():
    f = _floor(storage=10.0, **FAST)  # sha256 at 0.5 GB/s per core on 2 cores: 1 s for 1 GB
    it = eff.judge(_facts(f, 2.0, hash_alg="sha256"), NO_KNEE)
    assert it.evidence["binding"] == "cpu" and it.evidence["times_s"]["cpu"] == pytest.approx(1.0)
    assert "hashing with sha256 (0.50 GB/s per core) on 2 core(s)" in it.fix
    assert "a lighter hash (crc32c, measured 10.00 GB/s per core here)" in it.fix and "more cores" in it.fix
    fastest = eff.judge(_facts(_floor(storage=10.0, populate_4k=10.0, hash_crc32c=0.5), 2.0), NO_KNEE).fix
    assert "lighter hash" not in fastest and "more cores" in fastest


def test_a_read_from_the_page_cache_is_held_against_the_copy():
    f = _floor(storage=1.0, **FAST)
    hot = _floor(storage=1.0, populate_4k=40.0, copy=4.0, hash_crc32c=40.0)  # the copy: 0.25 s for 1 GB
    it = eff.judge(_facts(hot, 0.5, cold=False), NO_KNEE)
    # into fresh memory: populating, then copying, one after the other on the cores; the copy is the larger part
    assert it.evidence["binding"] == "page cache" and it.evidence["cold"] is False
    assert it.evidence["times_s"]["fresh memory"] == pytest.approx(1 / 40, rel=0.01)
    assert it.evidence["times_s"]["page cache"] == pytest.approx(1 / 4, rel=0.01)
    assert it.evidence["floor_s"] == pytest.approx(sum(it.evidence["times_s"].values()), rel=0.01)
    assert "storage" not in it.evidence["times_s"]
    assert it.verdict == "warn" and "page cache" in it.fix and "copy binds" in it.fix
    slow_memory = eff.judge(_facts(_floor(storage=1.0, populate_4k=2.0, copy=8.0), 1.0, cold=False), NO_KNEE)
    assert slow_memory.evidence["binding"] == "fresh memory" and "populated, then copied into" in slow_memory.fix and "2.00 GB/s" in slow_memory.fix


def test_a_storage_sample_under_64_mib_is_said_and_not_used():
    f = _floor(**FAST)
    f.storage = fl.Ceiling(0.5, 0.5, 0.5, "fixed storage", time.time())
    f.storage.sample_bytes = 5 << 20
    it = eff.judge(_facts(f, 1.0), KNEE_16)
    # as a run says of a cold restore held to part of its floor: no efficiency is given
    assert it.verdict == "unknown" and "storage" not in it.evidence["times_s"]
    assert "efficiency" not in it.evidence and it.evidence["floor_s"] > 0
    assert it.evidence["storage_missing"] == "a 5.0 MiB sample, under the 64 MiB a bandwidth figure needs"
    assert it.evidence["reason"].startswith("the floor has no storage figure (a 5.0 MiB sample")
    assert "no efficiency is given" in it.evidence["reason"] and "ckptbench floor DIR" in it.fix
    assert it.evidence["ceilings"]["storage"]["usable"] is False
    hot = eff.judge(_facts(f, 1.0, cold=False), KNEE_16)  # a hot restore's floor needs no storage figure
    assert hot.evidence["efficiency"] > 0 and "storage_missing" not in hot.evidence


def test_unknown_without_a_floor_says_why_and_what_to_run():
    it = eff.judge(eff.FloorFacts(why="s3://b/ckpt: no mount; run `ckptbench floor`"), NO_KNEE)
    assert it.verdict == "unknown" and it.evidence == {"reason": "s3://b/ckpt: no mount; run `ckptbench floor`"}
    assert "ckptbench floor" in it.fix
    none_applies = eff.judge(_facts(fl.Floor({"cores": 2}), 1.0), NO_KNEE)  # no ceilings at all
    assert none_applies.verdict == "unknown" and "ckptbench floor SOURCE" in none_applies.fix


S3_WHERE = {"fs_type": "s3", "mount_point": "http://127.0.0.1:9", "bucket": "bucket"}


def _s3_source():
    return SimpleNamespace(files_on_disk=False, describe=lambda root="/": S3_WHERE)


def _link_floor(gbps: float = 0.1, level: int = 16) -> fl.Floor:
    f = _floor(storage=gbps, **FAST)
    f.mount = fl.mount_key(S3_WHERE)
    f.storage.method = f"the source's 2 largest object(s) read through its S3 client, concurrency {level} of 4, 16, 64"
    return f


def _link_facts(floor: fl.Floor, seconds: float, concurrency: int = 4) -> eff.FloorFacts:
    probe = eff.RestoreProbe(GB, 2, seconds, "crc32c", "ranged GET", concurrency, True, 0.0, 8 << 20)
    return eff.FloorFacts(floor, probe, thp_enabled="madvise", thp_defrag="madvise")


def test_gather_is_unknown_for_a_source_without_files_on_disk_or_without_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(eff, "short_link_read", lambda *a: pytest.fail("no figure to hold it against: no read"))
    listing = SimpleNamespace(source="s3://bucket/ckpt", files=[], manifest=None)
    ff = eff.gather(_s3_source(), listing, 8, root=str(tmp_path))
    assert ff.floor is None and "s3://bucket/ckpt" in ff.why and "`ckptbench floor s3://bucket/ckpt`" in ff.why
    assert "no network figure cached for http://127.0.0.1:9/bucket (s3)" in ff.why
    assert isinstance(ff.thp_enabled, Unknown)  # no sysfs under this root: unknown, not a crash
    local = SimpleNamespace(files_on_disk=True)
    empty = SimpleNamespace(source=str(tmp_path), files=[SimpleNamespace(path="x", size=0)], manifest=None)
    assert "no readable file with bytes" in eff.gather(local, empty, 8, root=str(tmp_path)).why


def test_thp_mode_reads_the_selected_word(tmp_path):
    d = tmp_path / "sys/kernel/mm/transparent_hugepage"
    d.mkdir(parents=True)
    (d / "enabled").write_text("always [madvise] never\n")
    (d / "defrag").write_text("always defer defer+madvise madvise never\n")  # nothing selected
    assert eff.thp_mode("enabled", str(tmp_path)) == "madvise"
    assert isinstance(eff.thp_mode("defrag", str(tmp_path)), Unknown)
    assert isinstance(eff.thp_mode("absent", str(tmp_path)), Unknown)


def test_the_item_is_judged_only_when_the_check_measured_the_floor():
    bare = Facts(source="/ckpt")
    assert "efficiency" not in [i.id for i in evaluate(bare)]
    bare.floor_facts = eff.FloorFacts(why="not measured")
    items = evaluate(bare)
    assert items[-1].id == "efficiency" and items[-1].title == "Restore efficiency"


def test_cli_check_json_measures_the_floor_and_carries_the_item(tmp_path, h, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    src = tmp_path / "src"
    r = h.run_cli("gen", "small", src, "--scale", "0.02")
    assert r.rc == 0, r.err
    r = h.run_cli("check", src, "--json")
    assert r.rc in (0, 1), r.err
    it = json.loads(r.out)["items"][-1]
    assert it["id"] == "efficiency" and it["title"] == "Restore efficiency"
    ev = it["evidence"]
    # a floor under FIXED_COSTS_S (this 5 MiB checkpoint's, on most boxes) gets no verdict, as run's note says
    tiny = ev["floor_s"] < fl.FIXED_COSTS_S
    # a cold read of a sample under 64 MiB: the floor has no storage figure, and no efficiency is given
    partial = ev["cold"] and ev["ceilings"]["storage"]["sample_bytes"] < fl.MIN_STORAGE_SAMPLE
    if partial:
        assert it["verdict"] == "unknown" and "no efficiency is given" in ev["reason"] and "efficiency" not in ev
    else:
        assert it["verdict"] == "unknown" and ev["reason"] == eff.TOO_SMALL if tiny else it["verdict"] in ("ok", "warn")
        assert 0 < ev["efficiency"]
    assert 0 < ev["sample_bytes"] == ev["ceilings"]["storage"]["sample_bytes"]  # the floor read the same files
    assert ev["measured_s"] > 0 and ev["floor_s"] > 0
    assert ev["binding"] in ev["times_s"] and ev["cold"] in (True, False) and ev["floor_cached"] is False
    assert ev["storage_measured_now"] is True  # nothing was kept: measured by this check
    for name in ("fresh memory", "page cache copy", "storage"):
        assert ev["ceilings"][name]["gbps"] > 0 and ev["ceilings"][name]["method"], name
    assert ev["ceilings"]["cpu"]["kernels_gbps"]["crc32c"] > 0
    if ev["ceilings"]["storage"]["sample_bytes"] < fl.MIN_STORAGE_SAMPLE and ev["cold"]:
        assert "MiB sample" in ev["storage_missing"]
    assert (cache / "ckptbench" / "floor.json").exists()
    again = json.loads(h.run_cli("check", src, "--json").out)["items"][-1]
    assert again["evidence"]["floor_cached"] is True  # the box's figures came from the cache this time
    assert again["evidence"]["storage_measured_now"] is False  # and the mount's figure of these files too


def test_an_s3_source_is_held_against_the_cached_network_figure_and_check_never_sweeps_the_link(
        tmp_path, monkeypatch, plant_floor):
    plant_floor(4.0)  # the box's figures only: no network figure yet
    reads = []

    def short_link_read(source, listing, chosen, concurrency, alg):
        reads.append((sorted(chosen), concurrency, alg))
        return eff.RestoreProbe(sum(chosen.values()), len(chosen), 4.0, alg, "ranged GET", concurrency, True, 0.0,
                                8 << 20)

    monkeypatch.setattr(eff, "short_link_read", short_link_read)
    monkeypatch.setattr(fl, "link_ceiling", lambda *a, **k: pytest.fail("check must not measure the link"))
    mib = 1 << 20
    files = [SimpleNamespace(path=f"s3://bucket/ckpt/{n}", size=sz * mib) for n, sz in (("a", 200), ("b", 100),
                                                                                        ("c", 50))]
    listing = SimpleNamespace(source="s3://bucket/ckpt", files=files, manifest=None)
    ff = eff.gather(_s3_source(), listing, 8, root=str(tmp_path))
    assert ff.floor is None and "no network figure cached" in ff.why and not reads
    cached = fl.cached(fl.mount_key(S3_WHERE))  # what `ckptbench floor s3://bucket/ckpt` leaves behind
    cached.mount, cached.storage = fl.mount_key(S3_WHERE), fl.Ceiling(0.0625, 0.06, 0.065, "planted", time.time(),
                                                                      fl.LINK_SAMPLE)
    fl._save(fl.cache_path(), cached, {})
    ff = eff.gather(_s3_source(), listing, 8, root=str(tmp_path))
    assert reads == [(["s3://bucket/ckpt/a", "s3://bucket/ckpt/c"], 8, "none")]  # the floor's own sample, once
    assert ff.floor.storage.gbps == 0.0625 and ff.floor.resource == "network" and ff.restore.bytes == 250 * mib
    it = eff.judge(ff, NO_KNEE)  # 250 MiB at 62.5 MB/s: a 4.19 s floor against 4 s measured
    assert it.verdict == "ok" and it.evidence["binding"] == "network"
    assert it.evidence["ceilings"]["network"]["gbps"] == 0.062 and it.evidence["ceilings"]["network"]["usable"]


def test_network_bound_fix_raises_concurrency_to_the_knee_and_names_part_size_region_and_proxy():
    f = _link_floor(0.1, level=16)  # 1 GB at 100 MB/s: a 10 s floor
    it = eff.judge(_link_facts(f, 20.0, concurrency=4), NO_KNEE)
    assert it.verdict == "warn" and it.fix.startswith("at 50 % of the floor, bound by network (0.10 GB/s read into reused buffers): ")
    assert it.evidence["times_s"]["network"] == pytest.approx(10.0) and "storage" not in it.evidence["ceilings"]
    assert "raise --concurrency from 4 to 16, where `ckptbench floor` measured the link's 0.10 GB/s" in it.fix
    assert "--part-size 16M or 32M (8 MiB now)" in it.fix and "region" in it.fix and "HTTPS_PROXY" in it.fix
    assert "O_DIRECT" not in it.fix and "read_ahead_kb" not in it.fix  # a mount's levers, not a link's
    knee = eff.judge(_link_facts(f, 20.0, concurrency=4), KNEE_16).fix
    assert "raise --concurrency from 4 to 16, the measured knee 16 (quick sweep" in knee
    past = eff.judge(_link_facts(f, 20.0, concurrency=64), NO_KNEE).fix
    assert "--concurrency 64 is at or past the knee already (the floor measured the link at concurrency 16)" in past
    f.storage.method = "planted"  # no level recorded and no knee: measure one
    assert "--quick-sweep" in eff.judge(_link_facts(f, 20.0), NO_KNEE).fix
    assert eff.judge(_link_facts(f, 10.5), NO_KNEE).verdict == "ok"
