"""Live system figures for a dashboard: limits, dirty pages, read-ahead, CPU, memory, disk and TCP rates.

A SystemSampler keeps the previous counters so rates come from deltas between two samples.
`ckptbench sysinfo SOURCE --json` prints the same figures headless.
"""

from __future__ import annotations

import time
from collections import deque

import psutil

from ckptbench.core.progress import eta_s
from ckptbench.system import probes
from ckptbench.system.floor import populate_rate


def _plain(v):
    return None if isinstance(v, probes.Unknown) else v


class SystemSampler:
    def __init__(self, source: str, root: str = "/"):
        self.source = source
        self.root = root
        self.mount = probes.mount_of(source, root)
        self.proc = psutil.Process()
        self._disk = None
        self._tcp = None
        self._t = None
        psutil.cpu_percent(percpu=True)  # primes the per-core counters

    def sample(self) -> dict:
        now = time.perf_counter()
        m = self.mount if isinstance(self.mount, probes.Mount) else None
        mem = probes.meminfo(self.root)
        mem = mem if isinstance(mem, dict) else {}
        nofile = probes.ulimit_nofile(self.root)
        disk = probes.diskstats(m.device, self.root) if m else probes.Unknown("no mount")
        tcp = probes.tcp_counters(self.root)
        out = {
            "source": self.source,
            "fs_type": m.fs_type if m else None,
            "mount_point": m.mount_point if m else None,
            "mount_options": m.options if m else None,
            "ulimit_nofile": list(nofile) if isinstance(nofile, tuple) else None,
            "fds_in_use": _plain(probes.fds_in_use(self.root)),
            "dirty_ratio": _plain(probes.sysctl("vm.dirty_ratio", self.root)),
            "dirty_background_ratio": _plain(probes.sysctl("vm.dirty_background_ratio", self.root)),
            "dirty_bytes": mem.get("Dirty"),
            "writeback_bytes": mem.get("Writeback"),
            "mem_available_bytes": mem.get("MemAvailable"),
            "rss_bytes": self.proc.memory_info().rss,
            "read_ahead_kb": _plain(probes.read_ahead_kb(m.device, self.root)) if m else None,
            "cpu_pct_per_core": psutil.cpu_percent(percpu=True),
            "disk_util_pct": None,
            "disk_await_ms": None,
            "tcp_retransmit_pct": None,
        }
        if self._t is not None and now > self._t:
            if isinstance(disk, probes.DiskStats) and isinstance(self._disk, probes.DiskStats):
                d = probes.disk_util(self._disk, disk, now - self._t)
                out["disk_util_pct"], out["disk_await_ms"] = d["util_pct"], d["await_ms"]
            if isinstance(tcp, dict) and isinstance(self._tcp, dict):
                out["tcp_retransmit_pct"] = probes.retransmit_rate(self._tcp, tcp) * 100
        self._disk, self._tcp, self._t = disk, tcp, now
        return out


class LiveRates:
    """Now / average / peak GB/s and worker busy % from successive read snapshots (the progress line's figures).

    Rates are taken on the reader's own clock (`elapsed_s`, first byte to now), the clock the average uses, so
    the intervals tile the average's span and the peak cannot read below the average. A finished read's clock
    stops at its last byte, which can fall before the previous poll: the points after it are dropped and the
    rate is taken from the last point before it, so the intervals still tile."""

    KEEP = 16  # points kept for that step back; a longer one falls back to the start of the read

    def __init__(self) -> None:
        self.points: deque[tuple[float, int]] = deque(maxlen=self.KEEP)
        self.peak = 0.0

    def update(self, snap) -> dict:
        while self.points and self.points[-1][0] >= snap.elapsed_s and self.points[-1][1] <= snap.bytes:
            if self.points[-1][0] == snap.elapsed_s and self.points[-1][1] == snap.bytes:
                break  # the same point again: nothing new
            self.points.pop()
        t_prev, b_prev = self.points[-1] if self.points else (0.0, 0)
        now = 0.0
        if snap.elapsed_s > t_prev:
            now = max(0.0, (snap.bytes - b_prev) / (snap.elapsed_s - t_prev) / 1e9)
            self.points.append((snap.elapsed_s, snap.bytes))
        self.peak = max(self.peak, now)
        busy = snap.worker_busy_s
        busy_pct = sum(busy) / (len(busy) * snap.elapsed_s) * 100 if busy and snap.elapsed_s else 0.0
        eta = None if snap.finished else eta_s(snap.bytes, snap.bytes_planned, snap.elapsed_s)
        return {"now_gbps": now, "avg_gbps": snap.gbps, "peak_gbps": self.peak, "busy_pct": min(100.0, busy_pct),
                "latency_p50_us": snap.latency_us(0.5), "latency_p99_us": snap.latency_us(0.99), "eta_s": eta,
                "files": snap.files_done + snap.files_failed, "files_total": snap.files_total,
                "errors": snap.files_failed, "retries": snap.retries, "active_workers": snap.active_workers,
                "concurrency": snap.concurrency, "bytes": snap.bytes, "bytes_planned": snap.bytes_planned,
                # the rate the box gives fresh memory at so far, per core (None under floor.MET_MIN_BYTES, or where
                # nothing is populated: O_DIRECT, reused blocks, an object store's reader)
                "fresh_gbps_per_core": populate_rate(getattr(snap, "populated_bytes", 0),
                                                     getattr(snap, "populate_cpu_s", 0.0))}
