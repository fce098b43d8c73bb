"""A new user's save and pack: `pack` leaves the files a loader opens by name where they are and refuses an empty
folder as every command does; `save` saves the checkpoint a resume loads from a trainer's folder (or `--pick`'s) and
names the source's real format in its optimizer note; the sustained throughput is one figure (bytes over the median
time after the first save) in save's text, its JSON and plan."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import warnings
from types import SimpleNamespace

import pytest
from clirun import assert_one_line_error, run_cli

COMPAT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compat", "fixtures")

# what transformers' tokenizer.save_pretrained writes beside the model (tokenizers' JSON, trimmed to a tiny vocab)
TOKENIZER = {
    "tokenizer.json": {"version": "1.0", "truncation": None, "padding": None,
                       "added_tokens": [{"id": 0, "content": "<unk>", "single_word": False, "lstrip": False,
                                         "rstrip": False, "normalized": False, "special": True}],
                       "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                                             "trim_offsets": True, "use_regex": True},
                       "post_processor": None, "decoder": {"type": "ByteLevel"},
                       "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                                 "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                                 "ignore_merges": False, "vocab": {"<unk>": 0, "a": 1, "b": 2, "ab": 3},
                                 "merges": [["a", "b"]]}},
    "tokenizer_config.json": {"added_tokens_decoder": {"0": {"content": "<unk>", "lstrip": False, "normalized": False,
                                                             "rstrip": False, "single_word": False, "special": True}},
                              "clean_up_tokenization_spaces": False, "model_max_length": 32,
                              "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"},
    "special_tokens_map.json": {"unk_token": "<unk>"},
}


def _compat(name: str, dest) -> str:
    """A checkpoint the library itself wrote (tests/compat/fixtures), copied without the test's expected.json."""
    root = os.path.join(str(dest), name)
    shutil.copytree(os.path.join(COMPAT, name), root, ignore=shutil.ignore_patterns("expected.json"))
    return root


def _save_pretrained(tmp_path) -> str:
    """A save_pretrained folder as transformers writes it: config, generation config, weights, tokenizer files."""
    root = _compat("hf_safetensors", tmp_path)
    for name, doc in TOKENIZER.items():
        with open(os.path.join(root, name), "w") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return root


def _tail(root: str, n: int = 6) -> list[str]:
    """Small files a loader never opens by name: a data loader's positions in a folder of their own."""
    os.makedirs(os.path.join(root, "dataloader"))
    rels = [f"dataloader/rank000_worker{i:04d}.idx" for i in range(n)]
    for i, rel in enumerate(rels):
        with open(os.path.join(root, rel), "wb") as f:
            f.write(bytes([i + 1]) * (100 + i))
    return rels


# --- 1. pack leaves what a loader opens by name ------------------------------------------------------------------

def test_pack_keeps_a_save_pretrained_folder_loadable(h, tmp_path):
    src = _save_pretrained(tmp_path)
    tail = _tail(src)
    before = h.files_under(src)
    out = tmp_path / "packed"
    r = run_cli("pack", src, out, "--target-files", "2")
    assert r.rc == 0, r.err
    assert "kept as files" in r.out and "config.json" in r.out
    got = h.files_under(out)
    for name in ("config.json", "generation_config.json", "model.safetensors", *TOKENIZER):
        assert got[name] == before[name], name  # where from_pretrained and AutoTokenizer open them, unchanged
    assert not set(tail) & set(got)  # the data loader's files went into the packs
    man = h.read_manifest(out)
    members = {rel for index in man["packs"].values() for rel in index}
    assert members == set(tail)
    assert {e["path"] for e in man["files"] if e["kind"] == "small"} == {"config.json", "generation_config.json",
                                                                          *TOKENIZER}
    from safetensors.torch import load_file

    want = load_file(os.path.join(src, "model.safetensors"))
    have = load_file(os.path.join(out, "model.safetensors"))
    assert want.keys() == have.keys() and all((want[k] == have[k]).all() for k in want)
    assert run_cli("verify", out).rc == 0
    back = tmp_path / "back"
    assert run_cli("unpack", out, back).rc == 0
    assert {k: v for k, v in h.files_under(back).items() if k != h.MANIFEST} == before


