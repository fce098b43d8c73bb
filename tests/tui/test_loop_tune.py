"""Loop mode and auto-tune on the dashboard, driven with Pilot on a real generated checkpoint: `l` starts the loop
(the settings line says so and the pass count grows), `x` and `l` stop it, + reaches the loop's live read, and `t`
ends with the dashboard's concurrency at the knee the tuner reported, each level marked on the chart.

Expected values come from the domain objects the screen drives (the ReadLoop's pass counter, the AutoTune's
measured levels, sweep.knee on those rates), never from the widgets alone."""

from __future__ import annotations

import threading

from textual import events
from textual.widgets import Static

from ckptbench.restore.sweep import knee, recorded_knee
from tui.screens.dashboard import Dashboard
from tui.widgets.chart import ThroughputChart


def tap(app, key: str, char: str | None = None) -> None:
    """A key delivered without Pilot.press's wait for idle (the loop keeps the CPU busy)."""
    app.post_message(events.Key(key, char))


def running_in(fn) -> set[int]:
    """The idents of the threads whose stack is inside `fn` now."""
    import sys

    out = set()
    for ident, frame in sys._current_frames().items():
        while frame is not None:
            if frame.f_code is fn.__code__:
                out.add(ident)
                break
            frame = frame.f_back
    return out


def chart_top(chart) -> str:
    """The figure at the top of the chart's y-scale."""
    return chart.render().plain.splitlines()[0].split()[0]


def settings(dash, h) -> str:
    return h.text_of(dash.query_one("#settings", Static))


async def stop_loop(app, pilot, dash, h, key: str = "x", char: str = "x") -> int:
    """Stops the loop with `key`; returns the passes counted when the key reached the loop's cancel."""
    loop = dash.loop
    at_cancel = []
    cancel = loop.cancel

    def counted_cancel() -> None:
        at_cancel.append(loop.passes)
        cancel()

    loop.cancel = counted_cancel
    tap(app, key, char)
    await h.wait_until(pilot, lambda: dash.loop is None, "the loop to end", 30)
    await app.workers.wait_for_complete()
    assert at_cancel, "the key never cancelled the loop"
    at_press = at_cancel[0]
    assert loop.status == "stopped" and at_press <= loop.passes <= at_press + 1  # the pass in hand, no more
    assert not dash.running and settings(dash, h).startswith("idle"), settings(dash, h)
    return at_press


