"""A gen or save killed mid-write (SIGKILL: no cleanup runs) left its staging folder beside the target for good: the
next run into the same place now removes it, and says so in one line, because the folder holds the marker the tool
wrote into it first. A folder under the same kind of name without the marker is the user's and stays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from clirun import run_proc

from ckptbench.core.staging import MARKER, host


def _kill_mid_write(parent, *args: str) -> str:
    """Runs the CLI and SIGKILLs it once its staging folder in `parent` holds a file of the checkpoint beside the
    marker; returns that folder's name."""
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            for n in os.listdir(parent):
                try:
                    if ".tmp-" in n and set(os.listdir(os.path.join(parent, n))) - {MARKER}:
                        proc.send_signal(signal.SIGKILL)
                        proc.wait()
                        return n
                except OSError:  # renamed into place meanwhile
                    continue
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait()
    pytest.fail(f"{args[0]} ended before it could be killed mid-write")


def _users_folder(parent, name_like: str) -> str:
    """A folder of the user's own, named as a staging folder of a process that has ended, without the marker."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name = name_like[:name_like.index(".tmp-")] + f".tmp-{host()}-{int(dead.stdout)}"
    os.mkdir(os.path.join(parent, name))
    with open(os.path.join(parent, name, "notes.txt"), "w") as f:
        f.write("mine\n")
    return name


def test_a_killed_gens_staging_folder_is_removed_by_the_next_gen(tmp_path):
    left = _kill_mid_write(tmp_path, "gen", "small", tmp_path / "ck", "--scale", "1")
    assert os.path.isfile(tmp_path / left / MARKER) and not (tmp_path / "ck").exists()
    mine = _users_folder(tmp_path, left)
    r = run_proc("gen", "small", tmp_path / "ck", "--scale", "0.02")
    assert r.rc == 0, r.err
    assert r.err_lines == [f"removed {tmp_path / left}: the staging folder of a gen that was killed before it "
                           "finished"]
    assert sorted(os.listdir(tmp_path)) == sorted(["ck", mine])
    assert (tmp_path / mine / "notes.txt").read_text() == "mine\n"
    assert MARKER not in os.listdir(tmp_path / "ck")
    r = run_proc("verify", tmp_path / "ck")
    assert r.rc == 0, r.out + r.err


@pytest.mark.parametrize("fmt", ["safetensors", "dcp"])
def test_a_killed_saves_staging_folder_is_removed_by_the_next_save(tmp_path, fmt):
    target = tmp_path / "t"
    target.mkdir()
    left = _kill_mid_write(target, "save", "small", target, "--scale", "1", "--count", "1", "--format", fmt,
                           "--no-fsync", "--results", "")
    assert os.path.isfile(target / left / MARKER) and not (target / "step-000001").exists()
    mine = _users_folder(target, left)
    r = run_proc("save", "small", target, "--scale", "0.02", "--count", "1", "--format", fmt, "--no-fsync",
                 "--results", "", "--json")
    assert r.rc == 0, r.err
    notes = [n for n in json.loads(r.out)["notes"] if "staging" in n]
    assert notes == [f"removed 1 staging folder(s) of a save that was killed before it finished ({left})"]
    assert sorted(os.listdir(target)) == sorted(["step-000001", mine])
    assert (target / mine / "notes.txt").read_text() == "mine\n"
    assert MARKER not in os.listdir(target / "step-000001")
    r = run_proc("verify", target / "step-000001")
    assert r.rc == 0, r.out + r.err
