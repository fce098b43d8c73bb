"""New-user pass 14, the checklist and the box: `check --quick-sweep` reads as `sweep` does by default and says what
each rate is of; the advice to measure names the command that feeds check; notes name the real path; mount options
once; `--drop-caches` with a cache that is not cold is refused; positionals have help."""

from __future__ import annotations

import argparse
import json

import pytest
from clirun import assert_one_line_error, run_cli

from ckptbench.checklist import facts as facts_mod
from ckptbench.checklist import rules
from ckptbench.checklist.facts import Facts
from ckptbench.cli import root
from ckptbench.cli.settings import read_options
from ckptbench.restore.sweep import MeasuredKnee
from ckptbench.system import probes


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("nu14") / "ck pt"  # a space: every command said must quote it
    r = run_cli("gen", "small", d, "--scale", "0.02")
    assert r.rc == 0, r.err
    return str(d)


def test_the_quick_sweep_reads_as_sweep_does_by_default(small, monkeypatch):
    """It read with pread (ReadOptions' own default) while `sweep` read direct (`--read auto`, cold): the two
    advised different knees."""
    import ckptbench.restore.sweep as sweep_mod

    seen = []
    real = sweep_mod.sweep

    def spy(src, levels, **kw):
        seen.append(kw.get("opts"))
        return real(src, [1], **kw)

    monkeypatch.setattr(sweep_mod, "sweep", spy)
    monkeypatch.setattr(facts_mod, "SAMPLE_S", 0.0)
    facts_mod.gather(small, quick_sweep=True, probe_cache=False)
    as_sweep = read_options(root.build_parser().parse_args(["sweep", small]))
    assert seen == [as_sweep]
    assert (as_sweep.read, as_sweep.hash) == ("auto", "none")


def test_the_concurrency_evidence_says_what_its_rates_are_of():
    sweep = {"gbps": {"8": {"median": 2.31}}, "knee": 8, "best": 8, "read": "direct", "hash": "none",
             "date": "2025-01-31 12:00"}
    f = Facts(source="/ckpt", concurrency=8, sweep=sweep,
              knee=MeasuredKnee("/ckpt", 8, 8, {8: 2.31}, "quick sweep", "2025-01-31 12:00"))
    ev = rules.concurrency(f).evidence
    assert (ev["read"], ev["hash"], ev["into"]) == ("direct", "none", "reused buffers (a read's)")
    line = rules.evidence_line(ev)
    assert line.index("gbps_at_knee") < line.index("read=direct") < line.index("into=reused buffers")
    from ckptbench.checklist import efficiency

    assert efficiency.FRESH_WORDS == "fresh memory (a restore's)"


@pytest.mark.usefixtures("box_floor")
def test_check_json_says_each_rate_is_of_what(small):
    r = run_cli("check", small, "--quick-sweep", "--json", "--results", "")
    assert r.rc in (0, 1), r.err
    items = {i["id"]: i for i in json.loads(r.out)["items"]}
    conc = items["concurrency"]["evidence"]
    assert conc["into"] == "reused buffers (a read's)" and conc["read"] in ("direct", "pread")
    eff = items["efficiency"]["evidence"]
    if "into" in eff:  # the short restore ran (a floor could be measured here)
        assert eff["into"] == "fresh memory (a restore's)"
    opts = items["mount_options"]["evidence"].get("options")
    if opts:
        words = opts.split(",")
        assert len(words) == len(set(words)), opts


def test_the_advice_to_measure_is_the_command_that_feeds_check():
    """`ckptbench sweep` alone records nothing, and check kept saying "no measurement"."""
    f = Facts(source="/data/my ckpt", concurrency=8, results="/r dir/results.csv")
    doc = rules.report(f.source, [rules.concurrency(f)])
    fix = doc["items"][0]["fix"]
    assert "`ckptbench sweep '/data/my ckpt' --results '/r dir/results.csv'`" in fix
    assert "'/r dir/results.csv'.jsonl" in fix
    assert "`ckptbench check '/data/my ckpt' --quick-sweep`" in fix


@pytest.mark.usefixtures("box_floor")
def test_a_sweep_recorded_as_advised_is_what_check_then_reads(small, tmp_path):
    results = str(tmp_path / "results.csv")
    r = run_cli("sweep", small, "--levels", "1,2", "--repeat", "1", "--results", results)
    assert r.rc == 0, r.err
    r = run_cli("check", small, "--json", "--results", results)
    conc = next(i for i in json.loads(r.out)["items"] if i["id"] == "concurrency")
    assert "(sweep of" in conc["evidence"]["basis"]


def test_sweeps_floor_note_names_the_checkpoint(small, monkeypatch):
    import ckptbench.restore.sweep as sweep_mod

    real = sweep_mod.Sweep.result  # what the sweep command shows, whole or interrupted

    def noted(self):
        res = real(self)
        res.floor["floor_note"] = "low: `ckptbench floor SOURCE --remeasure` when the box is quiet"
        return res

    monkeypatch.setattr(sweep_mod.Sweep, "result", noted)
    r = run_cli("sweep", small, "--levels", "1", "--repeat", "1")
    assert r.rc == 0, r.err
    assert f"`ckptbench floor '{small}' --remeasure`" in r.out and "SOURCE" not in r.out
    r = run_cli("sweep", small, "--levels", "1", "--repeat", "1", "--json")
    assert f"`ckptbench floor '{small}' --remeasure`" in json.loads(r.out)["floor_note"]


def test_a_floor_note_is_the_command_that_was_run():
    from ckptbench.cli.box import again

    note = "busy: these figures may be low; `ckptbench floor SOURCE --remeasure` when it is quiet"
    args = argparse.Namespace(source=None, write_to="/tmp/saves here", pick=None)
    assert "`ckptbench floor --write-to '/tmp/saves here' --remeasure`" in again(note, args)
    args = argparse.Namespace(source="/ck pt", write_to=None, pick=None)
    assert "`ckptbench floor '/ck pt' --remeasure`" in again(note, args)


def test_mount_options_are_said_once():
    assert probes.options_once("rw,relatime,rw,discard,relatime") == "rw,relatime,discard"
    assert probes.options_once(None) is None


@pytest.mark.parametrize("cache", ["hot", "as-is"])
def test_drop_caches_with_a_cache_that_is_not_cold_is_refused(small, cache):
    assert_one_line_error(run_cli("run", small, "--cache", cache, "--drop-caches"), "--drop-caches with --cache")
    assert_one_line_error(run_cli("read", small, "--cache", cache, "--drop-caches"), "add --cache cold")


def test_positional_arguments_say_what_they_are():
    sub = next(a for a in root.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for cmd, dest in (("tui", "source"), ("gen", "profile"), ("gen", "directory"), ("history", "results")):
        action = next(a for a in sub.choices[cmd]._actions if a.dest == dest)
        assert action.help, (cmd, dest)


def test_a_read_plan_of_one_file_says_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    r = run_cli("inspect", tmp_path)
    assert r.rc == 0, r.err
    assert "read plan: 1 file, " in r.out
