"""The sources seam and what rests on it: one read-options type checked once, one drive loop with one clock per
name, one concurrency bound, errors as one line, warm-up kept out of the RTO, and no S3 branch in the domain."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import fastio
import pytest

from clirun import assert_one_line_error, run_cli, run_proc

from ckptbench.core import concurrency as conc
from ckptbench.core.errors import CkptbenchError, redact, translate
from ckptbench.sources import ReadHandle, ReadOptions, Source, drive, open_source, open_targets

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ckptbench")
SEAM_USERS = ("restore/runner.py", "restore/repeat.py", "restore/reading.py", "restore/sweep.py", "system/live.py",
              "checklist/facts.py", "restore/session.py")


@pytest.fixture(scope="module")
def small(ckpt):
    return ckpt("safetensors", 2)


def test_open_source_gives_a_source_for_a_directory_and_for_s3(small):
    local = open_source(small)
    remote = open_source("s3://bucket/prefix/")  # nothing is contacted until it lists
    assert isinstance(local, Source) and isinstance(remote, Source)
    assert (local.scheme, local.has_page_cache, local.files_on_disk) == (None, True, True)
    assert (remote.scheme, remote.has_page_cache, remote.files_on_disk) == ("s3", False, False)
    assert remote.url == "s3://bucket/prefix"
    listing = local.list()
    assert listing.format == "safetensors" and listing.manifest is not None
    assert sorted(listing.rels) == sorted([e.path for e in listing.manifest.files] + ["ckptbench.json"])


@pytest.mark.parametrize("target, needle", [("/nonexistent/x", "no such directory"), (__file__, "not a directory")])
def test_open_source_refuses_what_is_not_a_checkpoint_directory(target, needle):
    with pytest.raises(CkptbenchError, match=needle):
        open_source(target)


@pytest.mark.parametrize("kwargs, needle", [
    ({"read": "direct", "block_size": 6144}, "multiple of 4096"),
    ({"block_size": 100}, "--block-size"),
    ({"part_size": 0}, "--part-size"),
    ({"concurrency": 0}, f"1..{conc.MAX}"),
    ({"concurrency": conc.MAX + 1}, f"1..{conc.MAX}"),
    ({"concurrency": 2.5}, "whole number"),
    ({"hash": "crc64"}, "--hash"),
    ({"s3_client": "curl"}, "--s3-client"),
    ({"chunk_size": (1 << 20) + 1}, "multiple of --block-size"),
    ({"multipart": True, "hash": "none"}, "--multipart"),
])
def test_read_options_are_checked_once_when_made(kwargs, needle):
    with pytest.raises(CkptbenchError, match=re.escape(needle)):
        ReadOptions(**kwargs)


def test_read_options_pick_a_chunk_that_fits_the_block():
    assert ReadOptions(block_size=6144).chunk_size % 6144 == 0
    assert ReadOptions().chunk_size == 64 << 20


@pytest.mark.parametrize("args, needle", [
    (["--read", "direct", "--block-size", "6K"], "multiple of 4096"),
    (["--part-size", "0"], "--part-size"),
    (["--block-size", "1K"], "--block-size"),
])
def test_run_with_bad_read_options_is_one_line_not_a_traceback(small, tmp_path, args, needle):
    r = run_proc("run", small, "--repeat", "1", "--results", tmp_path / "r.csv", *args)
    assert_one_line_error(r, needle)
    assert not (tmp_path / "r.csv").exists()


def test_concurrency_bound_is_one_number_for_cli_and_engine(small):
    assert conc.MAX == fastio.MAX_CONCURRENCY and conc.MIN == 1
    r = run_proc("read", small, "-c", str(conc.MAX + 1))
    assert r.rc == 2 and f"must be 1..{conc.MAX}" in r.err
    r = run_cli("read", small, "-c", str(conc.MAX), "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["concurrency"] == conc.MAX
    assert [conc.step_up(n) for n in (1, 3, 4, 512, conc.MAX)] == [2, 4, 8, 1024, conc.MAX]
    assert [conc.step_down(n) for n in (1, 4, 8, conc.MAX)] == [1, 3, 4, conc.MAX // 2]


def test_drive_times_the_whole_read_and_names_the_engine_rate_apart(small):
    src = open_targets([small])
    listing = src.list()
    seen = []
    driven = drive(lambda: src.start_read(listing, ReadOptions(concurrency=2)), on_progress=seen.append)
    res = driven.result
    assert res.bytes == listing.bytes and not res.failed
    assert driven.wall_s >= res.seconds > 0
    assert driven.read_gbps == pytest.approx(res.bytes / driven.wall_s / 1e9)
    assert driven.engine_gbps == pytest.approx(res.read_gbps) and driven.engine_gbps >= driven.read_gbps
    assert seen and seen[-1].finished and seen[-1].bytes == res.bytes


def test_read_json_read_gbps_is_bytes_over_seconds(small):
    r = run_cli("read", small, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["read_gbps"] == pytest.approx(doc["bytes"] / doc["seconds"] / 1e9)
    assert doc["engine_gbps"] == pytest.approx(doc["bytes"] / doc["engine_seconds"] / 1e9)
    assert doc["seconds"] >= doc["engine_seconds"]


def test_run_json_read_gbps_is_bytes_over_the_read_stage(small, tmp_path):
    r = run_cli("run", small, "--repeat", "2", "--json", "--results", tmp_path / "r.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    for rep in doc["repeats"]:
        assert rep["read_gbps"] == pytest.approx(doc["bytes"] / rep["stages"]["read"] / 1e9)
        assert rep["engine_gbps"] >= rep["read_gbps"]


def test_sweep_json_uses_the_same_clock(small):
    r = run_cli("sweep", small, "--levels", "1,2", "--repeat", "1", "--cache", "as-is", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert set(doc["gbps"]) == {"1", "2"} and all(v["median"] > 0 for v in doc["gbps"].values())


def test_a_fresh_process_pays_warm_up_before_the_clock(small, tmp_path):
    """The one-time cost lands in warmup_s on the first repeat, never in a stage or the RTO."""
    r = run_proc("run", small, "--repeat", "2", "--json", "--results", tmp_path / "r.csv", timeout=300)
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    first, second = doc["repeats"]
    assert first["warmup_s"] > 0 and second["warmup_s"] == 0 and doc["warmup_s"] == first["warmup_s"]
    for rep in doc["repeats"]:
        assert rep["rto_s"] == pytest.approx(sum(rep["stages"].values()), abs=0.05)


def test_warm_up_runs_once_per_process():
    from ckptbench.restore.warmup import warm_up

    warm_up()
    assert warm_up() == 0.0


def test_demo_creates_its_cache_directory_on_a_fresh_home(tmp_path):
    """A fresh machine has no ~/.cache: the demo makes it (XDG_CACHE_HOME honoured) instead of failing."""
    cache = tmp_path / "fresh" / "cache"
    env = dict(os.environ, HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(cache))
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "demo", "--headless", "--scale", "0.02"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (cache / "ckptbench" / "demo-small" / "ckptbench.json").is_file()
    assert (cache / "ckptbench" / "demo-results.csv").is_file()
    assert not (tmp_path / "home").exists()


def test_translate_turns_third_party_failures_into_one_line():
    assert translate(fastio.OptionError("block size must be 4 KiB..1 GiB")).exit_code == 2
    err = translate(PermissionError(13, "Permission denied", "/root/x"))
    assert err is not None and str(err).startswith("/root/x: Permission denied") and err.exit_code == 1
    from botocore.exceptions import EndpointConnectionError

    err = translate(EndpointConnectionError(endpoint_url="http://user:s3cret@127.0.0.1:9/b"))
    assert err is not None and str(err).startswith("S3: ") and "s3cret" not in str(err) and "user" not in str(err)
    assert translate(ZeroDivisionError("a bug")) is None  # bugs keep their traceback


def test_redact_strips_user_info_from_every_url():
    text = "GET https://AKIA:secret@host:9000/b and s3://key:pw@bucket/p, plain http://host/x"
    assert redact(text) == "GET https://host:9000/b and s3://bucket/p, plain http://host/x"


def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_the_domain_imports_no_cli_module_and_no_ui():
    for root, _, names in os.walk(PKG):
        for n in names:
            path = os.path.join(root, n)
            if not n.endswith(".py") or os.path.basename(root) == "cli" or n == "__main__.py":  # the root: cli/
                continue
            bad = {m for m in _imports(path) if m.startswith(("ckptbench.cli", "tui", "textual"))}
            assert not bad, f"{os.path.relpath(path, PKG)} imports {bad}"


@pytest.mark.parametrize("name", SEAM_USERS)
def test_modules_on_the_seam_hold_no_s3_branch(name):
    """They talk to sources only: no S3 module imported, no s3:// literal, and no condition that mentions S3."""
    code = open(os.path.join(PKG, name)).read()
    tree = ast.parse(code)
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not any("s3://" in s for s in strings)
    assert not {m for m in _imports(os.path.join(PKG, name)) if "s3" in m.lower()}
    tests = [n.test for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While))]
    tests += [cond for n in ast.walk(tree) if isinstance(n, ast.comprehension) for cond in n.ifs]
    for t in tests:
        words = [getattr(x, "id", None) or getattr(x, "attr", None) or getattr(x, "value", None)
                 for x in ast.walk(t)]
        assert not [w for w in words if isinstance(w, str) and "s3" in w.lower()], ast.unparse(t)


