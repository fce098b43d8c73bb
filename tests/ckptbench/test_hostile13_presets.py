"""A storage preset is a .toml path the user names, often copied from elsewhere. TOML's integers have no bound in
Python's reader: a ceiling_gbps or min_concurrency of 10**400 raised OverflowError out of `plan` (math.isfinite of
an int past a float) where any other out-of-range figure is one line naming the file and the field."""

from __future__ import annotations

import os

import pytest
from clirun import run_cli

EFS = os.path.join(os.path.dirname(__file__), "..", "..", "profiles", "storage", "efs.toml")


@pytest.mark.parametrize("key", ["ceiling_gbps", "min_concurrency", "aggregate_gbps"])
def test_a_figure_past_a_floats_range_is_one_line_naming_it(tmp_path, key):
    lines = open(EFS).read().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(f"{key} ="))
    lines[at] = f"{key} = 1{'0' * 400}"
    preset = tmp_path / "huge.toml"
    preset.write_text("\n".join(lines) + "\n")
    r = run_cli("plan", "small", "--nodes", "2", "--storage", preset)
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert len(errors) == 1 and f"{key} must be a positive" in errors[0] and "huge.toml" in errors[0], r.err
    assert len(errors[0]) < 400, errors[0]  # the number is cut, not printed whole


def test_the_preset_as_shipped_still_plans():
    assert run_cli("plan", "small", "--nodes", "2", "--storage", EFS).rc == 0


def test_a_checkpoint_profiles_count_past_its_range_is_cut_in_its_line(tmp_path):
    """A checkpoint profile's whole-number field of 400 digits was printed whole in its one line (the storage preset's
    figures were cut already)."""
    small = os.path.join(os.path.dirname(EFS), "..", "checkpoints", "small.toml")
    lines = open(small).read().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("layers ="))
    lines[at] = f"layers = 1{'0' * 400}"
    profile = tmp_path / "huge.toml"
    profile.write_text("\n".join(lines) + "\n")
    r = run_cli("plan", profile, "--nodes", "2", "--storage", EFS)
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert len(errors) == 1 and "layers must be a whole number" in errors[0] and "huge.toml" in errors[0], r.err
    assert len(errors[0]) < 300, errors[0]
