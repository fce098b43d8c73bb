"""Shared fixtures for the checkpoint tests: sample checkpoints generated once per session, and helpers that
check them without going through the code under test (crc32c/hashlib, safetensors and torch read directly)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from types import SimpleNamespace

import crc32c
import pytest

SCALE = "0.02"  # the small profile at this scale: about 0.36 M parameters, about 5.5 MiB per checkpoint
MANIFEST = "ckptbench.json"
FORMATS = ("safetensors", "torch", "dcp")


from clirun import run_cli, run_proc  # noqa: E402  (shared with the test modules)


def crc32c_hex(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


def files_under(root) -> dict[str, bytes]:
    """Every regular file under root, relative "/"-separated path -> bytes."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            full = os.path.join(dirpath, n)
            out[os.path.relpath(full, root).replace(os.sep, "/")] = open(full, "rb").read()
    return out


def listing(root) -> list[str]:
    """Every entry (files and folders) under root, relative; [] when root is absent."""
    out = []
    for dirpath, dirs, names in os.walk(root):
        for n in dirs + names:
            out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(out)


def snapshot(root) -> dict[str, tuple[int, int, str]]:
    """rel path -> (size, mtime_ns, sha256) for every file under root."""
    out = {}
    for rel in files_under(root):
        full = os.path.join(root, rel)
        st = os.stat(full)
        out[rel] = (st.st_size, st.st_mtime_ns, hashlib.sha256(open(full, "rb").read()).hexdigest())
    return out


def read_manifest(root) -> dict:
    with open(os.path.join(root, MANIFEST)) as f:
        return json.load(f)


def write_manifest(root, doc: dict) -> None:
    with open(os.path.join(root, MANIFEST), "w") as f:
        json.dump(doc, f, indent=1)


def refresh_manifest_entry(root, rel: str) -> None:
    """After a deliberate edit of a file: its manifest size and crc32c made true again (computed here)."""
    doc = read_manifest(root)
    data = open(os.path.join(root, rel), "rb").read()
    assert doc["hash"] == "crc32c"
    hit = [e for e in doc["files"] if e["path"] == rel]
    assert len(hit) == 1
    hit[0]["bytes"], hit[0]["digest"] = len(data), crc32c_hex(data)
    write_manifest(root, doc)


def copy_ckpt(src, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def _tensors_in(obj, prefix: str, out: dict) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _tensors_in(v, f"{prefix}.{k}" if prefix else str(k), out)


def read_tensors(root, fmt: str, tmp_dir) -> tuple[dict, dict]:
    """(model tensors, optimizer tensors) read straight from the files with safetensors / torch, not ckptbench."""
    import torch
    from safetensors.torch import load_file

    model, optim = {}, {}
    names = sorted(os.listdir(root))
    if fmt == "safetensors":
        for n in names:
            if n.endswith(".safetensors"):
                tensors = load_file(os.path.join(root, n))
                dest = model if n.startswith("model-") else optim
                for k, t in tensors.items():
                    assert k not in dest, f"{k} appears in two shards"
                    dest[k] = t
    elif fmt == "torch":
        for n in names:
            if n.endswith(".pt"):
                obj = torch.load(os.path.join(root, n), weights_only=True, map_location="cpu")
                flat: dict = {}
                _tensors_in(obj, "", flat)
                dest = model if n.startswith("model_rank") else optim
                for k, t in flat.items():
                    assert k not in dest, f"{k} appears in two shards"
                    dest[k] = t
    elif fmt == "dcp":
        import warnings

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        out_pt = os.path.join(str(tmp_dir), f"dcp-{abs(hash(str(root)))}.pt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp_to_torch_save(str(root), out_pt)
        sd = torch.load(out_pt, weights_only=True)
        os.unlink(out_pt)
        _tensors_in(sd["model"], "", model)
        _tensors_in(sd["optim"], "", optim)
        _tensors_in({"step": sd["step"]}, "", optim)
    else:
        raise AssertionError(fmt)
    return model, optim


def dcp_saved(directory, state: dict) -> tuple[str, object]:
    """A DCP checkpoint torch writes, and its metadata as torch pickled it (unpickled here: the test's own file)."""
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(directory), no_dist=True)
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        return str(directory), pickle.load(f)


def gpt_param_count(layers: int, hidden: int, heads: int, vocab: int, seq_len: int) -> int:
    """Written out from the GPT shape: token and position embeddings, L blocks, final LayerNorm, untied head."""
    h = hidden
    ln = 2 * h  # weight + bias
    attn = (h * 3 * h + 3 * h) + (h * h + h)  # qkv, proj
    mlp = (h * 4 * h + 4 * h) + (4 * h * h + h)  # fc, proj
    block = ln + attn + ln + mlp
    return vocab * h + seq_len * h + layers * block + ln + h * vocab


@pytest.fixture(scope="session")
def h():
    """The helpers, as one namespace (a conftest is not imported by test modules)."""
    return SimpleNamespace(
        run_cli=run_cli, run_proc=run_proc, crc32c_hex=crc32c_hex, files_under=files_under, listing=listing,
        snapshot=snapshot, read_manifest=read_manifest, write_manifest=write_manifest,
        refresh_manifest_entry=refresh_manifest_entry, copy_ckpt=copy_ckpt, read_tensors=read_tensors,
        gpt_param_count=gpt_param_count, dcp_saved=dcp_saved, SCALE=SCALE, FORMATS=FORMATS, MANIFEST=MANIFEST,
    )


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """ckpt(fmt, ranks, seed=0, digest="crc32c") -> path of a generated checkpoint, made once per session.

    Tests must treat these as read-only: copy one before changing it."""
    root = tmp_path_factory.mktemp("ckpts")
    made: dict[tuple, str] = {}

    def make(fmt: str, ranks: int, seed: int = 0, digest: str = "crc32c") -> str:
        key = (fmt, ranks, seed, digest)
        if key not in made:
            target = root / f"{fmt}-r{ranks}-s{seed}-{digest}"
            r = run_cli("gen", "small", target, "--scale", SCALE, "--format", fmt, "--ranks", str(ranks),
                        "--seed", str(seed), "--digest", digest)
            assert r.rc == 0, r.err
            made[key] = str(target)
        return made[key]

    return make


@pytest.fixture
def plant_floor():
    """Writes this box's floor cache (in the test's own XDG_CACHE_HOME, see tests/conftest.py) with fixed rates:
    every box ceiling at `gbps`, and `source`'s storage figure at `storage_gbps` when given (a full sample, so the
    model uses it). Returns the Floor as the cache now holds it."""
    import time

    import fastio

    from ckptbench.sources import open_source
    from ckptbench.system import floor as fl

    def plant(gbps: float = 4.0, source=None, storage_gbps: float | None = None) -> fl.Floor:
        now = time.time()
        keys = ("populate_4k", "populate_thp", "copy", "scan", *(f"hash_{a}" for a in fastio.HASHES if a != "none"))
        f = fl.Floor(fl.box_key(), {k: fl.Ceiling(gbps, gbps, gbps, "planted by the test", now) for k in keys})
        if source is not None and storage_gbps is not None:
            f.mount = fl.mount_key(open_source(str(source)).describe())
            f.storage = fl.Ceiling(storage_gbps, storage_gbps, storage_gbps, "planted by the test", now,
                                   fl.STORAGE_SAMPLE)
        fl._save(fl.cache_path(), f, {})
        return fl.cached(f.mount)

    return plant
