"""The tools the S3 benchmark times, each reading the same objects from the local server: ckptbench (threads and
crt backends), boto3 download_file, `aws s3 cp`, and s3torchconnector and Run:ai's S3 backend in interpreters of
their own; each run checked against the data set."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from _harness import MiB, Series, Shape, log
from _s3_data import check_tree
from _s3_server import Server

PART = 8 * MiB
CONC = 16
LOW = 1
PREFIX = "ckpt"


@dataclass
class Run:
    seconds: float
    bytes: int
    ok: bool
    problem: str = ""
    peak_conns: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(kw_only=True)
class Measure(Series):
    """A tool's runs under one condition; its samples are the GB/s of the runs that succeeded."""

    tool: str
    config: str
    runs: list[Run] = field(default_factory=list)
    skipped: str = ""  # a reason when the tool could not run

    def add(self, run: Run) -> None:
        self.runs.append(run)
        if run.ok:
            self.samples.append(run.gbps)

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs)

    def as_dict(self) -> dict:
        return asdict(self) | {"median_gbps": self.median, "min_gbps": self.min, "max_gbps": self.max,
                               "valid": self.ok}


class Bench:
    def __init__(self, server: Server, shape: Shape, expected: dict[str, tuple[int, str]], repeat: int,
                 workdir: str):
        from ckptbench.sources import s3 as s3mod

        self.s3mod = s3mod
        self.server = server
        self.shape = shape
        self.expected = expected
        self.total = sum(s for s, _ in expected.values())
        self.repeat = repeat
        self.workdir = workdir
        self.url = s3mod.parse(f"s3://{server.bucket}/{PREFIX}")
        self.results: dict[str, Measure] = {}
        self.objects = None
        self.facts: dict = {}

    # ---- ckptbench -------------------------------------------------------------------------------------------
    def ours(self, backend: str, concurrency: int, into: str, retry_log=None) -> Run:
        from ckptbench.sources import ReadOptions, s3read, s3source

        s3mod = self.s3mod
        log_ = retry_log if retry_log is not None else s3mod.RetryLog()
        stage = tempfile.mkdtemp(prefix="stage-", dir=self.workdir) if into == "stage" else None
        client = s3mod.make_client(concurrency, retry_log=log_) if backend == "threads" else None
        opts = ReadOptions(concurrency=concurrency, part_size=PART, hash="crc32c", s3_client=backend)
        self.server.ask(op="peak")
        try:
            t0 = time.perf_counter()
            result = s3source.start(client, self.url, self.objects, opts, log_, into=into, stage_dir=stage).wait()
            dt = time.perf_counter() - t0
            peak = self.server.ask(op="peak")["peak"]
            problem = self._check_result(result)
            if not problem and stage:
                problem = check_tree(stage, self.expected) or ""
            return Run(dt, result.bytes, not problem, problem, peak,
                       {"retries": dict(log_.counts), "reported_gbps": result.read_gbps})
        finally:
            if stage:
                shutil.rmtree(stage, ignore_errors=True)

    def _check_result(self, result) -> str:
        bad = [f for f in result.files if f.error is not None]
        if bad:
            return f"{len(bad)} of {len(result.files)} objects failed, e.g. {bad[0].path}: {bad[0].error}"
        prefix = f"{self.url}/"
        for f in result.files:
            rel = f.path[len(prefix):]
            size, crc = self.expected[rel]
            if f.digest != crc:
                return f"{rel}: digest {f.digest}, expected {crc}"
        if result.bytes != self.total:
            return f"read {result.bytes} bytes, the data set has {self.total}"
        return ""

    # ---- boto3 download_file ---------------------------------------------------------------------------------
    def boto3_download(self) -> Run:
        """download_file per object with TransferConfig(max_concurrency=16, multipart_chunksize=8 MiB).

        16 connection tokens: each object takes min(16, its number of 8 MiB parts) of them before its download
        starts (2 for a 16 MiB object, 1 for a 256 KiB one), so at most 16 GETs are in flight at any time.
        """
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3", config=Config(max_pool_connections=CONC + 4, s3={"addressing_style": "path"},
                                retries={"mode": "standard", "max_attempts": 10}))
        cfg = TransferConfig(max_concurrency=CONC, multipart_chunksize=PART, multipart_threshold=PART)
        dest = tempfile.mkdtemp(prefix="boto3-", dir=self.workdir)
        tokens = {"free": CONC}
        cv = threading.Condition()

        def one(o) -> None:
            need = min(CONC, max(1, -(-o.size // PART)))
            with cv:
                cv.wait_for(lambda: tokens["free"] >= need)
                tokens["free"] -= need
            try:
                path = os.path.join(dest, o.rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                client.download_file(self.url.bucket, o.key, path, Config=cfg)
            finally:
                with cv:
                    tokens["free"] += need
                    cv.notify_all()

        order = sorted(self.objects, key=lambda o: -o.size)  # big first, as a scheduler that knows sizes would
        self.server.ask(op="peak")
        try:
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(CONC) as pool:
                list(pool.map(one, order))
            dt = time.perf_counter() - t0
            peak = self.server.ask(op="peak")["peak"]
            problem = check_tree(dest, self.expected) or ""
            return Run(dt, self.total, not problem, problem, peak)
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    # ---- aws s3 cp --recursive -------------------------------------------------------------------------------
    def aws_cp(self, aws: str, startup_s: float) -> Run:
        dest = tempfile.mkdtemp(prefix="awscli-", dir=self.workdir)
        self.server.ask(op="peak")
        try:
            t0 = time.perf_counter()
            out = subprocess.run([aws, "s3", "cp", "--recursive", "--only-show-errors", "--no-progress",
                                  "--endpoint-url", self.server.endpoint, f"s3://{self.url.bucket}/{PREFIX}/", dest],
                                 env=self.aws_env, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t0
            peak = self.server.ask(op="peak")["peak"]
            if out.returncode != 0:
                return Run(wall, self.total, False, f"aws exited {out.returncode}: {out.stderr.strip()[-300:]}", peak)
            problem = check_tree(dest, self.expected) or ""
            # The process's start-up (interpreter, imports, client, one request) is taken off, in the CLI's favour.
            return Run(max(1e-3, wall - startup_s), self.total, not problem, problem, peak,
                       {"wall_s": wall, "startup_s": startup_s})
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def aws_startup(self, aws: str) -> float:
        """Wall time of `aws s3 ls` on an empty prefix: start-up plus one LIST, as cp pays before its first GET."""
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run([aws, "s3", "ls", "--endpoint-url", self.server.endpoint,
                            f"s3://{self.url.bucket}/no-such-prefix/"], env=self.aws_env, capture_output=True,
                           check=False)
            times.append(time.perf_counter() - t0)
        return min(times)

    # ---- s3torchconnector ------------------------------------------------------------------------------------
    def _child(self, python: str, code: str, spec: dict, env: dict) -> Run:
        """A peer run in its own interpreter: its time, bytes and per-object md5s checked against the data set."""
        self.server.ask(op="peak")
        out = subprocess.run([python, "-c", code, json.dumps(spec)], env=env, capture_output=True, text=True,
                             check=False)
        peak = self.server.ask(op="peak")["peak"]
        if out.returncode != 0:
            return Run(1.0, 0, False, f"child exited {out.returncode}: {out.stderr.strip()[-300:]}", peak)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        bad = [rel for rel, md5 in r["md5s"].items() if self.md5s[rel] != md5]
        if len(r["md5s"]) != len(self.expected):
            bad.append(f"{len(self.expected) - len(r['md5s'])} objects missing")
        problem = f"{len(bad)} objects with a wrong md5, e.g. {bad[0]}" if bad else ""
        if r["bytes"] != self.total:
            problem = problem or f"read {r['bytes']} bytes, the data set has {self.total}"
        return Run(r["seconds"], r["bytes"], not problem, problem, peak)

    def s3torch(self, python: str) -> Run:
        spec = {"endpoint": self.server.endpoint, "bucket": self.url.bucket, "region": self.server.env["AWS_REGION"],
                "keys": [[o.key, o.rel] for o in sorted(self.objects, key=lambda o: -o.size)],
                "concurrency": CONC, "part_size": PART}
        return self._child(python, S3TORCH_CHILD, spec, self.peer_env)

    # ---- Run:ai Model Streamer (runai-model-streamer-s3) ---------------------------------------------------------
    def runai(self) -> Run:
        spec = {"bucket": self.url.bucket, "objects": [[o.key, o.rel, o.size] for o in
                                                       sorted(self.objects, key=lambda o: -o.size)]}
        return self._child(sys.executable, RUNAI_CHILD, spec, self.peer_env | RUNAI_ENV)

    def measure(self, m: Measure, fn) -> None:
        self.results.setdefault(m.key, m)
        m = self.results[m.key]
        try:
            run = fn()
        except Exception as exc:  # noqa: BLE001 - a tool that breaks is reported, not fatal
            run = Run(1.0, 0, False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        m.add(run)
        status = f"{run.gbps:.3f} GB/s" if run.ok else f"FAILED: {run.problem}"
        log(f"    {m.key:34} {status}  (peak {run.peak_conns} in flight, {run.seconds:.2f} s)")


S3TORCH_CHILD = r"""
import concurrent.futures, hashlib, json, sys, time
spec = json.loads(sys.argv[1])
from s3torchconnector import S3ClientConfig
from s3torchconnector._s3client import S3Client
cfg = S3ClientConfig(part_size=spec["part_size"], force_path_style=True,
                     throughput_target_gbps=spec.get("gbps", 10.0))
client = S3Client(spec["region"], endpoint=spec["endpoint"], s3client_config=cfg)
client.head_object(spec["bucket"], spec["keys"][0][0])  # connect and sign once, outside the timing

def one(kr):
    key, rel = kr
    data = client.get_object(spec["bucket"], key).read()
    return rel, data

t0 = time.perf_counter()
with concurrent.futures.ThreadPoolExecutor(spec["concurrency"]) as pool:
    got = list(pool.map(one, spec["keys"]))
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "bytes": sum(len(d) for _, d in got),
                  "md5s": {r: hashlib.md5(d).hexdigest() for r, d in got}}))
"""


# Run:ai reads the endpoint from AWS_ENDPOINT_URL (the server's env) and needs path-style addressing for a server
# on 127.0.0.1; IMDS stays off so nothing leaves the machine. Its concurrency counts CRT clients, each opening
# what its 10 Gbit/s target asks (16 clients kept 72 requests in flight), so one client capped at 16 connections
# reads at the concurrency every other tool here gets, in 8 MiB ranges like them.
RUNAI_ENV = {"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0", "AWS_EC2_METADATA_DISABLED": "true",
             "RUNAI_STREAMER_OBJ_CONCURRENCY": "1", "RUNAI_STREAMER_S3_MAX_CONNECTIONS": str(CONC),
             "RUNAI_STREAMER_CHUNK_BYTESIZE": str(PART), "RUNAI_STREAMER_LOG_LEVEL": "WARNING"}

RUNAI_CHILD = r"""
import hashlib, json, sys, time
spec = json.loads(sys.argv[1])
from runai_model_streamer import FileChunks, FileStreamer

def chunks(objects):
    return [FileChunks(i, f"s3://{spec['bucket']}/{key}", [0], [size]) for i, (key, _, size) in enumerate(objects)]

with FileStreamer() as fs:
    fs.stream_files(chunks(spec["objects"][-1:]))  # connect and sign once, outside the timing
    for _ in fs.get_chunks():
        pass
    t0 = time.perf_counter()
    fs.stream_files(chunks(spec["objects"]))
    got = {i: buf for i, _, buf in fs.get_chunks()}  # owned buffers (the default): kept, not copied
    dt = time.perf_counter() - t0
data = {spec["objects"][i][1]: bytes(buf.numpy()) for i, buf in got.items()}
print(json.dumps({"seconds": dt, "bytes": sum(len(d) for d in data.values()),
                  "md5s": {r: hashlib.md5(d).hexdigest() for r, d in data.items()}}))
"""
