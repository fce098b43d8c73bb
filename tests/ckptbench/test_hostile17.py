"""Hostile input, pass 17: torch's legacy format's storage list and counts (after the object's pickle), a Megatron
iteration's rank folders and saved sizes, and a Trainer's trainer_state.json."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import pickletools
import shutil
import struct
import subprocess
import sys
import warnings

import pytest
import torch

from clirun import assert_one_line_error, run_cli
from ckptbench.checkpoint.formats.state import FormatError
from ckptbench.checkpoint.formats.torch_format import load_buffer


def _legacy_parts(obj) -> tuple[bytes, list, bytes]:
    """A legacy torch.save of `obj` cut where torch reads it: up to the storage key list, the list, what follows."""
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    raw = buf.getvalue()
    f = io.BytesIO(raw)
    for _ in range(4):  # magic, protocol, system info, the object
        for _op in pickletools.genops(f):
            pass
    start = f.tell()
    keys = pickle.load(f)
    return raw[:start], keys, raw[f.tell():]


def _legacy(head_keys=None, count=None, tail_cut=0) -> bytes:
    head, keys, tail = _legacy_parts({"w": torch.arange(4, dtype=torch.float32), "step": 3})
    listed = pickle.dumps(keys if head_keys is None else head_keys(keys), protocol=2)
    if count is not None:
        tail = struct.pack("<q", count) + tail[8:]
    return head + listed + (tail[:len(tail) - tail_cut] if tail_cut else tail)


def _refused(data: bytes, *needles: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns reading a legacy file from a read-only buffer
        with pytest.raises(FormatError) as exc:
            load_buffer(data, "legacy.pt")
    line = str(exc.value)
    assert "\n" not in line and all(n in line for n in needles), line
    return line


def test_an_untouched_legacy_file_still_loads():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = load_buffer(_legacy(), "legacy.pt")
    assert torch.equal(state.model["w"], torch.arange(4, dtype=torch.float32))


def test_legacy_files_with_shared_empty_and_no_storages_still_load():
    base = torch.arange(10.0)
    for obj in ({"step": 3}, {"a": base, "b": base[2:5], "c": torch.ones(3, dtype=torch.int8), "d": torch.zeros(0),
                              "e": torch.ones(2, dtype=torch.bfloat16)}):
        buf = io.BytesIO()
        torch.save(obj, buf, _use_new_zipfile_serialization=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = load_buffer(buf.getvalue(), "legacy.pt")
        assert sorted(state.model) == sorted(k for k, v in obj.items() if isinstance(v, torch.Tensor))
        assert all(torch.equal(state.model[k], v) for k, v in obj.items() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("count", [1 << 60, -1, 2, 5])
def test_a_legacy_storage_count_that_disagrees_is_one_clear_line(count):
    """torch's own error read 'storage has wrong byte size: expected %ld got %ld461168601842738790416'."""
    line = _refused(_legacy(count=count), f"holds {count} elements by its own count, 4 by the pickle's",
                    "corrupt or crafted")
    assert "%ld" not in line


@pytest.mark.parametrize("keys, needle", [
    (lambda k: [], "leaves out storage"),
    (lambda k: ["999"], "leaves out storage"),
    (lambda k: k + k, "names 2 storages where its pickle names 1"),
    (lambda k: k * 100000, "names 100000 storages where its pickle names 1"),
    (lambda k: {k[0]: 1}, "not the list of storage keys torch.save writes (dict)"),
    (lambda k: 5, "not the list of storage keys torch.save writes (int)"),
])
def test_a_legacy_storage_list_that_disagrees_is_refused(keys, needle):
    """An empty list loaded: torch allocated the storage from the pickle and never filled it, so the restored tensor
    was uninitialised memory."""
    _refused(_legacy(head_keys=keys), needle)


def test_a_legacy_storage_list_naming_a_global_is_refused_unrun():
    head, _, tail = _legacy_parts({"w": torch.ones(2)})
    _refused(head + b"cos\nsystem\n(S'true'\ntR." + tail, "not the list of storage keys", "an object it builds")


def test_a_legacy_storage_cut_short_is_one_line():
    _refused(_legacy(tail_cut=3), "lies past the end of the file", "corrupt or truncated")


def test_a_huge_legacy_count_through_the_cli_is_one_line(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "pytorch_model.bin").write_bytes(_legacy(count=1 << 60))
    assert_one_line_error(run_cli("inspect", tmp_path / "ck", "--json"), "by its own count")


# ---- Megatron's rank folders against the sizes its args saved ---------------------------------------------------


