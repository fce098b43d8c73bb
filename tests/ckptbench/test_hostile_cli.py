"""A new user's bad input and hostile files through the CLI, where the other hostile tests do not go: one line on
stderr and a non-zero exit, never a traceback or a hang; nothing lost, nothing written where it should not be."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from clirun import assert_one_line_error, run_cli, run_proc


def _tree(root) -> dict:
    """Every path under root with its size and mtime: what "unchanged" compares."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for n in dirs + names:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_save_never_prunes_its_own_source(h, ckpt, tmp_path):
    """`save T/step-000001 T --keep 1` would write step-000002 and prune the source it was saving."""
    src = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "saves" / "step-000001")
    before = _tree(tmp_path)
    r = run_cli("save", src, tmp_path / "saves", "--count", "1", "--keep", "1", "--results", "")
    assert_one_line_error(r, "is the save step-000001 in the target")
    assert _tree(tmp_path) == before


def _results(path, edit=None) -> str:
    """A results.csv of two restore runs, two repeats each, as `run` writes it; `edit(rows)` damages it first."""
    import csv

    from ckptbench.records.results import COLUMNS

    rows = []
    for run, rto in (("run-a", 1.0), ("run-b", 2.0)):
        for rep in (1, 2):
            row = dict.fromkeys(COLUMNS, "") | {
                "schema": "2", "kind": "restore", "run_id": run, "repeat": str(rep), "timestamp": "2026-12-01T00:00:00",
                "source": "/ck", "format": "safetensors", "mode": "fused", "status": "ok", "cache": "cold",
                "concurrency": "8", "read": "pread", "hash": "crc32c", "block_size": "1048576", "device": "cpu",
                "rto_s": str(rto + rep / 100), "read_gbps": str(4 / rto), "bytes": "1000", "files": "3",
                "env": '{"cpu_count": 2, "source_fs": "nfs4"}'}
            rows.append(row)
    if edit:
        edit(rows)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return str(path)


def test_compare_of_a_sound_results_file_works(tmp_path):
    r = run_cli("compare", _results(tmp_path / "r.csv"), "--json")
    assert r.rc == 1 and '"rto_s"' in r.out  # run-b's RTO doubled: a regression, so the file itself is sound


def _set(field, value, row=-1):
    def edit(rows):
        rows[row][field] = value
    return edit


@pytest.mark.parametrize("edit, needle", [
    (_set("env", "[1, 2]"), "r.csv:5: malformed value"),  # was AttributeError: 'list' object has no attribute 'get'
    (_set("env", "null"), "r.csv:5: malformed value"),
    (_set("device", "x" * 200_000), "r.csv:5: malformed row (field larger than field limit"),  # was _csv.Error
])
def test_a_damaged_results_file_is_one_line_in_compare_and_plan(tmp_path, edit, needle):
    path = _results(tmp_path / "r.csv", edit)
    before = _tree(tmp_path)
    for args in (["compare", path], ["plan", "7b", "--nodes", "2", "--storage", "efs", "--results", path]):
        r = run_cli(*args)
        assert_one_line_error(r, needle)
    assert _tree(tmp_path) == before


