"""A DCP checkpoint served from the fused read's whole-file buffers (restore/tiles.py reads by range where it can):
each chunk is loaded in place from the buffer (a view of its bytes) and copied into its owned tensor once; the state
is the same as from the files, owns its memory, and read-only buffers take the copying path to the same state."""

import os

import torch
import torch.distributed.checkpoint as dcp

from ckptbench.checkpoint.formats import dcp_format


def _saved(tmp_path):
    g = torch.Generator().manual_seed(3)
    state = {
        "model.w": torch.randn(64, 48, generator=g).to(torch.bfloat16),
        "model.b": torch.randn(48, generator=g),
        "optim.adam.exp_avg": torch.randn(7, 5, 3, generator=g, dtype=torch.float64),
        "ids": torch.arange(100, dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
    }
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path)))
    return state


def _buffers(tmp_path, kind):
    out = {}
    for name in os.listdir(tmp_path):
        with open(tmp_path / name, "rb") as f:
            out[name] = kind(f.read())
    return out


def _flat(st):
    """Every tensor of the state by the key it was saved under (a foreign layout keeps model tensors without their
    `model.` prefix, so both spellings are looked up)."""
    return {name: t for _, name, t in st.tensors()}


def _get(flat, key):
    return next((flat[k] for k in (key, key.removeprefix("model."), f"model.{key}") if k in flat), None)


def test_a_dcp_chunk_from_a_writable_buffer_lands_in_an_owned_tensor_equal_to_the_files(tmp_path, monkeypatch):
    saved = _saved(tmp_path)
    bufs = _buffers(tmp_path, bytearray)
    from_files = _flat(dcp_format.load_dir(str(tmp_path)))
    loaded, real = [], dcp_format.tensor_in_place
    monkeypatch.setattr(dcp_format, "tensor_in_place", lambda view, where: loaded.append(real(view, where)) or
                        loaded[-1])
    in_place = _flat(dcp_format.load_dir(str(tmp_path), bufs))
    assert len(loaded) == len(saved) and all(isinstance(t, torch.Tensor) for t in loaded)  # every chunk in place
    for key, want in saved.items():
        got = _get(in_place, key)
        assert got is not None, (key, sorted(in_place))
        assert got.dtype == want.dtype and torch.equal(got, want), key
        assert torch.equal(got, _get(from_files, key)), key
    for b in bufs.values():  # the restored state owns its bytes: the read buffers may go, or be overwritten
        b[:] = bytes(len(b))
    for key, want in saved.items():
        assert torch.equal(_get(in_place, key), want), f"{key} aliases the read buffer"


def test_read_only_buffers_take_the_copying_path_to_the_same_state(tmp_path):
    saved = _saved(tmp_path)
    got = _flat(dcp_format.load_dir(str(tmp_path), _buffers(tmp_path, bytes)))
    for key, want in saved.items():
        assert torch.equal(_get(got, key), want), key


def test_a_dcp_run_says_why_its_load_stage_costs_what_it_does(tmp_path):
    from clirun import run_cli

    assert run_cli("gen", "small", tmp_path / "c", "--format", "dcp", "--scale", "0.05").rc == 0
    notes = {}
    for how in ((), ("--read", "mmap")):  # by range (restore/tiles.py), and a read of whole files asked by name
        r = run_cli("run", tmp_path / "c", "--repeat", "1", "--results", tmp_path / "r.csv", *how)
        assert r.rc == 0, r.err
        notes[how] = [ln for ln in r.out.splitlines() if ln.strip().startswith("note (load):")]
    assert len(notes[()]) == 1 and "read by range, each into memory of its own that is its tensor" in notes[()][0]
    mmap = notes[("--read", "mmap")]
    assert len(mmap) == 1 and "each DCP chunk copied into a tensor of its own" in mmap[0], mmap
