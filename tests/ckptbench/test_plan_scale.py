"""`plan --nodes`: the multi-node restore arithmetic, checked against figures computed here from a preset written
here, the measured-vs-assumed choice from a results.csv written here, and the CLI's text, JSON and errors."""

from __future__ import annotations

import json
import math

import pytest
from clirun import assert_one_line_error

from ckptbench.plan import scale as plan_scale
from ckptbench.checkpoint import profiles
from ckptbench.records import results
from ckptbench.system import storage
from ckptbench.core.errors import CkptbenchError
from ckptbench.plan.shape import plan

COORD = plan_scale.COORDINATION_S
NEW_FIELDS = ("client_gbps", "aggregate_gbps", "metadata_ops_per_s", "prefixes", "part_bytes", "per_connection_gbps",
              "shared", "head_per_file")


def write_preset(tmp_path, name="test-fs", **fields) -> str:
    lines = [f'name = "{name}"', "ceiling_gbps = 2.0", "min_concurrency = 4", "small_file_bytes = 65536"]
    for k, v in fields.items():
        lines.append(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}")
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n[mount_options]\n")
    return str(path)


@pytest.fixture
def shared_fs(tmp_path):
    """A shared file system: 2 GB/s per client, 10 GB/s in all, 1,000 opens per second."""
    return write_preset(tmp_path, aggregate_gbps=10.0, metadata_ops_per_s=1000)


def test_arithmetic_on_known_numbers(shared_fs):
    prof = profiles.load("7b")
    base = plan(prof)
    total, files = base["total_bytes"], base["files"]
    doc = plan_scale.scale(prof, 3, 8, storage.load(shared_fs))
    assert doc["ranks"] == 24
    assert doc["total_bytes"] == total and doc["files"] == files
    assert doc["bytes_per_rank"] == pytest.approx(total / 24)
    assert doc["bytes_per_rank_everything"] == total
    assert doc["per_rank"]["source"] == "assumed"
    assert doc["per_rank"]["gbps"] == pytest.approx(2.0 / 8)  # the client ceiling shared by the node's ranks
    assert doc["ceilings"]["per_node_gbps"] == pytest.approx(2.0)
    assert doc["ceilings"]["nodes_gbps"] == pytest.approx(6.0)
    assert doc["ceilings"]["aggregate_gbps"] == 10.0
    assert doc["ceilings"]["requests"]["count"] == files
    assert doc["ceilings"]["requests"]["s"] == pytest.approx(files / 1000)
    assert doc["binding"] == "per_node" and doc["gbps"] == pytest.approx(6.0)
    assert doc["saturates_at_nodes"] == math.ceil(10.0 / 2.0)
    read_s = total / 6e9
    assert doc["read_s"] == pytest.approx(read_s)
    assert doc["rto_floor_s"] == pytest.approx(max(read_s, files / 1000) + COORD)
    e = doc["everything"]
    assert e["read_amplification"] == 24 and e["bytes_read"] == total * 24 and e["requests"] == files * 24
    assert e["rto_floor_s"] == pytest.approx(max(total * 24 / 6e9, files * 24 / 1000) + COORD)


def test_binding_switches_from_per_node_to_aggregate(shared_fs):
    prof = profiles.load("7b")
    preset = storage.load(shared_fs)
    total = plan(prof)["total_bytes"]
    seen = []
    for n in range(1, 11):
        doc = plan_scale.scale(prof, n, 8, preset)
        expect = "aggregate" if n * 2.0 >= 10.0 else "per_node"
        assert doc["binding"] == expect, n
        assert doc["gbps"] == pytest.approx(min(n * 2.0, 10.0))
        assert doc["read_s"] == pytest.approx(total / (min(n * 2.0, 10.0) * 1e9))
        seen.append(doc["binding"])
    assert seen.index("aggregate") == 5 - 1  # the knee: 5 nodes × 2 GB/s reach the 10 GB/s aggregate
    table = plan_scale.scale(prof, 10, 8, preset)["table"]
    assert [r["nodes"] for r in table] == [1, 2, 4, 8, 10]
    assert [r["binding"] for r in table] == ["per_node"] * 3 + ["aggregate"] * 2
    assert [r["gbps"] for r in table] == pytest.approx([2.0, 4.0, 8.0, 10.0, 10.0])
    floors = [r["rto_floor_s"] for r in table]
    assert floors[0] > floors[1] > floors[2] > floors[3] == pytest.approx(floors[4])  # no gain past the knee


