"""An s3://bucket/prefix SOURCE for run (fused, staged, dcp), sweep and check; retries counted and classified under
injected faults; credentials never in output, logs or results."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import glob
import json
import os
import subprocess
import sys
import tempfile
import threading

import crc32c
import pytest
from s3help import files_under, put_dir

import ckptbench.cli.run  # noqa: F401  (imported outside any per-test capture: see run_cli)
from ckptbench.sources import s3 as s3mod
from ckptbench.sources import ReadOptions, s3read, s3source

MiB = 1 << 20
PARTIAL = s3read.STAGE_SUFFIX
STAGED_NOTE = "staged to local files first, loaded from there"


def gen(root, fmt: str | None = None, digest: str = "crc32c") -> str:
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    generate(profiles.load("small").scaled(0.02), str(root), fmt=fmt, force=True, digest=digest)
    return str(root)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("s3run")
    return {"safetensors": gen(base / "st"), "dcp": gen(base / "dcp", fmt="dcp"),
            "md5": gen(base / "md5", digest="md5")}


@pytest.fixture(scope="module")
def remote(s3server, ckpts) -> dict[str, str]:
    """Each checkpoint under its own prefix of one bucket on the session server: name -> s3:// URL."""
    bucket = s3server.make_bucket()
    direct = s3server.client(direct=True)
    for name, root in ckpts.items():
        put_dir(direct, bucket, f"ckpts/{name}", root)
    return {name: f"s3://{bucket}/ckpts/{name}" for name in ckpts}


def set_env(monkeypatch, env: dict) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def run_cli(capsys, *args):
    """The CLI in this process. Output is captured by redirecting sys.stdout/err (not capsys): cli_run's progress
    line binds sys.stderr as a default argument when first imported, and capsys closes its streams per test."""
    from ckptbench.cli import root as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in args])
        except SystemExit as exc:
            rc = exc.code
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return rc, out.getvalue(), err.getvalue()


def stage_temps() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "ckptbench-stage-*")))


# ---- run ----


@pytest.mark.parametrize("mode", ["fused", "staged"])
def test_run_s3_source(s3env, remote, ckpts, tmp_path, capsys, mode):
    before = stage_temps()
    rc, out, err = run_cli(capsys, "run", remote["safetensors"], "--mode", mode, "--repeat", "1", "--json",
                           "--part-size", "512K", "-c", "4", "--results", tmp_path / "r.csv")
    assert rc == 0, err
    doc = json.loads(out)
    local = files_under(ckpts["safetensors"])
    assert doc["status"] == "ok" and doc["success_rate"] == 1.0
    assert doc["format"] == "safetensors" and doc["source"] == remote["safetensors"]
    assert doc["files"] == len(local) and doc["bytes"] == sum(map(len, local.values()))
    assert doc["errors"] == {}
    rep = doc["repeats"][0]
    assert rep["problems"] == [] and rep["status"] == "ok"
    assert all(rep["stages"][s] is not None for s in ("list", "read", "verify", "load", "check"))
    if mode == "staged":
        assert rep["notes"]["load"] == STAGED_NOTE
    else:
        assert "hashed during read" in rep["notes"]["verify"]
    assert stage_temps() == before  # its own temporary stage directory is gone
    rows = open(tmp_path / "r.csv").read().splitlines()
    assert len(rows) == 2 and remote["safetensors"] in rows[1]


def test_run_s3_with_stage_dir_keeps_verified_files(s3env, remote, ckpts, tmp_path, capsys):
    stage = tmp_path / "stage"
    rc, out, err = run_cli(capsys, "run", remote["safetensors"], "--stage-dir", stage, "--repeat", "1", "--json",
                           "--part-size", "256K", "-c", "8", "--results", tmp_path / "r.csv")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["success_rate"] == 1.0 and doc["status"] == "ok"
    assert doc["repeats"][0]["notes"]["load"] == STAGED_NOTE
    staged = files_under(stage)
    assert staged == files_under(ckpts["safetensors"])
    assert not [p for p in staged if p.endswith(PARTIAL)]


