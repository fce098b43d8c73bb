"""From a new user's pass 19 over the README and docs, with checkpoints `gen` wrote and ones the libraries wrote
(tests/compat/fixtures): `check` told the user "`--remeasure` reads them again", a flag `check` does not take."""

from __future__ import annotations

import dataclasses
import shlex

from clirun import run_cli


def _plant_kept_storage(plant_floor, source) -> None:
    """The mount's storage figure kept from `source`'s own files, from a full sample (as `floor SOURCE` keeps it for
    a checkpoint of 64 MiB or more): the case whose note offers to read them again."""
    from ckptbench.sources import open_source
    from ckptbench.system import floor as fl
    from ckptbench.system.ceilings import files_key

    f = plant_floor(source=source, storage_gbps=2.0)
    listing = open_source(str(source)).list()
    f.storage = dataclasses.replace(f.storage, of_files=files_key([(x.path, x.size or 0) for x in listing.files]))
    fl._save(fl.cache_path(), f, {})


def test_checks_note_on_a_kept_storage_figure_names_a_command_that_takes_remeasure(ckpt, plant_floor):
    """`check SOURCE`'s efficiency item said "the storage figure was read from this checkpoint's files 25 s ago and
    kept: `--remeasure` reads them again"; `check SOURCE --remeasure` is refused (exit 2, "unrecognized arguments").
    The note names `ckptbench floor SOURCE --remeasure`, with the checkpoint filled in."""
    source = ckpt("safetensors", 1)
    _plant_kept_storage(plant_floor, source)
    r = run_cli("check", source)
    notes = [line for line in r.out.splitlines() if "read from this checkpoint's files" in line]
    assert len(notes) == 1, r.out
    assert f"`ckptbench floor {shlex.quote(source)} --remeasure` reads them again" in notes[0], notes[0]
    assert run_cli("floor", source, "--remeasure", "--json").rc == 0  # the command it names takes the flag
    assert run_cli("check", source, "--remeasure").rc == 2  # the one it seemed to name does not


def test_floor_and_checks_markdown_name_the_command_in_full(ckpt, plant_floor):
    """`floor SOURCE` and `check --markdown` say the same note with the command in full (the placeholder never
    shows)."""
    source = ckpt("safetensors", 1)
    _plant_kept_storage(plant_floor, source)
    r = run_cli("floor", source)
    assert r.rc == 0, r.err
    assert f"`ckptbench floor {shlex.quote(source)} --remeasure` reads them again" in r.out, r.out
    assert not [line for line in r.out.splitlines() if "note:" in line and "SOURCE" in line], r.out
    md = run_cli("check", source, "--markdown")
    assert f"`ckptbench floor {shlex.quote(source)} --remeasure` reads them again" in md.out, md.out


def test_a_saves_missing_write_figure_names_the_target_just_saved_to(tmp_path):
    """`save small /tmp/.../saves` ended "floor: no write figure for this mount: `ckptbench floor --write-to DIR`
    measures it": the user had just named the directory; the command names it (quoted for a shell)."""
    import json

    target = tmp_path / "my saves"
    r = run_cli("save", "small", target, "--scale", "0.02", "--count", "1", "--results", "", "--json")
    assert r.rc == 0, r.err
    note = json.loads(r.out)["floor_note"]
    assert f"`ckptbench floor --write-to {shlex.quote(str(target))}` measures it" in note, note
    assert "DIR" not in note, note


def test_a_watch_verdicts_fix_names_the_checkpoint_it_sends_to_sweep():
    """A watch of a safetensors load under `--source /tmp/.../small` ended "fix: read with more concurrency ...;
    `ckptbench sweep` shows the concurrency where this storage stops gaining": `sweep` without a SOURCE is refused.
    The fix names the checkpoint (--source, else the folder of the files seen read)."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    waiting = watch.Interval(0.0, 1.0, 100 << 20, 0, 0.3, 0.3, 0, 0.0, 1 << 30, "reading")
    probe = verdict.StorageProbe(2.0, "cold (verified)", 1, 100 << 20)
    named = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=100 << 20, disk_bytes=0, files={},
                              intervals=[waiting], phases=[], source="/data/my ckpt")
    v = verdict.judge(named, probe, cpus=2, mem_total=64 << 30)
    assert v.verdict == "loader-parallelism-bound", v
    assert "`ckptbench sweep '/data/my ckpt'` shows the concurrency" in v.fix, v.fix
    seen = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=100 << 20, disk_bytes=0,
                             files={"/data/run/model.safetensors": 100 << 20}, intervals=[waiting], phases=[])
    v = verdict.judge(seen, probe, cpus=2, mem_total=64 << 30)
    assert "`ckptbench sweep /data/run` shows" in v.fix, v.fix


def test_history_does_not_call_one_repeats_time_a_median(tmp_path, ckpt):
    """`history` of a one-repeat run read "1 repeat  median RTO 9.61 ms": a single time quoted as a median. One
    repeat's line gives its RTO as such, `median_of` 1 in --json; three repeats' say median, `median_of` 3."""
    import json

    results = str(tmp_path / "r.csv")
    source = ckpt("safetensors", 1)
    assert run_cli("run", source, "--repeat", "1", "--results", results).rc == 0
    assert run_cli("run", source, "--repeat", "3", "--results", results).rc == 0
    r = run_cli("history", results)
    assert r.rc == 0, r.err
    one, three = r.out.splitlines()
    assert "  1 repeat  RTO " in one and "median" not in one, one
    assert "  3 repeats  median RTO " in three, three
    runs = json.loads(run_cli("history", results, "--json").out)["runs"]
    assert [x["median_of"] for x in runs] == [1, 3], runs
