"""`ckptbench run`: the timed restore pipeline — stages, RTO, bytes, cache conditions, failures and bad input.

Expected values come from the files themselves (os.walk, hand-flipped bytes), never from ckptbench."""

from __future__ import annotations

import json
import os
import platform
import shutil

import pytest
from clirun import Run, run_cli

SCALE = "0.02"  # the small profile at this scale: a few MiB per checkpoint
FORMATS = ("safetensors", "torch", "dcp")
STAGES = ("list", "read", "verify", "load", "device", "check")
EPS = 1e-6  # clock rounding between the stage sum and the RTO


Result = Run
cli = run_cli


def tree_size(root) -> tuple[int, int]:
    """(bytes, files) of every regular file under root, counted here."""
    total = count = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            total += os.path.getsize(os.path.join(dirpath, n))
            count += 1
    return total, count


def fs_type_of(path: str) -> str:
    """The file system type holding path, from /proc/mounts (longest mount point prefix)."""
    target = os.path.realpath(path)
    best, fs = "", None
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mp = parts[1].replace("\\040", " ")
            if (target == mp or target.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                best, fs = mp, parts[2]
    return fs


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pipeline-ckpts")
    out = {}
    for fmt in FORMATS:
        target = root / fmt
        r = cli("gen", "small", target, "--scale", SCALE, "--format", fmt, "--ranks", "2")
        assert r.rc == 0, r.err
        out[fmt] = str(target)
    return out


@pytest.fixture(scope="module")
def cold_runs(ckpts, tmp_path_factory):
    """(fmt, mode) -> (exit code, JSON doc, results path): two cold repeats each, made once."""
    root = tmp_path_factory.mktemp("pipeline-runs")
    done = {}

    def get(fmt: str, mode: str):
        if (fmt, mode) not in done:
            results = root / f"{fmt}-{mode}.csv"
            r = cli("run", ckpts[fmt], "--mode", mode, "--cache", "cold", "--repeat", "2", "--concurrency", "4",
                    "--json", "--results", results)
            done[fmt, mode] = (r.rc, json.loads(r.out) if r.out else None, str(results), r.err)
        return done[fmt, mode]

    return get


@pytest.mark.parametrize("mode", ["staged", "fused"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_run_json_figures_are_consistent_with_the_files(ckpts, cold_runs, fmt, mode):
    rc, doc, _, err = cold_runs(fmt, mode)
    assert rc == 0, err
    total, count = tree_size(ckpts[fmt])
    assert doc["status"] == "ok"
    assert doc["format"] == fmt
    assert doc["options"]["mode"] == mode
    assert set(doc["stages"]) == set(STAGES)
    assert all(doc["stages"][s] >= 0 for s in STAGES)
    assert doc["bytes"] == total
    assert doc["files"] == count
    assert doc["success_rate"] == 1.0
    assert doc["retries"] == 0
    assert doc["errors"] == {}
    assert doc["cache"]["requested"] == "cold"
    assert doc["peak_rss_bytes"] > 0
    assert len(doc["repeats"]) == 2
    for rep in doc["repeats"]:
        assert rep["status"] == "ok" and rep["problems"] == []
        assert set(rep["stages"]) == set(STAGES)
        assert all(v >= 0 for v in rep["stages"].values())
        stage_sum = sum(rep["stages"].values())
        # the RTO is the stages end to end: no stage outside the clock, nothing big between them
        assert rep["rto_s"] >= stage_sum - EPS
        assert rep["rto_s"] <= stage_sum + 0.05 + 0.05 * rep["rto_s"]
        assert rep["read_gbps"] == pytest.approx(total / rep["stages"]["read"] / 1e9, rel=1e-9)
        assert rep["success_rate"] == 1.0 and rep["retries"] == 0 and rep["errors"] == {}
        assert rep["peak_rss_bytes"] > 0
    assert min(r["rto_s"] for r in doc["repeats"]) <= doc["rto_s"] <= max(r["rto_s"] for r in doc["repeats"])


@pytest.mark.parametrize("mode", ["staged", "fused"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cold_cache_is_verified_cold_on_every_repeat(cold_runs, fmt, mode):
    rc, doc, _, err = cold_runs(fmt, mode)
    assert rc == 0, err
    for rep in doc["repeats"]:
        assert rep["cache"]["requested"] == "cold"
        assert rep["cache"]["residency_before"] <= 0.05
        assert rep["cache"]["verified"] is True
    assert doc["cache"]["verified"] is True and doc["cache"]["residency_before"] <= 0.05


@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_says_verify_was_hashed_during_read_and_staged_does_not(cold_runs, fmt):
    _, fused, _, _ = cold_runs(fmt, "fused")
    _, staged, _, _ = cold_runs(fmt, "staged")
    assert "during read" in fused["notes"]["verify"]
    assert "during read" not in staged["notes"].get("verify", "")
    for rep in fused["repeats"]:
        assert "during read" in rep["notes"]["verify"]


def test_env_is_recorded_from_the_machine(ckpts, cold_runs):
    import torch

    rc, doc, _, err = cold_runs("safetensors", "fused")
    assert rc == 0, err
    env = doc["env"]
    assert env["kernel"] == os.uname().release
    assert env["cpu_count"] == os.cpu_count()
    assert env["torch"] == torch.__version__
    assert env["python"] == platform.python_version()
    assert env["source_fs"] == fs_type_of(ckpts["safetensors"])


def test_hot_cache_is_verified_hot_on_every_repeat(ckpts, tmp_path):
    r = cli("run", ckpts["safetensors"], "--cache", "hot", "--repeat", "2", "--json", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["cache"]["requested"] == "hot"
    assert len(doc["repeats"]) == 2
    for rep in doc["repeats"]:
        assert rep["cache"]["residency_before"] >= 0.95
        assert rep["cache"]["verified"] is True


def test_text_output_names_every_stage(ckpts, tmp_path):
    r = cli("run", ckpts["torch"], "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    for s in STAGES:
        assert any(line.split()[:1] == [s] for line in lines), s
    assert any(line.split()[:1] == ["RTO"] for line in lines)


# --- a damaged checkpoint: the run fails, says why, and the failure is recorded ---

def _flip(path: str, offset: int, n: int = 16) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def _biggest_file(root: str) -> str:
    sizes = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            sizes[p] = os.path.getsize(p)
    return max(sizes, key=sizes.get)


@pytest.mark.parametrize("mode", ["staged", "fused"])
def test_corrupted_shard_fails_with_digest_mismatch_and_is_recorded(ckpts, tmp_path, mode):
    import csv

    src = shutil.copytree(ckpts["safetensors"], tmp_path / "ckpt")
    shard = _biggest_file(str(src))
    _flip(shard, os.path.getsize(shard) // 2)
    results = tmp_path / "R.csv"
    r = cli("run", src, "--mode", mode, "--repeat", "1", "--json", "--results", results)
    assert r.rc == 1
    doc = json.loads(r.out)
    assert doc["status"] == "failed"
    assert doc["errors"].get("digest_mismatch") == 1
    assert doc["success_rate"] < 1.0
    rel = os.path.relpath(shard, src)
    assert any(p.startswith(rel + ":") for p in doc["repeats"][0]["problems"])
    with open(results, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1
    assert rows[0]["status"] == "failed"
    assert rows[0]["run_id"] == doc["run_id"]
    assert "digest_mismatch" in rows[0]["errors"]


@pytest.fixture(scope="module")
def missing_file_run(ckpts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("missing")
    src = shutil.copytree(ckpts["safetensors"], tmp / "ckpt")
    os.unlink(src / "scheduler.json")  # one small file of the tail; the manifest still lists it
    return cli("run", src, "--repeat", "1", "--json", "--results", tmp / "R.csv")


def test_missing_file_fails_and_names_the_file(missing_file_run):
    r = missing_file_run
    assert r.rc == 1
    doc = json.loads(r.out)
    assert doc["status"] == "failed"
    assert any("scheduler.json" in p for p in doc["repeats"][0]["problems"])


def test_missing_file_is_counted_under_an_error_class(missing_file_run):
    doc = json.loads(missing_file_run.out)
    assert doc["errors"], "a missing file fails the run, yet no error class is recorded"
    assert sum(doc["errors"].values()) == 1


def test_missing_file_makes_success_rate_below_one(missing_file_run):
    doc = json.loads(missing_file_run.out)
    assert doc["success_rate"] < 1.0, "a file of the checkpoint is missing, yet success_rate is 1.0"
    assert doc["repeats"][0]["success_rate"] < 1.0


# --- bad input: exit 2, one line, nothing recorded ---

def _assert_one_line_error(r: Result, needle: str = "") -> None:
    assert r.rc == 2
    assert r.out == ""
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error: ")
    assert needle in r.err_lines[0]
    assert "Traceback" not in r.err


@pytest.mark.parametrize("case", ["missing", "empty", "only-text"])
def test_bad_source_exits_2_with_one_line_and_records_nothing(tmp_path, case):
    source = tmp_path / "src"
    if case != "missing":
        source.mkdir()
    if case == "only-text":
        (source / "notes.txt").write_text("not a checkpoint\n")
    results = tmp_path / "R.csv"
    r = cli("run", source, "--repeat", "1", "--results", results)
    _assert_one_line_error(r, str(source))
    assert not results.exists()
    assert not os.path.exists(str(results) + ".jsonl")


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--hash", "crc64"], "crc64"),
        (["--repeat", "0"], "--repeat"),
        (["--mode", "foo"], "foo"),
    ],
)
def test_bad_options_exit_2_and_record_nothing(ckpts, tmp_path, flags, needle):
    results = tmp_path / "R.csv"
    r = cli("run", ckpts["safetensors"], *flags, "--results", results)
    assert r.rc == 2
    assert r.out == ""
    assert "Traceback" not in r.err
    error_lines = [line for line in r.err_lines if "error:" in line]
    assert len(error_lines) == 1 and needle in error_lines[0]
    assert not results.exists()


def test_oom_precheck_stops_before_reading(ckpts, tmp_path, monkeypatch):
    import psutil

    real = psutil.virtual_memory()
    tiny = real._replace(available=1 << 20)  # 1 MiB: less than any checkpoint here
    monkeypatch.setattr(psutil, "virtual_memory", lambda: tiny)
    import fastio

    started = []
    real_start = fastio.start
    monkeypatch.setattr(fastio, "start", lambda *a, **k: started.append(a) or real_start(*a, **k))
    results = tmp_path / "R.csv"
    r = cli("run", ckpts["safetensors"], "--mode", "staged", "--repeat", "1", "--results", results)
    _assert_one_line_error(r, "GiB")
    assert "Fix:" in r.err_lines[0] and "--mode fused" in r.err_lines[0]
    assert started == []
    assert not results.exists()


def test_oom_precheck_of_a_fused_restore_does_not_offer_fused(ckpts, tmp_path, monkeypatch):
    """A fused restore too large for memory was told 'Fix: --mode fused', the mode it was already in."""
    import psutil

    tiny = psutil.virtual_memory()._replace(available=1 << 20)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: tiny)
    results = tmp_path / "R.csv"
    r = cli("run", ckpts["safetensors"], "--mode", "fused", "--repeat", "1", "--results", results)
    _assert_one_line_error(r, "a fused restore")
    assert "Fix:" in r.err_lines[0] and "torchrun" in r.err_lines[0]
    assert "--mode fused" not in r.err
    assert not results.exists()


def test_unknown_device_exits_2_with_one_line(ckpts, tmp_path):
    results = tmp_path / "R.csv"
    r = cli("run", ckpts["safetensors"], "--repeat", "1", "--device", "foo", "--results", results)
    _assert_one_line_error(r, "--device")
    assert not results.exists()


def test_cuda_device_without_cuda_exits_2_with_one_line(ckpts, tmp_path):
    import torch

    results = tmp_path / "R.csv"
    r = cli("run", ckpts["safetensors"], "--repeat", "1", "--device", "cuda", "--json", "--results", results)
    if torch.cuda.is_available():
        assert r.rc == 0, r.err
        assert json.loads(r.out)["options"]["device"] == "cuda"
    else:
        _assert_one_line_error(r, "--device cuda")
        assert not results.exists()


@pytest.mark.parametrize("kwargs, needle", [({"mode": "foo"}, "mode"), ({"repeats": 0}, "--repeat")])
def test_pipeline_run_rejects_bad_options(ckpts, kwargs, needle):
    from ckptbench.restore import runner as pipeline
    from ckptbench.core.errors import CkptbenchError

    with pytest.raises(CkptbenchError, match=needle):
        opts = pipeline.RunOptions(mode=kwargs.get("mode", "fused"))  # options are checked when they are made
        pipeline.run(ckpts["safetensors"], opts, repeats=kwargs.get("repeats", 1))


def test_memory_needed_staged_holds_one_more_shard(ckpts):
    from ckptbench.restore import resources
    from ckptbench.sources import open_source

    listing = open_source(ckpts["safetensors"]).list()
    total, count = tree_size(ckpts["safetensors"])
    biggest = os.path.getsize(_biggest_file(ckpts["safetensors"]))
    assert len(listing.files) == count
    assert resources.memory_needed(listing, "fused") == total
    assert resources.memory_needed(listing, "staged") == total + biggest


def test_a_hash_the_manifest_cannot_check_is_recorded_unverified(ckpts, tmp_path):
    """--hash md5 on a crc32c manifest: no reference, so a flipped byte cannot be caught; the run must say so
    everywhere rather than be recorded as a verified success."""
    from ckptbench.records import results

    src = tmp_path / "ck"
    shutil.copytree(ckpts["safetensors"], src)
    victim = max((p for p in src.rglob("*.safetensors")), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # a flipped byte in tensor data: the load still succeeds
    victim.write_bytes(bytes(data))
    out = tmp_path / "r.csv"
    r = run_cli("run", src, "--repeat", "1", "--hash", "md5", "--json", "--results", out)
    doc = json.loads(r.out)
    assert doc["verified"] is False and doc["repeats"][0]["verified"] is False
    assert "NOT VERIFIED" in doc["notes"]["verify"]
    assert [row["status"] for row in results.read_rows(str(out))] == ["unverified"]
    text = run_cli("run", src, "--repeat", "1", "--hash", "md5", "--results", out).out
    assert "digests: NOT VERIFIED" in text
    ok = run_cli("run", ckpts["safetensors"], "--repeat", "1", "--json", "--results", out)
    assert json.loads(ok.out)["verified"] is True and results.read_rows(str(out))[-1]["status"] == "ok"