def _megatron(tmp_path, tp: int = 1, pp: int = 1, ep: int = 1, **args):
    from test_megatron import write_megatron

    root = tmp_path / "m"
    root.mkdir()
    for rel, obj in write_megatron(root, iterations=(10,), latest="10", tp=tp, pp=pp, ep=ep).items():
        for k, v in args.items():
            setattr(obj["args"], k, v)
        torch.save(obj, root / rel)
    return root


@pytest.mark.parametrize("pp, ep, args, named, folder", [
    # both ran: Megatron names mp_rank_TT_PPP_EEE, so two folders per tensor rank are half the save
    (2, 1, {"expert_model_parallel_size": 2}, "mp_rank_TT_PPP_EEE", "mp_rank_00_000"),
    (1, 2, {"pipeline_model_parallel_size": 2}, "mp_rank_TT_PPP_EEE", "mp_rank_00_000"),
    # neither ran: the _PPP folders passed as a second rank of some size nobody saved
    (2, 1, {"pipeline_model_parallel_size": 1}, "mp_rank_TT", "mp_rank_00_000"),
    # pipeline ran, yet the folders carry no pipeline rank: a stage missing passed as whole
    (1, 1, {"pipeline_model_parallel_size": 2}, "mp_rank_TT_PPP", "mp_rank_00"),
    (1, 1, {"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 4}, "mp_rank_TT_PPP_EEE", "mp_rank_00"),
])
@pytest.mark.parametrize("command", ["inspect", "run"])
def test_megatron_rank_folders_named_for_other_sizes_are_refused(tmp_path, pp, ep, args, named, folder, command):
    root = _megatron(tmp_path, pp=pp, ep=ep, **args)
    extra = ["--repeat", "1", "--results", str(tmp_path / "R.csv")] if command == "run" else []
    assert_one_line_error(run_cli(command, root, "--json", *extra),
                          f"which Megatron names {named}, but its rank folders are named {folder};")


def test_megatron_rank_folders_named_for_other_sizes_fail_check(tmp_path):
    root = _megatron(tmp_path, pp=2, expert_model_parallel_size=2)
    r = run_cli("check", root, "--json")
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    loads = next(v for v in json.loads(r.out)["items"] if v["id"] == "loads")
    assert loads["verdict"] == "fail" and "Megatron names mp_rank_TT_PPP_EEE" in loads["evidence"]["error"], loads


@pytest.mark.parametrize("pp, ep", [(2, 1), (1, 2), (2, 2)])
def test_megatron_rank_folders_as_megatron_names_them_still_restore(tmp_path, pp, ep):
    root = _megatron(tmp_path, tp=2, pp=pp, ep=ep)
    r = run_cli("inspect", root, "--json")
    assert r.rc == 0, r.err


# ---- a Trainer's trainer_state.json ------------------------------------------------------------------------------

TRAINER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compat", "fixtures",
                       "trainer_outdir", "checkpoint-10")


def _trainer(tmp_path, state) -> str:
    root = tmp_path / "checkpoint-10"
    shutil.copytree(TRAINER, root)
    text = state if isinstance(state, str) else json.dumps(state)
    (root / "trainer_state.json").write_text(text, encoding="utf-8")
    return str(root)


@pytest.mark.parametrize("text, name", [
    ('{"a.b": 1, "a": {"b": 2}}', "a.b"),  # the later value silently won
    ('{"a": {"b": 2}, "a.b": 1}', "a.b"),
    ('{"a": {"": 2}, "a.": 3}', "a."),  # an empty key beside one ending in a dot
    ('{"log_history": [5], "log_history.0": 6}', "log_history.0"),  # an index beside a dotted key
])
@pytest.mark.parametrize("command", ["inspect", "run"])
def test_trainer_state_keys_that_flatten_to_one_name_are_refused(tmp_path, text, name, command):
    root = _trainer(tmp_path, text)
    extra = ["--repeat", "1", "--results", str(tmp_path / "R.csv")] if command == "run" else []
    assert_one_line_error(run_cli(command, root, "--json", *extra),
                          f"trainer_state.json: {name!r}: two of its values have this name once nested keys are "
                          "joined with dots")


def test_trainer_state_keys_with_dots_that_do_not_collide_restore(tmp_path):
    from ckptbench.checkpoint.formats import trainer_json

    root = _trainer(tmp_path, {"global_step": 10, "a.b": 1, "a": {"c": 2}, "": 3, "d": {}})
    state = trainer_json.load_file(os.path.join(root, "trainer_state.json"))
    assert state.extra == {"trainer_state.global_step": 10, "trainer_state.a.b": 1, "trainer_state.a.c": 2,
                           "trainer_state.": 3, "trainer_state.d": {}}


def test_trainer_state_with_lone_surrogates_and_nan_round_trips_through_save(tmp_path):
    """Lone surrogates and NaN parse (Python's json, as a Trainer's resume reads them) and come back from each
    format save writes, as the trainer state it carries."""
    from ckptbench.restore import load as restore

    state = json.loads(open(os.path.join(TRAINER, "trainer_state.json"), encoding="utf-8").read())
    state["\ud800key"] = "\udfff"
    state["log_history"].append({"loss\ud800": float("nan")})
    root = _trainer(tmp_path, state)
    for fmt in ("safetensors", "torch"):
        out = tmp_path / f"out_{fmt}"
        r = run_cli("save", root, out, "--format", fmt, "--count", "1", "--keep", "1", "--results", "")
        assert r.rc == 0, r.err
        back = restore.load_state(str(out / "step-000001"), fmt).trainer["trainer_state"]
        assert back["\ud800key"] == "\udfff" and math.isnan(back["log_history"][-1]["loss\ud800"]), back
    r = run_cli("run", root, "--json", "--repeat", "1", "--results", str(tmp_path / "R.csv"))
    assert r.rc == 0 and json.loads(r.out)["status"] == "unverified", r.err


# ---- a step short of a rank, restored spread over ranks (--distributed) ----------------------------------------


def _torchrun(root, n: int = 2) -> tuple[int, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m",
                        "ckptbench", "run", str(root), "--distributed", "--repeat", "1", "--results", "", "--json"],
                       capture_output=True, text=True, timeout=240, env=env)
    return p.returncode, json.loads(p.stdout)


