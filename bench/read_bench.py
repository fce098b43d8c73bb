"""Read benchmark: fastio hot and cold against fio, a Python thread pool and the reference md5 loop.

Prints a Markdown report to stdout (progress goes to stderr) and writes bench/out/read_bench.{md,json}.
Exit status 0 even when a target is missed; 2 when a needed tool is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Callable

import _peers
from _harness import (Series, Shape, Target, cache_dir, child_env, fmt, judge, log, machine, missing, preface,
                      section, series_table, targets_section, utc_now, write_outputs)

MiB = 1 << 20
KiB = 1 << 10
BLOCK = 1 * MiB
HOT_WORKERS = 2
COLD_CONCURRENCY = 16
KERNEL_BUF = 256 * MiB
KERNEL_PIECE = 16 * MiB
RSS_BASE = 64 * MiB

# ru_maxrss is the kernel's high-water mark, which it updates when pages are unmapped or the process exits,
# not as they are mapped: a sampler thread also reads the resident size while the engine runs (GIL released),
# and the figure is the larger of the two.
RSS_CHILD = """
import json, os, resource, sys, threading
import fastio
files = json.load(open(sys.argv[1]))
page = os.sysconf("SC_PAGE_SIZE")
peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        with open("/proc/self/statm") as f:
            peak[0] = max(peak[0], int(f.read().split()[1]) * page)
        done.wait(0.0005)
sampler = threading.Thread(target=sample)
sampler.start()
r = fastio.read_files([tuple(f) for f in files], read=sys.argv[2], hash="crc32c",
                      concurrency=int(sys.argv[3]), block_size=int(sys.argv[4]))
done.set()
sampler.join()
hwm = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "vmhwm_kib": int(hwm), "sampled_kib": peak[0] // 1024, "bytes": r.bytes,
                  "failed": len(r.failed)}))
"""


def fileset_layout(directory: str, shape: Shape) -> list[tuple[str, int]]:
    big = [(os.path.join(directory, f"big-{i:05d}.bin"), shape.big_size) for i in range(shape.big_files)]
    small = [(os.path.join(directory, "small", f"small-{i:05d}.bin"), shape.small_size)
             for i in range(shape.small_files)]
    return big + small


def write_random_file(path: str, size: int) -> None:
    """Random bytes (never a zero page a filesystem could elide), fsynced, renamed into place."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MiB)
            f.write(os.urandom(n))
            left -= n
        os.fsync(f.fileno())
    os.rename(tmp, path)


def ensure_fileset(directory: str, shape: Shape) -> list[tuple[str, int]]:
    """Reuses files already present with the right size; writes only the rest."""
    files = fileset_layout(directory, shape)
    todo = [(p, s) for p, s in files if not (os.path.isfile(p) and os.path.getsize(p) == s)]
    if todo:
        need = sum(s for _, s in todo)
        log(f"writing {len(todo)} files ({need / MiB:.0f} MiB) into {directory}")
        for path, size in todo:
            write_random_file(path, size)
        for d in {os.path.dirname(p) for p, _ in todo}:
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)  # make the renames durable too
            finally:
                os.close(fd)
    else:
        log(f"reusing the file set in {directory}")
    return files


@dataclass(kw_only=True)
class Measure(Series):
    """A row of the read tables (condition: hot, cold, memory, rss): the tool, its settings, the row it is set
    against."""

    tool: str
    config: str
    peer: str | None = None
    short: str = ""  # how the ratio column names this row when it is the peer


