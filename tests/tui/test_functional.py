"""The TUI driven with Textual's Pilot: a restore runs to the end with every stage shown, concurrency changes reach
the live engine, cancel leaves a 'cancelled' row and no threads behind, and the checklist, sweep, history, help
and number-prompt screens do what their keys say.

Expected values come from the files (results.csv read with csv, the checklist's rule table), never from the
widgets under test alone."""

from __future__ import annotations

import os
import re
import subprocess
import threading

from textual import events
from textual.widgets import DataTable, Input, Static
from textual.worker import WorkerState

from ckptbench.core import concurrency as conc

from tui.screens.checklist import ChecklistScreen
from tui.screens.dashboard import Dashboard
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.prompt import NumberPrompt
from tui.screens.sweep import LEVELS, SweepScreen
from tui.widgets.chart import ThroughputChart
from tui.widgets.stagebar import StageBar

# one worker reading 4 KiB blocks with O_DIRECT: seconds of read stage on big_ckpt, long enough to act during it
SLOW = dict(concurrency=1, read="direct", block_size=4096)


def tap(app, key: str, char: str | None = None) -> None:
    """A key as the terminal driver delivers it, without Pilot.press's wait for the process to go idle (which
    waits up to seconds while a restore keeps the CPU busy): for keys that must land while a stage runs."""
    app.post_message(events.Key(key, char))


def dashboard(app) -> Dashboard:
    screen = app.screen_stack[0] if not isinstance(app.screen, Dashboard) else app.screen
    assert isinstance(screen, Dashboard)
    return screen


async def run_to_end(app, pilot, h) -> None:
    """Press r and let the restore finish: the worker completes and the dashboard handles its message."""
    dash = dashboard(app)
    runs_before = len(h.read_results(app.results_path))
    await pilot.press("r")
    await app.workers.wait_for_complete()
    await h.wait_until(pilot, lambda: not dash.running, "the dashboard to handle the end of the run")
    assert len(h.read_results(app.results_path)) > runs_before


async def read_in_progress(app, pilot, h, session_before):
    """After r: the new session's engine snapshot while its read stage is still running (None if the read finished
    before it could be seen)."""

    def seen():
        s = app.session
        if s is None or s is session_before:
            return None
        snap = s.snapshot()
        if snap is not None:
            return (s, snap)
        if s.status != "running":
            return (s, None)
        return None

    session, snap = await h.wait_until(pilot, seen, "the engine's first snapshot", timeout=60, step=0.005)
    if snap is None or snap.finished:
        return session, None
    return session, snap


async def catch_read(app, pilot, h, before_each=lambda: None, attempts: int = 3):
    """Tap r until a run's read stage is seen still running (a read that ends before it is seen does not count:
    that run finishes and another starts). Returns (session, unfinished snapshot)."""
    dash = dashboard(app)
    for _ in range(attempts):
        before_each()
        before_session = app.session
        tap(app, "r", "r")
        session, snap = await read_in_progress(app, pilot, h, before_session)
        if snap is not None:
            return session, snap
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not dash.running, "the run to end")
    raise AssertionError(f"the read stage never ran long enough to be seen in {attempts} runs")


# -- the restore on the dashboard ----------------------------------------------------------------------------


