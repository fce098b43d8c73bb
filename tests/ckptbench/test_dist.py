"""Distributed restore under torchrun, with real gloo ranks on this machine: a 2-rank checkpoint on 2 ranks, DCP
saved by 4 ranks restored on 2 and 1 and by 2 restored on 4 (every rank's tensors compared with what was saved,
through the crc32c each rank reports of its rows), read amplification, and a rank whose file is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import crc32c
import pytest
import torch

from ckptbench.distributed import group


_WRITER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def main(rank, world, out, port):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        g = torch.Generator().manual_seed(5)
        # uneven rows (10 and 3 over 4 ranks) so torch.chunk leaves short and empty shards
        full = {"model.w": torch.randn(10, 6, generator=g), "model.v": torch.randn(3, 9, generator=g).bfloat16(),
                "model.r": torch.randn(7, generator=g),
                "optimizer.state.w.exp_avg": torch.randn(10, 6, generator=g)}
        place = {"model.w": [Shard(0)], "model.v": [Shard(1)], "model.r": [Replicate()],
                 "optimizer.state.w.exp_avg": [Shard(0)]}
        sd = {k: distribute_tensor(t, mesh, place[k]) for k, t in full.items()}
        dcp.save(sd, checkpoint_id=out)
        if rank == 0:
            torch.save(full, out + "-reference.pt")
        dist.destroy_process_group()

    if __name__ == "__main__":
        import torch.multiprocessing as mp
        world = int(sys.argv[3])
        # fork: the writers inherit this interpreter's torch instead of importing it again, 4 times over
        mp.start_processes(main, args=(world, sys.argv[1], int(sys.argv[2])), nprocs=world, start_method="fork")
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dcp_by(tmp_path_factory, world: int):
    root = tmp_path_factory.mktemp(f"dcp{world}")
    script = root / "writer.py"
    script.write_text(_WRITER)
    d = root / "ckpt"
    proc = subprocess.run([sys.executable, str(script), str(d), str(_free_port()), str(world)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return d, torch.load(str(d) + "-reference.pt", weights_only=True)


@pytest.fixture(scope="module")
def dcp4(tmp_path_factory):
    return _dcp_by(tmp_path_factory, 4)


@pytest.fixture(scope="module")
def dcp2(tmp_path_factory):
    return _dcp_by(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def torch2(tmp_path_factory, h):
    """ckptbench's own torch layout written for 2 ranks (model_rank000.pt, optim_rank001.pt, ...)."""
    d = tmp_path_factory.mktemp("torch2") / "ckpt"
    r = h.run_cli("gen", "small", str(d), "--format", "torch", "--ranks", "2", "--scale", h.SCALE)
    assert r.rc == 0, r.err
    return d


def torchrun(n: int, *args, timeout: float = 240):
    """`torchrun --nproc-per-node n -m ckptbench run ... --distributed`; (rc, stdout, stderr, seconds)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", "ckptbench", "run", *map(str, args), "--distributed", "--repeat", "1", "--results", "",
           "--json"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t


def _doc(n: int, *args) -> dict:
    rc, out, err, _ = torchrun(n, *args)
    assert rc == 0, err[-3000:]
    return json.loads(out)


def _crc(t: torch.Tensor) -> str:
    return f"{crc32c.crc32c(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()):08x}"


def _rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """torch.chunk's split, computed here from torch itself rather than from the code under test."""
    sizes = [len(c) for c in torch.arange(n).chunk(world)] if n else []
    sizes += [0] * (world - len(sizes))
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def _assert_rows_match(doc: dict, full: dict[str, torch.Tensor]) -> None:
    """Every rank holds exactly torch.chunk's rows of every tensor, value for value (by crc32c)."""
    world = doc["world_size"]
    ranks = doc["repeats"][0]["ranks"]
    assert len(ranks) == world
    for r in ranks:
        assert r["status"] == "ok", r["error"]
        got = r["digests"]
        for key, t in full.items():
            name = key.removeprefix("model.")
            lo, hi = _rows(t.shape[0], world, r["rank"])
            assert name in got, (r["rank"], name, sorted(got))
            assert got[name] == _crc(t[lo:hi]), (r["rank"], name, lo, hi)


