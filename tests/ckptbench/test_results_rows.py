"""One row builder and one document builder for every kind: the same status words and the same head fields
(status, verified, success_rate); one meaning per rate; older schemas read in today's meanings."""

from __future__ import annotations

import csv

import pytest

from ckptbench.records import results

ENV = {"date": "2026-01-01T00:00:00"}


def _row(kind, **kw):
    said = {"status": "ok", "verified": True, "success_rate": 1.0} | kw.pop("said", {})
    return results.row(kind, "r1", 1, "/ckpt", kw.pop("settings", {}), kw.pop("figures", {}), ENV, **said)


@pytest.mark.parametrize("kind", results.KINDS)
def test_every_kind_has_the_same_head(kind):
    r = _row(kind, said={"verified": None})
    assert {"status", "verified", "success_rate", "schema", "kind", "env"} <= set(r)
    assert r["schema"] == results.SCHEMA and r["status"] == "ok"


@pytest.mark.parametrize("status,verified,word", [
    ("ok", True, "ok"), ("ok", False, "unverified"), ("ok", None, "ok"), ("failed", False, "failed"),
    ("cancelled", False, "cancelled")])
def test_one_status_vocabulary(status, verified, word):
    assert results.status_of(status, verified) == word
    assert _row("dist", said={"status": status, "verified": verified})["status"] == word
    doc = results.document("run", "save", "r1", "/c", {"status": "bogus"}, ENV, status=status, verified=verified,
                           success_rate=0.5)
    assert doc["status"] == word and doc["verified"] is verified and doc["success_rate"] == 0.5


def test_unknown_status_setting_or_figure_is_a_bug():
    with pytest.raises(ValueError):
        results.status_of("done", True)
    with pytest.raises(ValueError):
        _row("restore", settings={"colour": "red"})
    with pytest.raises(ValueError):
        _row("restore", figures={"speed": 1.0})


def test_settings_are_declared_once_and_are_columns():
    assert set(results.SETTINGS) <= set(results.COLUMNS)
    assert not set(results.SETTINGS) & set(results.FIGURES)
    assert {"read_gbps", "aggregate_gbps", "write_gbps", "success_rate"} - {"success_rate"} <= set(results.FIGURES)


def test_rows_round_trip_with_verified_and_aggregate(tmp_path):
    path = str(tmp_path / "r.csv")
    results.append(path, [_row("restore", figures={"read_gbps": 2.0}),
                          _row("dist", said={"verified": False}, figures={"aggregate_gbps": 8.0}, settings={"ranks": 4})])
    a, b = results.read_rows(path)
    assert (a["verified"], a["read_gbps"], a["aggregate_gbps"]) == (True, 2.0, None)
    assert (b["status"], b["verified"], b["read_gbps"], b["aggregate_gbps"]) == ("unverified", False, None, 8.0)


def test_schema_2_file_stays_readable_and_takes_rows_in_its_own_meanings(tmp_path):
    """A schema-2 dist row kept its aggregate in read_gbps: read back as aggregate_gbps, and written there too."""
    path = tmp_path / "v2.csv"
    v2 = list(results.COLUMNS_V2)
    old = dict.fromkeys(v2, "") | {"schema": "2", "kind": "dist", "run_id": "old", "repeat": "1", "status": "unverified",
                                   "read_gbps": "16.0", "ranks": "4", "env": "{}"}
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(v2)
        w.writerow([old[c] for c in v2])
    results.append(str(path), [_row("dist", figures={"aggregate_gbps": 8.0}, settings={"ranks": 4})])
    with open(path, newline="") as f:
        raw = list(csv.DictReader(f))
    assert [r["schema"] for r in raw] == ["2", "2"] and raw[1]["read_gbps"] == "8.0"
    assert list(raw[0]) == v2  # the header is unchanged
    a, b = results.read_rows(str(path))
    assert (a["aggregate_gbps"], a["read_gbps"], a["verified"]) == (16.0, None, False)
    assert (b["aggregate_gbps"], b["read_gbps"]) == (8.0, None)