async def test_run_finishes_and_stage_bar_shows_every_stage(make_app, small_ckpt, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await run_to_end(app, pilot, h)
        await app.workers.wait_for_complete()
        await pilot.pause()
        bar = app.screen.query_one("#stages", StageBar)
        assert set(bar.stages) == set(h.STAGES), bar.stages
        for s in h.STAGES:
            assert isinstance(bar.stages[s], float) and bar.stages[s] >= 0, (s, bar.stages[s])
        text = h.text_of(bar)
        for s in h.STAGES:
            assert f" {s} " in text, (s, text)
        assert "RTO" in text and "—" not in text
        assert re.search(r" read \d+\.\d{3}s \d+(\.\d)? %", text), text  # each stage's share as `run` prints it
        assert any(m.startswith("restored: RTO") and "success 100 % (ok)" in m for m, _ in app.notes), app.notes
        assert not app.screen.has_class("-running")
    rows = h.read_results(app.results_path)
    assert [r["status"] for r in rows] == ["ok"]
    assert rows[0]["source"] == small_ckpt


async def test_final_figures_show_after_a_run_shorter_than_a_poll_tick(make_app, small_ckpt, h, monkeypatch):
    """A run that ends between two poll ticks (here: no tick at all) must still show its final figures: the
    dashboard's finished() polls once more for exactly that."""
    import tui.screens.dashboard as dashboard_module

    monkeypatch.setattr(dashboard_module, "POLL_S", 3600.0)
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await run_to_end(app, pilot, h)
        await pilot.pause()
        figures = h.text_of(app.screen.query_one("#figures", Static))
        n_files = sum(len(names) for _, _, names in os.walk(small_ckpt))
        assert "GB/s" in figures and f"files {n_files}/{n_files}" in figures, figures


async def test_plus_raises_the_live_engines_concurrency_and_marks_the_chart(make_app, big_ckpt, h):
    app = make_app(big_ckpt, **SLOW)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = dashboard(app)
        chart = dash.query_one("#chart", ThroughputChart)
        session, snap = await catch_read(app, pilot, h)
        assert snap.concurrency == 1 and not chart.marks
        tap(app, "plus", "+")
        await h.wait_until(pilot, lambda: session.snapshot().concurrency > 1, "the engine to take the new concurrency",
                           10)
        assert session.snapshot().concurrency == 2
        assert session.opts.concurrency == 2 and app.opts.concurrency == 2 and dash.concurrency == 2
        assert [label for _, label in chart.marks] == ["c=2"]
        tap(app, "x", "x")
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not dash.running, "the cancelled run to end")


async def test_concurrency_keys_between_runs_change_the_options(make_app, small_ckpt, h):
    app = make_app(small_ckpt, concurrency=8)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = dashboard(app)
        await pilot.press("plus")
        assert dash.concurrency == 16 and app.opts.concurrency == 16
        await pilot.press("minus", "minus", "minus", "minus", "minus", "minus")
        assert dash.concurrency == 1 and app.opts.concurrency == 1
        await pilot.press("minus")
        assert dash.concurrency == 1 and app.opts.concurrency == 1
        assert dash.query_one("#chart", ThroughputChart).marks == []  # marks only while running
        assert "concurrency 1" in h.text_of(dash.query_one("#settings", Static))
        await app.workers.wait_for_complete()  # the source listed: the digest the manifest names is known
        await pilot.pause()
        # read: auto (the default) -> pread -> mmap; hash: the manifest's crc32c -> xxh64 (crc32c named is the same)
        await pilot.press("m", "o", "e", "e", "a")
        assert (app.opts.mode, app.opts.cache, app.opts.read, app.opts.hash) == ("staged", "cold", "mmap", "xxh64")
        await pilot.press("o", "o", "a", "a", "a", "a")
        assert (app.opts.cache, app.opts.hash) == ("as-is", None)
        settings = h.text_of(dash.query_one("#settings", Static))
        assert "mode staged" in settings and "read mmap" in settings, settings
        assert "hash crc32c (the manifest's)" in settings, settings  # gen's default digest


async def test_cancel_records_a_cancelled_row_and_leaves_no_threads(make_app, big_ckpt, h):
    app = make_app(big_ckpt, **SLOW)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = dashboard(app)
        # Textual runs thread workers on the event loop's default executor, whose pooled thread outlives each
        # worker: a no-op thread worker first puts that one thread into the baseline
        app.run_worker(lambda: None, thread=True)
        await app.workers.wait_for_complete()
        await pilot.pause()
        baseline = {}

        def count_threads():
            baseline.update(py=threading.active_count(), native=h.task_count())

        session, _ = await catch_read(app, pilot, h, count_threads)
        py_threads, native_threads = baseline["py"], baseline["native"]
        assert session.stage == "read" and dash.running
        workers = [w for w in app.workers if w.group == "restore"]
        assert len(workers) == 1 and workers[0].state == WorkerState.RUNNING
        tap(app, "x", "x")
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not dash.running, "the dashboard to handle the cancel")
        assert workers[0].state == WorkerState.SUCCESS and workers[0].is_finished
        assert not [w for w in app.workers if w.group == "restore"]
        assert session.status == "cancelled"
        assert any("cancelled" in m for m, _ in app.notes), app.notes
        assert "idle" in h.text_of(dash.query_one("#settings", Static))
        await h.wait_until(pilot, lambda: threading.active_count() <= py_threads, "Python threads to end", 10)
        await h.wait_until(pilot, lambda: h.task_count() <= native_threads, "engine threads to end", 10)
        assert threading.active_count() == py_threads
        assert h.task_count() == native_threads
    rows = h.read_results(app.results_path)
    assert [r["status"] for r in rows][-1:] == ["cancelled"] and all(r["status"] == "ok" for r in rows[:-1]), rows
    assert rows[-1]["source"] == big_ckpt and rows[-1]["concurrency"] == "1"
    assert rows[-1]["list_s"] != "" and rows[-1]["load_s"] == ""  # cancelled in the read: list timed, load never ran


