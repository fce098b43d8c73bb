"""The compat tier: checkpoints the training libraries wrote themselves (fixtures/<name>/, made by make_fixtures.py in
the compat venv), each with expected.json, what that library's own loader or resume returned from it. The tests read
only those files and run ckptbench on a copy: no training library is imported here."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckptbench"))

from clirun import run_cli  # noqa: E402  (the CLI in this process, as tests/ckptbench runs it)
from compat_helpers import copy_fixture  # noqa: E402


@pytest.fixture
def compat(tmp_path):
    """compat(name) -> Compat: the fixture copied to tmp_path."""
    return lambda name: copy_fixture(name, tmp_path)


@pytest.fixture(scope="session")
def cli():
    return run_cli
