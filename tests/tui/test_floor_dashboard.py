"""The dashboard holds the restore against this box's floor: a floor line on the throughput chart at the binding
resource's rate, and in the stage box the floor's time, what binds it and the efficiency (floor / RTO) after a run, per
pass in a loop, and the read's share of the floor's rate while it runs; with no floor measured, it says so and how.

The floor is a floor.json written through the module's own save path from Ceiling objects with fixed rates, into a
temporary XDG_CACHE_HOME: the figures are known, the test is fast, and the box's real cache is left alone. Expected
values are worked out here from those rates and the run's own document, not read back from the widgets' code."""

from __future__ import annotations

import re
import time

import fastio
import pytest
from textual import events

from ckptbench.sources import open_source
from ckptbench.system import binding as binding_words
from ckptbench.system import floor as fl
from tui.screens.dashboard import Dashboard
from tui.widgets.chart import ThroughputChart
from tui.widgets.stagebar import StageBar

STORAGE_GBPS = 2.0  # binds a cold read: fresh memory, copy and the CPU are all faster
FRESH_GBPS = 8.0
COPY_GBPS = 20.0
CPU_GBPS = 50.0


def _held_s(doc: dict) -> float:
    """The time a run's efficiency is held to: each repeat's RTO less its model step, the median."""
    import statistics

    step = doc.get("check") == "model step"
    return statistics.median(r["rto_s"] - (r["stages"]["check"] if step else 0.0) for r in doc["repeats"])


def percent_after(text: str, before: str) -> float:
    """The percent that follows `before` in `text`, written as `run` and the README write it: "82 %"."""
    found = re.search(re.escape(before) + r"(\d+(?:\.\d)?) %", text)
    assert found, text
    return float(found.group(1))


def ceiling(gbps: float, sample: int = 0) -> fl.Ceiling:
    return fl.Ceiling(gbps, gbps, gbps, "fixed by the test", time.time(), sample)


@pytest.fixture
def no_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))


