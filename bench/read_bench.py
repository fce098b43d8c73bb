"""Read benchmark: fastio hot and cold against fio, a Python thread pool and the reference md5 loop.

Prints a Markdown report to stdout (progress goes to stderr) and writes bench/out/read_bench.{md,json}.
Exit status 0 even when a target is missed; 2 when a needed tool is missing. Here: the runs (hot, cold, the hash
kernels in memory, a read-only child's peak RSS); the file set, how a repeat is measured and the report are in
bench/_read_*.py.
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
from collections.abc import Callable
from dataclasses import dataclass

from _harness import KiB, MiB, Shape, cache_dir, child_env, judge, log, machine, missing
from _read_fileset import ensure_fileset
from _read_measure import BLOCK, COLD_CONCURRENCY, HOT_WORKERS, RSS_BASE, Bench, Measure
from _read_report import report_markdown, targets, write_report

KERNEL_BUF = 256 * MiB
KERNEL_PIECE = 16 * MiB

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