async def test_cancel_pressed_before_the_worker_starts_the_session(make_app, small_ckpt, h, monkeypatch):
    """x right after r, before the worker thread has got going, must still cancel that run. The worker thread is
    held at its start (wherever the session is made: in it, or before it on the UI thread) until x is handled."""
    from ckptbench.restore.session import RestoreSession

    gate = threading.Event()
    gate.set()

    def held(fn):
        def wrapper(*args, **kw):
            if threading.current_thread() is not threading.main_thread():
                gate.wait(30)
            return fn(*args, **kw)
        return wrapper

    monkeypatch.setattr(RestoreSession, "run", held(RestoreSession.run))
    app = make_app(small_ckpt)
    app.new_session = held(app.new_session)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = dashboard(app)
        await run_to_end(app, pilot, h)  # a first run: app.session now holds a finished session
        gate.clear()
        await pilot.press("r")
        await pilot.press("x")
        gate.set()
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not dash.running, "the second run to end")
    statuses = [r["status"] for r in h.read_results(app.results_path)]
    assert statuses[0] == "ok" and statuses[1:] == ["cancelled"], statuses


async def test_a_failed_verification_shows_on_the_dashboard(make_app, corrupt_ckpt, h, monkeypatch):
    """A restore whose verify stage finds a bad digest ends 'failed' without load/device/check; the dashboard must
    show that run (stage bar with the stages that ran), not crash. The poll tick is stopped so that what the stage
    bar shows is what finished() gave it (a tick would replace it with the live session's stages)."""
    import tui.screens.dashboard as dashboard_module

    monkeypatch.setattr(dashboard_module, "POLL_S", 3600.0)
    app = make_app(corrupt_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await run_to_end(app, pilot, h)
        await pilot.pause()
        assert app.is_running and app.return_code is None
        bar = app.screen.query_one("#stages", StageBar)
        text = h.text_of(bar)
        for s in ("list", "read", "verify"):
            assert f" {s} " in text, text
        assert any("(failed)" in m for m, _ in app.notes), app.notes
    assert [r["status"] for r in h.read_results(app.results_path)] == ["failed"]


async def test_a_bug_in_the_restore_ends_the_run_on_screen_and_r_runs_again(make_app, small_ckpt, h, monkeypatch):
    """An exception outside ckptbench's family, raised deep in the load stage, must end the run on screen (error
    notification naming it, idle settings, 'restore failed' in the figures), not leave it 'running' forever; and
    r must then start a run that finishes."""
    from ckptbench.restore import runner as pipeline

    def boom(*_args, **_kw):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(pipeline.Run, "_load_state", boom)
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = dashboard(app)
        await pilot.press("r")
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not dash.running, "the dashboard to handle the failure", 10)
        await pilot.pause()
        assert app.is_running and app.return_code is None
        errors = [m for m, severity in app.notes if severity == "error"]
        assert len(errors) == 1 and "ZeroDivisionError" in errors[0] and "boom" in errors[0], app.notes
        assert app.session.status == "failed"
        assert h.text_of(dash.query_one("#settings", Static)).startswith("idle"), \
            h.text_of(dash.query_one("#settings", Static))
        assert "restore failed" in h.text_of(dash.query_one("#figures", Static))
        failed_session = app.session
        monkeypatch.undo()
        await run_to_end(app, pilot, h)
        assert app.session is not failed_session and app.session.status == "ok"
        assert any(m.startswith("restored: RTO") for m, _ in app.notes), app.notes
        assert "restore failed" not in h.text_of(dash.query_one("#figures", Static))
    # the failed repeat is on record with the stages it finished, then the run that worked
    rows = h.read_results(app.results_path)
    assert [r["status"] for r in rows][-2:] == ["failed", "ok"]
    assert rows[-2]["read_s"] not in ("", None) and rows[-2]["load_s"] in ("", None)


