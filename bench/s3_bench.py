"""S3 benchmark: ckptbench's S3 reads (threads and crt backends) against boto3, the AWS CLI, s3torchconnector and
the Run:ai Model Streamer's S3 backend.

Everything talks to one local S3 (moto behind ckptbench.s3local's shaping proxy) on 127.0.0.1, run in a child
process so the server's threads do not share a GIL with the clients being measured. One run: the server starts
unshaped, the data set is uploaded once, the unshaped ceiling is measured, then first-byte latency and a
per-connection bandwidth cap are applied and every tool reads the same objects; last, faults are switched on.

Prints a Markdown report to stdout (progress goes to stderr) and writes bench/out/s3_bench.{md,json}.
Exit status 0 even when a target is missed; 2 when a needed package is missing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import _peers  # bench/ is this script's directory, first on sys.path
from _harness import (OUT_DIR, ROOT, Series, Shape, Target, child_env, fmt, judge, log, missing, section,
                      series_table, targets_section, utc_now, write_outputs)

MiB = 1 << 20
KiB = 1 << 10
PART = 8 * MiB
CONC = 16
LOW = 1
SEED = 20240611
FAULT_RATE = 0.05
FAULT_SEED = 7
CAP_DIVISOR = 24  # cap per connection = unshaped ceiling / this: 16 connections use two thirds of the ceiling
SPEEDUP_MIN = 6.0
PEER_MIN = 1.0
PEER_VENV = os.path.join(tempfile.gettempdir(), "ckptbench-s3peers")
BUCKET = "ckptbench-s3bench"
PREFIX = "ckpt"


# --------------------------------------------------------------------------------------------------------------
# The server child: local_s3 in its own process, driven by one JSON command per line on stdin.

def serve(backlog: int) -> int:
    from ckptbench import s3local
    from ckptbench.s3local import local_s3

    # socketserver listens with a backlog of 5: 16 clients connecting at once overflow it, the kernel drops the
    # extra SYNs and those connections wait for the 1 s SYN retransmit. Real S3 does not do that, so the harness
    # raises the backlog (set before the proxy binds); --proxy-backlog 5 measures the server as it ships.
    s3local._ProxyServer.request_queue_size = backlog

    # Requests in flight at the proxy (accepted, response not yet finished): the most at once is the
    # concurrency a client really used, whatever its settings say. Counted around the proxy's per-request entry.
    flight = {"now": 0, "peak": 0}
    lock = threading.Lock()
    inner = s3local._Handler._proxy_one

    def counted(handler) -> None:
        with lock:
            flight["now"] += 1
            flight["peak"] = max(flight["peak"], flight["now"])
        try:
            inner(handler)
        finally:
            with lock:
                flight["now"] -= 1

    s3local._Handler._proxy_one = counted
    with local_s3(latency_s=0.0, bandwidth_bps=None, fault_rate=0.0, seed=FAULT_SEED) as s3:
        proxy = s3.proxy
        bucket = s3.make_bucket(BUCKET)
        print(json.dumps({"env": s3.env, "endpoint": s3.endpoint_url, "bucket": bucket}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            reply: dict = {"ok": True}
            if op == "shape":
                proxy.latency_s = cmd["latency_s"]
                proxy.bandwidth_bps = cmd["bandwidth_bps"] or None
                proxy.fault_kinds = tuple(cmd.get("fault_kinds", ("slowdown", "reset")))
                if "seed" in cmd:  # a fresh generator, so the fault phase draws the same sequence every run
                    proxy._rng = random.Random(cmd["seed"])
                proxy.fault_rate = cmd["fault_rate"]
            elif op == "counters":
                reply = proxy.counters()
            elif op == "peak":
                with lock:
                    reply = {"peak": flight["peak"], "now": flight["now"]}
                    flight["peak"] = flight["now"]
            elif op == "stop":
                print(json.dumps(reply), flush=True)
                break
            print(json.dumps(reply), flush=True)
    return 0


class Server:
    """The parent's handle on the server child."""

    def __init__(self, backlog: int = 128) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", "--proxy-backlog",
                                      str(backlog)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
        hello = json.loads(self.proc.stdout.readline())
        self.env, self.endpoint, self.bucket = hello["env"], hello["endpoint"], hello["bucket"]

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def shape(self, latency_s: float, bandwidth_bps: float | None, fault_rate: float = 0.0, **kw) -> None:
        self.ask(op="shape", latency_s=latency_s, bandwidth_bps=bandwidth_bps, fault_rate=fault_rate, **kw)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(op="stop")
                self.proc.wait(timeout=20)
            except (OSError, ValueError, subprocess.TimeoutExpired, json.JSONDecodeError):
                self.proc.kill()
                self.proc.wait()