def test_non_finite_figures_never_reach_a_document(tmp_path):
    """A "nan" or "inf" in a figure (older files wrote nan) is unknown: compare's JSON stays JSON, plan's rate real."""
    import json

    def edit(rows):
        rows[-1]["rto_s"] = "nan"
        rows[-2]["read_gbps"] = "inf"
        rows[-1]["read_gbps"] = "inf"
    path = _results(tmp_path / "r.csv", edit)
    r = run_cli("compare", path, "--json")
    doc = json.loads(r.out, parse_constant=lambda c: pytest.fail(f"{c} in compare --json"))
    assert r.rc in (0, 1) and doc["newest"] == "run-b"
    r = run_cli("plan", "7b", "--nodes", "2", "--storage", "efs", "--results", path, "--json")
    doc = json.loads(r.out, parse_constant=lambda c: pytest.fail(f"{c} in plan --json"))
    assert r.rc == 0 and doc["per_rank"]["run_id"] == "run-a", doc["per_rank"]  # not run-b at inf


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_results_path_that_is_a_fifo_or_a_device_is_refused_not_read(tmp_path, kind):
    """A FIFO blocked the read until a writer came, /dev/zero was read until memory ran out (/dev/null stands in for
    it here). A poller writes to the FIFO after 2 s so that code which does open it ends (and fails this test)
    instead of hanging."""
    import threading
    import time

    if kind == "fifo":
        path = str(tmp_path / "r.csv")
        os.mkfifo(path)
        done = threading.Event()

        def writer():
            deadline = time.monotonic() + 2
            while not done.wait(0.05):
                if time.monotonic() < deadline:
                    continue
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has it open
                except OSError:
                    continue
                os.write(fd, b"x\n")
                os.close(fd)
                return

        threading.Thread(target=writer, daemon=True).start()
    else:
        path = "/dev/null"
    try:
        for args in (["compare", path], ["plan", "7b", "--interval", "60", "--results", path]):
            r = run_cli(*args)
            assert_one_line_error(r, f"{path}: not a regular file")
    finally:
        if kind == "fifo":
            done.set()


@pytest.mark.parametrize("line, needle", [
    ("heads = 0", "model.heads must be a whole number 1..4096, got 0"),  # was ZeroDivisionError
    ("layers = -4", "model.layers must be a whole number 1..4096, got -4"),  # was a plan of negative sizes
    ("layers = true", "model.layers must be a whole number 1..4096, got True"),
])
def test_a_profile_toml_with_impossible_dims_is_one_line(tmp_path, line, needle):
    from ckptbench.core.paths import PROFILES_DIR

    text = open(os.path.join(PROFILES_DIR, "checkpoints", "small.toml")).read()
    key = line.split(" =")[0]
    lines = [line if ln.startswith(f"{key} =") else ln for ln in text.splitlines()]
    path = tmp_path / "p.toml"
    path.write_text("\n".join(lines) + "\n")
    for args in (["plan", path], ["plan", path, "--nodes", "2", "--storage", "efs", "--results", tmp_path / "none"]):
        assert_one_line_error(run_cli(*args), needle)


def test_a_profile_toml_with_no_ranks_is_one_line(tmp_path):
    from ckptbench.checkpoint.profiles import PROFILES_DIR

    text = open(os.path.join(PROFILES_DIR, "checkpoints", "small.toml")).read()
    path = tmp_path / "p.toml"
    path.write_text(text.replace("world_size = 2", "world_size = 0"))
    assert "world_size = 0" in path.read_text()
    assert_one_line_error(run_cli("plan", path), "checkpoint.world_size must be a whole number 1..1048576, got 0")


def test_pack_and_unpack_never_write_into_the_checkpoint_they_read(h, ckpt, tmp_path):
    """OUT inside DIR was accepted: the copy (and its staging directory) landed in the checkpoint being read."""
    src = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    before = _tree(src)
    for out in (os.path.join(src, "packed"), os.path.join(src, "sub", "packed")):
        assert_one_line_error(run_cli("pack", src, out), f"{out}: inside the checkpoint {src}")
    assert _tree(src) == before
    packed = str(tmp_path / "packed")
    assert run_cli("pack", src, packed).rc == 0
    before = _tree(packed)
    out = os.path.join(packed, "inner")
    assert_one_line_error(run_cli("unpack", packed, out), f"{out}: inside the checkpoint {packed}")
    assert _tree(packed) == before


def _hf_safetensors(ckpt, tmp_path, weight_map_edit) -> str:
    """The safetensors sample as a Hugging Face checkpoint with no manifest (nothing else lists its shards), its
    model.safetensors.index.json edited."""
    import json
    import shutil

    root = shutil.copytree(ckpt("safetensors", 2), tmp_path / "hf")
    os.unlink(root / "ckptbench.json")
    index = root / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    weight_map_edit(doc["weight_map"])
    index.write_text(json.dumps(doc))
    return str(root)


