"""A new user's distributed runs, with real gloo ranks on this machine: `run --distributed` says its floor and where it
went on record as a single-process run does; `sweep --distributed --results` records its knee and gives an
efficiency (or says why not); Ctrl-C keeps the finished repeats, says so in one line and lets every rank go."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from ckptbench.cli.show import clean, floor_line
from ckptbench.records.results import read_documents

ENV = dict(OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def torch2(tmp_path_factory, h):
    """ckptbench's own torch layout written for 2 ranks (model_rank000.pt, optim_rank001.pt, ...)."""
    d = tmp_path_factory.mktemp("torch2") / "ckpt"
    r = h.run_cli("gen", "small", str(d), "--format", "torch", "--ranks", "2", "--scale", h.SCALE)
    assert r.rc == 0, r.err
    return d


def _torchrun(*args) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ckptbench",
            *map(str, args)]


def _run(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(_torchrun(*args), capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **ENV))


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_distributed_run_says_its_floor_and_where_it_went_on_record(torch2, plant_floor, tmp_path):
    plant_floor(4.0, source=torch2, storage_gbps=4.0)  # a floor with what it reads from: an efficiency to say
    res = tmp_path / "r.csv"
    p = _run("run", torch2, "--distributed", "--repeat", "1", "--results", res)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = [d for d in read_documents(str(res), "run") if d.get("kind") == "dist"][-1]
    assert doc["efficiency"] is not None
    lines = p.stdout.splitlines()
    # the single-process run's own lines (cli/show.py), made from the document that was recorded
    assert clean(floor_line(doc)) in lines, p.stdout
    assert "% of it" in clean(floor_line(doc))
    assert any(ln.startswith(f"recorded: run {doc['run_id']} in {res} ") for ln in lines), p.stdout


def test_a_distributed_sweep_records_its_knee_and_its_efficiency(torch2, plant_floor, tmp_path):
    from ckptbench.restore.sweep import recorded_knee

    plant_floor(4.0)  # from the page cache the floor needs no storage figure
    res = tmp_path / "s.csv"
    p = _run("sweep", torch2, "--distributed", "--levels", "1,4", "--repeat", "1", "--cache", "hot", "--json",
             "--results", res)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    by_level = doc["efficiency_by_level"]
    assert all(e is not None for e in by_level.values())
    # the sweep's efficiency: its fastest level's, the floor over that level's median RTO
    fastest = min(doc["rto_s"], key=lambda lv: doc["rto_s"][lv]["median"])
    assert doc["efficiency"] == pytest.approx(doc["floor_s"] / doc["rto_s"][fastest]["median"])
    assert doc["efficiency"] == pytest.approx(max(by_level.values()))
    assert f"concurrency {fastest}'s, the fastest level" in doc["floor_note"]
    # on record as a single-process sweep's knee: what `check --results` advises from
    knee = recorded_knee(str(res), str(torch2))
    assert knee is not None and knee.knee == doc["knee"] and knee.best == doc["best"]
    assert knee.gbps == {int(lv): st["median"] for lv, st in doc["aggregate_gbps"].items()}
    assert "2-rank distributed sweep" in knee.basis


def _floor_of(torch2, gbps: float | None, cache_residency: float, plant) -> dict:
    """driver._sweep_floor over made-up levels (RTO 0.5 s at 1, 0.25 s at 4) of this checkpoint."""
    from ckptbench.distributed.driver import _sweep_floor
    from ckptbench.sources import open_source

    if gbps is not None:
        plant(gbps)
    source = open_source(str(torch2))
    listing = source.list()
    rep = {"bytes_read": listing.bytes, "ranks": [{"host": "a"}, {"host": "a"}],
           "cache": {"residency_before": cache_residency}}
    return _sweep_floor(source, listing, SimpleNamespace(hash=None), {1: [rep], 4: [rep]},
                        {"1": {"median": 0.5}, "4": {"median": 0.25}})


def test_a_sweep_efficiency_is_the_fastest_levels_and_none_only_with_a_reason(torch2, plant_floor):
    hot = _floor_of(torch2, 4.0, 1.0, plant_floor)
    assert hot["efficiency"] == pytest.approx(hot["floor_s"] / 0.25)
    assert hot["efficiency_by_level"] == {"1": pytest.approx(hot["floor_s"] / 0.5),
                                          "4": pytest.approx(hot["floor_s"] / 0.25)}
    # cold with no storage figure: the floor is memory and CPU only, and no level is held to it, as a run is not
    cold = _floor_of(torch2, 4.0, 0.0, plant_floor)
    assert cold["efficiency"] is None and set(cold["efficiency_by_level"].values()) == {None}
    assert "no efficiency is given" in cold["floor_note"]


def test_no_floor_at_all_says_why_rather_than_null(torch2, plant_floor):
    out = _floor_of(torch2, None, 1.0, plant_floor)  # this test's own cache holds no floor
    assert out["efficiency"] is None and out["floor_note"]


