"""What the ninth new-user pass found.

`plan --nodes` took an as-is restore of files already in the page cache (residency 100 %, the run just after
another read them) as the per-rank read rate MEASURED from storage: only a hot run was passed over."""

from __future__ import annotations

import pytest

from ckptbench.plan import scale as plan_scale
from ckptbench.records import results


def _row(run_id, read_gbps, **extra) -> dict:
    return {"schema": results.SCHEMA, "kind": "restore", "run_id": run_id, "repeat": 1, "timestamp": f"t-{run_id}",
            "source": f"/ckpt/{run_id}", "status": "ok", "cache": "cold", "read_gbps": read_gbps,
            "residency_before": 0.0, "env": {}} | extra


def test_plan_passes_over_an_as_is_restore_read_from_the_page_cache(tmp_path):
    csv = str(tmp_path / "results.csv")
    results.append(csv, [_row("cold1", 0.5)])
    results.append(csv, [_row("asis_cached", 2.1, cache="as-is", residency_before=1.0)])
    m = plan_scale.measured_rank_read(csv)
    assert m["run_id"] == "cold1" and m["gbps"] == pytest.approx(0.5)
    results.append(csv, [_row("asis_cold", 0.7, cache="as-is", residency_before=0.01)])
    assert plan_scale.measured_rank_read(csv)["run_id"] == "asis_cold"  # as found, but found on the device


@pytest.mark.parametrize("fraction, text", [(0.285, "29 %"), (0.125, "13 %"), (0.0125, "1.3 %"),
                                            (-0.285, "-29 %"), (0.415, "42 %")])
def test_a_share_rounds_its_halves_up(fraction, text):
    # check's efficiency item said efficiency=28 % in its evidence (0.285, rounded there) and 29 % in its fix
    from ckptbench.core.units import human_pct

    assert human_pct(fraction) == text


def test_the_efficiency_item_says_one_figure_in_its_evidence_and_its_fix():
    from floorhelp import fixed_floor

    from ckptbench.checklist import efficiency as item
    from ckptbench.checklist.rules import evidence_text
    from ckptbench.restore.sweep import Advice

    from ckptbench.system import floor as fl

    floor = fixed_floor(populate_4k=3.0, copy=10.0)  # a hot restore: its floor needs no storage figure
    floor_s = fl.model(floor, bytes_read=600_000_000, hash_alg="none", hot=True)["floor_s"]
    # 28.54 % before rounding, 0.285 in the evidence: its text said 28 % (half to even), the fix 29 %
    probe = item.RestoreProbe(600_000_000, 1, floor_s / 0.2854, "none", "pread", 8, False, 1.0)
    v = item.judge(item.FloorFacts(floor, probe), Advice(None, "", None))
    assert v.evidence["efficiency"] == 0.285 and v.evidence["floor_s"] == pytest.approx(floor_s, abs=1e-4)
    said = evidence_text("efficiency", v.evidence["efficiency"])
    assert said == "29 %" and v.fix.startswith("at 29 % of the floor"), (said, v.fix)


