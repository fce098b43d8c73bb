"""DCP benchmark: ckptbench's restore of a torch.distributed.checkpoint (DCP) checkpoint against torch's own loader,
cold and hot, each in a fresh process, on one checkpoint written by `dcp.save` (bf16 weights, fp32 optimizer
moments, a step counter; one process, so every tensor is one stored chunk at any offset of its file).

torch's loader is what a resume calls: `dcp.load(state_dict, checkpoint_id=DIR)` into a state dict of tensors it
allocates from the checkpoint's metadata inside the clock (as the peers bench's loaders restore into owned tensors
they allocate). ckptbench: `ckptbench run DIR --json --repeat 1 --cache as-is` with its defaults (its RTO; its check
stage scans every floating value for NaN/Inf, which torch's does not). The cache state is made here before each
contender and held 10 s (--settle) after the last free, as in the peers bench. Prints a Markdown table to stdout;
writes bench/out/dcp_bench-<date>.{md,json}. Exit 0 (a report); 2 when the checkpoint cannot be made.

    python bench/dcp_bench.py [--size-gib 2] [--repeat 3] [--settle 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import _harness
from _harness import GiB, OUT_DIR, cache_dir, child_env, log, make_cold, make_hot, settle, utc_now, write_outputs

LOADERS = ("ckptbench", "torch-dcp")


def write_checkpoint(directory: str, nbytes: int) -> None:
    """Once: bf16 weights (4096 x 4096, 32 MiB each) for 2/3 of `nbytes`, fp32 Adam moments in their weights' shape
    (as Adam keeps them: the restore's check holds a moment named by its weight to that weight's shape) for an eighth
    of the weights, a third of the bytes; a step counter; reused while its .metadata is there."""
    if os.path.exists(os.path.join(directory, ".metadata")):
        return
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(7)
    n = max(2, int(nbytes * 2 / 3) // (32 << 20))
    model = {f"layers.{i}.w": torch.randn(4096, 4096, generator=g).bfloat16() for i in range(n)}
    k = max(1, n // 8)
    optim = {f"layers.{i}.w": {"exp_avg": torch.randn(4096, 4096, generator=g),
                               "exp_avg_sq": torch.rand(4096, 4096, generator=g)} for i in range(k)}
    log(f"writing {directory} with dcp.save ({n} weights, {k} optimizer states)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model, "optimizer": {"state": optim}, "step": torch.tensor(100)}, checkpoint_id=directory,
                 no_dist=True)


def child(directory: str) -> None:
    """torch's loader in this fresh process: warm on a tiny DCP of its own, then the clock."""
    import tempfile
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tiny:  # first-use costs (imports, the planner), as ckptbench's warm-up
        dcp.save({"x": torch.ones(4)}, checkpoint_id=tiny, no_dist=True)
        dcp.load({"x": torch.empty(4)}, checkpoint_id=tiny, no_dist=True)
    t0 = time.perf_counter()
    meta = dcp.FileSystemReader(directory).read_metadata()
    flat = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}
    # the flat keys are the ones dcp.save recorded (its planner flattens a nested state dict to them): the same load
    dcp.load(flat, checkpoint_id=directory, no_dist=True)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "bytes": sum(t.numel() * t.element_size() for t in flat.values())}))


def shard_paths(directory: str) -> list[str]:
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory))]


def run_one(loader: str, directory: str, condition: str, results: str) -> tuple[float | None, str]:
    """One timed restore in a fresh process after the cache state is made and held; (seconds, problem)."""
    paths = shard_paths(directory)
    residency = make_cold(paths) if condition == "cold" else make_hot(paths)
    if (condition == "cold" and residency > 0.05) or (condition == "hot" and residency < 0.95):
        return None, f"the {condition} cache state did not hold (residency {residency:.0%})"
    settle()
    if loader == "ckptbench":
        cmd = [sys.executable, "-m", "ckptbench", "run", directory, "--json", "--repeat", "1", "--cache", "as-is",
               "--results", results]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", directory]
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=600)
    if p.returncode not in (0,):
        return None, f"exit {p.returncode}: {(p.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    doc = json.loads(p.stdout)
    if loader == "ckptbench":
        if doc["status"] not in ("ok", "unverified"):
            return None, f"status {doc['status']}"
        return doc["rto_s"], ""
    return doc["seconds"], ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--settle", type=float, default=_harness.SETTLE_DEFAULT_S)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    _harness.SETTLE_S = args.settle
    # v2: moments in their weights' shape (v1's were a quarter of it, which the restore's check now refuses)
    directory = args.dir or cache_dir(f"bench-dcp-v2-{args.size_gib:g}g")
    write_checkpoint(directory, int(args.size_gib * GiB))
    total = sum(os.path.getsize(p) for p in shard_paths(directory))
    os.makedirs(OUT_DIR, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    results = os.path.join(OUT_DIR, f"dcp_bench-{stamp}-results.csv")
    times: dict[tuple[str, str], list[float]] = {}
    problems: list[str] = []
    for i in range(args.repeat):
        for condition in ("cold", "hot"):
            order = LOADERS if i % 2 == 0 else LOADERS[::-1]  # whoever goes first alternates
            for loader in order:
                log(f"round {i + 1}: {condition} {loader}")
                s, problem = run_one(loader, directory, condition, results)
                if s is None:
                    problems.append(f"{condition} {loader}: {problem}")
                else:
                    times.setdefault((condition, loader), []).append(s)
    lines = [f"# DCP restore: ckptbench against torch's dcp.load ({utc_now()})", "",
             f"{directory}: {total / GiB:.2f} GiB in {len(shard_paths(directory))} files, written by dcp.save in one "
             f"process; fresh process each, settle {args.settle:g} s, medians of {args.repeat}", "",
             "| cache | loader | median s | min | max | GB/s | torch / ckptbench |", "|---|---|---:|---:|---:|---:|---:|"]
    record = {"date": utc_now(), "dir": directory, "bytes": total, "args": vars(args), "times": {}, "problems": problems}
    for condition in ("cold", "hot"):
        ours = times.get((condition, "ckptbench"))
        for loader in LOADERS:
            xs = times.get((condition, loader))
            if not xs:
                continue
            med = statistics.median(xs)
            ratio = f"{med / statistics.median(ours):.2f}×" if ours and loader != "ckptbench" else ""
            lines.append(f"| {condition} | {loader} | {med:.3f} | {min(xs):.3f} | {max(xs):.3f} | "
                         f"{total / med / 1e9:.2f} | {ratio} |")
            record["times"][f"{condition}/{loader}"] = xs
    verdicts = []
    for condition in ("cold", "hot"):  # the target: a DCP restore no slower than torch's own loader
        ours, theirs = times.get((condition, "ckptbench")), times.get((condition, "torch-dcp"))
        if ours and theirs:
            ratio = statistics.median(theirs) / statistics.median(ours)
            verdicts.append({"target": f"{condition}: torch's dcp.load / ckptbench >= 1.0", "value": ratio,
                             "status": "met" if ratio >= 1.0 else "MISSED"})
    record["targets"] = verdicts
    lines += [""] + [f"- target {v['target']}: {v['value']:.2f}× ({v['status']})" for v in verdicts]
    lines += [f"- problem: {p}" for p in problems]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    write_outputs(f"dcp_bench-{stamp}", text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
