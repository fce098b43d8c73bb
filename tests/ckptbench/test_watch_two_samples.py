"""`ckptbench watch` of a hot load that spans two samples: with no interval between to give its rate, its ends were cut
at the faster interval's rate, a load's rate only where it read through the whole of that interval; a 300 MiB
torch.load of 0.17 s that read 150 MiB in each was timed at 0.50 s. The sampler reads the job's byte counters at
parts of each interval, and those parts time it."""

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


def _iv(t0, steps, phase="deserializing"):
    from ckptbench.watch.phases import Interval

    dt = 0.25 / len(steps)
    parts = tuple((t0 + (k + 1) * dt, n) for k, n in enumerate(steps))
    return Interval(t0, t0 + 0.25, sum(steps), 0, 1.0, 1.0, 1, 0.0, 1 << 30, phase, ckpt_files=1, steps=parts)


def test_a_load_over_two_samples_is_timed_by_their_parts():
    """Imports at 16 MB/s, then 0.156 s of reads at 2 GB/s from 0.1875 s: two parts of the first interval, three of
    the second. Cut at the faster interval's rate it was 0.42 s."""
    from ckptbench.watch.window import reading_window

    full = int(2e9 * 0.25 / 8)
    a = _iv(0.0, [MIB // 2] * 6 + [full, full])
    z = _iv(0.25, [full] * 3 + [0] * 5)
    w = reading_window([a, z], [], 0.25)
    assert w.how == "samples" and not w.note
    assert (w.t0, w.t1) == pytest.approx((0.1875, 0.34375), abs=0.01)
    # without parts (hand-made intervals, older documents) it is cut as before: never shorter than the reads
    bare = reading_window([_iv(0.0, [a.bytes]), _iv(0.25, [z.bytes])], [], 0.25)
    assert bare.t0 <= 0.1875 and bare.t1 >= 0.34375


JOB = """
    import json, sys, time
    import torch
    t0 = time.perf_counter()
    sd = torch.load(sys.argv[1], weights_only=True)
    t1 = time.perf_counter()
    with open(sys.argv[2], "w") as f:
        json.dump({"load_s": t1 - t0}, f)
"""


def test_a_hot_load_across_two_samples_is_timed_near_the_loaders_own_time(tmp_path):
    """Before, 0.34 s for a load the loader timed at 0.16 s, 0.29 s for 0.17 s, 0.50 s for 0.17 s; within half the
    loader's own time now (generous: the box is shared)."""
    path = tmp_path / "ckpt" / "model.pt"
    path.parent.mkdir()
    torch.save({f"w{j}": torch.randn(4 << 20).to(torch.bfloat16) for j in range(36)}, str(path))  # 288 MiB
    path.read_bytes()  # hot
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    own = tmp_path / "own.json"
    seen = 0
    for _ in range(4):  # a hot load of 0.16 s can open, read and close its file between two samples: then it is not
        # seen at all (bytes 0, a documented limit, what the "read nothing" verdict says), and is tried again
        r = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--json", "--results", "", "--no-verdict",
                            "--source", str(path.parent), "--", sys.executable, str(job), str(path), str(own)],
                           capture_output=True, text=True, timeout=240, cwd=REPO)
        assert r.returncode == 0, r.stderr
        doc, loaded = json.loads(r.stdout), json.loads(own.read_text())
        if doc["bytes"] == 0:
            continue
        seen += 1
        # seen loading (read calls between two samples can go uncounted: 280 MiB of 288 once; a lower bound)
        assert doc["bytes"] >= 144 * MIB, doc["bytes"]
        if doc["window_note"]:  # the load fell inside one sample: not timed, and said so
            assert "one sampling interval" in doc["window_note"]
        else:
            assert doc["io_span_s"] <= 1.5 * loaded["load_s"] + 0.05, (doc["io_span_s"], loaded)
        break
    assert seen, "the load was never seen in four tries"