@pytest.mark.parametrize("fixture", ["hf_sharded", "hf_bin", "peft_lora", "accelerate_state"])
def test_every_file_a_library_wrote_stays_where_its_loader_opens_it(h, tmp_path, fixture):
    """The libraries' own folders (tests/compat/fixtures, written by transformers, peft, accelerate): packed beside
    a data loader's tail, every file they wrote is still a file at its path, byte for byte (from_pretrained and
    load_state open them by name); only the tail is packed."""
    src = _compat(fixture, tmp_path)
    wrote = h.files_under(src)
    tail = _tail(src)
    out = tmp_path / "packed"
    assert run_cli("pack", src, out).rc == 0
    got = h.files_under(out)
    assert all(got.get(rel) == data for rel, data in wrote.items()), sorted(set(wrote) - set(got))
    assert not set(tail) & set(got)


def test_pack_of_a_folder_with_only_files_a_loader_opens_writes_nothing(h, tmp_path):
    """A save_pretrained folder and a Trainer's output folder hold nothing pack may move: one line, nothing written."""
    for name, src in (("pretrained", _save_pretrained(tmp_path)), ("trainer", _compat("trainer_outdir", tmp_path))):
        before = h.snapshot(src)
        out = tmp_path / f"out-{name}"
        r = run_cli("pack", src, out)
        assert_one_line_error(r, "nothing to pack")
        assert "config.json" in r.err
        assert not os.path.lexists(out) and h.snapshot(src) == before
        assert not [n for n in os.listdir(tmp_path) if n.startswith(f".out-{name}")]


def test_pack_of_a_trainer_folder_keeps_every_checkpoint_whole(h, tmp_path):
    src = _compat("trainer_outdir", tmp_path)
    logs = os.path.join(src, "runs", "events")
    os.makedirs(logs)
    for i in range(3):
        with open(os.path.join(logs, f"log{i}.txt"), "w") as f:
            f.write("step loss\n" * (i + 1))
    before = h.files_under(src)
    out = tmp_path / "packed"
    assert run_cli("pack", src, out).rc == 0
    got = h.files_under(out)
    for rel, data in before.items():
        if rel.startswith("checkpoint-"):  # trainer_state.json, config.json, … beside each step's weights
            assert got[rel] == data, rel
    man = h.read_manifest(out)
    assert {rel for index in man["packs"].values() for rel in index} == {f"runs/events/log{i}.txt" for i in range(3)}


def test_a_generated_checkpoint_keeps_its_config_and_packs_its_data_loader_state(h, ckpt, tmp_path):
    src = ckpt("safetensors", 2)
    out = tmp_path / "packed"
    assert run_cli("pack", src, out).rc == 0
    got, man = h.files_under(out), h.read_manifest(out)
    members = {rel for index in man["packs"].values() for rel in index}
    assert members and all(rel.startswith("dataloader/") for rel in members)
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= set(got)
    r = run_cli("load", out, "--json")
    assert r.rc == 0 and json.loads(r.out)["ok"] is True, r.err


def test_check_says_what_packing_keeps_loadable():
    from ckptbench.checklist.rules import small_files

    f = SimpleNamespace(preset=None, sizes=[1000] * 2000, files=2000, bytes=2_000_000, open_rate=None, packable=None,
                        source="/ckpt")
    it = small_files(f)
    assert it.verdict == "warn" and it.fix.startswith("ckptbench pack /ckpt PACKED --target-files 4")
    for said in ("by name", "config.json", "tokenizer", "from_pretrained", "stay files", "ckptbench unpack"):
        assert said in it.fix, said


# --- 2. pack refuses an empty folder ------------------------------------------------------------------------------

