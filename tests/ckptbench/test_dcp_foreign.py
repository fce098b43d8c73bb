"""DCP checkpoints nobody here wrote: plain `dcp.save` of a flat dict, torchtitan's layout with byte entries,
and a save by two gloo ranks with sharded DTensors. Each restores value by value, or fails with a true line."""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptbench.checkpoint.formats import FormatError, RawBytes
from ckptbench.checkpoint.formats import dcp_format
from ckptbench.checkpoint.formats.dcp_metadata import _MetadataUnpickler


class Planted:
    """A pickle that runs a command when loaded with plain pickle (as DCP's default planner loads byte entries)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _save(state: dict, directory) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(directory), no_dist=True)


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    d = tmp_path_factory.mktemp("flat")
    g = torch.Generator().manual_seed(1)
    state = {"embed.weight": torch.randn(32, 8, generator=g), "head.bias": torch.randn(8, generator=g).bfloat16(),
             "counts": torch.arange(5)}
    _save(state, d)
    return d, state


@pytest.fixture(scope="module")
def titan(tmp_path_factory):
    """torchtitan's top level: model, optimizer (flattened state and param groups), lr_scheduler, dataloader
    (bytes), train_state (a BytesIO holding a torch.save), and one entry whose pickle runs a command."""
    d = tmp_path_factory.mktemp("titan")
    marker = d.parent / f"{d.name}-PLANTED"
    g = torch.Generator().manual_seed(2)
    model = {"tok_embeddings.weight": torch.randn(64, 16, generator=g),
             "layers.0.attention.wq.weight": torch.randn(16, 16, generator=g).bfloat16()}
    optim = {"state": {n: {"exp_avg": torch.randn(t.shape, generator=g), "exp_avg_sq": torch.rand(t.shape, generator=g),
                           "step": torch.tensor(7.0)} for n, t in model.items()},
             "param_groups": [{"lr": 3e-4, "betas": [0.9, 0.95], "params": list(model)}]}
    train_state = io.BytesIO()
    torch.save({"step": 7, "losses": [2.5, 2.25]}, train_state)
    state = {"model": model, "optimizer": optim, "lr_scheduler": {"last_epoch": 7, "base_lrs": [3e-4]},
             "dataloader": {"rank_0": pickle.dumps({"sample": 1234})}, "train_state": train_state,
             "planted": Planted(str(marker))}
    _save(state, d)
    assert not marker.exists()  # saving pickles the object; only loading it would run the command
    return d, state, marker


_GLOO_WRITER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def main(rank, world, out, port):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        g = torch.Generator().manual_seed(3)
        full = {"w": torch.randn(10, 6, generator=g), "v": torch.randn(4, 9, generator=g).bfloat16(),
                "r": torch.randn(5, generator=g)}
        sd = {"model": {"w": distribute_tensor(full["w"], mesh, [Shard(0)]),
                        "v": distribute_tensor(full["v"], mesh, [Shard(1)]),
                        "r": distribute_tensor(full["r"], mesh, [Replicate()])},
              "optimizer": {"state": {"w": {"exp_avg": distribute_tensor(full["w"] * 2, mesh, [Shard(0)])}}}}
        dcp.save(sd, checkpoint_id=out)
        if rank == 0:
            torch.save(full, out + "-reference.pt")
        dist.destroy_process_group()

    if __name__ == "__main__":
        import torch.multiprocessing as mp
        mp.spawn(main, args=(2, sys.argv[1], int(sys.argv[2])), nprocs=2)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    script = root / "writer.py"
    script.write_text(_GLOO_WRITER)
    d = root / "ckpt"
    proc = subprocess.run([sys.executable, str(script), str(d), str(_free_port())], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return d, torch.load(str(d) + "-reference.pt", weights_only=True)


def _run_json(h, d, *extra) -> dict:
    r = h.run_cli("run", d, "--repeat", "1", "--json", *extra)
    assert r.rc == 0, r.err
    return json.loads(r.out)


def test_flat_dcp_restores_every_tensor_at_its_key(h, flat):
    d, saved = flat
    state = dcp_format.load_dir(str(d))
    assert set(state.model) == set(saved)
    for k, t in saved.items():
        assert state.model[k].dtype == t.dtype and torch.equal(state.model[k], t)


@pytest.mark.parametrize("mode", ["fused", "staged"])
def test_flat_dcp_runs_with_a_structural_check(h, flat, mode):
    d, _ = flat
    doc = _run_json(h, d, "--mode", mode)
    assert doc["status"] == "unverified" and doc["format"] == "dcp"
    assert doc["check"] == "structural"
    assert "no model step" in doc["notes"]["check"]


def test_torchtitan_layout_restores_with_its_nesting_and_never_runs_a_byte_entry(flat, titan):
    d, saved, marker = titan
    state = dcp_format.load_dir(str(d))
    assert not marker.exists()
    for k, t in saved["model"].items():
        assert torch.equal(state.model[k], t)
    for name, parts in saved["optimizer"]["state"].items():
        for part, t in parts.items():
            assert torch.equal(state.extra[f"optimizer.state.{name}.{part}"], t)
    assert isinstance(state.extra["planted"], RawBytes)  # kept as saved, not unpickled
    assert b"system" in state.extra["planted"]
    assert state.extra["dataloader.rank_0"] == saved["dataloader"]["rank_0"]
    assert torch.load(io.BytesIO(state.extra["train_state"]), weights_only=True) == {"step": 7, "losses": [2.5, 2.25]}
    tree = state.tree
    assert tree["optimizer"]["param_groups"][0]["lr"] == pytest.approx(3e-4)
    assert tree["optimizer"]["param_groups"][0]["params"] == list(saved["model"])
    assert tree["lr_scheduler"] == {"last_epoch": 7, "base_lrs": [3e-4]}
    assert torch.equal(tree["model"]["tok_embeddings.weight"], saved["model"]["tok_embeddings.weight"])


def test_torchtitan_layout_runs_end_to_end_without_running_the_planted_pickle(h, titan):
    d, _, marker = titan
    for mode in ("fused", "staged"):
        doc = _run_json(h, d, "--mode", mode)
        assert doc["status"] == "unverified"
    assert not marker.exists()


def test_two_rank_sharded_save_is_reassembled(h, sharded):
    d, full = sharded
    state = dcp_format.load_dir(str(d))
    assert sorted(p.name for p in d.iterdir() if p.suffix == ".distcp") == ["__0_0.distcp", "__1_0.distcp"]
    for k, t in full.items():
        assert state.model[k].shape == t.shape and torch.equal(state.model[k], t)
    assert torch.equal(state.extra["optimizer.state.w.exp_avg"], full["w"] * 2)
    doc = _run_json(h, d, "--mode", "fused")
    assert doc["status"] == "unverified" and doc["files"] == 3


def test_inspect_describes_a_sharded_save(h, sharded):
    d, full = sharded
    r = h.run_cli("inspect", d, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["format"] == "dcp" and doc["layout"]["ranks"] == 2 and doc["layout"]["shards"] == 2
    model_bytes = sum(t.numel() * t.element_size() for t in full.values())
    assert doc["groups"]["model"]["bytes"] == model_bytes
    assert doc["groups"]["optimizer"]["bytes"] == full["w"].numel() * 4
    assert doc["read_plan"]["files"] == 3 and doc["read_plan"]["amplification"] > 1
    assert "no model step" in doc["check"]


def _first_chunk(d, fqn: str):
    with open(d / ".metadata", "rb") as f:
        meta = _MetadataUnpickler(f).load()
    for key, info in meta.storage_data.items():
        if key.fqn == fqn:
            return meta, info
    raise AssertionError(fqn)


def test_a_damaged_chunk_names_its_key_and_file(h, flat, tmp_path):
    d = Path(h.copy_ckpt(flat[0], tmp_path / "c"))
    _, info = _first_chunk(d, "embed.weight")
    path = d / str(info.relative_path)
    data = bytearray(path.read_bytes())
    data[info.offset:info.offset + info.length] = b"\x00" * info.length  # the zip of that chunk, gone
    path.write_bytes(bytes(data))
    # the prescan's line (zeros are no torch.save file), said once: not nested inside "not a readable tensor (…)"
    with pytest.raises(FormatError, match=r"entry 'embed.weight' at \d+\+\d+: not a torch.save file \(.*\); "
                                          r"the shard is corrupt or truncated$"):
        dcp_format.load_dir(str(d))
    r = h.run_cli("run", d, "--repeat", "1")
    assert r.rc != 0 and len(r.err_lines) == 1 and "embed.weight" in r.err and "Traceback" not in r.err


def test_a_missing_shard_is_named(h, sharded, tmp_path):
    d = Path(h.copy_ckpt(sharded[0], tmp_path / "c"))
    os.remove(d / "__1_0.distcp")
    with pytest.raises(Exception, match=r"__1_0\.distcp.*missing"):
        dcp_format.load_dir(str(d))


def test_overlapping_chunks_are_refused(h, sharded, tmp_path):
    """Two chunks that overlap while their sizes add up to the tensor's would leave a region never written."""
    d = Path(h.copy_ckpt(sharded[0], tmp_path / "c"))
    meta, _ = _first_chunk(d, "model.w")
    chunks = meta.state_dict_metadata["model.w"].chunks
    assert len(chunks) == 2
    moved = type(chunks[1])(offsets=torch.Size([3, 0]), sizes=chunks[1].sizes)  # rows 3..7 instead of 5..9
    old = chunks[1].offsets
    chunks[1] = moved
    for key in list(meta.storage_data):
        if key.fqn == "model.w" and tuple(key.offset) == tuple(old):
            info = meta.storage_data.pop(key)
            meta.storage_data[type(key)("model.w", moved.offsets)] = info
    with open(d / ".metadata", "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(FormatError, match="overlap"):
        dcp_format.load_dir(str(d))