# -- the number prompt ---------------------------------------------------------------------------------------


async def test_number_prompt_sets_concurrency_and_rejects_zero(make_app, small_ckpt, h):
    app = make_app(small_ckpt, concurrency=8)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = dashboard(app)
        await pilot.press("c")
        assert isinstance(app.screen, NumberPrompt)
        field = app.screen.query_one("#number", Input)
        assert field.value == "8"
        await pilot.press("backspace", "0", "enter")
        assert isinstance(app.screen, NumberPrompt), "0 was accepted"
        assert (f"concurrency: must be 1..{conc.MAX}, got 0", "error") in app.notes
        assert dash.concurrency == 8 and app.opts.concurrency == 8
        await pilot.press("backspace", "1", "_", "6", "enter")  # the Input's integer type lets an underscore in
        assert isinstance(app.screen, NumberPrompt), "1_6 was accepted"
        await pilot.press("backspace", "backspace", "backspace")
        await pilot.press("backspace", "1", "2", "enter")
        await pilot.pause()
        assert app.screen is dash
        assert dash.concurrency == 12 and app.opts.concurrency == 12
        assert "concurrency 12" in h.text_of(dash.query_one("#settings", Static))
        await pilot.press("c", "escape")
        await pilot.pause()
        assert app.screen is dash and app.opts.concurrency == 12


# -- help ----------------------------------------------------------------------------------------------------


async def test_question_mark_opens_help_and_escape_closes_it(make_app, small_ckpt, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = h.text_of(app.screen.query_one("#help", Static))
        for key_help in ("r  run a restore", "k  checklist", "s  sweep", "h  history", "q  quit"):
            assert key_help in text
        await pilot.press("question_mark")  # pressed again: closes, does not stack a second help
        assert isinstance(app.screen, Dashboard)
        await pilot.press("question_mark", "escape")
        assert isinstance(app.screen, Dashboard)
        assert not any(isinstance(s, HelpScreen) for s in app.screen_stack)


# -- checklist -----------------------------------------------------------------------------------------------


async def test_checklist_lists_every_item_exports_markdown_and_enter_reruns_one(make_app, small_ckpt, h,
                                                                                tmp_path, monkeypatch):
    from ckptbench.checklist.rules import RULES, VERDICTS

    ids = ["loads"] + [r.__name__ for r in RULES] + ["efficiency"]  # check's items: loads first, efficiency last

    monkeypatch.chdir(tmp_path)
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("k")
        screen = app.screen
        assert isinstance(screen, ChecklistScreen)
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: screen.doc is not None, "the checklist to finish")
        table = screen.query_one("#items", DataTable)
        assert len(screen.items) == len(ids) == 12 and table.row_count == 12
        for i, (rule, item) in enumerate(zip(ids, screen.items)):
            assert rule.startswith(item["id"]), (rule, item["id"])
            assert item["verdict"] in VERDICTS
            assert str(table.get_row_at(i)[1]) == item["title"]
        assert screen.doc["summary"] and sum(screen.doc["summary"].values()) == 12
        assert any(m.startswith("checklist:") for m, _ in app.notes)

        await pilot.press("w")
        out = tmp_path / "ckptbench-check.md"
        assert out.exists()
        md = out.read_text()
        assert md.startswith(f"# ckptbench check: {small_ckpt}\n")
        for item in screen.doc["items"]:
            assert f"| {item['title']} | **{item['verdict']}** |" in md
        assert any(m == f"wrote {out}" for m, _ in app.notes), app.notes
        # a folder it cannot write in (a real read-only mount): one error note, not a traceback out of the dashboard
        ro = tmp_path / "ro"
        ro.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], check=True)
        try:
            monkeypatch.chdir(ro)
            await pilot.press("w")
            said = [(m, sev) for m, sev in app.notes if m.startswith(f"{ro}/ckptbench-check.md: cannot write it")]
            assert said and said[-1][1] == "error" and "Read-only file system" in said[-1][0], app.notes
            assert os.listdir(ro) == []
        finally:
            monkeypatch.chdir(tmp_path)
            subprocess.run(["umount", "-l", str(ro)], check=True)

        before = list(screen.items)
        await pilot.press("down", "down")
        assert table.cursor_row == 2
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: screen.items[2] is not before[2], "the rerun item to come back", 5)
        assert [a is b for a, b in zip(screen.items, before)] == [True, True, False] + [True] * 9
        assert screen.items[2]["id"] == before[2]["id"] and table.row_count == 12
        assert h.text_of(screen.query_one("#detail", Static)).startswith(screen.items[2]["title"])

        await pilot.press("escape")
        assert isinstance(app.screen, Dashboard)


