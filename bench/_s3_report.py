"""The S3 benchmark's verdicts and report: targets judged on the threads backend, the default-backend
recommendation, the table and the notes."""

from __future__ import annotations

import os

from _harness import Target, fmt, judge, section, series_table, targets_section
from _s3_server import FAULT_RATE
from _s3_tools import CONC, LOW, Bench, Measure

SPEEDUP_MIN = 6.0
PEER_MIN = 1.0


def best_peer(res: dict[str, Measure]) -> Measure | None:
    peers = [m for k, m in res.items() if k.startswith("peer/") and m.median]
    return max(peers, key=lambda m: m.median) if peers else None


def judge_rows(res: dict[str, Measure]) -> tuple[dict[str, tuple[str, str]], list[dict]]:
    """Per-row (ratio text, verdict text) and the list of targets with their status. Targets are judged on the
    threads backend; crt's rows carry the same comparison for information."""
    rows: dict[str, tuple[str, str]] = {}
    verdicts = []

    def record(backend: str, v: dict, ratio: str, info: str) -> None:
        if v["status"] not in ("met", "MISSED"):
            ratio, info = "", ""
        if backend == "threads":
            verdicts.append(v)
            info = v["status"]
        rows[v["subject"]] = (ratio, info)

    for backend in ("threads", "crt"):
        v = judge(Target(f"1: ckptbench {backend} c={CONC} >= {SPEEDUP_MIN:g}× c={LOW} (crc32c, into=hash)",
                         f"{backend}/c{CONC}/hash", f"{backend}/c{LOW}/hash", low=SPEEDUP_MIN), res)
        record(backend, v, f"{v.get('detail')} c={LOW}", f"(info: {v['status']} ≥ {SPEEDUP_MIN:g}×)")
    peer = best_peer(res)
    for k, m in res.items():
        if k.startswith("peer/") and m.median and peer:
            rows[k] = (f"{m.median / peer.median:.2f}× best peer", "best peer" if m is peer else "")
    for backend in ("threads", "crt"):
        for into in ("stage", "memory"):
            v = judge(Target(f"2: ckptbench {backend} into={into} >= {PEER_MIN:g}× best peer at c={CONC}"
                             f" ({peer.tool if peer else 'none'})", f"{backend}/c{CONC}/{into}",
                             peer.key if peer else "peer/none", low=PEER_MIN), res)
            record(backend, v, f"{v.get('detail')} {peer.tool if peer else ''}",
                   f"(info: {'≥' if v['status'] == 'met' else '<'} {PEER_MIN:g}×)")
    for backend in ("threads", "crt"):
        m = res.get(f"faults/{backend}")
        if not m or not m.runs:
            continue
        run = m.runs[-1]
        clean = res.get(f"{backend}/c{CONC}/hash")
        ratio = f"{m.median / clean.median:.2f}× no faults" if m.median and clean and clean.median else ""
        retries = sum(run.extra.get("retries", {}).values())
        faults = sum(run.extra.get("proxy", {}).get("faults", {}).values())
        if backend == "threads":
            ok = run.ok and retries > 0 and faults > 0
            verdicts.append({"target": f"3: {FAULT_RATE:.0%} faults: 100 % success, every digest right, retries > 0 "
                                       "and classified", "status": "met" if ok else "MISSED",
                             "value": {"ok": run.ok, "problem": run.problem, "retries": run.extra.get("retries"),
                                       "proxy": run.extra.get("proxy")}})
            rows[m.key] = (ratio, "met" if ok else "MISSED")
        else:
            rows[m.key] = (ratio, "(info: all ok)" if run.ok else f"(info: FAILED: {run.problem[:80]})")
    return rows, verdicts


def recommend(res: dict[str, Measure]) -> tuple[str, list[str]]:
    """threads unless crt is faster in most of the measured conditions and also survives the fault run."""
    why, crt_wins, compared = [], 0, 0
    for cond in (f"c{LOW}/hash", f"c{CONC}/hash", f"c{CONC}/stage", f"c{CONC}/memory"):
        t, c = res.get(f"threads/{cond}"), res.get(f"crt/{cond}")
        if t and c and t.median and c.median:
            compared += 1
            r = c.median / t.median
            crt_wins += r >= 1.05
            why.append(f"{cond}: crt {c.median:.3f} vs threads {t.median:.3f} GB/s ({r:.2f}×)")
    ft, fc = res.get("faults/threads"), res.get("faults/crt")
    crt_robust = bool(fc and fc.ok)
    thr_robust = bool(ft and ft.ok)
    why.append(f"fault run: threads {'all ok' if thr_robust else 'FAILED'}, crt {'all ok' if crt_robust else 'FAILED'}"
               " (crt's retries happen inside awscrt and are not counted in RetryLog)")
    pick = "crt" if compared and crt_wins > compared / 2 and crt_robust else "threads"
    why.insert(0, f"crt ≥ 1.05× threads in {crt_wins} of {compared} conditions")
    return pick, why


def table(res: dict[str, Measure], rows: dict[str, tuple[str, str]]) -> list[str]:
    def label(m: Measure) -> str:
        peak = max((r.peak_conns for r in m.runs), default=0)
        return m.tool if m.skipped else f"{m.tool}: {m.config}; peak {peak} in flight"

    def cells(m: Measure) -> list[str]:
        if m.skipped:
            return ["—", m.skipped]
        ratio, verdict = rows.get(m.key, ("", ""))
        failed = [r.problem for r in m.runs if not r.ok]
        if failed:
            verdict = (verdict + " " if verdict else "") + f"{len(failed)} run(s) FAILED: {failed[0][:100]}"
        return [ratio, verdict]

    return series_table(res.values(), ("condition", "tool", "GB/s median", "min–max", "ratio", "target met?"),
                        label, lambda m, v: fmt(v, 3), cells)


