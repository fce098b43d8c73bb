"""The floor's cache is anyone's who can write the user's cache directory. JSON's integers have no bound: a
measured_at of 10**400 was dropped by the figure's own check (valid_ceiling), but the line that says why a floor is
not used (floor._gone) turned it into a float and raised OverflowError out of sysinfo and run."""

from __future__ import annotations

import json

import pytest
from clirun import run_cli

from ckptbench.system import floor as fl


def _plant_time(plant_floor, at) -> None:
    plant_floor()
    path = fl.cache_path()
    with open(path) as f:
        doc = json.load(f)
    doc["ceilings"]["copy"]["measured_at"] = at
    with open(path, "w") as f:
        f.write(json.dumps(doc))


@pytest.mark.parametrize("cmd", [("sysinfo",), ("run", "--repeat", "1", "--results", "")])
def test_a_measured_at_past_a_floats_range_is_not_measured_not_a_traceback(ckpt, plant_floor, cmd):
    _plant_time(plant_floor, 10 ** 400)
    r = run_cli(cmd[0], ckpt("safetensors", 1), *cmd[1:])
    assert r.rc == 0 and "Traceback" not in r.err, r.err
    assert "not measured" in r.out + r.err


def test_the_reason_skips_an_unbounded_time_and_keeps_the_others():
    from ckptbench.core import jsontext  # the reason's reading of a cached measured_at

    assert jsontext.number(10 ** 400) is None
    assert jsontext.number(True) is None
    assert jsontext.number(5) == 5.0


def test_floor_of_a_source_of_empty_files_names_it_and_what_to_do(tmp_path):
    d = tmp_path / "zeros"
    d.mkdir()
    (d / "model.safetensors").touch()
    (d / "config.json").touch()
    r = run_cli("floor", d)
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert len(errors) == 1 and str(d) in errors[0] and "point it at a checkpoint" in errors[0], r.err
