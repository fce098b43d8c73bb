"""Fresh memory at the restore's own size: a large restore is held to population measured at its size class, not
to the base samples' few hundred megabytes (on a VM the host backs the first of a guest's fresh memory and faults
the rest in, so gigabytes populate slower)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from ckptbench.system import ceilings
from ckptbench.system import floor as fl
from floorhelp import fixed_floor as _floor

GiB = 1 << 30


def test_size_classes_are_the_nearest_power_of_two_and_keys_round_trip():
    assert fl.size_class(GiB - 1) == 0  # below LARGE_MIN: the base samples stand
    assert fl.size_class(GiB) == GiB
    assert fl.size_class(int(1.4 * GiB)) == GiB and fl.size_class(int(1.42 * GiB)) == 2 * GiB
    assert fl.size_class(4 * GiB) == 4 * GiB and fl.size_class(5 * GiB) == 4 * GiB and fl.size_class(6 * GiB) == 8 * GiB
    assert fl.large_size(fl.large_key(4 * GiB)) == 4 * GiB and fl.large_key(4 * GiB) == "populate_at_4096m"
    for junk in ("populate_at_m", "populate_at_-1m", "populate_at_4096", "populate_4k", "populate_at_999999999999m"):
        assert fl.large_size(junk) == 0, junk


def _with_large(f: fl.Floor, size: int, gbps: float) -> fl.Floor:
    c = fl.Ceiling(gbps, gbps, gbps, f"fixed at {size >> 20} MiB", time.time() - 60)
    c.sample_bytes = size
    f.ceilings[fl.large_key(size)] = c
    return f


def test_a_large_restore_is_held_to_fresh_memory_at_its_size_and_a_small_one_to_the_samples():
    f = _with_large(_floor(populate_4k=5.0, populate_thp=2.0, copy=10.0), 4 * GiB, 2.0)
    assert fl.populate_gbps(f, 4 * GiB) == 2.0  # its own size class
    assert fl.populate_gbps(f, 3 * GiB) == 2.0  # 4 GiB is its class
    assert fl.populate_gbps(f, 2 * GiB) == 2.0  # a class away: the nearest measured, within a factor of two
    assert fl.populate_gbps(f, GiB) == 5.0  # two classes away: the samples'
    assert fl.populate_gbps(f, 256 << 20) == 5.0 and fl.populate_gbps(f) == 5.0
    m = fl.model(f, bytes_read=4 * GiB, hot=True)
    assert m["times_s"]["fresh memory"] == pytest.approx(4 * GiB / 1e9 / 2.0)
    assert m["floor_s"] == pytest.approx(4 * GiB / 1e9 * (1 / 2.0 + 1 / 10.0))
    assert fl.landing_gbps(f, hot=True, nbytes=4 * GiB) == pytest.approx(1 / (1 / 2.0 + 1 / 10.0))


def test_the_note_says_when_fresh_memory_was_not_measured_at_the_restores_size():
    bare = _floor(populate_4k=5.0, copy=10.0)
    note = fl.restore_fields(bare, bytes_read=4 * GiB, measured_s=2.0, hash_alg="none", hot=True)["floor_note"]
    assert "not at this restore's 4.0 GiB" in note and "ckptbench floor SOURCE" in note
    near = _with_large(_floor(populate_4k=5.0, copy=10.0), 4 * GiB, 2.0)
    note = fl.restore_fields(near, bytes_read=2 * GiB, measured_s=2.0, hash_alg="none", hot=True)["floor_note"]
    assert "measured at 4096 MiB, the size nearest" in note
    exact = fl.restore_fields(near, bytes_read=4 * GiB, measured_s=2.0, hash_alg="none", hot=True)["floor_note"]
    assert "MiB samples" not in exact and "nearest" not in exact
    small = fl.restore_fields(bare, bytes_read=64 << 20, measured_s=0.1, hash_alg="none", hot=True)["floor_note"]
    assert "samples" not in small  # a small restore is what the samples measure


def test_a_real_large_sample_is_one_plain_allocation_of_the_size_class(monkeypatch):
    monkeypatch.setattr(ceilings, "LARGE_MIN", 32 << 20)  # the real path, at a size a test can afford
    c, held = ceilings.populate_large(40 << 20, cores=2)
    try:
        assert held is not None and len(held) == 32 << 20  # nearer 32 than 64 MiB
        assert c.sample_bytes == 32 << 20 and c.gbps > 0 and "plain allocation" in c.method and "32 MiB" in c.method
    finally:
        held.close()
    out = ceilings.memory_ceilings(cores=1, size=8 << 20, repeats=1, restore_bytes=64 << 20)
    assert out["populate_at_64m"].sample_bytes == 64 << 20 and {"populate_4k", "populate_thp", "copy"} <= set(out)
    assert ceilings.populate_large(16 << 20) == (None, None)  # below LARGE_MIN: nothing measured
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=40 << 20))
    assert ceilings.populate_large(40 << 20) == (None, None)  # half the available memory at most: the box's own


def test_the_base_samples_are_measured_before_the_size_class_sample_and_nothing_of_it_is_held(monkeypatch):
    """Held while the base samples ran, the size-class sample took the memory the host still backed: they landed in
    memory it faults in (4 KiB 0.57 GB/s against 4.5 with nothing held). A small restore meets memory nothing holds."""
    order, regions = [], []

    def base(cores, size, repeats):
        order.append(("base", [r.closed for r in regions]))
        return {}

    def large(nbytes, cores=None):
        order.append(("large", None))
        regions.append(ceilings.anonymous(1 << 20, huge=False))
        return fl.Ceiling(1.0, 1.0, 1.0, "x", time.time(), 1 << 30), regions[-1]

    monkeypatch.setattr(ceilings, "_memory_ceilings", base)
    monkeypatch.setattr(ceilings, "populate_large", large)
    out = ceilings.memory_ceilings(cores=2, restore_bytes=1 << 30)
    assert order == [("base", []), ("large", None)] and list(out) == ["populate_at_1024m"]
    assert regions[0].closed  # given back at once


def test_the_size_class_sample_stops_at_its_time_budget_and_says_how_much_it_populated(monkeypatch):
    """`floor` is to take seconds: a 4 GiB class populated at a bad minute's 0.7 GB/s took 5 s of a 15 s floor. The
    sample goes in steps and stops once its budget is spent, its rate over what it populated, said in its method."""
    monkeypatch.setattr(ceilings, "LARGE_MIN", 32 << 20)
    monkeypatch.setattr(ceilings, "LARGE_STEP", 8 << 20)
    monkeypatch.setattr(ceilings, "LARGE_BUDGET_S", 0.25)
    steps = []

    def slow(region, n, start=0, length=None):  # 8 MiB steps at 0.1 GB/s: 0.084 s each, the budget spent in 3
        steps.append((start, length))
        return 0.1e9, "MADV_POPULATE_WRITE"

    monkeypatch.setattr(ceilings, "populate", slow)
    c, held = ceilings.populate_large(64 << 20, cores=2)
    held.close()
    assert [s for s, _ in steps] == [0, 8 << 20, 16 << 20] and all(n == 8 << 20 for _, n in steps)  # in order
    assert c.gbps == pytest.approx(0.1) and c.sample_bytes == 64 << 20  # the class it stands for
    assert "24 MiB of it in the 0.25 s" in c.method and "one sample of 64 MiB" in c.method
    steps.clear()
    monkeypatch.setattr(ceilings, "populate", lambda region, n, start=0, length=None: steps.append(length) or
                        (100e9, "MADV_POPULATE_WRITE"))  # fast: the whole class within the budget, said as whole
    c, held = ceilings.populate_large(64 << 20, cores=2)
    held.close()
    assert sum(steps) == 64 << 20 and "of it in the" not in c.method and c.gbps == pytest.approx(100)


def test_a_real_size_class_sample_cut_short_populates_the_pages_it_counts(monkeypatch):
    """The real path, with no time to spare: one step populated (resident), the rest of the allocation untouched."""
    import ctypes
    import mmap

    monkeypatch.setattr(ceilings, "LARGE_STEP", 4 << 20)
    region = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_NOHUGEPAGE)  # whole pages of 4 KiB: a huge page would make the untouched rest resident
    try:
        rate, how, done = ceilings._populate_for(region, 2, 0.0)
        assert done == 4 << 20 and rate > 0 and how in ("MADV_POPULATE_WRITE", "a write per page")
        pages = len(region) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        base = ctypes.c_char.from_buffer(region)
        assert libc.mincore(ctypes.addressof(base), len(region), vec) == 0
        del base  # the export goes before the region closes
        resident = [i for i in range(pages) if vec[i] & 1]
        assert resident == list(range((4 << 20) // mmap.PAGESIZE))  # the first step's pages, and no others
    finally:
        region.close()


def test_measure_adds_a_size_class_to_cached_box_figures_once_and_keeps_the_others(tmp_path, monkeypatch):
    cache = str(tmp_path / "floor.json")
    now = time.time()
    measured = []

    def large(nbytes, cores=None):
        measured.append(nbytes)
        c = fl.Ceiling(2.0, 2.0, 2.0, "large", time.time())
        c.sample_bytes = fl.size_class(nbytes)
        return c, None

    monkeypatch.setattr(fl, "populate_large", large)
    entry = {"gbps": 5.0, "min_gbps": 5.0, "max_gbps": 5.0, "method": "planted", "measured_at": now}
    old = entry | {"sample_bytes": 8 * GiB}
    with open(cache, "w") as f:
        json.dump({"schema": fl.SCHEMA, "box": fl.box_key(), "storage": {},
                   "ceilings": {k: entry for k in fl.BOX_FIGURES} | {"populate_at_8192m": old, "bogus": entry}}, f)
    f = fl.measure(path=cache, restore_bytes=4 * GiB)
    assert f.cached and measured == [4 * GiB]
    assert f.ceilings["populate_at_4096m"].gbps == 2.0 and "populate_at_8192m" in f.ceilings
    assert "bogus" not in f.ceilings  # a key the floor does not know is not carried
    again = fl.measure(path=cache, restore_bytes=4 * GiB)
    assert measured == [4 * GiB] and again.ceilings["populate_at_4096m"].gbps == 2.0  # cached now: not again
    fl.measure(path=cache, restore_bytes=512 << 20)
    assert measured == [4 * GiB]  # a small restore needs no size class
    assert {"populate_at_4096m", "populate_at_8192m"} <= set(fl.cached(path=cache).ceilings)


def test_a_restore_beyond_what_the_floor_populates_is_told_so_not_sent_to_measure_it():
    bare = _floor(populate_4k=5.0, copy=10.0)
    huge = fl.restore_fields(bare, bytes_read=64 * GiB, measured_s=30.0, hash_alg="none", hot=True)["floor_note"]
    assert "16 GiB at most" in huge and "measures it at this size" not in huge  # 64 GiB: over twice LARGE_MAX