def test_a_safetensors_index_naming_a_missing_shard_is_refused(ckpt, tmp_path):
    """The index was never read: a checkpoint missing a shard restored "ok", its tensors silently absent."""
    def drop_a_shard(wm):
        os.unlink(tmp_path / "hf" / "model-00002-of-00002.safetensors")
    root = _hf_safetensors(ckpt, tmp_path, drop_a_shard)
    for args in (["inspect", root], ["run", root, "--repeat", "1", "--results", tmp_path / "r.csv"]):
        assert_one_line_error(run_cli(*args), "names shard 'model-00002-of-00002.safetensors', which is missing")
    assert not (tmp_path / "r.csv").exists()


def test_a_safetensors_index_naming_a_file_outside_is_refused(ckpt, tmp_path):
    (tmp_path / "outside.safetensors").write_bytes(b"x" * 64)

    def point_out(wm):
        wm[next(iter(wm))] = "../outside.safetensors"
    root = _hf_safetensors(ckpt, tmp_path, point_out)
    r = run_cli("verify", root)
    assert r.rc == 1 and r.out == "" and "Traceback" not in r.err
    assert len(r.err_lines) == 1 and "names '../outside.safetensors', which is not a plain relative path" in r.err


def test_verify_of_a_directory_with_no_files_is_not_ok(tmp_path):
    """It printed "OK: 0 files" (exit 0), where read, run and inspect say the directory holds no files."""
    (tmp_path / "ck" / "sub").mkdir(parents=True)
    for args in (["verify", tmp_path / "ck"], ["verify", tmp_path / "ck", "--json"]):
        assert_one_line_error(run_cli(*args), "the directory holds no files")


@pytest.mark.parametrize("doc, needle", [
    ({"run_id": "d1"}, "run.world_size is 'None'"),  # was KeyError: 'world_size' inside the ranks screen
    ({"run_id": "d1", "world_size": 2, "nodes": 1, "source": "/ck", "format": "torch", "backend": "gloo",
      "each_rank": "part", "status": "ok", "repeats": [{"status": "ok", "ranks": [{"rank": 0}]}]},
     "repeats[0].ranks[0].host is 'None'"),
])
def test_tui_ranks_with_a_malformed_distributed_run_is_one_line(tmp_path, monkeypatch, doc, needle):
    """A foreign or hand-edited .jsonl reached the ranks screen, which died with a traceback and exit 0."""
    import json

    from ckptbench.cli import ui as cli
    from ckptbench.distributed.history import dist_runs
    from ckptbench.core.errors import CkptbenchError

    opened = []
    monkeypatch.setattr(cli, "run_app", lambda *a, **k: opened.append(a) or 0)
    path = _results(tmp_path / "r.csv")
    with open(path + ".jsonl", "w") as f:
        f.write(json.dumps({"record": "run", "kind": "dist"} | doc) + "\n")
    assert_one_line_error(run_cli("tui", "--ranks", "--results", path), needle)
    assert opened == []
    with pytest.raises(CkptbenchError, match=re.escape(needle)):  # the history screen shows this line
        dist_runs(path)


