"""The checks that need a GPU node, as one prepared run for the `device` tool's short lease (see bench/device_checks.sh).

Each check is what an open issue asks to be verified on a GPU, with a pass/fail line that could fail:
- device: `ckptbench run --device cuda` (the device stage: pinned host memory, asynchronous copies, a model step on
  the GPU), cold (page cache dropped, verified) and repeated;
- nccl (#16 item 6): the distributed restore under torchrun with nccl on cuda:0, its tensors compared digest by
  digest with the same restore on gloo/CPU, so a wrong copy to the GPU cannot pass;
- watch-gpu (#14): `ckptbench watch -- JOB` on a job that torch.loads a file and moves it to the GPU: the GPU peak
  nvidia-smi gave the watcher against what the job's own torch.cuda counters say, and the phase order;
- h2d-ring (#23 item 4): the device stage's reused pinned ring (restore.device.HostRing) against per-tensor
  pin_memory (what the stage did before) and pageable copies, one process, the same host tensors, rotated; every
  moved byte checked on the GPU;
- peers (#13): bench/peers_bench.py (4 GiB, 3 rounds) on a box where fresh memory is not the 2-core VM's floor.

Checks run in that order, each in child processes with its own time limit, and stop starting new ones when the
budget (--budget, seconds) would be passed: the lease is short. Writes device_checks.{md,json} into --out ($OUT
when set) and prints the Markdown. Exit 0 when every check that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30

# The job `watch` follows: load a torch.save file whole (weights_only), move every tensor to the GPU one by one as
# a resuming trainer does, hold it a moment, and write torch's own view of GPU memory for the comparison.
WATCH_JOB = """
import json, sys, time, torch
sd = torch.load(sys.argv[1], weights_only=True)
dev, gpu = sys.argv[3], sys.argv[3].startswith("cuda")
t0 = time.monotonic()
on_gpu = {k: v.to(dev) for k, v in sd.items()}
if gpu:
    torch.cuda.synchronize()
copy_s = time.monotonic() - t0
time.sleep(1.5)  # long enough for a sample or two at the peak
mem = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()) if gpu else (0, 0, 0)
json.dump({"allocated": mem[0], "max_allocated": mem[1], "reserved": mem[2], "copy_s": copy_s,
           "bytes": sum(v.nbytes for v in on_gpu.values())}, open(sys.argv[2], "w"))
"""


# The ring A/B: GIB of bf16 host tensors (large ones and a tail of small ones, as a model's), moved ROUNDS times by
# each way in rotation, each time into fresh device tensors, timed to a synchronize, checked by a sum on the GPU.
RING_JOB = """
import json, statistics, sys, time, torch
from ckptbench.restore.device import HostRing
gib, rounds, dev, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sizes = [64 << 20] * int(gib * 16) + [32 << 10] * 512  # elements: 128 MiB of bf16 each, then 64 KiB ones
host = [torch.arange(n, dtype=torch.int32).to(torch.int16).view(torch.bfloat16) for n in sizes]
want = [int(t.view(torch.int16).to(torch.int64).sum()) for t in host]
def pin(ts):  # on a CPU dry run of the plumbing there is nothing to pin: a copy stands in
    return [t.pin_memory().to(dev, non_blocking=True) if dev.startswith("cuda") else t.clone() for t in ts]
def pageable(ts):
    return [t.to(dev) for t in ts]
def ring(ts):
    r = HostRing(dev)
    return [r.move(t) for t in ts]
ways = {"pin": pin, "pageable": pageable, "ring": ring}
seen = {k: [] for k in ways}
wrong = []
for i in range(rounds):
    names = list(ways)[i % 3:] + list(ways)[:i % 3]
    for name in names:
        t0 = time.perf_counter()
        moved = ways[name](host)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        seen[name].append(time.perf_counter() - t0)
        got = [int(t.view(torch.int16).to(torch.int64).sum()) for t in moved]
        if got != want:
            wrong.append(name)
        del moved
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
nbytes = sum(t.nbytes for t in host)
json.dump({"bytes": nbytes, "seconds": seen, "median_s": {k: statistics.median(v) for k, v in seen.items()},
           "wrong": sorted(set(wrong))}, open(out, "w"))
