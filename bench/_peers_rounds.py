"""The peers benchmark's rounds: every loader and ckptbench once per round, cold then hot, each measurement a fresh
process after the page cache was set and checked; a repeat whose cache state did not hold is run again."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import _floor_bench
import _loaders
import _peers
from _harness import (COLD_MAX, CheckedSeries, child_env, disk_read_bytes, held, log, make_cold, make_hot, rotated,
                      settle)
from _floor_c import word_sum
from _peers_docs import check_peer, check_read, parse_child, read_command, run_summary

ATTEMPTS = 3  # a repeat whose cache state did not hold is run again, this often, then refused
DIRECT_IO = {"fastsafetensors", "runai"}  # read with O_DIRECT by default: the page cache is bypassed, hot or cold
LOADERS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_loaders.py")
CHILD_TIMEOUT = 900
C_LOOP = "plain C loop"  # no loader: the set's bytes landed in fresh memory by plain code, ckptbench's read path
INCIDENTAL = 8 << 20  # bytes a fresh process may read from the disk besides the set before a hot repeat counts as
# having read the set from it (0.2 % of the 4 GiB set)


@dataclass(kw_only=True)
class PeerSeries(CheckedSeries):
    """Seconds over repeats of one loader or stage, with each repeat's disk share and check."""

    loader: str

    def add(self, seconds: float, residency: float, disk: float | None = None, status: str = "ok",
            probe: float | None = None) -> None:
        """`probe`: the fresh-memory figure measured right before this repeat (_floor_bench.probe), where paired."""
        if probe is not None:
            self.extra.setdefault("probe_gbps", []).append(probe)
        self.samples.append(seconds)
        self.residency.append(residency)
        self.status.append(status)
        if disk is not None:
            self.disk.append(disk)

    def as_dict(self) -> dict:
        return super().as_dict() | {"ok": self.ok}


