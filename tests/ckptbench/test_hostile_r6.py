"""Hostile checkpoints, sixth round: `save` from a crafted source and into a crafted target, profiles, and what the
fifth round left open. Each input is made by the real library (torch.save, safetensors, torch.distributed.checkpoint)
and then crafted; bad input is one line naming what and where, and a non-zero exit."""

from __future__ import annotations

import os

import pytest
import torch

from clirun import assert_one_line_error


@pytest.mark.parametrize("how", ["fifo", "link"])
def test_a_dcp_folder_whose_metadata_is_not_a_file_names_it(tmp_path, h, how):
    """Shards torch wrote beside a `.metadata` that is a FIFO (or a link) was 'no safetensors, torch or
    torch.distributed.checkpoint files found': the one file that makes it a DCP checkpoint was there, passed over and
    never read, and the line sent the user looking for files that are present."""
    ck, _ = h.dcp_saved(tmp_path / "ck", {"w": torch.randn(8, 8)})
    os.replace(os.path.join(ck, ".metadata"), tmp_path / "meta")
    if how == "fifo":
        os.mkfifo(os.path.join(ck, ".metadata"))
    else:
        os.symlink(tmp_path / "meta", os.path.join(ck, ".metadata"))
    more = {"run": ("--repeat", "1", "--results", ""), "save": (tmp_path / "target", "--count", "1")}
    for cmd in ("inspect", "run", "load", "save"):
        r = h.run_cli(cmd, ck, *more.get(cmd, ()))
        assert_one_line_error(r, ".metadata")
        assert "no safetensors" not in r.err and "never read" in r.err, (cmd, r.err)
        assert ("a FIFO" if how == "fifo" else "symbolic link") in r.err, (cmd, r.err)
    assert not (tmp_path / "target").exists()


def _save(h, target, *extra):
    return h.run_cli("save", "small", target, "--scale", "0.02", "--no-fsync", "--results", "", *extra)


def test_a_folder_under_the_staging_name_is_never_removed(tmp_path, h):
    """A `.step-000001.tmp-HOST-PID` folder is let into the target as a killed save's leftover; when it held this
    process's pid (a container's pids repeat), mkdir failed and the cleanup removed the folder that was there, with
    whatever it held: nothing the save did not write is deleted. The save goes on under another staging name."""
    from ckptbench.checkpoint.generate import staging_name

    target = tmp_path / "t"
    target.mkdir()
    there = staging_name(str(target / "step-000001"))
    os.mkdir(there)
    with open(os.path.join(there, "kept.txt"), "w") as f:
        f.write("not the save's\n")
    r = _save(h, target, "--count", "1")
    assert r.rc == 0, r.err
    with open(os.path.join(there, "kept.txt")) as f:
        assert f.read() == "not the save's\n"
    assert sorted(os.listdir(target)) == sorted(["step-000001", os.path.basename(there)])


def test_a_step_folder_whose_manifest_is_a_link_is_not_a_save(tmp_path, h):
    """A `step-NNNNNN` folder whose `ckptbench.json` is a link (to a real save's manifest elsewhere) counted as a save
    ckptbench wrote, since the check followed the link, and --keep removed it with the user's files in it. Save
    writes its manifest as a regular file: anything else is the user's, refused and left as it was."""
    other = tmp_path / "other"
    assert _save(h, other, "--count", "1").rc == 0
    target = tmp_path / "t"
    (target / "step-000001").mkdir(parents=True)
    (target / "step-000001" / "evals.txt").write_text("the user's evals\n")
    os.symlink(other / "step-000001" / "ckptbench.json", target / "step-000001" / "ckptbench.json")
    r = _save(h, target, "--count", "2", "--keep", "1")
    assert_one_line_error(r, "step-000001")
    assert sorted(os.listdir(target / "step-000001")) == ["ckptbench.json", "evals.txt"]
    assert sorted(os.listdir(target)) == ["step-000001"]


