"""Once in a real terminal: `ckptbench tui DIR --run` in a detached tmux session of fixed size, driven with
send-keys and read back with capture-pane. tmux is required (CI installs it): without it this test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

TMUX = shutil.which("tmux") or "/usr/bin/tmux"
SESSION = "tui"


def tmux(sock: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    # COLUMNS/LINES (set under pytest) would override the pane's size for the app inside: leave them out
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run([TMUX, "-L", sock, *args], capture_output=True, text=True, timeout=30, check=check, env=env)


def screen(sock: str) -> str:
    return tmux(sock, "capture-pane", "-p", "-t", SESSION).stdout


def session_alive(sock: str) -> bool:
    return tmux(sock, "has-session", "-t", SESSION, check=False).returncode == 0


def wait_for(sock: str, pred, what: str, timeout: float = 60.0) -> str:
    """Capture the pane until pred(text) holds; fail with the last capture after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        if not session_alive(sock):
            raise AssertionError(f"the tmux session ended while waiting for {what}; last screen:\n{text}")
        text = screen(sock)
        if pred(text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last screen:\n{text}")


def test_tui_in_tmux_runs_restores_and_quits(small_ckpt, tmp_path, request, h):
    assert os.path.exists(TMUX), "tmux is required for this test (apt-get install tmux)"
    sock = f"ckptbench-test-{os.getpid()}"
    request.addfinalizer(lambda: tmux(sock, "kill-server", check=False))
    results = tmp_path / "R.csv"
    cmd = f"cd {h.REPO} && env -u COLUMNS -u LINES TERM=xterm-256color {h.CKPTBENCH_BIN} tui {small_ckpt} --run --results {results}" \
          f"; echo EXITED $?; sleep 30"
    tmux(sock, "new-session", "-d", "-s", SESSION, "-x", "140", "-y", "45", cmd)

    # the run finishes: every stage timed on the stage bar, the read throughput in the notification
    done = wait_for(sock, lambda t: "restored: RTO" in t and "GB/s" in t and "idle ·" in t, "the run to finish")
    for stage in h.STAGES:
        assert f" {stage} " in done and f" {stage} …" not in done, f"{stage}:\n{done}"
    assert "RTO" in done and "concurrency 8" in done, done

    # + raises the concurrency shown in the settings line; k opens the checklist, escape comes back
    tmux(sock, "send-keys", "-t", SESSION, "+")
    wait_for(sock, lambda t: "concurrency 16" in t, "concurrency 16 after +", 15)
    tmux(sock, "send-keys", "-t", SESSION, "k")
    wait_for(sock, lambda t: "verdict" in t and "Export MD" in t, "the checklist screen", 15)
    tmux(sock, "send-keys", "-t", SESSION, "Escape")
    wait_for(sock, lambda t: "read throughput" in t and "concurrency 16" in t, "the dashboard again", 15)

    tmux(sock, "send-keys", "-t", SESSION, "q")
    text = wait_for(sock, lambda t: "EXITED" in t, "the app to exit", 15)
    assert "EXITED 0" in text, text
    tmux(sock, "kill-session", "-t", SESSION, check=False)
    assert not session_alive(sock)

    rows = h.read_results(results)
    assert len(rows) == 1 and rows[0]["status"] == "ok", rows
