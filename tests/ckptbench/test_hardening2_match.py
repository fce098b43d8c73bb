"""watch --match leaves out the watcher by identity (itself, its ancestors, its descendants), never by the words in
a command line: a job run from a virtualenv under a path holding "ckptbench" is found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ckptbench.system import procstat
from ckptbench.core.errors import CkptbenchError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stop(*procs) -> None:
    for p in procs:
        p.kill()
        p.wait()


def test_a_job_whose_command_line_says_ckptbench_watch_is_found(tmp_path):
    tag = f"h2-match-{os.getpid()}"
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)", "/opt/ckptbench/venv", "watch", tag])
    try:
        time.sleep(0.3)
        p = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--json", "--no-verdict", "--interval", "0.1",
                            "--match", tag], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["pid"] == job.pid
    finally:
        _stop(job)


def test_the_watchers_own_tree_is_left_out():
    tag = f"h2-tree-{os.getpid()}"
    spawn = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', " \
            f"'{tag}']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", spawn])
    try:
        for _ in range(100):
            kids = procstat.children(parent.pid)
            if kids:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        child = kids[0]
        other = subprocess.Popen(["sleep", "30"])  # a watcher outside the tree sees both
        try:
            with pytest.raises(CkptbenchError, match="2 processes match"):
                procstat.find(tag, exclude=other.pid)
        finally:
            _stop(other)
        for watcher in (parent.pid, child):  # as the parent: its child is a descendant; as the child: its parent
            with pytest.raises(CkptbenchError, match="no running process"):
                procstat.find(tag, exclude=watcher)
    finally:
        _stop(parent)


def test_match_works_from_a_virtualenv_under_a_ckptbench_path(tmp_path):
    """The existing test, run by an interpreter at .../ckptbench-x/venv/bin/python: its jobs' command lines hold
    "ckptbench" and " watch" (the tag), and the old word filter left every one of them out."""
    home = tmp_path / "ckptbench-x"
    home.mkdir()
    os.symlink(sys.prefix, home / "venv")
    py = str(home / "venv" / "bin" / "python")
    p = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/ckptbench/test_watch.py::test_match_finds_one_process_or_says_why_not"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