"""


class Checks:
    def __init__(self, work: str, out: str, budget: float, device: str = "cuda") -> None:
        self.work, self.out = work, out
        self.device = device  # cpu only to try the script's plumbing on a box without a GPU: the checks then fail
        self.deadline = time.monotonic() + budget
        self.results: list[dict] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sh(self, cmd: list[str], limit: float, **kw) -> subprocess.CompletedProcess:
        """A child with a time limit; its output kept for the report (a timeout reads as rc 124)."""
        log("$ " + " ".join(cmd))
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, min(limit, self.left())),
                                  **({"env": self.env} | kw), cwd=ROOT)
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(cmd, 124, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)")

    def ckpt(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "ckptbench", *args]

    def record(self, name: str, issue: str, ok: bool | None, summary: str, details: dict) -> None:
        verdict = "pass" if ok else ("not run" if ok is None else "FAIL")
        log(f"{name}: {verdict}: {summary}")
        self.results.append({"check": name, "issue": issue, "verdict": verdict, "summary": summary, **details})

    def run(self, name: str, issue: str, need_s: float, fn) -> None:
        if self.left() < need_s:
            self.record(name, issue, None, f"skipped: {self.left():.0f} s of the budget left, it needs ~{need_s:.0f}",
                        {})
            return
        t = time.monotonic()
        try:
            ok, summary, details = fn()
        except Exception as exc:  # a check that breaks is reported as such; the others still run
            ok, summary, details = False, f"the check itself broke: {type(exc).__name__}: {exc}", {}
        details["seconds"] = round(time.monotonic() - t, 1)
        self.record(name, issue, ok, summary, details)

    # -- the checks ------------------------------------------------------------------------------------------------

    def environment(self) -> dict:
        import torch

        smi = self.sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"], 30) \
            if shutil.which("nvidia-smi") else None
        df = self.sh(["df", "-T", self.work], 10)
        return {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.cuda.is_available(),
                "gpu": smi.stdout.strip() if smi else "no nvidia-smi", "cpus": os.cpu_count(),
                "work_fs": df.stdout.strip().splitlines()[-1] if df.returncode == 0 else df.stderr.strip()}

    def sample(self) -> str:
        ck = os.path.join(self.work, "small")
        if not os.path.isdir(ck):
            out = self.sh(self.ckpt("gen", "small", ck), 300)
            if out.returncode != 0:
                raise RuntimeError(f"gen failed: {out.stderr.strip()[-500:]}")
        return ck

    def device_stage(self):
        ck = self.sample()
        out = self.sh(self.ckpt("run", ck, "--device", self.device, "--cache", "cold", "--drop-caches", "--repeat", "3",
                                "--json", "--results", os.path.join(self.work, "device.csv")), 300)
        doc = _json(out.stdout)
        if out.returncode != 0 or doc is None:
            return False, f"rc {out.returncode}: {_last(out.stderr)}", {"stderr": out.stderr[-3000:]}
        reps = doc["repeats"]
        moved = [r["stages"].get("device", 0) for r in reps]
        ok = (doc["status"] == "ok" and all(r["status"] == "ok" for r in reps) and all(m > 0 for m in moved)
              and all(r["cache"]["verified"] for r in reps) and "cuda" in str(reps[0]["notes"].get("device", "")))
        summary = (f"RTO median {doc['rto_s']:.3f} s, device stage {', '.join(f'{m:.3f}' for m in moved)} s, "
                   f"check: {reps[0].get('check')}, notes: {reps[0]['notes'].get('device')}")
        return ok, summary, {"run": {k: doc[k] for k in ("rto_s", "stages", "read", "cache", "notes")},
                             "repeats": [{k: r[k] for k in ("rto_s", "stages", "cache", "notes")} for r in reps]}

    def nccl(self):
        ck = self.sample()
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
        docs = {}
        for device in (self.device, "cpu"):
            out = self.sh(torchrun + ["-m", "ckptbench", "run", ck, "--distributed", "--device", device,
                                      "--tensor-digests", "--json",
                                      "--results", os.path.join(self.work, f"dist-{device}.csv")], 300)
            doc = _json(out.stdout)
            if out.returncode != 0 or doc is None:
                return False, f"--device {device}: rc {out.returncode}: {_last(out.stderr)}", {
                    "stderr": out.stderr[-3000:]}
            docs[device] = doc
        gpu, cpu = _digests(docs[self.device]), _digests(docs["cpu"])
        differ = sorted(k for k in set(gpu) | set(cpu) if gpu.get(k) != cpu.get(k))
        ok = bool(gpu) and not differ
        summary = (f"{len(gpu)} tensors restored on {self.device} over {docs[self.device].get('backend')}; "
                   "digests equal to the gloo/CPU restore: "
                   f"{'yes' if ok else f'no, {len(differ)} differ (first: {differ[:3]})'}; "
                   f"RTO {_rto(docs[self.device])} ({self.device}) vs {_rto(docs['cpu'])} (cpu)")
        ok = ok and self.device == "cuda" and docs[self.device].get("backend") == "nccl"
        return ok, summary, {"gpu_run": _trim(docs[self.device]), "cpu_run": _trim(docs["cpu"]), "differ": differ[:20]}

    def watch_gpu(self, gib: float):
        import torch

        path = os.path.join(self.work, "watched.pt")
        n = max(1, int(gib * 8))  # 128 MiB tensors
        if not os.path.exists(path):
            torch.save({f"layer{i}.weight": torch.full((64 << 20,), float(i), dtype=torch.bfloat16) for i in range(n)},
                       path)
        job = os.path.join(self.work, "job.py")
        with open(job, "w") as f:
            f.write(WATCH_JOB)
        seen = os.path.join(self.work, "job.json")
        out = self.sh(self.ckpt("watch", "--json", "--results", os.path.join(self.work, "watch.csv"), "--",
                                sys.executable, job, path, seen, self.device), 300)
        doc = _json(out.stdout)
        if doc is None or not os.path.exists(seen):
            return False, f"rc {out.returncode}: {_last(out.stderr)}", {"stderr": out.stderr[-3000:]}
        with open(seen) as f:
            torch_view = json.load(f)
        peak = doc.get("gpu_peak_bytes")
        phases = [p["phase"] for p in doc["phases"]]
        first = {name: i for i, name in reversed(list(enumerate(phases)))}
        copy_after_read = "copying-to-gpu" in first and any(
            first.get(p, 1 << 30) < first["copying-to-gpu"] for p in ("reading", "deserializing", "faulting"))
        # nvidia-smi counts the CUDA context and the caching allocator's reserve too: at least what torch
        # allocated, at most its reserve plus a context (well under 2 GiB)
        peak_ok = peak is not None and torch_view["max_allocated"] <= peak <= torch_view["reserved"] + 2 * GiB
        ok = peak_ok and copy_after_read
        summary = (f"nvidia-smi peak {_gb(peak)} vs torch max_allocated {_gb(torch_view['max_allocated'])}, "
                   f"reserved {_gb(torch_view['reserved'])} ({'in range' if peak_ok else 'OUT of range'}); "
                   f"phases {' → '.join(phases)} ({'copying-to-gpu after the read' if copy_after_read else 'NO copying-to-gpu after a read phase'}); "
                   f"job's copy {torch_view['copy_s']:.2f} s; verdict: {(doc.get('verdict') or {}).get('kind')}; "
                   f"gpu note: {doc.get('gpu_note') or '-'}")
        return ok, summary, {"watch": {k: doc.get(k) for k in ("phases", "gpu_peak_bytes", "gpu_note", "verdict",
                                                               "bytes_read", "peak_rss_bytes")},
                             "torch": torch_view}

    def floor_h2d(self):
        """#23: the floor measures the GPU's link (pinned, pageable) and a run with --device cuda is held to it."""
        ck = self.sample()
        cache = os.path.join(self.work, "floor-cache")  # the check's own figures, never the lease's user cache
        env = dict(self.env, XDG_CACHE_HOME=cache)
        out = self.sh(self.ckpt("floor", ck, "--remeasure", "--json"), 120, env=env)
        doc = _json(out.stdout)
        if doc is None:
            return False, f"floor: rc {out.returncode}: {_last(out.stderr)}", {"stderr": out.stderr[-3000:]}
        link = {k: (doc["ceilings"].get(k) or {}).get("gbps") for k in ("h2d_pinned", "h2d_pageable")}
        run = self.sh(self.ckpt("run", ck, "--device", self.device, "--repeat", "1", "--json", "--results",
                                os.path.join(self.work, "floor-h2d.csv")), 180, env=env)
        rdoc = _json(run.stdout) or {}
        times = rdoc.get("floor_times_s") or {}
        ok = bool(link["h2d_pinned"] and link["h2d_pageable"] and "host-to-device" in times
                  and doc["box"].get("gpus"))
        summary = (f"box gpus {doc['box'].get('gpus')}; pinned {link['h2d_pinned']} GB/s, pageable "
                   f"{link['h2d_pageable']} GB/s; run --device {self.device}: floor {rdoc.get('floor_s')} s bound by "
                   f"{rdoc.get('binding')}, efficiency {rdoc.get('efficiency')}, times {times}")
        return ok, summary, {"floor_ceilings": doc.get("ceilings"), "run_floor_note": rdoc.get("floor_note")}

    def h2d_ring(self, gib: float, rounds: int):
        """#23 item 4: the reused pinned ring is kept as the device stage only if it is the fastest way here."""
        job, seen = os.path.join(self.work, "ring.py"), os.path.join(self.work, "ring.json")
        with open(job, "w") as f:
            f.write(RING_JOB)
        out = self.sh([sys.executable, job, f"{gib:g}", str(rounds), self.device, seen], 240)
        if out.returncode != 0 or not os.path.exists(seen):
            return False, f"rc {out.returncode}: {_last(out.stderr)}", {"stderr": out.stderr[-3000:]}
        with open(seen) as f:
            doc = json.load(f)
        med = doc["median_s"]
        best_other = min(med["pin"], med["pageable"])
        ok = not doc["wrong"] and med["ring"] <= 1.05 * best_other
        gbps = {k: doc["bytes"] / v / 1e9 for k, v in med.items()}
        summary = (f"{doc['bytes'] / 1e9:.2f} GB, medians of {rounds}: ring {med['ring']:.3f} s "
                   f"({gbps['ring']:.1f} GB/s), per-tensor pin_memory {med['pin']:.3f} s ({gbps['pin']:.1f}), "
                   f"pageable {med['pageable']:.3f} s ({gbps['pageable']:.1f}); ring / best other "
                   f"{med['ring'] / best_other:.2f}× (keep the ring at ≤ 1.05×); bytes wrong: {doc['wrong'] or 'none'}")
        return ok, summary, {"ring": doc}

    def peers(self, size_gib: float, rounds: int, which: str | None):
        out = self.sh([sys.executable, os.path.join(ROOT, "bench", "peers_bench.py"), "--size-gib", f"{size_gib:g}",
                       "--repeat", str(rounds), "--dir", os.path.join(self.work, f"peers-{size_gib:g}g"),
                       *(["--peers", which] if which else [])], max(60.0, self.left() - 30))
        if out.returncode != 0:
            return False, f"rc {out.returncode}: {_last(out.stderr)}", {"stderr": out.stderr[-3000:]}
        newest = max((os.path.join(ROOT, "bench", "out", f) for f in os.listdir(os.path.join(ROOT, "bench", "out"))
                      if f.startswith("peers_bench-") and f.endswith(".json")), key=os.path.getmtime)
        with open(newest) as f:
            doc = json.load(f)
        shutil.copy(newest[:-len(".json")] + ".md", self.out)  # the whole report comes back with the checks
        targets = doc["targets"]
        ok = all(t["status"] == "met" for t in targets)
        summary = "; ".join(f"{t['target']}: {t['status']} ({t.get('detail', t.get('value'))})" for t in targets)
        return ok, summary, {"report_md": out.stdout[-6000:], "targets": targets}


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _digests(doc: dict) -> dict:
    """Every rank's tensor digests in the last repeat (the tensors as they stood after the device stage)."""
    found = {}
    for rank in doc["repeats"][-1]["ranks"]:
        found.update(rank.get("digests") or {})
    return found


