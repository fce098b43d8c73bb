"""The restore benchmark's targets and report: the main and per-stage tables, the notes,
bench/out/restore_bench.*."""

from __future__ import annotations

import os
import statistics
from typing import TYPE_CHECKING

from _harness import GiB, MiB, Target, fmt, preface, section, series_table, targets_section, write_outputs
from _restore_measure import HOT_ATTEMPTS, STAGES, RestoreSeries

if TYPE_CHECKING:
    from restore_bench import Bench

FUSED_VS_STAGED = 0.6  # fused RTO <= 0.6 x staged RTO
FUSED_VS_STOCK = 2.0  # stock RTO >= 2 x fused RTO
FIO_BAND = (0.95, 1.05)  # our read stage / fio, cold


def targets() -> list[Target]:
    return [
        Target(f"hot: fused RTO ≤ {FUSED_VS_STAGED}× staged RTO", "hot/fused", "hot/staged", high=FUSED_VS_STAGED,
               shown="{:.3f}×"),
        Target(f"hot: fused ≥ {FUSED_VS_STOCK:g}× faster than the stock path (stock RTO / fused RTO)",
               "hot/fused", "hot/stock", low=FUSED_VS_STOCK, invert=True, shown="{:.3f}×"),
        # paired: the median of back-to-back pairs, as the repeats alternate which tool reads first
        Target(f"cold: our read stage within ±5 % of fio psync (ours / fio in {FIO_BAND[0]}..{FIO_BAND[1]})",
               "cold/read/ours", "cold/read/fio", low=FIO_BAND[0], high=FIO_BAND[1], paired=True, shown="{:.3f}×"),
        Target(f"cold, agreement check: the engine's reads alone within ±5 % of fio psync (in {FIO_BAND[0]}.."
               f"{FIO_BAND[1]})", "cold/read/engine", "cold/read/fio", low=FIO_BAND[0], high=FIO_BAND[1], paired=True,
               shown="{:.3f}×"),
    ]


def main_table(b: Bench, verdicts: list[dict]) -> list[str]:
    by_peer = {(v["subject"], v["peer"]): v for v in verdicts}
    ratio_text = {
        "hot/staged": lambda v: f"fused = {v['value']:.2f}× staged",
        "hot/stock": lambda v: f"fused {v['value']:.2f}× faster (stock / fused)",
        "cold/read/fio": lambda v: f"ours = {v['value']:.3f}× fio",
        "cold/read/engine": lambda v: f"engine = {v['value']:.3f}× fio",
    }
    bound_text = {"hot/staged": f"≤ {FUSED_VS_STAGED}×", "hot/stock": f"≥ {FUSED_VS_STOCK:g}×",
                  "cold/read/fio": f"{FIO_BAND[0]}–{FIO_BAND[1]}×",
                  "cold/read/engine": f"{FIO_BAND[0]}–{FIO_BAND[1]}×"}
    info = {"cold/read/fused": ("cold/read/fio", "ours fused = {:.3f}× fio (info: includes crc32c)"),
            "hot/read/ours": ("hot/read/fio", "ours = {:.3f}× fio (info)")}

    def cells(s: RestoreSeries) -> list[str]:
        ratio, met = "—", "—"
        # a verdict shows on its peer's row, except the agreement check, which shares fio's row as peer
        v = (by_peer.get(("cold/read/engine", "cold/read/fio")) if s.key == "cold/read/engine" else
             next((v for (subj, peer), v in by_peer.items() if peer == s.key and subj != "cold/read/engine"), None))
        if v is not None and v["value"] is not None:
            ratio = ratio_text[s.key](v)
            met = f"{v['status']} ({bound_text[s.key]})"
        elif s.key in info and info[s.key][0] in b.series:
            ratio = info[s.key][1].format(s.median / b.series[info[s.key][0]].median)
            met = "—"
        if not s.ok:
            met = ("" if met == "—" else met + "; ") + "CHECK FAILED"
        return [ratio, met]

    order = ("hot/fused", "hot/staged", "hot/stock", "cold/read/ours", "cold/read/fused", "cold/read/engine",
             "cold/read/fio", "hot/read/ours", "hot/read/fio")
    rows = sorted(b.series.values(), key=lambda s: order.index(s.key) if s.key in order else len(order))
    return series_table(rows, ("condition", "path", "RTO or GB/s (median)", "min–max", "ratio", "target met?"),
                        lambda s: s.path, lambda s, v: fmt(v, 2, s.unit), cells)


