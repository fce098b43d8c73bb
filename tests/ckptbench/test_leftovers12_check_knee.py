"""check --quick-sweep on a tiny checkpoint marked the Concurrency item "ok" from a knee that is noise (its levels'
rates are opening files and starting threads): it says unknown now, in the words `sweep` says of a knee over a floor
under 10 ms, and advises nothing from it."""

from __future__ import annotations

import pytest

from ckptbench.checklist import rules
from ckptbench.checklist.facts import Facts
from ckptbench.restore.sweep import MeasuredKnee
from ckptbench.system import floor as fl

GBPS = {1: 0.6, 4: 0.7, 8: 1.4, 16: 1.0}


def _facts(size: int, floor_s=None) -> Facts:
    sweep = {"gbps": {str(k): {"median": v} for k, v in GBPS.items()}, "knee": 8, "best": 8, "read": "direct",
             "hash": "none", "date": "2025-01-31 12:00"} | ({"floor_s": floor_s} if floor_s is not None else {})
    return Facts(source="/ckpt", concurrency=8, sizes=[size], sweep=sweep,
                 knee=MeasuredKnee("/ckpt", 8, 8, GBPS, "quick sweep", "2025-01-31 12:00"))


def _noise(it) -> bool:
    return (it.verdict == "unknown" and it.evidence.get("too_small") is True
            and fl.SMALL_SWEEP_WHY in it.evidence["reason"] and fl.SMALL_SWEEP_FIX in it.fix)


def test_a_knee_over_a_floor_under_10_ms_is_unknown():
    assert _noise(rules.concurrency(_facts(1 << 30, floor_s=0.004)))


def test_with_no_floor_known_a_best_read_under_10_ms_is_unknown():
    assert _noise(rules.concurrency(_facts(5 << 20)))  # 5 MiB at 1.4 GB/s: 3.7 ms, and no floor is longer


def test_a_knee_of_a_checkpoint_that_takes_time_is_judged():
    it = rules.concurrency(_facts(4 << 30))  # 4 GiB at 1.4 GB/s: 3 s
    assert it.verdict == "ok" and "too_small" not in it.evidence
    assert rules.concurrency(_facts(4 << 30, floor_s=0.5)).verdict == "ok"


@pytest.mark.usefixtures("box_floor")
def test_check_quick_sweep_of_a_tiny_checkpoint_is_unknown(tmp_path):
    from clirun import run_cli

    d = tmp_path / "tiny"
    assert run_cli("gen", "small", d, "--scale", "0.02").rc == 0
    r = run_cli("check", d, "--quick-sweep", "--json", "--results", "")
    assert r.rc in (0, 1), r.err
    import json

    item = next(i for i in json.loads(r.out)["items"] if i["id"] == "concurrency")
    assert item["verdict"] == "unknown" and item["evidence"]["too_small"] is True, item
    assert "quick sweep" in item["evidence"]["basis"]  # which knee it judged
