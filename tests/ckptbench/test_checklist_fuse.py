"""FUSE facts and rules without a mount: the daemon found in a fake /proc, its options parsed from its command
line, and the checklist's FUSE item and mount-options judgement for each known daemon. The same rules against a
real s3fs mount are in tests/fuse."""

from __future__ import annotations

import os

from ckptbench.checklist import rules as checklist
from ckptbench.system import fuse as fuse_probes
from ckptbench.system import probes
from ckptbench.system import storage
from ckptbench.checklist.facts import Facts

MIB = 1 << 20


def _proc(tmp_path, procs: dict[int, list[str]]) -> str:
    """A root whose proc/PID/cmdline hold the given argv lists (NUL-separated, as the kernel writes them)."""
    for pid, argv in procs.items():
        d = tmp_path / "proc" / str(pid)
        d.mkdir(parents=True)
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (tmp_path / "proc" / "self").mkdir(exist_ok=True)
    return str(tmp_path)


def _facts(mount: probes.Mount, fuse, sizes=(4 * MIB,) * 3 + (1000,) * 20) -> Facts:
    preset = storage.match(storage.load_all(), scheme=None, fs_type=mount.fs_type, source=mount.source)
    return Facts(source=mount.mount_point + "/ckpt", mount=mount, fuse=fuse, sizes=list(sizes), files=len(sizes),
                 preset=preset)


S3FS = probes.Mount("/mnt/ckpt", "fuse.s3fs", "s3fs", "rw,nosuid,nodev,relatime,user_id=0,group_id=0", "0:52")
MOUNTPOINT_S3 = probes.Mount("/mnt/ms3", "fuse", "mountpoint-s3", "rw,nosuid,nodev,noatime,user_id=0,group_id=0",
                             "0:53")


def test_fuse_kind_from_the_fstype_subtype_or_the_source():
    assert fuse_probes.fuse_kind(S3FS) == "s3fs"
    assert fuse_probes.fuse_kind(MOUNTPOINT_S3) == "mountpoint-s3"
    assert fuse_probes.fuse_kind(probes.Mount("/m", "fuse.rclone", "r:bucket", "rw", "0:1")) == "rclone"
    assert isinstance(fuse_probes.fuse_kind(probes.Mount("/m", "fuse", "sshfs-thing", "rw", "0:1")), probes.Unknown)
    assert isinstance(fuse_probes.fuse_kind(probes.Mount("/m", "ext4", "/dev/sda", "rw", "8:1")), probes.Unknown)


def test_daemon_options_parse_o_lists_and_flags_and_hide_secrets():
    opts = fuse_probes.daemon_options(["s3fs", "bkt", "/mnt/ckpt", "-o", "url=http://h:9000,use_path_request_style",
                                  "-oparallel_count=16", "-o", "passwd_file=/etc/p"])
    assert opts == {"url": "http://h:9000", "use_path_request_style": True, "parallel_count": "16",
                    "passwd_file": "/etc/p"}
    opts = fuse_probes.daemon_options(["mount-s3", "bkt", "/mnt/ms3", "--max-threads", "64", "--read-part-size=8388608",
                                  "--foreground", "/mnt/ms3"], ("/mnt/ms3",))
    assert opts == {"max-threads": "64", "read-part-size": "8388608", "foreground": True}
    opts = fuse_probes.daemon_options(["rclone", "mount", "r:b", "/m", "--s3-secret-access-key", "SEKRIT"])
    assert opts == {"s3-secret-access-key": "(hidden)"}


def test_fuse_daemon_is_the_process_naming_the_mount_point(tmp_path):
    root = _proc(tmp_path, {10: ["/usr/bin/s3fs", "other", "/mnt/other", "-o", "parallel_count=2"],
                            11: ["/usr/bin/s3fs", "bkt", "/mnt/ckpt/", "-o", "parallel_count=16"],
                            12: ["bash"]})
    d = fuse_probes.fuse_daemon(S3FS, root)
    assert d == {"kind": "s3fs", "pid": 11, "command": "s3fs", "options": {"parallel_count": "16"}}
    root2 = _proc(tmp_path / "b", {20: ["mount-s3", "bkt", "/mnt/ms3", "--max-threads", "16"]})
    assert fuse_probes.fuse_daemon(MOUNTPOINT_S3, root2)["options"] == {"max-threads": "16"}


def test_fuse_daemon_not_found_is_unknown_with_the_reason(tmp_path):
    root = _proc(tmp_path, {12: ["bash"]})
    d = fuse_probes.fuse_daemon(S3FS, root)
    assert isinstance(d, probes.Unknown) and "no s3fs process names /mnt/ckpt" in d.reason
    assert isinstance(fuse_probes.fuse_daemon(S3FS, str(tmp_path / "nowhere")), probes.Unknown)


def test_the_s3fs_preset_matches_fuse_s3fs_mounts():
    p = storage.match(storage.load_all(), scheme=None, fs_type="fuse.s3fs", source="s3fs")
    assert p is not None and p.name == "fuse-s3fs"
    assert p.mount_options == {"parallel_count": 16, "multipart_size": 64, "max_stat_cache_size": 100000}


