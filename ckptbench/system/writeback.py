"""The write side of the page cache while checkpoints are saved: Dirty and Writeback against the kernel's dirty
limits, and the target's block device (write MB/s, %util, w_await), sampled on a thread every 250 ms."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ckptbench.system import probes

INTERVAL_S = 0.25
SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size


@dataclass(frozen=True)
class WritebackSample:
    t: float  # seconds since the sampler started
    dirty_bytes: int
    writeback_bytes: int
    dirty_limit_bytes: int
    dirty_background_bytes: int
    write_mbps: float | None  # the target's block device; None when it has none (tmpfs, FUSE)
    util_pct: float | None
    w_await_ms: float | None


@dataclass(frozen=True)
class WriteCounters:
    """The write half of a /proc/diskstats line."""

    writes: int
    sectors_written: int
    write_ms: int
    io_ms: int


def write_counters(device: str, root: str = "/") -> WriteCounters | probes.Unknown:
    """The write counters of block device major:minor (a partition has its own line)."""
    c = probes.diskstats_line(device, root)
    if isinstance(c, probes.Unknown):
        return probes.Unknown(f"no diskstats line for {device} (no block device: tmpfs, FUSE, network)")
    return WriteCounters(c[4], c[6], c[7], c[9])


def dirty_limits(mem: dict[str, int], root: str = "/") -> tuple[int, int]:
    """(dirty limit, background limit) in bytes, as the kernel computes them (mm/page-writeback.c): vm.dirty_bytes
    when set, else vm.dirty_ratio % of dirtyable memory, which is free pages plus the file cache, not MemTotal."""
    dirtyable = mem.get("MemFree", 0) + mem.get("Active(file)", 0) + mem.get("Inactive(file)", 0)

    def limit(bytes_name: str, ratio_name: str, default_ratio: int) -> int:
        fixed = probes.sysctl(bytes_name, root)
        if isinstance(fixed, int) and fixed > 0:
            return fixed
        ratio = probes.sysctl(ratio_name, root)
        return dirtyable * (ratio if isinstance(ratio, int) else default_ratio) // 100

    hard = limit("vm.dirty_bytes", "vm.dirty_ratio", 20)
    background = limit("vm.dirty_background_bytes", "vm.dirty_background_ratio", 10)
    if background >= hard:  # the kernel halves the background limit when it is not below the hard one
        background = hard // 2
    return hard, background


def device_of(target_dir: str, root: str = "/") -> str | None:
    """major:minor of the block device under `target_dir`, None when the mount has no diskstats line."""
    m = probes.mount_of(target_dir, root)
    if not isinstance(m, probes.Mount):
        return None
    return m.device if isinstance(write_counters(m.device, root), WriteCounters) else None


class WritebackSampler:
    """A thread that samples every `interval` seconds until stop(); the samples are kept in order."""

    def __init__(self, target_dir: str, interval: float = INTERVAL_S, root: str = "/", on_sample=None):
        self.target_dir, self.interval, self.root, self.on_sample = target_dir, interval, root, on_sample
        self.device = device_of(target_dir, root)
        self.samples: list[WritebackSample] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._first: WriteCounters | None = None
        self._last: WriteCounters | None = None

    def start(self) -> "WritebackSampler":
        self._t0 = self._prev_t = time.perf_counter()
        self._prev = self._counters()
        self._first = self._prev
        self._thread = threading.Thread(target=self._loop, name="ckptbench-writeback", daemon=True)
        self._thread.start()
        return self

    def _counters(self) -> WriteCounters | None:
        if self.device is None:
            return None
        c = write_counters(self.device, self.root)
        return c if isinstance(c, WriteCounters) else None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> WritebackSample:
        """Takes one sample now (the thread calls this; tests may too)."""
        now = time.perf_counter()
        mem = probes.meminfo(self.root)
        mem = mem if isinstance(mem, dict) else {}
        hard, background = dirty_limits(mem, self.root)
        cur = self._counters()
        mbps = util = w_await = None
        dt = now - self._prev_t
        if cur is not None and self._prev is not None and dt > 0:
            mbps = (cur.sectors_written - self._prev.sectors_written) * SECTOR / dt / 1e6
            util = min(100.0, (cur.io_ms - self._prev.io_ms) / (dt * 1000) * 100)
            writes = cur.writes - self._prev.writes
            w_await = (cur.write_ms - self._prev.write_ms) / writes if writes else 0.0
        s = WritebackSample(now - self._t0, mem.get("Dirty", 0), mem.get("Writeback", 0), hard, background,
                            mbps, util, w_await)
        with self._lock:
            self.samples.append(s)
            self._prev, self._prev_t = cur, now
            self._last = cur
        if self.on_sample is not None:
            self.on_sample(s)
        return s

    def clock(self) -> float:
        """Seconds since start(), on the clock the samples' `t` is on."""
        return time.perf_counter() - self._t0

    def between(self, after: float, until: float) -> list[WritebackSample]:
        """The samples taken after `after` and up to `until` (clock() values): one save's share of the series."""
        with self._lock:
            return [s for s in self.samples if after < s.t <= until]

    def latest(self) -> WritebackSample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    def sectors_written_bytes(self) -> int | None:
        """Bytes the device took since start() (up to the last sample); None without a block device."""
        if self._first is None or self._last is None:
            return None
        return (self._last.sectors_written - self._first.sectors_written) * SECTOR

    def stop(self) -> list[WritebackSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # the tail after the last tick: the device's count ends here
        with self._lock:
            return list(self.samples)
