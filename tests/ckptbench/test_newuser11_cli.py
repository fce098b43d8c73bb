"""From a new user's pass (newuser11): verify, load, pack and upload given a shard in place of its folder said "no such
directory" of a file that is there, where run, inspect and check sent the user to the folder that holds it."""

from __future__ import annotations

import os

import pytest

from clirun import run_cli


@pytest.mark.parametrize("command, extra", [("verify", []), ("load", []), ("pack", ["OUT"]), ("upload", ["s3://b/p"]),
                                            ("run", []), ("inspect", [])])
def test_every_command_given_a_shard_names_the_folder_that_holds_it(ckpt, tmp_path, command, extra):
    folder = ckpt("safetensors", 1)
    shard = next(os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".safetensors"))
    r = run_cli(command, shard, *[str(tmp_path / "out") if a == "OUT" else a for a in extra])
    assert r.rc == 2 and r.err_lines == [f"ckptbench: error: {shard}: a file, not a directory; point at the "
                                         f"checkpoint directory that holds it ({folder})"], r.err
    assert not (tmp_path / "out").exists()


def test_check_advises_from_the_knee_sweep_recorded_of_a_trainers_folder(ckpt, tmp_path):
    """`sweep out --results R.csv` records the knee of the checkpoint a resume loads (out/checkpoint-7); `check out
    --results R.csv` looked for one of `out` itself and said "no measurement", its fix the very sweep just run."""
    import shutil

    from ckptbench.checklist.facts import gather

    out = tmp_path / "out"
    for n in (3, 7):
        shutil.copytree(ckpt("safetensors", 1), out / f"checkpoint-{n}")
    results = str(tmp_path / "R.csv")
    r = run_cli("sweep", out, "--levels", "1,2", "--results", results)
    assert r.rc == 0, r.err
    knee = gather(str(out), results=results).knee
    assert knee is not None and knee.knee in (1, 2) and knee.how == "sweep", knee


@pytest.mark.usefixtures("box_floor")
def test_check_takes_the_pick_its_error_offers_and_says_which_checkpoint_it_checked(ckpt, tmp_path):
    """A folder of two checkpoints: check's error said "choose one with --pick NAME", and check refused --pick as an
    unrecognized argument; given a trainer's folder it never said which checkpoint its items were about."""
    import json
    import shutil

    two = tmp_path / "two"
    for n in ("a", "b"):
        shutil.copytree(ckpt("safetensors", 1), two / n)
    r = run_cli("check", two)
    assert r.rc == 2 and "--pick NAME" in r.err, r.err
    r = run_cli("check", two, "--pick", "b", "--json")
    assert r.rc in (0, 1), r.err
    doc = json.loads(r.out)
    assert doc["layout"]["why"] == "--pick b" and [x["path"] for x in doc["layout"]["not_read"]] == ["a"]
    # the fix commands take no --pick: they name the checkpoint it chose
    fix = next(i["fix"] for i in doc["items"] if i["id"] == "concurrency")
    assert f"`ckptbench check {two / 'b'} --quick-sweep`" in fix, fix
    out = tmp_path / "out"
    for n in (3, 7):
        shutil.copytree(ckpt("safetensors", 1), out / f"checkpoint-{n}")
    r = run_cli("check", out)
    assert r.out.splitlines()[0].startswith("checked checkpoint-7 (hf-safetensors): the highest checkpoint-N of 2"), r.out
    assert "  not read: checkpoint-3 (an older checkpoint: a resume takes checkpoint-7)" in r.out.splitlines()
    md = run_cli("check", out, "--markdown").out
    assert "\nchecked checkpoint-7 (hf-safetensors): the highest checkpoint-N of 2" in md, md


@pytest.mark.parametrize("name, says", [("7B", "unknown profile '7B'; did you mean '7b'? (choose one of "),
                                        ("DIR", ": a directory, not a profile (one of ")])
def test_plan_of_a_mistyped_profile_or_a_checkpoint_folder_says_what_to_type(ckpt, name, says):
    folder = ckpt("safetensors", 1)
    r = run_cli("plan", folder if name == "DIR" else name)
    assert r.rc == 2 and len(r.err_lines) == 1 and says in r.err_lines[0], r.err
    if name == "DIR":
        assert r.err_lines[0].endswith(f"what a checkpoint on disk holds: `ckptbench inspect {folder}`"), r.err


def test_sysinfo_names_the_checkpoint_a_restore_of_the_folder_reads(ckpt, tmp_path):
    """The dashboard's header names the checkpoint of a trainer's folder (tests/tui/test_newuser11_header.py): the
    figure headless, null where the folder is the checkpoint."""
    import json
    import shutil

    out = tmp_path / "out"
    for n in (3, 7):
        shutil.copytree(ckpt("safetensors", 1), out / f"checkpoint-{n}")
    assert json.loads(run_cli("sysinfo", out, "--json").out)["checkpoint"] == "checkpoint-7"
    assert json.loads(run_cli("sysinfo", out / "checkpoint-7", "--json").out)["checkpoint"] is None
    assert "checkpoint               the source itself" in run_cli("sysinfo", out / "checkpoint-7").out


