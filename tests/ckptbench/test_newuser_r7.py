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