def _gets(prof, part: int) -> int:
    base = plan(prof)
    w = prof.world_size
    shards = w * (math.ceil(prof.weights_bytes / w / part) + math.ceil(prof.optimizer_bytes / w / part))
    return shards + base["files"] - 2 * w


def test_s3_request_rate_binds_with_many_small_parts(tmp_path):
    prof = profiles.load("7b")
    total = plan(prof)["total_bytes"]
    part = 64 << 10
    small = storage.load(write_preset(tmp_path, "tiny-parts", client_gbps=12.5, per_prefix_get_per_s=5500,
                                                part_bytes=part))
    doc = plan_scale.scale(prof, 16, 8, small)
    gets = _gets(prof, part)
    assert doc["ceilings"]["requests"]["count"] == gets
    assert doc["binding"] == "requests"
    assert doc["requests_s"] == pytest.approx(gets / 5500)
    assert doc["rto_floor_s"] == pytest.approx(gets / 5500 + COORD)
    assert doc["gbps"] == pytest.approx(total / (gets / 5500) / 1e9)
    assert doc["saturates_at_nodes"] == 1  # one node's 12.5 GB/s already outruns 5,500 GETs of 64 KiB
    assert doc["everything"]["rto_floor_s"] == pytest.approx(gets * 128 / 5500 + COORD)
    spread = storage.load(write_preset(tmp_path, "four-prefixes", client_gbps=12.5,
                                                 per_prefix_get_per_s=5500, part_bytes=part, prefixes=4))
    assert plan_scale.scale(prof, 16, 8, spread)["requests_s"] == pytest.approx(gets / (4 * 5500))
    big = storage.load(write_preset(tmp_path, "big-parts", client_gbps=12.5, per_prefix_get_per_s=5500,
                                              part_bytes=8 << 20))
    one = plan_scale.scale(prof, 1, 8, big)
    assert one["binding"] == "per_node"  # 8 MiB parts: one node's NIC binds before the request rate
    assert one["rto_floor_s"] == pytest.approx(total / 12.5e9 + COORD)


def test_shipped_presets_load_and_keep_their_mount_options():
    names = [p.name for p in storage.load_all()]
    assert {"s3", "efs", "fsx-lustre", "local-nvme"} <= set(names)
    for p in storage.load_all():
        assert not set(NEW_FIELDS) & set(p.mount_options), p.name  # new fields sit above [mount_options]
        storage.load(p.name)
    s3 = storage.load("s3")
    assert s3.per_prefix_get_per_s == 5500 and s3.part_bytes and s3.aggregate_gbps is None
    assert storage.load("local-nvme").shared is False
    efs = storage.load("efs")
    assert efs.aggregate_gbps > efs.client_gbps and efs.metadata_ops_per_s


def test_local_disks_never_saturate():
    doc = plan_scale.scale(profiles.load("7b"), 64, 8, storage.load("local-nvme"))
    assert doc["saturates_at_nodes"] is None and doc["binding"] == "per_node"
    assert doc["gbps"] == pytest.approx(64 * storage.load("local-nvme").client_gbps)


def _row(run_id, kind, read_gbps, **extra) -> dict:
    return {"schema": results.SCHEMA, "kind": kind, "run_id": run_id, "repeat": 1, "timestamp": f"t-{run_id}",
            "source": f"/ckpt/{run_id}", "status": "ok", "cache": "cold", "read_gbps": read_gbps, "env": {}} | extra