class Bench:
    def __init__(self, files: list[tuple[str, int]], repeat: int, fio: str):
        import fastio

        self.fastio = fastio
        self.files = files
        self.paths = [p for p, _ in files]
        self.total = sum(s for _, s in files)
        self.repeat = repeat
        self.fio = fio
        self.results: dict[str, Measure] = {}
        self.digests: dict[str, dict[str, str]] = {}
        self.load: list[float] = []  # 1-minute load average at start and end
        self.other = _peers.OtherWork()  # CPU other processes take: other work skews the figures

    def residency(self) -> float:
        return self.fastio.residency(self.paths).fraction

    def make_hot(self) -> float:
        self.fastio.read_files(self.files, hash="none", concurrency=HOT_WORKERS)
        return self.residency()

    def make_cold(self) -> float:
        self.fastio.evict(self.paths)
        return self.residency()

    def prepare(self, condition: str) -> float | None:
        if condition == "hot":
            return self.make_hot()
        if condition == "cold":
            return self.make_cold()
        return None

    def measure(self, m: Measure, run: Callable[[], _peers.Timed]) -> Measure:
        """`repeat` runs, each after setting up and checking the page-cache state."""
        log(f"  {m.condition:5} {m.tool} {m.config}")
        for _ in range(self.repeat):
            res = self.prepare(m.condition)
            if res is not None:
                m.residency.append(res)
            t = run()
            if t.bytes != self.total:
                raise RuntimeError(f"{m.key}: read {t.bytes} bytes, the file set has {self.total}")
            m.samples.append(t.bytes / t.seconds / 1e9)
        self.results[m.key] = m
        return m

    def fastio_run(self, read: str, hash: str, concurrency: int) -> _peers.Timed:
        r = self.fastio.read_files(self.files, read=read, hash=hash, concurrency=concurrency,
                                   block_size=BLOCK)
        if r.failed:
            f = r.failed[0]
            raise RuntimeError(f"fastio {read}/{hash}: {len(r.failed)} files failed, "
                               f"e.g. {f.path}: {f.error}")
        if hash == "md5":
            self.digests[f"fastio-{read}"] = {f.path: f.digest for f in r.files}
        return _peers.Timed(r.bytes, r.seconds)

    def fio_run(self, **kw) -> _peers.Timed:
        return _peers.run_fio(self.fio, self.files, block_size=BLOCK, **kw)[0]

    def pool_run(self) -> _peers.Timed:
        t, self.digests["pool"] = _peers.thread_pool_md5(self.paths, HOT_WORKERS)
        return t

    def loop_run(self) -> _peers.Timed:
        t, self.digests["reference"] = _peers.reference_md5_loop(self.paths)
        return t


def hot_peer(read: str, hash: str) -> str | None:
    """Plain reads are set against fio with the same access; hashed reads against the reference loop."""
    if read == "direct":
        return None  # O_DIRECT reads the device even when hot: no hot peer compares
    if hash != "none":
        return "hot/ref-md5"
    return "hot/fio/mmap" if read == "mmap" else "hot/fio/psync"


def run_hot(b: Bench) -> None:
    log("hot (page cache warm, residency checked before each repeat)")
    for read in ("pread", "mmap", "direct"):
        for hash in ("none", "crc32c", "md5"):
            peer = hot_peer(read, hash)
            note = "O_DIRECT bypasses the page cache" if read == "direct" else ""
            m = Measure(f"hot/fastio/{read}/{hash}", "hot", "GB/s", tool="fastio",
                        config=f"{read}, {hash}, {HOT_WORKERS} workers", peer=peer, note=note)
            b.measure(m, lambda: b.fastio_run(read, hash, HOT_WORKERS))
    for engine in ("psync", "mmap"):
        m = Measure(f"hot/fio/{engine}", "hot", "GB/s", tool="fio", config=f"{engine}, {HOT_WORKERS} jobs, "
                    "--invalidate=0", short=f"fio {engine} {HOT_WORKERS} jobs")
        b.measure(m, lambda: b.fio_run(jobs=HOT_WORKERS, engine=engine, direct=False))
    m = Measure("hot/pool-md5", "hot", "GB/s", tool="Python thread pool",
                config=f"hashlib md5, {HOT_WORKERS} threads, 1 MiB reads", peer="hot/ref-md5", short="thread pool")
    b.measure(m, b.pool_run)
    m = Measure("hot/ref-md5", "hot", "GB/s", tool="reference md5 loop", config="one file after another, 1 MiB reads",
                short="reference md5 loop")
    b.measure(m, b.loop_run)


def run_cold(b: Bench) -> None:
    log("cold (evicted, residency checked before each repeat)")
    c = COLD_CONCURRENCY
    for read in ("direct", "pread", "mmap"):
        for hash in ("none", "crc32c", "md5"):
            m = Measure(f"cold/fastio/{read}/{hash}", "cold", "GB/s", tool="fastio",
                        config=f"{read}, {hash}, concurrency {c}",
                        peer="cold/fio/libaio" if read == "direct" else "cold/fio/psync")
            b.measure(m, lambda: b.fastio_run(read, hash, c))
    m = Measure("cold/fio/libaio", "cold", "GB/s", tool="fio", config=f"libaio --direct=1, 1 job, iodepth {c}",
                short=f"fio libaio direct iodepth {c}")
    b.measure(m, lambda: b.fio_run(jobs=1, engine="libaio", direct=True, iodepth=c))
    m = Measure("cold/fio/psync", "cold", "GB/s", tool="fio", config=f"psync, {c} jobs, --invalidate=0",
                short=f"fio psync {c} jobs")
    b.measure(m, lambda: b.fio_run(jobs=c, engine="psync", direct=False))


