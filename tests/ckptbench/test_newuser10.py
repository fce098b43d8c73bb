"""New-user pass 10: verify and sweep refuse a folder that holds no checkpoint as run does; compare's change in
points is the difference of the percents it shows; a watch's efficiency is in history and compare; save's shortest
safe interval is said to the millisecond."""

from __future__ import annotations

import os

import pytest
from clirun import assert_one_line_error, run_cli


def _texts(tmp_path) -> str:
    """A folder that holds no checkpoint: a note and a model card."""
    d = tmp_path / "notes"
    d.mkdir()
    (d / "a.txt").write_text("hello\n")
    (d / "README.md").write_text("# a model\n")
    return str(d)


@pytest.mark.parametrize("cmd", [("verify",), ("sweep", "--levels", "1,2", "--repeat", "1")])
def test_verify_and_sweep_refuse_a_folder_of_text_files_as_run_does(tmp_path, cmd):
    """verify read such a folder whole and said NOT VERIFIED, exit 3 (as of a checkpoint with no manifest: /etc was
    315 files "read and their digests computed"); sweep read it cold at every level and gave a knee to use."""
    notes = _texts(tmp_path)
    ran = run_cli("run", notes, "--repeat", "1", "--results", "")
    assert_one_line_error(ran, "no safetensors, torch or torch.distributed.checkpoint files found")
    results = tmp_path / "r.csv"
    r = run_cli(cmd[0], notes, *cmd[1:], *(("--results", results) if cmd[0] == "sweep" else ()))
    assert_one_line_error(r)
    assert r.err == ran.err
    assert not os.path.exists(f"{results}.jsonl")  # no knee recorded for check to advise from


# compare: the change in points between the percents as shown

@pytest.mark.parametrize("base, new, text", [
    (0.666, 0.502, "-17 pts"),  # shown 67 % and 50 %: it read "-16 pts" from the unrounded 0.164
    (0.6660413832047697, 0.5018786766370683, "-17 pts"),  # a new user's two runs, as recorded
    (0.054, 0.5, "+45 pts"), (0.0544, 0.0555, "+0.2 pts"),  # shown 5.4 % and 5.6 %
])
def test_an_efficiencys_change_is_the_difference_of_the_percents_shown(base, new, text):
    from ckptbench.core.units import human_pct
    from ckptbench.records.deltas import change_text

    assert change_text(None, "efficiency", base, new) == text, (human_pct(base), human_pct(new))


# history and compare: a watch's efficiency, as its document records it

def _watch_doc(tmp_path, span: float, floor: float, size: int = 100 << 20) -> dict:
    shard = str(tmp_path / "ck" / "model.safetensors")
    return {"bytes": size, "files": {shard: size}, "io_span_s": span, "loader_gbps": size / span / 1e9,
            "peak_rss_bytes": 1 << 28, "cpu_s": 1.0, "exit_code": 0, "floor_s": floor, "efficiency": floor / span,
            "binding": "storage", "command": ["python", "load.py"]}


def test_history_and_compare_give_a_watchs_efficiency(tmp_path):
    import json

    from ckptbench.system.env import snapshot
    from ckptbench.watch.results import record

    results = str(tmp_path / "r.csv")
    env = snapshot(str(tmp_path))
    record(results, "w1", _watch_doc(tmp_path, 0.5, 0.2), env)  # 40 %
    record(results, "w2", _watch_doc(tmp_path, 1.0, 0.2), env)  # 20 %
    r = run_cli("history", results, "--json")
    assert r.rc == 0, r.err
    assert [run["efficiency"] for run in json.loads(r.out)["runs"]] == pytest.approx([0.4, 0.2])
    r = run_cli("history", results)
    assert "efficiency 40 %" in r.out and "efficiency 20 %" in r.out, r.out
    r = run_cli("compare", results, "--baseline", "w1", "--json")
    eff = next(f for f in json.loads(r.out)["figures"] if f["figure"] == "efficiency")
    assert (eff["baseline"]["median"], eff["newest"]["median"]) == pytest.approx((0.4, 0.2))
    r = run_cli("compare", results, "--baseline", "w1")
    assert "-20 pts" in r.out, r.out


