"""`plan`: the arithmetic of a checkpoint shape — sizes by part, files, save bandwidth, restore memory."""

from __future__ import annotations

from ckptbench.profiles import DTYPE_BYTES, Profile

SMALL_FILE_AVG = 56 << 10  # the generator's data-loader files average 56 KiB


def plan(profile: Profile, interval_s: float | None = None) -> dict:
    p = profile.dims.param_count
    obytes = DTYPE_BYTES[profile.optimizer_dtype]
    parts = {
        "weights": profile.weights_bytes,
        "optimizer_master": p * obytes,
        "optimizer_exp_avg": p * obytes,
        "optimizer_exp_avg_sq": p * obytes,
        "small_files": profile.small_files * SMALL_FILE_AVG,
    }
    total = sum(parts.values())
    world = profile.world_size
    files = 2 * world + 1 + profile.small_files + 1  # model+optimizer shard per rank, index, tail, manifest
    largest_shard = (profile.weights_bytes + profile.optimizer_bytes) // world
    out = {
        "profile": profile.name,
        "reference": profile.reference,
        "params": p,
        "dims": vars(profile.dims),
        "world_size": world,
        "bytes": parts,
        "total_bytes": total,
        "files": files,
        "avg_file_bytes": total // files,
        "restore_memory": {
            # model and optimizer hold every tensor; a shard being deserialized adds one more copy at most
            "held_bytes": profile.weights_bytes + profile.optimizer_bytes,
            "peak_bytes_mmap_or_safetensors": profile.weights_bytes + profile.optimizer_bytes,
            "peak_bytes_full_read": profile.weights_bytes + profile.optimizer_bytes + largest_shard,
            "per_rank_bytes": (profile.weights_bytes + profile.optimizer_bytes) // world,
        },
    }
    if interval_s:
        out["save"] = {"interval_s": interval_s, "required_gbps": total / interval_s / 1e9,
                       "per_rank_gbps": total / interval_s / 1e9 / world}
    return out