def time_kernel(update: Callable[[memoryview], None], buf: memoryview, piece: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(buf), piece):
        update(buf[i:i + piece])
    return len(buf) / (time.perf_counter() - t0) / 1e9


def run_kernels(b: Bench) -> None:
    """Each kernel hashes the same 256 MiB buffer in 16 MiB pieces; digests are cross-checked.

    Repeats are interleaved (every kernel once per round) so drift on a shared host hits all alike.
    """
    import crc32c
    import xxhash

    log("hash kernels (256 MiB in memory)")
    buf = memoryview(os.urandom(KERNEL_BUF))
    size = f"{KERNEL_BUF // MiB} MiB buffer, {KERNEL_PIECE // MiB} MiB updates"
    cases = {
        "memory/fastio/crc32c": ("fastio.Hasher", "crc32c", "memory/pkg/crc32c",
                                 lambda: Digest.of(b.fastio.Hasher("crc32c"))),
        "memory/pkg/crc32c": ("crc32c package", "crc32c.crc32c", None, lambda: Digest.crc32c_pkg(crc32c)),
        "memory/fastio/xxh64": ("fastio.Hasher", "xxh64", "memory/pkg/xxh64",
                                lambda: Digest.of(b.fastio.Hasher("xxh64"))),
        "memory/pkg/xxh64": ("xxhash package", "xxhash.xxh64", None, lambda: Digest.of(xxhash.xxh64())),
    }
    digests = {}
    for key, (tool, cfg, peer, make) in cases.items():
        b.results[key] = Measure(key, "memory", "GB/s", tool=tool, config=f"{cfg}, {size}", peer=peer, short=tool)
        time_kernel(make().update, buf[:KERNEL_PIECE], KERNEL_PIECE)  # warm-up: page in code and tables
    for _ in range(b.repeat):
        for key, (_, _, _, make) in cases.items():
            d = make()
            b.results[key].samples.append(time_kernel(d.update, buf, KERNEL_PIECE))
            digests[key] = d.hexdigest()
    for alg in ("crc32c", "xxh64"):
        if digests[f"memory/fastio/{alg}"] != digests[f"memory/pkg/{alg}"]:
            raise RuntimeError(f"{alg}: fastio and the package disagree on the same buffer")


@dataclass
class Digest:
    """One update/hexdigest face over fastio.Hasher, xxhash and the crc32c package's function."""

    update: Callable[[memoryview], None]
    hexdigest: Callable[[], str]

    @classmethod
    def of(cls, hasher) -> Digest:
        return cls(hasher.update, hasher.hexdigest)

    @classmethod
    def crc32c_pkg(cls, crc32c) -> Digest:
        state = [0]

        def update(piece):
            state[0] = crc32c.crc32c(piece, state[0])

        return cls(update, lambda: f"{state[0]:08x}")


