"""The watch screen on a real job: a single-threaded loader started by the test is sampled live (the chart fills,
the figures name a phase) and, when it exits, judged: the verdict and its fix are on screen. `v` stops
watching a job that would run on, and the verdict comes from what was seen."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap

from textual.widgets import Static

import fastio
from ckptbench.watch import sampler as watch
from tui.watch_app import WatchApp
from tui.widgets.chart import ThroughputChart

SLOW = textwrap.dedent("""
    import os, sys, time
    # reads once the test says the watch is sampling (_go): a job that slept a fixed 0.3 s had read its file and
    # closed it before a loaded CI box had the app up, and the watch saw no checkpoint file
    for _ in range(6000):
        if os.path.exists(sys.argv[3]):
            break
        time.sleep(0.01)
    total = 0
    with open(sys.argv[1], "rb") as f:
        while chunk := f.read(1 << 20):
            for b in chunk:  # every byte: a fast box read every 4th in a few samples, too few for a verdict
                total += b
    time.sleep(float(sys.argv[2]))
""")


async def _until(pilot, pred, what: str, timeout: float = 90) -> None:
    for _ in range(int(timeout / 0.1)):
        if pred():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _job(tmp_path, linger: float):
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(24 << 20))
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    fastio.evict([str(data)])
    return watch.start_job([sys.executable, str(script), str(data), str(linger), str(tmp_path / "go")],
                           stdout_to_stderr=True)


async def _go(pilot, screen, tmp_path) -> None:
    """Lets a SLOW job read (its third argument, tmp_path / "go"), once the watch has taken its first sample."""
    chart = screen.query_one("#watch-chart", ThroughputChart)
    await _until(pilot, lambda: chart.samples, "the watch's first sample")
    (tmp_path / "go").touch()


async def test_a_watched_job_is_drawn_live_and_judged_when_it_exits(tmp_path, h):
    proc, marks = _job(tmp_path, 0.0)
    app = WatchApp(proc.pid, proc=proc, marks=marks, interval=0.1)
    try:
        async with app.run_test(size=h.SIZE) as pilot:
            screen = app.screen
            await _go(pilot, screen, tmp_path)
            verdict = screen.query_one("#watch-verdict", Static)
            await _until(pilot, lambda: "verdict:" in h.text_of(verdict), "the verdict")
            text = h.text_of(verdict)
            assert "verdict: loader-cpu-bound" in text and "fix:" in text
            assert "exited after" in h.text_of(screen.query_one("#watch-target", Static))
            assert "deserializing" in h.text_of(screen.query_one("#watch-phases", Static))
    finally:
        os.unlink(marks)
        proc.kill()
        proc.wait()


async def test_v_stops_watching_and_judges_what_was_seen(tmp_path, h):
    proc, marks = _job(tmp_path, 60.0)  # reads, then lingers: only `v` ends the watch
    app = WatchApp(proc.pid, proc=proc, marks=marks, interval=0.1)
    try:
        async with app.run_test(size=h.SIZE) as pilot:
            screen = app.screen
            await _go(pilot, screen, tmp_path)
            figures = screen.query_one("#watch-figures", Static)
            await _until(pilot, lambda: "waiting" in h.text_of(figures), "the job to finish reading")
            await pilot.press("v")
            verdict = screen.query_one("#watch-verdict", Static)
            await _until(pilot, lambda: "verdict:" in h.text_of(verdict), "the verdict")
            assert "cancelled after" in h.text_of(screen.query_one("#watch-target", Static))
            assert proc.poll() is None  # stopping the watch leaves the job alone
    finally:
        os.unlink(marks)
        proc.kill()
        proc.wait()


GPU_JOB = textwrap.dedent("""
    import os, sys, time
    table = sys.argv[1]
    time.sleep(0.4)
    for mib in range(0, 3001, 1000):
        with open(table + ".tmp", "w") as f:
            f.write(f"{os.getpid()}, {mib}\\n")
        os.replace(table + ".tmp", table)
        time.sleep(0.3)
    time.sleep(0.3)
