"""Peers benchmark: ckptbench's restore against the loaders users pick instead (safetensors load_file,
fastsafetensors, Run:ai Model Streamer), cold and hot, on one foreign safetensors checkpoint.

Every measurement is a fresh process: `ckptbench run DIR --json --repeat 1 --cache cold|hot` with its defaults, or
bench/_loaders.py for a peer. Prints a Markdown report to stdout (progress goes to stderr) and writes
bench/out/peers_bench-<date>.{md,json}. Exit status 0 even when a target is missed (it is a report); 2 when the
checkpoint cannot be made or a peer package is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import _foreign
import _loaders
import _peers
from _harness import (COLD_MAX, HOT_MIN, OUT_DIR, ROOT, Series, Target, cache_dir, child_env, fmt, judge, log,
                      machine, missing, preface, section, series_table, utc_now, write_outputs)

MiB, GiB = 1 << 20, 1 << 30
ATTEMPTS = 3  # a repeat whose cache state did not hold is run again, this often, then refused
HOT_SPEEDUP, COLD_SPEEDUP = 1.5, 1.3  # ckptbench RTO against the fastest peer
READ_BAND = (0.85, 1.15)  # run's read stage / `ckptbench read`, cold, same read path
CHECK_MAX = 0.25  # check stage / read stage
DIRECT_IO = {"fastsafetensors", "runai"}  # read with O_DIRECT by default: the page cache is bypassed, hot or cold
READ_MODES = ("pread", "mmap", "direct")
LOADERS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_loaders.py")
CHILD_TIMEOUT = 900


# --------------------------------------------------------------------------- children and their documents


def parse_child(returncode: int, stdout: str, stderr: str) -> tuple[dict | None, str]:
    """A child's JSON document (the whole of stdout, else its last line) and a problem line ("" when none)."""
    doc = None
    text = stdout.strip()
    for candidate in (text, text.splitlines()[-1] if text else ""):
        try:
            doc = json.loads(candidate)
            break
        except json.JSONDecodeError:
            continue
    if not isinstance(doc, dict):
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
        return None, f"exited {returncode} without a JSON document: {tail[:300]}"
    return doc, "" if returncode == 0 else f"exited {returncode}"


def run_summary(doc: dict) -> dict:
    """What the bench takes from `ckptbench run --json`: the RTO, the stages, the cache state and the read path."""
    opts = doc.get("options", {})
    stages = doc.get("stages", {})
    read_mode, why = resolved_read(doc)
    hash_, hash_how = resolved_hash(doc)
    return {"rto": doc.get("rto_s"), "read": stages.get("read"), "check": stages.get("check"), "stages": stages,
            "residency": doc.get("cache", {}).get("residency_before"), "status": doc.get("status"),
            "bytes": doc.get("bytes"), "mode": opts.get("mode"), "read_option": opts.get("read"),
            "read_mode": read_mode, "read_why": why,
            "hash": hash_, "hash_how": hash_how, "concurrency": opts.get("concurrency"),
            "block_size": opts.get("block_size"), "verified": doc.get("verified"), "warmup_s": doc.get("warmup_s")}


def resolved_read(doc: dict) -> tuple[str | None, str]:
    """The read mode the run used and why: its option when concrete, else what it says `auto` picked (the run's
    `read.modes` when one, else its first repeat's `read.mode`); None when it says neither (`ckptbench read` then
    keeps its own default)."""
    mode = doc.get("options", {}).get("read")
    if mode in READ_MODES:
        return mode, "set"
    read = doc.get("read") if isinstance(doc.get("read"), dict) else {}
    repeats = doc.get("repeats") or [{}]
    first = repeats[0].get("read") if isinstance(repeats[0].get("read"), dict) else {}
    modes = read.get("modes") or []
    mode = modes[0] if len(modes) == 1 else first.get("mode")
    return (mode, read.get("why") or first.get("why") or "") if mode in READ_MODES else (None, "not reported")


