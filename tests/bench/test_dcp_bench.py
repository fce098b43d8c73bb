"""The DCP benchmark's contenders on a checkpoint written by dcp.save: torch's loader in a fresh process restores
every tensor the metadata declares, and one round of the benchmark reports both loaders and the target."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import _harness
import dcp_bench


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp") / "ck"
    dcp_bench.write_checkpoint(str(d), 200 << 20)
    return d


def test_the_checkpoint_is_torchs_own_and_written_once(written):
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(written)).read_metadata()
    keys = set(meta.state_dict_metadata)
    assert "step" in keys and any(k.startswith("model.layers.") for k in keys)
    assert any(k.endswith(".exp_avg_sq") for k in keys)
    before = (written / ".metadata").stat().st_mtime_ns
    dcp_bench.write_checkpoint(str(written), 200 << 20)  # reused while its .metadata is there
    assert (written / ".metadata").stat().st_mtime_ns == before


def test_torchs_loader_restores_every_declared_byte(written):
    p = subprocess.run([sys.executable, dcp_bench.__file__, "--child", str(written)], capture_output=True, text=True,
                       env=_harness.child_env(), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(written)).read_metadata()
    want = sum(m.size.numel() * m.properties.dtype.itemsize for m in meta.state_dict_metadata.values()
               if isinstance(m, TensorStorageMetadata))
    assert doc["bytes"] == want and doc["seconds"] > 0


def test_one_round_reports_both_loaders_and_the_target(written, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_harness, "OUT_DIR", str(tmp_path))
    monkeypatch.setattr(dcp_bench, "OUT_DIR", str(tmp_path))
    assert dcp_bench.main(["--dir", str(written), "--repeat", "1", "--settle", "0"]) == 0
    out = capsys.readouterr().out
    for condition in ("cold", "hot"):
        for loader in dcp_bench.LOADERS:
            assert f"| {condition} | {loader} |" in out, out
        assert f"- target {condition}: torch's dcp.load / ckptbench >= 1.0:" in out
    assert list(tmp_path.glob("dcp_bench-*.json"))
