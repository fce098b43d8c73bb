"""`ckptbench watch` on a cold sharded safetensors load that maps its files (safetensors.torch.load_file, a clone of
each tensor): every shard listed, even one mapped and let go of between two samples; every byte counted (the pages
that came into the page cache count what the job's counters miss); a reading window that is neither a whole sample
interval at each end nor the sleep after the load; no efficiency from a count known to be short; and thread figures
that agree with each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fastio

from ckptbench.core.units import human_bytes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARDS = 4
WORK_S = 0.15  # the loader's work on each shard after reading it

LOAD_ALL = """
    import json, sys, time
    from safetensors.torch import load_file
    out, after, paths = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    t0 = time.monotonic()
    sd = {}
    for p in paths:
        sd |= {k: v.clone() for k, v in load_file(p).items()}
        t = time.monotonic()
        while time.monotonic() - t < %s:  # work on each shard (a dtype, a layout): a load of 0.6 s or more
            sum(range(10000))
    t1 = time.monotonic()
    with open(out, "w") as f:
        json.dump({"load_s": t1 - t0, "bytes": sum(v.numel() * v.element_size() for v in sd.values())}, f)
    time.sleep(after)  # the job goes on after its load: none of this is reading
"""

LOAD_HALF = """
    import sys
    from safetensors import safe_open
    paths = sys.argv[1:]
    handles = [safe_open(p, "pt") for p in paths]  # every shard mapped (its header read)
    sd = {}
    for f in handles[: len(handles) // 2]:  # the tensors of half of them
        sd |= {k: f.get_tensor(k).clone() for k in f.keys()}
    print(len(sd))
"""


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A 128 MiB bf16 safetensors checkpoint in 4 shards alone in its directory, and the loaders."""
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("sharded")
    src = d / "ckpt"
    src.mkdir()
    gen = torch.Generator().manual_seed(0)
    shards = []
    for s in range(SHARDS):
        path = src / f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        save_file({f"layer{s}.w{j}": torch.randn(2 << 20, generator=gen).to(torch.bfloat16) for j in range(8)},
                  str(path))
        shards.append(str(path))
    jobs = {}
    for name, body in (("load_all", LOAD_ALL % WORK_S), ("load_half", LOAD_HALF)):
        jobs[name] = d / f"{name}.py"
        jobs[name].write_text(textwrap.dedent(body))
    return str(src), shards, jobs


def _watch(*args) -> dict:
    r = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--json", "--results", "", *map(str, args)],
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_cold_sharded_mapped_load_is_counted_whole_and_timed_without_its_sleep(tmp_path, sharded, plant_floor):
    """Before: 576 of 1008 MiB counted, 3 of 4 shards listed, a 0.40 s load timed at 0.88 s and one with a sleep
    after it at 1.85 s, so 'your loader runs at 37 % of this box's floor' for a loader at 140 %."""
    src, shards, jobs = sharded
    total = sum(os.path.getsize(p) for p in shards)
    plant_floor(50.0, src, storage_gbps=0.5)  # the storage binds: the floor is the files' size over 0.5 GB/s
    fastio.evict(shards)
    own = tmp_path / "own.json"
    interval, sleep = 0.25, 1.5
    doc = _watch("--interval", interval, "--source", src, "--", sys.executable, jobs["load_all"], own, sleep, *shards)
    loaded = json.loads(own.read_text())
    assert set(doc["files"]) == set(shards), doc["files"]  # every shard, seen held or only by its pages
    assert set(doc["mapped"]) | set(doc["unseen"]) == set(shards)
    assert 0.95 * total <= doc["bytes"] <= 1.05 * total, (doc["bytes"], doc["counted_bytes"], total)
    assert doc["arrived_bytes"] >= 0.9 * total  # cold: the pages came in from storage while it ran
    assert doc["hot"] is False
    # the window: not the 1.5 s sleep, and not a whole interval at each end (generous: the box is shared)
    assert doc["window_how"] == "samples" and not doc["window_note"]
    # the load's last 0.15 s is work on the last shard, not reading: the window may rightly end before it
    assert loaded["load_s"] - WORK_S - 2 * interval <= doc["io_span_s"] <= loaded["load_s"] + 2 * interval, (
        doc["io_span_s"], loaded["load_s"])
    # held against the floor on the files' bytes and the reading window
    assert doc["efficiency"] is not None and doc["efficiency"] == pytest.approx(doc["floor_s"] / doc["io_span_s"])
    assert doc["floor_gbps"] * doc["floor_s"] * 1e9 == pytest.approx(total, rel=0.01)
    v = doc["verdict"]
    ev = v["evidence"]
    if ev["busiest_thread_cores_median"] >= 0.5:
        assert ev["busy_threads_median"] >= 1, ev
    assert "(0 busy" not in v["summary"]


def test_a_load_of_part_of_its_mapped_files_gets_no_efficiency_and_says_why(sharded, plant_floor):
    """Every shard mapped, the tensors of half of them loaded, cold: what came in is about half the files it mapped
    (read-ahead brings some of the others'); no efficiency from it, and the loader is not called slow on it."""
    src, shards, jobs = sharded
    total = sum(os.path.getsize(p) for p in shards)
    plant_floor(50.0, src, storage_gbps=0.5)
    fastio.evict(shards)
    doc = _watch("--interval", 0.05, "--source", src, "--", sys.executable, jobs["load_half"], *shards)
    assert set(doc["files"]) == set(shards)
    assert 0.4 * total <= doc["bytes"] <= 0.8 * total, (doc["bytes"], total)
    assert doc["efficiency"] is None and doc["floor_s"] is None
    note = doc["floor_note"]
    assert note.startswith("no efficiency: the job's bytes are undercounted (it counted "), note
    assert f"of the files' {human_bytes(total)}" in note, note  # in the headline's unit, not '0.0x of … GB'
    assert "it may have read only part of them" in note
    v = doc["verdict"]
    assert "of this box's floor" not in v["summary"]
    assert not v["kind"].startswith("loader-"), v  # its rate is a lower bound: never called slow on it


def test_a_loader_that_mostly_waits_is_not_one_busy_thread(tmp_path):
    """Reads with a pause between them, and one short burst of CPU: the busiest thread of one interval and the busy
    count of another read "one thread at 100 % of a core did the work (0 busy thread(s))"."""
    path = tmp_path / "shard.bin"
    path.write_bytes(os.urandom(64 << 20))
    job = tmp_path / "waits.py"
    job.write_text(textwrap.dedent("""
        import sys, time
        from ckptbench.mark import stage
        time.sleep(0.3)
        stage("load")
        with open(sys.argv[1], "rb") as f:
            t = time.monotonic()
            while time.monotonic() - t < 0.4:  # a burst of CPU: a few intervals with a thread at 100 %
                sum(range(10000))
            while f.read(1 << 20):
                time.sleep(0.03)  # the loader waits most of the time
        stage("done")
    """))
    fastio.evict([str(path)])
    doc = _watch("--interval", 0.05, "--", sys.executable, job, path)
    v = doc["verdict"]
    ev = v["evidence"]
    assert "(0 busy" not in v["summary"], v["summary"]
    assert ev["busiest_thread_cores_median"] < 0.8 and ev["intervals_judged"] >= 10, ev
    assert v["kind"] == "loader-parallelism-bound", v


def _iv(t0, t1, nbytes, files, phase="reading"):
    from ckptbench.watch import sampler as watch

    return watch.Interval(t0, t1, 0, nbytes, 0.3, 0.3, 0, 0.0, 1 << 30, phase, ckpt_files=files)


def test_the_window_is_cut_to_its_bytes_and_stops_at_the_last_read():
    """A load of 0.40 s at 400 MB/s from 0.15 s, sampled every 0.25 s, its first shard read before a sample saw it
    and its file held for a second after: timed 0.15..0.55 s, not 0..1.75 s."""
    from ckptbench.watch.window import reading_window

    r = 400e6
    intervals = [_iv(0.0, 0.25, int(0.1 * r), 0), _iv(0.25, 0.5, int(0.25 * r), 1), _iv(0.5, 0.75, int(0.05 * r), 1),
                 *(_iv(0.75 + k * 0.25, 1.0 + k * 0.25, 0, 1, "waiting") for k in range(4))]
    w = reading_window(intervals, [], 0.25)
    assert w.how == "samples" and not w.note
    assert (w.t0, w.t1) == pytest.approx((0.15, 0.55), abs=1e-6)
    # two intervals, none between: cut at the faster one's rate, a lower bound of the true one, so never shorter
    # than the reads (0.15..0.40 s here)
    two = reading_window([_iv(0.0, 0.25, int(0.1 * r), 1), _iv(0.25, 0.5, int(0.15 * r), 1)], [], 0.25)
    assert two.t0 <= 0.15 and two.t1 >= 0.4 and two.t1 - two.t0 < 0.45 and not two.note
    one = reading_window([_iv(0.0, 0.25, 50 << 20, 1)], [], 0.25)
    assert "one sampling interval (0.25 s): too short to time" in one.note
    marked = reading_window(intervals, [{"stage": "load", "t": 0.1}, {"stage": "done", "t": 0.3}], 0.25)
    assert (marked.t0, marked.t1, marked.how) == (0.1, 0.3, "marks")


def test_a_one_interval_load_gets_a_floor_and_no_efficiency(tmp_path, plant_floor):
    """Reads inside one sampling interval: the bytes are known and the time is not."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    shard = tmp_path / "model.safetensors"
    shard.write_bytes(b"\0" * (8 << 20))
    plant_floor(8.0, tmp_path, storage_gbps=2.0)
    report = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=8 << 20, disk_bytes=8 << 20,
                               files={str(shard): 8 << 20}, intervals=[_iv(0.0, 0.25, 8 << 20, 1)], phases=[],
                               interval_s=0.25)
    floor = verdict.floor_fields(report, [str(shard)])
    assert floor["floor_s"] > 0 and floor["efficiency"] is None
    assert floor["floor_note"].startswith("no efficiency: the reads fit in one sampling interval (0.25 s)")
    probe = verdict.StorageProbe(2.0, "cold (verified)", 1, 8 << 20)
    v = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=floor)
    assert v.verdict == "unknown" and "too short to time" in v.why and "of this box's floor" not in v.why