class Bench:
    def __init__(self, directory: str, meta: dict, repeat: int, peers: list[str], results: str, pair: bool = True):
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
        self.floor = None  # ckptbench.system.floor.Floor, measured in this run on these files
        self.floors: dict[str, dict] = {}  # the set's floor per condition (_floor_bench.models)
        self.c_loop: str | None = None  # the built C landing loop (_floor_c.LAND_C), when there is a compiler
        self.c_sum: int | None = None  # the files' word sum, its check
        self.pair = pair  # each repeat paired with a probe of fresh memory right before it (_floor_bench.probe)
        self.probe: float | None = None  # the probe before the repeat about to run

    def get(self, key: str, condition: str, loader: str) -> PeerSeries:
        if key not in self.series:
            self.series[key] = PeerSeries(key, condition, "s", loader=loader)
        return self.series[key]

    def child(self, cmd: list[str]) -> tuple[dict | None, str, float]:
        """Runs one measurement process; its document, a problem line, and the share of the set it read from
        the disk (the whole process: the timed part and its set-up)."""
        d0 = disk_read_bytes(children=True)
        with tempfile.TemporaryDirectory(prefix="ckptbench-peers-") as cwd:
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), cwd=cwd,
                                     timeout=CHILD_TIMEOUT, check=False)
            except subprocess.TimeoutExpired:
                return None, f"timed out after {CHILD_TIMEOUT} s", 0.0
        doc, problem = parse_child(out.returncode, out.stdout, out.stderr)
        return doc, problem, (disk_read_bytes(children=True) - d0) / self.total

    def read_the_set(self, disk: float) -> bool:
        """A whole process's disk share (child) past what a hot repeat allows: COLD_MAX of the set beyond what any
        fresh Python reads of its own (modules the box let go of: 0.1-2 MB here, over a tenth of the quick run's 2 MB
        set, whose hot repeats were all refused as read from the disk)."""
        return disk * self.total > COLD_MAX * self.total + INCIDENTAL

    def prepare(self, condition: str) -> float:
        """Evicts the files (cold) or reads them into the page cache (hot), then settles (the memory freed before
        goes back to the host, for every contender alike); their residency after."""
        res = make_cold(self.files) if condition == "cold" else make_hot(self.files)
        settle()
        self.probe = None
        # cold too: a cold restore lands the set in fresh memory as a hot one does, and the host's fresh memory drifts
        # the same (run 27: the hot probes met 1.37 GB/s against 6.11 in the floor measured once; the cold floor,
        # measured once, was storage-bound, while its rounds met fresh memory that alone took longer than it)
        if self.pair:  # then settled again: the probe's memory goes back as a run's does
            self.probe = _floor_bench.probe(self.total)
            settle()
        return res

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
            s.add(doc["seconds"], res, disk, "failed" if wrong else "ok", self.probe)
            s.extra.setdefault("peak_rss_bytes", []).append(doc.get("peak_rss_bytes"))
            s.extra["versions"] = doc.get("versions")
            return
        s.problems.append(f"a repeat refused: the {condition} cache state did not hold in {ATTEMPTS} attempts")

    def plain_c(self, condition: str) -> None:
        """The set landed by plain C the way ckptbench's read resolves it (cold: O_DIRECT into fresh pages; hot: each
        64 MiB unit populated, then pread out of the page cache), at ckptbench run's concurrency, in a fresh
        process under the same cache state as every row: what the floor's model says plain code can reach here,
        measured in the same minutes as the loaders. It builds no tensors and scans nothing."""
        s = self.get(f"{condition}/c-loop", condition, C_LOOP)
        level = next((r["concurrency"] for r in self.runs if r.get("concurrency")), None) or 8
        for attempt in range(1, ATTEMPTS + 1):
            log(f"  {condition} {C_LOOP}, {level} thread(s)" + (f" (attempt {attempt})" if attempt > 1 else ""))
            res = self.prepare(condition)
            if not held(condition, res):
                continue
            d0 = disk_read_bytes(children=True)
            out = subprocess.run([self.c_loop, str(level), "direct" if condition == "cold" else "populate",
                                  *self.files], capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
            disk = (disk_read_bytes(children=True) - d0) / self.total
            words = out.stdout.split()
            if out.returncode or len(words) != 3 or int(words[1]) != self.total:
                s.problems.append(f"exit {out.returncode}: {(out.stderr.strip() or out.stdout.strip())[-200:]}")
                s.status.append("failed")
                return
            if self.c_sum is None:
                self.c_sum = word_sum(self.files)  # once, after the loop's first run: never inside a cache state
            if int(words[2]) != self.c_sum:
                s.problems.append("the bytes it landed are not the files' (word sum differs)")
                s.add(self.total / float(words[0]), res, disk, "failed", self.probe)
                return
            if condition == "hot" and self.read_the_set(disk):
                log(f"    the cache did not hold ({disk:.0%} read from the disk); again")
                continue
            s.add(self.total / float(words[0]), res, disk, probe=self.probe)
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
        # the cache state made here, as for every contender (settled after the eviction's free), and kept by the run
        # (as-is): `--cache cold` evicted inside the run, right before its clock, where the freed pages come back
        # faster than any other contender's; it still reports and checks the residency it found
        cmd = [sys.executable, "-m", "ckptbench", "run", self.dir, "--json", "--repeat", "1", "--cache", "as-is",
               "--results", self.results]
        for attempt in range(1, ATTEMPTS + 1):
            log(f"  {condition} ckptbench run" + (f" (attempt {attempt})" if attempt > 1 else ""))
            self.prepare(condition)  # hot: its own pre-read is served from the cache and the disk share means the run
            doc, problem, disk = self.child(cmd)
            if doc is None:
                s.problems.append(problem)
                s.status.append("failed")
                return
            r = run_summary(doc)
            if not held(condition, r["residency"]) or (condition == "hot" and self.read_the_set(disk)):
                log(f"    the cache did not hold (residency {r['residency']}, {disk:.0%} read from the disk); again")
                continue
            # a foreign checkpoint has no manifest: its restore is unverified, and timed all the same
            done = r["status"] in ("ok", "unverified")
            status = "ok" if done and not problem and r["bytes"] == self.total else "failed"
            if status != "ok":
                s.problems.append(f"status {r['status']}, {problem or 'exit 0'}, read {r['bytes']} of {self.total} B")
            s.add(r["rto"], r["residency"], disk, status, self.probe)
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
        entries = ["ckptbench", *self.peers, *([C_LOOP] if self.c_loop else [])]
        for condition in ("cold", "hot"):
            for name in rotated(entries, i):
                if name == "ckptbench":
                    self.ckptbench(condition, read_first=bool(i % 2))
                elif name == C_LOOP:
                    self.plain_c(condition)
                else:
                    self.peer(condition, name)
