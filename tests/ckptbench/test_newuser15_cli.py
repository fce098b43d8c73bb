"""New-user pass 15, the command line: options that only an s3:// source, a price or several ranks read are refused
where they would be ignored; the terminal UI refuses a pipe in one line; a save of one save says so."""

from __future__ import annotations

import subprocess
import sys

import pytest
from clirun import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("nu15c") / "ck"
    assert run_cli("gen", "small", path, "--scale", "0.02").rc == 0
    return str(path)


@pytest.mark.parametrize("cmd, extra, needle", [
    ("floor", ("--s3-client", "crt"), "--s3-client crt: only for an s3:// source"),
    ("run", ("--part-size", "1048576", "--repeat", "1"), "--part-size 1048576: only for an s3:// source"),
    ("read", ("--s3-client", "crt"), "--s3-client crt: only for an s3:// source"),
    ("run", ("--spot-discount", "0.7", "--repeat", "1"), "--spot-discount needs --price-per-hour (the RTO's cost is priced from it)"),
    ("run", ("--restores-per-day", "4", "--repeat", "1"), "--restores-per-day needs --price-per-hour"),
], ids=["floor-client", "run-part-size", "read-client", "spot", "restores-per-day"])
def test_an_option_the_source_or_settings_would_ignore_is_refused(ckpt, tmp_path, cmd, extra, needle):
    results = ("--results", str(tmp_path / "R.csv")) if cmd == "run" else ()
    r = run_cli(cmd, ckpt, *extra, *results)
    assert_one_line_error(r, needle)
    assert not (tmp_path / "R.csv").exists()  # refused before anything ran or was recorded


def test_a_stagger_of_one_rank_is_refused(tmp_path):
    assert_one_line_error(run_cli("save", "small", tmp_path / "t", "--stagger", "1", "--count", "1"),
                          "there is one rank: add --ranks N")
    assert not (tmp_path / "t").exists()


def test_one_save_says_its_figure_is_of_the_only_save(tmp_path):
    r = run_cli("save", "small", tmp_path / "t", "--scale", "0.02", "--no-fsync", "--count", "1", "--results",
                tmp_path / "S.csv")
    assert r.rc == 0, r.err
    line = next(x for x in r.out.splitlines() if x.startswith("sustained throughput, not durable (--no-fsync)"))
    assert "of the only save)" in line and "after the first" not in line, line


def test_the_terminal_ui_refuses_a_pipe_in_one_line(ckpt):
    r = subprocess.run([sys.executable, "-m", "ckptbench", "tui", ckpt], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stdout == "", r.stdout[-300:]
    assert r.stderr.strip().splitlines() == [
        "ckptbench: error: the terminal UI needs a terminal, and this one's input or output is not one: run it in a "
        "terminal, or headless with --json (`ckptbench run SOURCE --json`)"]
