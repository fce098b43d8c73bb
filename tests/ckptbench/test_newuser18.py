"""From a new user's pass over a Trainer's output_dir and a Lightning checkpoints folder (each written by its library:
tests/compat/fixtures): a first run's last line sent the user to `compare`, which could only refuse; `--pick` of one
of two Lightning .ckpt files side by side listed the other as "not read" twice; a watch of a Trainer resume whose
2 MiB were read between two samples said "read 2.0 MiB in 0.00 s of reading: 0.00 GB/s", gave "the loader got
0.00 GB/s" as its verdict and recorded an RTO of 0 s."""

from __future__ import annotations

import json
import os
import shutil

from clirun import run_cli

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compat", "fixtures")


def _copy(name: str, dest) -> str:
    root = os.path.join(str(dest), name)
    shutil.copytree(os.path.join(FIXTURES, name), root, ignore=shutil.ignore_patterns("expected.json"))
    return root


def _recorded(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("recorded: "))


def test_a_first_run_is_not_sent_to_a_compare_that_refuses(tmp_path):
    """The Trainer's output_dir restored once, then cold: each first of its kind offered `compare`, which exited 2
    ("no earlier restore run ... to be its default baseline"); the next like it names the run it is held against."""
    src, results = _copy("trainer_outdir", tmp_path), str(tmp_path / "r.csv")
    first = run_cli("run", src, "--repeat", "1", "--results", results)
    assert first.rc == 0, first.err
    said = _recorded(first.out)
    assert "no earlier run like it is on record" in said and "--baseline RUN" in said, said
    assert f"`ckptbench history {results}`" in said
    assert run_cli("compare", results).rc == 2  # what the line had sent the user to
    cold = run_cli("run", src, "--repeat", "1", "--cache", "cold", "--results", results)
    assert "no earlier run like it is on record" in _recorded(cold.out)
    assert run_cli("compare", results).rc == 2  # as-is before, cold now: compare has no default baseline
    again = run_cli("run", src, "--repeat", "1", "--cache", "cold", "--results", results)
    base = next(line.split()[2] for line in cold.out.splitlines() if line.startswith("recorded: "))
    assert f"`ckptbench compare {results}` holds it against {base}, the last one like it" in _recorded(again.out)
    assert run_cli("compare", results).rc in (0, 1)


def test_picking_one_of_two_lightning_checkpoints_lists_the_other_once(tmp_path):
    """Two .ckpt files of one ModelCheckpoint (Lightning wrote one; the other is its copy at another step, as
    every_n_train_steps=1 leaves them): the one not picked was one of the top's files and one of the picked file's
    folder, and inspect and run said "not read: epoch=0-step=1.ckpt (not picked (--pick))" twice."""
    root = _copy("lightning_ckpt_max", tmp_path)
    folder = os.path.join(root, "checkpoints")
    shutil.copy(os.path.join(folder, "epoch=0-step=2.ckpt"), os.path.join(folder, "epoch=0-step=1.ckpt"))
    for cmd in (("inspect",), ("run", "--repeat", "1", "--results", str(tmp_path / "r.csv"))):
        r = run_cli(*cmd, folder, "--pick", "epoch=0-step=2.ckpt")
        assert r.rc == 0, r.err
        passed = [line for line in r.out.splitlines() if line.strip().startswith("not read:")]
        assert passed == ["  not read: epoch=0-step=1.ckpt (not picked (--pick))"], r.out


def _between_samples(src: str):
    """A watch of a hot Trainer resume of `src`'s files: 6 s of imports at 0.25 s samples, its read calls (a few MiB
    of modules) too slow for a load's, and the checkpoint files read and let go between two samples: their pages
    say it read them, no interval held one."""
    from ckptbench.watch import sampler as watch

    files = {os.path.join(src, n): os.path.getsize(os.path.join(src, n)) for n in sorted(os.listdir(src))}
    ivs = [watch.Interval(k * 0.25, (k + 1) * 0.25, 64 << 10, 0, 1.0, 1.0, 1, 0.0, 300 << 20, "starting")
           for k in range(24)]
    total = sum(files.values())
    return watch.WatchReport(pid=1, command="python resume.py", wall_s=6.0, bytes=total, disk_bytes=0, files=files,
                             intervals=ivs, phases=[], unseen=sorted(files), files_bytes=total, interval_s=0.25,
                             source=src, residency_first=dict.fromkeys(files, 1.0))


