"""The loaders users pick instead of ckptbench, each run in a fresh process: `python bench/_loaders.py NAME DIR`.

The child imports its loader, pays the loader's first-use costs on a tiny file of its own (as ckptbench's warm-up
does, outside its RTO), then starts the clock, lists the shards from the index, and stops it when the state dict
holds owned CPU tensors with every byte in memory. It prints one JSON line: seconds, bytes, tensors, a checksum of
sampled values, the residency of the shards just before the clock started, and what it read from the disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Mapping

LOADERS = ("safetensors", "fastsafetensors", "runai")
INDEX = "model.safetensors.index.json"
SAMPLES = 8  # values sampled per tensor for the checksum


def shard_paths(directory: str) -> list[str]:
    """The shards the index names, in order; every *.safetensors file when there is no index."""
    index = os.path.join(directory, INDEX)
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    return [os.path.join(directory, n) for n in names]


def sample_positions(numel: int, k: int = SAMPLES) -> list[int]:
    """k element indices spread over [0, numel): the first, the last and evenly between (fewer when small)."""
    if numel <= 0:
        return []
    if numel <= k:
        return list(range(numel))
    return sorted({round(i * (numel - 1) / (k - 1)) for i in range(k)})


def tensor_record(name: str, t) -> bytes:
    """A tensor's name, dtype, shape and the raw bytes of its sampled values."""
    import torch

    flat = t.reshape(-1)
    idx = torch.tensor(sample_positions(flat.numel()), dtype=torch.long)
    picked = flat[idx].contiguous().view(torch.uint8).numpy().tobytes()
    return f"{name}|{t.dtype}|{tuple(t.shape)}|".encode() + picked


def checksum_of(records: Mapping[str, bytes]) -> str:
    """sha256 over the records in name order: two loaders that produced the same tensors give the same digest."""
    h = hashlib.sha256()
    for name in sorted(records):
        h.update(records[name])
    return h.hexdigest()


def checksum(state: Mapping) -> str:
    """The checksum of a state dict of tensors (sampled values, see tensor_record)."""
    return checksum_of({k: tensor_record(k, t) for k, t in state.items()})


# ---------------------------------------------------------------------------- the loaders


def _safetensors() -> Callable[[list[str]], dict]:
    """safetensors.torch.load_file per shard; its tensors map the file lazily, so each is cloned into owned
    memory (the clone reads every byte)."""
    from safetensors.torch import load_file

    def load(paths: list[str]) -> dict:
        state = {}
        for p in paths:
            state.update({k: v.clone() for k, v in load_file(p).items()})
        return state

    return load


def _fastsafetensors() -> Callable[[list[str]], dict]:
    """SafeTensorsFileLoader on the CPU with nogds=True (its own reader, O_DIRECT by default, into host buffers),
    all shards in one copy_files_to_device; its tensors share ownership of those buffers and outlive close()
    (documented in 0.5), so no copy is made."""
    from fastsafetensors import SafeTensorsFileLoader

    def load(paths: list[str]) -> dict:
        loader = SafeTensorsFileLoader(None, "cpu", nogds=True)
        try:
            loader.add_filenames({0: paths})
            fb = loader.copy_files_to_device()
            try:
                return {k: fb.get_tensor(k) for k in fb.key_to_rank_lidx}
            finally:
                fb.close()
        finally:
            loader.close()

    return load


def _runai() -> Callable[[list[str]], dict]:
    """Run:ai SafetensorsStreamer.stream_files over all shards, then get_tensors. With owned=True (the default
    since 0.17) every yielded tensor keeps its own buffer, so none is copied; older versions reused buffers."""
    from runai_model_streamer import SafetensorsStreamer

    def load(paths: list[str]) -> dict:
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(paths)
            return dict(streamer.get_tensors())

    return load


PREPARE = {"safetensors": _safetensors, "fastsafetensors": _fastsafetensors, "runai": _runai}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "safetensors", "fastsafetensors", "runai-model-streamer", "runai-model-streamer-s3"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def warm_up(load: Callable[[list[str]], dict]) -> float:
    """The loader's one-time costs (threads, native library set-up, torch's first operations) on a tiny file."""
    import torch
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ckptbench-warm-") as tmp:
        path = os.path.join(tmp, "warm.safetensors")
        save_file({"w": torch.arange(4096, dtype=torch.float32).to(torch.bfloat16)}, path)
        load([path])
    return time.perf_counter() - t0


def residency(paths: list[str]) -> float | None:
    """The shards' page-cache share (fastio's mincore), or None when fastio is not importable."""
    try:
        import fastio
    except ImportError:
        return None
    return fastio.residency(paths).fraction


def peak_rss() -> int:
    """The child's own peak (VmHWM since its exec): its ru_maxrss is the bench's, 5367 MiB for every peer in run 21,
    because exec records the memory map it replaces there. (ckptbench's probes.own_peak_rss, read here: a peer's
    process imports nothing of ckptbench.)"""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def run(name: str, directory: str) -> dict:
    t0 = time.perf_counter()
    import torch  # noqa: F401 - every loader builds torch tensors; its import is not the loader's cost

    load = PREPARE[name]()
    import_s = time.perf_counter() - t0
    warm_s = warm_up(load)
    res = residency(shard_paths(directory))
    inblock = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
    t0 = time.perf_counter()
    state = load(shard_paths(directory))
    seconds = time.perf_counter() - t0
    disk = (resource.getrusage(resource.RUSAGE_SELF).ru_inblock - inblock) * 512
    return {"loader": name, "seconds": seconds, "bytes": sum(t.numel() * t.element_size() for t in state.values()),
            "tensors": len(state), "checksum": checksum(state), "residency_before": res, "disk_read_bytes": disk,
            "import_s": import_s, "warmup_s": warm_s,
            "peak_rss_bytes": peak_rss(), "versions": versions()}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in LOADERS:
        print(f"usage: _loaders.py {{{','.join(LOADERS)}}} DIR", file=sys.stderr)
        return 2
    print(json.dumps(run(argv[0], argv[1])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