def resolved_hash(doc: dict) -> tuple[str, str]:
    """The digest the run's read stage computed, and how that is known: none when staged (it hashes in verify);
    else the --hash option; else what the verify note says a run without a manifest did ("not computed", or
    "computed (ALG)"); else crc32c, the default before the run said which."""
    opts = doc.get("options", {})
    if opts.get("mode") == "staged":
        return "none", "staged: the read stage does not hash"
    if opts.get("hash"):
        return opts["hash"], "set"
    note = str((doc.get("notes") or {}).get("verify", ""))
    if "not computed" in note:
        return "none", "its verify note: not computed"
    named = re.search(r"computed \((\w+)\)", note)
    if named:
        return named.group(1), "its verify note"
    return "crc32c", "assumed (the run does not say)"


def read_command(summary: dict, directory: str) -> list[str]:
    """`ckptbench read` over the same files with the read path the run used, cold."""
    cmd = [sys.executable, "-m", "ckptbench", "read", directory, "--json", "--cache", "cold", "--hash",
           summary["hash"]]
    if summary.get("concurrency"):
        cmd += ["--concurrency", str(summary["concurrency"])]
    if summary.get("block_size"):
        cmd += ["--block-size", str(summary["block_size"])]
    if summary.get("read_mode"):
        cmd += ["--read", summary["read_mode"]]
    return cmd


def rotated(items: list, round_index: int) -> list:
    """`items` started at position round_index (mod its length): who goes first changes every round."""
    if not items:
        return []
    k = round_index % len(items)
    return items[k:] + items[:k]


def held(condition: str, residency: float | None) -> bool:
    if residency is None:
        return False
    return residency >= HOT_MIN if condition == "hot" else residency <= COLD_MAX


# --------------------------------------------------------------------------- measurements


@dataclass(kw_only=True)
class PeerSeries(Series):
    """Seconds over repeats of one loader or stage, with each repeat's disk share and check."""

    loader: str
    disk: list[float] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s == "ok" for s in self.status)

    def add(self, seconds: float, residency: float, disk: float | None = None, status: str = "ok") -> None:
        self.samples.append(seconds)
        self.residency.append(residency)
        self.status.append(status)
        if disk is not None:
            self.disk.append(disk)

    def as_dict(self) -> dict:
        return super().as_dict() | {"ok": self.ok}


