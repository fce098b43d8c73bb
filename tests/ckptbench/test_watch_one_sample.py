"""A load whose reads all fall inside one sampling interval: the interval's byte-counter readings (STEPS of them)
say where in it the reads were, and time it; before, every such load was "too short to time", with no efficiency,
whatever part of the interval it took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20


def _iv(t0, t1, nbytes, steps, files=1):
    from ckptbench.watch import sampler as watch

    return watch.Interval(t0, t1, nbytes, 0, 0.3, 0.3, 0, 0.0, 1 << 30, "reading", ckpt_files=files, steps=steps)


def test_one_interval_is_timed_by_its_parts_when_the_reads_span_two_or_more():
    from ckptbench.watch.window import reading_window

    # 1 s sampled in 8 parts; 400 MiB read at 800 MiB/s from 0.3 s to 0.8 s: parts 3..6 (0.25..0.875)
    rate = 800 * MIB
    cuts = [k * 0.125 for k in range(1, 9)]
    read = [max(0.0, min(t, 0.8) - max(t - 0.125, 0.3)) * rate for t in cuts]
    w = reading_window([_iv(0.0, 1.0, int(sum(read)), tuple((t, int(n)) for t, n in zip(cuts, read)))], [], 1.0)
    assert not w.note and w.how == "samples"
    assert (w.t0, w.t1) == pytest.approx((0.3, 0.8), abs=0.01)
    # every byte inside one part: no finer clock than that part, so not timed, and said so
    inside = [0] * 8
    inside[3] = 50 * MIB
    one = reading_window([_iv(0.0, 1.0, 50 * MIB, tuple(zip(cuts, inside)))], [], 1.0)
    assert "too short to time" in one.note
    # no parts (an interval made by hand, or a mapping's bytes, which the parts do not hold): as before
    assert "too short to time" in reading_window([_iv(0.0, 1.0, 50 * MIB, ())], [], 1.0).note


JOB = """
    import json, os, sys, time
    path, own = sys.argv[1], sys.argv[2]
    time.sleep(1.0)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):  # a throttled reader: 8 MiB every 40 ms
            time.sleep(0.04)
    t1 = time.perf_counter()
    with open(own, "w") as f:
        json.dump({"load_s": t1 - t0}, f)
    time.sleep(0.5)
"""


def test_a_load_inside_one_long_interval_is_timed_near_the_loaders_own_time(tmp_path):
    """At --interval 5 the whole job (1 s asleep, about 1.3 s reading, 0.5 s asleep) is one sample: its reads are
    timed by the parts, within a part of the loader's own clock."""
    path = tmp_path / "ckpt" / "shard.bin"
    path.parent.mkdir()
    path.write_bytes(os.urandom(256 * MIB))
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    own = tmp_path / "own.json"
    r = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--json", "--results", "", "--no-verdict",
                        "--interval", "5", "--source", str(path.parent), "--", sys.executable, str(job), str(path),
                        str(own)], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc, loaded = json.loads(r.stdout), json.loads(own.read_text())
    assert len(doc["intervals"]) == 1 and doc["bytes"] >= 256 * MIB, (len(doc["intervals"]), doc["bytes"])
    assert not doc["window_note"], doc["window_note"]
    step = 5 / 8
    assert loaded["load_s"] - step <= doc["io_span_s"] <= loaded["load_s"] + step, (doc["io_span_s"], loaded)
