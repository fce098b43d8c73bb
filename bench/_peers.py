"""What the read benchmark sets fastio against: fio, a Python thread pool, the reference md5 loop."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass

MD5_BLOCK = 1 << 20


class OtherWork:
    """CPU time other processes took while the benchmark ran: the machine's busy time (/proc/stat: user,
    nice, system, irq, softirq) minus this process's and its waited-for children's. The load average can't
    tell: it counts the benchmark's own threads blocked on the disk."""

    def __init__(self) -> None:
        self.helpers: dict[int, float] = {}  # pid of a helper process still running (a server) -> its CPU seconds
        self.start = self._now()

    def add_helper(self, pid: int) -> None:
        """Counts a child that runs for the whole benchmark (not waited for until the end) as our own work."""
        self.helpers[pid] = 0.0
        self.start = self._now()

    def _helper_cpu(self) -> float:
        hz = os.sysconf("SC_CLK_TCK")
        for pid in self.helpers:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                self.helpers[pid] = sum(int(x) for x in fields[11:15]) / hz  # utime stime cutime cstime
            except OSError:
                pass  # ended: its last reading stands
        return sum(self.helpers.values())

    def _now(self) -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        own = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + self._helper_cpu()
        return busy, own, time.monotonic()

    def share(self) -> tuple[float, float]:
        """Core-seconds other processes used since the start, and that as a share of all cores' time."""
        b0, o0, t0 = self.start
        b1, o1, t1 = self._now()
        other = max(0.0, (b1 - b0) - (o1 - o0))
        return other, other / max(1e-9, (t1 - t0) * (os.cpu_count() or 1))

    def line(self, busy_share: float = 0.10) -> str:
        other, share = self.share()
        verdict = "; OTHER WORK WAS RUNNING, figures are contended." if share > busy_share else "."
        return (f"Other processes used {other:.1f} core-seconds while it ran ({share:.1%} of the machine's "
                f"{os.cpu_count()} cores){verdict}")


@dataclass(frozen=True)
class Timed:
    bytes: int
    seconds: float


def md5_file(path: str) -> tuple[int, str]:
    """The reference md5 loop for one file: open, read 1 MiB, md5.update, until EOF."""
    h = hashlib.md5()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(MD5_BLOCK):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def reference_md5_loop(paths: list[str]) -> tuple[Timed, dict[str, str]]:
    """One file after another on one thread."""
    t0 = time.perf_counter()
    results = [md5_file(p) for p in paths]
    dt = time.perf_counter() - t0
    return Timed(sum(n for n, _ in results), dt), {p: d for p, (_, d) in zip(paths, results)}


def thread_pool_md5(paths: list[str], workers: int) -> tuple[Timed, dict[str, str]]:
    """The same loop per file, files spread over a concurrent.futures pool (hashlib releases the GIL)."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(md5_file, paths))
    dt = time.perf_counter() - t0
    return Timed(sum(n for n, _ in results), dt), {p: d for p, (_, d) in zip(paths, results)}


def split_fair(files: list[tuple[str, int]], jobs: int) -> list[list[tuple[str, int]]]:
    """Largest file first onto the job with the fewest bytes, so every job gets about the same share."""
    buckets: list[list[tuple[str, int]]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        j = load.index(min(load))
        buckets[j].append((path, size))
        load[j] += size
    return [b for b in buckets if b]


def _escape(path: str) -> str:
    # fio splits filename= on ':'; a literal colon must be written '\:'.
    return path.replace(":", "\\:")


def filename_lines(names: list[str], limit: int = 4000) -> list[str]:
    """`filename=a:b:c` lines; fio caps an option value at 4096 chars and appends repeated filename= lines."""
    lines, cur = [], []
    for name in names:
        if cur and len(":".join(cur + [name])) > limit:
            lines.append("filename=" + ":".join(cur))
            cur = []
        cur.append(name)
    if cur:
        lines.append("filename=" + ":".join(cur))
    return lines


def fio_groups(files: list[tuple[str, int]], block_size: int) -> dict[int, list[tuple[str, int]]]:
    """Files keyed by the fio bs that reads each whole: block_size, or the file's size when smaller.

    fio skips a file smaller than bs, so small files get bs = their size: one read each, as fastio does.
    """
    groups: dict[int, list[tuple[str, int]]] = {}
    for path, size in files:
        if size >= block_size and size % block_size:
            raise ValueError(f"{path}: size {size} is not a multiple of the block size {block_size}")
        groups.setdefault(min(size, block_size), []).append((path, size))
    return dict(sorted(groups.items(), reverse=True))


def fio_jobfile(files: list[tuple[str, int]], *, jobs: int, engine: str, block_size: int,
                direct: bool, iodepth: int = 1) -> str:
    """One stonewalled group per bs; each group runs `jobs` jobs over disjoint, byte-balanced file lists."""
    lines = [
        "[global]",
        f"ioengine={engine}",
        "rw=read",
        f"direct={int(direct)}",
        f"iodepth={iodepth}",
        "invalidate=0",  # the benchmark owns the cache state; fio's default would drop it
        "file_service_type=sequential",
        "allow_file_create=0",
        f"openfiles={max(16, iodepth)}",
        "",
    ]
    for g, (bs, group) in enumerate(fio_groups(files, block_size).items()):
        for j, part in enumerate(split_fair(group, jobs)):
            lines.append(f"[g{g}j{j}]")
            if g and not j:
                lines.append("stonewall")
            lines.append(f"bs={bs}")
            lines += filename_lines([_escape(p) for p, _ in part])
            lines.append("")
    return "\n".join(lines)


def run_fio(fio: str, files: list[tuple[str, int]], *, jobs: int, engine: str, block_size: int,
            direct: bool, iodepth: int = 1) -> tuple[Timed, dict]:
    """Runs the job file; time = the sum over groups of the slowest job's read runtime (ms resolution)."""
    text = fio_jobfile(files, jobs=jobs, engine=engine, block_size=block_size,
                       direct=direct, iodepth=iodepth)
    with tempfile.NamedTemporaryFile("w", suffix=".fio", delete=False) as f:
        f.write(text)
        jobfile = f.name
    try:
        out = subprocess.run([fio, *FIO_SAFE, jobfile],
                             capture_output=True, text=True, check=False)
    finally:
        os.unlink(jobfile)
    total, group_ms, njobs = fio_totals(out)
    want = sum(s for _, s in files)
    if total != want:
        raise RuntimeError(f"fio read {total} bytes, the file set has {want}")
    seconds = sum(group_ms.values()) / 1e3
    return Timed(total, seconds), {"jobs": njobs, "group_ms": group_ms}


