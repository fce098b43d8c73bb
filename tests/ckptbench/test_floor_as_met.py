"""The floor as a run met the box: the fresh-memory rate the restore's own population ran at (per core of CPU time)
scales the floor's figure for it, like for like, beside the floor as measured. Arithmetic with fixed rates, then a
real restore of a checkpoint written by safetensors."""

from __future__ import annotations

import json
import time

import pytest

from ckptbench.system import floor as fl

GB = 1e9
METHOD = "MADV_POPULATE_WRITE, 4 KiB pages, 2 thread(s) of 1, 2, each sample fresh"


def _floor(pop_gbps: float = 4.0, copy_gbps: float = 8.0, cores: int = 2) -> fl.Floor:
    now = time.time()
    ceilings = {"populate_4k": fl.Ceiling(pop_gbps, pop_gbps, pop_gbps, METHOD, now),
                "copy": fl.Ceiling(copy_gbps, copy_gbps, copy_gbps, "memmove", now)}
    return fl.Floor({"cores": cores}, ceilings)


def test_a_run_that_met_half_the_floors_rate_a_core_is_held_to_twice_its_fresh_memory_time():
    f = _floor(pop_gbps=4.0)  # 2 threads on 2 cores: 2 GB/s a core
    nbytes = 4 * 10**9
    met = fl.as_met(f, 1.0, bytes_read=nbytes, measured_s=5.0, hot=True, destination=fl.FRESH)
    assert met["floor_fresh_gbps_per_core"] == pytest.approx(2.0)
    assert met["scale"] == pytest.approx(0.5)
    assert met["floor_times_s"]["fresh memory"] == pytest.approx(nbytes / (2.0 * GB))  # 4 GB/s, halved
    assert met["floor_times_s"]["page cache"] == pytest.approx(nbytes / (8.0 * GB))  # the copy is not scaled
    assert met["floor_s"] == pytest.approx(2.0 + 0.5)  # from the page cache the parts add up
    assert met["efficiency"] == pytest.approx(2.5 / 5.0)
    assert met["binding"] == "fresh memory"
    plain = fl.model(f, bytes_read=nbytes, hot=True)
    assert plain["floor_s"] == pytest.approx(1.0 + 0.5)


def test_nothing_is_met_without_a_timed_population_or_a_fresh_destination():
    f = _floor()
    assert fl.as_met(f, None, bytes_read=10**9, measured_s=1.0) is None
    assert fl.as_met(f, 1.0, bytes_read=10**9, measured_s=1.0, destination=fl.REUSED) is None
    assert fl.as_met(fl.Floor({"cores": 2}, {}), 1.0, bytes_read=10**9, measured_s=1.0) is None  # no figure


def test_the_thread_count_is_read_from_the_figures_method_and_a_count_past_the_cores_is_the_cores():
    assert fl.threads_in(METHOD) == 2
    assert fl.threads_in("one sample of 4096 MiB, 16 thread(s), fresh") == 16
    assert fl.threads_in("123456 thread(s)") is None  # not a count fl.measure writes
    assert fl.threads_in("planted") is None
    f = _floor(pop_gbps=4.0, cores=2)
    f.ceilings["populate_4k"].method = "MADV_POPULATE_WRITE, 64 thread(s)"
    assert fl.as_met(f, 1.0, bytes_read=10**9, measured_s=1.0)["floor_fresh_gbps_per_core"] == pytest.approx(2.0)


def test_the_note_says_a_met_rate_off_the_floors_and_is_silent_within_its_spread():
    f = _floor(pop_gbps=4.0)
    near = fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none", hot=True,
                             met_gbps_per_core=1.9)
    assert near["floor_as_met"]["scale"] == pytest.approx(0.95) and "in this run" not in near["floor_note"]
    slow = fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none", hot=True,
                             met_gbps_per_core=0.5)
    assert "fresh memory ran at 0.50 GB/s a core in this run against the floor's 2.00" in slow["floor_note"]
    assert "slower than when the floor was measured" in slow["floor_note"]
    assert f"the floor is {slow['floor_as_met']['floor_s']:.3f} s" in slow["floor_note"]
    assert fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none", hot=True)["floor_as_met"] is None
    # a cold restore with no storage figure has no efficiency, as met or not (its floor is partial)
    assert fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none",
                             met_gbps_per_core=0.5)["floor_as_met"] is None
    assert "floor_as_met" in fl.FIELDS and fl.unmeasured()["floor_as_met"] is None