def test_a_safetensors_header_over_the_limit_says_so(tmp_path):
    """A 101 MiB header in a file that holds it was "header length N does not fit in N+8 bytes": untrue."""
    import struct

    n = 101 << 20
    (tmp_path / "ck").mkdir()
    with open(tmp_path / "ck" / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", n))
        f.truncate(8 + n)  # sparse: the length fits in the file, only the limit refuses it
    assert_one_line_error(run_cli("inspect", tmp_path / "ck"), f"header length {n} is over the 100 MiB")


def test_gen_with_a_seed_torch_cannot_take_is_one_line_and_writes_nothing(tmp_path):
    """torch.manual_seed's range: past it was a ValueError traceback (Overflow when unpacking long long)."""
    r = run_cli("gen", "small", tmp_path / "g", "--scale", "0.001", "--seed", str(1 << 64))
    assert_one_line_error(r, f"argument --seed: must be {-(1 << 63)}..{(1 << 64) - 1}, got {1 << 64}")
    assert os.listdir(tmp_path) == []


def test_a_file_the_manifest_does_not_list_is_read_but_never_verified(h, ckpt, tmp_path):
    """A shard left out of the manifest (or a manifest listing nothing) was read, loaded and reported verified."""
    import csv
    import json

    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    man = h.read_manifest(root)
    man["files"] = [e for e in man["files"] if e["path"] != "model-00002-of-00002.safetensors"]
    h.write_manifest(root, man)
    results = tmp_path / "r.csv"
    r = run_cli("run", root, "--repeat", "1", "--results", results, "--json")
    doc = json.loads(r.out)
    assert r.rc == 0 and doc["verified"] is False, r.err
    assert "NOT VERIFIED: 1 file(s) read are not in the manifest (first model-00002-of-00002.safetensors)" in \
        doc["repeats"][0]["notes"]["verify"]
    assert [row["status"] for row in csv.DictReader(open(results))] == ["unverified"]


def test_a_ranks_file_the_manifest_does_not_list_is_never_verified(tmp_path):
    """The same hole in run --distributed: a rank's whole file absent from the manifest was skipped, rank verified."""
    import time
    from types import SimpleNamespace

    from ckptbench.distributed.rank import RankReport, RankRestore
    from ckptbench.checkpoint.shares import Piece, Share
    from ckptbench.restore.stages import StageClock
    from ckptbench.sources import Listing
    from ckptbench.sources.local import LocalSource

    (tmp_path / "a.pt").write_bytes(b"a" * 100)
    (tmp_path / "b.pt").write_bytes(b"b" * 100)
    listed = SimpleNamespace(path="a.pt", bytes=100, digest=None)
    share = Share(0, 1, "")
    for rel in ("a.pt", "b.pt"):
        share.add(Piece(rel, 0, 100, True))
    man = SimpleNamespace(hash="crc32c", files=[listed])
    rr = RankRestore(LocalSource(str(tmp_path)), Listing(str(tmp_path), [], man, "torch"), share, concurrency=1,
                     read="pread", hash_alg="crc32c", device="cpu")
    rep = RankReport(0, "h", 0)
    rr._verify(rep, rr._read(StageClock(), rep, time.perf_counter()))
    assert rep.verified is False
    assert rep.notes["verify"].endswith("1 file(s) NOT VERIFIED: not in the manifest (first b.pt)")


def test_load_and_verify_say_which_files_the_manifest_does_not_list(h, ckpt, tmp_path):
    """load --json said "verified": true while a shard it loaded had no digest in the manifest."""
    import json

    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    man = h.read_manifest(root)
    man["files"] = [e for e in man["files"] if e["path"] != "model-00002-of-00002.safetensors"]
    h.write_manifest(root, man)
    before = _tree(root)
    r = run_cli("verify", root, "--json")  # a file with no reference: not verified (3), not a mismatch (1)
    assert r.rc == 3 and json.loads(r.out)["unlisted"] == ["model-00002-of-00002.safetensors"]
    assert json.loads(r.out)["verified"] is False
    r = run_cli("load", root, "--json")
    assert r.rc == 0 and json.loads(r.out)["verified"] is False, r.err
    assert _tree(root) == before


@pytest.mark.parametrize("args, what", [
    (["run", "--each-rank", "all", "--repeat", "1"], "--each-rank all"),
    (["run", "--tensor-digests", "--repeat", "1"], "--tensor-digests"),
    (["sweep", "--each-rank", "all", "--levels", "1"], "--each-rank all"),
])
def test_distributed_only_flags_without_distributed_are_one_line(tmp_path, args, what):
    """They were ignored: a single-process restore was timed and recorded as if they had been honoured."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "f.bin").write_bytes(b"x" * 10)
    r = run_cli(args[0], tmp_path / "ck", *args[1:], "--results", tmp_path / "r.csv") if args[0] == "run" else \
        run_cli(args[0], tmp_path / "ck", *args[1:])
    assert_one_line_error(r, f"{what}: only with --distributed (under torchrun)")
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_pack_and_upload_refuse_a_directory_they_cannot_enter(tmp_path):
    """Without a manifest they walk the tree, and a sub-directory they could not enter was left out silently: the
    packed copy verified whole without its files, the upload said it was done. Run without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH (setpriv), since root bypasses the mode."""
    import shutil
    import subprocess
    import sys

    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to drop root's permission bypass")
    src = tmp_path / "ck"
    (src / "hidden").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(b"x" * 64)
    (src / "hidden" / "rng_state.json").write_text("{}")
    os.chmod(src / "hidden", 0)
    env = os.environ | {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    try:
        for args, what in ((["pack", src, tmp_path / "out"], "would be left out of the pack"),
                           (["upload", src, "s3://bucket/p"], "would not be uploaded")):
            proc = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-m",
                                   "ckptbench", *map(str, args)], capture_output=True, text=True, timeout=60, env=env)
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert proc.returncode == 1 and proc.stdout == "" and len(lines) == 1, proc.stderr
            assert lines[0] == f"ckptbench: error: {src / 'hidden'}: unreadable directory (Permission denied); its " \
                               f"files {what}: fix its permissions"
        assert sorted(os.listdir(tmp_path)) == ["ck"]
    finally:
        os.chmod(src / "hidden", 0o755)


def test_watch_never_prints_or_records_credentials_on_the_command_line(tmp_path):
    """The watched command was printed and recorded in results.csv.jsonl as given, user:password and secret key too.
    A fresh interpreter: the job is started with this process's real stdout and stderr."""
    import json

    results = tmp_path / "r.csv"
    r = run_proc("watch", "--no-verdict", "--json", "--interval", "0.05", "--results", results, "--", "sh", "-c",
                "exit 0", "http://admin:hunter2pw@minio:9000/b", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENG")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["command"] == ("sh -c exit 0 http://minio:9000/b AWS_SECRET_ACCESS_KEY=<redacted>")
    recorded = results.read_text() + (tmp_path / "r.csv.jsonl").read_text()
    for secret in ("hunter2pw", "wJalrXUtnFEMIK7MDENG"):
        assert secret not in r.out + r.err + recorded


def test_watch_match_never_shows_part_of_a_password(tmp_path):
    """The processes --match found were listed cut at 60 characters, and then redacted: a cut inside user:password
    left no "@" to recognise, so the start of the password was printed."""
    import subprocess
    import uuid

    tag = uuid.uuid4().hex[:12]
    url = "http://admin:hunter2pwhunter2pwhunter2pw@minio:9000/b"
    argv = ["sh", "-c", "sleep 5; :", tag, url]  # the ":" keeps sh from exec-ing sleep (its command line)
    assert " ".join(argv).index("hunter2") < 60 < " ".join(argv).index("@")
    jobs = [subprocess.Popen(argv) for _ in range(2)]
    try:
        # a fresh interpreter: the watcher's own descendants (these jobs, under run_cli) are never matched
        r = run_proc("watch", "--match", tag, "--results", tmp_path / "r.csv")
    finally:
        for p in jobs:
            p.kill()
            p.wait()
    assert_one_line_error(r, "2 processes match")
    assert "hunter2" not in r.err and "http://minio:9000/b" in r.err


def test_a_long_third_party_error_never_shows_part_of_a_password():
    """A library's message is cut to 300 characters for its one line; cut before redacting, the start of a password
    whose "@" fell past the cut stayed in it."""
    from ckptbench.core.errors import translate

    torch_error = type("TorchError", (Exception,), {"__module__": "torch.serialization"})
    err = translate(torch_error("x" * 270 + " http://admin:hunter2pwhunter2pwhunter2pw@host/ckpt"))
    assert err is not None and "hunter2" not in str(err)


def test_a_fuse_daemons_endpoint_url_loses_its_password():
    """check reports the FUSE daemon's options (its endpoint among them): secret-named keys were hidden, but an
    endpoint URL's user:password went into the report as given."""
    from ckptbench.system.fuse import daemon_options

    opts = daemon_options(["s3fs", "bucket", "/mnt/ck", "-o", "url=http://admin:hunter2pw@minio:9000,use_cache=/c"],
                          ("/mnt/ck",))
    assert opts["url"] == "http://minio:9000" and opts["use_cache"] == "/c"
    opts = daemon_options(["mount-s3", "--endpoint-url", "https://k:hunter2pw@s3.local", "bucket", "/mnt/ck"],
                          ("/mnt/ck",))
    assert opts["endpoint-url"] == "https://s3.local"


@pytest.mark.parametrize("args, needle", [
    (["--price-per-hour", "1e308", "--restores-per-day", "1e308"], "--price-per-hour must be 0..1000000, got 1e+308"),
    (["--price-per-hour", "10", "--restores-per-day", "1e308"], "--restores-per-day must be 0..86400, got 1e+308"),
])
def test_cost_figures_that_would_overflow_are_refused_before_the_run(tmp_path, args, needle):
    """Their product was inf, recorded as null, and printing the cost line crashed after the run was recorded."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "f.bin").write_bytes(b"x" * 10)
    r = run_cli("run", tmp_path / "ck", "--repeat", "1", "--results", tmp_path / "r.csv", *args)
    assert_one_line_error(r, needle)
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("args, needle", [
    (["--count", "2", "--interval", "1e300"], "--interval must be above 0 and at most 604800 seconds, got 1e+300"),
    (["--ranks", "2", "--stagger", "1e300"], "--stagger must be 0..604800 seconds, got 1e+300"),
])
def test_save_waits_the_clock_cannot_hold_are_refused_before_writing(tmp_path, args, needle):
    """--interval 1e300 was an OverflowError traceback after the first save; --stagger 1e300 a time_t error."""
    r = run_cli("save", "small", tmp_path / "t", "--scale", "0.001", "--results", "", *args)
    assert_one_line_error(r, needle)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_rank_timeout_the_process_group_cannot_take_is_one_line(tmp_path, command):
    """Under torchrun, --rank-timeout 1e300 was an OverflowError traceback from the process group's timedelta."""
    r = run_cli(command, tmp_path, "--distributed", "--rank-timeout", "1e300")
    assert_one_line_error(r, "argument --rank-timeout: must be above 0 and at most 604800, got 1e300")


def test_demo_never_replaces_a_directory_that_is_not_its_sample(tmp_path):
    """demo --dir DIR generated its sample with --force whenever DIR had no ckptbench.json: everything a user kept
    in DIR was deleted, without being asked."""
    keep = tmp_path / "home"
    keep.mkdir()
    (keep / "thesis.txt").write_text("three years of work")
    before = _tree(tmp_path)
    r = run_cli("demo", "--dir", keep, "--headless", "--scale", "0.001")
    assert_one_line_error(r, f"{keep}: not empty and not the sample (no ckptbench.json)")
    assert _tree(tmp_path) == before and (keep / "thesis.txt").read_text() == "three years of work"


def test_plan_for_more_nodes_than_a_float_holds_is_one_line():
    """--nodes 10**300 was an OverflowError traceback (int too large to convert to float) in the arithmetic."""
    r = run_cli("plan", "7b", "--nodes", str(10 ** 300), "--storage", "efs")
    assert_one_line_error(r, "argument --nodes: must be 1..1048576")


def test_a_storage_preset_figure_too_large_for_the_arithmetic_is_one_line(tmp_path):
    """ceiling_gbps = 1e308 was accepted; times the nodes it was inf, and plan --json printed Infinity (not JSON)."""
    path = tmp_path / "s.toml"
    path.write_text('name = "x"\nceiling_gbps = 1e308\nmin_concurrency = 1\nsmall_file_bytes = 1\n')
    r = run_cli("plan", "7b", "--nodes", "4", "--storage", path, "--json", "--results", tmp_path / "none")
    assert_one_line_error(r, "ceiling_gbps must be a positive number at most 1e+12, got 1e+308")


def test_gen_force_replaces_only_a_checkpoint_gen_wrote(tmp_path, h):
    """`gen small . --force` in a folder of the user's own files deleted them; now one line and nothing touched."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    before = h.snapshot(mine)
    r = h.run_cli("gen", "small", mine, "--scale", h.SCALE, "--force")
    assert r.rc == 2 and len(r.err_lines) == 1 and "not a checkpoint gen wrote" in r.err_lines[0], r.err
    assert h.snapshot(mine) == before
    ours = tmp_path / "ours"
    assert h.run_cli("gen", "small", ours, "--scale", h.SCALE).rc == 0
    r = h.run_cli("gen", "small", ours, "--scale", h.SCALE, "--seed", "1", "--force")
    assert r.rc == 0, r.err
    assert json.loads((ours / "ckptbench.json").read_text())["seed"] == 1


def test_a_torch_file_nested_too_deep_is_named(tmp_path, h):
    d = {"w": torch.zeros(2)}
    for _ in range(40):
        d = {"k": d}
    root = tmp_path / "deep"
    root.mkdir()
    torch.save(d, root / "x.pt")
    r = h.run_cli("run", root, "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 2 and len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith(f"ckptbench: error: {root / 'x.pt'}: ") and "nested deeper than" in r.err_lines[0]


def test_compare_keeps_escapes_long_names_odd_kinds_and_infinite_floors_out(tmp_path):
    """A kind with a screen-wipe reached the header; an unknown kind was compared as a restore; a 100 kB --newest
    made a 100 kB error line; a floor of Infinity printed inf % and nan %."""
    import json

    def odd(rows):
        for r in rows[:2]:
            r["kind"] = "sa\x1b[2Jve"
    path = _results(tmp_path / "r.csv", odd)
    r = run_cli("compare", path)  # run-a's rows are of no kind ckptbench writes: one run left, one line
    assert_one_line_error(r, "1 successful run(s)")
    assert "\x1b" not in r.out + r.err
    path = _results(tmp_path / "ok.csv")
    r = run_cli("compare", path, "--newest", "x" * 100_000)
    assert_one_line_error(r, "--newest")
    assert len(r.err) < 2000, len(r.err)
    assert_one_line_error(run_cli("compare", path, "--kind", "bogus\x1b[2J"), "--kind bogus: one of restore")
    with open(path + ".jsonl", "w") as f:
        for run in ("run-a", "run-b"):
            f.write(json.dumps({"record": "run", "run_id": run, "floor_s": float("inf")}) + "\n")
    r = run_cli("compare", path)
    assert "inf" not in r.out and "nan" not in r.out, r.out


def test_a_storage_preset_with_escapes_or_empty_names_is_one_line(tmp_path):
    """A preset's name and filesystems are printed (escapes reached the terminal) and matched (an empty one matched
    every run whose filesystem was not recorded)."""
    base = 'ceiling_gbps = 12.0\naggregate_gbps = 24.0\nmetadata_ops_per_s = 12000\n'
    for bad, needle in (('name = "\\u001b[2Jfsx"\n', "name must be"), ('name = "x"\nfs_types = [""]\n', "fs_types"),
                        ('name = 5\n', "name must be"), ('name = "x"\nschemes = ["\\u001b]0;t\\u0007"]\n', "schemes")):
        p = tmp_path / "p.toml"
        p.write_text(bad + base)
        r = run_cli("plan", "7b", "--nodes", "2", "--storage", p)
        assert_one_line_error(r, needle)
        assert "\x1b" not in r.err
