"""Watching a restore ckptbench did not start: samples of the user's job every interval, the phases they show
(phases.py), and (verdict.py) why it is slow. Runs in the caller's thread, cancellable; the UI or CLI only renders.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from ckptbench import mark
from ckptbench.restore.efficiency import HOT
from ckptbench.system import probes
from ckptbench.system import procstat
from ckptbench.watch.maps import FileJudge, MapReader
from ckptbench.watch.maps import is_checkpoint_file  # noqa: F401  the screen's live count reaches it here
from ckptbench.watch.pages import PageLedger, files_under
from ckptbench.watch.phases import (Interval, interval_of, live_phase, merge_phases, start_phase, started_by,
                                    window_bytes, with_gpu)
from ckptbench.watch.window import Window, finer, reading_window
from ckptbench.core.errors import CkptbenchError, redact

STEPS = 8  # parts of a sampling interval at which the job's byte counters alone are read: a load over two samples
STEP_MIN_S = 0.03  # is timed by them, not by the two intervals' rates
GPU_EVERY_S = 0.5  # nvidia-smi takes tens of milliseconds: asked at most this often


@dataclass
class WatchReport:
    pid: int
    command: str
    wall_s: float
    bytes: int
    disk_bytes: int
    files: dict[str, int]  # checkpoint-looking files the job had open or mapped -> size
    intervals: list[Interval]
    phases: list[dict]  # merged runs: {"phase", "t0", "t1"}
    marks: list[dict] = field(default_factory=list)  # {"stage", "t"} from the job's CKPTBENCH_MARK file
    positions: dict[str, int] = field(default_factory=dict)  # furthest offset seen per file (0: pread or mmap)
    peak_rss_bytes: int = 0
    cpu_s: float = 0.0
    majflt: int = 0
    exit_code: int | None = None
    tcp_retransmit_rate: float | None = None  # the whole machine's: /proc/net/snmp does not split by process
    sockets_peak: int = 0  # the most sockets the job had open: none, and retransmits are someone else's
    ended: str = "exited"  # exited | cancelled
    gpu_peak_bytes: int | None = None  # the most GPU memory the job held (nvidia-smi); None where not sampled
    gpu_note: str = ""  # why GPU memory is missing or may read zero
    mapped: list[str] = field(default_factory=list)  # of `files`, those the job mapped (read by page faults)
    residency_first: dict[str, float] = field(default_factory=dict)  # each file's page-cache share when first seen
    unseen: list[str] = field(default_factory=list)  # of `files`, those never seen held: read between two samples
    counted_bytes: int = 0  # what the job's counters (read calls, its mappings' pages, the disk) saw in the window
    arrived_bytes: int = 0  # what came into the page cache of the checkpoint's files while watched (pages.py)
    files_bytes: int = 0  # per checkpoint file, the larger of what came into its mappings and its page cache, summed
    interval_s: float | None = None  # the sampling interval asked for
    source: str | None = None  # the checkpoint --source named (its own key in a document: "checkpoint")

    @property
    def hot(self) -> bool | None:
        """Whether the job read its files from the page cache: they were 90 % cached when first seen and the disk
        did not deliver most of what the job got (a fast loader may have read a cold file before it was seen);
        None when no file was seen."""
        sizes = {p: self.files.get(p, 0) for p in self.residency_first}
        total = sum(sizes.values())
        if not total:
            return None
        cached = sum(self.residency_first[p] * n for p, n in sizes.items()) / total
        cold = self.bytes and max(self.disk_bytes, self.arrived_bytes) >= 0.5 * self.bytes
        return cached >= HOT and not cold

    @property
    def reading(self) -> Window:
        """The restore's reading window (window.py): between the job's first and last marks when it marks, else
        from its first to its last read of the checkpoint, the ends cut to their bytes' time. Read calls beside the
        intervals that held a file are let in up to the size of the files it did not map: a mapping loader's bytes come
        through its mappings, and the read calls beside them are its imports (at --interval 0.02, a job's modules read
        just before its load were timed as the load's first reads)."""
        mapped = set(self.mapped)
        read = sum(n for p, n in self.files.items() if p not in mapped)
        window = reading_window(self.intervals, self.marks, self.interval_s, self.files_bytes, read)
        if not window.how and self.files_bytes:
            # the files' pages say it read them, no sample saw it reading: a hot Trainer resume of 2 MiB among 7 s of
            # imports read "2.0 MiB in 0.00 s of reading: 0.00 GB/s", and its verdict "the loader got 0.00 GB/s"
            return replace(window, note="no sample saw it read the checkpoint files whose pages it took in: too "
                           f"short to time; {finer(self.interval_s, 'watch with {}, or ')}mark the load "
                           "(`from ckptbench.mark import stage`)")
        return window

    @property
    def window(self) -> tuple[float, float]:
        """The reading window in seconds since the watch started."""
        r = self.reading
        return r.t0, r.t1

    @property
    def io_span_s(self) -> float:
        t0, t1 = self.window
        return max(0.0, t1 - t0)

    @property
    def untimed(self) -> bool:
        """Checkpoint bytes it saw read and no reading window to time them in: no rate, not 0.00 GB/s."""
        return bool(self.bytes) and not self.io_span_s

    @property
    def loader_gbps(self) -> float:
        span = self.io_span_s
        return self.bytes / span / 1e9 if span > 0 else 0.0

    def to_json(self) -> dict:
        doc = asdict(self)
        del doc["source"]  # a run document's "source" is its head's (the files' directory): the CLI says "checkpoint"
        doc["intervals"] = [{**asdict(i), "gbps": i.gbps} for i in self.intervals]
        doc["loader_gbps"] = None if self.untimed else self.loader_gbps  # the text says "untimed"
        doc["io_span_s"] = self.io_span_s
        doc["hot"] = self.hot
        r = self.reading
        doc["window_how"], doc["window_note"] = r.how, r.note
        return doc


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096).replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def check_interval(interval: float) -> None:
    """One line for a sampling interval out of range: checked before the job is looked for or started."""
    if not 0.01 <= interval <= 60:
        raise CkptbenchError(f"--interval {interval:g}: give 0.01..60 seconds")