def test_run_s3_dcp_fused_loads_from_memory(s3env, remote, ckpts, tmp_path, capsys):
    """DCP from S3 in fused mode: the shards and .metadata are served from the read buffers, nothing is staged."""
    before = stage_temps()
    rc, out, err = run_cli(capsys, "run", remote["dcp"], "--mode", "fused", "--repeat", "1", "--json",
                           "--part-size", "1M", "--results", tmp_path / "r.csv")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["format"] == "dcp"
    assert doc["status"] == "ok" and doc["success_rate"] == 1.0 and doc["errors"] == {}
    assert "staged" not in doc["repeats"][0]["notes"].get("load", "")  # no staging note: loaded from memory
    assert doc["repeats"][0]["stages"]["load"] >= 0
    assert stage_temps() == before


def test_run_s3_md5_manifest_checked_with_etags(s3env, remote, tmp_path, capsys):
    """A manifest of MD5 digests: the read hashes md5, which S3's single-part ETags confirm as well."""
    rc, out, err = run_cli(capsys, "run", remote["md5"], "--repeat", "1", "--json", "--results", tmp_path / "r.csv")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["status"] == "ok" and doc["success_rate"] == 1.0


def test_run_s3_wrong_bytes_fail_against_the_manifest(s3server, s3env, ckpts, tmp_path, capsys):
    """An object whose bytes differ from the manifest's digest (same size): not restored, status failed."""
    bucket = s3server.make_bucket()
    direct = s3server.client(direct=True)
    put_dir(direct, bucket, "c", ckpts["safetensors"])
    rel = "tokenizer.json"
    data = bytearray(files_under(ckpts["safetensors"])[rel])
    data[100] ^= 0xFF
    direct.put_object(Bucket=bucket, Key=f"c/{rel}", Body=bytes(data))
    rc, out, err = run_cli(capsys, "run", f"s3://{bucket}/c", "--repeat", "1", "--json", "--results",
                           tmp_path / "r.csv")
    assert rc == 1
    doc = json.loads(out)
    assert doc["status"] == "failed"
    assert doc["success_rate"] == pytest.approx((doc["files"] - 1) / doc["files"])
    assert doc["errors"] == {"digest_mismatch": 1}
    assert any(rel in p and f"{crc32c.crc32c(bytes(data)):08x}" in p for p in doc["repeats"][0]["problems"])


# ---- sweep and check ----


