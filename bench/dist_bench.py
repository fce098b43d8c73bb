"""Distributed restore benchmark: what coordinating ranks costs.

A 2-rank checkpoint (the medium profile, safetensors, about 2 GiB) restored cold by 2 ranks under torchrun
(`run --distributed`, concurrency C per rank, each rank reading its own files) against one process reading the same
bytes with concurrency 2C (`run --concurrency 2C`), fresh processes, order alternating, medians of the repeats.
Figure: the 2 ranks' aggregate read rate (all bytes over the span from the first read start to the last read end)
over the single process's read rate (bytes over its read stage). Target: ≥ 0.9×.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _harness as hx  # noqa: E402

TARGET = 0.9


def _checkpoint(scale: float) -> str:
    d = os.path.join(hx.cache_dir("bench-dist"), f"medium-st-2r-{scale:g}")
    os.makedirs(os.path.dirname(d), exist_ok=True)
    if not os.path.exists(os.path.join(d, "ckptbench.json")):
        subprocess.run([sys.executable, "-m", "ckptbench", "gen", "medium", d, "--format", "safetensors", "--ranks",
                        "2", "--scale", str(scale), "--force"], check=True, env=hx.child_env(), cwd=hx.ROOT,
                       stdout=subprocess.DEVNULL)
    return d


def _single(d: str, conc: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "ckptbench", "run", d, "--cache", "cold", "--concurrency", str(conc),
                          "--repeat", "1", "--results", "", "--json"], capture_output=True, text=True, check=True,
                         env=hx.child_env(), cwd=hx.ROOT)
    doc = json.loads(out.stdout)
    rep = doc["repeats"][0]
    return {"gbps": rep["read_gbps"], "rto_s": rep["rto_s"], "residency": rep["cache"]["residency_before"]}


def _ranks(d: str, conc: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          "-m", "ckptbench", "run", d, "--distributed", "--cache", "cold", "--concurrency", str(conc),
                          "--repeat", "1", "--results", "", "--json"], capture_output=True, text=True, check=True,
                         env=dict(hx.child_env(), OMP_NUM_THREADS="1"), cwd=hx.ROOT)
    doc = json.loads(out.stdout)
    rep = doc["repeats"][0]
    cache = [r["cache"] for r in rep["ranks"] if r.get("cache")]
    return {"gbps": rep["aggregate_gbps"], "rto_s": rep["rto_s"], "skew_s": rep["skew_s"],
            "amplification": rep["amplification"], "residency": max(c["residency_before"] for c in cache)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="resize the medium profile (1.0: about 2 GiB)")
    ap.add_argument("--concurrency", type=int, default=8, help="per rank; the single process gets twice this")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    why = hx.missing("dist_bench.py", modules=("torch", "fastio"))
    if why:
        print(why, file=sys.stderr)
        return 2
    d = _checkpoint(args.scale)
    single, ranks = [], []
    for r in range(args.repeat):
        hx.log(f"round {r + 1} of {args.repeat}")
        for which in (("single", "ranks") if r % 2 == 0 else ("ranks", "single")):
            if which == "single":
                single.append(_single(d, 2 * args.concurrency))
            else:
                ranks.append(_ranks(d, args.concurrency))
    cold = all(x["residency"] <= hx.COLD_MAX for x in single + ranks)
    s_g, r_g = statistics.median(x["gbps"] for x in single), statistics.median(x["gbps"] for x in ranks)
    ratio = statistics.median(b["gbps"] / a["gbps"] for a, b in zip(single, ranks))  # rounds ran back to back
    verdict = ("met" if ratio >= TARGET else "MISSED") if cold else "not verified (cache state)"
    size = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)
    date = hx.utc_now()
    lines = hx.preface(date, hx.machine(d)) + [
        f"Checkpoint: medium profile ×{args.scale:g}, safetensors, saved by 2 ranks, {size / 2**30:.2f} GiB; cold "
        f"(evicted before each run{'' if cold else ', NOT verified'}); fresh processes, order alternating, medians "
        f"of {args.repeat}.", "",
        "| | read GB/s median | min–max | RTO s median | other |", "|---|---:|---|---:|---|",
        f"| one process, concurrency {2 * args.concurrency} | {s_g:.2f} | {min(x['gbps'] for x in single):.2f}–"
        f"{max(x['gbps'] for x in single):.2f} | {statistics.median(x['rto_s'] for x in single):.3f} | |",
        f"| 2 ranks (torchrun, gloo), concurrency {args.concurrency} each | {r_g:.2f} | "
        f"{min(x['gbps'] for x in ranks):.2f}–{max(x['gbps'] for x in ranks):.2f} | "
        f"{statistics.median(x['rto_s'] for x in ranks):.3f} (slowest rank) | skew "
        f"{statistics.median(x['skew_s'] for x in ranks):.3f} s, amplification "
        f"{statistics.median(x['amplification'] for x in ranks):.2f} |", "",
        f"2 ranks / one process: {ratio:.2f}× (median of per-round ratios; ratio of medians {r_g / s_g:.2f}×). "
        f"Target ≥ {TARGET}×: {verdict}.",
    ]
    md = "# ckptbench distributed restore: what coordination costs\n\n" + "\n".join(lines) + "\n"
    print(md)
    hx.write_outputs("dist_bench", md, {"date": date, "single": single, "ranks": ranks, "ratio": ratio,
                                        "verdict": verdict, "concurrency": args.concurrency})
    return 0


if __name__ == "__main__":
    sys.exit(main())
