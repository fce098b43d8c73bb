"""Layout selection on an S3 prefix, as on a directory: a DeepSpeed prefix with several steps restores the one its
`latest` names (read by a bounded ranged GET, a larger object refused from its listed size without a download), a
Hugging Face index selects its shards, a Trainer's training_args.bin is never read; a hostile `latest` or index is
one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import shlex

import pytest
import torch
from s3help import files_under, put_dir, run_cli
from s3help import one_line_error as _one_line

import ckptbench.cli.run  # noqa: F401  (imported before any per-test stream redirection)

MODES = ("fused", "staged")


def one_line_error(rc, err: str, *needles: str) -> str:
    return _one_line(rc, err, *needles, code=None)  # a refused member path exits 1, a bad `latest` 2


def _run(url: str, mode: str, tmp_path):
    return run_cli("run", url, "--json", "--repeat", "1", "--mode", mode, "--part-size", "256K", "-c", "4",
                   "--results", tmp_path / f"R-{mode}.csv")


def _ds_step(d, step: int, n: int, ranks: int = 2) -> None:
    """One DeepSpeed ZeRO-2 step directory: the model states and one optimizer partition per rank."""
    g = torch.Generator().manual_seed(step)
    os.makedirs(d)
    module = {"wte.weight": torch.randn(48, n, generator=g), "h.0.ln_1.bias": torch.randn(n, generator=g)}
    torch.save({"module": module, "global_steps": step, "lr_scheduler": {"last_epoch": step}, "dp_world_size": ranks},
               os.path.join(d, "mp_rank_00_model_states.pt"))
    part = sum(t.numel() for t in module.values()) // ranks
    for r in range(ranks):
        torch.save({"optimizer_state_dict": {"base_optimizer_state": {
            "state": {0: {"exp_avg": torch.randn(part, generator=g)}}, "param_groups": [{"lr": 1e-4, "params": [0]}]},
            "single_partition_of_fp32_groups": [torch.randn(part, generator=g)]}},
            os.path.join(d, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


STEP200 = ["latest", "global_step200/mp_rank_00_model_states.pt",
           "global_step200/zero_pp_rank_0_mp_rank_00_optim_states.pt",
           "global_step200/zero_pp_rank_1_mp_rank_00_optim_states.pt"]  # zero_to_fp32.py: a script, never read


@pytest.fixture
def ds_prefix(s3server, s3bucket, tmp_path):
    """global_step100 (larger, with a torn partition: reading it would fail the load) and global_step200 under a
    prefix, `latest` naming 200; returns (url, local copy, a function that replaces one object)."""
    root = tmp_path / "ds"
    root.mkdir()
    _ds_step(root / "global_step100", 100, n=64)
    (root / "global_step100" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"PK\x03\x04torn" * 50)
    _ds_step(root / "global_step200", 200, n=16)
    (root / "latest").write_text("global_step200\n")
    (root / "zero_to_fp32.py").write_text("# DeepSpeed's conversion script\n")
    direct = s3server.client(direct=True)
    put_dir(direct, s3bucket, "runs/ds", str(root))

    def put(rel: str, body: bytes) -> None:
        direct.put_object(Bucket=s3bucket, Key=f"runs/ds/{rel}", Body=body)

    return f"s3://{s3bucket}/runs/ds", str(root), put


@pytest.mark.parametrize("mode", MODES)
def test_deepspeed_prefix_restores_only_the_step_latest_names(s3env, ds_prefix, tmp_path, mode):
    url, root, _ = ds_prefix
    rc, out, err = _run(url, mode, tmp_path)
    assert rc == 0, err
    doc = json.loads(out)
    local = files_under(root)
    assert doc["status"] == "unverified" and doc["format"] == "torch" and doc["source"] == url
    assert doc["files"] == len(STEP200) and doc["bytes"] == sum(len(local[r]) for r in STEP200)
    assert len(local) == len(STEP200) + 4  # step 100's three objects and zero_to_fp32.py were listed and left alone


def test_s3_selection_matches_the_local_one(s3env, ds_prefix):
    from ckptbench.sources.local import LocalSource
    from ckptbench.sources.s3source import S3Source

    url, root, _ = ds_prefix
    remote, local = S3Source(url).list(), LocalSource(root, checkpoint=True).list()
    assert sorted(remote.rels) == sorted(local.rels) == sorted(STEP200)
    assert remote.bytes == local.bytes and remote.format == local.format == "torch"


@pytest.mark.parametrize("content, needle", [
    (b"../x", "'../x'"),
    (b"global_step100/../../x", "not one directory name"),
    (b"global_step999\n", "'global_step999', which is not a directory"),
    (b"", "names ''"),
    (b"\xff\xfe\x00\x9cgarbage\x00", "not text"),
    (b"zero_to_fp32.py", "not a directory"),
    (b"global_step200" + b" " * 5000, "more than a DeepSpeed `latest` file holds"),
])
def test_hostile_latest_on_s3_is_one_line(s3env, ds_prefix, tmp_path, content, needle):
    url, _, put = ds_prefix
    put("latest", content)
    for mode in MODES:
        rc, out, err = _run(url, mode, tmp_path)
        one_line_error(rc, err, f"{url}/latest", needle)
        assert out == ""
    rc, _, err = run_cli("read", url)
    one_line_error(rc, err, f"{url}/latest", needle)


def test_a_large_latest_is_refused_from_its_listed_size_without_downloading_it(s3env, s3server, ds_prefix, tmp_path):
    url, _, put = ds_prefix
    put("latest", b"global_step200" + b"\n" * (4 << 20))
    before = s3server.proxy.counters()["bytes_out"]
    rc, _, err = _run(url, "fused", tmp_path)
    one_line_error(rc, err, f"{url}/latest", f"{14 + (4 << 20)} bytes", "at most 4096")
    assert s3server.proxy.counters()["bytes_out"] - before < 256 << 10  # the listing only, not 4 MiB


def test_several_steps_and_no_latest_on_s3_is_refused_not_guessed(s3env, s3server, s3bucket, ds_prefix, tmp_path):
    url, _, _ = ds_prefix
    s3server.client(direct=True).delete_object(Bucket=s3bucket, Key="runs/ds/latest")
    rc, _, err = _run(url, "fused", tmp_path)
    one_line_error(rc, err, url, "2 DeepSpeed step directories", "no `latest`")


# ---- Hugging Face: an index's shards, a Trainer's files ----------------------------------------------------------


@pytest.fixture
def hf_prefix(s3server, s3bucket, tmp_path):
    """Two .bin shards and their index, a stale shard the index no longer names (garbage); returns (url, root,
    a function that rewrites the index)."""
    root = tmp_path / "hf"
    root.mkdir()
    g = torch.Generator().manual_seed(3)
    shards = {"pytorch_model-00001-of-00002.bin": {"wte.weight": torch.randn(40, 8, generator=g)},
              "pytorch_model-00002-of-00002.bin": {"lm_head.weight": torch.randn(40, 8, generator=g)}}
    for name, sd in shards.items():
        torch.save(sd, str(root / name))
    index = {"metadata": {"total_size": 1}, "weight_map": {k: n for n, sd in shards.items() for k in sd}}
    (root / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    (root / "pytorch_model-00001-of-00003.bin").write_bytes(b"stale " * 100)
    direct = s3server.client(direct=True)
    put_dir(direct, s3bucket, "hf", str(root))

    def put_index(body: bytes) -> None:
        direct.put_object(Bucket=s3bucket, Key="hf/pytorch_model.bin.index.json", Body=body)

    return f"s3://{s3bucket}/hf", str(root), put_index, index


@pytest.mark.parametrize("mode", MODES)
def test_hf_index_on_s3_selects_the_shards_it_names(s3env, hf_prefix, tmp_path, mode):
    url, root, _, _ = hf_prefix
    rc, out, err = _run(url, mode, tmp_path)
    assert rc == 0, err
    doc = json.loads(out)
    read = {r: b for r, b in files_under(root).items() if r != "pytorch_model-00001-of-00003.bin"}
    assert doc["status"] == "unverified" and doc["files"] == len(read) == 3 and doc["bytes"] == sum(map(len, read.values()))


@pytest.mark.parametrize("edit, needles", [
    (lambda d: d["weight_map"].update({"evil.w": "../evil.bin"}), ("'../evil.bin'", "refusing")),
    (lambda d: d["weight_map"].update({"x.w": "pytorch_model-00009-of-00009.bin"}),
     ("pytorch_model-00009-of-00009.bin", "missing")),
    (lambda d: d.update({"weight_map": {"w": 7}}), ("pytorch_model.bin.index.json", "not a file name")),
    (None, ("pytorch_model.bin.index.json", "not valid UTF-8 JSON")),
])
def test_hostile_index_on_s3_is_one_line(s3env, hf_prefix, tmp_path, edit, needles):
    url, _, put_index, index = hf_prefix
    if edit is None:
        put_index(b"{not json")
    else:
        doc = json.loads(json.dumps(index))
        edit(doc)
        put_index(json.dumps(doc).encode())
    for mode in MODES:
        rc, out, err = _run(url, mode, tmp_path)
        one_line_error(rc, err, *needles)
        assert out == ""


class RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


@pytest.mark.parametrize("mode", MODES)
def test_trainer_prefix_on_s3_loads_its_state_and_never_reads_training_args(s3env, s3server, s3bucket, tmp_path,
                                                                            monkeypatch, mode):
    from safetensors.torch import save_file

    from ckptbench.restore import load as restore

    loaded = []
    real = restore.load_state
    monkeypatch.setattr(restore, "load_state", lambda *a, **kw: loaded.append(real(*a, **kw)) or loaded[-1])
    root = tmp_path / "checkpoint-500"
    root.mkdir()
    g = torch.Generator().manual_seed(1)
    save_file({"embed.weight": torch.randn(16, 8, generator=g)}, str(root / "model.safetensors"))
    exp_avg = torch.randn(16, 8, generator=g)
    torch.save({"state": {0: {"step": torch.tensor(1.0), "exp_avg": exp_avg}},
                "param_groups": [{"lr": 1e-3, "params": [0]}]}, str(root / "optimizer.pt"))
    torch.save({"last_epoch": 500}, str(root / "scheduler.pt"))
    (root / "trainer_state.json").write_text('{"global_step": 500}')
    torch.save(RunsCode(str(tmp_path / "MARKER")), str(root / "training_args.bin"))
    put_dir(s3server.client(direct=True), s3bucket, "ck", str(root))
    rc, out, err = _run(f"s3://{s3bucket}/ck", mode, tmp_path)
    assert rc == 0, err
    doc = json.loads(out)
    read = {r: b for r, b in files_under(root).items() if r != "training_args.bin"}
    assert doc["status"] == "unverified" and doc["format"] == "safetensors"
    assert doc["files"] == len(read) == 4 and doc["bytes"] == sum(map(len, read.values()))
    assert not (tmp_path / "MARKER").exists()
    (state,) = loaded  # fused: from the read buffers of the objects; staged: from the staged files
    assert torch.equal(state.extra["optimizer.state.0.exp_avg"], exp_avg)
    assert state.extra["scheduler.last_epoch"] == 500 and set(state.model) == {"embed.weight"}


def test_a_megatron_prefix_restores_the_iteration_its_file_names(s3env, s3server, s3bucket, tmp_path):
    """The listing descends into iter_0000020 (what latest_checkpointed_iteration.txt names), on S3 as on disk:
    the source recorded is that prefix and nothing of iter_0000010 is read."""
    root = tmp_path / "meg"
    for it in (10, 20):
        d = root / f"iter_{it:07d}" / "mp_rank_00"
        d.mkdir(parents=True)
        torch.save({"model": {"w": torch.full((64, 64), float(it))}, "iteration": it}, d / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("20\n")
    put_dir(s3server.client(direct=True), s3bucket, "runs/meg", str(root))
    url = f"s3://{s3bucket}/runs/meg"
    rc, out, err = _run(url, "fused", tmp_path)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["source"] == f"{url}/iter_0000020" and doc["files"] == 1
    assert doc["bytes"] == os.path.getsize(root / "iter_0000020" / "mp_rank_00" / "model_optim_rng.pt")