def test_save_and_load_of_a_source_beyond_memory_stop_before_reading(tmp_path, h, monkeypatch):
    """`run` stops before reading a checkpoint that cannot fit in memory; `save SOURCE` and `load` read it whole
    with no such check: a 64 GiB sparse shard on a 23 GiB box was a MemoryError traceback (or the OOM killer, a
    little smaller). Now the same line as run's, before the target exists."""
    import psutil
    from safetensors.torch import save_file

    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"w": torch.randn(512, 512)}, str(ck / "model.safetensors"), metadata={"format": "pt"})
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=256 << 10))
    for cmd, more in (("save", (tmp_path / "target", "--count", "1", "--results", "")), ("load", ())):
        r = h.run_cli(cmd, ck, *more)
        assert_one_line_error(r, "is available; stop before reading")
        assert str(ck) in r.err and "MemoryError" not in r.err, (cmd, r.err)
    assert not (tmp_path / "target").exists()


SMALL_TOML = os.path.join(os.path.dirname(__file__), "..", "..", "profiles", "checkpoints", "small.toml")


def _profile(tmp_path, old: str, new: str, prefix: str = "") -> str:
    with open(SMALL_TOML) as f:
        text = f.read()
    assert old in text
    path = tmp_path / "p.toml"
    path.write_text(prefix + text.replace(old, new, 1))
    return str(path)


@pytest.mark.parametrize("old, new, prefix, needle", [
    ("", "", "a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep"),
    ('weights = "bfloat16"', "weights = { a = 1 }", "", "dtypes.weights"),
    ('format = "safetensors"', "format = [1]", "", "checkpoint.format"),
    ('name = "small"', 'name = "\\u001b]0;pwned\\u0007x"', "", "name"),
    ('name = "small"', "name = 7", "", "name"),
    ('name = "small"', 'name = "' + "n" * 5000 + '"', "", "name"),
    ('description = "Laptop-sized: about 256 MiB in tens of files"', 'description = "\\u001b[2J wiped"', "",
     "description"),
    ("reference = false", 'reference = "false"', "", "reference"),
], ids=["deep", "dtype-table", "format-list", "name-escapes", "name-number", "name-long", "description-escapes",
        "reference-string"])
def test_a_hostile_profile_toml_is_one_line(tmp_path, h, old, new, prefix, needle):
    """A checkpoint profile given as a .toml path is checked as a storage preset is: nested past any profile was a
    RecursionError traceback, a dtype given as a table a TypeError ('unhashable type'), a name holding ESC]0;…BEL
    retitled the terminal from plan's first line, and reference = "false" (a string) made a real-model shape."""
    path = _profile(tmp_path, old, new, prefix)
    for cmd, more in (("plan", ()), ("gen", (tmp_path / "out",))):
        r = h.run_cli(cmd, path, *more)
        assert_one_line_error(r, needle)
        assert "\x1b" not in r.err and len(r.err) < 600, (cmd, r.err)
    assert not (tmp_path / "out").exists()


def test_a_profile_toml_that_is_not_a_small_regular_file_is_refused_unread(tmp_path, h):
    """A profile is a few lines: a file of megabytes is no profile, and is not read whole."""
    path = _profile(tmp_path, "", "", "# " + "x" * (4 << 20) + "\n")
    assert_one_line_error(h.run_cli("plan", path), "not a checkpoint profile")


def test_the_shipped_profiles_still_load():
    from ckptbench.checkpoint import profiles

    for name in profiles.available():
        assert profiles.load(name).name == name


@pytest.mark.parametrize("args, needle", [
    (["--interval", "1e-320"], "--interval"),
    (["--interval", "1e300"], "--interval"),
    (["--nodes", "2", "--storage", "efs", "--node-memory", "1e-300"], "--node-memory"),
])
def test_plan_figures_no_plan_can_mean_are_one_line(h, args, needle):
    """`plan 70b --interval 1e-320` was an OverflowError traceback (the bandwidth it needs is infinite), --interval
    1e300 printed a rate of 300 zeros, and --node-memory 1e-300 an RTO floor of 10^302 s: held to the bounds save's
    own --interval has (a week) and to a rate a node can have."""
    r = h.run_cli("plan", "70b", *args)
    assert_one_line_error(r, needle)
    r = h.run_cli("plan", "70b", *args, "--json")
    assert_one_line_error(r, needle)