# our job files name no size, so fio reads what each file has; --readonly (a command-line option only) makes any
# write an error all the same: a job asking more of a file than it has would lay it out, rewriting it with fio's
# bytes (a hand-run fio with size= past the end replaced three shards of a bench set that way)
FIO_SAFE = ("--readonly", "--output-format=json")


def fio_totals(out: subprocess.CompletedProcess) -> tuple[int, dict[int, int], int]:
    """Bytes read, the slowest job's runtime (ms) per stonewalled group, and the job count of a fio JSON run."""
    if out.returncode != 0:
        raise RuntimeError(f"fio failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    report = json.loads(out.stdout[out.stdout.index("{"):])  # fio may print warnings before the JSON
    group_ms: dict[int, int] = {}
    total = 0
    for job in report["jobs"]:
        total += job["read"]["io_bytes"]
        group_ms[job["groupid"]] = max(group_ms.get(job["groupid"], 0), job["read"]["runtime"])
    return total, group_ms, len(report["jobs"])


def replay_plan(files: list[tuple[str, int]], *, jobs: int, block: int, chunk: int) -> list[list[tuple[str, int, int]]]:
    """fastio's read plan as per-job unit lists: files cut into `chunk`-byte units, units spread over `jobs`.

    Units go largest first onto the job with the fewest bytes (fastio's workers claim the next unit as they
    free up, which balances the same way). Empty files are left out: fio has no read to issue for them.
    """
    units = []
    for path, size in files:
        for off in range(0, size, chunk):
            units.append((path, off, min(chunk, size - off)))
    units.sort(key=lambda u: (-u[2], u[0], u[1]))
    plan: list[list[tuple[str, int, int]]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for u in units:
        j = load.index(min(load))
        plan[j].append(u)
        load[j] += u[2]
    return [p for p in plan if p]


def iolog(units: list[tuple[str, int, int]], block: int) -> str:
    """A fio version 2 iolog: per unit, open, `block`-sized reads (the last one short), close."""
    lines = ["fio version 2 iolog"]
    lines += [f"{p} add" for p in dict.fromkeys(p for p, _, _ in units)]
    for path, off, length in units:
        lines.append(f"{path} open")
        end = off + length
        while off < end:
            n = min(block, end - off)
            lines.append(f"{path} read {off} {n}")
            off += n
        lines.append(f"{path} close")
    return "\n".join(lines) + "\n"


def run_fio_replay(fio: str, files: list[tuple[str, int]], *, jobs: int, block: int, chunk: int,
                   direct: bool = False, huge: bool = False) -> tuple[Timed, dict]:
    """fio replays exactly the reads fastio issues (read_iolog): every byte, the short last read of a file
    included, `jobs` psync jobs in one group. A bs-based job file cannot: fio skips a file smaller than bs
    and a file's last partial block, so mixed sizes need one stonewalled group per size, and each group's
    start-up then counts. Time = the slowest job's read runtime (ms resolution)."""
    if any(" " in p or "\n" in p or len(p) > 256 for p, _ in files):
        raise ValueError("fio's iolog format cannot name a path with a space or newline, or over 256 characters")
    plan = replay_plan(files, jobs=jobs, block=block, chunk=chunk)
    with tempfile.TemporaryDirectory(prefix="ckptbench-fio-") as tmp:
        lines = ["[global]", "ioengine=psync", f"direct={int(direct)}", "invalidate=0",  # the bench owns the cache
                 "fadvise_hint=sequential",  # what fastio advises for each unit it reads
                 "replay_no_stall=1", "allow_file_create=0",
                 *(["iomem=shmhuge", "hugepage-size=2M"] if huge else []),  # huge_buffers reserved them
                 ""]
        for j, units in enumerate(plan):
            log_path = os.path.join(tmp, f"job{j}.iolog")
            with open(log_path, "w") as f:
                f.write(iolog(units, block))
            lines += [f"[replay{j}]", f"read_iolog={log_path}", ""]
        jobfile = os.path.join(tmp, "replay.fio")
        with open(jobfile, "w") as f:
            f.write("\n".join(lines))
        t0 = time.perf_counter()
        out = subprocess.run([fio, *FIO_SAFE, jobfile], capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
    total, group_ms, njobs = fio_totals(out)
    want = sum(s for _, s in files)
    if total != want:
        raise RuntimeError(f"fio replayed {total} bytes, the file set has {want}")
    return Timed(total, sum(group_ms.values()) / 1e3), {"jobs": njobs, "groups": len(group_ms), "wall_s": wall,
                                                         "units": sum(len(p) for p in plan)}
