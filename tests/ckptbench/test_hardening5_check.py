"""A recorded knee is input like any other: `check --results` over a knee record whose best was no measured level,
whose rates are NaN or out of range, or whose `how` and `date` carry a credential or 100 kB, says the record is
malformed in one line and does not use it; what it shows is redacted and bounded, and --json stays JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch
from clirun import run_cli
from safetensors.torch import save_file

from ckptbench.restore.sweep import GBPS_MAX, TEXT_MAX, MeasuredKnee

GOOD = {"record": "knee", "knee": 16, "best": 16, "gbps": {"8": 1.0, "16": 2.0}, "how": "sweep",
        "date": "2025-01-31 12:00"}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("h5check") / "ck"
    d.mkdir()
    save_file({"w": torch.zeros(256, 256)}, str(d / "model.safetensors"))
    return str(d)


@pytest.fixture(autouse=True)
def _floor(plant_floor):
    plant_floor()  # the floor from the test's cache: the knee is what is under test, and measuring it took seconds


def _check(ckpt: str, tmp_path, *docs: dict, json_out: bool = False):
    results = tmp_path / "k.csv"
    with open(f"{results}.jsonl", "w") as f:  # written as a hand or another tool would: NaN as JSON's NaN token
        for doc in docs:
            f.write(json.dumps({"source": ckpt} | doc) + "\n")
    r = run_cli("check", ckpt, "--results", results, *(["--json"] if json_out else []))
    assert r.rc in (0, 1) and "Traceback" not in r.err, r.err
    return r


def _concurrency(r) -> dict:
    def refuse(name):
        raise AssertionError(f"check --json printed {name}: not JSON")

    doc = json.loads(r.out, parse_constant=refuse)
    return next(i for i in doc["items"] if i["id"] == "concurrency")


@pytest.mark.parametrize("bad, why", [
    ({"best": 999}, "best '999' is not a level it measured"),
    ({"knee": 12}, "knee '12' is not a level it measured"),
    ({"knee": True}, "knee 'True'"),
    ({"knee": "16"}, "knee '16'"),
    ({"gbps": {"8": math.nan, "16": 2.0}}, "at level 8 is 'nan'"),
    ({"gbps": {"8": 1.0, "16": math.inf}}, "at level 16 is 'inf'"),
    ({"gbps": {"8": -1.0, "16": 2.0}}, "at level 8 is '-1.0'"),
    ({"gbps": {"8": 1.0, "16": GBPS_MAX * 2}}, "at level 16"),
    ({"gbps": {"8": 1.0, "16": "2.0"}}, "at level 16 is '2.0'"),
    ({"gbps": {"0": 1.0, "16": 2.0}}, "level '0'"),
    ({"gbps": {"08": 1.0, "16": 2.0}}, "level '08'"),
    ({"gbps": {"9" * 5000: 1.0, "16": 2.0}}, "level '999"),
    ({"gbps": []}, "no GB/s by level"),
    ({"how": None}, "no how"),
])
def test_a_malformed_knee_record_is_not_used_and_check_says_so(ckpt, tmp_path, bad, why):
    assert MeasuredKnee.from_json(GOOD | {"source": ckpt} | bad) is None
    it = _concurrency(_check(ckpt, tmp_path, GOOD | bad, json_out=True))
    ev = it["evidence"]
    assert "knee" not in ev and ev["basis"].startswith("no measurement")  # advice does not go by it
    assert ev["knee_record"].startswith(f"{tmp_path / 'k.csv.jsonl'}: the newest knee record of this checkpoint is "
                                        "malformed (") and why in ev["knee_record"]
    assert len(ev["knee_record"]) < 300


def test_a_malformed_record_newer_than_a_good_one_leaves_the_good_one_in_use_and_is_said(ckpt, tmp_path):
    r = _check(ckpt, tmp_path, GOOD | {"knee": 8, "date": "2025-01-30 08:00"}, GOOD | {"best": 999})
    line = next(ln for ln in r.out.splitlines() if "evidence: concurrency=" in ln)
    assert "basis=measured knee 8 (sweep of 2025-01-30 08:00)" in line
    assert "knee_record=" in line and "malformed (its best '999' is not a level it measured)" in line


def test_a_good_record_newer_than_a_malformed_one_is_used_and_nothing_is_said(ckpt, tmp_path):
    it = _concurrency(_check(ckpt, tmp_path, GOOD | {"best": 999}, GOOD | {"knee": 8}, json_out=True))
    assert it["evidence"]["knee"] == 8 and "knee_record" not in it["evidence"]


def test_a_knee_records_how_and_date_are_redacted_and_cut(ckpt, tmp_path):
    doc = GOOD | {"how": "sweep token=sEcReT " + "x" * 100_000, "date": "s3://AKIAIOSFODNN7EXAMPLE:hunter2@b/x"}
    text = _check(ckpt, tmp_path, doc)
    as_json = _check(ckpt, tmp_path, doc, json_out=True)
    for out in (text.out, as_json.out):
        assert "sEcReT" not in out and "hunter2" not in out and "AKIAIOSFODNN7EXAMPLE" not in out
        assert "x" * (TEXT_MAX + 1) not in out
    assert len(text.out) < 20_000  # the 100 kB `how` had been printed whole, twice
    ev = _concurrency(as_json)["evidence"]
    assert ev["knee"] == 16 and ev["basis"].startswith("measured knee 16 (sweep token=<redacted> xxx")
    mk = MeasuredKnee.from_json(doc | {"source": ckpt})
    assert len(mk.how) <= TEXT_MAX and mk.date == "s3://b/x"


def test_a_finished_records_figures_still_come_back_whole(ckpt):
    mk = MeasuredKnee.from_json(GOOD | {"source": ckpt, "gbps": {"1": 0, "8": 1, "16": 2.5}})
    assert mk == MeasuredKnee(ckpt, 16, 16, {1: 0.0, 8: 1.0, 16: 2.5}, "sweep", "2025-01-31 12:00")
    assert MeasuredKnee.from_json(mk.to_json()) == mk
    assert MeasuredKnee.from_json(GOOD | {"source": ckpt, "status": "cancelled", "knee": None}) is None