def stage_table(b: Bench) -> list[str]:
    cols = [(k, n) for k, n in (("hot/fused", "fused"), ("hot/staged", "staged"), ("hot/stock", "stock"))
            if k in b.series]
    head = "| stage | " + " | ".join(f"{n} median s | {n} % of RTO" for _, n in cols) + " |"
    rows = [head, "|---|" + "---:|---:|" * len(cols)]
    for stage in STAGES:
        meds = [b.series[k].stage_median(stage) for k, _ in cols]
        if all(m is None for m in meds):
            continue
        cells = []
        for (k, _), m in zip(cols, meds):
            rto = b.series[k].median
            cells += ["—", "—"] if m is None else [f"{m:.3f}", f"{m / rto:.0%}"]
        rows.append(f"| {stage} | " + " | ".join(cells) + " |")
    rows.append("| **RTO** | " + " | ".join(f"**{b.series[k].median:.3f}** | 100%" for k, _ in cols) + " |")
    return rows


def notes(b: Bench) -> list[str]:
    out = [
        "Verification differs by path: fused hashes crc32c during the read and compares with the manifest; staged "
        "hashes crc32c over the read buffers after the read; the stock path computes hashlib md5 over every file "
        "(1 MiB reads, one file after another), as the seed scripts do"
        + ("" if b.listing.manifest.hash == "md5" else
           " — the manifest holds crc32c, so its md5 digests have no reference to compare with")
        + ".",
        "Stock path: `GPT(dims).to(bfloat16)` built normally (not on meta), then per shard, one after another, "
        "`safetensors.torch.load_file` and `model.load_state_dict(strict=False)` (a copy into the model's own "
        "storage); optimizer shards through `load_file` with every tensor `.clone()`d (load_file maps lazily; the "
        "clone reads the bytes); the same AdamW-over-fp32-masters optimizer the fused path builds, the small-file "
        "tail, and the same check (parameter count, one forward step with finite output). Its stages: verify = "
        "md5, load = build + shards + optimizer + tail, check = forward.",
        "hot = residency ≥ 0.95 before every repeat (the pipeline's hot condition, or a fastio pre-read for the "
        "stock path and fio), checked with fastio.residency, and at most 5 % of the set read from the disk while "
        "timed (getrusage ru_inblock of this process, or of fio as a child): a hot repeat that read from the disk "
        f"(another process dropped the page cache under it) is run again, up to {HOT_ATTEMPTS} times; cold = "
        "fastio.evict before every repeat and residency ≤ 0.05. Fused, staged and stock repeats are interleaved "
        "in one process, their order rotated each repeat, after `warmup.warm_up()`, after one untimed warm-up "
        "restore each.",
        "fio: psync, `read_iolog` replay of the read stage's own reads: files cut into 64 MiB units (fastio's "
        "chunk size), each read in 1 MiB reads with the short last read, every byte of every file; units spread "
        f"largest first over {b.concurrency} jobs in one group; `replay_no_stall=1`, `invalidate=0` (the benchmark "
        "evicts or pre-reads itself). GB/s = the bytes fio read / the slowest job's runtime (ms resolution). A "
        "bs-based job file cannot read the same bytes: fio skips a file smaller than bs and a file's last partial "
        "block, so mixed sizes need a stonewalled group per size, and each group's start-up counts.",
        "Our read-stage GB/s = all bytes of the checkpoint / the pipeline's read stage (engine start to the last "
        "buffer filled, into memory). The target is judged on the staged run (no hash, the same work as fio); the "
        "fused read stage also computes crc32c and is shown for information.",
    ]
    f = b.series.get("cold/read/fio")
    if f is not None and "fio" in f.extra:
        x = f.extra["fio"]
        out.append(f"fio read {x['bytes'] / MiB:.1f} MiB of the {b.total / MiB:.1f} MiB set "
                   f"({x['bytes'] / b.total:.2%}) as {x['units']} unit(s) in {x['jobs']} job(s).")
    o, p = b.series.get("cold/read/ours"), b.series.get("cold/read/fio")
    if o is not None and p is not None and len(o.samples) == len(p.samples):
        pairs = [x / y for x, y in zip(o.samples, p.samples)]
        out.append("cold ours / fio per repeat (each pair run back to back): "
                   + ", ".join(f"{r:.3f}" for r in pairs) + f"; median {statistics.median(pairs):.3f} "
                   "(the ±5 % target uses this median of pairs; repeats alternate which tool reads first).")
    e, f, o = (b.series.get(k) for k in ("cold/read/engine", "cold/read/fio", "cold/read/ours"))
    if b.fault_in and e is not None and f is not None and o is not None:
        out.append(
            f"What separates the read stage from fio: the read stage lands every byte in fresh memory for the "
            f"loader, fio reads into one reused buffer. The engine doing fio's work (same reads, a reused "
            f"buffer) ran at {e.median:.2f} GB/s against fio's {f.median:.2f}; the read stage at {o.median:.2f}. "
            f"This machine faults in fresh memory at {statistics.median(b.fault_in):.2f} GB/s per thread "
            f"(MADV_POPULATE_WRITE of {b.total / GiB:.1f} GiB, per repeat: "
            + ", ".join(f"{g:.2f}" for g in b.fault_in) + f"), on {os.cpu_count()} core(s) shared with the "
            "reads. A virtual machine whose host takes back freed guest memory (free page reporting) pays a "
            "host fault on each re-touch.")
    disk = {k: s.disk for k, s in b.series.items() if s.disk}
    if disk:
        out.append("Share of the set's bytes read from the disk while timed, per repeat: " + "; ".join(
            f"{k} " + "/".join(f"{d:.2f}" for d in v) for k, v in disk.items()) + ".")
    redo = {k: s.extra["discarded_not_hot"] for k, s in b.series.items() if s.extra.get("discarded_not_hot")}
    if redo:
        out.append("Hot attempts discarded because they read from the disk: "
                   + ", ".join(f"{k} {n}" for k, n in redo.items()) + ".")
    if b.md5_agree is not None:
        out.append("md5 of every file by the stock path matches fastio's md5 of the same files." if b.md5_agree
                   else "md5 of the stock path DIFFERS from fastio's md5 of the same files.")
    cores = os.cpu_count() or 1
    if b.load:
        first, last = b.load[0][1], b.load[-1][1]
        out.append(f"Load average (1/5/15 min) {first[0]:.2f}/{first[1]:.2f}/{first[2]:.2f} at the start, "
                   f"{last[0]:.2f}/{last[1]:.2f}/{last[2]:.2f} at the end, on {cores} cores (it counts the "
                   "benchmark's own threads waiting on the disk).")
    out.append(b.other.line())
    for s in b.series.values():
        for p in s.problems[:3]:
            out.append(f"problem ({s.key}): {p}")
    return out


