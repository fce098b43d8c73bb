"""From a new user's pass (round 3): a hot torch.load watched by PID was counted as 16 MiB of its 288 MiB (the
file was open at one sample only, and the reads after it came from the page cache, fetching nothing); `sysinfo`
needed a SOURCE and `compare` a RESULTS that `history` defaults; run and save given `--results ''` printed an id never
recorded, or no document at all; `run model.safetensors` was not sent to its folder; a watch at a tiny interval made
a 900-character phase line; compare gave an efficiency's change as a relative percent."""

from __future__ import annotations

import pytest

from clirun import run_cli


def _iv(t0, t1, nbytes, files, phase="reading"):
    from ckptbench.watch import sampler as watch

    return watch.Interval(t0, t1, nbytes, 0, 0.3, 0.3, 0, 0.0, 1 << 30, phase, ckpt_files=files)


# watch: read calls from the page cache beside the interval that saw the file open are the load's

def test_a_hot_read_load_the_watch_saw_open_once_is_counted_whole():
    from ckptbench.watch import sampler as watch

    mib = 1 << 20
    intervals = [_iv(0.0, 0.25, 9 * mib, 0, "starting"), _iv(0.25, 0.5, 0, 0, "waiting"),
                 _iv(0.5, 0.75, 16 * mib, 1), _iv(0.75, 1.0, 272 * mib, 0), _iv(1.0, 1.25, 0, 0, "waiting")]
    report = watch.WatchReport(pid=1, command="job", wall_s=1.25, bytes=0, disk_bytes=0,
                               files={"/ckpt/ckpt.pt": 288 * mib}, intervals=intervals, phases=[], interval_s=0.25)
    t0, t1 = report.window
    assert watch.window_bytes(intervals, t0, t1) == 288 * mib
    assert 0.5 <= t0 and t1 <= 1.0


def test_read_calls_beside_the_load_stop_once_its_files_are_in():
    """The imports before the open and a log after the load are not the load's: the files' bytes are all in."""
    from ckptbench.watch.window import reading_window

    mib = 1 << 20
    intervals = [_iv(0.0, 0.25, 9 * mib, 0, "starting"), _iv(0.25, 0.5, 100 * mib, 1), _iv(0.5, 0.75, 200 * mib, 0),
                 _iv(0.75, 1.0, 30 * mib, 0)]
    w = reading_window(intervals, [], 0.25, 0, 300 * mib)
    assert w.t0 >= 0.25 and w.t1 <= 0.75
    # without the files' size (a caller that passes none) read calls alone never widen it
    assert reading_window(intervals, [], 0.25).t1 <= 0.5


# sysinfo: the system panel's figures need no checkpoint

def test_sysinfo_without_a_source_gives_the_box_and_the_current_directorys_mount(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    r = run_cli("sysinfo", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["source"] is None and doc["mount_point"] and "mem_available_bytes" in doc and "floor" in doc
    r = run_cli("sysinfo")
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].split() == ["source", "none:", "the", "mount", "below", "is", "the", "current",
                                             "directory's"]


# compare: its results file defaults as history's does, and a missing one is the same line

def test_compare_takes_results_csv_by_default_and_says_a_missing_one_as_history_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c, h = run_cli("compare"), run_cli("history")
    assert c.rc == h.rc == 2
    assert c.err_lines == h.err_lines == ["ckptbench: error: results.csv: no such results file; `ckptbench run`, "
                                          "`save` and `watch` write one (--results PATH), or name the one they wrote"]


# run and save with --results '': the document --json prints, its run id null (nothing on record to name)

def test_run_and_save_json_unrecorded_say_run_id_null(tmp_path, ckpt, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    ck = ckpt("safetensors", 1)
    r = run_cli("run", ck, "--repeat", "1", "--json", "--results", "")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["record"] == "run" and doc["kind"] == "restore" and doc["run_id"] is None
    r = run_cli("save", ck, tmp_path / "saves", "--count", "1", "--json", "--results", "")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert (doc["record"], doc["kind"], doc["run_id"], doc["schema"]) == ("run", "save", None, 3), list(doc)[:6]
    assert doc["saves"] and "env" in doc
    assert not (tmp_path / "results.csv").exists()


# a restore pointed at one of its files is sent to the folder that holds it

def test_run_of_a_checkpoint_file_names_the_folder_that_holds_it(ckpt):
    import os

    shard = next(os.path.join(ckpt("safetensors", 1), n) for n in sorted(os.listdir(ckpt("safetensors", 1)))
                 if n.endswith(".safetensors"))
    for command in ("run", "inspect", "check"):
        r = run_cli(command, shard)
        assert r.rc == 2 and r.err_lines == [f"ckptbench: error: {shard}: a file, not a directory; point at the "
                                             f"checkpoint directory that holds it ({ckpt('safetensors', 1)})"], r.err


# watch: a phase line a tiny --interval alternates 40 times is each phase's total

def test_a_watch_phase_line_of_many_runs_gives_each_phases_total():
    from ckptbench.cli.watch import PHASES_SHOWN, phases_line

    few = [{"phase": "reading", "t0": 0.0, "t1": 0.5}, {"phase": "waiting", "t0": 0.5, "t1": 0.75}]
    assert phases_line(few) == "phases: reading 0.50 s → waiting 0.25 s"
    many = [{"phase": ("reading", "deserializing")[k % 2], "t0": k * 0.01, "t1": (k + 1) * 0.01} for k in range(40)]
    line = phases_line(many)
    assert len(many) > PHASES_SHOWN and "→" not in line and len(line) < 120, line
    assert line == "phases: 40 runs, in total reading 0.20 s, deserializing 0.20 s (each run in --json)"


# compare: the efficiency's change in percentage points, every other figure's as a percent of the baseline

@pytest.mark.parametrize("figure, base, new, pct, text", [
    ("efficiency", 1.10, 0.93, -15.45, "-17 pts"), ("efficiency", 0.50, 0.53, 6.0, "+3.0 pts"),
    ("rto_s", 0.243, 0.251, 3.46, "+3.5 %"), ("efficiency", None, 0.9, None, ""),
])
def test_compare_says_an_efficiencys_change_in_points(figure, base, new, pct, text):
    from ckptbench.records.deltas import change_text

    assert change_text(pct, figure, base, new) == text