def test_a_real_restore_records_the_fresh_memory_it_met_and_the_floor_at_that_rate(tmp_path, h, plant_floor):
    import torch
    from safetensors.torch import save_file

    root = tmp_path / "ck"
    root.mkdir()
    # 72 MiB in two shards: past fl.MET_MIN_BYTES, so the population is timed
    for i in range(2):
        save_file({f"layer{i}.w{k}": torch.randn(1536, 1536) for k in range(4)},
                  str(root / f"model-0000{i + 1}-of-00002.safetensors"))
    plant_floor(400.0)  # far above anything this box populates at: the met rate is off it, and said
    r = h.run_cli("run", root, "--repeat", "2", "--cache", "hot", "--json", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    for rep in doc["repeats"]:
        assert rep["populated"]["bytes"] >= 72 << 20 and rep["populated"]["cpu_s"] > 0, rep["populated"]
    met = doc["floor_as_met"]
    rates = sorted(p["bytes"] / p["cpu_s"] / GB for p in (rep["populated"] for rep in doc["repeats"]))
    assert met["fresh_gbps_per_core"] == pytest.approx(sum(rates) / 2)  # the median of two
    cores = fl.box_key()["cores"]
    assert met["floor_fresh_gbps_per_core"] == pytest.approx(400.0 / cores)  # the planted figure names no threads
    assert met["scale"] == pytest.approx(met["fresh_gbps_per_core"] / met["floor_fresh_gbps_per_core"])
    assert met["floor_s"] > doc["floor_s"] and met["efficiency"] > doc["efficiency"]
    assert met["efficiency"] == pytest.approx(met["floor_s"] / doc["rto_s"])
    assert "a core in this run" in doc["floor_note"]
    r = h.run_cli("run", root, "--repeat", "1", "--cache", "hot", "--results", tmp_path / "R.csv")
    line = next(ln for ln in r.out.splitlines() if ln.startswith("  floor "))
    assert "% of it (" in line and "% of the box as this run met it)" in line, r.out


def test_the_run_is_held_against_the_figure_measured_its_way_and_the_models_figure_scaled_by_the_two():
    f = _floor(pop_gbps=4.0)  # 4 KiB pages, 2 threads: 2 GB/s a core
    f.ceilings["populate_thp"] = fl.Ceiling(10.0, 10.0, 10.0, "MADV_POPULATE_WRITE, transparent huge pages, "
                                            "1 thread(s) of 1, 2, each sample fresh", time.time())
    assert fl.like_for_like(f, 10**9) == pytest.approx(2.0)  # not the huge pages' 10 a core: a restore's are 4 KiB
    met = fl.as_met(f, 1.0, bytes_read=10**10, measured_s=10.0, hot=True)
    assert met["floor_times_s"]["fresh memory"] == pytest.approx(10**10 / 5e9)  # the model's 10 GB/s, halved
    size = 8 << 30  # a restore's own size class, measured as a plain allocation's pages on every core
    f.ceilings[fl.large_key(size)] = fl.Ceiling(3.0, 3.0, 3.0, "MADV_POPULATE_WRITE, 4 KiB pages (a plain "
                                                "allocation's), one sample of 8192 MiB, 2 thread(s), fresh",
                                                time.time(), size)
    assert fl.like_for_like(f, size) == pytest.approx(1.5)


def test_a_run_whose_later_repeats_met_fresh_memory_faster_than_the_first_says_so():
    """On a VM a repeat lands in the memory the one before just freed, which the host gives back faster: the median
    RTO is then the later repeats', and a restore in a new process meets the first's."""
    from types import SimpleNamespace

    from ckptbench.restore.efficiency import later_repeats_faster

    def reps(*cpu_s):
        return [SimpleNamespace(populated_bytes=1 << 30, populate_cpu_s=c) for c in cpu_s]

    said = later_repeats_faster(reps(2.0, 0.5, 0.6))
    assert said.startswith("; the first repeat met fresh memory at 0.54 GB/s a core and the later ones at 1.97")
    assert later_repeats_faster(reps(1.0, 0.8, 0.9)) == ""  # within FIRST_SLOWER
    assert later_repeats_faster(reps(2.0)) == ""  # one repeat: nothing to compare
    few = reps(2.0, 0.5) + [SimpleNamespace(populated_bytes=1 << 20, populate_cpu_s=0.001)]
    assert later_repeats_faster(few) == ""  # a repeat not timed: which one was first is not known
