"""The peers benchmark's pure parts: the checkpoint's layout and generation, the loaders' checksum, what is taken
from a child's output and from `ckptbench run --json`, the checks on a peer's result, the targets and the report's
ratios. One real child (the safetensors loader) runs end to end; no timing is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import _foreign
import _harness as h
import _loaders
import _peers
import _peers_docs as docs
import _peers_report as report
import _peers_rounds as rounds
import peers_bench as pb

MiB, GiB = 1 << 20, 1 << 30
TINY = (64, 224)  # hidden, intermediate: a layer of 86 KB, so a checkpoint of a few layers is written in an instant


# ---------------------------------------------------------------------------- layout and generation


def test_the_default_layout_is_four_one_gib_shards_of_8b_class_mlp_layers():
    spec = _foreign.layout(4 * GiB)
    assert (spec["hidden"], spec["intermediate"]) == (4096, 14336)
    assert spec["layers"] == 12
    assert [len(s) for s in spec["shards"]] == [3, 3, 3, 3]
    layer = 3 * 4096 * 14336 * 2 + 2 * 4096 * 2
    assert 3 * layer <= GiB


def test_a_small_checkpoint_halves_the_dims_and_still_has_several_shards():
    spec = _foreign.layout(256 * MiB)
    layer = 3 * spec["hidden"] * spec["intermediate"] * 2 + 2 * spec["hidden"] * 2
    assert spec["hidden"] < 4096 and layer <= 64 * MiB
    assert len(spec["shards"]) >= 3
    assert abs(spec["layers"] * layer - 256 * MiB) <= layer  # about the size asked for


@pytest.mark.parametrize("total", [1, 3 * MiB, 256 * MiB, 4 * GiB, 9 * GiB])
def test_every_layer_is_in_exactly_one_shard_in_order(total):
    spec = _foreign.layout(total)
    flat = [layer for shard in spec["shards"] for layer in shard]
    assert flat == list(range(spec["layers"]))
    assert all(shard for shard in spec["shards"])


def test_layer_values_are_seeded_finite_and_not_zero():
    spec = _foreign.layout(1 * MiB, dims=TINY)
    a, b = _foreign.layer_tensors(spec, 1), _foreign.layer_tensors(spec, 1)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for t in a.values():
        assert t.dtype == torch.bfloat16
        assert bool(torch.isfinite(t.float()).all()) and bool(t.float().abs().sum() > 0)
    other = _foreign.layer_tensors(spec, 2)
    assert not torch.equal(a["model.layers.1.mlp.up_proj.weight"], other["model.layers.2.mlp.up_proj.weight"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("peers") / "ckpt")
    spec = _foreign.layout(4 * 86272, dims=TINY)  # four layers, a shard each (a quarter of the total)
    meta, problem = _foreign.ensure_checkpoint(directory, spec)
    assert problem == ""
    return directory, spec, meta


def test_generation_writes_the_hf_layout_without_a_manifest(tiny):
    directory, spec, meta = tiny
    names = sorted(os.listdir(directory))
    assert names == [f"model-0000{i}-of-00004.safetensors" for i in (1, 2, 3, 4)] + [_loaders.INDEX]
    with open(os.path.join(directory, _loaders.INDEX)) as f:
        index = json.load(f)
    assert set(index["weight_map"].values()) == set(names[:4])
    assert meta["ckptbench_peers"]["spec"] == spec
    assert meta["ckptbench_peers"]["tensors"] == len(index["weight_map"]) == 5 * spec["layers"]


def test_the_recorded_checksum_and_sizes_are_those_of_the_written_tensors(tiny):
    directory, _, meta = tiny
    state = {}
    for path in _loaders.shard_paths(directory):
        state.update(load_file(path))
    assert _loaders.checksum(state) == meta["ckptbench_peers"]["checksum"]
    assert sum(t.numel() * t.element_size() for t in state.values()) == meta["total_size"]


def test_the_recorded_crc32c_is_that_of_each_shard_as_fastio_reads_it(tiny):
    import fastio

    directory, _, meta = tiny
    r = fastio.read_files(_loaders.shard_paths(directory), hash="crc32c")
    assert {os.path.basename(f.path): f.digest for f in r.files} == meta["ckptbench_peers"]["crc32c"]


def test_a_matching_checkpoint_is_reused_and_another_refused(tiny, tmp_path):
    directory, spec, meta = tiny
    assert _foreign.ensure_checkpoint(directory, spec) == (meta, "")
    other = dict(spec, seed=spec["seed"] + 1)
    assert _foreign.ensure_checkpoint(directory, other)[0] is None
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    got, why = _foreign.ensure_checkpoint(str(tmp_path / "busy"), spec)
    assert got is None and "not empty" in why
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "ckptbench.json").write_text("{}")
    got, why = _foreign.ensure_checkpoint(str(tmp_path / "ours"), spec)
    assert got is None and "manifest" in why


# ---------------------------------------------------------------------------- the loaders' checksum


@pytest.mark.parametrize("numel, want", [(0, []), (1, [0]), (3, [0, 1, 2]), (8, list(range(8))),
                                         (100, [0, 14, 28, 42, 57, 71, 85, 99])])
def test_sampled_positions_take_the_first_the_last_and_between(numel, want):
    assert _loaders.sample_positions(numel) == want


def test_the_checksum_ignores_dict_order_and_storage():
    a = torch.arange(1000, dtype=torch.float32).to(torch.bfloat16).reshape(10, 100)
    b = torch.ones(7, dtype=torch.bfloat16)
    assert _loaders.checksum({"a": a, "b": b}) == _loaders.checksum({"b": b.clone(), "a": a.clone()})


@pytest.mark.parametrize("change", ["sampled value", "name", "shape", "dtype"])
def test_the_checksum_sees_a_changed_sampled_value_name_shape_or_dtype(change):
    a = torch.arange(1000, dtype=torch.float32).to(torch.bfloat16).reshape(10, 100)
    base = _loaders.checksum({"a": a})
    if change == "sampled value":
        b = a.clone()
        b.view(-1)[999] = -1
        state = {"a": b}
    elif change == "name":
        state = {"b": a}
    elif change == "shape":
        state = {"a": a.reshape(100, 10)}
    else:
        state = {"a": a.view(torch.int16)}
    assert _loaders.checksum(state) != base


def test_shards_come_from_the_index_or_else_the_directory(tmp_path):
    (tmp_path / "b.safetensors").write_bytes(b"")
    (tmp_path / "a.safetensors").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    assert _loaders.shard_paths(str(tmp_path)) == [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    (tmp_path / _loaders.INDEX).write_text(json.dumps({"weight_map": {"x": "b.safetensors", "y": "b.safetensors"}}))
    assert _loaders.shard_paths(str(tmp_path)) == [str(tmp_path / "b.safetensors")]


def test_the_safetensors_child_reports_the_generators_tensors(tiny):
    """The real runner in a fresh process, its output parsed and checked as the benchmark does."""
    directory, _, meta = tiny
    out = subprocess.run([sys.executable, rounds.LOADERS_PY, "safetensors", directory], capture_output=True, text=True,
                         env=h.child_env(), check=False)
    doc, problem = docs.parse_child(out.returncode, out.stdout, out.stderr)
    assert problem == "", out.stderr
    assert docs.check_peer(doc, meta["ckptbench_peers"], meta["total_size"]) == []
    assert doc["loader"] == "safetensors" and doc["seconds"] > 0
    assert 0.0 <= doc["residency_before"] <= 1.0


def test_an_unknown_loader_is_one_usage_line_and_status_2():
    out = subprocess.run([sys.executable, rounds.LOADERS_PY, "nope", "/nonexistent"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.startswith("usage:")


# ---------------------------------------------------------------------------- children's output


def test_a_child_document_is_the_whole_stdout():
    doc = {"rto_s": 1.5, "stages": {"read": 1.0}}
    assert docs.parse_child(0, json.dumps(doc, indent=2), "") == (doc, "")


def test_a_child_document_is_else_the_last_line_after_other_output():
    assert docs.parse_child(0, "a log line\n{\"seconds\": 2.0}\n", "") == ({"seconds": 2.0}, "")


def test_a_child_without_a_document_gives_its_last_stderr_line():
    doc, problem = docs.parse_child(1, "", "Traceback...\nImportError: no module named runai_model_streamer\n")
    assert doc is None
    assert problem == "exited 1 without a JSON document: ImportError: no module named runai_model_streamer"


@pytest.mark.parametrize("stdout", ["", "[1, 2]", "not json"])
def test_output_that_is_not_a_json_object_is_no_document(stdout):
    doc, problem = docs.parse_child(0, stdout, "")
    assert doc is None and problem.startswith("exited 0 without a JSON document: no output")


def test_a_document_from_a_failed_child_is_kept_with_the_status():
    assert docs.parse_child(1, "{\"status\": \"failed\"}", "") == ({"status": "failed"}, "exited 1")


# ---------------------------------------------------------------------------- ckptbench run --json


def run_doc(**over) -> dict:
    doc = {"rto_s": 2.0, "stages": {"list": 0.01, "read": 1.5, "verify": 0.1, "load": 0.2, "device": 0.0,
                                    "check": 0.19},
           "cache": {"residency_before": 0.0}, "status": "ok", "bytes": 100, "verified": False, "warmup_s": 3.0,
           "options": {"mode": "fused", "read": "auto", "hash": None, "concurrency": 8, "block_size": 1 << 20},
           "read": {"modes": ["direct"], "why": "auto: cold"},
           "repeats": [{"read": {"mode": "direct", "why": "auto: cold"}}]}
    return doc | over


def test_the_summary_takes_the_rto_the_stages_and_the_read_path_auto_picked():
    s = docs.run_summary(run_doc())
    assert (s["rto"], s["read"], s["check"], s["residency"]) == (2.0, 1.5, 0.19, 0.0)
    assert (s["read_option"], s["read_mode"], s["read_why"]) == ("auto", "direct", "auto: cold")
    assert (s["hash"], s["concurrency"], s["block_size"]) == ("crc32c", 8, 1 << 20)


def test_a_concrete_read_option_is_the_read_path():
    doc = run_doc(options=run_doc()["options"] | {"read": "mmap"})
    assert docs.resolved_read(doc) == ("mmap", "set")


def test_without_the_runs_list_the_first_repeat_says_what_auto_picked():
    doc = run_doc(read={"modes": ["direct", "pread"]}, repeats=[{"read": {"mode": "pread", "why": "hot"}}])
    assert docs.resolved_read(doc) == ("pread", "hot")


def test_a_run_that_says_nothing_of_its_read_path_gives_none():
    doc = run_doc()
    del doc["read"], doc["repeats"]
    assert docs.resolved_read(doc) == (None, "not reported")


def test_staged_reads_without_a_hash_and_an_explicit_hash_is_kept():
    assert docs.run_summary(run_doc(options=run_doc()["options"] | {"mode": "staged"}))["hash"] == "none"
    assert docs.run_summary(run_doc(options=run_doc()["options"] | {"hash": "xxh64"}))["hash"] == "xxh64"


@pytest.mark.parametrize("note, want", [
    ("NOT VERIFIED: no manifest, so there is no reference; digests were not computed (--hash crc32c computes them)",
     "none"),
    ("NOT VERIFIED: no manifest, so there is no reference; digests were computed (xxh64) for the record only",
     "xxh64"),
    ("NOT VERIFIED: no manifest, so digests were computed with no reference", "crc32c")])
def test_without_a_hash_option_the_verify_note_says_what_the_read_hashed(note, want):
    assert docs.resolved_hash(run_doc(notes={"verify": note}))[0] == want


def test_the_read_command_repeats_the_runs_read_path_cold():
    cmd = docs.read_command(docs.run_summary(run_doc()), "/ckpt")
    assert cmd[1:6] == ["-m", "ckptbench", "read", "/ckpt", "--json"]
    options = cmd[6:]
    assert dict(zip(options[::2], options[1::2])) == {"--cache": "cold", "--hash": "crc32c", "--concurrency": "8",
                                                      "--block-size": str(1 << 20), "--read": "direct"}


def test_the_read_command_leaves_the_read_mode_to_read_when_the_run_did_not_say():
    doc = run_doc()
    del doc["read"], doc["repeats"]
    assert "--read" not in docs.read_command(docs.run_summary(doc), "/ckpt")


# ---------------------------------------------------------------------------- checks on results


REF = {"checksum": "abc", "tensors": 5}


def test_a_peer_with_the_generators_tensors_passes():
    assert docs.check_peer({"loader": "x", "checksum": "abc", "tensors": 5, "bytes": 10}, REF, 10) == []


def test_a_peer_with_other_tensors_is_told_what_differs():
    wrong = docs.check_peer({"loader": "x", "checksum": "abd", "tensors": 4, "bytes": 9}, REF, 10)
    assert len(wrong) == 3
    assert "checksum" in wrong[0] and "4 tensors" in wrong[1] and "9 tensor bytes" in wrong[2]


def read_doc(digests: dict[str, str], hash_: str = "crc32c", failed: int = 0) -> dict:
    return {"hash": hash_, "files_failed": failed, "bytes": 10,
            "files": [{"path": f"/ckpt/{n}", "digest": d} for n, d in digests.items()]}


def test_a_read_is_checked_against_the_shards_crc32c_and_may_carry_the_index():
    crc = {"a.safetensors": "1", "b.safetensors": "2"}
    assert docs.check_read(read_doc(crc | {_loaders.INDEX: "9"}), crc, 10) == []
    assert docs.check_read(read_doc({"a.safetensors": "1", "b.safetensors": "3"}), crc, 10) == [
        "b.safetensors: crc32c 3 != 2"]
    assert docs.check_read(read_doc({"a.safetensors": "1"}), crc, 10) == ["b.safetensors: crc32c None != 2"]


def test_a_read_with_another_hash_is_not_compared_but_failures_and_bytes_count():
    crc = {"a.safetensors": "1"}
    assert docs.check_read(read_doc({"a.safetensors": "ff"}, hash_="none"), crc, 10) == []
    assert docs.check_read(read_doc({"a.safetensors": "1"}, failed=2), crc, 10) == ["2 file(s) failed"]
    assert docs.check_read(read_doc({"a.safetensors": "1"}), crc, 11) == ["read 10 bytes, the directory holds 11"]


# ---------------------------------------------------------------------------- targets and ratios


def series(key: str, samples: list[float], loader: str | None = None) -> rounds.PeerSeries:
    condition = key.split("/")[0]
    s = rounds.PeerSeries(key, condition, "s", loader=loader or key.split("/", 1)[1])
    for v in samples:
        s.add(v, 0.0 if condition == "cold" else 1.0)
    return s


def by_key(*items: rounds.PeerSeries) -> dict[str, rounds.PeerSeries]:
    return {s.key: s for s in items}


PEERS = ["safetensors", "fastsafetensors", "runai"]


def test_the_fastest_peer_is_the_lowest_median_time():
    sr = by_key(series("hot/safetensors", [3.0, 1.0, 3.0]), series("hot/runai", [2.0, 2.0, 1.0]))
    assert report.fastest_peer(sr, "hot", PEERS) == "hot/runai"
    assert report.fastest_peer(sr, "cold", PEERS) is None


@pytest.mark.parametrize("peer_s, status", [(2.9, "MISSED"), (3.0, "met"), (4.0, "met")])
def test_hot_needs_ckptbench_1_5x_faster_than_the_fastest_peer(peer_s, status):
    sr = by_key(series("hot/ckptbench", [2.0], "ckptbench run"), series("hot/runai", [peer_s]),
                series("hot/safetensors", [10.0]))
    v = h.judge(report.targets(sr, PEERS)[0], sr)
    assert v["status"] == status and v["value"] == pytest.approx(peer_s / 2.0)
    assert "runai" in v["target"]


def test_cold_needs_1_3x_and_without_peers_it_is_not_measured():
    sr = by_key(series("cold/ckptbench", [1.0], "ckptbench run"), series("cold/fastsafetensors", [1.3]))
    assert h.judge(report.targets(sr, PEERS)[1], sr)["status"] == "met"
    lone = by_key(series("cold/ckptbench", [1.0], "ckptbench run"))
    assert h.judge(report.targets(lone, PEERS)[1], lone)["status"] == "not measured"


@pytest.mark.parametrize("stage, status", [(0.84, "MISSED"), (0.85, "met"), (1.15, "met"), (1.16, "MISSED")])
def test_the_read_stage_must_be_within_15_percent_of_read(stage, status):
    sr = by_key(series("cold/ckptbench/read-stage", [stage * 2]), series("cold/ckptbench/read", [2.0]))
    v = h.judge(report.targets(sr, PEERS)[2], sr)
    assert v["status"] == status


def test_the_check_stage_bound_is_a_quarter_of_the_read_stage_paired():
    sr = by_key(series("cold/ckptbench/check-stage", [0.25, 0.5, 0.1]),
                series("cold/ckptbench/read-stage", [1.0, 1.0, 1.0]))
    v = h.judge(report.targets(sr, PEERS)[3], sr)
    assert (v["status"], v["value"]) == ("met", 0.25)


def test_verdicts_read_pass_miss_or_why_not():
    lines = report.verdict_lines([{"status": "met", "target": "a", "detail": "1.60×"},
                                  {"status": "MISSED", "target": "b"},
                                  {"status": "not verified (cache state)", "target": "c"}])
    assert lines == ["PASS: a — 1.60×", "MISS: b", "not verified (cache state): c"]


def test_a_peers_ratio_is_its_median_over_ckptbench_and_stages_are_paired():
    sr = by_key(series("cold/ckptbench", [2.0, 4.0, 3.0], "ckptbench run"), series("cold/runai", [6.0, 9.0, 7.5]),
                series("cold/ckptbench/read-stage", [1.0, 2.0]), series("cold/ckptbench/read", [1.0, 1.0]),
                series("cold/ckptbench/check-stage", [0.1, 0.4]))
    assert report.ratio_cell(sr, sr["cold/runai"]) == "2.50× ckptbench"
    assert report.ratio_cell(sr, sr["cold/ckptbench"]) == "reference"
    assert report.ratio_cell(sr, sr["cold/ckptbench/read"]) == "read stage / read = 1.500×"
    assert report.ratio_cell(sr, sr["cold/ckptbench/check-stage"]) == "check / read stage = 0.150×"


def test_a_failed_repeat_marks_the_series_failed():
    s = series("cold/runai", [1.0])
    assert s.ok
    s.add(2.0, 0.0, status="failed")
    assert not s.ok and s.as_dict()["ok"] is False


# ---------------------------------------------------------------------------- end to end


def test_a_quick_run_on_a_tiny_checkpoint_writes_its_report(tmp_path, monkeypatch):
    """The whole benchmark, one round, with the one peer every install has; figures are not judged."""
    out = tmp_path / "out"
    monkeypatch.setattr(h, "OUT_DIR", str(out))
    monkeypatch.setattr(pb, "OUT_DIR", str(out))
    rc = pb.main(["--quick", "--size-gib", "0.002", "--dir", str(tmp_path / "ckpt"), "--peers", "safetensors",
                  "--floor-runs", "2"])
    assert rc == 0
    md = [p for p in out.iterdir() if p.suffix == ".md"]
    assert len(md) == 1 and md[0].name.startswith("peers_bench-")
    text = md[0].read_text()
    record = json.loads(md[0].with_suffix(".json").read_text())
    assert "| hot | ckptbench run |" in text and "| hot | safetensors |" in text
    assert [v["target"].split(":")[0] for v in record["targets"]] == ["hot"] * 3 + ["cold"] * 3 + ["hot", "cold"] \
        + ["hot", "cold", "cold", "cold"]
    assert "efficiency" in record["targets"][0]["target"]
    # ckptbench against the floor of its own work (its scan added) and against the plain C loop: said, never judged
    info = [v["target"] for v in record["targets"] if v["status"] == "info"]
    assert len(info) == 4 and sum("its own work" in t for t in info) == 2 and sum("plain C loop" in t for t in info) == 2
    assert record["floor"]["models"]["hot-own"]["floor_s"] > record["floor"]["models"]["hot"]["floor_s"]
    assert "INFO: hot: ckptbench run against the floor of its own work" in text
    head = next(line for line in text.splitlines() if line.startswith("| condition |"))
    assert head.split(" | ")[2] == "efficiency"  # the headline column, right after the loader
    rows = {(m["condition"], m["loader"]): m["efficiency"] for m in record["measurements"]}
    for row in (("hot", "ckptbench run"), ("cold", "ckptbench run"), ("hot", "safetensors"), ("cold", "safetensors"),
                ("hot", "plain C loop"), ("cold", "plain C loop")):
        # a sanity bound, not a target: a 2 MiB set lands in the CPU's caches while the floor is held to 256 MiB
        # samples, and on a busy box the two move apart (the C loop read 1.55 in CI); a units slip is 1000x
        assert 0 < rows[row] <= 3, (row, rows[row])
    assert "| hot | plain C loop |" in text and "within ±10 % of a plain C loop landing it" in text
    assert record["floor"]["models"]["hot"]["floor_s"] > 0 and record["floor"]["models"]["cold"]["floor_s"] > 0
    agree = record["floor_agreement"]["verdicts"]
    assert len(agree) >= 6 and all(v["status"] in ("met", "MISSED", "not measured", "info") for v in agree)
    # the host beside the floor runs: said, never judged
    assert [v["status"] for v in agree if v["target"].startswith("the host over")] == ["info"]
    assert "## Does the floor agree" in text
    assert all(m["ok"] for m in record["measurements"]), [m["problems"] for m in record["measurements"]]
    assert record["read_command"] is None or record["read_command"][2:4] == ["ckptbench", "read"]
    assert (out / f"{md[0].stem}-results.csv").exists()


def test_fio_reads_into_huge_pages_reserved_for_it_and_given_back(tmp_path):
    # here, beside the quick run that reserves them too: a test file runs on one worker, so never both at once
    import _floor_agree as agree

    fio = shutil.which("fio")
    assert fio, "fio is needed (make test installs it: apt-get install fio)"
    files = []
    for i, size in enumerate((1 << 20, 3 << 20)):
        (tmp_path / f"f{i}").write_bytes(os.urandom(size))
        files.append((str(tmp_path / f"f{i}"), size))
    with open(agree.HUGEPAGES) as f:
        before = f.read()
    with agree.huge_buffers(2) as huge:
        # root may reserve them (make test runs as root); anyone else reads into 4 KiB pages, and the record says so
        assert huge == (os.geteuid() == 0 and os.access(agree.HUGEPAGES, os.W_OK))
        timed, _ = _peers.run_fio_replay(fio, files, jobs=2, block=1 << 20, chunk=1 << 20, direct=True, huge=huge)
    assert timed.bytes == sum(s for _, s in files)
    with open(agree.HUGEPAGES) as f:
        assert f.read() == before  # the box's reservation as it was



def test_every_contender_starts_the_same_settle_after_its_cache_state(monkeypatch, tmp_path):
    """A VM hands freed memory back to its host seconds after the free; a contender started right after one lands
    several times faster (_harness.settle): each cache state made for a contender is followed by the same wait."""
    assert pb.parse_args([]).settle == h.SETTLE_DEFAULT_S > 0 and pb.parse_args(["--quick"]).settle == 0
    assert pb.parse_args(["--settle", "3"]).settle == 3
    waits, made = [], []
    monkeypatch.setattr(h, "SETTLE_S", 7.0)
    monkeypatch.setattr(h.time, "sleep", waits.append)
    monkeypatch.setattr(rounds, "make_cold", lambda files: made.append("cold") or 0.0)
    monkeypatch.setattr(rounds, "make_hot", lambda files: made.append("hot") or 1.0)
    b = rounds.Bench.__new__(rounds.Bench)
    b.files, b.pair = [str(tmp_path / "x")], False
    assert b.prepare("cold") == 0.0 and b.prepare("hot") == 1.0
    assert made == ["cold", "hot"] and waits == [7.0, 7.0]
    # paired, a repeat's probe of fresh memory (cold and hot: both land in fresh memory) comes after the same wait,
    # and is followed by it again (its memory goes back as a run's does): the contender starts as long after the
    # probe's free as after any other
    probed = []
    monkeypatch.setattr(rounds._floor_bench, "probe", lambda n: probed.append(len(waits)) or 2.5)
    b.pair, b.total, waits[:] = True, 1 << 30, []
    assert b.prepare("cold") == 0.0 and b.probe == 2.5
    assert b.prepare("hot") == 1.0 and b.probe == 2.5
    assert waits == [7.0] * 4 and probed == [1, 3]
