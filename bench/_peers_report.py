"""The peers benchmark's targets and report: the loaders' table, ckptbench run's stages, the verdicts, the notes."""

from __future__ import annotations

import statistics

import _floor_bench
import _loaders
import _harness
from _harness import COLD_MAX, GiB, HOT_MIN, MiB, Series, Target, fmt, judge, preface, section
from _peers_rounds import ATTEMPTS, C_LOOP, INCIDENTAL, Bench, PeerSeries

HOT_SPEEDUP, COLD_SPEEDUP = 1.5, 1.3  # ckptbench RTO against the fastest peer
READ_BAND = (0.85, 1.15)  # run's read stage / `ckptbench read`, cold, same read path
CHECK_MAX = 0.25  # check stage / read stage


def fastest_peer(series: dict[str, Series], condition: str, peers: list[str]) -> str | None:
    """The key of the peer with the lowest median time under `condition`, or None when none was measured."""
    measured = [series[k] for k in (f"{condition}/{p}" for p in peers) if k in series and series[k].samples]
    return min(measured, key=lambda s: s.median).key if measured else None


def targets(series: dict[str, Series], peers: list[str]) -> list[Target]:
    out = []
    for condition, low in (("hot", HOT_SPEEDUP), ("cold", COLD_SPEEDUP)):
        peer = fastest_peer(series, condition, peers)
        name = peer.split("/", 1)[1] if peer else "none measured"
        out.append(Target(f"{condition}: ckptbench run ≥ {low:g}× faster than the fastest peer, {name} (peer median / "
                          "ckptbench median RTO)", f"{condition}/ckptbench", peer or f"{condition}/none", low=low,
                          invert=True, shown="{:.3f}×"))  # 1.297 must not print as a met-looking 1.30
    out.append(Target(f"cold: the run's read stage within ±15 % of `ckptbench read` on the same files with the same "
                      f"read path (paired ratio in {READ_BAND[0]}..{READ_BAND[1]})", "cold/ckptbench/read-stage",
                      "cold/ckptbench/read", low=READ_BAND[0], high=READ_BAND[1], paired=True, shown="{:.3f}×"))
    out.append(Target(f"cold: check stage ≤ {CHECK_MAX:g}× read stage (paired)", "cold/ckptbench/check-stage",
                      "cold/ckptbench/read-stage", high=CHECK_MAX, paired=True, shown="{:.3f}×"))
    return out


def verdict_lines(verdicts: list[dict]) -> list[str]:
    word = {"met": "PASS", "MISSED": "MISS", "info": "INFO"}
    return [f"{word.get(v['status'], v['status'])}: {v['target']}" + (f" — {v['detail']}" if v.get("detail") else "")
            for v in verdicts]


def ratio_cell(series: dict[str, PeerSeries], s: PeerSeries) -> str:
    """peer median / ckptbench median on a peer's row; the paired ratios on the read and check rows."""
    cond = s.condition
    if s.key == f"{cond}/ckptbench":
        return "reference"
    pairs = {f"{cond}/ckptbench/read": (f"{cond}/ckptbench/read-stage", "read stage / read = {:.3f}×"),
             f"{cond}/ckptbench/check-stage": (f"{cond}/ckptbench/read-stage", "check / read stage = {:.3f}×")}
    if s.key in pairs:
        other, text = pairs[s.key]
        subject, peer = (other, s.key) if s.key.endswith("/read") else (s.key, other)
        v = judge(Target("", subject, peer, paired=True), series)["value"]
        return text.format(v) if v is not None else "—"
    ref = series.get(f"{cond}/ckptbench")
    if (s.loader in _loaders.LOADERS or s.key.endswith("/c-loop")) and ref is not None and ref.median and s.median:
        return f"{s.median / ref.median:.2f}× ckptbench"
    return "—"


