"""ckptbench against a real FUSE mount: s3fs over the local S3 (fixtures in conftest.py). A checkpoint written
through the mount restores from it, and `check` names the daemon, its options and what a FUSE object store does
to a checkpoint. Nothing here asserts a time: only that the stages were timed and the bytes are right."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from fusehelp import ckptbench, s3fs_mount

STAGES = ("list", "read", "verify", "load", "device", "check")


def _items(doc: dict) -> dict:
    return {i["id"]: i for i in doc["items"]}


def test_the_mount_is_fuse_s3fs_and_backed_by_the_bucket(s3fs_ckpt):
    from ckptbench.system import probes

    m = probes.mount_of(os.path.join(s3fs_ckpt.path, "ckpt"))
    assert isinstance(m, probes.Mount) and m.fs_type == "fuse.s3fs" and m.mount_point == s3fs_ckpt.path
    keys = {o["Key"] for o in s3fs_ckpt.s3.client(direct=True).list_objects_v2(
        Bucket=s3fs_ckpt.bucket, Prefix="ckpt/")["Contents"]}
    assert "ckpt/model.safetensors.index.json" in keys or any(k.endswith(".safetensors") for k in keys)


def test_run_restores_from_the_mount_and_times_every_stage(s3fs_ckpt):
    src = os.path.join(s3fs_ckpt.path, "ckpt")
    r = ckptbench("run", src, "--repeat", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "ok" and doc["verified"] is True and doc["source"] == src
    assert set(STAGES) <= set(doc["stages"]) and all(doc["stages"][s] >= 0 for s in STAGES)
    assert doc["stages"]["read"] > 0
    # --read auto: O_DIRECT opens on the mount but stops at the daemon, so the read path is pread, and says why
    assert doc["read"]["modes"] == ["pread"] and doc["read"]["why"].startswith("FUSE: fuse.s3fs")


@pytest.mark.usefixtures("box_floor")
def test_check_has_the_fuse_item_with_the_daemon_and_its_fixes(s3fs_ckpt):
    src = os.path.join(s3fs_ckpt.path, "ckpt")
    r = ckptbench("check", src, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    items = _items(json.loads(r.stdout))
    fuse = items["fuse"]
    assert fuse["verdict"] == "warn"
    ev = fuse["evidence"]
    assert ev["fs_type"] == "fuse.s3fs" and ev["daemon"] == "s3fs" and ev["daemon_pid"] > 0
    assert ev["daemon_options"]["url"] == s3fs_ckpt.s3.direct_url and ev["daemon_options"]["use_path_request_style"]
    assert ev["rename"] == "copy + delete (not atomic)" and ev["cache"] is None
    assert "save to local disk and upload" in fuse["fix"] and "-o use_cache=" in fuse["fix"]
    assert f"ckptbench pack {src} PACKED" in fuse["fix"]
    assert s3fs_ckpt.s3.direct_url in items["network_path"]["fix"]
    opts = items["mount_options"]
    assert opts["verdict"] == "warn" and opts["evidence"]["preset"] == "fuse-s3fs"
    assert "parallel_count not set (s3fs's default)" in opts["evidence"]["problems"]
    assert "-o parallel_count=16,multipart_size=64,max_stat_cache_size=100000" in opts["fix"]
    assert items["concurrency"]["evidence"]["preset"] == "fuse-s3fs"


@pytest.mark.usefixtures("box_floor")
def test_check_passes_the_mount_options_of_a_tuned_mount(fuse_s3, tmp_path):
    bucket = fuse_s3.make_bucket()
    with s3fs_mount(fuse_s3, bucket, str(tmp_path), "parallel_count=16", "multipart_size=64",
                    "max_stat_cache_size=100000", f"use_cache={tmp_path / 'cache'}") as mnt:
        os.mkdir(tmp_path / "cache")
        src = os.path.join(mnt, "ckpt")
        gen = ckptbench("gen", "small", src, "--scale", "0.02")
        assert gen.returncode == 0, gen.stderr[-2000:]
        items = _items(json.loads(ckptbench("check", src, "--json").stdout))
        assert items["mount_options"]["verdict"] == "ok", items["mount_options"]
        assert items["fuse"]["evidence"]["cache"] == str(tmp_path / "cache")
        assert "use_cache" not in items["fuse"]["fix"]


def test_rename_on_the_mount_is_a_copy_and_a_delete(s3fs_mounted):
    """What the FUSE item tells the user, shown on the object store: a rename leaves a new object (a server-side
    copy) and deletes the old one; there is no atomic move underneath."""
    path = s3fs_mounted.path
    os.makedirs(os.path.join(path, "tmp-step"))
    data = os.urandom(3 << 20)
    with open(os.path.join(path, "tmp-step", "shard.bin"), "wb") as f:
        f.write(data)
    os.rename(os.path.join(path, "tmp-step", "shard.bin"), os.path.join(path, "tmp-step", "final.bin"))
    client = s3fs_mounted.s3.client(direct=True)
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=s3fs_mounted.bucket)["Contents"]}
    assert "tmp-step/final.bin" in keys and "tmp-step/shard.bin" not in keys
    assert client.get_object(Bucket=s3fs_mounted.bucket, Key="tmp-step/final.bin")["Body"].read() == data


def test_save_onto_the_mount_lands_in_the_bucket(s3fs_mounted):
    """The mount as a save target: each save is committed by renaming its temporary directory, which s3fs turns
    into object copies and deletes; what is left in the bucket is the newest save, whole, and no temporary."""
    target = os.path.join(s3fs_mounted.path, "saves")
    r = ckptbench("save", "small", target, "--count", "1", "--scale", "0.02", "--results", "")
    # the preflight sees that a directory rename on s3fs is copies and deletes: no save without --force
    assert r.returncode == 1 and "s3fs FUSE mount over an object store" in r.stderr, r.stderr[-2000:]
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1
    r = ckptbench("save", "small", target, "--count", "2", "--keep", "1", "--scale", "0.02", "--json",
                  "--results", "", "--force")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    names = [s["name"] for s in doc["saves"]]
    assert len(names) == 2 and all(s["durable_s"] >= s["written_s"] > 0 for s in doc["saves"])
    assert any("no block device" in n for n in doc["notes"])  # FUSE: the write side has no device to sample
    keys = {o["Key"] for o in s3fs_mounted.s3.client(direct=True).list_objects_v2(
        Bucket=s3fs_mounted.bucket, Prefix="saves/")["Contents"]}
    tops = {k.split("/")[1] for k in keys if k.count("/") >= 2}
    assert tops == {names[-1]}, sorted(keys)  # keep=1, and no temporary directory left behind
    on_disk = {os.path.relpath(os.path.join(d, n), target) for d, _, ns in os.walk(target) for n in ns}
    assert {f"saves/{p}" for p in on_disk} <= keys


def test_a_dcp_checkpoint_on_the_mount_is_read_by_range_and_every_file_verified(s3fs_mounted, tmp_path):
    """A DCP restore reads each chunk's elements by range (restore/tiles.py): on a FUSE mount each range is its own
    open and pread through the daemon. The ranges must still cover every byte (each file's CRC combined from its
    tiles, checked against the manifest), and a byte flipped between two chunks, behind the daemon, fails the
    restore naming the file."""
    local = tmp_path / "dcp"
    gen = ckptbench("gen", "small", local, "--format", "dcp", "--ranks", "2", "--scale", "0.02")
    assert gen.returncode == 0, gen.stderr[-2000:]
    src = os.path.join(s3fs_mounted.path, "dcp")
    shutil.copytree(local, src, copy_function=shutil.copyfile)  # through the mount, as a trainer saving onto it
    r = ckptbench("run", src, "--repeat", "1", "--json", "--results", "")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "ok" and doc["verified"] is True, doc.get("notes")
    rep = doc["repeats"][0]
    assert rep["read"]["mode"] == "pread" and "each DCP chunk's elements land" in rep["read"]["why"], rep["read"]
    assert "read by range" in rep["notes"]["load"]
    assert doc["bytes"] == sum(p.stat().st_size for p in local.rglob("*") if p.is_file())

    from ckptbench.checkpoint.formats import dcp_format

    meta = dcp_format.SafeReader(str(local)).read_metadata()
    info = next(iter(meta.storage_data.values()))
    raw = bytearray((local / str(info.relative_path)).read_bytes())
    raw[info.offset + 2] ^= 0x01  # inside a chunk's zip local header: read by a tile, in no tensor
    s3fs_mounted.s3.client(direct=True).put_object(Bucket=s3fs_mounted.bucket, Key=f"dcp/{info.relative_path}",
                                                   Body=bytes(raw))  # behind the daemon's back, as another writer
    bad = ckptbench("run", src, "--repeat", "1", "--results", "")
    assert bad.returncode != 0 and str(info.relative_path) in bad.stdout + bad.stderr, bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr
