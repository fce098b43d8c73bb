"""A foreign safetensors checkpoint for the peers benchmark: the Hugging Face layout (shards + index), no ckptbench
manifest, bf16 MLP weights of seeded random values; generated once and reused while its index says it matches."""

from __future__ import annotations

import json
import os

import _loaders
from _harness import log

GiB = 1 << 30
SEED = 20261201
DIMS = (4096, 14336)  # hidden, intermediate: an MLP layer of an 8B-class model
SHARD = 1 * GiB


def layout(total: int, dims: tuple[int, int] = DIMS, shard: int = SHARD) -> dict:
    """Layers of (gate, up, down, two norms) filling about `total` bytes, grouped into shards of at most `shard`.
    Dims halve until a layer is at most a quarter of the total, so a small checkpoint still has several files."""
    hidden, inter = dims
    while hidden > 256 and 3 * hidden * inter * 2 > total / 4:
        hidden, inter = hidden // 2, inter // 2
    layer = 3 * hidden * inter * 2 + 2 * hidden * 2
    layers = max(1, round(total / layer))
    per_shard = max(1, min(shard, max(layer, total // 4)) // layer)
    shards = [list(range(i, min(i + per_shard, layers))) for i in range(0, layers, per_shard)]
    return {"hidden": hidden, "intermediate": inter, "layers": layers, "shards": shards, "seed": SEED}


def layer_tensors(spec: dict, layer: int) -> dict:
    """One layer's bf16 tensors: seeded normal values (finite, never all zeros)."""
    import torch

    h, i = spec["hidden"], spec["intermediate"]
    g = torch.Generator().manual_seed(spec["seed"] * 1000 + layer)
    p = f"model.layers.{layer}."
    shapes = {p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i)}
    out = {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
    for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        out[p + norm] = (1 + torch.randn(h, generator=g) * 0.01).to(torch.bfloat16)
    return out


def generate(directory: str, spec: dict) -> None:
    """Shards in the Hugging Face layout plus the index; the index's metadata carries the spec, the checksum of
    the tensors (as _loaders computes it) and each shard's crc32c. Written into a sibling, then renamed."""
    import fastio
    from safetensors.torch import save_file

    tmp = f"{directory}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    n = len(spec["shards"])
    weight_map, records, nbytes = {}, {}, 0
    for s, layers in enumerate(spec["shards"]):
        name = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
        tensors = {k: v for layer in layers for k, v in layer_tensors(spec, layer).items()}
        save_file(tensors, os.path.join(tmp, name), metadata={"format": "pt"})
        for k, t in tensors.items():
            weight_map[k] = name
            records[k] = _loaders.tensor_record(k, t)
            nbytes += t.numel() * t.element_size()
        log(f"  wrote {name} ({len(tensors)} tensors)")
    shards = sorted(set(weight_map.values()))
    r = fastio.read_files([os.path.join(tmp, f) for f in shards], hash="crc32c")
    crc = {os.path.basename(f.path): f.digest for f in r.files}
    meta = {"total_size": nbytes, "ckptbench_peers": {"spec": spec, "checksum": _loaders.checksum_of(records),
                                                      "tensors": len(records), "crc32c": crc}}
    with open(os.path.join(tmp, _loaders.INDEX), "w") as f:
        json.dump({"metadata": meta, "weight_map": weight_map}, f, indent=2)
    os.rename(tmp, directory)


def ensure_checkpoint(directory: str, spec: dict) -> tuple[dict | None, str]:
    """The index metadata of the checkpoint in `directory`, generated once; or None and why it cannot be used."""
    index = os.path.join(directory, _loaders.INDEX)
    if os.path.exists(os.path.join(directory, "ckptbench.json")):
        return None, f"peers_bench: {directory} has a ckptbench manifest; the peers need a foreign checkpoint"
    if os.path.exists(index):
        with open(index) as f:
            meta = json.load(f).get("metadata", {})
        if meta.get("ckptbench_peers", {}).get("spec") == spec:
            log(f"reusing the checkpoint in {directory}")
            return meta, ""
        return None, f"peers_bench: {directory} holds another checkpoint; pass another --dir or remove it"
    if os.path.isdir(directory) and os.listdir(directory):
        return None, f"peers_bench: {directory} is not empty and has no index; pass another --dir or remove it"
    if os.path.isdir(directory):
        os.rmdir(directory)
    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    log(f"generating {spec['layers']} layers (hidden {spec['hidden']}, intermediate {spec['intermediate']}) in "
        f"{len(spec['shards'])} shard(s) into {directory}; once, reused afterwards")
    generate(directory, spec)
    return ensure_checkpoint(directory, spec)