def table(b: Bench) -> list[str]:
    """A row per loader and stage; efficiency (this box's floor for the set / median seconds) leads."""
    tensor_bytes = b.meta["total_size"]
    head = ("condition", "loader", "efficiency", "paired", "median s", "min–max", "GB/s (tensor bytes)", "ratio",
            "disk share per repeat", "check")
    rows = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---|---:|---|---|---|"]
    order = [f"{c}/{k}" for c in ("cold", "hot") for k in ("ckptbench", *b.peers, "c-loop", "ckptbench/read-stage",
                                                            "ckptbench/read", "ckptbench/check-stage")]
    for s in (b.series[k] for k in order if k in b.series):
        eff = _floor_bench.efficiency(b.floors, s.key, s.median)
        pair = _floor_bench.paired(b.floors, s)
        gbps = fmt(tensor_bytes / s.median / 1e9, 2) if s.median else "—"
        disk = "/".join(f"{d:.2f}" for d in s.disk) if s.disk else "—"
        check = "ok" if s.ok and not s.problems else ("CHECK FAILED: " if not s.ok else "") + "; ".join(s.problems[:2])
        span = f"{fmt(s.min, 3)}–{fmt(s.max, 3)}" if s.samples else "—"
        rows.append("| " + " | ".join([
            s.condition_label(), s.loader, f"**{eff:.2f}**" if eff is not None else "—",
            f"**{pair['median']:.2f}**" if pair else "—", fmt(s.median, 3), span,
            gbps if s.loader in _loaders.LOADERS or s.key.endswith(("/ckptbench", "/c-loop")) else "—",
            ratio_cell(b.series, s),
            disk, check]) + " |")
    return rows


def stage_table(b: Bench) -> list[str]:
    stages = ("list", "read", "verify", "load", "device", "check")
    rows = ["| stage | cold median s | hot median s |", "|---|---:|---:|"]
    for stage in (*stages, "rto"):
        cells = []
        for cond in ("cold", "hot"):
            vals = [r["rto"] if stage == "rto" else r["stages"].get(stage) for r in b.runs if r["condition"] == cond]
            vals = [v for v in vals if v is not None]
            cells.append(f"{statistics.median(vals):.3f}" if vals else "—")
        rows.append(f"| {'**RTO**' if stage == 'rto' else stage} | " + " | ".join(cells) + " |")
    return rows


def notes(b: Bench) -> list[str]:
    first = b.runs[0] if b.runs else {}
    chosen = {c: next((r for r in b.runs if r["condition"] == c), None) for c in ("cold", "hot")}
    read = "; ".join(f"{c}: {r['read_mode']} ({r['read_why']})" for c, r in chosen.items() if r)
    out = [
        "Every measurement is a fresh process. ckptbench: `ckptbench run DIR --json --repeat 1 --cache cold|hot` with "
        f"its defaults: mode {first.get('mode')}, read-stage hash {first.get('hash')} ({first.get('hash_how')}), "
        f"concurrency {first.get('concurrency')}, "
        f"block {first.get('block_size')} B, read {first.get('read_option')}, which it resolved as {read}. Its RTO "
        "(list + read + verify + load + device + check) is taken from the JSON; its warm-up (imports, torch's first "
        "operations) is outside the RTO.",
        "Peers: bench/_loaders.py imports the loader, loads a tiny file through it once (its first-use costs, like "
        "ckptbench's warm-up), then times from listing the shards (the index) to a state dict of owned CPU tensors "
        "with every byte in memory. " + " ".join(f"{n}: {' '.join((_loaders.PREPARE[n].__doc__ or '').split())}"
                                                 for n in b.peers),
        "Same tensors: each peer's checksum (sha256 over every tensor's name, dtype, shape and "
        f"{_loaders.SAMPLES} sampled values) is compared with the generator's, with the tensor count and bytes; "
        "`ckptbench read`'s bytes with the directory's and, when it hashes crc32c, its per-file digests with the "
        "generator's. A mismatch marks the row CHECK FAILED.",
        f"`ckptbench read` command (the cold run's read path): `{' '.join(b.read_cmd[2:]) if b.read_cmd else '—'}`; "
        "its time is the read's own wall time. It reads into reused buffers, the run's read stage into the memory "
        "the state dict is built over; the cold run and the read run back to back, the order alternating per round.",
        f"cold: the files evicted (fastio.evict) and residency ≤ {COLD_MAX} checked after the eviction and again in "
        "the child right before its clock (ckptbench run and read evict and check themselves and report it); hot: "
        f"the files read into the page cache and residency ≥ {HOT_MIN} checked the same way, and a hot repeat of a "
        f"page-cache reader (ckptbench, safetensors) that read over {COLD_MAX:.0%} of the set from the disk (for "
        f"ckptbench's whole process, beyond {INCIDENTAL >> 20} MiB of its own) is run again; a repeat whose cache "
        f"state did not hold in {ATTEMPTS} attempts is refused, not reported.",
        "fastsafetensors (nogds) and Run:ai read with O_DIRECT by default: they bypass the page cache, so their hot "
        "repeats read from the device as their cold ones do (see the disk share column: the child's ru_inblock "
        "over its timed load, for peers; the whole process for ckptbench run). That is their default behaviour and "
        "is measured as such.",
        f"Bytes: the peers read the shards' {b.meta['total_size'] / MiB:.1f} MiB of tensors; ckptbench reads every "
        f"file in the directory ({b.total / MiB:.1f} MiB with headers and the index). GB/s in the table is tensor "
        "bytes / median seconds.",
        f"{C_LOOP}: bench/_floor_c.py's LAND_C in a fresh process at ckptbench run's concurrency, every file of the "
        "set into an anonymous mapping of its own in 64 MiB units (cold: O_DIRECT 1 MiB reads into pages never "
        "populated; hot: each unit populated with one MADV_POPULATE_WRITE, then pread); its clock covers the mappings "
        "and the reads; its check, after the clock, is a sum of every landed 64-bit word against the files', and the disk "
        "share. It is no loader (no tensors, no scan): it "
        "says what plain code lands in fresh memory in the same minutes, under the same cache state, as the rows.",
        f"Order: each round runs cold then hot, the loaders' order rotated each round; {b.repeat} round(s).",
        f"Settle: every contender (and every measurement of fresh memory, the floor's included) starts "
        f"{_harness.SETTLE_S:g} s after its cache state was made, so memory freed before it has gone back to a VM's "
        "host for all alike (bench/_harness.py settle(): the C loop landed the set in 0.9 s right after a free, "
        "3.7-4.1 s ten seconds later); ckptbench run keeps the state the bench made (`--cache as-is`) and checks it.",
        b.other.line(),
    ]
    versions = next((s.extra["versions"] for s in b.series.values() if s.extra.get("versions")), None)
    if versions:
        out.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    rss = {s.key: max(r for r in s.extra["peak_rss_bytes"] if r) for s in b.series.values()
           if any(s.extra.get("peak_rss_bytes", []))}
    if rss:
        out.append("Peers' peak RSS (the child's VmHWM, largest over repeats): "
                   + ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in rss.items()) + ".")
    return out