# save: the shortest safe interval in the unit that keeps it

def test_save_says_a_short_safe_interval_as_it_is_not_as_zero(tmp_path):
    """A save of 220 KiB durable in 3 ms: 'shortest safe interval 0.00 s' (the dashboard's '0.0 s') beside saves
    timed to the millisecond."""
    from tui.screens.save import summary

    r = run_cli("save", "small", tmp_path / "t", "--scale", "0.001", "--count", "2", "--results", "")
    assert r.rc == 0, r.err
    line = next(ln for ln in r.out.splitlines() if "shortest safe interval" in ln)
    said = line.split("shortest safe interval ")[1].split(" (durable")[0]
    assert said not in ("0.00 s", "0.000 s") and (said.endswith(" ms") or float(said.split()[0]) > 0), line
    assert "shortest safe interval 4.06 ms" in str(summary({"shortest_safe_interval_s": 0.00406}))
    assert "shortest safe interval 12.500 s" in str(summary({"shortest_safe_interval_s": 12.5}))


# a loop's counter beside the state dicts is no model weight

def test_a_step_saved_beside_the_state_dicts_is_not_a_model_weight(tmp_path):
    """dcp.save({"model": …, "optim": …, "step": torch.tensor(7)}): the step was grouped with the weights (one
    parameter more, an int64 among the model's dtypes) and `save` wrote it into the model's file, where a resume's
    load_state_dict(strict=True) refuses the unexpected key."""
    import json
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(2, 16)).sum().backward()
    opt.step()
    src = tmp_path / "ck"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": net.state_dict(), "optim": opt.state_dict(), "step": torch.tensor(7)},
                 checkpoint_id=str(src), no_dist=True)
    r = run_cli("inspect", src, "--json")
    assert r.rc == 0, r.err
    groups = json.loads(r.out)["groups"]
    params = sum(p.numel() for p in net.parameters())
    assert groups["model"]["params"] == params and set(groups["model"]["dtypes"]) == {"float32"}, groups
    assert groups["other"]["tensors"] == 1, groups
    (tmp_path / "t").mkdir()
    r = run_cli("save", src, tmp_path / "t" / "s", "--format", "torch", "--count", "1", "--results", "")
    assert r.rc == 0, r.err
    model = torch.load(next((tmp_path / "t" / "s").glob("step-*/model_rank000.pt")), weights_only=True)
    net.load_state_dict(model, strict=True)  # the weights, and nothing a model does not hold


# load: what the model check ran, in the text as in --json

def test_load_says_the_steps_its_check_ran(tmp_path):
    """`load --optimizer-step` printed 'check passed' as `load` did: only --json's optimizer_step said the step ran,
    and where there was no optimizer state to step, nothing said it did not."""
    from ckptbench.cli.checkpoints import _what_ran
    from ckptbench.restore.load import CheckReport

    ck = tmp_path / "ck"
    assert run_cli("gen", "small", ck, "--scale", "0.02").rc == 0
    r = run_cli("load", ck, "--optimizer-step")
    assert r.rc == 0, r.err
    assert "one forward step: output finite; one optimizer step: the master weights moved" in r.out, r.out
    r = run_cli("load", ck)
    assert "one forward step: output finite" in r.out and "optimizer step" not in r.out, r.out
    bare = CheckReport(True, 10, {"weights": "bfloat16"}, True, None, (), False)
    assert _what_ran(bare, True).endswith("no optimizer step: the checkpoint holds no optimizer state to step")


# check: every rate in its evidence line with its unit

def test_checks_concurrency_rates_carry_their_unit():
    """The concurrency item's evidence read `gbps_at_current=2.118, gbps_at_knee=2.167` beside the efficiency item's
    `measured_gbps=0.74 GB/s`, in the text, the Markdown and the dashboard alike."""
    from ckptbench.checklist.rules import evidence_line

    line = evidence_line({"knee": 4, "gbps_at_current": 2.118, "gbps_at_knee": None, "measured_gbps": 0.74})
    assert line == "knee=4, gbps_at_current=2.12 GB/s, gbps_at_knee=unknown, measured_gbps=0.74 GB/s", line


