"""What the sixth new-user pass met outside the dashboard.

- `torchrun ... run --distributed --repeat 3` printed a per-rank table whose slowest "end s" (0.176) was not the RTO
  printed under it ("RTO (slowest rank) 0.258 s ... median of 3"): the table is the last repeat's, and nothing said
  so. It now says which repeat it is when there were several.
- `--read pread` said "read path: pread (pread: as asked)", and the dashboard, which shows the reason's short part,
  "(read pread: pread)": the short part of a reason is now a reason ("as asked", "byte ranges")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ckptbench.records.results import read_documents
from ckptbench.system import readmode


def test_the_per_rank_table_says_it_is_the_last_repeat(h, tmp_path):
    ckpt = tmp_path / "ckpt"
    assert h.run_cli("gen", "small", str(ckpt), "--format", "torch", "--ranks", "2", "--scale", h.SCALE).rc == 0
    res = tmp_path / "r.csv"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                        "ckptbench", "run", str(ckpt), "--distributed", "--repeat", "2", "--results", str(res)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    doc = [d for d in read_documents(str(res), "run") if d.get("kind") == "dist"][-1]
    lines = p.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["rank", "host"])
    assert lines[head - 1] == "  per rank, the last repeat (2 of 2; the RTO below is the median):", p.stdout
    ends = [float(ln.split()[8]) for ln in lines[head + 1:head + 3]]
    assert round(max(ends), 3) == round(doc["repeats"][-1]["rto_s"], 3), (ends, doc["repeats"][-1])


def test_a_read_mode_asked_for_gives_a_reason_not_the_mode_again(h, tmp_path):
    ckpt = tmp_path / "ckpt"
    assert h.run_cli("gen", "small", str(ckpt), "--scale", h.SCALE).rc == 0
    r = h.run_cli("run", str(ckpt), "--read", "pread", "--repeat", "1", "--results", tmp_path / "r.csv", "--json")
    assert r.rc == 0, r.err
    why = json.loads(r.out)["read"]["why"]
    assert readmode.short(why) == "as asked" and "--read pread" in why, why
