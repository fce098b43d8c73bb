"""`ckptbench plan` and the profile arithmetic, checked against the profile TOML read here and a formula written here."""

from __future__ import annotations

import json
import os
import tomllib

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILE_DIR = os.path.join(REPO, "profiles", "checkpoints")
PROFILE_NAMES = sorted(n[:-5] for n in os.listdir(PROFILE_DIR) if n.endswith(".toml"))
SMALL_FILE_AVG = ((16 << 10) + (96 << 10)) // 2  # data-loader files are drawn uniformly from 16..96 KiB


def toml_of(name: str) -> dict:
    with open(os.path.join(PROFILE_DIR, f"{name}.toml"), "rb") as f:
        return tomllib.load(f)


def shape_of(doc: dict) -> dict:
    m = doc["model"]
    return {k: int(m[k]) for k in ("layers", "hidden", "heads", "vocab", "seq_len")}


def test_the_expected_profiles_exist():
    assert {"small", "medium", "large", "7b", "30b", "70b"} <= set(PROFILE_NAMES)


def test_plan_7b_interval_600_numbers(h):
    r = h.run_proc("plan", "7b", "--interval", "600", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    t = toml_of("7b")
    params = h.gpt_param_count(**shape_of(t))
    assert doc["params"] == params
    small = t["checkpoint"]["small_files"] * SMALL_FILE_AVG
    total = params * (2 + 3 * 4) + small  # bf16 weights; fp32 master, exp_avg, exp_avg_sq
    assert doc["total_bytes"] == total
    assert doc["bytes"]["weights"] == params * 2
    for part in ("optimizer_master", "optimizer_exp_avg", "optimizer_exp_avg_sq"):
        assert doc["bytes"][part] == params * 4
    assert doc["save"]["interval_s"] == 600
    assert doc["save"]["required_gbps"] == pytest.approx(total / 600 / 1e9, rel=1e-12)
    assert doc["world_size"] == t["checkpoint"]["world_size"] == 8
    assert doc["save"]["per_rank_gbps"] == pytest.approx(total / 600 / 1e9 / 8, rel=1e-12)
    assert 6.5e9 < params < 7.5e9  # a 7B-class model, as its name says


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_plan_params_and_bytes_for_every_profile(h, name):
    r = h.run_cli("plan", name, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    t = toml_of(name)
    shape = shape_of(t)
    assert doc["dims"] == shape
    params = h.gpt_param_count(**shape)
    assert doc["params"] == params
    wb = {"bfloat16": 2, "float16": 2, "float32": 4}[t["dtypes"]["weights"]]
    ob = {"bfloat16": 2, "float16": 2, "float32": 4}[t["dtypes"]["optimizer"]]
    assert doc["total_bytes"] == params * (wb + 3 * ob) + t["checkpoint"]["small_files"] * SMALL_FILE_AVG
    assert "save" not in doc  # no --interval, no bandwidth


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_param_formula_matches_the_model_that_restores(name):
    """The profile's count equals the parameters of the GPT module a checkpoint is restored into (meta device)."""
    import torch

    from ckptbench.checkpoint.model import GPT
    from ckptbench.checkpoint.profiles import ModelDims

    dims = ModelDims(**shape_of(toml_of(name)))
    with torch.device("meta"):
        model = GPT(dims)
    assert sum(p.numel() for p in model.parameters()) == dims.param_count


def test_plan_unknown_profile_one_line_listing_profiles(h, tmp_path):
    r = h.run_proc("plan", "nosuchprofile", "--interval", "600")
    assert r.rc == 2
    assert r.out == ""
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("ckptbench: error:")
    assert "nosuchprofile" in r.err and "Traceback" not in r.err
    for name in PROFILE_NAMES:
        assert name in r.err_lines[0]


@pytest.mark.parametrize("name, scale", [("7b", 0.25), ("small", 4.0), ("70b", 0.25), ("medium", 0.5)])
def test_plan_scale_resizes_by_about_the_factor(h, name, scale):
    base = json.loads(h.run_cli("plan", name, "--json").out)
    r = h.run_cli("plan", name, "--scale", str(scale), "--json")
    assert r.rc == 0, r.err
    scaled = json.loads(r.out)
    d = scaled["dims"]
    assert d["layers"] == base["dims"]["layers"] and d["heads"] == base["dims"]["heads"]
    assert d["hidden"] % d["heads"] == 0
    assert scaled["params"] == h.gpt_param_count(**d)  # the formula holds for the new shape
    model_bytes = scaled["total_bytes"] - scaled["bytes"]["small_files"]
    base_bytes = base["total_bytes"] - base["bytes"]["small_files"]
    assert model_bytes / base_bytes == pytest.approx(scale, rel=0.15)
    assert scaled["bytes"]["small_files"] == base["bytes"]["small_files"]


@pytest.mark.parametrize("scale", ["0", "-1"])
def test_plan_non_positive_scale_is_one_line(h, scale):
    r = h.run_cli("plan", "small", f"--scale={scale}")
    assert r.rc == 2 and r.out == ""
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("ckptbench: error:") and "--scale" in r.err
