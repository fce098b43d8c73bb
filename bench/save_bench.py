"""Save benchmark: the sustained durable throughput of `ckptbench save` against fio writing the same bytes on the
same filesystem in the same run (sequential 1 MiB psync writes, one fsync at the end).

Prints a Markdown report to stdout (progress goes to stderr) and writes bench/out/save_bench.{md,json}.
Exit status 0 even when the target is missed; 2 when a needed tool is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _harness import (MiB, ROOT, Series, Target, cache_dir, child_env, fmt, judge, log, machine, missing, preface,
                      section, targets_section, utc_now, write_outputs)

PROFILE = "small"
SAVES = 4  # per repeat: the first is left out of the sustained figure, as `save` reports it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=cache_dir("save_bench"), help="where the saves and fio's file go")
    p.add_argument("--scale", type=float, default=4.0, help=f"the {PROFILE} profile at this scale (4: about 1 GiB)")
    p.add_argument("--repeat", type=int, default=5, help="repeats (at least 3)")
    args = p.parse_args(argv)
    args.repeat = max(3, args.repeat)
    return args


def ckptbench_save(target: str, scale: float) -> dict:
    """One `ckptbench save` process: SAVES saves of the profile, the newest kept; its JSON report."""
    shutil.rmtree(target, ignore_errors=True)
    cmd = [sys.executable, "-m", "ckptbench", "save", PROFILE, target, "--scale", str(scale), "--count", str(SAVES),
           "--keep", "1", "--results", "", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), cwd=ROOT, check=False)
    if out.returncode != 0:
        raise SystemExit(f"save_bench: ckptbench save failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def fio_durable_s(fio: str, directory: str, size: int) -> float:
    """Seconds from fio's first write to its return, the end fsync included: fio's own runtime leaves the end
    fsync out, so the start is stamped by exec_prerun and the end is when fio exits."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    stamp = tempfile.NamedTemporaryFile(delete=False)
    stamp.close()
    cmd = [fio, "--name=save", f"--directory={directory}", "--rw=write", "--bs=1M", f"--size={size}",
           "--ioengine=psync", "--end_fsync=1", "--fallocate=none", "--output-format=json",
           f"--exec_prerun=python3 -c \"import time; open('{stamp.name}', 'w').write(repr(time.time()))\""]
    subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=directory)  # exec_prerun leaves a .txt here
    end = time.time()
    with open(stamp.name) as f:
        start = float(f.read())
    os.unlink(stamp.name)
    return end - start


def run(args, fio: str) -> tuple[dict[str, Series], dict]:
    series = {"ckptbench": Series("ckptbench", "durable", "GB/s", note="ckptbench save, median of saves 2..4"),
              "fio": Series("fio", "durable", "GB/s", note="fio psync 1 MiB sequential writes, end_fsync=1"),
              "fio_overhead": Series("fio_overhead", "durable", "s", note="fio of 1 MiB: its fixed start and exit")}
    info: dict = {}
    for i in range(args.repeat):
        order = ("ckptbench", "fio") if i % 2 == 0 else ("fio", "ckptbench")  # neither always goes first
        for tool in order:
            if tool == "ckptbench":
                doc = ckptbench_save(os.path.join(args.dir, "saves"), args.scale)
                info = {k: doc[k] for k in ("bytes", "format", "dirty_peak_fraction", "throttled",
                                            "write_amplification")}
                series["ckptbench"].samples.append(doc["sustained_gbps"])
                log(f"[{i + 1}] ckptbench save: {doc['sustained_gbps']:.3f} GB/s sustained")
            else:
                size = info.get("bytes") or int(args.scale * 256 * MiB)
                overhead = fio_durable_s(fio, os.path.join(args.dir, "fio"), MiB)
                seconds = fio_durable_s(fio, os.path.join(args.dir, "fio"), size // MiB * MiB) - overhead
                series["fio_overhead"].samples.append(overhead)
                series["fio"].samples.append(size // MiB * MiB / seconds / 1e9)
                log(f"[{i + 1}] fio: {series['fio'].samples[-1]:.3f} GB/s (fixed overhead {overhead:.3f} s taken off)")
    shutil.rmtree(os.path.join(args.dir, "fio"), ignore_errors=True)
    shutil.rmtree(os.path.join(args.dir, "saves"), ignore_errors=True)
    return series, info


# paired: each repeat runs both tools back to back, so a ratio per pair cancels the disk's slow drifts (a virtual
# disk whose host caches too)
TARGETS = [Target("ckptbench save's sustained durable throughput within ±10 % of fio's (median of paired ratios)",
                  "ckptbench", "fio", low=0.90, high=1.10, paired=True)]


def report(series: dict[str, Series], info: dict, verdicts: list[dict], args, date: str, facts: dict) -> str:
    c, f = series["ckptbench"], series["fio"]
    lines = preface(date, facts) + [
        f"# Save: `ckptbench save` against fio ({info.get('bytes', 0) / MiB:.0f} MiB per save, {info.get('format')}, "
        f"medians of {args.repeat})", "",
        "| tool | median GB/s | min–max | repeats |", "|---|---:|---:|---:|",
        f"| ckptbench save (sustained: saves 2..{SAVES}, fsync'd files and directory, rename) | {fmt(c.median, 3)} | "
        f"{fmt(c.min, 3)}–{fmt(c.max, 3)} | {len(c.samples)} |",
        f"| fio psync 1 MiB sequential, end_fsync=1 | {fmt(f.median, 3)} | {fmt(f.min, 3)}–{fmt(f.max, 3)} | "
        f"{len(f.samples)} |",
        "", f"ratio of the medians (ckptbench / fio): {fmt(c.median / f.median if c.median and f.median else None, 2)}×; "
        f"per pair: {', '.join(fmt(a / b, 2) for a, b in zip(c.samples, f.samples))}"]
    lines += section("Notes", [
        f"fio's time runs from its first write (stamped by exec_prerun) to its exit, less a 1 MiB job's "
        f"({fmt(series['fio_overhead'].median, 3)} s median): fio's own runtime leaves the end fsync out",
        f"page cache during the saves: Dirty + Writeback peaked at "
        f"{fmt((info.get('dirty_peak_fraction') or 0) * 100, 1)} % of the dirty limit; throttled: {info.get('throttled')}; write amplification "
        f"{fmt(info.get('write_amplification'), 3)}"])
    return "\n".join(lines + targets_section(verdicts)) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = missing("save_bench", executables=("fio",), modules=("fastio", "torch", "safetensors"))
    if problem:
        print(problem, file=sys.stderr)
        return 2
    fio = shutil.which("fio")
    os.makedirs(args.dir, exist_ok=True)
    date = utc_now()
    series, info = run(args, fio)
    verdicts = [judge(t, series) for t in TARGETS]
    facts = machine(args.dir, fio)
    text = report(series, info, verdicts, args, date, facts)
    print(text, end="")
    write_outputs("save_bench", text, {"date": date, "machine": facts, "info": info, "verdicts": verdicts,
                                       "series": {k: s.as_dict() for k, s in series.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