@pytest.mark.parametrize("world", [2, 1])
def test_dcp_saved_by_4_ranks_restores_on_fewer(dcp4, world):
    d, full = dcp4
    doc = _doc(world, d, "--tensor-digests")
    # a DCP save has no ckptbench manifest: nothing to match, so finished but unverified, in the rows' words
    assert doc["status"] == "unverified" and not doc["verified"] and doc["saved_world"] == 4 and doc["resharded"]
    _assert_rows_match(doc, full)
    payload = sum(t.numel() * t.element_size() for t in full.values())
    rep = doc["repeats"][0]
    # each byte of each tensor read once, by the rank that needs it
    assert rep["unique_bytes"] == payload and rep["bytes_read"] == payload
    assert doc["amplification"] == pytest.approx(1.0)
    if world == 2:  # torch's reader reads a stored chunk whole per request: Shard(1) chunks span both halves
        assert doc["dcp_reader"]["bytes"] > payload


def test_dcp_saved_by_2_ranks_restores_on_4(dcp2):
    d, full = dcp2
    doc = _doc(4, d, "--tensor-digests")
    assert doc["status"] == "unverified" and not doc["verified"] and doc["saved_world"] == 2
    _assert_rows_match(doc, full)
    assert doc["amplification"] == pytest.approx(1.0)
    # on 4 ranks each saved half is needed by two ranks: torch's reader would read each half twice
    assert doc["dcp_reader"]["amplification"] > 1.5
    rep = doc["repeats"][0]
    # per rank: ours reads what the share needs; torch's reader reads whole halves for a quarter of the rows
    assert all(r["amplification"] == 1.0 for r in rep["ranks"])
    assert all(r["dcp_reader_amplification"] > 1.5 for r in rep["ranks"])
    assert rep["read_plan"]["backward_seeks"] == 0  # each rank's requests go front to back through each file
    assert rep["read_plan"]["requests"] == sum(r["requests"] for r in rep["ranks"])
    assert all(r["warmup_s"] > 0 for r in rep["ranks"])  # paid before the barrier, reported apart
    slow = doc["repeats"][0]["slowest_rank"]
    assert 0 <= slow < 4 and doc["repeats"][0]["rto_s"] == max(r["end_s"] for r in doc["repeats"][0]["ranks"])


def test_two_rank_checkpoint_on_two_ranks_reads_each_file_once(torch2, plant_floor):
    man = json.loads((torch2 / "ckptbench.json").read_text())
    plant_floor(4.0, source=torch2, storage_gbps=4.0)  # a cold run's floor needs what it reads from
    doc = _doc(2, torch2, "--cache", "cold")
    assert doc["status"] == "ok" and doc["saved_world"] == 2 and not doc["resharded"]
    assert doc["cache"]["requested"] == "cold" and doc["cache"]["verified"]  # evicted by the node, and measured
    assert doc["cache"]["residency_before"] <= 0.05
    rep = doc["repeats"][0]
    on_disk = sum(p.stat().st_size for p in torch2.rglob("*") if p.is_file())
    assert rep["bytes_read"] == rep["unique_bytes"] == on_disk
    assert doc["amplification"] == 1.0
    manifest_size = (torch2 / "ckptbench.json").stat().st_size
    for r in rep["ranks"]:  # each rank read the files the manifest gives its rank (rank 0 also the shared ones)
        own = sum(e["bytes"] for e in man["files"] if e["rank"] == r["rank"] or (e["rank"] is None and r["rank"] == 0))
        assert r["bytes_read"] == own + (manifest_size if r["rank"] == 0 else 0)
        assert r["verified"] and "matched the manifest" in r["notes"]["verify"]
    assert rep["aggregate_gbps"] > 0 and rep["skew_s"] >= 0
    # held against this box's floor (planted: each resource at 4 GB/s), the node's bytes over the slowest rank's RTO
    assert doc["binding"] in doc["floor_times_s"] and doc["floor_s"] == max(doc["floor_times_s"].values())
    assert doc["floor_gbps"] == pytest.approx(rep["bytes_read"] / doc["floor_s"] / 1e9)
    assert doc["efficiency"] == pytest.approx(doc["floor_s"] / doc["rto_stats"]["median"])