def test_fuse_item_comes_after_mount_options_only_on_fuse():
    ids = [i.id for i in checklist.evaluate(_facts(S3FS, {"kind": "s3fs", "pid": 1, "command": "s3fs",
                                                          "options": {}}))]
    assert ids[ids.index("mount_options") + 1] == "fuse" and len(ids) == len(checklist.RULES) + 2  # and "loads"
    ext4 = probes.Mount("/data", "ext4", "/dev/nvme0n1", "rw,noatime", "259:1")
    assert "fuse" not in [i.id for i in checklist.evaluate(_facts(ext4, None))]


def test_s3fs_item_names_rename_o_direct_small_files_and_the_cache():
    f = _facts(S3FS, {"kind": "s3fs", "pid": 7, "command": "s3fs", "options": {"url": "https://s3.eu-west-1.x"}})
    it = checklist.fuse_mount(f)
    assert it.verdict == "warn" and it.evidence["daemon"] == "s3fs" and it.evidence["daemon_pid"] == 7
    assert it.evidence["rename"] == "copy + delete (not atomic)" and it.evidence["cache"] is None
    assert it.evidence["small_files"] == 23  # every file is under the preset's 8 MiB part
    assert "save to local disk and upload" in it.fix and "--read pread" in it.fix
    assert f"ckptbench pack {f.source} PACKED" in it.fix and "-o use_cache=" in it.fix
    assert "https://s3.eu-west-1.x" in checklist.network_path(f).fix


def test_s3fs_small_files_that_pack_would_not_pack_are_not_sent_to_pack():
    """All small files a loader opens by name (shards, configs): pack says "nothing to pack", so the FUSE item,
    as the small-files item, advises fewer, larger files at save time instead."""
    f = _facts(S3FS, {"kind": "s3fs", "pid": 7, "command": "s3fs", "options": {}})
    f.packable = 0
    it = checklist.fuse_mount(f)
    assert f"ckptbench pack {f.source}" not in it.fix and "23 files under" in it.fix and "fewer, larger files" in it.fix
    f.packable = 5
    assert f"ckptbench pack {f.source} PACKED" in checklist.fuse_mount(f).fix


def test_s3fs_with_a_cache_is_not_told_to_add_one():
    it = checklist.fuse_mount(_facts(S3FS, {"kind": "s3fs", "pid": 7, "command": "s3fs",
                                            "options": {"use_cache": "/nvme/c"}}, sizes=(64 * MIB,)))
    assert it.evidence["cache"] == "/nvme/c" and "use_cache" not in it.fix and "pack" not in it.fix


def test_s3fs_mount_options_against_the_preset():
    low = _facts(S3FS, {"kind": "s3fs", "pid": 7, "command": "s3fs",
                        "options": {"parallel_count": "5", "multipart_size": "64"}})
    it = checklist.mount_options(low)
    assert it.verdict == "warn" and it.evidence["preset"] == "fuse-s3fs"
    assert it.evidence["problems"] == ["parallel_count=5 is below 16", "max_stat_cache_size not set (s3fs's default)"]
    assert "remount s3fs with -o parallel_count=16,multipart_size=64,max_stat_cache_size=100000" in it.fix
    tuned = _facts(S3FS, {"kind": "s3fs", "pid": 7, "command": "s3fs", "options": {
        "parallel_count": "32", "multipart_size": "64", "max_stat_cache_size": "100000"}})
    assert checklist.mount_options(tuned).verdict == "ok"


def test_mount_options_unknown_when_the_daemon_is_not_found():
    it = checklist.mount_options(_facts(S3FS, probes.Unknown("daemon not found: no s3fs process names /mnt/ckpt")))
    assert it.verdict == "unknown" and "ps -o args -C s3fs" in it.fix and "daemon not found" in it.evidence["reason"]


def test_mountpoint_s3_without_a_preset_is_judged_by_its_own_tuning_flags():
    f = _facts(MOUNTPOINT_S3, {"kind": "mountpoint-s3", "pid": 9, "command": "mount-s3",
                               "options": {"max-threads": "16"}})
    assert f.preset is None
    it = checklist.mount_options(f)
    assert it.verdict == "warn" and "max-threads=16 is below 64" in it.evidence["problems"]
    assert f"--max-threads 64 --read-part-size {16 * MIB}" in it.fix
    fuse = checklist.fuse_mount(f)
    assert fuse.verdict == "warn" and "--cache /local/nvme/mountpoint-s3-cache" in fuse.fix


def test_an_unknown_fuse_daemon_is_unknown_not_guessed():
    m = probes.Mount("/m", "fuse.sshfs", "host:/x", "rw,relatime", "0:9")
    f = _facts(m, probes.Unknown("daemon not found"))
    assert checklist.fuse_mount(f).verdict == "unknown"
    assert checklist.mount_options(f).verdict == "unknown"
    assert os.path.basename(f.source) == "ckpt"