# the checkpoint picked is named once

def test_the_checkpoint_picked_is_named_once_in_the_line_that_says_why(tmp_path):
    """'picked checkpoint-6: checkpoint-6: the highest checkpoint-N of 2, …' (run: 'restored checkpoint-6
    (hf-trainer): checkpoint-6: …'), where layouts.md shows 'restored checkpoint-10 (hf-trainer): the highest …'."""
    import shutil

    gen = tmp_path / "g"
    assert run_cli("gen", "small", gen, "--scale", "0.02").rc == 0
    out = tmp_path / "out"
    for n in (3, 6):
        shutil.copytree(gen, out / f"checkpoint-{n}")
    r = run_cli("inspect", out)
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].startswith("picked checkpoint-6: the highest checkpoint-N of 2"), r.out
    r = run_cli("verify", out)
    assert r.out.splitlines()[0].startswith("checking checkpoint-6 (hf-safetensors): the highest checkpoint-N"), r.out
    nested = tmp_path / "runs"
    shutil.copytree(out, nested / "outputs")  # several levels: each named with its reason
    r = run_cli("inspect", nested)
    assert r.out.splitlines()[0].startswith("picked outputs/checkpoint-6: outputs: the only folder"), r.out


def test_compare_says_a_floor_moved_with_the_bytes_held_to_it(tmp_path):
    """Two watches of loaders that read 40 MiB and 283 MiB of one checkpoint: 'this box's floor for the restore:
    0.031 s → 0.219 s (the box itself did more or less; …)', where the box had not changed, the bytes had."""
    import json

    from ckptbench.system.env import snapshot
    from ckptbench.watch.results import record

    results = str(tmp_path / "r.csv")
    env = snapshot(str(tmp_path))
    record(results, "w1", _watch_doc(tmp_path, 0.5, 0.03, 40 << 20), env)
    record(results, "w2", _watch_doc(tmp_path, 1.0, 0.2, 280 << 20), env)
    r = run_cli("compare", results, "--baseline", "w1")
    assert "bytes: 40.0 MiB → 280.0 MiB (the floor is sized on them)" in r.out, r.out
    assert "or other bytes were held to it" in r.out, r.out
    r = run_cli("compare", results, "--baseline", "w1", "--json")
    assert json.loads(r.out)["env_diff"]["bytes"] == [40 << 20, 280 << 20]
    record(results, "w3", _watch_doc(tmp_path, 1.0, 0.2, 280 << 20), env)  # the same bytes: no such line
    r = run_cli("compare", results, "--baseline", "w2")
    assert "bytes:" not in r.out, r.out


# save: a step it cannot carry is said

def test_save_says_its_step_is_not_the_sources_where_the_optimizer_is_left_out(tmp_path):
    """A Trainer's checkpoint-1 with model.safetensors (no model order, so its optimizer state is left out): the
    saves' manifests said step 0, and no note said the source's step had gone with the optimizer."""
    import json

    from test_hf_trainer import _write_trainer_dir

    root = tmp_path / "checkpoint-1"
    _write_trainer_dir(str(root), "safetensors", tmp_path / "MARKER")
    r = run_cli("save", root, tmp_path / "t", "--count", "1", "--results", "", "--json")
    assert r.rc == 0, r.err
    notes = json.loads(r.out)["notes"]
    assert any(n.startswith("the saves' step (their manifest's `step`) is 0, not the source's") for n in notes), notes
    manifest = json.loads(next((tmp_path / "t").glob("step-*/ckptbench.json")).read_text())
    assert manifest["step"] == 0


# --pick . where the top holds no checkpoint

def test_pick_dot_on_a_folder_whose_checkpoints_are_all_below_names_them(tmp_path):
    """A Trainer's output_dir with no final model: `--pick .` was run's 'no safetensors, torch or … files found;
    point at a checkpoint directory', said of the folder the user had pointed at."""
    import shutil

    gen = tmp_path / "g"
    assert run_cli("gen", "small", gen, "--scale", "0.02").rc == 0
    out = tmp_path / "out"
    for n in (3, 6):
        shutil.copytree(gen, out / f"checkpoint-{n}")
    for cmd in ("inspect", "run"):
        r = run_cli(cmd, out, "--pick", ".", *(("--results", "") if cmd == "run" else ()))
        assert_one_line_error(r, f"--pick '.': no checkpoint files at the top in {out}; choose one of checkpoint-3, "
                                 "checkpoint-6")
    shutil.copytree(gen, out, dirs_exist_ok=True)  # a final model at the top: '.' restores it
    r = run_cli("inspect", out, "--pick", ".")
    assert r.rc == 0 and r.out.startswith("picked the checkpoint at the top: --pick ."), r.out


