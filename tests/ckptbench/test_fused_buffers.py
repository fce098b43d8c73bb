"""Fused loads build tensors from bytes already read: the files are not read a second time."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from ckptbench import manifest as mf
from ckptbench import restore


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


def test_safetensors_buffers_are_not_copied(ckpt):
    """Tensors from a safetensors buffer are views of it: writing the buffer shows through."""
    src = ckpt("safetensors", 1)
    man = mf.read(src)
    shard = next(e.path for e in man.files if e.kind == "model")
    path = os.path.join(src, shard)
    with open(path, "rb") as f:
        buf = bytearray(f.read())
    state = restore.load_state(src, "safetensors", buffers={path: buf}, shards=[path])
    name, t = next((k, v) for k, v in state.model.items() if v.numel() > 4)
    before = t.flatten()[0].clone()
    addr = t.untyped_storage().data_ptr()
    base = (torch.frombuffer(buf, dtype=torch.uint8)).data_ptr()
    assert base <= addr < base + len(buf)
    buf[:] = bytes(len(buf))  # zero the buffer: a view now reads zeros
    assert t.flatten()[0].item() == 0 and before.item() != 0


def test_torch_buffers_are_not_copied(ckpt):
    """torch.save shards in writable read buffers load in place: the tensors are views of the buffer."""
    src = ckpt("torch", 1)
    man = mf.read(src)
    shard = next(e.path for e in man.files if e.kind == "model")
    path = os.path.join(src, shard)
    with open(path, "rb") as f:
        buf = bytearray(f.read())
    reference = restore.load_state(src, "torch", shards=[path])
    state = restore.load_state(src, "torch", buffers={path: buf}, shards=[path])
    assert set(state.model) == set(reference.model) and state.model
    for name, t in reference.model.items():
        assert torch.equal(state.model[name], t), name
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    name, t = next((k, v) for k, v in state.model.items() if v.numel() > 4)
    assert base <= t.untyped_storage().data_ptr() < base + len(buf)
    before = t.flatten()[0].clone()
    buf[:] = bytes(len(buf))  # zero the buffer: a view now reads zeros
    assert t.flatten()[0].item() == 0 and before.item() != 0


def test_read_only_torch_buffers_still_load(ckpt):
    """bytes cannot back a tensor without a warning and a writable alias: they take the copying path."""
    src = ckpt("torch", 1)
    man = mf.read(src)
    shard = next(e.path for e in man.files if e.kind == "model")
    path = os.path.join(src, shard)
    with open(path, "rb") as f:
        data = f.read()
    reference = restore.load_state(src, "torch", shards=[path])
    state = restore.load_state(src, "torch", buffers={path: data}, shards=[path])
    for name, t in reference.model.items():
        assert torch.equal(state.model[name], t), name