def rss_child(listing: str, read: str, concurrency: int) -> dict:
    """Runs RSS_CHILD as a grandchild under sh.

    A direct child inherits this process's peak in ru_maxrss (exec records the mm it replaces, and
    vfork shares ours); under sh the recorded peak is sh's, a few hundred KiB.
    """
    cmd = [sys.executable, "-c", RSS_CHILD, listing, read, str(concurrency), str(BLOCK)]
    # Not the last command, so sh forks python instead of exec'ing it.
    out = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd],
                         capture_output=True, text=True, env=child_env(), check=False)
    if out.returncode != 0:
        raise RuntimeError(f"rss child ({read}) failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_rss(b: Bench) -> None:
    """Peak RSS of a child that only runs fastio over the file set (pread / mmap, crc32c)."""
    log("peak RSS of a read-only child")
    c = COLD_CONCURRENCY
    bound = RSS_BASE + c * BLOCK
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(b.files, f)
        listing = f.name
    try:
        for read in ("pread", "mmap"):
            m = Measure(f"rss/fastio/{read}", "rss", "MiB", tool="fastio child",
                        config=f"{read}, crc32c, concurrency {c}, block 1 MiB",
                        note=f"bound {bound // MiB} MiB = 64 MiB + {c} x 1 MiB")
            log(f"  rss   fastio {read}")
            for _ in range(b.repeat):
                m.residency.append(b.make_hot())
                r = rss_child(listing, read, c)
                if r["failed"] or r["bytes"] != b.total:
                    raise RuntimeError(f"rss child ({read}): {r}")
                m.samples.append(max(r["maxrss_kib"], r["sampled_kib"]) * KiB / MiB)
                m.extra.setdefault("vmhwm_mib", []).append(r["vmhwm_kib"] * KiB / MiB)
                m.extra.setdefault("sampled_mib", []).append(r["sampled_kib"] * KiB / MiB)
            b.results[m.key] = m
    finally:
        os.unlink(listing)


def targets() -> list[Target]:
    bound = (RSS_BASE + COLD_CONCURRENCY * BLOCK) / MiB
    out = []
    for read in ("pread", "mmap"):
        for engine in ("psync", "mmap"):
            out.append(Target(f"hot, hash none, 2 workers: fastio {read} >= 0.95x fio {engine} 2 jobs",
                              f"hot/fastio/{read}/none", f"hot/fio/{engine}", low=0.95, shown="{:.2f}x"))
    for hash, factor, what in (("crc32c", 15, "hot, crc32c"), ("md5", 1.9, "hot, md5, 2 workers")):
        for read in ("pread", "mmap"):
            out.append(Target(f"{what}: fastio {read} >= {factor}x the reference md5 loop",
                              f"hot/fastio/{read}/{hash}", "hot/ref-md5", low=factor, shown="{:.2f}x"))
    out.append(Target("cold, concurrency 16: fastio direct >= 0.95x fio libaio direct iodepth 16",
                      "cold/fastio/direct/none", "cold/fio/libaio", low=0.95, shown="{:.2f}x"))
    for alg, pkg in (("crc32c", "crc32c"), ("xxh64", "xxhash")):
        out.append(Target(f"{alg} kernel: fastio >= 0.9x the {pkg} package",
                          f"memory/fastio/{alg}", f"memory/pkg/{alg}", low=0.9, shown="{:.2f}x"))
    for read in ("pread", "mmap"):
        out.append(Target(f"peak RSS, {read}: <= {bound:.0f} MiB (64 MiB + 16 x 1 MiB), worst repeat",
                          f"rss/fastio/{read}", high=bound, worst=True, shown="{:.1f} MiB"))
    return out


def table_rows(res: dict[str, Measure], unit: str) -> list[str]:
    def ratio(m: Measure) -> str:
        if not (m.peer and m.peer in res):
            return ""
        p = res[m.peer]
        return f"{m.median / p.median:.2f}× {p.short or p.tool}"

    return series_table([m for m in res.values() if m.unit == unit],
                        ("condition", "tool / config", f"{unit} (median)", "min–max", "ratio vs peer"),
                        lambda m: f"{m.tool}: {m.config}" + (f" — {m.note}" if m.note else ""),
                        lambda m, v: fmt(v, 1 if m.unit == "MiB" else 2), lambda m: [ratio(m)])


def report_markdown(b: Bench, verdicts: list[dict], shape: Shape, args, preface: list[str] = ()) -> str:
    lines = [
        "# fastio read benchmark",
        "",
        *preface,
        f"File set: {shape.describe()} in `{args.dir}`; block 1 MiB; median of {b.repeat} repeat(s); "
        "GB = 10^9 bytes.",
        "",
    ]
    lines += table_rows(b.results, "GB/s")
    lines += ["", "Peak RSS of a child process that only runs fastio over the file set (the larger of "
              "ru_maxrss and the resident size sampled every 0.5 ms during the read; the whole process, nothing "
              "subtracted):", ""]
    lines += table_rows(b.results, "MiB")
    lines += targets_section(verdicts) + section("Notes", notes(b))
    return "\n".join(lines) + "\n"


def notes(b: Bench) -> list[str]:
    out = [
        "hot = every repeat follows a fastio pre-read and needs residency ≥ 0.95 (fastio.residency); "
        "cold = every repeat follows fastio.evict and needs residency ≤ 0.05.",
        "fio: one job file, `rw=read`, `file_service_type=sequential`, `invalidate=0`; files split across "
        "jobs largest-first onto the lightest job (disjoint `filename=a:b:c` lists, colons escaped). fio skips "
        "files smaller than bs, so the small files form a second stonewalled group with bs = their size "
        "(one read each); throughput = all bytes / sum over groups of the slowest job's runtime "
        "(ms resolution). "
        "Bytes read are checked against the file set.",
        f"cold fio libaio: 1 job × iodepth {COLD_CONCURRENCY} (jobs × iodepth = {COLD_CONCURRENCY}). "
        f"cold fastio pread/mmap are set against fio psync with {COLD_CONCURRENCY} jobs.",
        "hot direct rows read with O_DIRECT, which bypasses the page cache, so they measure the device "
        "even when the files are resident.",
        "The disk is whatever backs --dir; on a virtual disk the host's cache can make cold reads fast.",
        "fastio mmap with hash none maps each block's pages (MADV_POPULATE_READ: from the disk when cold) "
        "without touching the bytes; fio's mmap engine copies each block out of the mapping. With a hash, "
        "fastio reads every byte through the mapping.",
    ]
    cores = os.cpu_count() or 1
    if b.load:
        out.append(f"1-minute load average {b.load[0]:.1f} at the start, {b.load[-1]:.1f} at the end, on {cores} "
                   "cores (it counts the benchmark's own threads waiting on the disk).")
    out.append(b.other.line())
    same = dict(b.digests)
    if "reference" in same:
        ref = same.pop("reference")
        bad = [k for k, d in same.items() if d != ref]
        out.append("md5 digests of fastio (every read mode) and the thread pool match the reference loop."
                   if not bad else f"md5 digests DIFFER from the reference loop: {', '.join(bad)}")
    return out


def write_report(b: Bench, verdicts: list[dict], facts: dict, shape: Shape, args) -> None:
    date = utc_now()
    raw = {
        "date": date,
        "machine": facts,
        "args": {k: v for k, v in vars(args).items() if k != "shape"},
        "fileset": {**asdict(shape), "bytes": b.total, "dir": args.dir},
        "measurements": [m.as_dict() for m in b.results.values()],
        "targets": verdicts,
        "load_average_1min": b.load,
        "other_work_core_s": b.other.share()[0],
        "md5_digests_agree": all(d == b.digests.get("reference") for d in b.digests.values()),
    }
    write_outputs("read_bench", report_markdown(b, verdicts, shape, args, preface(date, facts)), raw)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=cache_dir("bench-read"), help="where the file set lives (reused when present)")
    ap.add_argument("--repeat", type=int, default=None, help="repeats per figure (default 3; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="small set (8 × 32 MiB + 100 × 64 KiB), 1 repeat")
    ap.add_argument("--big-files", type=int)
    ap.add_argument("--big-size", type=int, help="bytes; a multiple of 1 MiB")
    ap.add_argument("--small-files", type=int)
    ap.add_argument("--small-size", type=int, help="bytes; a multiple of 4 KiB, below 1 MiB")
    args = ap.parse_args(argv)
    base = Shape(8, 32 * MiB, 100, 64 * KiB) if args.quick else Shape(64, 32 * MiB, 1000, 64 * KiB)
    args.shape = Shape(
        args.big_files if args.big_files is not None else base.big_files,
        args.big_size or base.big_size,
        args.small_files if args.small_files is not None else base.small_files,
        args.small_size or base.small_size,
    )
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    s = args.shape
    # fio and O_DIRECT need whole blocks: big files in 1 MiB, small files in 4 KiB, each read whole.
    if s.big_size % BLOCK or s.small_size % 4096 or not 0 < s.small_size < BLOCK:
        ap.error("--big-size must be a multiple of 1 MiB and --small-size a multiple of 4 KiB below 1 MiB")
    if s.big_files < 0 or s.small_files < 0 or s.big_files + s.small_files < 1:
        ap.error("the file set needs at least one file")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = missing("read_bench", executables=("fio",), modules=("fastio", "crc32c", "xxhash"))
    if problem:
        print(problem, file=sys.stderr)
        return 2
    fio = shutil.which("fio")
    files = ensure_fileset(args.dir, args.shape)
    b = Bench(files, args.repeat, fio)
    t0 = time.monotonic()
    b.load.append(os.getloadavg()[0])
    run_hot(b)
    run_cold(b)
    run_kernels(b)
    run_rss(b)
    b.load.append(os.getloadavg()[0])
    log(f"done in {time.monotonic() - t0:.0f} s")
    verdicts = [judge(t, b.results) for t in targets()]
    print(report_markdown(b, verdicts, args.shape, args), end="")
    write_report(b, verdicts, machine(args.dir, fio), args.shape, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