async def test_l_loops_pass_after_pass_and_x_stops_it(make_app, small_ckpt, h):
    app = make_app(small_ckpt, concurrency=2, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        assert isinstance(dash, Dashboard)
        await pilot.press("l")
        loop = dash.loop
        assert loop is not None and dash.running
        await h.wait_until(pilot, lambda: loop.passes >= 3, "three passes", 30)

        def shown() -> int:
            text = settings(dash, h)
            return int(text.split("looping, pass ")[1].split(" ")[0]) if "looping, pass " in text else 0

        first = await h.wait_until(pilot, shown, "the settings line to say looping")
        assert 1 <= first <= loop.pass_no
        await h.wait_until(pilot, lambda: shown() > first, "the pass shown to grow", 30)
        await h.wait_until(pilot, lambda: dash.query_one("#chart", ThroughputChart).samples, "a chart sample", 10)
        await stop_loop(app, pilot, dash, h)
        assert any(m == f"loop stopped after {loop.passes} passes" for m, _ in app.notes), app.notes
        assert loop.last is not None and loop.last.bytes == app.source_info["bytes"]
    assert app.session is None and h.read_results(app.results_path) == []  # a loop is a diagnosis, not a record


async def test_passes_no_poll_caught_reading_go_on_the_chart_as_their_own_rates(make_app, small_ckpt, h, monkeypatch):
    """A small checkpoint's passes run between two polls, the more so on a busy box: the chart stood at "waiting
    for the read stage…" through the loop and after it. Here no poll sees a pass reading (the loop's snapshot is
    hidden), and every finished pass still goes on the chart as its measured rate."""
    from ckptbench.restore.loop import ReadLoop

    monkeypatch.setattr(ReadLoop, "snapshot", lambda self: None)
    seen: dict[int, float] = {}  # every pass's rate, as the loop reports it
    run = ReadLoop.run
    monkeypatch.setattr(ReadLoop, "run", lambda self, **kw: run(
        self, on_pass=lambda p: seen.__setitem__(p.pass_no, p.read_gbps), **kw))
    app = make_app(small_ckpt, concurrency=2, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        chart = dash.query_one("#chart", ThroughputChart)
        await pilot.press("l")
        loop = dash.loop

        await h.wait_until(pilot, lambda: len(chart.samples) >= 2, "two passes on the chart", 30)
        await stop_loop(app, pilot, dash, h)
        assert {g for _, g in chart.samples} <= set(seen.values()) and len(chart.samples) >= 2
        assert "waiting" not in chart.render().plain
        assert chart.peak == max(g for _, g in chart.samples)


async def test_a_loop_stopped_before_any_pass_says_so_on_the_chart(make_app, small_ckpt, h, monkeypatch):
    from ckptbench.restore.loop import ReadLoop

    listing = ReadLoop._list

    def held(self, src):  # the first listing waits for the stop: no pass can end before it
        self.cancel_event.wait(30)
        return listing(self, src)

    monkeypatch.setattr(ReadLoop, "_list", held)
    app = make_app(small_ckpt, concurrency=2, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await pilot.press("l")
        loop = dash.loop
        await stop_loop(app, pilot, dash, h)
        chart = dash.query_one("#chart", ThroughputChart)
        assert loop.passes == 0
        assert "loop stopped before its first pass was read" in chart.render().plain and not chart.samples
        dash.begin(None, "")  # what the next run or loop starts with: it waits for its read stage again
        assert chart.render().plain.startswith("waiting for the read stage")
        dash.running = False


async def test_l_again_stops_the_loop_and_plus_reaches_its_live_read(make_app, big_ckpt, h):
    app = make_app(big_ckpt, concurrency=1, read="direct", block_size=4096)  # slow passes: + lands mid-pass
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        tap(app, "l", "l")  # pilot.press would wait for idle, which a loop never is
        loop = await h.wait_until(pilot, lambda: dash.loop, "the loop to start")
        samples = []
        loop.watch(samples.append)

        def first_half():
            s = loop.snapshot()
            return (loop.pass_no, s) if s is not None and 0 < s.bytes < s.bytes_planned / 2 else None

        in_hand, snap = await h.wait_until(pilot, first_half, "a pass in its first half", 30, step=0.005)
        assert snap.concurrency == 1
        tap(app, "plus", "+")
        await h.wait_until(pilot, lambda: dash.concurrency == 2, "+ to be handled", 10)
        assert loop.opts.concurrency == 2 and app.opts.concurrency == 2
        assert [label for _, label in dash.query_one("#chart", ThroughputChart).marks] == ["c=2"]
        # the pass that was at c=1 when + was pressed reports c=2 before it ends: the change was live
        await h.wait_until(pilot, lambda: loop.passes >= in_hand, "that pass to end", 30)
        assert any(s.pass_no == in_hand and s.concurrency == 2 for s in samples), samples
        await stop_loop(app, pilot, dash, h, "l", "l")
        assert all(s.concurrency == 2 for s in samples if s.pass_no > in_hand)  # later passes start with it


async def test_t_tunes_to_the_knee_and_marks_each_level(make_app, small_ckpt, h):
    app = make_app(small_ckpt, concurrency=16, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        chart = dash.query_one("#chart", ThroughputChart)
        await pilot.press("t")  # not looping yet: t starts the loop
        loop, tuner = dash.loop, dash.tuner
        assert loop is not None and tuner is not None and dash.tuning
        await h.wait_until(pilot, lambda: "auto-tuning" in settings(dash, h), "the settings line to say tuning")
        await h.wait_until(pilot, lambda: not dash.tuning, "auto-tune to reach the knee", 60)
        assert tuner.done and tuner.knee == knee(tuner.rates)[0]
        assert dash.concurrency == tuner.knee and app.opts.concurrency == tuner.knee
        assert loop.opts.concurrency == tuner.knee
        k = tuner.knee_level()
        assert (f"knee at c={k.concurrency} ({k.gbps:.2f} GB/s)", "information") in app.notes, app.notes
        labels = [label for _, label in chart.marks]
        assert labels == [m.label for m in tuner.measured] and len(labels) >= 2, labels
        assert [m.concurrency for m in tuner.measured] == tuner.levels[:len(tuner.measured)]
        assert chart.border_subtitle.endswith(f"→ knee at c={k.concurrency} ({k.gbps:.2f} GB/s)")
        assert "looping" in settings(dash, h)  # the loop goes on at the knee
        await h.wait_until(pilot, lambda: f"concurrency {tuner.knee} " in settings(dash, h), "the knee on screen")
        await stop_loop(app, pilot, dash, h)
    # on record, where the checklist's concurrency item reads it (issue #24 item 6a)
    recorded = recorded_knee(app.results_path, small_ckpt)
    assert recorded is not None and recorded.how == "auto-tune"
    assert (recorded.knee, recorded.gbps) == (tuner.knee, tuner.rates)


async def test_each_pass_shows_its_stages_and_rto_and_a_stopped_loop_leaves_no_partial_pass(make_app, big_ckpt, h):
    """issue #24 item 6c: the stage box follows the loop pass by pass (list and read, the RTO of the last finished
    pass) instead of "RTO —"; stopped mid-pass, the progress bar and figures show the last finished pass, not the
    cancelled one; and the chart's scale reads the figures line's peak (item 6b)."""
    from textual.widgets import ProgressBar

    from tui.widgets.stagebar import StageBar

    app = make_app(big_ckpt, concurrency=1, read="direct", block_size=4096)  # slow passes: x lands mid-pass
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        bar = dash.query_one("#stages", StageBar)
        tap(app, "l", "l")
        loop = await h.wait_until(pilot, lambda: dash.loop, "the loop to start")
        await h.wait_until(pilot, lambda: loop.passes >= 1, "a first pass", 60)
        await h.wait_until(pilot, lambda: bar.stages == loop.last.stages, "the pass's stages in the box", 10)
        text = h.text_of(bar)
        assert f"RTO {loop.last.rto_s:.3f}s" in text and "RTO —" not in text, text
        assert " list " in text and " read " in text and "verify" not in text and "load" not in text, text

        def mid_pass():
            snap = loop.snapshot()
            return snap is not None and 0 < snap.bytes < snap.bytes_planned / 2 and loop.passes >= 1

        await h.wait_until(pilot, mid_pass, "a pass in its first half", 30, step=0.005)
        await h.wait_until(pilot, lambda: dash.query_one("#progress", ProgressBar).progress < loop.last.bytes,
                           "the pass in hand on the progress bar", 10)
        await stop_loop(app, pilot, dash, h)
        last = loop.last
        progress = dash.query_one("#progress", ProgressBar)
        assert (progress.progress, progress.total) == (last.bytes, last.bytes)  # no cancelled pass standing
        assert bar.stages == last.stages and f"RTO {last.rto_s:.3f}s" in h.text_of(bar)
        figures = h.text_of(dash.query_one("#figures", Static))
        assert f"last pass {last.pass_no}: {last.read_gbps:.2f} GB/s" in figures, figures
        chart = dash.query_one("#chart", ThroughputChart)
        assert chart.peak == dash.rates.peak > 0 and chart_top(chart) == f"{dash.rates.peak:.2f}"


async def test_x_during_auto_tune_stops_both(make_app, small_ckpt, h):
    app = make_app(small_ckpt, concurrency=4, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await pilot.press("l")
        await h.wait_until(pilot, lambda: dash.loop.passes >= 1, "a first pass", 30)
        await pilot.press("t")
        tuner = dash.tuner
        assert dash.tuning and dash.loop.opts.concurrency == 1  # the walk starts at c=1 on the loop in hand
        await stop_loop(app, pilot, dash, h)
        assert not dash.tuning and not tuner.done and dash.concurrency == 4
        assert ("auto-tune stopped before it found the knee", "warning") in app.notes


async def test_quit_while_looping_ends_the_loop_thread(make_app, small_ckpt, h):
    from ckptbench.restore.loop import ReadLoop

    app = make_app(small_ckpt, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await pilot.press("l")
        loop = dash.loop
        await h.wait_until(pilot, lambda: loop.passes >= 1, "a first pass", 30)
        assert running_in(ReadLoop.run)  # what the check after the quit looks for is seen while it loops
        await pilot.press("q")
        await pilot.pause()
    assert loop.cancel_event.is_set()
    await_deadline = threading.Event()
    for _ in range(100):
        if loop.status == "stopped":
            break
        await_deadline.wait(0.1)
    assert loop.status == "stopped"
    # no thread is still in the loop: asyncio's default executor keeps its idle threads, as many as ran at once
    # (the loop, the floor's lookup, the source's measure: a count of threads was a count of those, and failed on
    # a quiet box), so the threads' stacks are looked at instead
    in_loop = [t.name for t in threading.enumerate() if t.ident in running_in(ReadLoop.run)]
    assert not in_loop, in_loop


async def test_the_app_can_start_in_loop_mode(make_app, small_ckpt, h):
    """`ckptbench tui SOURCE --loop`: the dashboard starts looping on mount, as `l` would."""
    app = make_app(small_ckpt, concurrency=2, cache="hot")
    app.autostart = "loop"
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        loop = await h.wait_until(pilot, lambda: dash.loop, "the loop to start on its own")
        await h.wait_until(pilot, lambda: loop.passes >= 2, "two passes", 30)
        assert app.session is None  # a loop, not a restore
        await stop_loop(app, pilot, dash, h)
