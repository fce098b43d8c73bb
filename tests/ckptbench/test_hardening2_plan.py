"""plan --results: a recorded save throughput out of range (negative, zero, absurd) is unknown, said in one line, and
never makes an interval "met"; recorded text in what plan shows is printable."""

from __future__ import annotations

import json

import pytest
from clirun import run_cli

from ckptbench.records import results


def _save_rows(path, gbps: list[float], run_id: str = "r1", target: str = "/t") -> None:
    env = {"date": "2024-01-01T00:00:00"}
    rows = [{"schema": results.SCHEMA, "kind": "save", "run_id": run_id, "repeat": i + 1, "timestamp": env["date"],
             "source": "small", "format": "safetensors", "mode": "sync", "status": "ok", "target": target,
             "bytes": 280 << 20, "durable_s": 1.0, "write_gbps": g, "env": env} for i, g in enumerate(gbps)]
    results.append(str(path), rows)


@pytest.mark.parametrize("gbps", [[-3.0, -3.0], [1e9, 1e9], [2.0, -1.0], [0.0, 0.0]])
def test_out_of_range_throughput_is_unknown_never_met(tmp_path, gbps):
    path = tmp_path / "R.csv"
    _save_rows(path, [5.0, 5.0], run_id="older")  # an older good run must not stand in for the newest
    _save_rows(path, gbps)
    r = run_cli("plan", "small", "--interval", "3600", "--results", path, "--json")
    assert r.rc == 0, r.err
    save = json.loads(r.out)["save"]
    assert "measured" not in save
    assert "out of range" in save["measured_unknown"] and "r1" in save["measured_unknown"]
    r = run_cli("plan", "small", "--interval", "3600", "--results", path)
    assert r.rc == 0, r.err
    assert ": met" not in r.out and "-" not in r.out.split("saving every", 1)[1].split("GB/s", 1)[0]


def test_a_good_run_is_still_measured_and_its_text_printable(tmp_path):
    path = tmp_path / "R.csv"
    _save_rows(path, [1.0, 2.0, 2.0], target="/t\x1b]0;pwned\x07")
    r = run_cli("plan", "small", "--interval", "3600", "--results", path)
    assert r.rc == 0 and "2.000 GB/s sustained" in r.out and ": met" in r.out, r.out
    assert "\x1b" not in r.out and "\x07" not in r.out


def test_an_absurd_recorded_read_rate_is_not_a_measurement(tmp_path):
    from ckptbench.plan.scale import measured_rank_read

    path = tmp_path / "R.csv"
    env = {"date": "2024-01-01T00:00:00"}
    row = {"schema": results.SCHEMA, "kind": "restore", "repeat": 1, "timestamp": env["date"], "format": "safetensors",
           "mode": "pipeline", "status": "ok", "cache": "cold", "rto_s": 1.0, "bytes": 10, "env": env}
    results.append(str(path), [row | {"run_id": "good", "source": "/c\x1b[2J", "read_gbps": 2.0}])
    assert measured_rank_read(str(path))["gbps"] == 2.0
    assert "\x1b" not in measured_rank_read(str(path))["where"]
    results.append(str(path), [row | {"run_id": "damaged", "source": "/c", "read_gbps": 1e9}])
    assert measured_rank_read(str(path))["run_id"] == "good"
