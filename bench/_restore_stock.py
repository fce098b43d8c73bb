"""The restore benchmark's stock path: what a seed script does to restore the checkpoint, one file after another."""

from __future__ import annotations

import os
import time

import _peers


def stock_restore(listing) -> tuple[dict[str, float], list[str], dict[str, str]]:
    """What a seed script does, one file after another: md5 of every file (1 MiB reads), then
    safetensors.torch.load_file per shard into a GPT built normally (load_state_dict copies), optimizer
    tensors cloned (load_file maps lazily; the clone reads the bytes), the small-file tail, one forward step.
    """
    import safetensors.torch
    import torch

    from ckptbench.restore import load as restore
    from ckptbench.checkpoint.model import DTYPES, GPT, master_optimizer, sample_batch

    man = listing.manifest
    stages: dict[str, float] = {}
    problems: list[str] = []
    t0 = time.perf_counter()

    t = time.perf_counter()
    digests = {f.path: _peers.md5_file(f.path)[1] for f in listing.files}
    if man is not None and man.hash == "md5":
        for e in man.files:
            got = digests.get(os.path.join(listing.source, e.path))
            if got is not None and got != e.digest:
                problems.append(f"{e.path}: md5 {got} != manifest {e.digest}")
    stages["verify"] = time.perf_counter() - t

    t = time.perf_counter()
    dims = restore.dims_of(man, {})
    model = GPT(dims).to(DTYPES[man.weights_dtype])
    loaded: set[str] = set()
    optim: dict[str, torch.Tensor] = {}
    for path in restore.shard_files(listing.source, "safetensors"):
        sd = safetensors.torch.load_file(path)
        if os.path.basename(path).startswith("optimizer"):
            for k, v in sd.items():
                optim[k] = v.clone()
        else:
            res = model.load_state_dict(sd, strict=False)
            if res.unexpected_keys:
                problems.append(f"{os.path.basename(path)}: unexpected keys {res.unexpected_keys[:3]}")
            loaded.update(sd)
        del sd
    missing = set(model.state_dict()) - loaded
    if missing:
        problems.append(f"{len(missing)} weight(s) not in any shard, e.g. {sorted(missing)[0]}")
    # the same optimizer the fused path builds: AdamW over the fp32 masters, with the saved moments
    master = {n: optim[f"{n}.master"].requires_grad_(True) for n, _ in model.named_parameters()}
    opt, master, names = master_optimizer(model, master)
    sd = opt.state_dict()
    step = torch.tensor(float(man.step))
    sd["state"] = {i: {"step": step.clone(), "exp_avg": optim[f"{n}.exp_avg"],
                       "exp_avg_sq": optim[f"{n}.exp_avg_sq"]} for i, n in enumerate(names)}
    opt.load_state_dict(sd)
    tail = restore.load_tail(listing.source, man)
    stages["load"] = time.perf_counter() - t

    t = time.perf_counter()
    count = sum(p.numel() for p in model.parameters())
    if count != man.param_count:
        problems.append(f"parameter count {count} != manifest {man.param_count}")
    with torch.no_grad():
        out = model(sample_batch(dims))
    if not bool(torch.isfinite(out).all()):
        problems.append("forward step gave non-finite output")
    stages["check"] = time.perf_counter() - t
    stages["rto"] = time.perf_counter() - t0
    del model, opt, master, optim, tail
    return stages, problems, digests
