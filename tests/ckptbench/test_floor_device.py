"""The GPU's link in the floor: host-to-device figures (pinned, pageable) where the driver lists a GPU, the model's
device term for a run that moves its state to one, and the box key that tells a box with a GPU from one without.
The measurement itself runs where a GPU is lent (bench/device_checks.py); here, what this box can show."""

from __future__ import annotations

import time

import pytest

from ckptbench.system import ceilings
from ckptbench.system import floor as fl
from floorhelp import fixed_floor as _floor

GB = 10**9


def test_the_device_term_is_the_state_over_the_pinned_link_and_can_bind():
    f = _floor(storage=2.0, populate_4k=4.0, h2d_pinned=1.0, h2d_pageable=0.5)
    m = fl.model(f, bytes_read=8 * GB, device_bytes=8 * GB)
    assert m["times_s"]["host-to-device"] == pytest.approx(8.0) and m["binding"] == "host-to-device"
    assert m["floor_s"] == pytest.approx(8.0) and m["gbps"] == 1.0
    fast_link = _floor(storage=2.0, populate_4k=4.0, h2d_pinned=50.0)
    m = fl.model(fast_link, bytes_read=8 * GB, device_bytes=8 * GB)
    assert m["binding"] == "storage" and m["times_s"]["host-to-device"] == pytest.approx(0.16)
    assert "host-to-device" not in fl.model(f, bytes_read=8 * GB)["times_s"]  # --device cpu: nothing crosses


def test_a_run_on_a_gpu_without_a_link_figure_says_its_floor_leaves_the_device_out():
    f = _floor(storage=2.0, populate_4k=4.0)
    doc = fl.restore_fields(f, bytes_read=8 * GB, measured_s=5.0, hash_alg="none", device_bytes=8 * GB)
    assert "no host-to-device figure" in doc["floor_note"] and "host-to-device" not in doc["floor_times_s"]
    cpu = fl.restore_fields(f, bytes_read=8 * GB, measured_s=5.0, hash_alg="none")
    assert "host-to-device" not in cpu["floor_note"]


def _driver_tree(root, models: list[str]) -> None:
    for i, model in enumerate(models):
        d = root / "proc" / "driver" / "nvidia" / "gpus" / f"0000:0{i}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\nGPU UUID: \t GPU-x\nBus Type: \t PCIe\n")


def test_the_box_key_names_the_gpus_the_driver_lists(tmp_path):
    assert ceilings.gpu_models(str(tmp_path)) == []  # no driver: no GPU
    _driver_tree(tmp_path, ["NVIDIA H200", "NVIDIA H200\u202e"])
    assert ceilings.gpu_models(str(tmp_path)) == ["NVIDIA H200", "NVIDIA H200"]  # printable: no bidi override
    assert fl.box_key()["gpus"] == ceilings.gpu_models("/")


def test_no_cuda_here_measures_no_link_and_keeps_no_such_figure(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():  # a GPU box measures it for real: bench/device_checks.py checks the figures
        got = ceilings.device_ceilings(size=8 << 20, repeats=1)
        assert set(got) == set(fl.DEVICE_FIGURES) and all(c.gbps > 0 for c in got.values())
    else:
        assert ceilings.device_ceilings(size=8 << 20, repeats=1) == {}
    # a cache that says this box has a link figure while the box has no GPU: another box's, never used
    cache = str(tmp_path / "floor.json")
    now = time.time()
    entry = {"gbps": 5.0, "min_gbps": 5.0, "max_gbps": 5.0, "method": "planted", "measured_at": now}
    box = fl.box_key() | {"gpus": ["NVIDIA planted"]}
    fl.write_cache(cache, {"schema": fl.SCHEMA, "box": box, "storage": {},
                           "ceilings": {k: entry for k in (*fl.BOX_FIGURES, *fl.DEVICE_FIGURES)}})
    if not fl.box_key()["gpus"]:
        assert fl.cached(path=cache) is None
    same = fl.box_key()
    fl.write_cache(cache, {"schema": fl.SCHEMA, "box": same, "storage": {},
                           "ceilings": {k: entry for k in (*fl.BOX_FIGURES, *fl.DEVICE_FIGURES, "h2d_bogus")}})
    kept = fl.cached(path=cache).ceilings
    assert set(fl.DEVICE_FIGURES) <= set(kept) and "h2d_bogus" not in kept