def _one_interval_load(interval_s: float):
    """A job that read 8 MiB of its checkpoint inside one sample, watched at `interval_s`."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch.phases import Interval

    def iv(k, nbytes, phase, files):
        return Interval(k * interval_s, (k + 1) * interval_s, nbytes, 0, 1.0, 1.0, 1, 0.0, 1 << 28, phase, files)

    intervals = [iv(0, 0, "starting", 0), iv(1, 8 << 20, "reading", 1), iv(2, 0, "deserializing", 1)]
    return watch.WatchReport(pid=1, command="job", wall_s=3 * interval_s, bytes=8 << 20, disk_bytes=0,
                             files={"/ckpt/model.safetensors": 8 << 20}, intervals=intervals, phases=[],
                             exit_code=0, source="/ckpt", files_bytes=8 << 20, interval_s=interval_s)


@pytest.mark.parametrize("interval_s, advised", [(0.25, True), (0.02, False)])
def test_a_load_too_short_to_time_is_told_of_a_finer_interval_only_where_it_was_sampled_coarser(interval_s, advised):
    # watched with --interval 0.02, the note and the fix said to watch again with `--interval 0.02`
    from ckptbench.watch import verdict

    report = _one_interval_load(interval_s)
    note = report.reading.note
    assert "too short to time" in note and ("--interval 0.02" in note) == advised, note
    v = verdict.judge(report, verdict.StorageProbe(2.0, "cold (verified)", 1, 8 << 20), cpus=2, mem_total=64 << 30)
    assert v.verdict == "unknown" and "mark the load" in v.fix, (v.verdict, v.why, v.fix)
    assert ("--interval 0.02" in v.fix) == advised and ("--interval 0.02" in v.why) == advised, v
    assert v.fix.endswith("watch it with `--interval 0.02`, the files cold" if advised else "watch it with the files "
                          "cold"), v.fix


def test_a_watchs_floor_is_said_to_the_millisecond_as_its_parts_are():
    # 'floor: 0.00 s, bound by fresh memory (2.99 GB/s populated); fresh memory 0.003 s + page cache 0.001 s'
    from ckptbench.cli.watch import floor_lines

    doc = {"floor_s": 0.0042, "binding": "fresh memory", "binding_gbps": 2.99, "binding_how": "populated",
           "floor_times_s": {"fresh memory": 0.0031, "page cache": 0.0011}, "floor_note": "the read was from the page "
           "cache; every part on the cores, one after the other, so the parts add up"}
    lines = floor_lines(doc)
    assert lines[0].startswith("floor: 0.004 s, bound by fresh memory (2.99 GB/s populated)"), lines
    assert "fresh memory 0.003 s + page cache 0.001 s" in lines[0] and len(lines) == 3, lines
    assert floor_lines({"floor_s": None, "floor_note": "not measured"}) == ["floor: not measured"]
    assert floor_lines({}) == []
    from ckptbench.watch.verdict import floor_sentence

    assert "(floor 0.004 s, bound by fresh memory" in floor_sentence(doc | {"efficiency": 0.5}), floor_sentence(doc)


def test_an_ambiguity_below_the_folder_named_says_the_pick_that_chooses_from_it():
    # `run light` said "light/checkpoints: 2 Lightning checkpoints (epoch=1-step=100.ckpt, ...); choose one with
    # --pick NAME (a .ckpt file) or point at it": --pick epoch=1-step=100.ckpt was 'no such folder in light', and a
    # .ckpt file cannot be pointed at (a file, not a directory)
    from ckptbench.checkpoint.resume import choose
    from ckptbench.core.errors import CkptbenchError

    rels = ["checkpoints/epoch=1-step=50.ckpt", "checkpoints/epoch=1-step=100.ckpt"]
    with pytest.raises(CkptbenchError) as exc:
        choose("light", rels)
    said = str(exc.value)
    assert said.startswith("light/checkpoints: 2 Lightning checkpoints") and said.endswith(
        "choose one with --pick checkpoints/NAME (a .ckpt file)"), said
    assert choose("light", rels, pick="checkpoints/epoch=1-step=100.ckpt").tag == "epoch=1-step=100.ckpt"
    dcp = [f"run/{d}/{f}" for d in ("a", "b") for f in (".metadata", "__0_0.distcp")]
    with pytest.raises(CkptbenchError) as exc:
        choose("out", dcp)
    assert str(exc.value).endswith("2 DCP checkpoints (a, b) and nothing saying which a resume loads; choose one "
                                   "with --pick run/NAME or point at it"), exc.value
    with pytest.raises(CkptbenchError) as exc:
        choose("out/run", [r.removeprefix("run/") for r in dcp])
    assert str(exc.value).endswith("--pick NAME or point at it"), exc.value


def test_a_lightning_file_picked_is_named_by_the_file(tmp_path):
    # inspect said "picked the checkpoint at the top" of a .ckpt chosen at the top, and run "restored checkpoints"
    # of one chosen below: the folder, not the checkpoint
    import torch
    from clirun import run_cli

    folder = tmp_path / "light" / "checkpoints"
    folder.mkdir(parents=True)
    for step in (50, 100):
        torch.save({"epoch": 1, "global_step": step, "state_dict": {"model.w": torch.ones(4, 4) * step}},
                   folder / f"epoch=1-step={step}.ckpt")
    r = run_cli("inspect", folder, "--pick", "epoch=1-step=100.ckpt")
    assert r.rc == 0 and r.out.splitlines()[0] == "picked epoch=1-step=100.ckpt: --pick epoch=1-step=100.ckpt", r.out
    r = run_cli("load", tmp_path / "light", "--pick", "checkpoints/epoch=1-step=50.ckpt")
    assert r.rc == 0 and r.out.startswith("restored checkpoints/epoch=1-step=50.ckpt (lightning): "), r.out