def test_every_rank_reading_everything_is_amplified(torch2):
    doc = _doc(2, torch2, "--each-rank", "all")
    rep = doc["repeats"][0]
    assert doc["status"] == "ok"
    assert rep["bytes_read"] == 2 * rep["unique_bytes"]
    assert doc["amplification"] == pytest.approx(2.0)


def test_a_rank_whose_file_is_missing_fails_the_run_naming_it(torch2, tmp_path):
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(torch2, d)
    os.remove(d / "optim_rank001.pt")
    rc, out, err, took = torchrun(2, d, "--rank-timeout", "60")
    assert rc != 0
    doc = json.loads(out)
    assert doc["status"] == "failed"
    assert any(p.startswith("rank 1 ") and "optim_rank001.pt" in p for p in doc["problems"]), doc["problems"]
    assert not any(p.startswith("rank 0 ") for p in doc["problems"])
    assert took < 60  # failed on the error, not on a deadline


def test_outside_torchrun_the_flag_says_how_to_start_it(torch2):
    from clirun import run_cli

    assert "RANK" not in os.environ
    r = run_cli("run", str(torch2), "--distributed")
    assert r.rc != 0 and "torchrun --nproc-per-node" in r.err and "Traceback" not in r.err
    assert len(r.err_lines) == 1


def test_a_rank_with_nothing_at_the_rendezvous_says_so_in_one_line_by_its_deadline(torch2):
    """Rank 1 started alone, nobody at MASTER_PORT: torch waited the whole timeout, retried another, then printed
    C++ log lines and stack traces; the rank's own deadline now ends it with one line."""
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ckptbench", "run", str(torch2), "--distributed", "--rank-timeout", "3"],
                       capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t0
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert "rank 1: nothing listens at the rendezvous 127.0.0.1:" in lines[0] and "after 3 s" in lines[0]
    assert took < 60  # the rank's deadline, not torch's own


def test_torchs_log_lines_are_held_while_the_group_forms_and_written_after_a_success(capfd):
    with group._torch_log_held():
        os.write(2, b"[W c10d] a warning worth keeping\n")
    assert capfd.readouterr().err == "[W c10d] a warning worth keeping\n"
    with pytest.raises(RuntimeError), group._torch_log_held():
        os.write(2, b"[E c10d] connect failed\nframe #0: ...\n")
        raise RuntimeError("the rendezvous failed: our line says so")
    assert capfd.readouterr().err == ""
    os.write(2, b"after\n")  # the descriptor is stderr again
    assert capfd.readouterr().err == "after\n"