def test_pack_of_an_empty_folder_is_run_s_line_and_writes_nothing(h, tmp_path):
    src = tmp_path / "empty"
    src.mkdir()
    out = tmp_path / "sub" / "out"
    r = run_cli("pack", src, out)
    assert_one_line_error(r, "empty: the directory holds no files; point at a checkpoint directory")
    assert r.err_lines == run_cli("run", src).err_lines  # the line every other command says
    assert h.listing(tmp_path) == ["empty"]


# --- 3. save takes the checkpoint a resume loads --------------------------------------------------------------------

def _dcp(directory, seed: int) -> dict:
    """A DCP checkpoint as a training loop writes it (torch's dcp.save): the model's state and a plain AdamW's,
    which keys its state by parameter index. Returns the model's weights."""
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id=str(directory),
                 no_dist=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _saved_model(step_dir) -> dict:
    from safetensors.torch import load_file

    out = {}
    for n in sorted(os.listdir(step_dir)):
        if n.startswith("model") and n.endswith(".safetensors"):
            out |= load_file(os.path.join(step_dir, n))
    return out


def _same(saved: dict, weights: dict) -> bool:
    ends = {k.split("model.", 1)[-1]: v for k, v in saved.items()}
    return set(ends) == set(weights) and all((ends[k] == weights[k]).all() for k in weights)


@pytest.fixture(scope="module")
def trainer_dcp(tmp_path_factory):
    """ckpts/dcp holding step-50 and step-100, each a DCP checkpoint of different weights."""
    root = tmp_path_factory.mktemp("trainer") / "ckpts" / "dcp"
    weights = {step: _dcp(root / f"step-{step}", seed=step) for step in (50, 100)}
    return root, weights