# --------------------------------------------------------------------------------------------------------------
# The data set.

def make_dataset(directory: str, shape: Shape) -> tuple[dict[str, tuple[int, str]], dict[str, str]]:
    """Seeded random bytes written under directory; returns rel -> (size, crc32c) and rel -> md5 of those bytes."""
    import hashlib

    import fastio

    rng = random.Random(SEED)
    out, md5s = {}, {}
    names = [(f"big/shard-{i:03d}.bin", shape.big_size) for i in range(shape.big_files)]
    names += [(f"small/tensor-{i:03d}.bin", shape.small_size) for i in range(shape.small_files)]
    for rel, size in names:
        data = rng.randbytes(size)
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        h = fastio.Hasher("crc32c")
        h.update(data)
        out[rel] = (size, h.hexdigest())
        md5s[rel] = hashlib.md5(data).hexdigest()  # the s3torchconnector child checks with hashlib alone
    return out, md5s


def crc_file(path: str) -> str:
    import fastio

    h = fastio.Hasher("crc32c")
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def check_tree(directory: str, expected: dict[str, tuple[int, str]]) -> str | None:
    """None when every expected file is there with the right size and crc32c; else what is wrong."""
    for rel, (size, crc) in expected.items():
        path = os.path.join(directory, rel)
        if not os.path.isfile(path):
            return f"{rel}: missing"
        if os.path.getsize(path) != size:
            return f"{rel}: {os.path.getsize(path)} bytes, expected {size}"
        if crc_file(path) != crc:
            return f"{rel}: crc32c differs"
    return None


# --------------------------------------------------------------------------------------------------------------
# Measurements.

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
        from ckptbench.sources import ReadOptions, s3read

        s3mod = self.s3mod
        log_ = retry_log if retry_log is not None else s3mod.RetryLog()
        stage = tempfile.mkdtemp(prefix="stage-", dir=self.workdir) if into == "stage" else None
        client = s3mod.make_client(concurrency, retry_log=log_) if backend == "threads" else None
        opts = ReadOptions(concurrency=concurrency, part_size=PART, hash="crc32c", s3_client=backend)
        self.server.ask(op="peak")
        try:
            t0 = time.perf_counter()
            result = s3read.start(client, self.url, self.objects, opts, log_, into=into, stage_dir=stage).wait()
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


# --------------------------------------------------------------------------------------------------------------
# Peers: where they come from.

def find_aws(env: dict) -> tuple[str | None, str]:
    """The `aws` on PATH, or one installed into a venv under /tmp; (path or None, how or why not)."""
    aws = shutil.which("aws")
    if aws:
        out = subprocess.run([aws, "--version"], capture_output=True, text=True, env=env, check=False)
        if out.returncode == 0:
            return aws, (out.stdout or out.stderr).strip()
    venv_aws = os.path.join(PEER_VENV, "bin", "aws")
    if not os.path.exists(venv_aws):
        log(f"aws not found: installing awscli into {PEER_VENV}")
        err = ensure_venv() or pip_install(["awscli"])
        if err:
            return None, f"not installed: {err}"
    out = subprocess.run([venv_aws, "--version"], capture_output=True, text=True, env=env, check=False)
    return (venv_aws, (out.stdout or out.stderr).strip()) if out.returncode == 0 else (None, "not installed: broken")


def ensure_venv() -> str | None:
    if os.path.exists(os.path.join(PEER_VENV, "bin", "python")):
        return None
    out = subprocess.run([sys.executable, "-m", "venv", PEER_VENV], capture_output=True, text=True, check=False)
    return None if out.returncode == 0 else f"venv failed: {out.stderr.strip()[-200:]}"


