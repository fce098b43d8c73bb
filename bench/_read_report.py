"""The read benchmark's targets and report: the throughput and peak-RSS tables, the notes, bench/out/read_bench.*."""

from __future__ import annotations

import os
from dataclasses import asdict

from _harness import (MiB, Shape, Target, fmt, preface, section, series_table, targets_section, utc_now,
                      write_outputs)
from _read_measure import BLOCK, COLD_CONCURRENCY, RSS_BASE, Bench, Measure


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
