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