class Bench:
    def __init__(self, directory: str, meta: dict, repeat: int, peers: list[str], results: str):
        import fastio

        self.fastio = fastio
        self.dir = directory
        self.meta = meta
        self.shards = _loaders.shard_paths(directory)
        self.files = sorted(os.path.join(directory, n) for n in os.listdir(directory))
        self.total = sum(os.path.getsize(p) for p in self.files)
        self.repeat = repeat
        self.peers = peers
        self.results = results
        self.series: dict[str, PeerSeries] = {}
        self.other = _peers.OtherWork()
        self.read_cmd: list[str] | None = None
        self.runs: list[dict] = []  # every ckptbench run summary, for the report's stage table

    def get(self, key: str, condition: str, loader: str) -> PeerSeries:
        if key not in self.series:
            self.series[key] = PeerSeries(key, condition, "s", loader=loader)
        return self.series[key]

    def child(self, cmd: list[str]) -> tuple[dict | None, str, float]:
        """Runs one measurement process; its document, a problem line, and the share of the set it read from
        the disk (the whole process: the timed part and its set-up)."""
        d0 = disk_read_bytes()
        with tempfile.TemporaryDirectory(prefix="ckptbench-peers-") as cwd:
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), cwd=cwd,
                                     timeout=CHILD_TIMEOUT, check=False)
            except subprocess.TimeoutExpired:
                return None, f"timed out after {CHILD_TIMEOUT} s", 0.0
        doc, problem = parse_child(out.returncode, out.stdout, out.stderr)
        return doc, problem, (disk_read_bytes() - d0) / self.total

    def prepare(self, condition: str) -> float:
        """Evicts the files (cold) or reads them into the page cache (hot); their residency after."""
        if condition == "cold":
            self.fastio.evict(self.files)
        else:
            self.fastio.read_files(self.files, concurrency=2, read="pread", hash="none")
        return self.fastio.residency(self.files).fraction

    def peer(self, condition: str, name: str) -> None:
        s = self.get(f"{condition}/{name}", condition, name)
        ref = self.meta["ckptbench_peers"]
        for attempt in range(1, ATTEMPTS + 1):
            log(f"  {condition} {name}" + (f" (attempt {attempt})" if attempt > 1 else ""))
            if not held(condition, self.prepare(condition)):
                continue
            doc, problem, _ = self.child([sys.executable, LOADERS_PY, name, self.dir])
            if doc is None or problem:
                s.problems.append(problem)
                s.status.append("failed")
                return
            res = doc.get("residency_before")
            disk = doc["disk_read_bytes"] / self.total
            if not held(condition, res) or (condition == "hot" and name not in DIRECT_IO and disk > COLD_MAX):
                log(f"    the cache did not hold (residency {res}, {disk:.0%} read from the disk); again")
                continue
            wrong = check_peer(doc, ref, self.meta["total_size"])
            s.problems += wrong
            s.add(doc["seconds"], res, disk, "failed" if wrong else "ok")
            s.extra.setdefault("peak_rss_bytes", []).append(doc.get("peak_rss_bytes"))
            s.extra["versions"] = doc.get("versions")
            return
        s.problems.append(f"a repeat refused: the {condition} cache state did not hold in {ATTEMPTS} attempts")

    def ckptbench(self, condition: str, read_first: bool) -> None:
        """`ckptbench run`; cold, also `ckptbench read` back to back with it, the order alternating per round (on a
        virtual disk whoever reads second may gain from the host's cache)."""
        if condition == "cold" and read_first and self.read_cmd:
            self.read_cold()
            self.run(condition)
            return
        self.run(condition)
        if condition == "cold" and self.read_cmd:
            self.read_cold()

    def run(self, condition: str) -> None:
        s = self.get(f"{condition}/ckptbench", condition, "ckptbench run")
        cmd = [sys.executable, "-m", "ckptbench", "run", self.dir, "--json", "--repeat", "1", "--cache", condition,
               "--results", self.results]
        for attempt in range(1, ATTEMPTS + 1):
            log(f"  {condition} ckptbench run" + (f" (attempt {attempt})" if attempt > 1 else ""))
            if condition == "hot":
                self.prepare("hot")  # so its own pre-read is served from the cache and the disk share means the run
            doc, problem, disk = self.child(cmd)
            if doc is None:
                s.problems.append(problem)
                s.status.append("failed")
                return
            r = run_summary(doc)
            if not held(condition, r["residency"]) or (condition == "hot" and disk > COLD_MAX):
                log(f"    the cache did not hold (residency {r['residency']}, {disk:.0%} read from the disk); again")
                continue
            status = "ok" if r["status"] == "ok" and not problem and r["bytes"] == self.total else "failed"
            if status != "ok":
                s.problems.append(f"status {r['status']}, {problem or 'exit 0'}, read {r['bytes']} of {self.total} B")
            s.add(r["rto"], r["residency"], disk, status)
            for stage in ("read", "check"):
                if r[stage] is not None:
                    self.get(f"{condition}/ckptbench/{stage}-stage", condition, f"ckptbench run: {stage} stage").add(
                        r[stage], r["residency"], None, status)
            self.runs.append({"condition": condition} | r)
            if condition == "cold" and self.read_cmd is None:
                self.read_cmd = read_command(r, self.dir)
            return
        s.problems.append(f"a repeat refused: the {condition} cache state did not hold in {ATTEMPTS} attempts")

    def read_cold(self) -> None:
        s = self.get("cold/ckptbench/read", "cold", "ckptbench read")
        for attempt in range(1, ATTEMPTS + 1):
            log("  cold ckptbench read" + (f" (attempt {attempt})" if attempt > 1 else ""))
            doc, problem, disk = self.child(self.read_cmd)
            if doc is None:
                s.problems.append(problem)
                s.status.append("failed")
                return
            res = doc.get("cache", {}).get("residency_before")
            if not held("cold", res):
                continue
            wrong = check_read(doc, self.meta["ckptbench_peers"]["crc32c"], self.total)
            wrong += [problem] if problem else []
            s.problems += wrong
            s.add(doc["seconds"], res, disk, "failed" if wrong else "ok")
            return
        s.problems.append(f"a repeat refused: the cold cache state did not hold in {ATTEMPTS} attempts")

    def round(self, i: int) -> None:
        """One repeat of everything: cold then hot, each in an order rotated by the round."""
        entries = ["ckptbench", *self.peers]
        for condition in ("cold", "hot"):
            for name in rotated(entries, i):
                if name == "ckptbench":
                    self.ckptbench(condition, read_first=bool(i % 2))
                else:
                    self.peer(condition, name)