def test_measured_per_rank_prefers_dist_then_restore(tmp_path, shared_fs):
    csv = str(tmp_path / "results.csv")
    assert plan_scale.measured_rank_read(csv) is None
    results.append(csv, [_row("hot1", "restore", 9.0, cache="hot"), _row("save1", "save", None, write_gbps=3.0)])
    assert plan_scale.measured_rank_read(csv) is None  # a page-cache read and a save say nothing of the storage
    results.append(csv, [_row("r1", "restore", 0.10), _row("r1", "restore", 0.20, repeat=2),
                         _row("r1", "restore", 0.30, repeat=3)])
    m = plan_scale.measured_rank_read(csv)
    assert m["source"] == "measured-restore" and m["run_id"] == "r1" and m["gbps"] == pytest.approx(0.20)
    results.append(csv, [_row("d1", "dist", 32.0, ranks=16), _row("d1", "dist", 48.0, ranks=16, repeat=2)])
    results.append(csv, [_row("r2", "restore", 0.5)])  # newer, but a distributed run is preferred
    results.append(csv, [_row("dhot", "dist", 640.0, ranks=16, cache="hot")])
    m = plan_scale.measured_rank_read(csv)
    assert m["source"] == "measured-dist" and m["run_id"] == "d1" and m["ranks"] == 16
    assert m["gbps"] == pytest.approx((32.0 / 16 + 48.0 / 16) / 2)
    results.append(csv, [_row("d2", "dist", 4.0, ranks=8), _row("d3", "dist", 64.0, ranks=8, status="failed")])
    m = plan_scale.measured_rank_read(csv)
    assert m["run_id"] == "d2" and m["gbps"] == pytest.approx(0.5)
    # schema 3: a distributed row's rate is its aggregate, its read_gbps left empty; an unverified run counts
    results.append(csv, [_row("d4", "dist", None, aggregate_gbps=16.0, ranks=8, status="unverified")])
    m4 = plan_scale.measured_rank_read(csv)
    assert m4["run_id"] == "d4" and m4["gbps"] == pytest.approx(2.0)
    doc = plan_scale.scale(profiles.load("7b"), 3, 8, storage.load(shared_fs), m)
    assert doc["per_rank"]["source"] == "measured-dist"
    assert doc["ceilings"]["per_node_gbps"] == pytest.approx(min(8 * 0.5, 2.0))
    assert doc["ceilings"]["per_node_capped_by"] == "client"
    slow = plan_scale.scale(profiles.load("7b"), 3, 8, storage.load(shared_fs),
                            dict(m, gbps=0.1))
    assert slow["ceilings"]["per_node_gbps"] == pytest.approx(0.8)
    assert slow["ceilings"]["per_node_capped_by"] == "ranks"
    assert slow["saturates_at_nodes"] == math.ceil(10.0 / 0.8)


@pytest.mark.parametrize("field, value, needle", [
    ("aggregate_gbps", -3, "aggregate_gbps must be a positive number"),
    ("metadata_ops_per_s", "fast", "metadata_ops_per_s must be a positive number"),
    ("prefixes", 1.5, "prefixes must be a positive whole number"),
    ("client_gbps", 0, "client_gbps must be a positive number"),
    ("shared", "no", "shared must be true or false"),
])
def test_bad_preset_field_is_one_line(h, tmp_path, field, value, needle):
    path = write_preset(tmp_path, **{field: value})
    with pytest.raises(CkptbenchError, match=needle):
        storage.load(path)
    r = h.run_cli("plan", "7b", "--nodes", "2", "--storage", path, "--results", tmp_path / "none.csv")
    assert_one_line_error(r, needle)
    assert path in r.err_lines[0]


def test_inconsistent_presets_are_refused(tmp_path):
    with pytest.raises(CkptbenchError, match="part_bytes"):
        storage.load(write_preset(tmp_path, per_prefix_get_per_s=5500))
    with pytest.raises(CkptbenchError, match="shared = false"):
        storage.load(write_preset(tmp_path, shared=False, aggregate_gbps=10.0))


