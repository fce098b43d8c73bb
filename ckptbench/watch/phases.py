"""An interval of a watched job and the phase it shows: the signals each phase is read from (read rate, faults, CPU
demand, GPU memory), and the intervals as runs of one phase. sampler.py takes the samples these are made from."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ckptbench.system import procstat
from ckptbench.watch.window import FAULT_MIN_PER_S, IO_MIN_BPS, fetching, got

PHASES = ("starting", "reading", "faulting", "deserializing", "freeing", "copying-to-gpu", "waiting")
FREEING_MIN = 64 << 20  # the job's RSS falling this much in one interval, busy with little I/O: it is releasing
# memory (a load dropping its staging or a mapping, the job's exit), not deserializing: a job's 2 s of exit after it
# said it had loaded read as "deserializing"
GPU_COPY_MIN_BPS = 50e6  # the job's GPU memory growing this fast, with little read I/O: it is copying to the GPU
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
    steps: tuple = ()  # (t1, bytes) of its parts: read calls or disk (not mappings), where in it the reads were
    freed_bytes: int = 0  # how far its RSS fell over the interval (0 where it rose)

    @property
    def gbps(self) -> float:
        return got(self.bytes, self.mapped_bytes, self.disk_bytes) / (self.t1 - self.t0) / 1e9 \
            if self.t1 > self.t0 else 0.0


def phase_of(bytes_per_s: float, majflt_per_s: float, cpu_cores: float, top_thread: float = 0.0,
             freed: int = 0) -> str:
    """What an interval was doing, from its signals alone (without the job's marks): faulting an mapping in,
    reading (I/O in flight, threads mostly waiting on it), deserializing (CPU-bound: little I/O, or a thread
    saturated between its reads), freeing (CPU-bound with little I/O while its RSS fell by FREEING_MIN or more), or
    waiting. The sampler calls a busy interval "starting" until the job has a checkpoint file open or mapped, or
    reads or faults at a reading rate, whichever comes first."""
    if majflt_per_s >= FAULT_MIN_PER_S:
        return "faulting"
    # busy by its demand too, the CPU it got plus what it queued for: on a busy box a loader's one thread got 0.2 of
    # a core and was runnable the rest (CI read such intervals as "waiting", or as "reading" while it read)
    if max(cpu_cores, top_thread) >= CPU_BUSY and (bytes_per_s < IO_MIN_BPS or top_thread >= SATURATED):
        return "freeing" if freed >= FREEING_MIN and bytes_per_s < IO_MIN_BPS else "deserializing"
    if bytes_per_s >= IO_MIN_BPS:
        return "reading"
    return "waiting"


def start_phase(phase: str, started: bool) -> str:
    """An interval's phase before the job came to its checkpoint (no checkpoint file open or mapped, nothing read
    yet): a busy one is "starting" (imports, the model built; a loader's import of torch reads as "deserializing")."""
    return "starting" if not started and phase != "waiting" else phase


def live_phase(iv: Interval, seen: bool) -> Interval:
    """The interval as the live line shows it: before any checkpoint file was seen open or mapped, read calls alone at
    a reading rate, from the page cache, are what a job's imports look like (at --interval 0.02 they read 20 MB/s and
    more), so it is "starting" there. The report keeps the sampled phase: its window needs it to find a hot load that
    opened, read and closed its file between two samples, and `started_by` tells the start from the load after."""
    if seen or iv.phase != "reading" or fetching(iv):
        return iv
    return replace(iv, phase="starting")


def interval_of(a: procstat.ProcSample, b: procstat.ProcSample, t_start: float, mapped: int = 0) -> Interval:
    dt = max(1e-6, b.t - a.t)
    nbytes = max(0, b.rchar - a.rchar)
    disk = max(0, b.read_bytes - a.read_bytes)
    # a thread's demand: the CPU it got plus the time it was runnable but waited for one (other work on the box),
    # so a loader that is its own bottleneck reads as saturated even on a busy machine; tick-grained, capped
    per_thread = [min(1.0, (b.threads[t] - a.threads.get(t, 0.0) + b.waits.get(t, 0.0) - a.waits.get(t, 0.0)) / dt)
                  for t in b.threads]
    cpu = max(0.0, b.cpu_s - a.cpu_s) / dt
    majflt = max(0, b.majflt - a.majflt) / dt
    freed = max(0, a.rss_bytes - b.rss_bytes)
    return Interval(a.t - t_start, b.t - t_start, nbytes, disk, cpu,
                    max(per_thread, default=0.0), sum(1 for c in per_thread if c >= CPU_BUSY), majflt, b.rss_bytes,
                    phase_of(got(nbytes, mapped, disk) / dt, majflt, cpu, max(per_thread, default=0.0), freed),
                    mapped_bytes=mapped, freed_bytes=freed)


def with_gpu(iv: Interval, before: int | None, now: int | None, dt: float) -> Interval:
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


def started_by(intervals: list[Interval], window: tuple[float, float]) -> list[Interval]:
    """The intervals, "starting" exactly before the reading window: a loader busy as it read its first shard, before
    any sample saw it hold a file, was called "starting" then, and the window shows it was reading; and a busy
    interval wholly before the window that held no checkpoint file is the job starting, whatever its rate said as
    it was sampled (at --interval 0.02 a job's imports read 20 MB/s and more from the page cache, and the phases
    showed them as reading)."""
    t0, t1 = window
    if t1 <= t0:  # nothing read: nothing to tell the start from
        return intervals
    out = []
    for i in intervals:
        if i.phase == "starting" and min(i.t1, t1) > max(i.t0, t0):
            i = replace(i, phase=phase_of(i.gbps * 1e9, i.majflt_per_s, i.cpu_cores, i.top_thread_cores,
                                          i.freed_bytes))
        elif i.t1 <= t0 and i.ckpt_files == 0 and i.phase in ("reading", "deserializing"):
            i = replace(i, phase="starting")
        out.append(i)
    return out


def window_bytes(intervals: list[Interval], t0: float, t1: float, disk_cap: int | None = None) -> int:
    """Bytes read in the intervals that overlap [t0, t1]: what the job read well before the restore (a Python
    job's imports) or after it is not the checkpoint's. An interval the window only partly covers counts whole:
    a mark falls between samples, and the reads next to it are the restore's far more often than not (pro-rating
    by time undercounted a 160 MiB torch.load by 7 % at 20 ms samples). What read calls returned plus what came
    into the job's mappings, or what the disk delivered when that is more (`got`): summing the disk's count with
    the others would count read-ahead and faults twice. `disk_cap`: the checkpoint files' size, where they are known;
    the disk's count is the process's, of every file: with the page cache dropped first, the libraries a loader
    faulted in as it loaded made a 128 MiB safetensors load count 136 MiB (and 254 MiB once, in a busy CI run)."""
    inside = [i for i in intervals if min(i.t1, t1) > max(i.t0, t0)]
    disk = sum(i.disk_bytes for i in inside)
    return got(sum(i.bytes for i in inside), sum(i.mapped_bytes for i in inside),
               disk if disk_cap is None else min(disk, disk_cap))