def report(b: Bench, verdicts: list[dict], args, date: str, facts: dict | None = None,
           agree: list[dict] | None = None) -> str:
    spec = b.meta["ckptbench_peers"]["spec"]
    lines = ["# ckptbench against the loaders users pick instead", ""]
    lines += preface(date, facts) if facts else [f"Date: {date}", ""]
    lines += [f"Checkpoint: foreign safetensors (no manifest), {spec['layers']} layers of bf16 MLP weights (hidden "
              f"{spec['hidden']}, intermediate {spec['intermediate']}), {b.meta['ckptbench_peers']['tensors']} tensors, "
              f"{b.meta['total_size'] / GiB:.2f} GiB in {len(b.shards)} shard(s) + index, `{b.dir}`; median of "
              f"{b.repeat} round(s){' (--quick)' if args.quick else ''}; GB = 10^9 bytes.", ""]
    lines += ["Efficiency = this box's floor for the set's bytes (measured in this run, below) / the row's median "
              "seconds: 1.00 is the box's best; hot rows against fresh memory populated, then copied into from the "
              "page cache; cold rows against the storage figure read into fresh memory; `ckptbench read` (reused "
              "buffers) against storage alone. Paired: each repeat against that floor with its fresh-memory part "
              "re-measured right before the repeat, after the same settle (the host's fresh memory drifts over the "
              "rounds), the median over the repeats; the targets are judged on it (the cold floor is the larger of "
              "the storage figure read into fresh memory and that fresh-memory part).", ""]
    lines += table(b)
    lines += ["", "ckptbench run's stages (median seconds):", ""] + stage_table(b)
    lines += section("Targets", verdict_lines(verdicts))
    if b.floor is not None:
        lines += section("This box's floor, measured in this run on the set's files",
                         _floor_bench.ceilings_lines(b.floor, b.floors, b.total))
    if agree:
        lines += section("Does the floor agree with independent tools? (floor / tool; ±10 %)", verdict_lines(agree))
    lines += section("Notes", notes(b))
    return "\n".join(lines) + "\n"