def test_cli_json_is_the_scale_document(h, tmp_path, shared_fs):
    r = h.run_cli("plan", "7b", "--nodes", "6", "--ranks-per-node", "4", "--storage", shared_fs,
                  "--results", tmp_path / "none.csv", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    want = plan_scale.scale(profiles.load("7b"), 6, 4, storage.load(shared_fs))
    assert doc == json.loads(json.dumps(want))
    assert doc["ranks"] == 24 and doc["per_rank"]["gbps"] == pytest.approx(2.0 / 4)
    assert [row["nodes"] for row in doc["table"]] == [1, 2, 4, 6]


def test_cli_text_says_assumed_or_measured_and_prints_the_table(h, tmp_path, shared_fs):
    r = h.run_proc("plan", "7b", "--nodes", "6", "--storage", shared_fs, "--results", tmp_path / "none.csv")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert "ASSUMED" in r.out and "MEASURED" not in r.out
    assert "saturates at 5 nodes" in r.out
    table = lines[lines.index(next(line for line in lines if line.split()[:2] == ["nodes", "ranks"])) + 1:]
    assert [int(line.split()[0]) for line in table] == [1, 2, 4, 6]
    assert [line.split()[3] for line in table] == ["nodes", "nodes", "nodes", "aggregate"]
    # the floor is the larger of read and requests plus coordination, and the line says so (it read as a sum)
    floor = next(line for line in lines if line.startswith("RTO floor "))
    assert "(the larger of read " in floor and " s and requests " in floor, floor
    assert "binding: the nodes at " in r.out or "binding: the storage's aggregate at " in r.out, r.out
    csv = str(tmp_path / "results.csv")
    results.append(csv, [_row("d9", "dist", 8.0, ranks=16)])
    r = h.run_cli("plan", "7b", "--nodes", "6", "--storage", shared_fs, "--results", csv)
    assert r.rc == 0, r.err
    assert "MEASURED" in r.out and "d9" in r.out and "ASSUMED" not in r.out


@pytest.mark.parametrize("args, needle", [
    (["--nodes", "4"], "--storage"),
    (["--storage", "efs"], "--nodes"),
    (["--ranks-per-node", "4"], "--nodes"),
    (["--nodes", "0", "--storage", "efs"], "--nodes"),
    (["--nodes", "x", "--storage", "efs"], "--nodes"),
    (["--nodes", "2", "--ranks-per-node", "0", "--storage", "efs"], "--ranks-per-node"),
    (["--nodes", "2", "--storage", "nosuchfs"], "nosuchfs"),
    (["--nodes", "2", "--storage", "efs", "--interval", "600"], "--interval"),
])
def test_cli_bad_values_are_one_line(h, tmp_path, args, needle):
    r = h.run_cli("plan", "7b", *args, "--results", tmp_path / "none.csv")
    assert_one_line_error(r, needle)


def test_plan_without_nodes_is_unchanged(h):
    r = h.run_cli("plan", "7b", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc == json.loads(json.dumps(plan(profiles.load("7b"))))
    assert "table" not in doc and "ceilings" not in doc


def test_a_run_on_other_storage_is_not_the_presets_measured_rate(tmp_path):
    """A restore of a local ext4 checkpoint, found in ./results.csv, was the MEASURED per-rank rate of an FSx for
    Lustre plan."""
    csv = str(tmp_path / "results.csv")
    results.append(csv, [_row("local", "restore", 1.2, env={"source_fs": "ext4"})])
    lustre = storage.load("fsx-lustre")
    measured, why = plan_scale.rank_read_on(csv, lustre)
    assert measured is None and "(local, /ckpt/local) read ext4, not fsx-lustre (lustre), the storage this plan is for" in why, why
    doc = plan_scale.scale(profiles.load("7b"), 2, 8, lustre, measured, unmeasured_why=why)
    assert doc["per_rank"]["source"] == "assumed" and doc["per_rank"]["why"].endswith(": not used")
    nvme, _ = plan_scale.rank_read_on(csv, storage.load("local-nvme"))  # the storage it was measured on
    assert nvme["source"] == "measured-restore" and nvme["gbps"] == pytest.approx(1.2)
    results.append(csv, [_row("fsx", "restore", 0.8, env={"source_fs": "lustre"})])
    older = plan_scale.rank_read_on(csv, lustre)[0]
    assert older["run_id"] == "fsx"
    s3, _ = plan_scale.rank_read_on(csv, storage.load("s3"))
    assert s3 is None
    results.append(csv, [_row("obj", "restore", 0.3, source="s3://bucket/ckpt")])
    assert plan_scale.rank_read_on(csv, storage.load("s3"))[0]["run_id"] == "obj"
