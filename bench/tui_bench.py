"""The TUI's cost, measured: engine throughput with the dashboard attached against headless, and key-to-redraw latency.

Targets (issue: the Textual TUI):
- the engine keeps >= 0.97x its headless throughput with the TUI attached (same checkpoint, same settings, hot);
- key press to redraw under 100 ms during a 2-worker hot read.
Both are measured in one run, alternating headless and TUI repeats; medians of the repeats.

    python bench/tui_bench.py [--dir CKPT] [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

from _harness import OUT_DIR, ROOT, Series, Target, cache_dir, fmt, judge, log, write_outputs

from ckptbench.restore.runner import RunOptions, run  # noqa: E402
from ckptbench.restore.warmup import warm_up  # noqa: E402


def ensure_checkpoint(path: str, profile: str, scale: float) -> str:
    if not os.path.isfile(os.path.join(path, "ckptbench.json")):
        log(f"generating {profile} (scale {scale}) in {path}")
        subprocess.run([sys.executable, "-m", "ckptbench", "gen", profile, path, "--scale", str(scale), "--force"],
                       check=True, cwd=ROOT)
    return path


def headless_read_gbps(source: str, opts: RunOptions) -> float:
    rep = run(source, opts, repeats=1)[0]
    assert rep.status == "ok", rep.problems
    return rep.read_gbps


async def tui_read_gbps(source: str, opts: RunOptions, results: str, keys: bool) -> tuple[float, list[float]]:
    """One restore inside the app; with `keys`, presses +/- during the read and times each redraw."""
    from textual import events
    from textual.widgets import Static

    from tui.app import CkptbenchApp

    app = CkptbenchApp(source, opts, results_path=results)
    latencies: list[float] = []
    async with app.run_test(size=(140, 45)):
        app.screen.action_run()  # pilot.press waits for the app to go idle, which a running restore delays
        if keys:
            for _ in range(2000):
                if app.session is not None and app.session.stage == "read" and app.session.snapshot() is not None:
                    break
                await asyncio.sleep(0.005)
            settings = app.screen.query_one("#settings", Static)
            for i in range(10):
                snap = app.session.snapshot() if app.session else None
                if snap is None or snap.finished:
                    break
                key, char = ("plus", "+") if i % 2 == 0 else ("minus", "-")
                before = str(settings.render())
                t0 = time.perf_counter()
                # posted as a terminal would deliver it: pilot.press also waits for the app to go idle
                app.post_message(events.Key(key, char))
                while str(settings.render()) == before and time.perf_counter() - t0 < 1.0:
                    await asyncio.sleep(0.001)
                latencies.append((time.perf_counter() - t0) * 1000)
        await app.workers.wait_for_complete()
        doc = app.session.doc
    return doc["read_gbps"], latencies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="checkpoint to restore (default: a medium one in the cache directory)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small checkpoint, 2 repeats")
    args = ap.parse_args()
    profile, scale = ("small", 1.0) if args.quick else ("medium", 1.0)
    source = args.dir or ensure_checkpoint(cache_dir(f"bench-tui-{profile}"), profile, scale)
    repeats = 2 if args.quick else args.repeat
    warm_up()
    os.makedirs(OUT_DIR, exist_ok=True)
    results = os.path.join(OUT_DIR, "tui_bench_results.csv")
    opts = RunOptions.make(mode="fused", cache="hot", concurrency=2)
    load0 = os.getloadavg()[0]
    headless, attached = Series("headless", "headless", "GB/s"), Series("attached", "TUI attached", "GB/s")
    keys = Series("keys", "TUI attached", "ms")
    headless_read_gbps(source, opts)  # warm-up: first-use costs out of the comparison
    for _ in range(repeats):
        headless.samples.append(headless_read_gbps(source, opts))
        gbps, _ = asyncio.run(tui_read_gbps(source, opts, results, keys=False))
        attached.samples.append(gbps)
    # a sha256 read keeps the 2 workers busy long enough to press keys during it
    slow = RunOptions.make(mode="fused", cache="hot", concurrency=2, hash="sha256")
    for _ in range(max(2, repeats // 2)):
        _, lat = asyncio.run(tui_read_gbps(source, slow, results, keys=True))
        keys.samples += lat
    series = {s.key: s for s in (headless, attached, keys)}
    kept = judge(Target("engine throughput with the TUI attached >= 0.97x headless", "attached", "headless",
                        low=0.97, shown="{:.3f}×"), series)
    redraw = judge(Target("key press to redraw under 100 ms, worst press", "keys", high=100, worst=True), series)
    said = {"met": "yes", "MISSED": "NO"}
    lines = [
        f"# TUI benchmark — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load {load0:.2f} → "
        f"{os.getloadavg()[0]:.2f}",
        "",
        f"Checkpoint: `{source}`; fused restore, hot, concurrency 2, {repeats} alternating repeats.",
        "",
        "| figure | headless | TUI attached | ratio | target | met? |",
        "|---|---:|---:|---:|---|---|",
        f"| read stage GB/s (median) | {fmt(headless.median)} ({fmt(headless.min)}–{fmt(headless.max)}) | "
        f"{fmt(attached.median)} ({fmt(attached.min)}–{fmt(attached.max)}) | {kept.get('detail', '—')} | ≥ 0.97× | "
        f"{said.get(kept['status'], kept['status'])} |",
        f"| key → redraw ms, during a 2-worker sha256 read (median / worst of {len(keys.samples)}) | | "
        f"{fmt(keys.median, 1)} / {fmt(keys.max, 1)} | | < 100 ms | {said.get(redraw['status'], redraw['status'])} |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_outputs("tui_bench", text, {"headless_gbps": headless.samples, "tui_gbps": attached.samples,
                                      "ratio": kept["value"], "key_latency_ms": keys.samples})
    return 0


if __name__ == "__main__":
    sys.exit(main())
