"""S3 benchmark: ckptbench's S3 reads (threads and crt backends) against boto3, the AWS CLI, s3torchconnector and
the Run:ai Model Streamer's S3 backend.

Everything talks to one local S3 (moto behind ckptbench.testing.s3local's shaping proxy) on 127.0.0.1, run in a child
process so the server's threads do not share a GIL with the clients being measured. One run: the server starts
unshaped, the data set is uploaded once, the unshaped ceiling is measured, then first-byte latency and a
per-connection bandwidth cap are applied and every tool reads the same objects; last, faults are switched on.

Prints a Markdown report to stdout (progress goes to stderr) and writes bench/out/s3_bench.{md,json}.
Exit status 0 even when a target is missed; 2 when a needed package is missing. Here: the phases of the run (the
ceiling, the shaped runs, the faults); the server, the data set, the tools, the peers' installs and the report are
in bench/_s3_*.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict

import _peers  # bench/ is this script's directory, first on sys.path
from _harness import KiB, MiB, OUT_DIR, Shape, log, missing, rotated, utc_now, write_outputs
from _s3_data import make_dataset
from _s3_install import find_aws, find_runai, find_s3torch
from _s3_report import judge_rows, recommend, report
from _s3_server import FAULT_RATE, FAULT_SEED, Server
from _s3_tools import CONC, LOW, PREFIX, Bench, Measure

CAP_DIVISOR = 24  # cap per connection = unshaped ceiling / this: 16 connections use two thirds of the ceiling


def measure_ceiling(b: Bench, repeat: int) -> tuple[float, dict]:
    """Unshaped (no latency, no cap): what moto + proxy serve to the fastest of our clients at concurrency 16."""
    b.server.shape(0.0, None)
    seen = {}
    for backend in ("threads", "crt"):
        m = Measure(f"ceiling/{backend}", "unshaped (ceiling probe)", "GB/s", tool=f"ckptbench {backend}",
                    config=f"concurrency {CONC}, crc32c, into=hash, no latency, no cap")
        for _ in range(repeat):
            b.measure(m, lambda: b.ours(backend, CONC, "hash"))
        if m.median:
            seen[backend] = m.median
    return max(seen.values()) if seen else 0.0, seen


def main_runs(b: Bench, aws: str | None, aws_why: str, torch_py: str | None, torch_why: str, runai: bool,
              runai_why: str) -> None:
    cond1 = f"c={LOW}"
    cond16 = f"c={CONC}"
    plan = []  # (Measure, fn); every repeat runs each once, the order rotated per repeat
    for backend in ("threads", "crt"):
        for c, cond in ((LOW, cond1), (CONC, cond16)):
            plan.append((Measure(f"{backend}/c{c}/hash", cond, "GB/s", tool=f"ckptbench {backend}",
                                 config=f"concurrency {c}, crc32c, into=hash"),
                         lambda backend=backend, c=c: b.ours(backend, c, "hash")))
        for into in ("stage", "memory"):
            plan.append((Measure(f"{backend}/c{CONC}/{into}", cond16, "GB/s", tool=f"ckptbench {backend}",
                                 config=f"concurrency {CONC}, crc32c, into={into}"),
                         lambda backend=backend, into=into: b.ours(backend, CONC, into)))
    plan.append((Measure("peer/boto3", cond16, "GB/s", tool="boto3 download_file",
                         config=f"TransferConfig(max_concurrency={CONC}, multipart_chunksize=8 MiB), objects in a "
                         f"{CONC}-thread pool sharing {CONC} connection tokens, to files"),
                 b.boto3_download))
    m_aws = Measure("peer/awscli", cond16, "GB/s", tool="aws s3 cp --recursive",
                    config=f"max_concurrent_requests={CONC}, multipart_chunksize=8MB, to files; start-up subtracted",
                    note=aws_why)
    if aws:
        startup = b.aws_startup(aws)
        b.facts["aws_startup_s"] = startup
        plan.append((m_aws, lambda: b.aws_cp(aws, startup)))
    else:
        m_aws.skipped = aws_why
        b.results[m_aws.key] = m_aws
    m_torch = Measure("peer/s3torchconnector", cond16, "GB/s", tool="s3torchconnector",
                      config=f"S3Client.get_object(...).read() per object, {CONC}-thread pool, to memory",
                      note=torch_why)
    if torch_py:
        plan.append((m_torch, lambda: b.s3torch(torch_py)))
    else:
        m_torch.skipped = torch_why
        b.results[m_torch.key] = m_torch
    m_runai = Measure("peer/runai-s3", cond16, "GB/s", tool="runai-model-streamer-s3",
                      config=f"FileStreamer, one range per object, one client with RUNAI_STREAMER_S3_MAX_CONNECTIONS="
                      f"{CONC}, RUNAI_STREAMER_CHUNK_BYTESIZE=8 MiB, to memory", note=runai_why)
    if runai:
        plan.append((m_runai, b.runai))
    else:
        m_runai.skipped = runai_why
        b.results[m_runai.key] = m_runai
    for m, _ in plan:
        b.results[m.key] = m
    for r in range(b.repeat):
        log(f"  repeat {r + 1} of {b.repeat}")
        for m, fn in rotated(plan, r):
            b.measure(m, fn)


def fault_runs(b: Bench, latency_s: float, cap_bps: float) -> None:
    before = b.server.ask(op="counters")
    for backend in ("threads", "crt"):
        b.server.shape(latency_s, cap_bps, FAULT_RATE, fault_kinds=("slowdown", "reset"), seed=FAULT_SEED)
        c0 = b.server.ask(op="counters")
        retry_log = b.s3mod.RetryLog()
        m = Measure(f"faults/{backend}", f"c={CONC}, {FAULT_RATE:.0%} faults", "GB/s", tool=f"ckptbench {backend}",
                    config=f"concurrency {CONC}, crc32c, into=hash, slowdown+reset, seed {FAULT_SEED}")
        b.measure(m, lambda: b.ours(backend, CONC, "hash", retry_log))
        c1 = b.server.ask(op="counters")
        run = m.runs[-1]
        run.extra["proxy"] = {
            "requests": c1["requests"] - c0["requests"],
            "faults": {k: c1["faults"].get(k, 0) - c0["faults"].get(k, 0) for k in c1["faults"]},
            "resets": {k: c1["resets"].get(k, 0) - c0["resets"].get(k, 0) for k in c1["resets"]},
        }
        run.extra["retries"] = dict(retry_log.counts)
        b.results[m.key] = m
    b.server.shape(latency_s, cap_bps, 0.0)
    b.facts["proxy_counters_before_faults"] = before


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small data set (4 × 16 MiB + 16 × 256 KiB), 1 repeat")
    ap.add_argument("--repeat", type=int, help="repeats per figure (default 3; 1 with --quick)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="first-byte latency per request (default 20)")
    ap.add_argument("--cap-mbps", type=float, default=0.0,
                    help="per-connection cap in Mbit/s, like s3local's --bandwidth-mbps (default: the measured "
                         f"unshaped ceiling / {CAP_DIVISOR})")
    ap.add_argument("--skip-peers", action="store_true", help="measure ckptbench only")
    ap.add_argument("--proxy-backlog", type=int, default=128,
                    help="listen backlog of the shaping proxy (socketserver's default is 5; see the notes)")
    args = ap.parse_args(argv)
    args.shape = Shape(4, 16 * MiB, 16, 256 * KiB) if args.quick else Shape(16, 16 * MiB, 64, 256 * KiB)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = missing("s3_bench", modules=("fastio", "boto3", "moto", "awscrt"), install="pip install -e .[s3]")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import moto

    t_start = time.monotonic()
    load = [os.getloadavg()[0]]
    other = _peers.OtherWork()
    workdir = tempfile.mkdtemp(prefix="ckptbench-s3bench-")
    server = Server(args.proxy_backlog)
    other.add_helper(server.proc.pid)  # the S3 server is part of the benchmark, not other work
    try:
        os.environ.update(server.env)  # ckptbench's S3 code reads the endpoint and credentials from here
        for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            os.environ.pop(k, None)
        cfg = os.path.join(workdir, "aws-config")
        with open(cfg, "w") as f:
            f.write(f"[default]\nregion = {server.env['AWS_REGION']}\ns3 =\n  max_concurrent_requests = {CONC}\n"
                    "  multipart_chunksize = 8MB\n  addressing_style = path\n")
        peer_env = dict(os.environ, AWS_CONFIG_FILE=cfg, AWS_SHARED_CREDENTIALS_FILE=os.path.join(workdir, "none"))
        src = os.path.join(workdir, "src")
        log(f"data set: {args.shape.describe()} in {args.shape.files} objects")
        expected, md5s = make_dataset(src, args.shape)
        from ckptbench.sources import s3 as s3mod

        url = s3mod.parse(f"s3://{server.bucket}/{PREFIX}")
        t0 = time.perf_counter()
        s3mod.upload(src, url, concurrency=CONC)
        log(f"uploaded in {time.perf_counter() - t0:.1f} s (unshaped)")
        shutil.rmtree(src)
        b = Bench(server, args.shape, expected, args.repeat, workdir)
        b.aws_env = b.peer_env = peer_env
        b.md5s = md5s
        b.objects = s3mod.list_objects(s3mod.make_client(CONC), url)
        b.facts.update(moto=moto.__version__, latency_ms=args.latency_ms, load=load)

        log("unshaped ceiling")
        ceiling, seen = measure_ceiling(b, 1 if args.quick else 2)
        b.facts["ceiling"] = seen
        if args.cap_mbps > 0:
            cap = args.cap_mbps * 1e6 / 8
            reason = "set with --cap-mbps"
        else:
            cap = ceiling * 1e9 / CAP_DIVISOR
            reason = (f"unshaped ceiling {ceiling:.3f} GB/s / {CAP_DIVISOR}: {CONC} capped connections then ask for "
                      f"{CONC / CAP_DIVISOR:.0%} of what moto + proxy can serve, so the server is not the bottleneck "
                      f"at concurrency {CONC}")
        b.facts.update(cap_bps=cap, cap_reason=reason)
        log(f"cap: {cap / 1e6:.2f} MB/s per connection ({reason})")

        aws, aws_why, torch_py, torch_why = None, "skipped (--skip-peers)", None, "skipped (--skip-peers)"
        runai, runai_why = False, "skipped (--skip-peers)"
        if not args.skip_peers:
            aws, aws_why = find_aws(peer_env)
            torch_py, torch_why = find_s3torch()
            runai, runai_why = find_runai()
            log(f"aws: {aws_why}\ns3torchconnector: {torch_why}\nrunai-model-streamer-s3: {runai_why}")
        b.facts.update(aws=aws_why, s3torch=torch_why, runai=runai_why)

        latency_s = args.latency_ms / 1000
        server.shape(latency_s, cap)
        log(f"shaped: {args.latency_ms:g} ms, {cap / 1e6:.2f} MB/s per connection")
        main_runs(b, aws, aws_why, torch_py, torch_why, runai, runai_why)
        log(f"faults: {FAULT_RATE:.0%}, slowdown+reset, seed {FAULT_SEED}")
        fault_runs(b, latency_s, cap)
        load.append(os.getloadavg()[0])
        b.facts["other_work"] = other.line()
        rows, verdicts = judge_rows(b.results)
        pick, why = recommend(b.results)
        text = report(b, rows, verdicts, pick, why, args)
        print(text, end="")
        date = utc_now()
        raw = {"date": date, "args": {k: v for k, v in vars(args).items() if k != "shape"},
               "dataset": {**asdict(args.shape), "bytes": b.total},
               "facts": {k: v for k, v in b.facts.items()}, "endpoint": server.endpoint,
               "measurements": [m.as_dict() for m in b.results.values()], "targets": verdicts,
               "recommended_backend": pick, "recommendation_reasons": why,
               "cores": os.cpu_count(), "seconds": time.monotonic() - t_start}
        write_outputs("s3_bench", f"Date: {date}\n\n" + text, raw)
        log(f"done in {time.monotonic() - t_start:.0f} s; wrote {OUT_DIR}/s3_bench.md and .json")
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
