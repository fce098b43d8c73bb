"""A series killed outright (SIGKILL, OOM, a lost node) is no finished run: history says it was cut short and how many
of its saves (or repeats) finished, and says `running` of one whose process is still alive; a series that ends,
however it ends, is not called cut short."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from clirun import run_cli

from ckptbench.system import procstat

SCALE = "0.02"
HANG_S = 120  # only a guard against a hung series, never a measurement


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --results is ./results.csv: never the repository's


def _rows_now(results) -> int:
    try:
        with open(results, newline="") as f:
            return max(0, sum(1 for _ in f) - 1)
    except FileNotFoundError:
        return 0


def _history(results) -> dict[str, dict]:
    h = run_cli("history", results, "--json")
    assert h.rc == 0 and "Traceback" not in h.err, h.err
    return {x["run_id"]: x for x in json.loads(h.out)["runs"]}


def _killed_after(args: list[str], results, rows: int) -> tuple[dict, dict, str]:
    """The CLI `args` as a fresh process, SIGKILLed once `rows` rows are on record: (history while it ran, history
    after, the history line after)."""
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_S
    try:
        while _rows_now(results) < rows and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        assert _rows_now(results) >= rows, f"no {rows} rows on record in {HANG_S} s"
        alive = _history(results)
        proc.send_signal(signal.SIGKILL)  # no handler runs: nothing more is written
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    text = run_cli("history", results)
    assert text.rc == 0, text.err
    return alive, _history(results), text.out


def test_a_save_series_killed_outright_is_cut_short_in_history(tmp_path):
    results, target = str(tmp_path / "r.csv"), str(tmp_path / "t")
    assert run_cli("save", "small", target, "--scale", SCALE, "--no-fsync", "--count", "2", "--keep", "1",
                   "--results", results).rc == 0  # one that finished, beside it
    alive, after, text = _killed_after(["save", "small", target, "--scale", SCALE, "--no-fsync", "--count", "100000",
                                        "--keep", "1", "--results", results], results, 2 + 3)
    done, killed = list(after.values())
    assert done["status"] == "ok" and done.get("cut_short") is None
    assert alive[killed["run_id"]]["status"] == "running"
    assert killed["status"] == "cut short"
    assert killed["cut_short"]["planned"] == 100000
    assert killed["cut_short"]["finished"] == killed["repeats"] >= 3
    line = next(x for x in text.splitlines() if x.startswith(killed["run_id"]))
    assert f"cut short after {killed['repeats']} of 100000 saves" in line


def test_a_restore_run_killed_outright_is_cut_short_in_history(ckpt, tmp_path):
    results = str(tmp_path / "r.csv")
    alive, after, text = _killed_after(["run", ckpt("safetensors", 2), "--repeat", "30", "--results", results],
                                       results, 2)
    (killed,) = after.values()
    assert alive[killed["run_id"]]["status"] == "running"
    assert killed["status"] == "cut short"
    assert killed["cut_short"] == {"finished": killed["repeats"], "planned": 30} and killed["repeats"] >= 2
    assert f"cut short after {killed['repeats']} of 30 repeats" in text


def test_compare_says_a_run_it_compares_was_cut_short(ckpt, tmp_path):
    """compare took a killed run's rows as a finished run's, and said nothing: each row is a whole repeat, so it
    still compares them, and says the run was cut short and after how many."""
    results, src = str(tmp_path / "r.csv"), ckpt("safetensors", 2)
    assert run_cli("run", src, "--repeat", "2", "--results", results).rc == 0
    _, after, _ = _killed_after(["run", src, "--repeat", "30", "--results", results], results, 2 + 2)
    killed = next(x for x in after.values() if x["status"] == "cut short")
    c = run_cli("compare", results, "--json")
    assert c.rc in (0, 1) and "Traceback" not in c.err, c.err
    doc = json.loads(c.out)
    assert doc["newest"] == killed["run_id"]
    (note,) = doc["notes"]
    assert f"was cut short (killed) after {killed['repeats']} of 30 repeats" in note and "newest" in note
    text = run_cli("compare", results)
    assert any(ln.startswith("note: the newest run") and "cut short" in ln for ln in text.out.splitlines()), text.out


def test_a_series_killed_before_its_first_save_ended_is_listed_cut_short(tmp_path, monkeypatch):
    """Nothing finished, but it ran: history lists it with 0 of its saves (before, nothing said it had begun)."""
    from ckptbench.records.recorder import Lifeline

    results = str(tmp_path / "r.csv")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = procstat.identity(gone.pid)  # taken while it waits to be reaped
    gone.wait()
    monkeypatch.setattr(procstat, "identity", lambda pid=None: ident)  # the series' process, gone
    Lifeline(results, "save", "abc123", str(tmp_path / "t")).begin(4, mode="sync", cache="")
    (r,) = _history(results).values()
    assert (r["run_id"], r["kind"], r["status"], r["repeats"]) == ("abc123", "save", "cut short", 0)
    assert r["cut_short"] == {"finished": 0, "planned": 4}


@pytest.mark.parametrize("how", ["finished", "sigterm", "failed"])
def test_a_series_that_ended_is_never_cut_short(tmp_path, monkeypatch, how):
    from ckptbench.save import series

    results = str(tmp_path / "r.csv")
    if how == "sigterm":
        real, calls = series.prune, []

        def prune(target, keep):
            calls.append(real(target, keep))
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            return calls[-1]

        monkeypatch.setattr(series, "prune", prune)
    elif how == "failed":
        def prune(target, keep):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(series, "prune", prune)
    r = run_cli("save", "small", str(tmp_path / "t"), "--scale", SCALE, "--no-fsync", "--count", "4", "--keep", "1",
                "--results", results)
    assert r.rc == {"finished": 0, "sigterm": 143, "failed": 1}[how], r.err
    for x in _history(results).values():
        assert x["status"] not in ("cut short", "running") and x.get("cut_short") is None


def test_a_process_is_told_apart_from_one_gone_or_elsewhere():
    me = procstat.identity()
    assert procstat.still_running(me) is True
    assert procstat.still_running(me | {"start_ticks": me["start_ticks"] + 1}) is False  # its PID used again
    assert procstat.still_running(me | {"boot_id": "another-boot"}) is False  # rebooted since
    assert procstat.still_running(me | {"host": me["host"] + "-elsewhere"}) is None  # not this host's to see
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = procstat.identity(gone.pid)
    gone.wait()
    assert procstat.still_running(ident) is False
    assert procstat.still_running(None) is None and procstat.still_running({"pid": "1"}) is None


def test_a_zombie_is_not_running():
    """A child that exited but was not reaped keeps its PID and start time in /proc (state Z): it has ended."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        ident = procstat.identity(pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until it has exited, unreaped
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            pytest.fail("the child never became a zombie")
        assert ident["start_ticks"] is not None
        assert procstat.still_running(ident) is False
    finally:
        os.waitpid(pid, 0)
