"""Shared fixtures for the TUI tests: sample checkpoints generated once per session, an app factory that records
notifications, and helpers that read results.csv and rendered widgets without going through the code under test."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import inspect
import io
import os
import shutil
import sys
import time
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CKPTBENCH_BIN = os.path.join(os.path.dirname(sys.executable), "ckptbench")
STAGES = ("list", "read", "verify", "load", "device", "check")
SIZE = (120, 40)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Runs `async def` tests in a fresh event loop (the app's run_test needs one; no asyncio plugin is installed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True


def gen(target, scale: str, *extra: str) -> str:
    """`ckptbench gen small TARGET --scale SCALE` in this process (torch is imported once)."""
    from ckptbench.cli import root as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["gen", "small", str(target), "--scale", scale, *extra])
    assert rc == 0, err.getvalue()
    return str(target)


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory) -> str:
    """The small profile at scale 0.05: about 18 MiB in 22 files. Read-only: copy it before changing it."""
    return gen(tmp_path_factory.mktemp("tui-ckpt") / "small", "0.05")


@pytest.fixture(scope="session")
def big_ckpt(tmp_path_factory) -> str:
    """The small profile at scale 0.3 (about 75 MiB): read with O_DIRECT in 4 KiB blocks by one worker, its read
    stage lasts long enough (seconds) to change concurrency while it runs."""
    return gen(tmp_path_factory.mktemp("tui-ckpt") / "big", "0.3")


@pytest.fixture
def corrupt_ckpt(small_ckpt, tmp_path) -> str:
    """A copy of the small checkpoint with one byte flipped in the middle of a model shard (manifest unchanged)."""
    dst = shutil.copytree(small_ckpt, tmp_path / "corrupt")
    shard = sorted(p for p in os.listdir(dst) if p.startswith("model-") and p.endswith(".safetensors"))[0]
    path = os.path.join(dst, shard)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    return str(dst)


def read_results(path) -> list[dict]:
    """results.csv read with the csv module, not ckptbench; [] when absent."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def text_of(widget) -> str:
    """The plain text a widget renders now (Static content, or a custom widget's Rich Text)."""
    r = widget.render()
    plain = getattr(r, "plain", None)
    return plain if plain is not None else str(r)


def task_count() -> int:
    """Native threads of this process (the engine's pthreads included)."""
    return len(os.listdir("/proc/self/task"))


async def wait_until(pilot, cond, what: str, timeout: float = 30.0, step: float = 0.02):
    """Let the app run until cond() is true; fail (naming `what`) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(step)


async def run_once(pilot, app) -> None:
    """`r` on the dashboard, then until its run is on record and its workers are done."""
    await pilot.press("r")
    await wait_until(pilot, lambda: app.session is not None and app.session.doc is not None, "the run to end")
    await app.workers.wait_for_complete()


@pytest.fixture
def make_app(tmp_path):
    """make_app(source, **run_options) -> CkptbenchApp with results in tmp_path/results.csv; app.notes records
    every (message, severity) the app notifies."""
    from ckptbench.restore.runner import RunOptions
    from tui.app import CkptbenchApp

    def make(source, **opts):
        app = CkptbenchApp(source, RunOptions.make(**opts), results_path=str(tmp_path / "results.csv"), autostart=False)
        app.notes = []
        original = app.notify

        def notify(message, *args, **kw):
            app.notes.append((str(message), kw.get("severity", "information")))
            return original(message, *args, **kw)

        app.notify = notify
        return app

    return make


@pytest.fixture(scope="session")
def h():
    return SimpleNamespace(read_results=read_results, text_of=text_of, task_count=task_count, wait_until=wait_until,
                           run_once=run_once, STAGES=STAGES, SIZE=SIZE, REPO=REPO, CKPTBENCH_BIN=CKPTBENCH_BIN)
