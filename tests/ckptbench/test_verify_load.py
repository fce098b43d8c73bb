"""`verify` and `load` against the manifest: mismatches, truncation, and sources that are never modified."""

from __future__ import annotations

import json
import os

import pytest


def _one_line(r, *needles):
    assert "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error:"), r.err
    for n in needles:
        assert n in r.err_lines[0], r.err


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "dcp"])
def test_verify_json_digests_are_crc32c_of_the_files(h, ckpt, fmt):
    root = ckpt(fmt, 4)
    r = h.run_cli("verify", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    files = h.files_under(root)
    assert doc["ok"] is True and doc["has_reference"] is True and doc["problems"] == []
    assert doc["files"] == len(files) - 1  # all but the manifest itself
    assert doc["bytes"] == sum(len(d) for rel, d in files.items() if rel != h.MANIFEST)
    assert doc["digests"] == {rel: h.crc32c_hex(d) for rel, d in files.items() if rel != h.MANIFEST}


@pytest.mark.parametrize("fmt, rel", [("safetensors", "model-00004-of-00004.safetensors"),
                                      ("torch", "model_rank003.pt"), ("dcp", "__0_1.distcp")])
def test_truncated_shard(h, ckpt, tmp_path, fmt, rel):
    root = h.copy_ckpt(ckpt(fmt, 4), tmp_path / "ck")
    path = os.path.join(root, rel)
    full = os.path.getsize(path)
    os.truncate(path, full - 1000)
    v = h.run_cli("verify", root)
    assert v.rc == 1
    assert f"{rel}: {full - 1000} bytes, manifest says {full}" in v.err
    assert "MISMATCH" in v.out and "1 problem" in v.out
    vj = json.loads(h.run_cli("verify", root, "--json").out)
    assert vj["ok"] is False and [p["path"] for p in vj["problems"]] == [rel]
    r = h.run_cli("load", root)
    assert r.rc == 2 and r.out == ""
    _one_line(r, "do not match the manifest", rel)


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_edited_manifest_digest(h, ckpt, tmp_path, fmt):
    root = h.copy_ckpt(ckpt(fmt, 1), tmp_path / "ck")
    doc = h.read_manifest(root)
    entry = next(e for e in doc["files"] if e["kind"] == "optimizer")
    real = entry["digest"]
    entry["digest"] = f"{(int(real, 16) ^ 1):08x}"
    h.write_manifest(root, doc)
    before = h.snapshot(root)
    v = h.run_cli("verify", root)
    assert v.rc == 1
    assert entry["path"] in v.err and real in v.err
    r = h.run_cli("load", root, "--json")
    assert r.rc == 2 and r.out == ""
    _one_line(r, "do not match the manifest", entry["path"])
    assert h.snapshot(root) == before


def test_edited_manifest_via_the_cli_process(h, ckpt, tmp_path):
    root = h.copy_ckpt(ckpt("safetensors", 4), tmp_path / "ck")
    doc = h.read_manifest(root)
    doc["files"][0]["digest"] = "00000000" if doc["files"][0]["digest"] != "00000000" else "00000001"
    h.write_manifest(root, doc)
    r = h.run_proc("load", root)
    assert r.rc == 2
    _one_line(r, "do not match the manifest")
    assert h.run_proc("verify", root).rc == 1


def test_file_missing_from_disk(h, ckpt, tmp_path):
    root = h.copy_ckpt(ckpt("torch", 4), tmp_path / "ck")
    os.unlink(os.path.join(root, "scheduler.json"))
    v = h.run_cli("verify", root)
    assert v.rc == 1 and "scheduler.json" in v.err
    r = h.run_cli("load", root)
    assert r.rc == 2
    _one_line(r, "scheduler.json")


def test_unreadable_manifest_is_one_line(h, ckpt, tmp_path):
    root = h.copy_ckpt(ckpt("torch", 1), tmp_path / "ck")
    with open(os.path.join(root, h.MANIFEST), "w") as f:
        f.write("{not json")
    for cmd in ("verify", "load"):
        r = h.run_cli(cmd, root)
        assert r.rc == 2
        _one_line(r, h.MANIFEST)


@pytest.mark.parametrize("args", [["load"], ["verify"], ["load", "--no-verify"]])
def test_missing_directory_is_one_line(h, tmp_path, args):
    r = h.run_cli(args[0], tmp_path / "nope", *args[1:])
    assert r.rc == 2
    _one_line(r, "nope", "no such directory")


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "dcp"])
def test_load_and_verify_never_modify_the_source(h, ckpt, fmt):
    root = ckpt(fmt, 4)
    before = h.snapshot(root)
    listed = h.listing(root)
    parent = os.listdir(os.path.dirname(root))
    assert h.run_cli("load", root, "--optimizer-step", "--json").rc == 0
    assert h.run_cli("load", root, "--no-verify").rc == 0
    assert h.run_cli("verify", root, "--json").rc == 0
    assert h.snapshot(root) == before  # sizes, mtimes and sha256 of every file
    assert h.listing(root) == listed
    assert os.listdir(os.path.dirname(root)) == parent
