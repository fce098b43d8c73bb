"""`ckptbench watch` at a tiny interval: a job's imports read its modules from the page cache through read calls (rchar)
at a reading rate, and just before a mapping load they were taken into its reading window (the load's bytes come
through its mappings and never fill the files' size, so read calls beside them were let in until they did): the
window began at the imports, and the read rate came out at a third of what it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20


def _iv(t0, t1, rchar, mapped, files, phase="deserializing"):
    from ckptbench.watch import sampler as watch

    return watch.Interval(t0, t1, rchar, 0, 1.0, 1.0, 1, 0.0, 1 << 30, phase, ckpt_files=files, mapped_bytes=mapped)


def test_read_calls_before_a_mapping_load_are_its_imports_not_its_reads():
    """Ten intervals of 20 ms reading 1.5 MiB of modules each, then a hot mapped load of part of a 300 MiB file seen in
    five: the window is the load's 0.1 s, not 0.3 s from the first import."""
    from ckptbench.watch import sampler as watch

    dt = 0.02
    imports = [_iv(k * dt, (k + 1) * dt, 3 * MIB // 2, 0, 0) for k in range(10)]
    load = [_iv((10 + k) * dt, (11 + k) * dt, 4096, 30 * MIB, 1) for k in range(5)]
    after = [_iv((15 + k) * dt, (16 + k) * dt, 0, 0, 0, "waiting") for k in range(3)]
    report = watch.WatchReport(pid=1, command="job", wall_s=0.36, bytes=0, disk_bytes=0,
                               files={"/ckpt/model.safetensors": 300 * MIB}, intervals=imports + load + after,
                               phases=[], mapped=["/ckpt/model.safetensors"], files_bytes=150 * MIB, interval_s=dt)
    t0, t1 = report.window
    assert t0 >= 10 * dt - 1e-9 and t1 <= 15 * dt + 1e-9, (t0, t1)
    # a file it read through read calls, seen open at one sample only, still takes in the read calls beside it
    read = watch.WatchReport(pid=1, command="job", wall_s=0.36, bytes=0, disk_bytes=0,
                             files={"/ckpt/model.pt": 300 * MIB},
                             intervals=[_iv(0.0, 0.25, 9 * MIB, 0, 0, "starting"),
                                        _iv(0.25, 0.5, 16 * MIB, 0, 1), _iv(0.5, 0.75, 284 * MIB, 0, 0)],
                             phases=[], interval_s=0.25)
    assert watch.window_bytes(read.intervals, *read.window) >= 300 * MIB


BULK_MODULES = 400  # ~100 KiB each: ~40 MiB of modules read through read calls, a few MiB each 20 ms

JOB = """
    import glob, json, sys, time
    sys.path.insert(0, sys.argv[1])
    from safetensors import safe_open
    t0 = time.perf_counter()
    import bulk  # the job's own modules, from the page cache, just before its load
    t1 = time.perf_counter()
    sd = {}
    for path in sorted(glob.glob(sys.argv[2] + "/*.safetensors")):
        with safe_open(path, "pt") as f:  # mapped; half of its tensors loaded: its count never fills the files
            keys = sorted(f.keys())
            sd |= {k: f.get_tensor(k).clone() for k in keys[: len(keys) // 2]}
    t2 = time.perf_counter()
    with open(sys.argv[3], "w") as f:
        json.dump({"import_s": t1 - t0, "load_s": t2 - t1}, f)
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A 256 MiB bf16 safetensors checkpoint in 4 shards, a package of modules, and the loader."""
    import compileall

    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("imports")
    src = d / "ckpt"
    src.mkdir()
    gen = torch.Generator().manual_seed(0)
    for s in range(4):
        save_file({f"l{s}.w{j}": torch.randn(4 << 20, generator=gen).to(torch.bfloat16) for j in range(8)},
                  str(src / f"model-{s + 1:05d}-of-00004.safetensors"))
    pkg = d / "pkg" / "bulk"
    pkg.mkdir(parents=True)
    for k in range(BULK_MODULES):
        (pkg / f"m{k}.py").write_text(f"DATA = {os.urandom(96 << 10)!r}\nX = sum(i * i for i in range(15000))\n")
    (pkg / "__init__.py").write_text("".join(f"from . import m{k}\n" for k in range(BULK_MODULES)))
    compileall.compile_dir(str(pkg), quiet=1)
    script = d / "job.py"
    script.write_text(textwrap.dedent(JOB))
    return str(src), str(d / "pkg"), str(script)


def test_a_mapping_load_after_its_imports_is_timed_without_them(tmp_path, job):
    """Before: its imports (0.26 to 0.35 s) were in its window: 0.34 s of reading for a load the loader timed at
    0.11 s, 0.69 s for 0.40 s. The window is the load's, not half its imports more (the box is shared: its time is
    the loader's own, whatever it was)."""
    src, pkg, script = job
    subprocess.run(["cat", *(os.path.join(src, n) for n in os.listdir(src))], stdout=subprocess.DEVNULL, check=True)
    own = tmp_path / "own.json"
    r = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--json", "--results", "", "--no-verdict",
                        "--interval", "0.02", "--source", src, "--", sys.executable, script, pkg, src, str(own)],
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc, loaded = json.loads(r.stdout), json.loads(own.read_text())
    assert doc["window_how"] == "samples"
    assert doc["io_span_s"] < loaded["load_s"] + 0.5 * loaded["import_s"], (doc["io_span_s"], loaded)


def test_the_imports_before_the_window_are_the_job_starting_not_reading():
    """The same job's phases: its imports at 75 MB/s read as "reading" (the live phase, from the rate alone), and the
    report listed a reading phase before the load that the window already said was not the load's."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch.phases import merge_phases, started_by

    dt = 0.02
    imports = [_iv(k * dt, (k + 1) * dt, 3 * MIB // 2, 0, 0, "reading") for k in range(10)]
    load = [_iv((10 + k) * dt, (11 + k) * dt, 4096, 30 * MIB, 1, "reading") for k in range(5)]
    report = watch.WatchReport(pid=1, command="job", wall_s=0.3, bytes=0, disk_bytes=0,
                               files={"/ckpt/model.safetensors": 300 * MIB}, intervals=imports + load,
                               phases=[], mapped=["/ckpt/model.safetensors"], files_bytes=150 * MIB, interval_s=dt)
    phases = merge_phases(started_by(report.intervals, report.window))
    assert [p["phase"] for p in phases] == ["starting", "reading"], phases
    assert abs(phases[1]["t0"] - 10 * dt) < 1e-9
    # nothing read: no window to tell the start by, the phases stay as sampled
    assert started_by(imports, (0.0, 0.0)) == imports


def test_a_job_seen_reading_nothing_is_told_a_hot_load_of_any_kind_slips_between_samples():
    """The fix said "a hot load that maps them" can slip between two samples: a hot torch.load, which reads, does too
    (the new-user pass saw it), and a shorter interval catches it."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    report = watch.WatchReport(pid=1, command="job", wall_s=0.5, bytes=0, disk_bytes=0, files={}, intervals=[],
                               phases=[], exit_code=0, source="/ckpt")
    v = verdict.judge(report, verdict.StorageProbe(1.0, "cold (verified)", 1, 1 << 20), cpus=2, mem_total=64 << 30)
    assert v.verdict == "unknown" and "read or mapped" in v.fix and "--interval 0.02" in v.fix, v.fix