def test_read_and_run_of_one_file_say_one_file(tmp_path):
    import torch

    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"w": torch.ones(4)}, ck / "model.pt")
    r = run_cli("read", ck / "model.pt")
    assert r.rc == 0 and " in 1 file: " in r.out.splitlines()[0], r.out
    r = run_cli("run", ck, "--repeat", "1", "--results", "")
    assert r.rc == 0 and r.out.splitlines()[0].endswith(" in 1 file"), r.out


def test_saves_free_space_check_says_sizes_in_their_own_unit(tmp_path):
    """59428.5 MiB free beside 53.2 MiB needed: the free space in GiB, as every other size is said."""
    import shutil

    from ckptbench.core.units import human_bytes
    from ckptbench.save.preflight import _free_space

    check = _free_space(str(tmp_path), 53 << 20)
    free = shutil.disk_usage(tmp_path).free
    assert check.evidence.startswith(f"{human_bytes(free)} free, 53.0 MiB needed"), check.evidence


def test_load_counts_one_small_file_and_one_tensor_as_one(tmp_path):
    """load said "1 small files" (what they were, not at all) and "1 floating tensors"."""
    import json

    import torch

    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"w": torch.ones(4)}, ck / "model.pt")
    (ck / "config.json").write_text(json.dumps({"hidden": 4}))
    r = run_cli("load", ck)
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].startswith("torch: 4 parameters float32, 1 small file read beside the tensors; "), r.out
    assert "no model step: 1 floating tensor (16 B) scanned" in r.out, r.out


def test_two_cost_options_without_a_price_are_named_together(ckpt, tmp_path):
    from clirun import assert_one_line_error

    r = run_cli("run", ckpt("safetensors", 1), "--spot-discount", "0.7", "--restores-per-day", "4", "--results", "")
    assert_one_line_error(r, "--spot-discount and --restores-per-day need --price-per-hour (the RTO's cost is "
                             "priced from it): add --price-per-hour USD, or leave them out")


@pytest.mark.parametrize("storage_gbps, small", [(4.0, True), (0.0001, False)])
def test_a_sweep_over_a_floor_under_10_ms_says_its_knee_is_fixed_costs(ckpt, plant_floor, storage_gbps, small):
    """A 35 KiB sweep recommended --concurrency 1 beside a floor note saying the efficiency says little."""
    import json

    from ckptbench.system.floor import FIXED_COSTS_S

    folder = ckpt("safetensors", 1)
    plant_floor(4.0, folder, storage_gbps)
    doc = json.loads(run_cli("sweep", folder, "--levels", "1,2", "--repeat", "1", "--json").out)
    assert (doc["floor_s"] < FIXED_COSTS_S) == small, doc["floor_s"]
    last = run_cli("sweep", folder, "--levels", "1,2", "--repeat", "1").out.splitlines()[-1]
    assert last.startswith("knee: ") and ("at this size the levels differ by fixed costs" in last) == small, last


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_distributed_outside_torchrun_names_the_command_and_the_checkpoint(ckpt, monkeypatch, command):
    """`sweep --distributed` outside torchrun was told to start `ckptbench run SOURCE --distributed`."""
    from clirun import assert_one_line_error

    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    folder = ckpt("safetensors", 1)
    r = run_cli(command, folder, "--distributed", "--results", "")
    assert_one_line_error(r, f": torchrun --nproc-per-node K -m ckptbench {command} {folder} --distributed")


def test_the_dashboards_auto_tune_knee_of_a_trainers_folder_is_the_one_check_finds(ckpt, tmp_path):
    """The dashboard's auto-tune recorded its knee under the folder named, sweep under the checkpoint a resume loads
    (out/checkpoint-7): check, which looks up the latter, found one of the two."""
    import shutil

    from ckptbench.checklist.facts import gather
    from ckptbench.cli import ui
    from ckptbench.restore.autotune import AutoTune
    from ckptbench.restore.loop import Sample

    out = tmp_path / "out"
    for n in (3, 7):
        shutil.copytree(ckpt("safetensors", 1), out / f"checkpoint-{n}")
    tuner = AutoTune([1, 2, 4], settle_s=0, hold_s=1.0)
    for c, gbps in ((1, 1.74), (2, 1.91), (4, 1.80)):
        tuner.feed(Sample(c, c, 0, 0.0))
        tuner.feed(Sample(c, c, int(gbps * 1e9), 1.0))
    results = str(tmp_path / "R.csv")
    assert ui.record_knee(results, tuner, str(out)) is None
    knee = gather(str(out), results=results).knee
    assert knee is not None and knee.knee == tuner.knee and knee.how.startswith("auto-tune"), knee