class Watch:
    """Samples process `pid` (and its children) every `interval` until it exits or `cancel` is set.

    With `proc` (a job ckptbench started) the final counters are read from the exited process before it is
    reaped, so nothing it read after the last sample is lost; a job started elsewhere keeps its last sample.
    With `source` (the checkpoint --source names) every file under it is the checkpoint's, whatever its name."""

    def __init__(self, pid: int, *, interval: float = 0.25, cancel: threading.Event | None = None,
                 on_interval: Callable[[Interval, procstat.ProcSample], None] | None = None,
                 proc: subprocess.Popen | None = None, marks_path: str | None = None, gpu=None,
                 source: str | None = None):
        check_interval(interval)
        self.pid = pid
        self.interval = interval
        self.cancel = cancel or threading.Event()
        self.on_interval = on_interval
        self.proc = proc
        self.marks_path = marks_path
        self.source = source
        if gpu is None:
            from ckptbench.system.gpustat import GpuMemory

            gpu = GpuMemory()
        self.gpu = gpu

    def _exited(self) -> bool:
        """The started job has exited (a zombie until reaped: its counters are still readable)."""
        if self.proc is None:
            return False
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _wait(self, prev: procstat.ProcSample) -> list | None:
        """The interval's wait, its byte counters read at each of its STEPS parts (only those, a few microseconds):
        where in it the reads began and ended. None when cancelled."""
        n = max(1, min(STEPS, int(self.interval / STEP_MIN_S)))
        marks = [(prev.t, prev.rchar, prev.read_bytes)]
        for k in range(n):
            if self.cancel.wait(self.interval / n):
                return None
            if k < n - 1:
                marks.append(procstat.io_now(prev.pids))
        return marks

    def run(self) -> WatchReport:
        # printed and recorded: a URL's user:password or a secret key on the command line stays out
        command = redact(" ".join(self.proc.args) if self.proc is not None else _cmdline(self.pid))
        judge = FileJudge(self.source)  # open and mapped files alike: by name or place, never code
        # the named checkpoint's pages before the job reads them: what comes in later is counted however it was read
        ledger = PageLedger(files_under(judge.source))
        prev = procstat.sample(self.pid)
        if self.proc is None and prev.state in ("Z", "X"):  # a job ckptbench started may exit before this sample
            raise procstat.zombie_error(self.pid)
        t_start = prev.t
        tcp0 = probes.tcp_counters()
        intervals: list[Interval] = []
        files: dict[str, int] = {}
        positions: dict[str, int] = {}  # the furthest offset seen per file (read() loaders move it)
        mapper = MapReader(judge)
        mapped: set[str] = set()
        started = False  # the job has come to its checkpoint (see phase_of)
        # what a job watched mid-load had mapped already is not this watch's; a job this watch started is all its
        # own (a started job that mapped and touched its file before this first sample read 0 bytes: a flaky test)
        peaks = {} if self.proc is not None else mapper.sample(prev.pids)[1]
        through_maps: dict[str, int] = {}  # per file: what came into the job's mappings of it
        device, disk_prev = None, None
        peak = prev.rss_bytes
        sockets = prev.sockets
        ended = "exited"
        last = prev
        gpu_prev = self.gpu.sample(set(prev.pids)) if self.gpu.available else None
        gpu_t = prev.t
        while True:
            ticks = self._wait(prev)
            if ticks is None:
                ended = "cancelled"
                break
            done = self._exited()
            try:
                cur = procstat.sample(self.pid)
            except procstat.ProcessGone:
                break
            ckpt = judge.open_files(cur.files, cur.pids)  # the files themselves, not what their names reach here
            for f in ckpt:
                files[f.path] = f.size
                positions[f.path] = max(positions.get(f.path, 0), f.pos)
            in_maps, resident = mapper.sample(cur.pids)
            files |= in_maps
            mapped |= set(in_maps)
            # growth past each mapping's peak: a page touched twice counts once; what a mapping gained after the last
            # sample before it was unmapped is not seen (an undercount, never a double count)
            grown = {k: max(0, n - peaks.get(k, 0)) for k, n in resident.items()}
            grew = sum(grown.values())
            for (_, path), n in grown.items():
                through_maps[path] = through_maps.get(path, 0) + n
            peaks |= {k: max(n, peaks.get(k, 0)) for k, n in resident.items()}
            here = {f.path for f in ckpt} | set(in_maps)
            ledger.add(here)  # hot or cold when the job came to it, unless known from the start (a mincore, no read)
            if device is None and here:
                m = probes.mount_of(min(here))
                device = m.device if isinstance(m, probes.Mount) else ""
            util = None
            disk = probes.diskstats(device) if device else None
            if isinstance(disk, probes.DiskStats):
                if isinstance(disk_prev, probes.DiskStats):
                    util = probes.disk_util(disk_prev, disk, cur.t - prev.t)["util_pct"]
                disk_prev = disk
            iv = replace(interval_of(prev, cur, t_start, grew), ckpt_files=len(here), device_util_pct=util,
                         steps=_steps([*ticks, (cur.t, cur.rchar, cur.read_bytes)], t_start))
            started = started or bool(files) or iv.phase in ("reading", "faulting")
            iv = replace(iv, phase=start_phase(iv.phase, started))
            if self.gpu.available and cur.t - gpu_t >= GPU_EVERY_S:
                gpu_bytes = self.gpu.sample(set(cur.pids))  # the tree this sample already walked
                iv = with_gpu(iv, gpu_prev, gpu_bytes, cur.t - gpu_t)
                gpu_prev, gpu_t = gpu_bytes, cur.t
            elif gpu_prev is not None:
                iv = replace(iv, gpu_bytes=gpu_prev)
            intervals.append(iv)
            peak = max(peak, cur.rss_bytes)
            sockets = max(sockets, cur.sockets)
            if self.on_interval:
                self.on_interval(live_phase(intervals[-1], bool(files)), cur)
            prev = last = cur
            if done or cur.state in ("Z", "X"):  # exited: a zombie's counters are its final ones
                break
        exit_code = self.proc.wait() if self.proc is not None and ended == "exited" else None
        tcp1 = probes.tcp_counters()
        retrans = (probes.retransmit_rate(tcp0, tcp1)
                   if not isinstance(tcp0, probes.Unknown) and not isinstance(tcp1, probes.Unknown) else None)
        marks = [{"stage": name, "t": t - t_start} for t, name in mark.read_marks(self.marks_path)] \
            if self.marks_path else []
        arrived = ledger.arrived()  # before anything else reads the files (the verdict's re-read evicts them)
        # a checkpoint file whose pages came in though the job was never seen to hold it: opened or mapped, read and
        # let go between two samples (judged after the count: its first bytes are read to tell code from data)
        unseen = sorted(p for p in arrived if p not in files and judge.open_file(p, ledger.sizes[p]))
        files |= {p: ledger.sizes[p] for p in unseen}
        residency = {p: share for p in files if (share := ledger.share_first(p)) is not None}
        report = WatchReport(
            pid=self.pid, command=command, wall_s=last.t - t_start, bytes=0,
            disk_bytes=sum(i.disk_bytes for i in intervals), files=files, intervals=intervals,
            phases=merge_phases(intervals), marks=marks, peak_rss_bytes=peak, positions=positions,
            cpu_s=sum(i.cpu_cores * (i.t1 - i.t0) for i in intervals),
            majflt=sum(round(i.majflt_per_s * (i.t1 - i.t0)) for i in intervals),
            exit_code=exit_code, tcp_retransmit_rate=retrans, sockets_peak=sockets, ended=ended,
            mapped=sorted(mapped), residency_first=residency, unseen=unseen, interval_s=self.interval,
            source=self.source)
        seen = [i.gpu_bytes for i in intervals if i.gpu_bytes is not None]
        report.gpu_peak_bytes = max(seen) if seen else None
        report.gpu_note = self.gpu.note(report.gpu_peak_bytes)
        report.arrived_bytes = sum(n for p, n in arrived.items() if p in files)
        # the best evidence: the counters, or per file the larger of its mappings' pages and its pages that came
        # into the page cache, whichever says more (each is a lower bound of what the job read)
        report.files_bytes = sum(max(through_maps.get(p, 0), arrived.get(p, 0)) for p in files)
        report.intervals = started_by(intervals, report.window)
        report.phases = merge_phases(report.intervals)
        report.counted_bytes = window_bytes(intervals, *report.window, disk_cap=sum(files.values()) or None)
        report.bytes = max(report.counted_bytes, report.files_bytes)
        return report


def _steps(marks: list, t_start: float) -> tuple:
    """(t1 since the watch started, bytes) of each part between the counters' readings: read calls or disk, the
    larger (as `got` counts them); () when the interval was not split."""
    if len(marks) < 3:
        return ()
    return tuple((b[0] - t_start, max(0, b[1] - a[1], b[2] - a[2])) for a, b in zip(marks, marks[1:]))


def start_job(command: list[str], *, stdout_to_stderr: bool = False) -> tuple[subprocess.Popen, str]:
    """The user's command, started with CKPTBENCH_MARK pointing at a fresh marks file; (process, marks path).
    `stdout_to_stderr` keeps ckptbench's own stdout one document (--json) whatever the job prints."""
    if not command:
        raise CkptbenchError("watch: give a PID, --match PATTERN, or -- COMMAND ...")
    fd, marks = tempfile.mkstemp(prefix="ckptbench-marks-")
    os.close(fd)
    try:
        proc = subprocess.Popen(command, env={**os.environ, mark.ENV: marks},
                                stdout=sys.stderr.fileno() if stdout_to_stderr else None)
    except OSError as exc:
        os.unlink(marks)
        raise CkptbenchError(f"{command[0]}: cannot start ({exc.strerror}); check the command") from None
    return proc, marks
