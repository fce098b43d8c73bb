"""Credentials never leave the process: watch's text, --json and results rows, save's rows, the --match ambiguity
error and the CLI's error line all go through errors.redact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from clirun import run_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
S = "hunter2XyZ"
LEAKY = ["--password", S, f"https://alice:p/{S}@objects.example.com/b", f"--hf-token={S}",
         "Authorization: Bearer " + S, "AKIAIOSFODNN7EXAMPLE"]


def _no_leak(*texts) -> None:
    for t in texts:
        assert S not in t and "AKIAIOSFODNN7EXAMPLE" not in t, t


def _all_of(results) -> str:
    return open(results).read() + open(f"{results}.jsonl").read()


def test_watch_json_text_and_results_are_redacted(tmp_path):
    results = tmp_path / "R.csv"
    job = [sys.executable, "-c", "import time; time.sleep(0.4)", *LEAKY]
    for fmt in (["--json"], []):
        p = subprocess.run([sys.executable, "-m", "ckptbench", "watch", *fmt, "--no-verdict", "--interval", "0.1",
                            "--results", str(results), "--", *job], capture_output=True, text=True, timeout=120,
                           cwd=REPO)
        assert p.returncode == 0, p.stderr
        _no_leak(p.stdout, p.stderr)
        assert "<redact" in p.stdout  # the text cuts the command at 80 characters
    _no_leak(_all_of(results))
    doc = [json.loads(ln) for ln in open(f"{results}.jsonl")][-1]
    assert "objects.example.com/b" in doc["command"]  # the host stays, the user-info goes


def test_save_rows_and_json_are_redacted(tmp_path):
    target = tmp_path / f"alice:{S}@host"  # an scp-style user:password@host folder name
    results = tmp_path / "R.csv"
    r = run_cli("save", "small", target, "--scale", "0.02", "--no-fsync", "--count", "1", "--json",
                "--results", results)
    assert r.rc == 0, r.err
    _no_leak(r.out, r.err, _all_of(results))
    r = run_cli("save", "small", target, "--scale", "0.02", "--no-fsync", "--count", "1")
    assert r.rc == 0, r.err
    _no_leak(r.out, r.err)


def test_the_cli_error_line_is_redacted(tmp_path):
    r = run_cli("save", "small", tmp_path / "missing" / f"x?token={S}" / "t", "--scale", "0.02")
    assert r.rc == 2 and r.err.startswith("ckptbench: error:")
    _no_leak(r.err)
    r = run_cli("compare", tmp_path / f"u:{S}@h" / "R.csv")
    assert r.rc != 0 and "ckptbench: error:" in r.err
    _no_leak(r.err)


def test_match_ambiguity_lists_commands_redacted():
    tag = f"leak-match-{os.getpid()}"
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", tag, *LEAKY]) for _ in range(2)]
    try:
        time.sleep(0.3)
        p = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--match", tag], capture_output=True,
                           text=True, timeout=60, cwd=REPO)
        assert p.returncode == 2 and "2 processes match" in p.stderr, p.stderr
        _no_leak(p.stderr)
    finally:
        for q in procs:
            q.kill()
            q.wait()