def test_save_of_a_trainer_folder_saves_the_step_a_resume_loads(trainer_dcp, tmp_path):
    root, weights = trainer_dcp
    r = run_cli("save", root, tmp_path / "t", "--count", "1", "--results", "", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert any("step-100" in n and "highest" in n for n in doc["notes"]), doc["notes"]
    assert _same(_saved_model(tmp_path / "t" / "step-000001"), weights[100])
    r = run_cli("inspect", root)
    assert r.rc == 0 and "step-100" in r.out  # the same pick as inspect's


def test_save_takes_pick(trainer_dcp, tmp_path):
    root, weights = trainer_dcp
    r = run_cli("save", root, tmp_path / "t", "--count", "1", "--results", "", "--pick", "step-50", "--json")
    assert r.rc == 0, r.err
    assert any("--pick step-50" in n for n in json.loads(r.out)["notes"])
    assert _same(_saved_model(tmp_path / "t" / "step-000001"), weights[50])
    assert_one_line_error(run_cli("save", "small", tmp_path / "u", "--pick", "x"), "drop --pick")
    assert not os.path.lexists(tmp_path / "u")


def test_save_of_a_generated_dcp_under_a_step_folder(ckpt, tmp_path):
    """The report's case: `gen --format dcp` into ckpts/dcp/step-100, then `save ckpts/dcp`."""
    root = tmp_path / "ckpts" / "dcp"
    shutil.copytree(ckpt("dcp", 2), root / "step-100")
    r = run_cli("save", root, tmp_path / "t", "--count", "1", "--results", "")
    assert r.rc == 0, r.err
    assert "step-100" in r.out and ".metadata: cannot open" not in r.err


def test_save_of_a_folder_where_nothing_says_which_is_one_line(trainer_dcp, tmp_path):
    src = tmp_path / "two"
    for name in ("a", "b"):
        shutil.copytree(trainer_dcp[0] / "step-50", src / name)
    r = run_cli("save", src, tmp_path / "t")
    assert_one_line_error(r, "--pick")
    assert not os.path.lexists(tmp_path / "t")  # said before the target was made


def test_the_optimizer_note_names_dcp_for_a_dcp_source(trainer_dcp, tmp_path):
    root, _ = trainer_dcp
    r = run_cli("save", root / "step-100", tmp_path / "t", "--count", "1", "--results", "", "--json")
    assert r.rc == 0, r.err
    note = next(n for n in json.loads(r.out)["notes"] if "NOT saved" in n)
    assert "DCP" in note and "safetensors" not in note


# --- 4. one sustained throughput ----------------------------------------------------------------------------------

def _timing(i, nbytes, durable):
    from ckptbench.save.report import SaveTiming

    return SaveTiming(i, f"step-{i:06d}", nbytes, durable, durable / 2, durable, False)


def test_sustained_is_the_bytes_over_the_median_time_after_the_first():
    from ckptbench.save.analysis import sustained

    saves = [_timing(1, 10**9, 9.0), _timing(2, 10**9, 1.0), _timing(3, 10**9, 2.0)]
    gbps, durable = sustained(saves)
    assert durable == 1.5
    assert gbps == pytest.approx(1 / 1.5)  # the median of the two rates would be 0.75


def test_save_text_json_and_plan_give_one_figure(tmp_path, capsys):
    from ckptbench.cli.save import print_report
    from ckptbench.records import results
    from ckptbench.save.analysis import analyze
    from ckptbench.save.report import SaveOptions

    opts = SaveOptions(count=3, interval_s=60.0)
    saves = [_timing(1, 10**9, 9.0), _timing(2, 10**9, 1.0), _timing(3, 10**9, 2.0)]
    report = analyze(str(tmp_path), opts, saves, [], [], None, [])
    assert report.to_json()["sustained_gbps"] == pytest.approx(1 / 1.5)
    print_report(report)
    assert "sustained durable throughput 0.667 GB/s" in capsys.readouterr().out
    path = tmp_path / "R.csv"
    env = {"date": "2024-01-01T00:00:00"}
    results.append(str(path), [
        {"schema": results.SCHEMA, "kind": "save", "run_id": "s1", "repeat": t.index, "timestamp": env["date"],
         "source": "small", "format": "safetensors", "mode": "sync", "status": "ok", "target": str(tmp_path),
         "bytes": t.bytes, "durable_s": t.durable_s, "write_gbps": t.bytes / t.durable_s / 1e9, "env": env}
        for t in saves])
    r = run_cli("plan", "small", "--interval", "60", "--results", path, "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["save"]["measured"]["sustained_gbps"] == pytest.approx(1 / 1.5)
    hist = json.loads(run_cli("history", path, "--json").out)
    run = next(x for x in (hist if isinstance(hist, list) else hist["runs"]) if x["run_id"] == "s1")
    assert 10**9 / run["figure_s"] / 1e9 == pytest.approx(1 / 1.5)  # history's median time gives the same rate


def test_a_no_fsync_series_is_not_headlined_durable(tmp_path, capsys):
    """--no-fsync: each time ends at the rename, with the bytes perhaps only in memory; the headline said
    "sustained durable throughput" above a note saying they were not."""
    from ckptbench.cli.save import print_report
    from ckptbench.save.analysis import analyze
    from ckptbench.save.report import SaveOptions

    saves = [_timing(1, 10**9, 9.0), _timing(2, 10**9, 1.0), _timing(3, 10**9, 2.0)]
    print_report(analyze(str(tmp_path), SaveOptions(count=3, fsync=False), saves, [], [], None, []))
    out = capsys.readouterr().out
    assert "durable throughput" not in out and "until durable" not in out
    assert "sustained throughput, not durable (--no-fsync) 0.667 GB/s" in out and "(rename time × 1.25)" in out


def test_a_real_series_reports_bytes_over_its_median_time(tmp_path):
    r = run_cli("save", "small", tmp_path / "t", "--scale", "0.02", "--count", "3", "--results", "", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    after = doc["saves"][1:]
    assert doc["sustained_gbps"] == pytest.approx(doc["bytes"] / statistics.median(s["durable_s"] for s in after) / 1e9)