def report_markdown(b: Bench, verdicts: list[dict], args, preface: list[str] = ()) -> str:
    man = b.listing.manifest
    lines = [
        "# ckptbench restore benchmark",
        "",
        *preface,
        f"Checkpoint: profile `{man.profile}`" + ("" if args.scale == 1.0 else f" × {args.scale:g}")
        + f", {man.format}, {man.world_size} rank(s), {man.param_count / 1e6:.1f} M parameters, "
        f"{b.total / MiB:.1f} MiB in {len(b.files)} files, `{args.dir}`; concurrency {b.concurrency}, block 1 MiB; "
        f"median of {b.repeat} repeat(s); GB = 10^9 bytes.",
        "",
    ]
    lines += main_table(b, verdicts)
    lines += ["", "Per-stage breakdown, hot (median seconds and share of the median RTO):", ""]
    lines += stage_table(b)
    lines += targets_section(verdicts) + section("Notes", notes(b))
    return "\n".join(lines) + "\n"


def write_report(b: Bench, verdicts: list[dict], facts: dict, args, date: str, elapsed: float) -> None:
    man = b.listing.manifest
    raw = {
        "date": date,
        "elapsed_s": elapsed,
        "machine": facts,
        "args": vars(args),
        "checkpoint": {"dir": args.dir, "profile": man.profile, "format": man.format, "ranks": man.world_size,
                       "params": man.param_count, "bytes": b.total, "files": len(b.files), "hash": man.hash},
        "measurements": [s.as_dict() for s in b.series.values()],
        "targets": verdicts,
        "load_average": [{"when": w, "1min": l[0], "5min": l[1], "15min": l[2]} for w, l in b.load],
        "other_work_core_s": b.other.share()[0],
        "md5_agree": b.md5_agree,
    }
    write_outputs("restore_bench", report_markdown(b, verdicts, args, preface(date, facts)), raw)
