"""What the sixth new-user pass met on the dashboard, driven with Pilot on a real generated checkpoint.

- After `l` stopped a loop, the next poll drew the previous restore's six stages again under the loop's last pass
  note: "RTO 1.804s (pass 57: 1.99 GB/s, cache cold)", a pass it was not. The stages the loop ended on stand.
- The sweep screen's cold reads went on after escape (and after R, beside the new sweep): a restore started on the
  dashboard then read beside a sweep evicting its files. Leaving stops it; it does not start while a restore runs.
- The history's comparison said REGRESSION or improved bare where one side had one repeat; `compare` says beside it
  that the noise is unknown there.
- A restore with --read pread said "(read pread: pread)": the reason's short part was the mode again.

Expected values come from the domain objects the screen drives (the ReadLoop's last pass, compare's FigureDelta,
read_source's calls), never from the widgets alone."""

from __future__ import annotations

import threading

from textual import events
from textual.widgets import Static

import ckptbench.restore.sweep as sweepmod
from ckptbench.records import compare as comparemod
from ckptbench.records.results import read_documents
from tui.screens.dashboard import Dashboard
from tui.screens.history import HistoryScreen
from tui.screens.loopmode import LOOP_STAGES
from tui.screens.sweep import SweepScreen
from tui.widgets.stagebar import StageBar


async def run_to_end(app, pilot, h) -> None:
    dash = app.screen
    await pilot.press("r")
    await app.workers.wait_for_complete()
    await h.wait_until(pilot, lambda: not dash.running, "the dashboard to handle the end of the run")


async def test_stopping_a_loop_after_a_restore_leaves_the_loops_stages(make_app, small_ckpt, h):
    app = make_app(small_ckpt, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        assert isinstance(dash, Dashboard)
        await run_to_end(app, pilot, h)
        assert app.session is not None and set(app.session.stages()) == set(h.STAGES)
        await pilot.press("l")
        loop = dash.loop
        await h.wait_until(pilot, lambda: loop.passes >= 2, "two passes", 30)
        app.post_message(events.Key("x", "x"))
        await h.wait_until(pilot, lambda: dash.loop is None, "the loop to end", 30)
        await app.workers.wait_for_complete()
        dash.poll()  # the next tick after the loop: it drew the restore's stages again
        await pilot.pause()
        bar = dash.query_one("#stages", StageBar)
        last = loop.last
        assert bar.shown == LOOP_STAGES and bar.stages == last.stages, (bar.stages, last.stages)
        text = h.text_of(bar)
        assert f"RTO {last.rto_s:.3f}s   (pass {last.pass_no}:" in text, text
        assert " verify " not in text and " check " not in text, text


def counting_reads(monkeypatch, gate: threading.Event | None = None, ended: threading.Event | None = None) -> list:
    """Counts the sweep's level reads; the first waits for `gate` (so the test can leave the screen mid-sweep);
    `ended` is set when the sweep's call returns (its thread outlives the screen's worker)."""
    calls = []
    real, real_sweep = sweepmod.read_source, sweepmod.sweep

    def sweep(*args, **kw):
        try:
            return real_sweep(*args, **kw)
        finally:
            if ended is not None:
                ended.set()

    def read(*args, **kw):
        calls.append(kw.get("cache"))
        if gate is not None and len(calls) == 1:
            assert gate.wait(30), "the test never opened the gate"
        return real(*args, **kw)

    monkeypatch.setattr(sweepmod, "read_source", read)
    monkeypatch.setattr(sweepmod, "sweep", sweep)
    return calls


async def test_leaving_the_sweep_stops_its_cold_reads(make_app, small_ckpt, h, monkeypatch):
    gate, ended = threading.Event(), threading.Event()
    calls = counting_reads(monkeypatch, gate, ended)
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("s")
        assert isinstance(app.screen, SweepScreen)
        await h.wait_until(pilot, lambda: calls, "the sweep's first read", 30)
        await pilot.press("escape")
        assert isinstance(app.screen, Dashboard)
        gate.set()
        await h.wait_until(pilot, ended.is_set, "the sweep's thread to return", 120)
    assert len(calls) == 1, f"the sweep read {len(calls)} levels after the screen was left"
    assert read_documents(app.results_path, "knee") == []  # no knee recorded from a sweep that did not finish


async def test_the_sweep_does_not_start_while_a_restore_runs(make_app, small_ckpt, h, monkeypatch):
    calls = counting_reads(monkeypatch)
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        dash.running = True  # a restore or loop under way on the dashboard
        await pilot.press("s")
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        await pilot.pause()
        await app.workers.wait_for_complete()
        text = h.text_of(screen.query_one("#sweep-summary", Static))
        assert "running on the dashboard" in text and "evict" in text, text
        dash.running = False
    assert calls == []


async def test_history_compare_says_a_one_repeat_side_has_no_noise_estimate(make_app, small_ckpt, h, monkeypatch):
    app = make_app(small_ckpt, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        await run_to_end(app, pilot, h)
        await run_to_end(app, pilot, h)
        real = comparemod.compare

        def compare(*args, **kw):  # the newest run's read twice as slow: a regression on one repeat a side
            c = real(*args, **kw)
            figures = [f if f.figure != "read_s" else
                       comparemod.FigureDelta(f.figure, f.baseline, f.newest | {"median": f.baseline["median"] * 2},
                                              100.0, True, False, noise_known=False) for f in c.figures]
            return comparemod.Comparison(c.baseline_id, c.newest_id, figures, c.env_diff, c.threshold_pct, c.kind)

        monkeypatch.setattr(comparemod, "compare", compare)
        await pilot.press("h")
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        await pilot.press("space", "down", "space", "c")
        await pilot.pause()
        text = h.text_of(screen.query_one("#comparison", Static))
        line = next(ln for ln in text.splitlines() if ln.strip().startswith("read_s "))
        base, new = screen.marked  # marked in the table's order: the older first
        delta = next(f for f in compare(app.results_path, base, newest=new).figures if f.figure == "read_s")
        assert delta.noise_note == "one repeat each: noise unknown"
        assert line.endswith(f"REGRESSION ({delta.noise_note})"), line


async def test_a_read_mode_asked_for_says_so_beside_the_rto(make_app, small_ckpt, h):
    app = make_app(small_ckpt, cache="hot", read="pread")
    async with app.run_test(size=h.SIZE) as pilot:
        await run_to_end(app, pilot, h)
        text = h.text_of(app.screen.query_one("#stages", StageBar))
        assert "(read pread: as asked" in text and "read pread: pread" not in text, text