def test_sweep_s3_source(s3env, remote, capsys):
    rc, out, err = run_cli(capsys, "sweep", remote["safetensors"], "--levels", "1,4", "--repeat", "1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["source"] == remote["safetensors"] and doc["levels"] == [1, 4]
    assert set(doc["gbps"]) == {"1", "4"} and all(v["median"] > 0 for v in doc["gbps"].values())
    assert doc["knee"] in (1, 4) and doc["cache"] == "n/a (s3)"


def test_check_s3_source(s3env, remote, capsys):
    rc, out, err = run_cli(capsys, "check", remote["safetensors"], "--json")
    doc = json.loads(out)
    assert doc["source"] == remote["safetensors"]
    net = next(i for i in doc["items"] if i["title"] == "Network path")
    assert net["evidence"]["endpoint_host"] == "127.0.0.1" and net["verdict"] == "ok"
    assert len(doc["items"]) >= 5
    assert doc["summary"]["fail"] == 0 and doc["ok"] is True and rc == 0, doc["summary"]


# ---- retries, counted and classified ----


@pytest.fixture(scope="module")
def upload_to(ckpts):
    """upload_to(server) -> s3:// URL of the safetensors checkpoint put on that server (straight to moto)."""
    def put(server) -> str:
        bucket = server.make_bucket()
        put_dir(server.client(direct=True), bucket, "ck", ckpts["safetensors"])
        return f"s3://{bucket}/ck"
    return put


def test_run_retries_faults_and_classifies_them(s3faulty, upload_to, ckpts, monkeypatch, tmp_path):
    """Under 503 SlowDown and connection resets (before and mid-body) on ~12 % of requests: every file restored
    and verified, and the retries, by class, are the faults the proxy handed out."""
    from ckptbench.restore import runner as pipeline

    server = s3faulty(fault_rate=0.0, seed=3)
    url = upload_to(server)
    set_env(monkeypatch, server.env)
    server.proxy.fault_rate = 0.12
    stage = tmp_path / "stage"
    (rep,) = pipeline.run(url, pipeline.RunOptions.make(mode="staged", concurrency=4, part_size=256 * 1024,
                                                   stage_dir=str(stage)), repeats=1)
    faults = server.proxy.counters()["faults"]
    assert rep.status == "ok" and rep.problems == [], rep.problems
    assert rep.success_rate == 1.0 and rep.errors == {}
    assert files_under(stage) == files_under(ckpts["safetensors"])  # every byte, and no partial file
    assert sum(faults.values()) > 0
    assert rep.retries > 0
    assert set(rep.retry_classes) <= {s3mod.THROTTLING, s3mod.CONNECTION_RESET}, rep.retry_classes
    assert (s3mod.THROTTLING in rep.retry_classes) == (faults["slowdown"] > 0)
    assert (s3mod.CONNECTION_RESET in rep.retry_classes) == (faults["reset"] > 0)
    # each injected fault failed exactly one attempt, and each failed attempt was retried and counted once
    assert rep.retry_classes.get(s3mod.THROTTLING, 0) == faults["slowdown"]
    assert rep.retry_classes.get(s3mod.CONNECTION_RESET, 0) == faults["reset"]


def test_read_retries_classified_per_fault_kind(s3faulty, upload_to, ckpts, monkeypatch):
    """One kind at a time, straight through s3read: the classes are exactly the kind injected."""
    local = files_under(ckpts["safetensors"])
    for kind, cls in (("slowdown", s3mod.THROTTLING), ("reset", s3mod.CONNECTION_RESET)):
        server = s3faulty(fault_rate=0.0, fault_kinds=(kind,), seed=11)
        url = s3mod.parse(upload_to(server))
        set_env(monkeypatch, server.env)
        log = s3mod.RetryLog()
        client = s3mod.make_client(4, retry_log=log)
        objs = s3mod.list_objects(client, url)
        server.proxy.fault_rate = 0.2
        res = s3source.start(client, url, objs, ReadOptions(concurrency=4, part_size=256 * 1024), log,
                           into="memory").wait(120)
        assert res is not None and not res.failed, [f.error for f in res.failed]
        for f, buf in zip(res.files, res.buffers):
            assert bytes(buf) == local[f.path.split("/ck/", 1)[1]]
        faults = server.proxy.counters()["faults"]
        assert faults[kind] > 0 and sum(faults.values()) == faults[kind]
        assert log.counts == {cls: faults[kind]}, (kind, log.counts, faults)
        assert res.retries == faults[kind]


def test_manifest_read_survives_a_mid_body_reset(s3faulty, upload_to, monkeypatch):
    """A reset in the middle of the manifest's body (S3 does this under load) is as transient as one in a shard's:
    listing the checkpoint must retry it, not give up with 'cannot reach'."""
    from ckptbench.sources import open_source

    server = s3faulty(fault_rate=0.0, fault_kinds=("reset",), reset_points=("mid",))
    url = upload_to(server)
    set_env(monkeypatch, server.env)
    proxy = server.proxy
    seen = []
    lock = threading.Lock()

    def draw():  # request 1 lists the prefix, request 2 GETs ckptbench.json: cut that one mid-body, once
        with lock:
            proxy.requests += 1
            seen.append(proxy.requests)
            if len(seen) == 2:
                proxy.faults["reset"] += 1
                return "reset", None
            return None, None

    monkeypatch.setattr(proxy, "_draw_fault", draw)
    source = open_source(url)
    listing = source.list()
    assert proxy.counters()["resets"]["mid"] == 1  # the cut happened
    assert listing.manifest is not None and listing.format == "safetensors"
    assert source.retry_classes() == {s3mod.CONNECTION_RESET: 1}


def test_files_count_only_when_every_byte_arrived(s3faulty, upload_to, monkeypatch, tmp_path):
    """Every request throttled from the read on: no file is restored, each fails as throttling, success_rate 0,
    and the stage directory holds nothing (no partial file, no final name)."""
    from ckptbench.restore import runner as pipeline

    server = s3faulty(fault_rate=0.0, fault_kinds=("slowdown",))
    url = upload_to(server)
    set_env(monkeypatch, server.env)
    # keep the test short: 1 try per request (botocore) and 2 per part (ours) instead of 11 and 6
    real_make_client, real_start = s3mod.make_client, s3source.start
    monkeypatch.setattr(s3mod, "make_client",
                        lambda concurrency=16, **kw: real_make_client(concurrency, **{**kw, "max_attempts": 0}))
    monkeypatch.setattr(s3source, "start",
                        lambda c, u, o, opts, log, **kw: real_start(c, u, o, dataclasses.replace(opts, part_retries=1),
                                                                    log, **kw))

    def progress(stage, snap):
        if stage == "read":
            server.proxy.fault_rate = 1.0

    stage = tmp_path / "stage"
    (rep,) = pipeline.run(url, pipeline.RunOptions.make(mode="staged", concurrency=16, part_size=1 * MiB,
                                                   stage_dir=str(stage)), repeats=1, progress=progress)
    assert rep.status == "failed"
    assert rep.files_restored == 0 and rep.success_rate == 0.0
    assert len(rep.problems) == rep.files
    assert rep.errors == {s3mod.THROTTLING: rep.files}
    assert all("throttling" in p for p in rep.problems)
    assert rep.retry_classes.get(s3mod.THROTTLING, 0) > 0
    assert files_under(stage) == {}


def test_object_outside_the_manifest_that_fails_is_not_restored(s3server, s3env, ckpts, monkeypatch, tmp_path):
    """An object the manifest does not list (here ckptbench.json itself) vanishes between the listing and its read:
    it was not restored, so the run cannot report every file restored."""
    from ckptbench.restore import runner as pipeline

    bucket = s3server.make_bucket()
    direct = s3server.client(direct=True)
    put_dir(direct, bucket, "c", ckpts["safetensors"])

    def progress(stage, snap):
        if stage == "read" and snap is None:  # the listing is done, no byte read yet
            direct.delete_object(Bucket=bucket, Key="c/ckptbench.json")

    (rep,) = pipeline.run(f"s3://{bucket}/c", pipeline.RunOptions.make(concurrency=4, stage_dir=str(tmp_path / "st")),
                          repeats=1, progress=progress)
    assert rep.errors == {s3mod.MISSING: 1}  # the read did fail
    assert rep.files_restored == rep.files - 1
    assert rep.success_rate < 1.0
    assert rep.status == "failed"


# ---- credentials never leak ----


def test_credentials_never_in_output_logs_or_results(s3server, remote, tmp_path):
    env = dict(os.environ, **s3server.env)
    secrets = (s3server.env["AWS_SECRET_ACCESS_KEY"], s3server.env["AWS_ACCESS_KEY_ID"])
    results = tmp_path / "R.csv"
    url = remote["safetensors"]
    commands = [
        ["run", url, "--json", "--repeat", "1", "--results", results, "--part-size", "1M"],
        ["read", url, "--json"],
        ["check", url, "--json"],
        ["sweep", url, "--json", "--levels", "2", "--repeat", "1"],
    ]
    procs = [subprocess.Popen([sys.executable, "-m", "ckptbench", *map(str, args)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for args in commands]
    texts = []
    for args, proc in zip(commands, procs):  # all at once: a fresh interpreter each costs seconds
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (args, err)
        texts += [out, err]
    texts += [results.read_text(), (tmp_path / "R.csv.jsonl").read_text()]
    assert len(results.read_text().splitlines()) == 2  # header + the run's one row
    for text in texts:
        for secret in secrets:
            assert secret not in text
