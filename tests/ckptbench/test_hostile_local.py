"""Unlucky and crafted local checkpoints: an unreadable file or directory stays a per-file failure in every
command, and manifest entries that point outside, at a FIFO or at a device are refused before any read.

Permission cases run without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (setpriv): root bypasses file modes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def cli_without_dac(*args, timeout=300):
    proc = subprocess.run([*NO_DAC, sys.executable, "-m", "ckptbench", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def locked(ckpt, tmp_path, h):
    """A checkpoint with one file mode 000 and one extra sub-directory mode 000."""
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    os.chmod(os.path.join(root, "config.json"), 0)
    os.mkdir(os.path.join(root, "hidden"))
    with open(os.path.join(root, "hidden", "f.bin"), "wb") as f:
        f.write(b"x" * 100)
    os.chmod(os.path.join(root, "hidden"), 0)
    yield root
    os.chmod(os.path.join(root, "hidden"), 0o755)


def test_setpriv_really_drops_the_bypass(locked):
    r = subprocess.run([*NO_DAC, sys.executable, "-c", f"open({os.path.join(locked, 'config.json')!r}).read()"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "PermissionError" in r.stderr


def test_read_keeps_the_other_files_and_names_both_failures(locked):
    r = cli_without_dac("read", locked, "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    total = sum(len(n) for _, _, n in os.walk(locked)) - 1  # hidden/f.bin is never listed
    assert doc["files_failed"] == 1 and doc["files_ok"] == total - 1
    bad = [f for f in doc["files"] if f["error"]]
    assert bad[0]["path"].endswith("config.json") and bad[0]["error"]["errno"] == 13
    assert doc["unreadable_dirs"] == [{"path": os.path.join(locked, "hidden"), "error": "Permission denied"}]


def test_run_is_a_failed_restore_naming_both_not_a_crash(locked, tmp_path):
    results = tmp_path / "r.csv"
    r = cli_without_dac("run", locked, "--repeat", "1", "--json", "--results", results)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    (rep,) = doc["repeats"]
    assert rep["status"] == "failed" and 0 < rep["success_rate"] < 1
    assert any(p.startswith("config.json: unreadable") for p in rep["problems"])
    assert any(p.startswith("hidden: unreadable directory") for p in rep["problems"])
    assert results.read_text().count("\n") == 2  # the repeat is on record


def test_verify_check_and_sweep_report_it_and_go_on(locked, h):
    r = cli_without_dac("verify", locked, "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert [p["path"] for p in doc["problems"]] == ["config.json", "hidden"]  # as run reports them
    assert len(doc["digests"]) == len(h.read_manifest(locked)["files"]) - 1
    r = cli_without_dac("check", locked, "--json")
    assert r.returncode == 1
    item = next(i for i in json.loads(r.stdout)["items"] if i["id"] == "readable")
    assert item["verdict"] == "fail" and item["evidence"]["unreadable_count"] == 2
    r = cli_without_dac("sweep", locked, "--levels", "1,2", "--repeat", "1", "--cache", "as-is", "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert {os.path.basename(f["path"]) for f in doc["failed"]} == {"config.json", "hidden"}
    assert all(v["median"] > 0 for v in doc["gbps"].values())


@pytest.fixture
def crafted(ckpt, tmp_path, h):
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(os.urandom(1000))
    os.chmod(secret, 0o600)
    return root, str(secret), h


def _point_first_entry(h, root, path, size):
    doc = h.read_manifest(root)
    doc["files"][0]["path"], doc["files"][0]["bytes"] = path, size
    h.write_manifest(root, doc)
    return doc["files"][0]


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_verify_refuses_entries_outside_the_checkpoint(crafted, how):
    from clirun import run_cli

    root, secret, h = crafted
    size = os.path.getsize(secret)
    if how == "dotdot":
        path = "../secret.bin"
    elif how == "absolute":
        path = secret
    else:
        os.symlink(secret, os.path.join(root, "link.bin"))
        path = "link.bin"
    _point_first_entry(h, root, path, size)
    r = run_cli("verify", root, "--json")
    assert r.rc == 1
    doc = json.loads(r.out)
    refused = [p for p in doc["problems"] if p["path"] == path]
    assert len(refused) == 1 and refused[0]["problem"].startswith("refused:"), doc["problems"]
    assert path not in doc["digests"]  # nothing about the outside file is printed


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_verify_refuses_a_fifo_or_a_device_without_hanging(crafted, kind):
    from clirun import run_cli

    root, _, h = crafted
    special = os.path.join(root, "special")
    if kind == "fifo":
        os.mkfifo(special)
    else:
        os.mknod(special, 0o600 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero's numbers
    _point_first_entry(h, root, "special", 4096)
    r = run_cli("verify", root, "--json")
    assert r.rc == 1
    problems = {p["path"]: p["problem"] for p in json.loads(r.out)["problems"]}
    assert problems["special"] == "refused: not a regular file"
    os.unlink(special)
    shutil.rmtree(root)
