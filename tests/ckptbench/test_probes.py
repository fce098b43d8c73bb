"""System probes read fake /proc and /sys trees (tests/fixtures/proc_*): parsed values, and Unknown (never an
exception) with the path in its reason when a file is missing or malformed. Expected values are read off the
fixture files by hand."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import types
from pathlib import Path

import pytest

from ckptbench.system import probes
from ckptbench.system.probes import DiskStats, Mount, Unknown

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KIB = 1024
MIB = 1 << 20
GIB = 1 << 30


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def tree(tmp_path: Path, name: str, base: str = "/data") -> str:
    """A copy of tests/fixtures/<name> with @BASE@ in its mountinfo replaced by `base`."""
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root, symlinks=True)
    mi = root / "proc/self/mountinfo"
    if mi.exists():
        mi.write_text(mi.read_text().replace("@BASE@", _escape(base)))
    return str(root)


def write(root, rel: str, text: str) -> None:
    p = Path(root) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def assert_unknown(value, *fragments: str) -> None:
    assert isinstance(value, Unknown), value
    assert not value  # falsy, so `if probe():` reads naturally
    for frag in fragments:
        assert frag in value.reason, (frag, value.reason)


# ---------------------------------------------------------------- Unknown itself


def test_unknown_is_falsy_and_says_why():
    u = Unknown("proc/meminfo: No such file or directory")
    assert not u
    assert bool(u) is False
    assert str(u) == "unknown (proc/meminfo: No such file or directory)"


# ---------------------------------------------------------------- limits, fds


@pytest.mark.parametrize("name, expected", [("proc_ok", (1048576, 1048576)), ("proc_warn", (1024, 4096)),
                                            ("proc_fail", (64, 4096))])
def test_ulimit_nofile_parses_soft_and_hard(name, expected):
    assert probes.ulimit_nofile(str(FIXTURES / name)) == expected


def test_ulimit_nofile_unlimited_is_minus_one(tmp_path):
    write(tmp_path, "proc/self/limits",
          "Limit                     Soft Limit           Hard Limit           Units     \n"
          "Max open files            unlimited            unlimited            files     \n")
    assert probes.ulimit_nofile(str(tmp_path)) == (-1, -1)


def test_ulimit_nofile_missing_and_malformed(tmp_path):
    missing = probes.ulimit_nofile(str(tmp_path))
    assert_unknown(missing, str(tmp_path / "proc/self/limits"))
    write(tmp_path, "proc/self/limits", "Max processes 255356 255356 processes\n")
    assert_unknown(probes.ulimit_nofile(str(tmp_path)), "Max open files")
    write(tmp_path, "proc/self/limits", "Max open files   lots   many   files\n")
    assert_unknown(probes.ulimit_nofile(str(tmp_path)), "Max open files")


def test_fds_in_use_counts_entries():
    assert probes.fds_in_use(str(FIXTURES / "proc_ok")) == 5  # 0 1 2 3 4 in proc_ok/proc/self/fd


def test_fds_in_use_counts_a_fresh_directory(tmp_path):
    fd = tmp_path / "proc/self/fd"
    fd.mkdir(parents=True)
    for i in range(37):
        os.symlink("/dev/null", fd / str(i))
    assert probes.fds_in_use(str(tmp_path)) == 37


def test_fds_in_use_missing(tmp_path):
    assert_unknown(probes.fds_in_use(str(tmp_path)), str(tmp_path / "proc/self/fd"))


# ---------------------------------------------------------------- meminfo, sysctl


def test_meminfo_in_bytes():
    m = probes.meminfo(str(FIXTURES / "proc_ok"))
    assert m["MemTotal"] == 65536000 * KIB
    assert m["MemAvailable"] == 61440000 * KIB
    assert m["Dirty"] == 2048 * KIB
    assert m["Writeback"] == 0
    assert m["HugePages_Total"] == 0  # no unit: a count, not kB
    assert m["Hugepagesize"] == 2 * MIB


def test_meminfo_other_trees():
    w = probes.meminfo(str(FIXTURES / "proc_warn"))
    assert (w["MemTotal"], w["MemAvailable"], w["Dirty"]) == (64 * GIB, 50 * GIB, 8 * GIB)
    f = probes.meminfo(str(FIXTURES / "proc_fail"))
    assert (f["MemTotal"], f["MemAvailable"]) == (32 * GIB, 16 * GIB)


def test_meminfo_missing(tmp_path):
    assert_unknown(probes.meminfo(str(tmp_path)), str(tmp_path / "proc/meminfo"))


@pytest.mark.parametrize("name, value", [("vm.dirty_ratio", 20), ("vm.dirty_background_ratio", 10),
                                         ("vm.dirty_bytes", 0), ("vm.dirty_expire_centisecs", 3000),
                                         ("net.core.somaxconn", 4096)])
def test_sysctl_reads_proc_sys(name, value):
    assert probes.sysctl(name, str(FIXTURES / "proc_ok")) == value


def test_sysctl_missing_and_not_a_number(tmp_path):
    assert_unknown(probes.sysctl("vm.dirty_ratio", str(tmp_path)), str(tmp_path / "proc/sys/vm/dirty_ratio"))
    write(tmp_path, "proc/sys/vm/dirty_ratio", "twenty\n")
    assert_unknown(probes.sysctl("vm.dirty_ratio", str(tmp_path)), "proc/sys/vm/dirty_ratio")
    write(tmp_path, "proc/sys/vm/dirty_ratio", "")
    assert_unknown(probes.sysctl("vm.dirty_ratio", str(tmp_path)), "proc/sys/vm/dirty_ratio")


# ---------------------------------------------------------------- cpu, load, THP, instance


def test_cpu_model_count_loadavg_thp_instance():
    root = str(FIXTURES / "proc_ok")
    assert probes.cpu_model(root) == "AMD EPYC 7R13 Processor"
    assert probes.cpu_count(root) == 2
    assert probes.loadavg(root) == (0.52, 0.58, 0.59)
    assert probes.transparent_hugepages(root) == "madvise"
    assert probes.transparent_hugepages(str(FIXTURES / "proc_warn")) == "always"
    assert probes.instance_type(root) == "p4d.24xlarge"


def test_cpu_and_load_malformed(tmp_path):
    write(tmp_path, "proc/cpuinfo", "CPU implementer\t: 0x41\nBogoMIPS\t: 243.75\n")
    assert_unknown(probes.cpu_model(str(tmp_path)), "model name")
    assert_unknown(probes.cpu_count(str(tmp_path)), "processor")
    write(tmp_path, "proc/loadavg", "high higher highest 1/2 3\n")
    assert_unknown(probes.loadavg(str(tmp_path)), "loadavg")
    write(tmp_path, "sys/kernel/mm/transparent_hugepage/enabled", "always madvise never\n")
    assert_unknown(probes.transparent_hugepages(str(tmp_path)), "transparent_hugepage")


def test_arm_cpuinfo_model(tmp_path):
    write(tmp_path, "proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 243.75\nModel\t: Raspberry Pi 4 Model B\n")
    assert probes.cpu_model(str(tmp_path)) == "Raspberry Pi 4 Model B"
    assert probes.cpu_count(str(tmp_path)) == 1


# ---------------------------------------------------------------- every probe on an empty root


def test_every_probe_fails_soft_on_an_empty_root(tmp_path):
    r = str(tmp_path / "nothing")
    checks = {
        "proc/self/limits": probes.ulimit_nofile(r),
        "proc/self/fd": probes.fds_in_use(r),
        "proc/meminfo": probes.meminfo(r),
        "proc/sys/vm/dirty_ratio": probes.sysctl("vm.dirty_ratio", r),
        "proc/cpuinfo": probes.cpu_model(r),
        "proc/loadavg": probes.loadavg(r),
        "sys/kernel/mm/transparent_hugepage/enabled": probes.transparent_hugepages(r),
        "sys/class/dmi/id/product_name": probes.instance_type(r),
        "proc/self/mountinfo": probes.mount_of("/data/ckpt", r),
        "sys/dev/block/259:1/../queue/read_ahead_kb": probes.read_ahead_kb("259:1", r),
        "proc/diskstats": probes.diskstats("259:1", r),
        "proc/net/snmp": probes.tcp_counters(r),
        "proc": probes.openers("/data/ckpt", r),
    }
    for rel, value in checks.items():
        assert_unknown(value, os.path.join(r, rel))
    assert_unknown(probes.cpu_count(r), os.path.join(r, "proc/cpuinfo"))
    assert_unknown(probes.scheduler("259:1", r), "259:1")


def test_probes_fail_soft_when_root_is_a_file(tmp_path):
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    for value in (probes.meminfo(str(f)), probes.ulimit_nofile(str(f)), probes.fds_in_use(str(f)),
                  probes.mount_of("/x", str(f)), probes.openers("/x", str(f)), probes.tcp_counters(str(f))):
        assert_unknown(value, str(f))


# ---------------------------------------------------------------- mountinfo


def test_mount_of_root_ext4():
    m = probes.mount_of("/home/user/ckpt", str(FIXTURES / "proc_ok"))
    assert m == Mount("/", "ext4", "/dev/nvme0n1p1", "rw,relatime,rw,discard,errors=remount-ro", "259:1")


def test_mount_of_efs_merges_per_mount_and_super_options(tmp_path):
    root = tree(tmp_path, "proc_ok", "/data")
    m = probes.mount_of("/data/efs/run1/step-100", root)
    assert isinstance(m, Mount)
    assert (m.mount_point, m.fs_type, m.source, m.device) == (
        "/data/efs", "nfs4", "fs-123.efs.us-east-1.amazonaws.com:/", "0:52")
    opts = probes.mount_options(m)
    assert opts["relatime"] is True  # per-mount
    assert opts["rsize"] == "1048576" and opts["wsize"] == "1048576"  # super options
    assert opts["hard"] is True and opts["noresvport"] is True
    assert opts["nconnect"] == "16" and opts["vers"] == "4.1"
    assert "soft" not in opts
    assert probes.nfs_server(m) == "fs-123.efs.us-east-1.amazonaws.com"


def test_mount_of_failing_efs_options(tmp_path):
    m = probes.mount_of("/data/efs/ckpt", tree(tmp_path, "proc_fail", "/data"))
    opts = probes.mount_options(m)
    assert opts["rsize"] == "65536" and opts["soft"] is True
    assert "noresvport" not in opts and "hard" not in opts and "nconnect" not in opts


def test_mount_of_exact_mount_point_and_prefix_boundary(tmp_path):
    root = tree(tmp_path, "proc_ok", "/data")
    assert probes.mount_of("/data/efs", root).fs_type == "nfs4"
    # /data/efsx is not under /data/efs: it belongs to /
    assert probes.mount_of("/data/efsx/ckpt", root).mount_point == "/"


def test_mount_of_escaped_space(tmp_path):
    root = tree(tmp_path, "proc_ok", "/data")
    m = probes.mount_of("/data/my ckpt/step-7", root)
    assert isinstance(m, Mount)
    assert (m.mount_point, m.fs_type, m.source, m.device) == ("/data/my ckpt", "xfs", "/dev/nvme1n1", "259:3")
    assert probes.mount_options(m)["noatime"] is True
    assert probes.mount_of("/data/my\\040ckpt/x", root).mount_point == "/"  # the escaped form is not the path


def test_mount_of_lustre_and_fuse(tmp_path):
    root = tree(tmp_path, "proc_ok", "/data")
    lustre = probes.mount_of("/data/fsx/ckpt", root)
    assert (lustre.fs_type, lustre.source) == ("lustre", "10.0.0.20@tcp:/abcdefgh")
    assert probes.nfs_server(lustre) is None
    assert probes.mount_options(lustre)["flock"] is True
    fuse = probes.mount_of("/data/s3/bucket/ckpt", root)
    assert (fuse.fs_type, fuse.source) == ("fuse", "mountpoint-s3")
    assert probes.mount_options(fuse)["user_id"] == "1000"


def test_mount_of_nas_nfs(tmp_path):
    m = probes.mount_of("/mnt/nfs/ckpt", tree(tmp_path, "proc_warn", "/mnt"))
    assert (m.fs_type, m.source) == ("nfs4", "nas01.corp.example:/export/ckpt")
    assert probes.nfs_server(m) == "nas01.corp.example"


def test_mount_of_unescapes_the_source_too(tmp_path):
    """mountinfo escapes space, tab, newline and backslash in the source field as in the mount point."""
    write(tmp_path, "proc/self/mountinfo",
          "40 22 0:60 / /mnt/team\\040share rw,relatime shared:5 - cifs //nas01/team\\040share rw,vers=3.1.1\n")
    m = probes.mount_of("/mnt/team share/ckpt", str(tmp_path))
    assert m.mount_point == "/mnt/team share"
    assert m.source == "//nas01/team share"


def test_nfs_server_ipv6():
    m = Mount("/mnt", "nfs4", "[fd00::9]:/export", "rw", "0:50")
    assert probes.nfs_server(m) == "fd00::9"
    assert probes.nfs_server(Mount("/", "ext4", "/dev/sda1", "rw", "8:1")) is None


def test_mount_of_later_over_mount_wins_and_bad_lines_are_skipped(tmp_path):
    write(tmp_path, "proc/self/mountinfo",
          "garbage line without a separator\n"
          "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
          "30 22 0:40 / /ckpt rw,relatime shared:2 - tmpfs tmpfs rw\n"
          "31 30 0:41 / /ckpt rw,relatime shared:3 - nfs4 server:/x rw,rsize=1048576\n"
          "32 22\n")
    m = probes.mount_of("/ckpt/a", str(tmp_path))
    assert (m.fs_type, m.device) == ("nfs4", "0:41")


def test_mount_of_no_mount_holds_the_path(tmp_path):
    write(tmp_path, "proc/self/mountinfo", "30 22 0:40 / /ckpt rw,relatime shared:2 - tmpfs tmpfs rw\n")
    assert_unknown(probes.mount_of("/elsewhere/x", str(tmp_path)), "/elsewhere/x")
    assert_unknown(probes.mount_of("/data/x", str(tmp_path / "void")), str(tmp_path / "void/proc/self/mountinfo"))


def test_mount_options_flags_and_values():
    m = Mount("/", "ext4", "/dev/sda1", "rw,noatime,,commit=60", "8:1")
    assert probes.mount_options(m) == {"rw": True, "noatime": True, "commit": "60"}


# ---------------------------------------------------------------- block queue


def test_read_ahead_and_scheduler_partition_and_whole_disk():
    root = str(FIXTURES / "proc_ok")
    assert probes.read_ahead_kb("259:1", root) == 4096  # partition: its disk's queue through ..
    assert probes.scheduler("259:1", root) == "none"
    assert probes.read_ahead_kb("259:3", root) == 128  # whole disk: its own queue
    assert probes.scheduler("259:3", root) == "mq-deadline"
    warn = str(FIXTURES / "proc_warn")
    assert probes.read_ahead_kb("8:1", warn) == 16
    assert probes.scheduler("8:1", warn) == "mq-deadline"


def test_read_ahead_and_scheduler_unknown_device():
    root = str(FIXTURES / "proc_ok")
    assert_unknown(probes.read_ahead_kb("0:52", root), "0:52")  # an NFS mount has no block queue
    assert_unknown(probes.scheduler("0:52", root), "0:52")


def test_scheduler_without_brackets_is_the_text(tmp_path):
    write(tmp_path, "sys/dev/block/8:0/queue/scheduler", "none\n")
    assert probes.scheduler("8:0", str(tmp_path)) == "none"


# ---------------------------------------------------------------- diskstats, disk_util


def test_diskstats_reads_the_devices_line():
    root = str(FIXTURES / "proc_ok")
    # 259:1 nvme0n1p1: reads 149000 + writes 79000; io ticks 69000; read ms 59000 + write ms 39500
    assert probes.diskstats("259:1", root) == DiskStats(228000, 69000, 98500)
    assert probes.diskstats("259:0", root) == DiskStats(230000, 70000, 100000)
    assert probes.diskstats("8:1", str(FIXTURES / "proc_warn")) == DiskStats(78121, 41700, 90300)


def test_diskstats_unknown(tmp_path):
    assert_unknown(probes.diskstats("259:9", str(FIXTURES / "proc_ok")), "259:9")
    assert_unknown(probes.diskstats("259:1", str(tmp_path)), str(tmp_path / "proc/diskstats"))
    write(tmp_path, "proc/diskstats", " 259 1 nvme0n1p1 x y z 1 2 3 4 5 6 7 8\n")
    assert_unknown(probes.diskstats("259:1", str(tmp_path)), "259:1")


def test_disk_util_by_hand():
    before, after = DiskStats(1000, 5000, 2000), DiskStats(1500, 5800, 4500)
    # 800 ms busy in 2 s = 40 %; 2500 ms waited over 500 I/Os = 5 ms; 500 I/Os in 2 s = 250/s
    assert probes.disk_util(before, after, 2.0) == {"util_pct": 40.0, "await_ms": 5.0, "iops": 250.0}


def test_disk_util_caps_and_zero_windows():
    before = DiskStats(0, 0, 0)
    assert probes.disk_util(before, DiskStats(10, 5000, 20), 2.0)["util_pct"] == 100.0  # 250 % capped
    idle = probes.disk_util(before, DiskStats(0, 0, 0), 1.0)
    assert idle == {"util_pct": 0.0, "await_ms": 0.0, "iops": 0.0}
    assert probes.disk_util(before, DiskStats(4, 10, 8), 0) == {"util_pct": 0.0, "await_ms": 2.0, "iops": 0.0}


# ---------------------------------------------------------------- TCP


def test_tcp_counters_from_snmp():
    assert probes.tcp_counters(str(FIXTURES / "proc_ok")) == {"OutSegs": 2120000, "RetransSegs": 1060}


def test_tcp_counters_unknown(tmp_path):
    assert_unknown(probes.tcp_counters(str(tmp_path)), str(tmp_path / "proc/net/snmp"))
    write(tmp_path, "proc/net/snmp", "Tcp: RtoAlgorithm RtoMin OutSegs RetransSegs\n")
    assert_unknown(probes.tcp_counters(str(tmp_path)), "Tcp")
    write(tmp_path, "proc/net/snmp", "Tcp: RtoAlgorithm OutSegs RetransSegs\nTcp: 1 many 3\n")
    assert_unknown(probes.tcp_counters(str(tmp_path)), "Tcp")
    write(tmp_path, "proc/net/snmp", "Tcp: RtoAlgorithm InSegs\nTcp: 1 2\n")
    assert_unknown(probes.tcp_counters(str(tmp_path)), "Tcp")


def test_retransmit_rate_by_hand():
    before = {"OutSegs": 1000, "RetransSegs": 10}
    after = {"OutSegs": 3000, "RetransSegs": 50}
    assert probes.retransmit_rate(before, after) == pytest.approx(0.02)  # 40 retransmits / 2000 sent
    assert probes.retransmit_rate(before, before) == 0.0  # nothing sent: no rate, no division by zero


# ---------------------------------------------------------------- openers


def _make_openers(root: Path, src: Path) -> None:
    files = []
    for i in range(4):
        p = src / f"shard-{i}.bin"
        p.write_bytes(b"x")
        files.append(p)
    scanner = root / "proc/4242/fd"
    scanner.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(files[:3]):
        os.symlink(str(p), scanner / str(10 + i))
    os.symlink("/dev/null", scanner / "0")
    sibling = Path(str(src) + "2")  # /…/ckpt2 is not under /…/ckpt
    os.symlink(str(sibling / "shard-0.bin"), scanner / "20")
    other = root / "proc/5151/fd"  # no comm file
    other.mkdir(parents=True)
    os.symlink(str(files[3]), other / "3")
    quiet = root / "proc/6060/fd"
    quiet.mkdir(parents=True)
    os.symlink("/var/log/syslog", quiet / "1")
    (root / "proc/6060/comm").write_text("rsyslogd\n")
    (root / "proc/7070").mkdir()  # a process whose fd folder we cannot read


def test_openers_counts_links_into_the_directory(tmp_path):
    root = Path(tree(tmp_path, "proc_warn"))
    src = tmp_path / "ckpt"
    src.mkdir()
    _make_openers(root, src)
    found = sorted(probes.openers(str(src), str(root)))
    assert found == [(4242, "clamd", 3), (5151, "?", 1)]
    assert sorted(probes.openers(str(src) + "/", str(root))) == found  # trailing slash
    assert probes.openers(str(src), str(root), exclude_pid=4242) == [(5151, "?", 1)]


def test_openers_none_and_missing(tmp_path):
    assert probes.openers("/data/ckpt", str(FIXTURES / "proc_ok")) == []
    assert_unknown(probes.openers("/data/ckpt", str(tmp_path)), str(tmp_path / "proc"))


# ---------------------------------------------------------------- lustre stripe, gpus (tools faked on PATH)


def _tool(bindir: Path, name: str, script: str) -> None:
    bindir.mkdir(exist_ok=True)
    p = bindir / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_lustre_stripe_with_and_without_lfs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert_unknown(probes.lustre_stripe("/fsx/ckpt/shard.bin"), "lfs")
    _tool(tmp_path / "bin", "lfs", 'printf "4\\n1048576\\n"\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert probes.lustre_stripe("/fsx/ckpt/shard.bin") == {"stripe_count": 4, "stripe_size": 1048576}
    _tool(tmp_path / "bin", "lfs", 'echo "lfs: not a Lustre file" >&2; exit 22\n')
    assert_unknown(probes.lustre_stripe("/fsx/ckpt/shard.bin"), "not a Lustre file")


def test_gpus_from_nvidia_smi_when_torch_has_no_cuda(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    _tool(tmp_path / "bin", "nvidia-smi", 'printf "81559\\n81559\\n"\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert probes.gpus() == {"count": 2, "memory_bytes": [81559 * MIB, 81559 * MIB]}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert probes.gpus() == {"count": 0, "memory_bytes": []}


def test_gpus_broken_cuda_is_unknown(monkeypatch):
    def boom():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=boom)))
    assert_unknown(probes.gpus(), "torch.cuda", "RuntimeError")


# ---------------------------------------------------------------- S3 endpoint


def test_s3_endpoint_global_without_region():
    s3 = probes.s3_endpoint({})
    assert s3["endpoint_host"] == "s3.amazonaws.com"
    assert s3["region"] is None and s3["regional"] is False and s3["vpc_endpoint"] is False
    assert s3["proxies"] == {} and s3["retry_mode"] is None and s3["max_attempts"] is None


def test_s3_endpoint_regional_from_region_variables():
    s3 = probes.s3_endpoint({"AWS_REGION": "us-west-2", "AWS_RETRY_MODE": "adaptive", "AWS_MAX_ATTEMPTS": "10"})
    assert (s3["endpoint_host"], s3["region"], s3["regional"]) == ("s3.us-west-2.amazonaws.com", "us-west-2", True)
    assert (s3["retry_mode"], s3["max_attempts"]) == ("adaptive", "10")
    assert probes.s3_endpoint({"AWS_DEFAULT_REGION": "eu-central-1"})["endpoint_host"] == \
        "s3.eu-central-1.amazonaws.com"
    # AWS_REGION wins over AWS_DEFAULT_REGION
    assert probes.s3_endpoint({"AWS_REGION": "ap-south-1", "AWS_DEFAULT_REGION": "us-east-1"})["region"] == \
        "ap-south-1"


def test_s3_endpoint_url_overrides_and_s3_specific_wins():
    s3 = probes.s3_endpoint({"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "https://s3.amazonaws.com/"})
    assert s3["endpoint_host"] == "s3.amazonaws.com" and s3["regional"] is False  # the global one, region or not
    s3 = probes.s3_endpoint({"AWS_ENDPOINT_URL": "http://minio.local:9000",
                             "AWS_ENDPOINT_URL_S3": "https://s3.eu-west-1.amazonaws.com"})
    assert s3["endpoint_host"] == "s3.eu-west-1.amazonaws.com" and s3["regional"] is True


def test_s3_endpoint_global_with_port_is_not_regional():
    s3 = probes.s3_endpoint({"AWS_ENDPOINT_URL": "https://s3.amazonaws.com:443"})
    assert s3["regional"] is False


def test_s3_endpoint_vpc_interface_endpoint():
    host = "bucket.vpce-0a1b2c3d4e5f-abcdefgh.s3.us-east-1.vpce.amazonaws.com"
    s3 = probes.s3_endpoint({"AWS_ENDPOINT_URL_S3": f"https://{host}"})
    assert s3["endpoint_host"] == host and s3["vpc_endpoint"] is True and s3["regional"] is True
    assert probes.s3_endpoint({"AWS_REGION": "us-east-1"})["vpc_endpoint"] is False


def test_s3_endpoint_strips_proxy_and_endpoint_credentials():
    secret = "Sup3rS3cret!"
    env = {"HTTPS_PROXY": f"http://alice:{secret}@proxy.corp:3128",
           "http_proxy": f"bob:{secret}@proxy.corp:8080",
           "NO_PROXY": "169.254.169.254,.internal",
           "AWS_ENDPOINT_URL": f"https://carol:{secret}@objects.example.com:9000/",
           "AWS_SECRET_ACCESS_KEY": secret, "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SESSION_TOKEN": secret}
    s3 = probes.s3_endpoint(env)
    assert s3["proxies"] == {"HTTPS_PROXY": "http://proxy.corp:3128", "http_proxy": "proxy.corp:8080",
                             "NO_PROXY": "169.254.169.254,.internal"}
    assert s3["endpoint_host"].split(":")[0] == "objects.example.com"
    text = repr(s3)
    for leak in (secret, "alice", "bob", "carol", "AKIAEXAMPLE"):
        assert leak not in text


# ---------------------------------------------------------------- size histogram


def test_size_histogram_buckets_and_edges():
    sizes = [0, 64 * KIB - 1,  # <64KiB
             64 * KIB, MIB - 1,  # 64KiB-1MiB
             MIB, 16 * MIB - 1, 5 * MIB,  # 1-16MiB
             16 * MIB, 256 * MIB - 1,  # 16-256MiB
             256 * MIB, 40 * GIB]  # >=256MiB
    assert probes.size_histogram(sizes) == {"<64KiB": 2, "64KiB-1MiB": 2, "1-16MiB": 3, "16-256MiB": 2,
                                            ">=256MiB": 2}
    assert probes.size_histogram([]) == {"<64KiB": 0, "64KiB-1MiB": 0, "1-16MiB": 0, "16-256MiB": 0, ">=256MiB": 0}


def test_unknown_reason_names_errno_text(tmp_path):
    assert_unknown(probes.meminfo(str(tmp_path)), os.strerror(errno.ENOENT))


def test_own_peak_rss_is_the_childs_not_the_parent_it_was_forked_from():
    """ru_maxrss of a child keeps the peak of the memory map exec replaced: a child of a large parent (the peers
    bench, 5 GiB) reported the parent's size for every peer. own_peak_rss is the child's own."""
    import subprocess
    import sys

    big = bytearray(512 << 20)  # this process's resident size grows by 512 MiB, touched
    for i in range(0, len(big), 4096):
        big[i] = 1
    code = ("import resource; from ckptbench.system import probes; "
            "print(probes.own_peak_rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    own, maxrss = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                          check=True).stdout.split())
    assert maxrss >= 512 << 20  # the inherited peak the kernel keeps (what the bench reported before)
    assert 0 < own < 256 << 20  # a Python importing ckptbench.system: far below the parent's 512 MiB
    del big