# history: a save run counts saves

@pytest.mark.parametrize("kind, n, said", [("save", 2, "2 saves"), ("save", 1, "1 save"), ("restore", 3, "3 repeats")])
def test_history_counts_a_save_runs_saves_as_saves(kind, n, said):
    """'c64c725c8b56  save  …  sync  2 repeats  median durable after the first save 0.776 s': a save run's are saves,
    as its cut-short line ('cut short after 3 of 20 saves') and save's own output count them."""
    from ckptbench.cli.history import run_line

    r = {"run_id": "abc", "kind": kind, "date": "2026-12-07T06:32:29", "source": "/ck", "mode": "sync", "cache": "",
         "repeats": n, "cancelled": 0, "figure": "durable_s" if kind == "save" else "rto_s", "figure_s": 0.5,
         "held_s": None, "steady": kind == "save", "efficiency": None, "status": "ok", "unseen": False}
    line = run_line(r)
    assert f"  {said}  median " in line, line


# the dashboard's history: a save run's time is on the screen

def test_the_dashboards_history_gives_a_save_runs_time():
    """The history screen's 'RTO s' column was '-' for a save run (it has no RTO), beside '-' for its rate: the
    median time until durable, which `ckptbench history` gives, was nowhere on the screen."""
    from tui.screens.history import time_cell

    save = {"figure": "durable_s", "figure_s": 0.776, "steady": True, "rto_s": None}
    assert time_cell(save) == "0.776 (durable after the first save)"
    assert time_cell({"figure": "rto_s", "figure_s": 0.514, "rto_s": 0.514}) == "0.514"
    assert time_cell({"figure": "rto_s", "figure_s": None, "rto_s": None}) == "-"  # a watch that saw no read


# docs/distributed.md: the binding line it quotes is plan's

def test_the_binding_line_distributed_md_quotes_is_the_one_plan_prints(tmp_path):
    """The page quoted `binding: aggregate at 24.00 GB/s; the storage saturates at 2 nodes`, a line plan no longer
    prints (it says 'the storage's aggregate at 24.0 GB/s', and 7b on FSx for Lustre saturates at 5 nodes)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "distributed.md").read_text()
    quoted = re.search(r"The line `(binding:[^`]*)`", page.replace("\n", " ")).group(1)
    r = run_cli("plan", "7b", "--nodes", "32", "--storage", "fsx-lustre", "--node-memory", "5.26", "--results",
                tmp_path / "none.csv")
    assert r.rc == 0, r.err
    assert quoted in r.out, (quoted, r.out)


# a cold floor without its storage figure gives no efficiency, and says nothing of one

def test_a_floor_that_gives_no_efficiency_does_not_say_the_efficiency_says_little(plant_floor):
    """An S3 demo restore of 18 MiB: 'no network figure … so no efficiency is given' and, on the next line, 'a floor
    under 10 ms counts the bytes alone: … so the efficiency says little'."""
    from ckptbench.system import floor as fl

    floor = plant_floor(40.0)  # the box's figures, no storage figure: a cold restore's floor is partial
    assert floor.storage is None
    doc = fl.restore_fields(floor, bytes_read=1 << 20, measured_s=0.1, hash_alg="crc32c")
    assert doc["efficiency"] is None and "so no efficiency is given" in doc["floor_note"], doc
    assert "the efficiency says little" not in doc["floor_note"], doc["floor_note"]
    hot = fl.restore_fields(floor, bytes_read=1 << 20, measured_s=0.1, hash_alg="crc32c", hot=True)
    assert hot["efficiency"] is not None and "the efficiency says little" in hot["floor_note"], hot