def _child_with_rank(parent: int, rank: int) -> int | None:
    """The torchrun worker (a child of `parent`) started with RANK=rank, from /proc."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def _running(pid):
    """Whether pid is alive and not a zombie. torchrun can reap it between any two looks, so a /proc entry
    that vanishes while being read means it has ended (CI once failed on exactly that race)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_a_rank_that_hangs_is_named_when_its_deadline_passes(torch2):
    """Rank 1 is stopped (SIGSTOP) as soon as it starts: it never answers. Rank 0 must say so, naming rank 1,
    once --rank-timeout passes, and exit; the stopped rank is killed afterwards, as torchrun does after its
    grace period."""
    import signal

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ckptbench",
           "run", str(torch2), "--distributed", "--repeat", "1", "--results", "", "--rank-timeout", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 30
        r1 = r0 = None
        while (r1 is None or r0 is None) and time.monotonic() < deadline:
            r1 = r1 or _child_with_rank(proc.pid, 1)
            r0 = r0 or _child_with_rank(proc.pid, 0)
            if r1:
                os.kill(r1, signal.SIGSTOP)
            time.sleep(0.01)
        assert r1 and r0, "torchrun's workers not found"
        stopped = time.monotonic()
        while _running(r0) and time.monotonic() < stopped + 60:
            time.sleep(0.05)
        took = time.monotonic() - stopped
        os.kill(r1, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 4 * 2 + 15  # its deadlines, not forever
    assert proc.returncode != 0
    assert "rank(s) 1 did not reach" in err, err[-3000:]


def test_a_distributed_sweep_gives_the_aggregate_rate_per_level_and_its_knee(torch2, plant_floor):
    plant_floor(4.0)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ckptbench",
           "sweep", str(torch2), "--distributed", "--levels", "1,4", "--repeat", "2", "--cache", "hot", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["status"] == "ok" and doc["world_size"] == 2 and doc["levels"] == [1, 4]
    medians = {int(lv): st["median"] for lv, st in doc["aggregate_gbps"].items()}
    assert all(g > 0 for g in medians.values()) and all(st["n"] == 2 for st in doc["aggregate_gbps"].values())
    best = max(medians, key=medians.get)
    assert doc["best"] == best
    # the knee: the smallest level within 10 % of the best, computed here from the figures themselves
    assert doc["knee"] == min(lv for lv, g in medians.items() if g >= 0.9 * medians[best])
    # each level against the floor (planted at 4 GB/s): the floor over the level's median RTO
    # from the page cache every part is the cores' work: the parts add up
    assert doc["binding"] in ("page cache", "fresh memory")
    assert doc["floor_s"] == pytest.approx(sum(doc["floor_times_s"].values()))
    for lv, eff in doc["efficiency_by_level"].items():
        assert eff == pytest.approx(doc["floor_s"] / doc["rto_s"][lv]["median"])


def test_a_trainer_checkpoint_in_safetensors_splits_rows_and_loads_its_state_once(tmp_path):
    """A Hugging Face Trainer directory nobody here wrote: each rank holds torch.chunk's rows of every weight,
    read by byte range; the Trainer's optimizer.pt is read and loaded by rank 0 alone."""
    from safetensors.torch import save_file

    d = tmp_path / "checkpoint-10"
    d.mkdir()
    g = torch.Generator().manual_seed(9)
    a = {"embed.weight": torch.randn(33, 16, generator=g).bfloat16(), "norm.weight": torch.randn(16, generator=g)}
    b = {"lm_head.weight": torch.randn(7, 16, generator=g)}
    save_file(a, str(d / "model-00001-of-00002.safetensors"))
    save_file(b, str(d / "model-00002-of-00002.safetensors"))
    exp_avg = torch.randn(5, generator=g)
    torch.save({"state": {0: {"exp_avg": exp_avg}}, "param_groups": [{"lr": 0.1, "params": [0]}]}, d / "optimizer.pt")
    (d / "trainer_state.json").write_text("{}")
    doc = _doc(2, d, "--tensor-digests")
    assert doc["status"] == "unverified" and not doc["verified"]  # a Trainer directory has no manifest to match
    _assert_rows_match(doc, {**a, **b})
    ranks = doc["repeats"][0]["ranks"]
    held = [r["rank"] for r in ranks if "optimizer.state.0.exp_avg" in r["digests"]]
    assert held == [0] and ranks[0]["digests"]["optimizer.state.0.exp_avg"] == _crc(exp_avg)
    assert doc["amplification"] == pytest.approx(1.0)


def test_torchs_log_lines_are_not_held_where_there_is_no_stderr():
    script = ("import os, sys\nfrom ckptbench.distributed import group\nos.close(2)\n"
              "with group._torch_log_held():\n    x = 1\nsys.stdout.write('ok')\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "ok", p.stderr
