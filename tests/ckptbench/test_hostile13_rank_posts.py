"""What another rank posts to torch's store (unauthenticated: anything on the network can write it) is checked before
rank 0 uses it. JSON nested past the parser's recursion raised RecursionError (only ValueError was caught), and
integers past a float's range (JSON's have no bound) raised OverflowError from the report's checks (a stage's
seconds) or later (a live post's bytes over bytes): tracebacks on rank 0 where the rest is one line."""

from __future__ import annotations

from dataclasses import fields

import pytest

from ckptbench.core.errors import CkptbenchError
from ckptbench.distributed import group, live, rank

HUGE = 10 ** 400


def _report(**changes) -> dict:
    plain = {"int": 0, "float": 0.0, "str": "", "bool": False, "str | None": None}
    doc = {f.name: plain.get(f.type, {} if f.type.startswith("dict") else []) for f in fields(rank.RankReport)}
    return doc | {"rank": 1} | changes


def test_a_post_nested_past_the_parsers_recursion_is_one_line():
    with pytest.raises(CkptbenchError, match="not what a rank of ckptbench posts"):
        group._decoded(b"[" * 100_000, 1, "report")


@pytest.mark.parametrize("changes", [{"stages": {"read": HUGE}}, {"read_end_s": HUGE}, {"bytes_read": HUGE}])
def test_a_report_with_a_number_past_a_floats_range_is_refused(changes):
    with pytest.raises(CkptbenchError, match="rank 1: its report cannot be read"):
        rank.read_report(_report(**changes), 1)


def test_a_plain_report_still_reads():
    assert rank.read_report(_report(stages={"read": 1.5}, bytes_read=10), 1)["bytes_read"] == 10


def test_a_live_post_past_any_size_is_left_out_and_a_plain_one_kept():
    assert live.read_post(b'{"s": "read", "b": %d, "n": 1}' % HUGE) is None
    assert live.read_post(b'{"s": "read", "b": 5, "n": 10}') == {"s": "read", "b": 5, "n": 10}