def test_a_watch_that_saw_no_read_of_the_bytes_it_counts_gives_no_rate_and_no_rto(tmp_path, capsys):
    from ckptbench.cli import watch as cli_watch
    from ckptbench.records.results import read_rows
    from ckptbench.system import env as envmod
    from ckptbench.watch import results, verdict

    src = os.path.join(_copy("trainer_outdir", tmp_path), "checkpoint-10")
    report = _between_samples(src)
    assert report.io_span_s == 0 and report.bytes > 0
    assert "too short to time" in report.reading.note and "--interval 0.02" in report.reading.note
    v = verdict.judge(report, verdict.StorageProbe(0.8, "cold (verified)", 1, report.bytes), cpus=2,
                      mem_total=24 << 30)
    assert v.verdict == "unknown" and "0.00 GB/s" not in v.why and "rate is unknown" in v.why, v
    assert "ckptbench check" not in v.fix and "mark the load" in v.fix, v.fix
    # --json as the text: no rate where no window timed the read (it gave loader_gbps 0.0)
    assert report.to_json()["loader_gbps"] is None and v.evidence["loader_gbps"] is None
    doc = report.to_json() | {"verdict": None, "floor_s": None, "floor_note": "unknown"}
    cli_watch._print(doc)
    out = capsys.readouterr().out
    assert "0.00 GB/s" not in out and "in 0.00 s of reading" not in out, out
    assert "untimed: no sample saw it read" in out, out
    path = str(tmp_path / "r.csv")
    results.record(path, "w1", report.to_json(), envmod.snapshot(str(tmp_path)))
    row = read_rows(path)[-1]
    assert row["rto_s"] is None and row["read_s"] is None and row["read_gbps"] is None, row


def test_check_says_which_checkpoints_files_left_the_page_cache(tmp_path):
    """check of a Trainer's output_dir reads the checkpoint a resume takes cold, not the older ones beside it; its
    note said the output_dir's files had left the page cache."""
    from ckptbench.system.pagecache import residency_of

    out = _copy("trainer_outdir", tmp_path)
    older = os.path.join(out, "checkpoint-3", "optimizer.pt")
    open(older, "rb").read()
    before = residency_of([older])
    r = run_cli("check", out)
    note = next(line for line in r.err.splitlines() if line.startswith("note: "))
    assert note.startswith(f"note: {os.path.join(out, 'checkpoint-10')}'s files were read cold"), note
    assert residency_of([older]) == before > 0  # checkpoint-3 was not read: its pages stay


def test_a_watch_whose_reads_fit_in_one_sample_gives_bounds_not_a_rate_and_no_rto(tmp_path, capsys):
    """from_pretrained of a Trainer's checkpoint at --interval 0.02: its reads fit in one sample. The floor said "too
    short to time" and the verdict "at least 0.05 GB/s", while the headline gave "in 0.04 s of reading: 0.05 GB/s"
    and the row recorded the sample's length as the RTO."""
    from ckptbench.cli import watch as cli_watch
    from ckptbench.records.results import read_rows
    from ckptbench.system import env as envmod
    from ckptbench.watch import results
    from ckptbench.watch import sampler as watch

    src = os.path.join(_copy("trainer_outdir", tmp_path), "checkpoint-10")
    files = {os.path.join(src, n): os.path.getsize(os.path.join(src, n)) for n in sorted(os.listdir(src))}
    total = sum(files.values())
    ivs = [watch.Interval(0.0, 0.02, 0, 0, 1.0, 1.0, 1, 0.0, 300 << 20, "starting"),
           watch.Interval(0.02, 0.04, total, 0, 1.0, 1.0, 1, 0.0, 300 << 20, "reading", ckpt_files=1),
           watch.Interval(0.04, 0.06, 0, 0, 1.0, 1.0, 1, 0.0, 300 << 20, "deserializing")]
    report = watch.WatchReport(pid=1, command="python load.py", wall_s=0.06, bytes=total, disk_bytes=total,
                               files=files, intervals=ivs, phases=[], interval_s=0.02, source=src)
    doc = report.to_json()
    assert doc["window_note"] and doc["io_span_s"] > 0, doc["window_note"]
    cli_watch._print(doc | {"verdict": None, "floor_s": None, "floor_note": "unknown"})
    headline = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("read "))
    assert " in at most 0.02 s of reading: at least " in headline, headline
    path = str(tmp_path / "r.csv")
    results.record(path, "w1", doc, envmod.snapshot(str(tmp_path)))
    row = read_rows(path)[-1]
    assert row["rto_s"] is None and row["read_gbps"] is None and row["bytes"] == total, row


