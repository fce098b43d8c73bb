"""Watching a restore ckptbench did not start: samples of the user's job every interval, the phases they show,
and (verdict.py) why it is slow. Runs in the caller's thread, cancellable; the UI or CLI only renders.
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
from ckptbench.watch.window import FAULT_MIN_PER_S, IO_MIN_BPS, Window, got, reading_window
from ckptbench.core.errors import CkptbenchError, redact

PHASES = ("starting", "reading", "faulting", "deserializing", "copying-to-gpu", "waiting")
GPU_COPY_MIN_BPS = 50e6  # the job's GPU memory growing this fast, with little read I/O: it is copying to the GPU
GPU_EVERY_S = 0.5  # nvidia-smi takes tens of milliseconds: asked at most this often
CPU_BUSY = 0.5  # cores: a thread or process above this is doing work, not waiting
SATURATED = 0.9  # a thread this busy is the bottleneck, whatever it reads meanwhile
FAULT_BYTES = 32 << 10  # what one major fault brings in, roughly (read-around of a mapped file)


@dataclass(frozen=True)
class Interval:
    t0: float  # seconds since the watch started
    t1: float
    bytes: int  # returned to the job by read calls in this interval (rchar: page-cache hits included)
    disk_bytes: int  # fetched by the block layer for it (read_bytes: mmap faults and read-ahead included)
    cpu_cores: float  # all the job's threads
    top_thread_cores: float  # its busiest thread's demand: CPU got plus runnable time spent waiting for a CPU
    busy_threads: int  # threads above CPU_BUSY cores
    majflt_per_s: float
    rss_bytes: int
    phase: str
    ckpt_files: int = 0  # checkpoint files open or mapped at the interval's end
    device_util_pct: float | None = None  # the checkpoint's block device, as iostat -x (None: no device known)
    gpu_bytes: int | None = None  # GPU memory the job's processes held at the interval's end (None: not known)
    mapped_bytes: int = 0  # checkpoint pages that came into the job's mappings (maps.py: faults, from disk or cache)

    @property
    def gbps(self) -> float:
        return got(self.bytes, self.mapped_bytes, self.disk_bytes) / (self.t1 - self.t0) / 1e9 \
            if self.t1 > self.t0 else 0.0


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
        from its first to its last read of the checkpoint, the ends cut to their bytes' time."""
        return reading_window(self.intervals, self.marks, self.interval_s, self.files_bytes)

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
    def loader_gbps(self) -> float:
        span = self.io_span_s
        return self.bytes / span / 1e9 if span > 0 else 0.0

    def to_json(self) -> dict:
        doc = asdict(self)
        del doc["source"]  # a run document's "source" is its head's (the files' directory): the CLI says "checkpoint"
        doc["intervals"] = [{**asdict(i), "gbps": i.gbps} for i in self.intervals]
        doc["loader_gbps"] = self.loader_gbps
        doc["io_span_s"] = self.io_span_s
        doc["hot"] = self.hot
        r = self.reading
        doc["window_how"], doc["window_note"] = r.how, r.note
        return doc


def phase_of(bytes_per_s: float, majflt_per_s: float, cpu_cores: float, top_thread: float = 0.0) -> str:
    """What an interval was doing, from its signals alone (without the job's marks): faulting an mapping in,
    reading (I/O in flight, threads mostly waiting on it), deserializing (CPU-bound: little I/O, or a thread
    saturated between its reads), or waiting. The sampler calls a busy interval "starting" until the job has a
    checkpoint file open or mapped, or reads or faults at a reading rate, whichever comes first."""
    if majflt_per_s >= FAULT_MIN_PER_S:
        return "faulting"
    # busy by its demand too, the CPU it got plus what it queued for: on a busy box a loader's one thread got 0.2 of
    # a core and was runnable the rest (CI read such intervals as "waiting", or as "reading" while it read)
    if max(cpu_cores, top_thread) >= CPU_BUSY and (bytes_per_s < IO_MIN_BPS or top_thread >= SATURATED):
        return "deserializing"
    if bytes_per_s >= IO_MIN_BPS:
        return "reading"
    return "waiting"


def start_phase(phase: str, started: bool) -> str:
    """An interval's phase before the job came to its checkpoint (no checkpoint file open or mapped, nothing read
    yet): a busy one is "starting" (imports, the model built; a loader's import of torch reads as "deserializing")."""
    return "starting" if not started and phase != "waiting" else phase


def _interval(a: procstat.ProcSample, b: procstat.ProcSample, t_start: float, mapped: int = 0) -> Interval:
    dt = max(1e-6, b.t - a.t)
    nbytes = max(0, b.rchar - a.rchar)
    disk = max(0, b.read_bytes - a.read_bytes)
    # a thread's demand: the CPU it got plus the time it was runnable but waited for one (other work on the box),
    # so a loader that is its own bottleneck reads as saturated even on a busy machine; tick-grained, capped
    per_thread = [min(1.0, (b.threads[t] - a.threads.get(t, 0.0) + b.waits.get(t, 0.0) - a.waits.get(t, 0.0)) / dt)
                  for t in b.threads]
    cpu = max(0.0, b.cpu_s - a.cpu_s) / dt
    majflt = max(0, b.majflt - a.majflt) / dt
    return Interval(a.t - t_start, b.t - t_start, nbytes, disk, cpu,
                    max(per_thread, default=0.0), sum(1 for c in per_thread if c >= CPU_BUSY), majflt, b.rss_bytes,
                    phase_of(got(nbytes, mapped, disk) / dt, majflt, cpu, max(per_thread, default=0.0)),
                    mapped_bytes=mapped)


