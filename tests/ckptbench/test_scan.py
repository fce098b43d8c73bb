"""The structural check's scan: native counts per tensor, and the part done during a fused read on files the
read had already finished, recognised in the loaded state by where the bytes are."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from safetensors.torch import save_file

import fastio
from ckptbench.restore import scan
from ckptbench.checkpoint.formats import CheckpointState, safetensors_format
from ckptbench.restore.load import structural_check


def _shards(d, bad: str | None = None) -> dict[str, torch.Tensor]:
    """Two foreign shards (no manifest) of bf16 and f32 tensors; `bad` gets a NaN and an Inf."""
    g = torch.Generator().manual_seed(5)
    tensors = {"a.w": torch.randn(256, 64, generator=g).bfloat16(), "a.b": torch.randn(64, generator=g),
               "b.w": torch.randn(128, 128, generator=g).half(), "b.i": torch.arange(10)}
    if bad:
        tensors[bad].view(-1)[3] = float("nan")
        tensors[bad].view(-1)[-1] = float("inf")
    save_file({k: tensors[k] for k in ("a.w", "a.b")}, os.path.join(d, "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in ("b.w", "b.i")}, os.path.join(d, "model-00002-of-00002.safetensors"))
    return tensors


def test_counts_match_torch_and_name_the_tensor(tmp_path):
    tensors = _shards(str(tmp_path), bad="b.w")
    floating, nbytes, bad, early = scan.nonfinite(tensors.items(), concurrency=2)
    assert floating == 3 and early == 0
    assert nbytes == sum(t.numel() * t.element_size() for k, t in tensors.items() if k != "b.i")
    assert bad == {"b.w": int((~torch.isfinite(tensors["b.w"])).sum())} == {"b.w": 2}


def test_regions_scanned_during_the_read_are_not_scanned_again(tmp_path):
    """A file the read finished while another was still held is scanned early; the check then finds its tensors
    by address in the state loaded over the same buffers, and counts a NaN in them (the early count, not a
    rescan: the scan's record is altered here to prove which one is used)."""
    _shards(str(tmp_path), bad="a.w")
    paths = sorted(str(p) for p in tmp_path.iterdir())
    h = fastio.start(paths, concurrency=1, read="pread", hash="none", into_memory=True,
                     _faults={paths[1]: "hold"})
    early = scan.EarlyScan(paths)
    try:
        deadline = time.monotonic() + 30
        while h.completed() != [0] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert h.completed() == [0]
        early.poll(h)
    finally:
        h._release()
    res = h.wait()
    early.poll(h)  # the second file too, now that it is complete
    assert early.files == 2 and len(early.counts) == 3  # a.w, a.b, b.w; the int tensor is not scanned
    state = CheckpointState({})
    for p, buf in zip(paths, res.buffers):
        state.merge(safetensors_format.load_buffer(buf, p))
    report = structural_check(state, 2, early.counts)
    assert not report.ok and report.problems == ("a.w: 2 non-finite value(s) in weights",)
    assert "3 of them during the read" in report.summary
    key = (state.model["a.w"].data_ptr(), state.model["a.w"].numel() * 2)
    early.counts[key] = 0  # the check trusts what the early scan recorded for that region
    assert structural_check(state, 2, early.counts).ok
    assert not structural_check(state, 2, None).ok  # and without it, scans the bytes itself


def test_a_foreign_checkpoint_run_reports_the_scan_and_a_nan_fails_it(h, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    _shards(str(good))
    _shards(str(bad), bad="b.w")
    for mode in ("fused", "staged"):
        r = h.run_cli("run", good, "--repeat", "1", "--json", "--mode", mode, "--results", tmp_path / "r.csv")
        doc = json.loads(r.out)
        assert r.rc == 0 and doc["status"] == "unverified" and doc["check"] == "structural", r.err
        assert "3 floating tensors" in doc["notes"]["check"] and "none found" in doc["notes"]["check"]
        r = h.run_cli("run", bad, "--repeat", "1", "--json", "--mode", mode, "--results", tmp_path / "r.csv")
        doc = json.loads(r.out)
        assert r.rc != 0 and doc["status"] == "failed"
        assert doc["repeats"][0]["problems"] == ["b.w: 2 non-finite value(s) in weights"]


def test_inf_in_bookkeeping_scalars_is_normal_and_named_but_fails_in_weights_and_moments():
    """Lightning's ModelCheckpoint saves kth_value = inf, a loss scaler its inf sentinel: not corruption. The same
    inf in a weight or an optimizer moment is."""
    from ckptbench.restore.load import structural_check

    state = CheckpointState({"w": torch.ones(4)}, extra={
        "callbacks.ModelCheckpoint{'monitor': None}.kth_value": torch.tensor(float("inf")),
        "callbacks.ModelCheckpoint{'monitor': None}.best_model_score": torch.tensor(float("-inf")),
        "optimizer.state.0.exp_avg": torch.zeros(4), "optimizer.loss_scaler.cur_scale": torch.tensor(float("inf"))})
    report = structural_check(state, 1)
    assert report.ok, report.problems
    assert "3 bookkeeping value(s) hold NaN/Inf on purpose" in report.summary and "kth_value" not in str(
        report.problems)
    state.extra["optimizer.state.0.exp_avg"][1] = float("nan")
    report = structural_check(state, 1)
    assert report.problems == ("optimizer.state.0.exp_avg: 1 non-finite value(s) in optimizer moments",)
    state.extra["optimizer.state.0.exp_avg"][1] = 0.0
    state.model["w"][0] = float("inf")
    assert structural_check(state, 1).problems == ("w: 1 non-finite value(s) in weights",)


def _large_shards(d, bad: str | None = None) -> dict[str, torch.Tensor]:
    """Shards over LANDING_MIN (the engine counts them as they land): bf16 and f32 tensors, an int one."""
    g = torch.Generator().manual_seed(7)
    tensors = {"a.w": torch.randn(1024, 700, generator=g).bfloat16(), "a.b": torch.randn(333, generator=g),
               "b.w": torch.randn(600, 600, generator=g), "b.i": torch.arange(10)}
    if bad:
        tensors[bad].view(-1)[12345] = float("nan")
        tensors[bad].view(-1)[-1] = float("-inf")
    save_file({k: tensors[k] for k in ("a.w", "a.b")}, os.path.join(d, "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in ("b.w", "b.i")}, os.path.join(d, "model-00002-of-00002.safetensors"))
    return tensors


def test_landing_regions_are_each_floating_tensors_bytes_in_the_file(tmp_path):
    tensors = _large_shards(str(tmp_path))
    (tmp_path / "small.safetensors").write_bytes(b"x" * 100)  # under LANDING_MIN: scanned once landed
    (tmp_path / "broken.safetensors").write_bytes(b"\xff" * (2 << 20))  # no header: its load says so
    paths = sorted(str(p) for p in tmp_path.iterdir())
    regions = scan.landing_regions([(p, os.path.getsize(p)) for p in paths])
    assert sorted(regions) == [paths.index(p) for p in paths if "model-" in p]
    first = paths.index(next(p for p in paths if p.endswith("00001-of-00002.safetensors")))
    with open(paths[first], "rb") as f:
        data = f.read()
    for off, n, kind in regions[first]:  # each region is one tensor's bytes, found by its own bytes
        name = next(k for k in ("a.w", "a.b") if tensors[k].numel() * tensors[k].element_size() == n)
        assert data[off:off + n] == tensors[name].contiguous().view(torch.uint8).numpy().tobytes()
        assert kind == scan.kind_of(tensors[name].dtype)
    assert len(regions[first]) == 2 and len(regions[paths.index(paths[first].replace("00001-", "00002-"))]) == 1


def test_a_fused_run_counts_nans_as_the_blocks_land_and_scans_nothing_after(tmp_path, monkeypatch):
    """Large local shards: the read engine's counts are the check's; the scan after the read and the early scan of
    finished files are made to fail here, and the NaN is found all the same."""
    from ckptbench.restore import runner
    from ckptbench.restore.warmup import warm_up

    warm_up()  # the process's one-time warm-up restores (and scans) a tiny checkpoint of its own: before the patches
    _large_shards(str(tmp_path), bad="b.w")
    unseen = []  # files the early scan would have scanned (it runs on a thread of its own: recorded, not raised)
    monkeypatch.setattr(scan.EarlyScan, "poll", lambda self, h: unseen.extend(set(h.completed()) - self.seen))

    def no_scan_after(items, concurrency=None):
        assert not list(items), "a tensor was scanned after the read"
        return []

    monkeypatch.setattr(scan.fastio, "count_nonfinite", no_scan_after)
    for read in ("pread", "direct"):
        rep = runner.run(str(tmp_path), runner.RunOptions.make(cache="hot", read=read), repeats=1)[0]
        assert rep.status == "failed" and rep.problems == ["b.w: 2 non-finite value(s) in weights"]
        assert "3 of them during the read" in rep.notes["check"]
    assert unseen == []
    monkeypatch.setattr(scan, "LANDING_MIN", 1 << 40)  # nothing counted as it lands: the early scan's, or the check's
    with pytest.raises(AssertionError, match="scanned after the read|early"):
        runner.run(str(tmp_path), runner.RunOptions.make(cache="hot"), repeats=1)
        assert unseen == [], "early"


def test_a_file_rewritten_between_its_header_read_and_its_read_keeps_no_landed_counts(tmp_path):
    """Counts of regions parsed from one header are not another file's tensors: the same sizes, another dtype."""
    _large_shards(str(tmp_path), bad="a.w")
    paths = sorted(str(p) for p in tmp_path.iterdir())
    regions = scan.landing_regions([(p, os.path.getsize(p)) for p in paths])
    first = paths[0]
    data = open(first, "rb").read()
    assert b'"BF16"' in data
    with open(first, "r+b") as f:  # a.w now F16: the same bytes, another kind (and another NaN count)
        f.write(data.replace(b'"BF16"', b'"F16" ', 1)[:len(data)])
    h = fastio.start(paths, read="pread", hash="none", into_memory=True, scan=regions)
    h.wait()
    got = scan.landed_counts(h, regions)
    assert h.scan_counts(0) is not None and len(got) == len(regions[1])  # the second file's alone
    buf = h.buffer(1)
    assert all(scan._address(buf) <= addr < scan._address(buf) + buf.nbytes for addr, _ in got)


def test_the_summary_names_only_what_was_there_and_nothing_when_nothing_was_scanned():
    weights = CheckpointState({})
    weights.merge(safetensors_format.load_buffer(_st_bytes({"w": torch.ones(4)}), "model.safetensors"))
    got = structural_check(weights, 1).summary
    assert "none found in weights" in got and "optimizer" not in got
    foreign = CheckpointState({"w": torch.ones(4)}, extra={"optimizer.state.0.exp_avg": torch.zeros(4)})
    assert "none found in weights or optimizer moments" in structural_check(foreign, 1).summary  # a trainer's own
    ints = CheckpointState({})
    ints.merge(safetensors_format.load_buffer(_st_bytes({"steps": torch.arange(3)}), "model.safetensors"))
    got = structural_check(ints, 1).summary
    assert "nothing was scanned" in got and "none found" not in got


def _st_bytes(tensors: dict) -> memoryview:
    from safetensors.torch import save

    return memoryview(save(tensors))