def disk_read_bytes() -> int:
    """Bytes the waited-for children made the kernel read from a block device (ru_inblock, 512-byte units)."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512


def check_peer(doc: dict, ref: dict, total_size: int) -> list[str]:
    """What is wrong with a peer's state dict against the generator's: checksum, tensor count, bytes."""
    out = []
    if doc.get("checksum") != ref["checksum"]:
        out.append(f"{doc.get('loader')}: checksum of sampled values {doc.get('checksum')} != {ref['checksum']}")
    if doc.get("tensors") != ref["tensors"]:
        out.append(f"{doc.get('loader')}: {doc.get('tensors')} tensors, the checkpoint has {ref['tensors']}")
    if doc.get("bytes") != total_size:
        out.append(f"{doc.get('loader')}: {doc.get('bytes')} tensor bytes, the checkpoint has {total_size}")
    return out


def check_read(doc: dict, crc: dict[str, str], total: int) -> list[str]:
    """What is wrong with a `ckptbench read`: a failed file, fewer bytes than the directory holds, a shard whose
    crc32c is not the generator's (when it hashed crc32c)."""
    out = [f"{doc['files_failed']} file(s) failed"] if doc.get("files_failed") else []
    if doc.get("bytes") != total:
        out.append(f"read {doc.get('bytes')} bytes, the directory holds {total}")
    if doc.get("hash") != "crc32c":
        return out
    got = {os.path.basename(f["path"]): f.get("digest") for f in doc.get("files", [])}
    return out + [f"{n}: crc32c {got.get(n)} != {want}" for n, want in sorted(crc.items()) if got.get(n) != want]


# --------------------------------------------------------------------------- targets and report


def fastest_peer(series: dict[str, Series], condition: str, peers: list[str]) -> str | None:
    """The key of the peer with the lowest median time under `condition`, or None when none was measured."""
    measured = [series[k] for k in (f"{condition}/{p}" for p in peers) if k in series and series[k].samples]
    return min(measured, key=lambda s: s.median).key if measured else None


