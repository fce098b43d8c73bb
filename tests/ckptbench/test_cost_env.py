"""The RTO in money (cost), the recorded environment (env, probes over fixture roots), and what is never recorded
(credentials from the process environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from clirun import Run, run_cli

from ckptbench.core.errors import CkptbenchError

SCALE = "0.02"


Result = Run
cli = run_cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    target = tmp_path_factory.mktemp("cost-ckpt") / "ckpt"
    r = cli("gen", "small", target, "--scale", SCALE, "--format", "safetensors", "--ranks", "1")
    assert r.rc == 0, r.err
    return str(target)


# --- cost ---

def test_restore_cost_per_restore_is_price_times_hours():
    from ckptbench.plan.cost import restore_cost

    c = restore_cost(2400, 13)
    assert c["per_restore"] == pytest.approx(8.666666666666666)  # 40 min at 13 $/h
    assert c["effective_price_per_hour"] == 13
    assert c["per_month"] == pytest.approx(8.666666666666666 * 30)  # one restore a day, 30 days
    assert c["idle_gpu_hours_per_month"] == pytest.approx(20.0)  # 40 min × 30


def test_restore_cost_with_spot_discount_and_restores_per_day():
    from ckptbench.plan.cost import restore_cost

    c = restore_cost(2400, 13, spot_discount=0.7, restores_per_day=4)
    assert c["effective_price_per_hour"] == pytest.approx(3.9)
    assert c["per_restore"] == pytest.approx(2.6)  # 13 × 0.3 × 2/3
    assert c["per_month"] == pytest.approx(2.6 * 4 * 30)
    assert c["idle_gpu_hours_per_month"] == pytest.approx(80.0)  # 2/3 h × 4 × 30
    assert c["spot_discount"] == 0.7 and c["restores_per_day"] == 4


def test_reference_example_forty_against_fifteen_minutes():
    from ckptbench.plan.cost import restore_cost

    slow, fast = restore_cost(40 * 60, 13), restore_cost(15 * 60, 13)
    assert fast["per_restore"] == pytest.approx(3.25)
    assert slow["per_restore"] - fast["per_restore"] == pytest.approx(5.416666666666667)


def test_zero_restores_per_day_costs_nothing_per_month():
    from ckptbench.plan.cost import restore_cost

    c = restore_cost(600, 10, restores_per_day=0)
    assert c["per_restore"] == pytest.approx(10 / 6)
    assert c["per_month"] == 0 and c["idle_gpu_hours_per_month"] == 0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"spot_discount": 1.5}, "--spot-discount"),
        ({"spot_discount": -0.1}, "--spot-discount"),
        ({"price_per_hour": -1}, "--price-per-hour"),
        ({"restores_per_day": -2}, "--restores-per-day"),
    ],
)
def test_restore_cost_rejects_invalid_figures(kwargs, needle):
    from ckptbench.plan.cost import restore_cost

    args = {"rto_s": 60, "price_per_hour": 13, **kwargs}
    with pytest.raises(CkptbenchError, match=needle):
        restore_cost(**args)


def test_run_reports_cost_of_its_median_rto(ckpt, tmp_path):
    r = cli("run", ckpt, "--repeat", "1", "--price-per-hour", "13", "--spot-discount", "0.6",
            "--restores-per-day", "2", "--json", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    cost = doc["cost"]
    assert cost["per_restore"] == pytest.approx(doc["rto_s"] / 3600 * 13 * 0.4)
    assert cost["per_month"] == pytest.approx(doc["rto_s"] / 3600 * 13 * 0.4 * 2 * 30)
    assert cost["idle_gpu_hours_per_month"] == pytest.approx(doc["rto_s"] * 2 * 30 / 3600)


def test_a_small_cost_is_said_to_three_figures_not_as_nothing(ckpt, tmp_path):
    """A small checkpoint's restore at 9.60/h cost 'cost: 0.00 per restore', as if it cost nothing."""
    import re

    from ckptbench.core.units import human_money

    assert [human_money(x) for x in (0.000153, 0.05, 0.5, 12.345, 12345.6)] == \
        ["0.000153", "0.05", "0.50", "12.35", "12,345.60"]
    r = cli("run", ckpt, "--repeat", "1", "--price-per-hour", "9.6", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    line = next(x for x in r.out.splitlines() if x.startswith("cost"))
    shown = float(re.search(r"\): ([\d.,]+) per restore", line).group(1))
    assert shown > 0 and "in --price-per-hour's currency" in line, line


def test_run_without_a_price_has_no_cost(ckpt, tmp_path):
    r = cli("run", ckpt, "--repeat", "1", "--json", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert "cost" not in json.loads(r.out)


def test_run_with_invalid_discount_exits_2_before_running(ckpt, tmp_path):
    results = tmp_path / "R.csv"
    r = cli("run", ckpt, "--repeat", "1", "--price-per-hour", "13", "--spot-discount", "1.5", "--results", results)
    assert r.rc == 2 and r.out == ""
    assert len(r.err_lines) == 1 and "--spot-discount" in r.err_lines[0]
    assert not results.exists()


# --- probes over fixture roots ---

def write(root, rel: str, text: str) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


MOUNTINFO = "\n".join([
    "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,discard",
    "40 22 0:50 / /mnt/nfs\\040data rw,noatime shared:60 - nfs4 fileserver:/export/ckpt "
    "rw,vers=4.1,rsize=1048576,wsize=1048576,hard,proto=tcp",
    "41 22 0:51 / /mnt/nfs rw,relatime shared:61 - tmpfs tmpfs rw,size=1024k",
    "bogus line without separator",
    "",
])


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("fakeroot"))
    write(root, "proc/meminfo", "MemTotal:       16384 kB\nMemAvailable:    8192 kB\nHugePages_Total:       3\n")
    write(root, "proc/sys/vm/dirty_ratio", "20\n")
    write(root, "proc/sys/vm/dirty_background_ratio", "not-a-number\n")
    write(root, "proc/self/mountinfo", MOUNTINFO)
    write(root, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Fake CPU 9000 @ 3.0GHz\n")
    write(root, "sys/class/dmi/id/product_name", "p5.48xlarge\n")
    write(root, "sys/dev/block/0:50/queue/read_ahead_kb", "15360\n")
    # a partition: its directory is a link inside its disk, whose queue the partition reports
    write(root, "sys/block/vda/queue/read_ahead_kb", "4096\n")
    os.makedirs(os.path.join(root, "sys/block/vda/vda1"))
    os.symlink("../../block/vda/vda1", os.path.join(root, "sys/dev/block/253:1"))
    return root


def test_meminfo_in_bytes(fake_root):
    from ckptbench.system import probes

    mem = probes.meminfo(fake_root)
    assert mem["MemTotal"] == 16384 * 1024
    assert mem["MemAvailable"] == 8192 * 1024
    assert mem["HugePages_Total"] == 3  # no unit: a count, not kB


def test_sysctl_number_and_not_a_number(fake_root):
    from ckptbench.system import probes

    assert probes.sysctl("vm.dirty_ratio", fake_root) == 20
    bad = probes.sysctl("vm.dirty_background_ratio", fake_root)
    assert isinstance(bad, probes.Unknown) and not bad and "not a number" in bad.reason


def test_cpu_model_and_instance_type(fake_root):
    from ckptbench.system import probes

    assert probes.cpu_model(fake_root) == "Fake CPU 9000 @ 3.0GHz"
    assert probes.instance_type(fake_root) == "p5.48xlarge"


def test_mount_of_nfs_path_with_escaped_space(fake_root):
    from ckptbench.system import probes

    m = probes.mount_of("/mnt/nfs data/run1/step100", fake_root)
    assert isinstance(m, probes.Mount)
    assert m.mount_point == "/mnt/nfs data"
    assert m.fs_type == "nfs4"
    assert m.source == "fileserver:/export/ckpt"
    assert "rsize=1048576" in m.options.split(",") and "noatime" in m.options.split(",")
    assert m.device == "0:50"
    assert probes.read_ahead_kb(m.device, fake_root) == 15360


def test_mount_of_respects_path_boundaries(fake_root):
    from ckptbench.system import probes

    assert probes.mount_of("/mnt/nfs/x", fake_root).fs_type == "tmpfs"
    assert probes.mount_of("/mnt/nfs", fake_root).fs_type == "tmpfs"
    assert probes.mount_of("/mnt/nfsother/x", fake_root).fs_type == "ext4"  # not inside /mnt/nfs
    assert probes.mount_of("/mnt/nfs dataset", fake_root).fs_type == "ext4"  # not inside "/mnt/nfs data"


def test_read_ahead_of_a_partition_is_its_disks(fake_root):
    from ckptbench.system import probes

    m = probes.mount_of("/home/user/ckpt", fake_root)
    assert m.device == "253:1" and m.fs_type == "ext4"
    assert probes.read_ahead_kb("253:1", fake_root) == 4096


@pytest.mark.parametrize(
    "probe",
    [
        lambda p, root: p.meminfo(root),
        lambda p, root: p.sysctl("vm.dirty_ratio", root),
        lambda p, root: p.cpu_model(root),
        lambda p, root: p.instance_type(root),
        lambda p, root: p.mount_of("/data", root),
        lambda p, root: p.read_ahead_kb("8:0", root),
    ],
    ids=["meminfo", "sysctl", "cpu_model", "instance_type", "mount_of", "read_ahead_kb"],
)
def test_missing_files_give_unknown_with_a_reason(tmp_path, probe):
    from ckptbench.system import probes

    got = probe(probes, str(tmp_path))
    assert isinstance(got, probes.Unknown)
    assert not got
    assert got.reason
    assert str(got).startswith("unknown (")


def test_mount_of_with_no_matching_mount_is_unknown(tmp_path):
    from ckptbench.system import probes

    write(str(tmp_path), "proc/self/mountinfo", "40 22 0:50 / /mnt/a rw - nfs4 srv:/x rw\n")
    got = probes.mount_of("/elsewhere/ckpt", str(tmp_path))
    assert isinstance(got, probes.Unknown) and not got and "/elsewhere/ckpt" in got.reason


def test_env_snapshot_from_a_fixture_root(fake_root):
    from ckptbench.system import env

    snap = env.snapshot("/mnt/nfs data/run1", root=fake_root)
    assert snap["source_fs"] == "nfs4"
    assert snap["source_mount"] == "/mnt/nfs data"
    assert "rsize=1048576" in snap["source_mount_options"]
    assert snap["read_ahead_kb"] == 15360
    assert snap["mem_total_bytes"] == 16384 * 1024
    assert snap["vm_dirty_ratio"] == 20
    assert snap["cpu_model"] == "Fake CPU 9000 @ 3.0GHz"
    assert snap["instance_type"] == "p5.48xlarge"
    assert snap["cpu_count"] == os.cpu_count()
    assert snap["kernel"] == os.uname().release
    json.dumps(snap)  # recorded as JSON: must be serializable as it is


def test_env_snapshot_from_an_empty_root_fails_soft(tmp_path):
    from ckptbench.system import env

    snap = env.snapshot("/data/ckpt", root=str(tmp_path))
    assert snap["source_fs"].startswith("unknown (")
    assert snap["cpu_model"].startswith("unknown (")
    assert snap["vm_dirty_ratio"].startswith("unknown (")
    assert snap["source_mount"] is None and snap["read_ahead_kb"] is None
    assert json.loads(json.dumps(snap)) == snap


# --- credentials are never recorded ---

def test_credentials_in_the_environment_are_never_recorded(ckpt, tmp_path):
    results = tmp_path / "R.csv"
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="SECRETXYZ", AWS_ACCESS_KEY_ID="AKIDSECRETXYZ",
               HF_TOKEN="hf_SECRETXYZ")
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "run", ckpt, "--repeat", "1", "--json",
                           "--results", str(results)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "ok"
    assert "SECRETXYZ" not in proc.stdout and "SECRETXYZ" not in proc.stderr
    assert results.stat().st_size > 0 and "SECRETXYZ" not in results.read_text()
    jsonl = open(str(results) + ".jsonl").read()
    assert jsonl.strip() and "SECRETXYZ" not in jsonl
