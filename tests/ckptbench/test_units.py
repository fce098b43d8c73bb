"""One format per kind of figure, for every command and the dashboard: a share as "82 %" (a new user saw 0.82, 82%
and 82 % for one efficiency), an age in the unit that keeps it short (floor said "0.0 h old" in one place and "63 s
old" in another for the same cache), bytes in binary units."""

from __future__ import annotations

import pytest

from ckptbench.core.units import human_age, human_bytes, human_pct


@pytest.mark.parametrize("fraction, text", [
    (0.82, "82 %"), (1.0, "100 %"), (1.114, "111 %"), (0.1, "10 %"), (0.0996, "10 %"),  # whole percents from 10 %
    (0.0994, "9.9 %"), (0.004, "0.4 %"), (0.0, "0.0 %"),  # under 10 % a decimal: 0.4 % is not none
    (0.415, "42 %"),  # 41.4999… as a float times 100
])
def test_a_share_is_a_percent_with_a_space(fraction, text):
    assert human_pct(fraction) == text


def test_a_change_carries_its_sign():
    assert human_pct(0.053, signed=True) == "+5.3 %" and human_pct(-0.124, signed=True) == "-12 %"
    assert human_pct(0.0, signed=True) == "+0.0 %"


def test_a_share_from_0_to_100_percent_is_at_most_five_characters():
    """A column of shares (a sweep's, the CPU per core) stays aligned with one width."""
    assert {len(human_pct(i / 1000)) for i in range(0, 1001)} <= {4, 5}


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (45, "45 s"), (59.4, "59 s"),
    (59.6, "1 min"), (63, "1 min"), (12 * 60, "12 min"), (59 * 60, "59 min"),
    (3570, "1.0 h"), (7200, "2.0 h"), (3.1 * 3600, "3.1 h"), (47.9 * 3600, "47.9 h"),
    (48 * 3600, "2.0 d"), (10 * 86400, "10.0 d"),
])
def test_an_age_is_said_in_the_unit_that_keeps_it_short(seconds, text):
    assert human_age(seconds) == text


def test_an_age_from_a_clock_set_back_is_new():
    assert human_age(-3.0) == "0 s"


def test_sizes_are_binary_units():
    assert human_bytes(512) == "512 B" and human_bytes(18 << 20) == "18.0 MiB" and human_bytes(3 << 30) == "3.0 GiB"