def targets(series: dict[str, Series], peers: list[str]) -> list[Target]:
    out = []
    for condition, low in (("hot", HOT_SPEEDUP), ("cold", COLD_SPEEDUP)):
        peer = fastest_peer(series, condition, peers)
        name = peer.split("/", 1)[1] if peer else "none measured"
        out.append(Target(f"{condition}: ckptbench run ≥ {low:g}× faster than the fastest peer, {name} (peer median / "
                          "ckptbench median RTO)", f"{condition}/ckptbench", peer or f"{condition}/none", low=low,
                          invert=True, shown="{:.3f}×"))  # 1.297 must not print as a met-looking 1.30
    out.append(Target(f"cold: the run's read stage within ±15 % of `ckptbench read` on the same files with the same "
                      f"read path (paired ratio in {READ_BAND[0]}..{READ_BAND[1]})", "cold/ckptbench/read-stage",
                      "cold/ckptbench/read", low=READ_BAND[0], high=READ_BAND[1], paired=True, shown="{:.3f}×"))
    out.append(Target(f"cold: check stage ≤ {CHECK_MAX:g}× read stage (paired)", "cold/ckptbench/check-stage",
                      "cold/ckptbench/read-stage", high=CHECK_MAX, paired=True, shown="{:.3f}×"))
    return out


def verdict_lines(verdicts: list[dict]) -> list[str]:
    word = {"met": "PASS", "MISSED": "MISS"}
    return [f"{word.get(v['status'], v['status'])}: {v['target']}" + (f" — {v['detail']}" if v.get("detail") else "")
            for v in verdicts]


def ratio_cell(series: dict[str, PeerSeries], s: PeerSeries) -> str:
    """peer median / ckptbench median on a peer's row; the paired ratios on the read and check rows."""
    cond = s.condition
    if s.key == f"{cond}/ckptbench":
        return "reference"
    pairs = {f"{cond}/ckptbench/read": (f"{cond}/ckptbench/read-stage", "read stage / read = {:.3f}×"),
             f"{cond}/ckptbench/check-stage": (f"{cond}/ckptbench/read-stage", "check / read stage = {:.3f}×")}
    if s.key in pairs:
        other, text = pairs[s.key]
        subject, peer = (other, s.key) if s.key.endswith("/read") else (s.key, other)
        v = judge(Target("", subject, peer, paired=True), series)["value"]
        return text.format(v) if v is not None else "—"
    ref = series.get(f"{cond}/ckptbench")
    if s.loader in _loaders.LOADERS and ref is not None and ref.median and s.median:
        return f"{s.median / ref.median:.2f}× ckptbench"
    return "—"


def table(b: Bench) -> list[str]:
    tensor_bytes = b.meta["total_size"]

    def cells(s: PeerSeries) -> list[str]:
        gbps = fmt(tensor_bytes / s.median / 1e9, 2) if s.median else "—"
        disk = "/".join(f"{d:.2f}" for d in s.disk) if s.disk else "—"
        check = "ok" if s.ok and not s.problems else ("CHECK FAILED: " if not s.ok else "") + "; ".join(s.problems[:2])
        return [gbps if s.loader in _loaders.LOADERS or s.key.endswith("/ckptbench") else "—", ratio_cell(b.series, s),
                disk, check]

    order = [f"{c}/{k}" for c in ("cold", "hot") for k in ("ckptbench", *b.peers, "ckptbench/read-stage",
                                                            "ckptbench/read", "ckptbench/check-stage")]
    rows = [b.series[k] for k in order if k in b.series]
    return series_table(rows, ("condition", "loader", "median s", "min–max", "GB/s (tensor bytes)", "ratio",
                               "disk share per repeat", "check"), lambda s: s.loader, lambda s, v: fmt(v, 3), cells)


def stage_table(b: Bench) -> list[str]:
    import statistics

    stages = ("list", "read", "verify", "load", "device", "check")
    rows = ["| stage | cold median s | hot median s |", "|---|---:|---:|"]
    for stage in (*stages, "rto"):
        cells = []
        for cond in ("cold", "hot"):
            vals = [r["rto"] if stage == "rto" else r["stages"].get(stage) for r in b.runs if r["condition"] == cond]
            vals = [v for v in vals if v is not None]
            cells.append(f"{statistics.median(vals):.3f}" if vals else "—")
        rows.append(f"| {'**RTO**' if stage == 'rto' else stage} | " + " | ".join(cells) + " |")
    return rows


