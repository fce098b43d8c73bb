"""What the seventh new-user pass met (local sources; tests/s3/test_s3_newuser_r7.py has the S3 ones).

- `--help` of verify, load, pack, unpack and upload listed DIR, OUT and s3://BUCKET/PREFIX with no word on what they
  are; upload's --part-size said "S3: bytes per ranged GET" (run's meaning) where upload cuts multipart parts by it;
  gen's --format said only "default: the profile's"."""

from __future__ import annotations

import argparse

import pytest

from ckptbench.cli import root


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = root.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_every_argument_of_every_command_says_what_it_is(name):
    for action in _subparsers()[name]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        said = (action.help or "").replace("%(default)s", "")
        assert said.strip() and not said.strip().startswith(("(default", "default")), (name, action.dest, action.help)


def test_upload_part_size_is_the_multipart_part():
    text = _subparsers()["upload"].format_help()
    assert "ranged GET" not in text and "multipart part size" in text, text


@pytest.fixture(scope="module")
def idle_watch(tmp_path_factory) -> tuple[str, object]:
    """A watch of a job that reads no checkpoint byte, recorded."""
    import sys

    from clirun import run_cli

    root = tmp_path_factory.mktemp("nu_r7_watch")
    ckpt, results = str(root / "ck"), str(root / "results.csv")
    assert run_cli("gen", "small", ckpt, "--scale", "0.02").rc == 0
    r = run_cli("watch", "--no-verdict", "--interval", "0.05", "--source", ckpt, "--results", results, "--",
                sys.executable, "-c", "import time; time.sleep(0.3)")
    assert r.rc == 0, r.err
    return results, r


def test_a_watch_that_saw_no_read_gives_no_rate(idle_watch):
    """It said "read 0 B in 0.00 s of reading: 0.00 GB/s": a rate of nothing over no time."""
    _, r = idle_watch
    line = next(ln for ln in r.out.splitlines() if ln.startswith("read"))
    assert "GB/s" not in line and "no checkpoint read seen" in line, line


def test_history_of_a_watch_that_saw_no_read_says_no_save(idle_watch):
    """history said "median RTO after the first save - (no checkpoint read seen ...)" of a watch, and `steady` true:
    the save's first-save rule was taken as applied where no repeat was left to time."""
    import json

    from clirun import run_cli

    results, _ = idle_watch
    out = run_cli("history", results)
    assert out.rc == 0, out.err
    assert "no checkpoint read seen" in out.out and "save" not in out.out, out.out
    (doc,) = json.loads(run_cli("history", results, "--json").out)["runs"]
    assert doc["steady"] is False and doc["unseen"] is True, doc


def test_the_time_held_to_the_floor_says_it_is_a_median_of_repeats(monkeypatch):
    """`run --repeat 3` said "the efficiency is over the RTO less its first step (0.052 s, ...): 0.114 s" under a median
    RTO of 0.179 s: 0.179 - 0.052 is 0.127. The 0.114 s is the median of each repeat's difference, which no pair of
    medians gives; the note now says so, and gives the steps' range, not a median to subtract."""
    from types import SimpleNamespace

    from ckptbench.restore import efficiency

    monkeypatch.setattr(efficiency, "of_restore", lambda *a, **kw: {"efficiency": 0.68, "floor_s": 0.078,
                                                                     "floor_note": "bound by storage"})

    def rep(rto, check):
        return SimpleNamespace(status="ok", rto_s=rto, stages={"check": check}, check_kind="model step",
                               cache=SimpleNamespace(residency_before=0.0), populated_bytes=0, populate_cpu_s=0.0)

    reps = [rep(0.217, 0.115), rep(0.137, 0.023), rep(0.179, 0.052)]
    note = efficiency.of_repeats(None, None, None, reps)["floor_note"]
    assert "each repeat's RTO less its first step" in note, note
    assert "0.023 s to 0.115 s" in note and "median 0.114 s" in note, note
    assert "0.052 s" not in note, note  # the median step, which does not subtract from the median RTO to the 0.114
    one = efficiency.of_repeats(None, None, None, reps[:1])["floor_note"]
    assert "the RTO less its first step (0.115 s" in one and ": 0.102 s" in one, one