""")


async def test_the_jobs_gpu_memory_is_on_screen_where_nvidia_smi_is(tmp_path, h, monkeypatch):
    """A stand-in nvidia-smi (this box has no GPU) prints what the real query prints, from a file the job writes."""
    table = tmp_path / "apps.csv"
    table.write_text("")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(table)!r}).read())\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(smi.parent) + os.pathsep + os.environ["PATH"])
    script = tmp_path / "gpu.py"
    script.write_text(GPU_JOB)
    proc, marks = watch.start_job([sys.executable, str(script), str(table)], stdout_to_stderr=True)
    app = WatchApp(proc.pid, proc=proc, marks=marks, interval=0.1)
    try:
        async with app.run_test(size=h.SIZE) as pilot:
            screen = app.screen
            figures = screen.query_one("#watch-figures", Static)
            await _until(pilot, lambda: "GPU 2.9 GiB" in h.text_of(figures), "the GPU memory live")
            target = screen.query_one("#watch-target", Static)
            await _until(pilot, lambda: "GPU memory peak 2.9 GiB" in h.text_of(target), "the GPU peak at the end")
            assert "copying-to-gpu" in h.text_of(screen.query_one("#watch-phases", Static))
    finally:
        os.unlink(marks)  # the marks file start_job made: it was left in /tmp by every run of this test
        if proc.poll() is None:
            proc.kill()


async def test_the_checkpoint_named_as_source_is_judged_whatever_its_files_are_called(tmp_path, h):
    """`tui SOURCE --watch PID` and `watch --tui --source DIR`: a file under the source counts as the checkpoint's,
    as it does headless (blob.dat is no checkpoint by its name: without the source the verdict has no file)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    data = ck / "blob.dat"
    data.write_bytes(os.urandom(24 << 20))
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    fastio.evict([str(data)])
    proc, marks = watch.start_job([sys.executable, str(script), str(data), "0", str(tmp_path / "go")],
                                  stdout_to_stderr=True)
    app = WatchApp(proc.pid, proc=proc, marks=marks, interval=0.1, source=str(ck))
    try:
        async with app.run_test(size=h.SIZE) as pilot:
            await _go(pilot, app.screen, tmp_path)
            verdict = app.screen.query_one("#watch-verdict", Static)
            await _until(pilot, lambda: "verdict:" in h.text_of(verdict), "the verdict")
            assert "verdict: loader-cpu-bound" in h.text_of(verdict), h.text_of(verdict)
    finally:
        os.unlink(marks)
        proc.kill()
        proc.wait()


async def test_a_count_known_short_is_shown_as_at_least(tmp_path, h):
    """As `watch` prints it: a hot mapped load slips between samples, so its bytes and rate are a lower bound (the
    screen gave them as the rate); the verdict reads the --source checkpoint's files."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ckptbench"))
    try:
        from test_newuser15_watch import HOT_MAPPER, _safetensors
    finally:
        sys.path.pop(0)
    src = tmp_path / "ckpt"
    src.mkdir()
    shards = [src / f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for s in shards:
        _safetensors(s, 16 << 20)  # just written: in the page cache
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(HOT_MAPPER))
    proc, marks = watch.start_job([sys.executable, str(script), *map(str, shards)], stdout_to_stderr=True)
    app = WatchApp(proc.pid, proc=proc, marks=marks, interval=0.05, source=str(src))
    try:
        async with app.run_test(size=h.SIZE) as pilot:
            screen = app.screen
            await _until(pilot, lambda: "verdict:" in h.text_of(screen.query_one("#watch-verdict", Static)),
                         "the verdict")
            target = h.text_of(screen.query_one("#watch-target", Static))
            assert "read at least " in target and ": at least " in target, target
            assert "a lower bound: it mapped its files from the page cache" in target
    finally:
        os.unlink(marks)
        proc.kill()
        proc.wait()