def notes(b: Bench) -> list[str]:
    first = b.runs[0] if b.runs else {}
    chosen = {c: next((r for r in b.runs if r["condition"] == c), None) for c in ("cold", "hot")}
    read = "; ".join(f"{c}: {r['read_mode']} ({r['read_why']})" for c, r in chosen.items() if r)
    out = [
        "Every measurement is a fresh process. ckptbench: `ckptbench run DIR --json --repeat 1 --cache cold|hot` with "
        f"its defaults: mode {first.get('mode')}, read-stage hash {first.get('hash')} ({first.get('hash_how')}), "
        f"concurrency {first.get('concurrency')}, "
        f"block {first.get('block_size')} B, read {first.get('read_option')}, which it resolved as {read}. Its RTO "
        "(list + read + verify + load + device + check) is taken from the JSON; its warm-up (imports, torch's first "
        "operations) is outside the RTO.",
        "Peers: bench/_loaders.py imports the loader, loads a tiny file through it once (its first-use costs, like "
        "ckptbench's warm-up), then times from listing the shards (the index) to a state dict of owned CPU tensors "
        "with every byte in memory. " + " ".join(f"{n}: {' '.join((_loaders.PREPARE[n].__doc__ or '').split())}"
                                                 for n in b.peers),
        "Same tensors: each peer's checksum (sha256 over every tensor's name, dtype, shape and "
        f"{_loaders.SAMPLES} sampled values) is compared with the generator's, with the tensor count and bytes; "
        "`ckptbench read`'s bytes with the directory's and, when it hashes crc32c, its per-file digests with the "
        "generator's. A mismatch marks the row CHECK FAILED.",
        f"`ckptbench read` command (the cold run's read path): `{' '.join(b.read_cmd[2:]) if b.read_cmd else '—'}`; "
        "its time is the read's own wall time. It reads into reused buffers, the run's read stage into the memory "
        "the state dict is built over; the cold run and the read run back to back, the order alternating per round.",
        f"cold: the files evicted (fastio.evict) and residency ≤ {COLD_MAX} checked after the eviction and again in "
        "the child right before its clock (ckptbench run and read evict and check themselves and report it); hot: "
        f"the files read into the page cache and residency ≥ {HOT_MIN} checked the same way, and a hot repeat of a "
        f"page-cache reader (ckptbench, safetensors) that read over {COLD_MAX:.0%} of the set from the disk is run "
        f"again; a repeat whose cache state did not hold in {ATTEMPTS} attempts is refused, not reported.",
        "fastsafetensors (nogds) and Run:ai read with O_DIRECT by default: they bypass the page cache, so their hot "
        "repeats read from the device as their cold ones do (see the disk share column: the child's ru_inblock "
        "over its timed load, for peers; the whole process for ckptbench run). That is their default behaviour and "
        "is measured as such.",
        f"Bytes: the peers read the shards' {b.meta['total_size'] / MiB:.1f} MiB of tensors; ckptbench reads every "
        f"file in the directory ({b.total / MiB:.1f} MiB with headers and the index). GB/s in the table is tensor "
        "bytes / median seconds.",
        f"Order: each round runs cold then hot, the loaders' order rotated each round; {b.repeat} round(s).",
        b.other.line(),
    ]
    versions = next((s.extra["versions"] for s in b.series.values() if s.extra.get("versions")), None)
    if versions:
        out.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    rss = {s.key: max(r for r in s.extra["peak_rss_bytes"] if r) for s in b.series.values()
           if any(s.extra.get("peak_rss_bytes", []))}
    if rss:
        out.append("Peers' peak RSS (the child's ru_maxrss, largest over repeats): "
                   + ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in rss.items()) + ".")
    return out


