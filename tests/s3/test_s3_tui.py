"""The dashboard restoring an S3 source through a shaped local S3 (one connection at 4 MB/s: a read stage of about
2 s): with the CRT client, whose concurrency is fixed when the read starts, +, - and c are disabled and the read
keeps the concurrency it started with; with the threads client, + reaches the running read and marks the chart."""

from __future__ import annotations

import asyncio
import time

import pytest
from s3help import put_dir
from textual import events
from textual.widgets import Static

from ckptbench.restore.runner import RunOptions
from tui.app import CkptbenchApp
from tui.screens.dashboard import POLL_S
from tui.widgets.chart import ThroughputChart

SIZE = (120, 40)
SHAPED = dict(fault_rate=0.0, latency_s=0.02, bandwidth_bps=4e6)  # ~5.6 MB at 1 connection: ~2 s of read


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    """The small profile at scale 0.02: about 5.6 MB in 22 files."""
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path_factory.mktemp("s3tui") / "ck"
    generate(profiles.load("small").scaled(0.02), str(root), force=True, digest="crc32c")
    return str(root)


@pytest.fixture
def slow_url(s3faulty, ckpt, monkeypatch) -> str:
    """The checkpoint on its own shaped server, with this process's environment pointed at it."""
    server = s3faulty(**SHAPED)
    bucket = server.make_bucket()
    put_dir(server.client(direct=True), bucket, "ck", ckpt)
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_RETRY_MODE"):
        monkeypatch.delenv(k, raising=False)
    return f"s3://{bucket}/ck"


def settings_of(dash) -> str:
    return dash.query_one("#settings", Static).render().plain


async def wait_until(pilot, cond, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.01)
    return value


async def start_read(app, pilot):
    """Press r; returns (dashboard, session) once the new session's read stage runs and the dashboard has polled
    it (the settings line says 'running')."""
    dash = app.screen
    before = app.session
    app.post_message(events.Key("r", "r"))

    def reading():
        s = app.session
        snap = s.snapshot() if s is not None and s is not before else None
        return s if snap is not None and not snap.finished and s.stage == "read" else None

    session = await wait_until(pilot, reading, "the read stage to start")
    await wait_until(pilot, lambda: settings_of(dash).startswith("running"), "the dashboard to poll the read")
    return dash, session


def still_reading(session) -> bool:
    snap = session.snapshot()
    return session.stage == "read" and snap is not None and not snap.finished


async def finish(app, pilot, dash) -> None:
    await app.workers.wait_for_complete()
    await wait_until(pilot, lambda: not dash.running, "the run to end")


def test_crt_read_keeps_its_concurrency_and_threads_read_takes_plus(slow_url, tmp_path):
    asyncio.run(_crt_then_threads(slow_url, str(tmp_path / "results.csv")))


async def _crt_then_threads(url: str, results: str) -> None:
    app = CkptbenchApp(url, RunOptions.make(s3_client="crt", concurrency=1), results_path=results)
    async with app.run_test(size=SIZE) as pilot:
        dash, session = await start_read(app, pilot)
        chart = dash.query_one("#chart", ThroughputChart)
        await wait_until(pilot, lambda: dash.fixed, "the dashboard to see the CRT read's fixed concurrency", 2)
        for action in ("more", "less", "ask_concurrency"):
            assert dash.check_action(action, ()) is None, action
        assert " concurrency 1 (fixed for this read) ·" in settings_of(dash), settings_of(dash)
        app.post_message(events.Key("plus", "+"))
        await pilot.pause(POLL_S + 0.05)  # more than a poll tick
        assert still_reading(session), "the CRT read ended before + could be checked"
        assert session.snapshot().concurrency == 1 and dash.concurrency == 1 and app.opts.concurrency == 1
        assert chart.marks == []
        app.set_concurrency(2)  # what the sweep screen's "apply the knee" calls, which no binding check stops
        await pilot.pause(POLL_S + 0.05)
        assert still_reading(session), "the CRT read ended before the set could be checked"
        assert session.snapshot().concurrency == 1 and chart.marks == []
        assert " concurrency 1 (fixed for this read) ·" in settings_of(dash), settings_of(dash)
        await finish(app, pilot, dash)
        assert session.status == "ok" and not dash.fixed
        assert "(fixed for this read)" not in settings_of(dash)
        assert dash.check_action("more", ()) is True

        app.set_concurrency(1)
        app.update_opts(s3_client="threads")
        dash, session = await start_read(app, pilot)
        await pilot.pause(POLL_S + 0.05)  # a poll tick: the threads read must not be marked fixed
        assert not dash.fixed and dash.check_action("more", ()) is True
        assert "(fixed for this read)" not in settings_of(dash)
        assert session.snapshot().concurrency == 1 and chart.marks == []
        app.post_message(events.Key("plus", "+"))
        await wait_until(pilot, lambda: session.snapshot().concurrency == 2, "the threads read to take +", 2)
        assert [label for _, label in chart.marks] == ["c=2"]
        await finish(app, pilot, dash)
        assert session.status == "ok"
        # the row and the document agree on the settings the run started with; the live change is listed
        assert session.doc["options"]["concurrency"] == 1 and session.doc["concurrency_changes"] == [2]
        from ckptbench.records.results import read_documents

        crt_doc = read_documents(results, "run")[0]
        assert crt_doc["options"]["concurrency"] == 1 and crt_doc["concurrency_changes"] == []