def _rto(doc: dict) -> str:
    rto = (doc.get("rto_stats") or {}).get("median")
    return f"{rto:.3f} s" if isinstance(rto, (int, float)) else "?"


def _trim(doc: dict) -> dict:
    last = doc["repeats"][-1]
    return {k: v for k, v in doc.items() if k not in ("env", "repeats")} | {
        "last_repeat": {k: v for k, v in last.items() if k != "ranks"},
        "rank0_stages": last["ranks"][0].get("stages"), "rank0_notes": last["ranks"][0].get("notes")}


def _gb(n) -> str:
    return "?" if n is None else f"{n / 1e9:.2f} GB"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def markdown(env: dict, results: list[dict]) -> str:
    lines = ["# Device checks", "", "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), "",
             "| check | issue | verdict | seconds | what was seen |", "|---|---|---|---:|---|"]
    for r in results:
        lines.append(f"| {r['check']} | {r['issue']} | {r['verdict']} | {r.get('seconds', '')} | "
                     f"{r['summary'].replace('|', '/')} |")
    peers = next((r for r in results if r["check"] == "peers" and r.get("report_md")), None)
    if peers:
        lines += ["", "## peers_bench report (tail)", "", peers["report_md"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "out"))
    ap.add_argument("--work", default="/var/tmp/ckptbench-device", help="where checkpoints are written (a disk, "
                    "not tmpfs: cold reads must reach a device)")
    ap.add_argument("--budget", type=float, default=420, help="seconds for all checks together")
    ap.add_argument("--only", default="device,floor-h2d,h2d-ring,nccl,watch-gpu,peers",
                    help="comma-separated checks to run")
    ap.add_argument("--ring-gib", type=float, default=4.0, help="host tensors the h2d-ring A/B moves, each way")
    ap.add_argument("--ring-rounds", type=int, default=3)
    ap.add_argument("--watch-gib", type=float, default=6.0, help="size of the file the watched job moves to the GPU")
    ap.add_argument("--peers-gib", type=float, default=4.0)
    ap.add_argument("--peers-rounds", type=int, default=3)
    ap.add_argument("--peers", default=None, help="passed to peers_bench.py (default: all its peers)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a dry run of the plumbing
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(","))
    c = Checks(args.work, args.out, args.budget, args.device)
    env = c.environment()
    log(f"environment: {env}")
    plan = [("device", "#16 device stage", 40, c.device_stage),
            ("floor-h2d", "#23 item 1 (host-to-device)", 40, c.floor_h2d),
            ("h2d-ring", "#23 item 4 (pinned ring)", 60, lambda: c.h2d_ring(args.ring_gib, args.ring_rounds)),
            ("nccl", "#16 item 6", 60, c.nccl),
            ("watch-gpu", "#14", 60, lambda: c.watch_gpu(args.watch_gib)),
            ("peers", "#13", 150, lambda: c.peers(args.peers_gib, args.peers_rounds, args.peers))]
    for name, issue, need, fn in plan:
        if name in only:
            if name != "peers" and args.device == "cuda" and not env["cuda"]:
                c.record(name, issue, False, "no CUDA device visible to torch here", {})
                continue
            c.run(name, issue, need, fn)
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "environment": env, "checks": c.results}
    with open(os.path.join(args.out, "device_checks.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    md = markdown(env, c.results)
    with open(os.path.join(args.out, "device_checks.md"), "w") as f:
        f.write(md)
    print(md)
    return 0 if all(r["verdict"] == "pass" for r in c.results if r["verdict"] != "not run") else 1


if __name__ == "__main__":
    sys.exit(main())
