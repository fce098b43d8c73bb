"""`--pick` in sysinfo, watch and tui: their error for a folder of several checkpoints said to choose one with
--pick, and none of them took it (the dashboard's side: tests/tui/test_pick_screens.py). The two .ckpt files are the
compat tier's, written by Lightning itself, under two names."""

from __future__ import annotations

import json
import os
import sys

from clirun import run_cli
from lightning_pair import two_ckpts


def test_the_commands_take_pick_and_say_when_it_has_nothing_to_pick_from(tmp_path):
    folder = two_ckpts(tmp_path)
    r = run_cli("sysinfo", folder)
    assert r.rc == 2 and "--pick" in r.err
    r = run_cli("sysinfo", folder, "--pick", "a.ckpt", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["checkpoint"] == "a.ckpt"
    for argv in (("sysinfo", "--pick", "a.ckpt"), ("tui", "--pick", "a.ckpt"),
                 ("watch", "--pick", "a.ckpt", "--", sys.executable, "-c", "pass")):
        r = run_cli(*argv)
        assert r.rc == 2 and len(r.err_lines) == 1 and "--pick chooses among" in r.err, (argv, r.err)
    import subprocess

    # in a process of its own: with --json the job writes to ckptbench's stderr, which in-process is captured in
    # memory and has no file descriptor to hand the job
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--source", folder, "--pick", "b.ckpt",
                           "--no-verdict", "--json", "--results", str(tmp_path / "W.csv"), "--", sys.executable, "-c",
                           "pass"], capture_output=True, text=True, timeout=240,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checkpoint"]["bytes"] == os.path.getsize(os.path.join(folder, "b.ckpt"))
