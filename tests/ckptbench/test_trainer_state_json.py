"""A Hugging Face Trainer's trainer_state.json is state its resume loads (TrainerState.load_from_json: the global step
it skips the data to, the epoch, the best checkpoint, the log history), so the restore parses it and keeps it under
`trainer_state.`, from the checkpoints transformers itself wrote (tests/compat/fixtures). One a resume cannot parse
was restored as sound: it is one line now, from run, inspect and a distributed rank alike."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from clirun import run_cli

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compat", "fixtures")


def _checkpoint(tmp_path, name: str = "trainer_outdir", sub: str = "checkpoint-10") -> str:
    dst = str(tmp_path / name)
    shutil.copytree(os.path.join(FIXTURES, name, sub), dst, symlinks=True)
    return dst


def _one_line(r, *needles) -> str:
    assert r.rc != 0 and r.out == "", (r.rc, r.out)
    assert "Traceback" not in r.err and len(r.err_lines) == 1, r.err
    for n in needles:
        assert n in r.err_lines[0], r.err_lines[0]
    return r.err_lines[0]


@pytest.mark.parametrize("name, sub", [("trainer_outdir", "checkpoint-10"), ("trainer_fsdp_sharded", "checkpoint-2")])
def test_the_trainer_state_comes_back_as_the_file_holds_it(tmp_path, name, sub):
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    root = _checkpoint(tmp_path, name, sub)
    with open(os.path.join(root, "trainer_state.json")) as f:
        saved = json.load(f)
    listing = LocalSource(root, checkpoint=True).list()
    state = restore.load_state(listing.source, listing.format, lay=listing.layout)
    assert state.extra["trainer_state.global_step"] == saved["global_step"] > 0
    assert state.extra["trainer_state.max_steps"] == saved["max_steps"]
    for i, entry in enumerate(saved["log_history"]):
        for k, v in entry.items():
            assert state.extra[f"trainer_state.log_history.{i}.{k}"] == v


def test_inspect_counts_the_trainer_state_among_the_other_entries(tmp_path):
    root = _checkpoint(tmp_path)
    before = json.loads(run_cli("inspect", root, "--json").out)
    with open(os.path.join(root, "trainer_state.json"), "w") as f:
        json.dump({"global_step": 10, "extra_counter": [1, 2, 3]}, f)
    after = json.loads(run_cli("inspect", root, "--json").out)
    # the fixture's file holds more fields than these five; the torch.save state files' entries are the same
    assert before["layout"]["other_entries"] - after["layout"]["other_entries"] > 5


@pytest.mark.parametrize("raw, needle", [
    (b'{"global_step": 10, "epoch": ', "not JSON (Expecting value at line 1"),  # truncated by a failed copy
    (b"\xff\xfe{}", "byte 0 is not UTF-8 text"),
    (b"[1, 2]", "holds a JSON list, not the object"),
    (b"", "not JSON"),
    (b"[" * 200_000 + b"]" * 200_000, "nested deeper than JSON parsers follow"),
    (b'{"global_step": ' + b"9" * 5000 + b"}", "not JSON"),  # past Python's integer digit limit
])
def test_a_trainer_state_a_resume_cannot_parse_is_one_line(tmp_path, raw, needle):
    root = _checkpoint(tmp_path)
    with open(os.path.join(root, "trainer_state.json"), "wb") as f:
        f.write(raw)
    for cmd in (("run", root, "--json", "--repeat", "1", "--results", str(tmp_path / "R.csv")),
                ("inspect", root, "--json")):
        line = _one_line(run_cli(*cmd), "trainer_state.json", needle)
        assert "re-copy the checkpoint" in line


def test_a_trainer_state_nested_past_the_depth_bound_is_one_line(tmp_path):
    """Parsed (under the parser's own recursion limit), then refused by flatten's bound on depth."""
    root = _checkpoint(tmp_path)
    with open(os.path.join(root, "trainer_state.json"), "w") as f:
        f.write('{"log_history": ' + "[" * 300 + "]" * 300 + "}")
    _one_line(run_cli("run", root, "--json", "--repeat", "1", "--results", str(tmp_path / "R.csv")),
              "trainer_state.json: ", "'trainer_state.log_history.0.0", "nested deeper than 32 levels")


def test_a_trainer_torch_state_file_whose_keys_flatten_to_one_name_is_one_line(tmp_path):
    """scheduler.pt holding {"a.b": 1, "a": {"b": 2}}: two values its load_state_dict reads, one flat key here (the
    later silently won, as in trainer_state.json before); refused as a foreign torch.save's clash is."""
    import torch

    root = _checkpoint(tmp_path)
    torch.save({"last_epoch.x": 1, "last_epoch": {"x": 2}}, os.path.join(root, "scheduler.pt"))
    _one_line(run_cli("run", root, "--json", "--repeat", "1", "--results", str(tmp_path / "R.csv")),
              "scheduler.pt", "'scheduler.last_epoch.x' appears twice once the nesting is flattened")
