"""watch: only ASCII digits are a PID; a zombie is not a job to watch (one line, exit 2, nothing recorded)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from clirun import assert_one_line_error, run_cli


@pytest.mark.parametrize("target", ["٣", "１", "³", "1٣"])
def test_a_pid_in_other_digits_is_refused_in_one_line(target):
    r = run_cli("watch", target, "--no-verdict")
    assert_one_line_error(r, "not a PID")
    assert "process 3" not in r.err and "process 1 " not in r.err


def _zombie() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(200):  # exited, not reaped: a zombie of this process
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return child
        time.sleep(0.02)
    raise AssertionError("the child did not become a zombie")


def test_a_zombie_is_one_line_and_nothing_is_recorded(tmp_path):
    child = _zombie()
    try:
        results = tmp_path / "R.csv"
        r = run_cli("watch", child.pid, "--no-verdict", "--json", "--results", results)
        assert_one_line_error(r, f"process {child.pid}")
        assert "zombie" in r.err
        assert not results.exists() and not os.path.exists(f"{results}.jsonl")
    finally:
        child.wait()


def test_the_watch_class_refuses_a_zombie_it_did_not_start():
    from ckptbench.system.procstat import ProcessGone
    from ckptbench.watch.sampler import Watch

    child = _zombie()
    try:
        with pytest.raises(ProcessGone, match="zombie"):
            Watch(child.pid, interval=0.05).run()
    finally:
        child.wait()