def _with_gpu(iv: Interval, before: int | None, now: int | None, dt: float) -> Interval:
    """The interval with the job's GPU memory; "copying-to-gpu" when that memory grew fast while the job read
    little (a load's device stage: host tensors going to the GPU)."""
    if now is None:
        return iv
    growing = before is not None and dt > 0 and (now - before) / dt >= GPU_COPY_MIN_BPS
    if growing and iv.phase not in ("reading", "faulting"):
        return replace(iv, gpu_bytes=now, phase="copying-to-gpu")
    return replace(iv, gpu_bytes=now)


BLIP_S = 0.3  # a wait this short between two runs of one phase is that phase's: a sample the box's other work
BLIP_INTERVALS = 2  # took the core from, not a pause (CI read a busy start as starting, waiting, starting)


def merge_phases(intervals: list[Interval]) -> list[dict]:
    """The intervals as runs of one phase, each "waiting" blip (at most BLIP_INTERVALS samples and under BLIP_S)
    between two runs of the same phase taken into them (a short read between two runs of deserializing is a read);
    the live figures keep every interval's own phase."""
    runs: list[dict] = []
    for i in intervals:
        if runs and runs[-1]["phase"] == i.phase:
            runs[-1]["t1"], runs[-1]["n"] = i.t1, runs[-1]["n"] + 1
        else:
            runs.append({"phase": i.phase, "t0": i.t0, "t1": i.t1, "n": 1})
    out: list[dict] = []
    for k, r in enumerate(runs):
        if out and out[-1]["phase"] == r["phase"]:  # the run after an absorbed blip
            out[-1]["t1"] = r["t1"]
            continue
        blip = r["phase"] == "waiting" and r["n"] <= BLIP_INTERVALS and r["t1"] - r["t0"] < BLIP_S
        if blip and out and k + 1 < len(runs) and runs[k + 1]["phase"] == out[-1]["phase"]:
            out[-1]["t1"] = r["t1"]
            continue
        out.append({"phase": r["phase"], "t0": r["t0"], "t1": r["t1"]})
    return out


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
            if self.cancel.wait(self.interval):
                ended = "cancelled"
                break
            done = self._exited()
            try:
                cur = procstat.sample(self.pid)
            except procstat.ProcessGone:
                break
            ckpt = [f for f in cur.files if judge.open_file(f.path, f.size)]
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
            iv = replace(_interval(prev, cur, t_start, grew), ckpt_files=len(here), device_util_pct=util)
            started = started or bool(files) or iv.phase in ("reading", "faulting")
            iv = replace(iv, phase=start_phase(iv.phase, started))
            if self.gpu.available and cur.t - gpu_t >= GPU_EVERY_S:
                gpu_bytes = self.gpu.sample(set(cur.pids))  # the tree this sample already walked
                iv = _with_gpu(iv, gpu_prev, gpu_bytes, cur.t - gpu_t)
                gpu_prev, gpu_t = gpu_bytes, cur.t
            elif gpu_prev is not None:
                iv = replace(iv, gpu_bytes=gpu_prev)
            intervals.append(iv)
            peak = max(peak, cur.rss_bytes)
            sockets = max(sockets, cur.sockets)
            if self.on_interval:
                self.on_interval(intervals[-1], cur)
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
        report.intervals = _started_by(intervals, report.window)
        report.phases = merge_phases(report.intervals)
        report.counted_bytes = window_bytes(intervals, *report.window)
        report.bytes = max(report.counted_bytes, report.files_bytes)
        return report


def _started_by(intervals: list[Interval], window: tuple[float, float]) -> list[Interval]:
    """The intervals, "starting" only before the reading window: a loader busy as it read its first shard, before
    any sample saw it hold a file, was called "starting" then; the window shows it was reading."""
    t0, t1 = window
    return [replace(i, phase=phase_of(i.gbps * 1e9, i.majflt_per_s, i.cpu_cores, i.top_thread_cores))
            if i.phase == "starting" and min(i.t1, t1) > max(i.t0, t0) else i for i in intervals]


def window_bytes(intervals: list[Interval], t0: float, t1: float) -> int:
    """Bytes read in the intervals that overlap [t0, t1]: what the job read well before the restore (a Python
    job's imports) or after it is not the checkpoint's. An interval the window only partly covers counts whole:
    a mark falls between samples, and the reads next to it are the restore's far more often than not (pro-rating
    by time undercounted a 160 MiB torch.load by 7 % at 20 ms samples). What read calls returned plus what came
    into the job's mappings, or what the disk delivered when that is more (`got`): summing the disk's count with
    the others would count read-ahead and faults twice."""
    inside = [i for i in intervals if min(i.t1, t1) > max(i.t0, t0)]
    return got(sum(i.bytes for i in inside), sum(i.mapped_bytes for i in inside), sum(i.disk_bytes for i in inside))


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