def test_an_interrupt_torch_swallows_inside_its_loader_is_still_heard():
    """torch turns a KeyboardInterrupt raised in a file's read into an AttributeError, which a format's loader then
    calls a corrupt shard; the rank hears it anyway and stops as interrupted."""
    from ckptbench.core.interrupt import Heard

    buf = io.BytesIO()
    torch.save({"w": torch.randn(64)}, buf)
    data = buf.getvalue()

    class Interrupting(io.RawIOBase):
        calls = 0

        def __init__(self):
            super().__init__()
            self.inner = io.BytesIO(data)

        def readable(self):
            return True

        def seekable(self):
            return True

        def seek(self, *a):
            return self.inner.seek(*a)

        def tell(self):
            return self.inner.tell()

        def readinto(self, b):
            Interrupting.calls += 1
            if Interrupting.calls == 3:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, arriving while torch reads
            return self.inner.readinto(b)

    before = signal.getsignal(signal.SIGINT)
    with Heard() as heard:
        try:
            torch.load(Interrupting(), weights_only=True)
        except (AttributeError, RuntimeError, KeyboardInterrupt):
            pass
        with pytest.raises(KeyboardInterrupt):
            heard.raise_if_heard()
    assert signal.getsignal(signal.SIGINT) is before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def _wait_for_repeats(env: dict[str, str], n: int, alive, deadline_s: float = 90) -> None:
    """Until rank 0 has given its verdict on repeat `n`, read from the ranks' own store (the keys driver.py and
    group.py post: ckptbench/<run id>-<restart>/run/<repeat>/verdict)."""
    store = torch.distributed.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                                       timeout=timedelta(seconds=30))
    run = env.get("TORCHELASTIC_RUN_ID", "none") + "-" + env.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"ckptbench/{run}/run/{n}/verdict"
    end = time.monotonic() + deadline_s
    while not store.check([key]):
        assert alive() and time.monotonic() < end, "the ranks never got that far"
        time.sleep(0.05)


def _assert_kept(res, err: str) -> dict:
    """Rank 0's one line, the finished repeats on record and the one under way as cancelled; returns the doc."""
    said = [ln for ln in err.splitlines() if ln.startswith("ckptbench: interrupted")]
    assert len(said) == 1, err[-3000:]
    m = re.search(r"(?:during|after) repeat \d+ of 1000: (\d+) repeat\(s\) finished, recorded in (\S+) as run (\w+)",
                  said[0])
    assert m, said[0]
    finished = int(m.group(1))
    assert m.group(2) == str(res) and finished >= 2
    doc = [d for d in read_documents(str(res), "run") if d.get("run_id") == m.group(3)][-1]
    under = doc["interrupted"]["repeat"]  # None: stopped between two repeats
    assert doc["status"] == "cancelled" and len(doc["repeats"]) == finished
    assert doc["interrupted"] == {"repeat": under, "repeats": 1000, "finished": finished}
    assert doc["rto_stats"]["n"] == finished
    rows = [r for r in _rows(res) if r["run_id"] == m.group(3)]
    assert [r["status"] for r in rows] == ["ok"] * finished + (["cancelled"] if under else [])
    assert [int(r["repeat"]) for r in rows] == list(range(1, finished + 1 + bool(under)))
    assert not re.search(r'File "[^"]*ckptbench/', err), err[-3000:]  # no traceback of ours
    return doc


def test_ctrl_c_on_every_rank_keeps_the_finished_repeats_and_exits_130(torch2, tmp_path):
    """Two ranks started as srun starts them (rank 0 hosts the store), both sent SIGINT as torchrun forwards a
    Ctrl-C: rank 0 records and exits 130, rank 1 exits 0 once rank 0 has recorded, both promptly."""
    res = tmp_path / "r.csv"
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, **ENV, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "ckptbench", "run", str(torch2), "--distributed",
                                       "--repeat", "1000", "--results", str(res), "--rank-timeout", "120"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    try:
        _wait_for_repeats(_environ(procs[0].pid), 3, lambda: all(p.poll() is None for p in procs))
        for p in procs:
            p.send_signal(signal.SIGINT)
        t = time.monotonic()
        outs = [p.communicate(timeout=60) for p in procs]
        took = time.monotonic() - t
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    (out0, err0), (out1, err1) = outs
    assert procs[0].returncode == 130, err0[-3000:]
    assert procs[1].returncode == 0 and err1.strip() == "", err1[-3000:]
    assert took < 20  # no rank waited for a deadline
    assert out0 == ""  # nothing on stdout, as a single-process run prints nothing there when interrupted
    _assert_kept(res, err0)


def test_ctrl_c_under_torchrun_keeps_the_finished_repeats(torch2, tmp_path):
    """The user's way: Ctrl-C reaches torchrun, which hands SIGINT to every rank."""
    res = tmp_path / "r.csv"
    proc = subprocess.Popen(_torchrun("run", torch2, "--distributed", "--repeat", "1000", "--results", res),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **ENV))
    try:
        rank0 = None
        end = time.monotonic() + 60
        while rank0 is None and time.monotonic() < end and proc.poll() is None:
            rank0 = next((pid for pid in _children(proc.pid) if _environ(pid).get("RANK") == "0"), None)
            time.sleep(0.05)
        assert rank0, "torchrun's rank 0 not found"
        workers = _children(proc.pid)
        _wait_for_repeats(_environ(rank0), 3, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGINT)
        t = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 25  # under torchrun's own 30 s before it kills what is left
    assert not any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in workers)
    _assert_kept(res, err)


def _children(parent: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        out.append(int(pid))
            except (OSError, ValueError, IndexError):
                continue
    return out


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_an_interrupt_outside_the_repeats_is_said_by_rank_0_alone(rank, monkeypatch, capsys, tmp_path):
    """Ctrl-C under torchrun reaches every rank; one that is not rank 0 and is interrupted where the driver keeps no
    repeats (joining the group, leaving it) exits as interrupted without a line of its own: rank 0 says it for the
    run (fresh-clone CI once had rank 1's bare 'ckptbench: interrupted' beside rank 0's one line)."""
    from ckptbench.cli import root
    from ckptbench.distributed import driver

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "run", interrupted)
    monkeypatch.setenv("RANK", rank)
    assert root.main(["run", str(tmp_path), "--distributed", "--results", ""]) == 130
    said = [ln for ln in capsys.readouterr().err.splitlines() if "interrupted" in ln]
    assert said == (["ckptbench: interrupted"] if rank == "0" else [])