def test_the_live_line_calls_the_imports_starting_and_the_load_reading(job):
    """The live phase came from the rate alone: the same job's imports, read calls from the page cache at 75 MB/s
    before any checkpoint file was open or mapped, showed as "reading" while they ran. Live, they are "starting";
    the load itself, once a file is seen, is not."""
    from ckptbench.watch import phases
    from ckptbench.watch import sampler as watch

    src, pkg, script = job
    subprocess.run(["cat", *(os.path.join(src, n) for n in os.listdir(src))], stdout=subprocess.DEVNULL, check=True)
    own = os.path.join(os.path.dirname(script), "own-live.json")
    proc, marks = watch.start_job([sys.executable, script, pkg, src, own])
    shown = []
    try:
        report = watch.Watch(proc.pid, interval=0.02, proc=proc, marks_path=marks, source=src,
                             on_interval=lambda iv, cur: shown.append(iv)).run()
    finally:
        os.unlink(marks)
    assert report.exit_code == 0 and len(shown) == len(report.intervals)
    first = next(k for k, iv in enumerate(shown) if iv.ckpt_files or iv.mapped_bytes)
    before = [iv for iv in shown[:first] if not phases.fetching(iv)]
    # the imports were sampled (each a reading rate, their rate alone said "reading"), and none is shown as reading
    assert any(iv.bytes / (iv.t1 - iv.t0) >= phases.IO_MIN_BPS for iv in before), before
    assert all(iv.phase != "reading" for iv in before), [(iv.t0, iv.phase) for iv in before]
    assert any(iv.phase in ("reading", "faulting", "deserializing") for iv in shown[first:])