@pytest.fixture
def floor_cached(tmp_path, monkeypatch, small_ckpt):
    """This box's floor cached with fixed rates, the storage figure under the small checkpoint's mount."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ceilings = {"populate_4k": ceiling(FRESH_GBPS / 2), "populate_thp": ceiling(FRESH_GBPS),
                "copy": ceiling(COPY_GBPS), "scan": ceiling(CPU_GBPS)}
    ceilings |= {f"hash_{a}": ceiling(CPU_GBPS) for a in fastio.HASHES if a != "none"}
    mount = fl.mount_key(open_source(small_ckpt).describe())
    floor = fl.Floor(fl.box_key(), ceilings, ceiling(STORAGE_GBPS, 1 << 30), mount)
    fl._save(fl.cache_path(), floor, {})
    assert fl.cached(mount) is not None and fl.cached(mount).storage.gbps == STORAGE_GBPS


def chart_text(dash) -> str:
    return dash.query_one("#chart", ThroughputChart).render().plain


def stage_text(dash) -> str:
    return dash.query_one("#stages", StageBar).render().plain


def floor_row(chart: str) -> str:
    rows = [r for r in chart.splitlines() if "floor " in r]
    assert len(rows) == 1, chart
    return rows[0]


async def test_floor_line_and_efficiency_after_a_run(make_app, small_ckpt, floor_cached, h):
    app = make_app(small_ckpt, concurrency=4, cache="cold")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        assert isinstance(dash, Dashboard)
        # before a run: the floor looked up for the settings (cold: the storage binds), no live share
        await h.wait_until(pilot, lambda: "bound by" in stage_text(dash), "the floor before a run")
        assert f"floor {STORAGE_GBPS:.2f} GB/s · bound by storage" in chart_text(dash)
        assert "bound by storage" in stage_text(dash) and "efficiency" not in stage_text(dash)

        await h.run_once(pilot, app)
        await h.wait_until(pilot, lambda: "efficiency" in stage_text(dash), "the run's efficiency")
        doc = app.session.doc
        assert doc["status"] in ("ok", "unverified"), doc["status"]
        hot = doc["cache"]["residency_before"] >= 0.9  # an eviction the box refused: the page cache's copy binds
        binding, rate = ("page cache", COPY_GBPS) if hot else ("storage", STORAGE_GBPS)

        # the chart: one floor row, its y label the binding rate, a dashed line through the empty cells
        await pilot.pause()
        row = floor_row(chart_text(dash))
        assert float(row.split()[0]) == pytest.approx(rate)
        assert f"floor {rate:.2f} GB/s · bound by {binding}" in row and "╌╌╌" in row
        # its height: the row the rate falls in, on a scale that reaches at least the floor
        rows = chart_text(dash).splitlines()[:-1]
        top = float(rows[0].split()[0])
        assert top >= rate and rows.index(row) == len(rows) - max(1, -(-rate * len(rows) // top))

        stages = stage_text(dash).splitlines()[-1]
        floor_s = doc["bytes"] / (rate * 1e9)
        # the floor's rate and the binding resource's (one resource binds here: the same rate twice), and what the
        # binding rate is of, as every command says it
        assert f"floor {floor_s:.3f} s ({rate:.2f} GB/s), bound by {binding} ({rate:.2f} GB/s " in stages, stages
        assert f"bound by {binding_words.text(doc)}" in stages, stages
        # against the RTO less the model's first step (compute no ceiling measures), as the run document holds it
        assert percent_after(stages, "efficiency ") == pytest.approx(floor_s / _held_s(doc) * 100, abs=0.5), stages
        assert "not measured" not in stages and "read now" not in stages


async def test_live_share_of_the_floor_rate(make_app, small_ckpt, floor_cached, h):
    """While a read runs, the stage box says the read's average rate over the floor's rate (the dashboard feeds the
    average it shows; fed here, so that no timing decides what the test sees)."""
    app = make_app(small_ckpt, cache="cold")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await h.wait_until(pilot, lambda: "bound by" in stage_text(dash), "the floor before a run")
        dash.floor.show(STORAGE_GBPS / 4)
        await pilot.pause()
        assert "read now at 25 % of the floor's rate" in stage_text(dash).splitlines()[-1]
        dash.floor.show()
        await pilot.pause()
        assert "read now" not in stage_text(dash)


async def test_live_fresh_memory_rate_beside_the_floors(make_app, small_ckpt, floor_cached, h):
    """While a read runs, the stage box sets the rate the read meets fresh memory at (per core, fed here as the
    dashboard feeds LiveRates' figure) beside the floor's like-for-like figure, when the two are apart."""
    app = make_app(small_ckpt, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await h.wait_until(pilot, lambda: "bound by" in stage_text(dash), "the floor before a run")
        # the cached 4 KiB figure names no thread count: it is the box's cores' together
        ref = FRESH_GBPS / 2 / fl.box_key()["cores"]
        assert dash.floor.fresh_ref == pytest.approx(ref)
        dash.floor.show(1.0, ref / 4)
        await pilot.pause()
        line = stage_text(dash).splitlines()[-1]
        assert f"fresh memory so far {ref / 4:.2f} GB/s a core, the floor's {ref:.2f}" in line, line
        dash.floor.show(1.0, ref * (1 + fl.MET_OFF / 2))  # within the floor's spread: nothing to say
        await pilot.pause()
        assert "fresh memory so far" not in stage_text(dash)


async def test_loop_shows_each_pass_against_the_floor(make_app, small_ckpt, floor_cached, h):
    app = make_app(small_ckpt, concurrency=2, cache="cold")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await pilot.press("l")
        await h.wait_until(pilot, lambda: dash.loop is not None and dash.loop.passes >= 2, "two loop passes", 60)
        await h.wait_until(pilot, lambda: "pass " in stage_text(dash).splitlines()[-1], "a pass's efficiency")
        loop = dash.loop
        app.post_message(events.Key("l", "l"))  # a key without Pilot.press's wait for idle: the loop is busy
        await h.wait_until(pilot, lambda: dash.loop is None, "the loop to stop", 30)
        await app.workers.wait_for_complete()
        await pilot.pause()
        line = stage_text(dash).splitlines()[-1]
        last = loop.last  # the loop's last pass, as the loop itself recorded it
        floor_s = last.bytes / (STORAGE_GBPS * 1e9)  # settings cold: the storage binds
        assert f"floor {floor_s:.3f} s (" in line and "bound by storage" in line, line
        assert percent_after(line, f"pass {last.pass_no}: efficiency ") == pytest.approx(floor_s / last.rto_s * 100,
                                                                                     abs=0.5), line
        assert "read now" not in line


async def test_without_a_floor_the_stage_box_says_how_to_measure_it(make_app, small_ckpt, no_floor, h):
    app = make_app(small_ckpt, cache="cold")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await h.wait_until(pilot, lambda: "not measured" in stage_text(dash), "the not-measured line")
        await h.run_once(pilot, app)
        await pilot.pause()
        line = stage_text(dash).splitlines()[-1]
        assert line.startswith(f"floor: not measured · `ckptbench floor {small_ckpt}`"), line
        assert "efficiency" not in line
        assert "floor " not in chart_text(dash) and "╌" not in chart_text(dash)


async def test_a_hot_loop_pass_is_held_to_the_read_floor_not_the_restores(make_app, small_ckpt, floor_cached, h):
    """A loop pass reads into reused buffers: hot, its floor is the page cache's copy alone, where a restore's adds
    the population of fresh memory (held to that, a cold pass read 300 % of its floor)."""
    app = make_app(small_ckpt, concurrency=2, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await h.wait_until(pilot, lambda: "bound by" in stage_text(dash), "the floor before a run")
        assert stage_text(dash).splitlines()[-1].startswith("floor ")  # idle: the restore's
        await pilot.press("l")
        await h.wait_until(pilot, lambda: dash.loop is not None and dash.loop.passes >= 2, "two loop passes", 60)
        await h.wait_until(pilot, lambda: "pass " in stage_text(dash).splitlines()[-1], "a pass's efficiency")
        loop = dash.loop
        app.post_message(events.Key("l", "l"))
        await h.wait_until(pilot, lambda: dash.loop is None, "the loop to stop", 30)
        await app.workers.wait_for_complete()
        await pilot.pause()
        line, last = stage_text(dash).splitlines()[-1], loop.last
        # the page cache's copy, then the manifest's crc32c over the cores (hot: the cores' work, one after the
        # other); no population of fresh memory, which a restore's floor adds (FRESH_GBPS)
        read_floor_s = last.bytes / (COPY_GBPS * 1e9) + last.bytes / (CPU_GBPS * 1e9 * fl.box_key()["cores"])
        assert line.startswith(f"read floor {read_floor_s:.3f} s ("), line
        assert percent_after(line, f"pass {last.pass_no}: efficiency ") == pytest.approx(
            read_floor_s / last.rto_s * 100, abs=0.5), line
        # the line's own label ("floor 2.34 GB/s"): on its row, or under "waiting…" where the chart has no sample
        # in its window (a fresh-clone CI under three workers caught it so)
        rate = re.search(r"floor (\d+\.\d+) GB/s", floor_row(chart_text(dash)))
        assert rate and float(rate.group(1)) == pytest.approx(last.bytes / read_floor_s / 1e9, rel=0.01)


async def test_a_failed_restore_shows_no_rto(make_app, tmp_path, h):
    """A restore that failed shows the stages it got through and no RTO: there was no restore to time."""
    import torch
    from safetensors.torch import save_file

    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"w": torch.ones(1 << 20)}, str(ck / "model.safetensors"))
    with open(ck / "model.safetensors", "r+b") as f:
        f.truncate(1 << 20)  # the header names 4 MiB of data
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await pilot.press("r")
        await h.wait_until(pilot, lambda: "restore failed" in str(dash.query_one("#figures").render()),
                           "the failure")
        await app.workers.wait_for_complete()
        await pilot.pause(0.3)  # a poll after the failure keeps it failed
        rto = next(r for r in stage_text(dash).splitlines() if "RTO" in r)
        assert rto.strip().startswith("RTO — (failed after"), rto


def test_the_stage_box_says_the_efficiency_against_the_box_as_the_run_met_it_when_that_is_off_the_floors():
    """A run that met fresh memory at a rate off the floor's figure (floor_as_met) says both, as `run` does; within
    the floor's spread, only the efficiency."""
    from ckptbench.system import floor as fl
    from tui.widgets.floorline import floor_text

    fields = {"floor_s": 2.0, "floor_gbps": 2.0, "binding": "fresh memory", "binding_gbps": 2.0,
              "floor_times_s": {"fresh memory": 2.0}, "efficiency": 0.5}
    met = {"efficiency": 0.8, "scale": 0.6, "fresh_gbps_per_core": 1.2, "floor_fresh_gbps_per_core": 2.0}
    text = floor_text(fields | {"floor_as_met": met}, done=0.5).plain
    assert "efficiency 50 % (floor / RTO) · 80 % of the box as this run met it (fresh memory 1.20 GB/s a core, " \
           "the floor's 2.00)" in text, text
    near = met | {"scale": 1 + fl.MET_OFF / 2}
    assert "as this run met it" not in floor_text(fields | {"floor_as_met": near}, done=0.5).plain
    assert "as this run met it" not in floor_text(fields | {"floor_as_met": None}, done=0.5).plain


def test_the_not_measured_line_names_the_checkpoint_on_screen():
    """`make demo` showed "`ckptbench floor SOURCE` measures this box's ceilings" about the sample it had just named
    in its header: the command is the one to type, as run's and check's notes give it."""
    from tui.widgets.floorline import floor_text

    text = floor_text({"floor_s": None}, source="/data/my ckpt").plain
    assert "`ckptbench floor '/data/my ckpt'` measures" in text and "SOURCE" not in text
    assert "`ckptbench floor SOURCE`" in floor_text({"floor_s": None}).plain  # nothing on screen to name
