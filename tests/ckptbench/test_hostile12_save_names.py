"""`save` of a checkpoint whose tensor names the format written cannot hold wrote a save it reported ok that no
reader loads: safetensors' header keeps its metadata under `__metadata__` (a tensor of that name replaced it) and
refuses a lone surrogate; a DCP key longer than the metadata reader takes made every restore refuse the .metadata as
crafted. Each is now one line before the first save, nothing written; the formats that hold the name still save it.
A torch.save file holding a strided 1-d view (w[::2]) failed load, run and verify with a traceback in the scan."""

from __future__ import annotations

import os

import torch
from clirun import assert_one_line_error, run_cli


def _source(tmp_path, tensors: dict) -> str:
    src = tmp_path / "src"
    src.mkdir()
    torch.save(tensors, src / "pytorch_model.bin")
    return str(src)


def _save(src: str, target, fmt: str):
    target.mkdir(exist_ok=True)
    return run_cli("save", src, str(target), "--format", fmt, "--count", "1", "--results", "", "--force")


def _refused(r, target, needle: str) -> None:
    assert r.rc == 2, r.err
    lines = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert len(lines) == 1 and needle in lines[0], r.err
    assert "Traceback" not in r.err
    assert os.listdir(target) == []  # nothing written, not even a staging folder


def test_a_tensor_named_metadata_is_refused_for_safetensors(tmp_path):
    src = _source(tmp_path, {"__metadata__": torch.ones(3), "w": torch.ones(3)})
    target = tmp_path / "out"
    _refused(_save(src, target, "safetensors"), target, "'__metadata__' is the name safetensors keeps its metadata")
    r = _save(src, tmp_path / "out_torch", "torch")
    assert r.rc == 0, r.err
    (step,) = os.listdir(tmp_path / "out_torch")
    assert run_cli("load", str(tmp_path / "out_torch" / step)).rc == 0


def test_a_lone_surrogate_name_is_refused_for_safetensors(tmp_path):
    src = _source(tmp_path, {"\ud800x": torch.ones(3), "w": torch.ones(3)})
    target = tmp_path / "out"
    _refused(_save(src, target, "safetensors"), target, "is not text (it holds a lone surrogate)")


def test_a_name_longer_than_a_dcp_key_is_refused_for_dcp(tmp_path):
    from ckptbench.checkpoint.formats.dcp_metadata import MAX_NAME

    src = _source(tmp_path, {"x" * (MAX_NAME + 1): torch.ones(3), "w": torch.ones(3)})
    target = tmp_path / "out"
    _refused(_save(src, target, "dcp"), target, f"characters as a DCP key, over the {MAX_NAME}")
    r = _save(src, tmp_path / "out_st", "safetensors")  # safetensors holds it, and ckptbench reads it back
    assert r.rc == 0, r.err
    (step,) = os.listdir(tmp_path / "out_st")
    assert run_cli("load", str(tmp_path / "out_st" / step)).rc == 0


def test_a_strided_view_in_a_torch_file_is_scanned(tmp_path):
    w = torch.arange(10, dtype=torch.float32)
    w[4] = float("nan")
    src = _source(tmp_path, {"v": w[::2], "t": torch.ones(4, 4).t()})  # v holds the NaN at its index 2
    for cmd in (("load",), ("run", "--repeat", "1", "--results", "")):
        r = run_cli(*cmd[:1], src, *cmd[1:])
        assert "Traceback" not in r.err and "stride" not in r.err, r.err
        assert r.rc != 0 and "v: 1 non-finite value(s)" in r.out + r.err, r.out + r.err
    (tmp_path / "ok").mkdir()
    assert run_cli("load", _source(tmp_path / "ok", {"v": torch.ones(10)[::2]})).rc == 0
