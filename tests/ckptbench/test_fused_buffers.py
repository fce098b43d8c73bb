"""Fused loads build tensors from bytes already read: the files are not read a second time."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from ckptbench.checkpoint import manifest as mf
from ckptbench.restore import load as restore


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "dcp"])
def test_load_from_buffers_does_not_touch_the_shard_files(ckpt, fmt, tmp_path):
    src = ckpt(fmt, 2)
    reference = restore.load_state(src, fmt)
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    ext = restore.SHARD_EXT[fmt] + ((".metadata",) if fmt == "dcp" else ())
    buffers = {}
    for root, _, names in os.walk(copy):
        for n in names:
            if n.endswith(ext):
                path = os.path.join(root, n)
                with open(path, "rb") as f:
                    buffers[path] = bytearray(f.read())
                os.truncate(path, 0)  # a load that went back to the file would find nothing
    state = restore.load_state(str(copy), fmt, buffers=buffers)
    assert set(state.model) == set(reference.model) and state.model
    for name, t in reference.model.items():
        assert torch.equal(state.model[name], t), name
    for name, parts in reference.optim.items():
        for k, t in parts.items():
            assert torch.equal(state.optim[name][k], t), (name, k)


def _model_shard(src: str) -> str:
    man = mf.read(src)
    return os.path.join(src, next(e.path for e in man.files if e.kind == "model"))


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_buffers_are_not_copied(ckpt, fmt):
    """Tensors from a safetensors or torch.save buffer are views of it: writing the buffer shows through."""
    src = ckpt(fmt, 1)
    path = _model_shard(src)
    with open(path, "rb") as f:
        buf = bytearray(f.read())
    reference = restore.load_state(src, fmt, shards=[path])
    state = restore.load_state(src, fmt, buffers={path: buf}, shards=[path])
    assert set(state.model) == set(reference.model) and state.model
    for name, t in reference.model.items():
        assert torch.equal(state.model[name], t), name
    name, t = next((k, v) for k, v in state.model.items() if v.numel() > 4)
    before = t.flatten()[0].clone()
    addr = t.untyped_storage().data_ptr()
    base = (torch.frombuffer(buf, dtype=torch.uint8)).data_ptr()
    assert base <= addr < base + len(buf)
    buf[:] = bytes(len(buf))  # zero the buffer: a view now reads zeros
    assert t.flatten()[0].item() == 0 and before.item() != 0


def test_read_only_torch_buffers_still_load(ckpt):
    """bytes cannot back a tensor without a warning and a writable alias: they take the copying path."""
    src = ckpt("torch", 1)
    path = _model_shard(src)
    with open(path, "rb") as f:
        data = f.read()
    reference = restore.load_state(src, "torch", shards=[path])
    state = restore.load_state(src, "torch", buffers={path: data}, shards=[path])
    for name, t in reference.model.items():
        assert torch.equal(state.model[name], t), name