def pip_install(pkgs: list[str]) -> str | None:
    out = subprocess.run([os.path.join(PEER_VENV, "bin", "pip"), "install", "--quiet", *pkgs],
                         capture_output=True, text=True, check=False)
    return None if out.returncode == 0 else f"pip install {' '.join(pkgs)} failed: {out.stderr.strip()[-200:]}"


def pip_plan(pkgs: list[str]) -> tuple[list[tuple[str, str]] | None, str]:
    """What `pip install pkgs` would install into the peer venv (a dry run), as (name, version) pairs."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = f.name
    try:
        out = subprocess.run([os.path.join(PEER_VENV, "bin", "pip"), "install", "--dry-run", "--quiet", "--report",
                              report, *pkgs], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            return None, out.stderr.strip().splitlines()[-1][:200] if out.stderr.strip() else "pip failed"
        with open(report) as f:
            r = json.load(f)
        return [(i["metadata"]["name"], i["metadata"]["version"]) for i in r.get("install", [])], ""
    finally:
        os.unlink(report)


def find_runai() -> tuple[bool, str]:
    """runai-model-streamer-s3 in this venv (the `bench` extra); (usable, its version or why not)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        import runai_model_streamer  # noqa: F401
        import runai_model_streamer_s3  # noqa: F401
    except ImportError as exc:
        return False, f"not installed ({exc.name}): pip install -c constraints.txt -e '.[bench]'"
    try:
        return True, f"runai-model-streamer-s3 {version('runai-model-streamer-s3')} in {sys.prefix}"
    except PackageNotFoundError:
        return True, "runai-model-streamer-s3 (version unknown)"


def find_s3torch() -> tuple[str | None, str]:
    """s3torchconnector in the /tmp peer venv, installed there if needed, never with a CUDA torch (gigabytes).

    The unpinned install resolves to the newest torch, which drags in the CUDA wheels; so the plan is checked
    with a dry run and torch is pinned to the CPU build the project's venv uses (a local wheel here) when needed.
    """
    python = os.path.join(PEER_VENV, "bin", "python")
    probe = ("import s3torchconnector, s3torchconnectorclient, torch; "
             "print(s3torchconnectorclient.__version__, torch.__version__)")
    if os.path.exists(python):
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            v, tv = out.stdout.split()
            return python, f"s3torchconnector {v} (torch {tv}) in {PEER_VENV}"
    err = ensure_venv()
    if err:
        return None, f"not installed: {err}"
    attempts = [["s3torchconnector"]]
    try:
        import torch

        if "+cpu" in torch.__version__:
            attempts.insert(0, ["s3torchconnector", f"torch=={torch.__version__}"])
    except ImportError:
        pass
    why = "no plan"
    for pkgs in attempts:
        plan, err = pip_plan(pkgs)
        if plan is None:
            why = err
            continue
        heavy = [n for n, _ in plan if n.lower().startswith(("nvidia-", "triton", "cuda-"))]
        if heavy:
            torch_v = dict((n.lower(), v) for n, v in plan).get("torch", "?")
            why = f"would pull torch {torch_v} with {len(heavy)} CUDA packages (gigabytes)"
            continue
        log(f"installing {' '.join(pkgs)} into {PEER_VENV}")
        err = pip_install(pkgs)
        if err:
            why = err
            continue
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            v, tv = out.stdout.split()
            return python, f"s3torchconnector {v} (torch {tv}) in {PEER_VENV}"
        why = f"import failed: {out.stderr.strip()[-200:]}"
    return None, f"not installed: {why}"


# --------------------------------------------------------------------------------------------------------------
# The run.

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
        k = r % len(plan)
        for m, fn in plan[k:] + plan[:k]:
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


# --------------------------------------------------------------------------------------------------------------
# Targets, recommendation, report.

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
    lines += [f"- server: moto {f.get('moto')} behind ckptbench.s3local's ShapingProxy, in a child process, "
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


# --------------------------------------------------------------------------------------------------------------

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
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.shape = Shape(4, 16 * MiB, 16, 256 * KiB) if args.quick else Shape(16, 16 * MiB, 64, 256 * KiB)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve(args.proxy_backlog)
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