def report(b: Bench, verdicts: list[dict], args, date: str, facts: dict | None = None) -> str:
    spec = b.meta["ckptbench_peers"]["spec"]
    lines = ["# ckptbench against the loaders users pick instead", ""]
    lines += preface(date, facts) if facts else [f"Date: {date}", ""]
    lines += [f"Checkpoint: foreign safetensors (no manifest), {spec['layers']} layers of bf16 MLP weights (hidden "
              f"{spec['hidden']}, intermediate {spec['intermediate']}), {b.meta['ckptbench_peers']['tensors']} tensors, "
              f"{b.meta['total_size'] / GiB:.2f} GiB in {len(b.shards)} shard(s) + index, `{b.dir}`; median of "
              f"{b.repeat} round(s){' (--quick)' if args.quick else ''}; GB = 10^9 bytes.", ""]
    lines += table(b)
    lines += ["", "ckptbench run's stages (median seconds):", ""] + stage_table(b)
    lines += section("Targets", verdict_lines(verdicts)) + section("Notes", notes(b))
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=None, help="checkpoint size (default 4; 0.25 with --quick)")
    ap.add_argument("--dir", default=None, help="where the checkpoint lives (generated once, reused while its index "
                    "matches); default $XDG_CACHE_HOME or ~/.cache + /ckptbench/bench-peers-SIZEg")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (default 5; 1 with --quick)")
    ap.add_argument("--peers", default=",".join(_loaders.LOADERS), help="comma-separated peers (default all: "
                    + ", ".join(_loaders.LOADERS) + ")")
    ap.add_argument("--quick", action="store_true", help="a 256 MiB checkpoint, 1 round")
    args = ap.parse_args(argv)
    args.size_gib = args.size_gib if args.size_gib is not None else (0.25 if args.quick else 4.0)
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    args.peers = [p for p in args.peers.split(",") if p]
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.size_gib <= 0:
        ap.error("--size-gib must be positive")
    unknown = [p for p in args.peers if p not in _loaders.LOADERS]
    if unknown:
        ap.error(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(_loaders.LOADERS)}")
    args.dir = args.dir or cache_dir(f"bench-peers-{args.size_gib:g}g")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modules = {"safetensors": "safetensors", "fastsafetensors": "fastsafetensors", "runai": "runai_model_streamer"}
    problem = missing("peers_bench", modules=("fastio", "torch", *(modules[p] for p in args.peers)),
                      install="pip install -c constraints.txt -e '.[bench]'")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    meta, problem = _foreign.ensure_checkpoint(args.dir, _foreign.layout(int(args.size_gib * GiB)))
    if meta is None:
        print(problem, file=sys.stderr)
        return 2
    date = utc_now()
    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    os.makedirs(OUT_DIR, exist_ok=True)
    results = os.path.join(OUT_DIR, f"peers_bench-{stamp}-results.csv")
    b = Bench(args.dir, meta, args.repeat, args.peers, results)
    t0 = time.monotonic()
    for i in range(args.repeat):
        log(f"round {i + 1} of {args.repeat}")
        b.round(i)
    elapsed = time.monotonic() - t0
    log(f"done in {elapsed:.0f} s")
    verdicts = [judge(t, b.series) for t in targets(b.series, args.peers)]
    print(report(b, verdicts, args, date), end="")
    facts = machine(args.dir) | {"peer_versions": _loaders.versions()}
    record = {"date": date, "elapsed_s": elapsed, "machine": facts, "args": vars(args),
              "checkpoint": {"dir": args.dir, "files": len(b.files), "bytes": b.total, "tensor_bytes": meta["total_size"],
                             **meta["ckptbench_peers"]},
              "measurements": [s.as_dict() for s in b.series.values()], "targets": verdicts,
              "ckptbench_runs": b.runs, "read_command": b.read_cmd, "other_work_core_s": b.other.share()[0],
              "results_csv": results, "root": ROOT}
    write_outputs(f"peers_bench-{stamp}", report(b, verdicts, args, date, facts), record)
    log(f"wrote {OUT_DIR}/peers_bench-{stamp}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