def test_the_watch_screen_says_an_untimed_read_as_the_cli_does(tmp_path):
    """The watch screen's last line read "read 2.0 MiB: 0.00 GB/s" for the hot Trainer resume the CLI now calls
    untimed."""
    from types import SimpleNamespace

    from tui.screens.watch import WatchDone, WatchScreen

    src = os.path.join(_copy("trainer_outdir", tmp_path), "checkpoint-10")
    doc = _between_samples(src).to_json() | {"verdict": {"kind": "unknown", "summary": "s", "fix": "f"},
                                             "floor_sentence": "", "floor_note": "", "gpu_note": "",
                                             "count_note": ""}
    shown: dict[str, str] = {}
    widget = lambda sel, _cls: SimpleNamespace(update=lambda text: shown.__setitem__(sel, str(text)))  # noqa: E731
    fake = SimpleNamespace(query_one=widget, notify=lambda *a, **k: None)
    WatchScreen.done(fake, WatchDone(doc))
    assert "0.00 GB/s" not in shown["#watch-target"] and "untimed" in shown["#watch-target"], shown


def test_two_lightning_checkpoints_of_one_folder_are_recorded_apart(tmp_path):
    """run --pick of each of two .ckpt files of one ModelCheckpoint folder recorded both as the folder: history
    could not tell them apart and compare held one's restore against the other's as 'the last one like it'."""
    from ckptbench.records.results import read_rows

    folder = os.path.join(_copy("lightning_ckpt_max", tmp_path), "checkpoints")
    shutil.copy(os.path.join(folder, "epoch=0-step=2.ckpt"), os.path.join(folder, "epoch=0-step=1.ckpt"))
    results = str(tmp_path / "r.csv")
    for name in ("epoch=0-step=2.ckpt", "epoch=0-step=1.ckpt"):
        r = run_cli("run", folder, "--pick", name, "--repeat", "1", "--results", results)
        assert r.rc == 0, r.err
    sources = [row["source"] for row in read_rows(results)]
    assert [os.path.basename(s) for s in sources] == ["epoch=0-step=2.ckpt", "epoch=0-step=1.ckpt"], sources
    assert "no earlier run like it is on record" in _recorded(r.out)
    assert run_cli("compare", results).rc == 2  # no baseline of the same checkpoint


def test_the_dashboards_restore_records_the_checkpoint_run_records(tmp_path):
    """The dashboard's restore of a Trainer's output_dir recorded the folder given, `run` its checkpoint-N: compare
    never held one against the other."""
    from ckptbench.records.results import read_rows
    from ckptbench.restore.repeat import RunOptions
    from ckptbench.restore.session import RestoreSession

    out = _copy("trainer_outdir", tmp_path)
    results = str(tmp_path / "r.csv")
    assert run_cli("run", out, "--repeat", "1", "--results", results).rc == 0
    RestoreSession(out, RunOptions(), results_path=results).run(repeats=1)
    rows = read_rows(results)
    assert len({row["run_id"] for row in rows}) == 2
    assert {row["source"] for row in rows} == {os.path.realpath(os.path.join(out, "checkpoint-10"))}, rows


def test_a_distributed_run_records_the_lightning_checkpoint_it_restored(tmp_path):
    """run --distributed recorded the folder of a picked .ckpt, as run did before Listing.restored."""
    from types import SimpleNamespace

    from ckptbench.distributed.summary import summarize
    from ckptbench.sources.local import LocalSource

    folder = os.path.join(_copy("lightning_ckpt_max", tmp_path), "checkpoints")
    shutil.copy(os.path.join(folder, "epoch=0-step=2.ckpt"), os.path.join(folder, "epoch=0-step=1.ckpt"))
    listing = LocalSource(folder, checkpoint=True, pick="epoch=0-step=1.ckpt").list()
    doc = summarize("d1", listing, SimpleNamespace(size=1, backend="gloo"), {}, "part", None, [],
                    {"date": "2026-12-07T00:00:00+00:00"})
    assert os.path.basename(doc["source"]) == "epoch=0-step=1.ckpt", doc["source"]


def test_a_watch_of_one_lightning_checkpoint_records_that_file(tmp_path):
    """A watch of a resume from one .ckpt of a folder was recorded as the folder, where run records the file: the
    two never compared, and two .ckpt files' watches read as one source."""
    from ckptbench.watch.results import source_of

    folder = os.path.join(_copy("lightning_ckpt_max", tmp_path), "checkpoints")
    ckpt = os.path.join(folder, "epoch=0-step=2.ckpt")
    r = run_cli("run", folder, "--repeat", "1", "--results", str(tmp_path / "r.csv"), "--json")
    assert r.rc == 0, r.err
    assert source_of([ckpt]) == ckpt == json.loads(r.out)["source"]
    assert source_of([os.path.join(folder, "a.safetensors"), os.path.join(folder, "b.safetensors")]) == folder