def test_a_megatron_iteration_short_of_a_rank_fails_spread_over_ranks(tmp_path):
    """Each rank loaded only its own rank files and checked nothing across them: status unverified, exit 0."""
    root = _megatron(tmp_path, tp=4)
    shutil.rmtree(root / "iter_0000010" / "mp_rank_03")
    rc, doc = _torchrun(root)
    assert rc != 0 and doc["status"] == "failed", doc
    assert doc["problems"] and all("tensor-parallel size 4, but mp_rank_03 is missing (3 found)" in p
                                   for p in doc["problems"]), doc["problems"]


def test_a_deepspeed_step_short_of_a_partition_fails_spread_over_ranks(tmp_path):
    from test_torch_layouts import _ds_step

    root = tmp_path / "ds"
    _ds_step(str(root), 5, n=16, ranks=3)
    (root / "zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()
    rc, doc = _torchrun(root)
    assert rc != 0 and doc["status"] == "failed", doc
    assert any("for 3 data-parallel rank(s), but rank 2's is missing (2 found)" in p for p in doc["problems"]), doc


def test_a_whole_megatron_iteration_restores_spread_over_ranks(tmp_path):
    rc, doc = _torchrun(_megatron(tmp_path, tp=2, pp=2, ep=2))
    assert rc == 0 and doc["status"] == "unverified" and not doc["problems"], doc


@pytest.mark.parametrize("extra", [{"dp_world_size": 9}, {"x": {"dp_world_size": 2}}])
def test_a_trainer_state_saying_dp_world_size_does_not_hide_a_missing_partition(tmp_path, extra):
    """Any key ending in dp_world_size counted as the ZeRO partitions' own: a trainer_state.json beside them with
    another value made the sizes disagree, the check fell back to the ranks found, and inspect passed the step."""
    from test_torch_layouts import _ds_step

    root = tmp_path / "checkpoint-5"
    _ds_step(str(root / "global_step5"), 5, n=16, ranks=3)
    (root / "latest").write_text("global_step5")
    shutil.copy(os.path.join(TRAINER, "config.json"), root)
    (root / "trainer_state.json").write_text(json.dumps({"global_step": 5, **extra}))
    (root / "global_step5" / "zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()
    needle = "for 3 data-parallel rank(s), but rank 2's is missing (2 found)"
    assert_one_line_error(run_cli("inspect", root, "--json"), needle)
    assert_one_line_error(run_cli("run", root, "--json", "--repeat", "1", "--results", ""), needle)


def test_a_trainer_state_saying_megatron_args_does_not_set_the_rank_sizes(tmp_path):
    from ckptbench.checkpoint.formats.state import CheckpointState
    from ckptbench.checkpoint.formats.torch_shards import check_complete

    folder = str(tmp_path / "iter_0000010")
    paths = [os.path.join(folder, f"mp_rank_{r:02d}", "model_optim_rng.pt") for r in range(2)]
    check_complete(paths, CheckpointState({}, extra={"trainer_state.args.tensor_model_parallel_size": 4}))
    with pytest.raises(FormatError, match="tensor-parallel size 4, but mp_rank_02 is missing"):
        check_complete(paths, CheckpointState({}, extra={"mp_rank_00.args.tensor_model_parallel_size": 4}))