def test_a_handle_follows_the_protocol(small):
    src = open_source(small)
    listing = src.list()
    with src.start_read(listing, ReadOptions(concurrency=1)) as h:
        assert isinstance(h, ReadHandle) and h.live_concurrency
        assert h.set_concurrency(3) == 3
        res = h.wait(60)
    assert res is not None and h.error_classes(res) == {}


def test_an_endpoint_password_never_reaches_the_output(small, tmp_path):
    """AWS_ENDPOINT_URL with user-info (127.0.0.1:1 refuses at once): the error line names the endpoint without it."""
    env = dict(os.environ, AWS_ENDPOINT_URL="http://key:s3cretpw@127.0.0.1:1", AWS_ACCESS_KEY_ID="a",
               AWS_SECRET_ACCESS_KEY="b", AWS_REGION="us-east-1", AWS_MAX_ATTEMPTS="1")
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "run", "s3://bucket/ckpt", "--repeat", "1",
                           "--results", str(tmp_path / "r.csv"), "--json"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "s3cretpw" not in proc.stderr + proc.stdout and "key:" not in proc.stderr
    assert "127.0.0.1:1" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("env", ["3", "1", "", "lots", "0"])
def test_aws_max_attempts_is_honoured_when_it_is_a_sensible_number(monkeypatch, env):
    """AWS_MAX_ATTEMPTS counts every attempt, the first included (as the AWS CLI reads it); otherwise ckptbench
    retries MAX_ATTEMPTS times after the first."""
    from ckptbench.sources import s3

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", env)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    client = s3.make_client(2)
    total = int(env) if env.isdigit() and env != "0" else s3.MAX_ATTEMPTS + 1
    assert client.meta.config.retries["total_max_attempts"] == total