def report(b: Bench, rows, verdicts, pick, why, args) -> str:
    f = b.facts
    lines = ["# S3 read benchmark", ""]
    lines += [f"- server: moto {f.get('moto')} behind ckptbench.testing.s3local's ShapingProxy, in a child process, "
              f"on {b.server.endpoint}",
              f"- data set: {b.shape.describe()} in {b.shape.files} objects, seeded random bytes, uploaded once (ckptbench upload: CRC32C, "
              f"multipart above 8 MiB); expected crc32c computed locally from the bytes",
              f"- first-byte latency: {f['latency_ms']:g} ms per request",
              f"- per-connection cap: {f['cap_bps'] / 1e6:.2f} MB/s ({f['cap_bps'] * 8 / 1e6:.1f} Mbit/s) — "
              f"{f['cap_reason']}",
              f"- unshaped ceiling (moto + proxy, concurrency {CONC}): "
              + ", ".join(f"{k} {v:.3f} GB/s" for k, v in f["ceiling"].items()),
              f"- part size 8 MiB everywhere; median of {b.repeat} repeat(s), tools alternated (order rotated each "
              "repeat); GB = 10^9 bytes; time = wall clock of the transfer (client set-up outside, except crt "
              "and aws)",
              f"- 1-minute load average: {f['load'][0]:.2f} at the start, {f['load'][-1]:.2f} at the end, "
              f"on {os.cpu_count()} cores (client and server share them; it counts the benchmark's own threads)",
              f"- {f['other_work']}",
              ""]
    lines += table(b.results, rows)
    lines += targets_section(verdicts)
    ft = b.results.get("faults/threads")
    if ft and ft.runs:
        r = ft.runs[-1]
        lines += ["", "## Fault run (threads)", "",
                  f"- objects ok: {'all' if r.ok else 'NOT ALL: ' + r.problem}; digests compared with the local crc32c",
                  f"- retries (RetryLog.counts): {r.extra.get('retries')}",
                  f"- proxy counters for the run: {r.extra.get('proxy')}"]
    fc = b.results.get("faults/crt")
    if fc and fc.runs:
        r = fc.runs[-1]
        lines += [f"- crt under the same faults: {'all ok' if r.ok else 'FAILED: ' + r.problem}; proxy "
                  f"{r.extra.get('proxy')}"]
    lines += ["", "## Default backend", "", f"Recommendation: **{pick}**", ""] + [f"- {w}" for w in why]
    lines += section("Notes", [
        "boto3: one download_file per object, with TransferConfig(max_concurrency=16, "
        "multipart_chunksize=8 MiB, multipart_threshold=8 MiB); the objects run in a 16-thread pool that "
        "shares 16 connection tokens — each object takes min(16, its 8 MiB parts) tokens (2 for 16 MiB, 1 "
        "for 256 KiB) — so at most 16 GETs are in flight.",
        f"aws: {f.get('aws')}; AWS_CONFIG_FILE with s3 max_concurrent_requests = 16, "
        "multipart_chunksize = 8MB, "
        f"addressing_style = path; the CLI's start-up (`aws s3 ls` on an empty prefix, "
        f"{f.get('aws_startup_s', 0):.2f} s) is subtracted from its wall time.",
        f"s3torchconnector: {f.get('s3torch')}; it has no connection-count setting (its CRT client sizes "
        "its pool from throughput_target_gbps, left at its default of 10 Gbit/s: at 1–4 it kept only 10 "
        "requests in flight); 16 objects are read at a time by a thread pool; the peak-in-flight figure "
        "shows what it used.",
        f"runai-model-streamer-s3: {f.get('runai')}; a FileStreamer in a child process (this venv), one range "
        "per object, owned buffers kept without a copy; RUNAI_STREAMER_OBJ_CONCURRENCY=1 with "
        "RUNAI_STREAMER_S3_MAX_CONNECTIONS=16 (its concurrency counts CRT clients, each sizing its own pool "
        "from a 10 Gbit/s target: RUNAI_STREAMER_CONCURRENCY=16 kept 72 requests in flight) and "
        "RUNAI_STREAMER_CHUNK_BYTESIZE=8 MiB; the endpoint from AWS_ENDPOINT_URL, "
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0 (path-style, as a local server needs), "
        "AWS_EC2_METADATA_DISABLED=true; one stream of the smallest object first connects and signs, outside "
        "the timing, as the s3torchconnector child's head_object does; md5 of every object checked.",
        "peak in flight: the most requests the proxy had in progress at once during the tool's runs "
        "(counted in the server process), i.e. the concurrency the tool really used.",
        f"the proxy listens with backlog {args.proxy_backlog} here (socketserver's default is 5: 16 "
        "clients connecting at once overflow it and the dropped SYNs cost a 1 s retransmit; see "
        "--proxy-backlog).",
        "ckptbench stage fsyncs each file before renaming it; boto3 and aws write without fsync.",
        "the crt backend's time includes creating its CRT client; aws's includes its own listing.",
    ])
    return "\n".join(lines) + "\n"