# -- history -------------------------------------------------------------------------------------------------


async def test_history_lists_runs_and_compares_two(make_app, small_ckpt, h):
    app = make_app(small_ckpt, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        await run_to_end(app, pilot, h)
        await run_to_end(app, pilot, h)
        run_ids = list(dict.fromkeys(r["run_id"] for r in h.read_results(app.results_path)))
        assert len(run_ids) == 2
        await pilot.press("h")
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        table = screen.query_one("#runs", DataTable)
        assert table.row_count == 2
        assert [str(table.get_row_at(i)[1]) for i in range(2)] == run_ids
        assert [str(table.get_row_at(i)[-1]) for i in range(2)] == ["ok", "ok"]

        await pilot.press("c")  # nothing marked yet
        assert ("mark two runs with space first", "warning") in app.notes
        await pilot.press("space", "down", "space")
        assert screen.marked == run_ids
        assert [str(table.get_row_at(i)[0]) for i in range(2)] == ["●", "●"]
        await pilot.press("c")
        await pilot.pause()
        text = h.text_of(screen.query_one("#comparison", Static))
        assert text.startswith(f"{run_ids[1]} against {run_ids[0]}"), text
        for figure in ("rto_s", "read_s", "read_gbps"):
            assert f"  {figure} " in text, text
        # a REGRESSION or improvement with one repeat a side carries compare's note, as the CLI's line does
        assert re.search(r"  rto_s .* [+-]\d+(\.\d)? %( REGRESSION| improved| \([a-z :]+\))?"
                         r"( \(one repeat (each|in the newest|in the baseline): (its )?noise unknown\))?$", text,
                         re.M), text
        await pilot.press("escape")
        assert isinstance(app.screen, Dashboard)


async def test_history_without_results_says_so(make_app, small_ckpt, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        assert app.screen.query_one("#runs", DataTable).row_count == 0
        assert "no runs recorded" in h.text_of(app.screen.query_one("#comparison", Static))


# -- sweep ---------------------------------------------------------------------------------------------------


async def test_sweep_shows_the_knee_and_a_applies_it(make_app, small_ckpt, h):
    app = make_app(small_ckpt, concurrency=3)  # not a sweep level: applying the knee always changes it
    async with app.run_test(size=h.SIZE) as pilot:
        dash = dashboard(app)
        await pilot.press("s")
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: screen.result is not None, "the sweep to finish", 60)
        knee = screen.result["knee"]
        assert knee in LEVELS and sorted(screen.points) == LEVELS
        chart = h.text_of(screen.query_one("#sweep-chart", Static))
        knee_lines = [line for line in chart.splitlines() if "← knee" in line]
        assert len(knee_lines) == 1 and knee_lines[0].split("│")[0].strip() == str(knee), chart
        assert "GB/s" in chart and "…" not in chart
        summary = h.text_of(screen.query_one("#sweep-summary", Static))
        assert f"knee: concurrency {knee} " in summary and "within 10 % of the best" in summary, summary
        from ckptbench.restore.sweep import recorded_knee  # recorded where the checklist reads a measured knee

        recorded = recorded_knee(app.results_path, small_ckpt)
        assert recorded is not None and recorded.knee == knee and recorded.how == "sweep"
        await pilot.press("a")
        assert app.opts.concurrency == knee and dash.concurrency == knee
        assert (f"concurrency set to {knee}", "information") in app.notes
        await pilot.press("escape")
        assert app.screen is dash and f"concurrency {knee}" in h.text_of(dash.query_one("#settings", Static))


# -- quit ----------------------------------------------------------------------------------------------------


async def test_q_quits(make_app, small_ckpt, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running
    assert app.return_code == 0
