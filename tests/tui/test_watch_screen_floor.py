"""The watch screen holds the watched restore against this box's floor, as `ckptbench watch` does: with a floor
cached for the job's mount, the floor line and the verdict lead with the loader's share of it and what binds; with
none, the floor line says it is not measured and the command that measures it, for the job's own files.

The floor is written through floor.py's own save path with fixed rates into the test's own XDG_CACHE_HOME (never
measured: that would read the box for seconds); every ceiling a 24 MiB read can meet (storage, the page cache's copy)
is 2 GB/s and the rest far faster, so the binding rate on screen is 2.0 GB/s whether the read came cold or cached."""

from __future__ import annotations

import os
import time

import fastio
from textual.widgets import Static

from ckptbench.system import floor as fl
from ckptbench.system import probes
from test_watch_screen import _go, _job, _until
from tui.watch_app import WatchApp

BINDING_GBPS = 2.0


def _plant(where) -> str:
    def ceiling(gbps: float, sample: int = 0) -> fl.Ceiling:
        return fl.Ceiling(gbps, gbps, gbps, "fixed by the test", time.time(), sample)

    m = probes.mount_of(str(where))
    mount = fl.mount_key({"mount_point": m.mount_point, "fs_type": m.fs_type})
    ceilings = {"populate_4k": ceiling(40.0), "populate_thp": ceiling(40.0), "copy": ceiling(BINDING_GBPS),
                "scan": ceiling(50.0)} | {f"hash_{a}": ceiling(50.0) for a in fastio.HASHES if a != "none"}
    fl._save(fl.cache_path(), fl.Floor(fl.box_key(), ceilings, ceiling(BINDING_GBPS, fl.STORAGE_SAMPLE), mount), {})
    assert fl.cached(mount).storage.gbps == BINDING_GBPS
    return mount


async def _watched(tmp_path, h) -> tuple[str, str]:
    """The floor line and the verdict once a short job has been watched to its end."""
    proc, marks = _job(tmp_path, 0.0)
    app = WatchApp(proc.pid, proc=proc, marks=marks, interval=0.1)
    try:
        async with app.run_test(size=h.SIZE) as pilot:
            screen = app.screen
            await _go(pilot, screen, tmp_path)  # the job reads once the watch samples it
            floor = screen.query_one("#watch-floor", Static)
            await _until(pilot, lambda: "floor:" in h.text_of(floor), "the floor line")
            return h.text_of(floor), h.text_of(screen.query_one("#watch-verdict", Static))
    finally:
        os.unlink(marks)
        proc.kill()
        proc.wait()


async def test_with_a_floor_cached_the_screen_says_the_loaders_share_of_it(tmp_path, h):
    _plant(tmp_path)
    floor, verdict = await _watched(tmp_path, h)
    assert "your loader runs at " in floor and " % of this box's floor (floor " in floor, floor
    assert f"bound by storage ({BINDING_GBPS:.2f} GB/s read into " in floor, floor
    assert "ceilings measured" in floor and "not measured" not in floor  # what the floor stands on, from its note
    assert "of this box's floor" in verdict  # the verdict leads with it, as `ckptbench watch` prints it


async def test_without_a_floor_the_screen_says_it_is_not_measured_and_how(tmp_path, h):
    floor, verdict = await _watched(tmp_path, h)
    assert "this box's floor is not measured yet" in floor, floor
    assert f"ckptbench floor {tmp_path}" in floor.replace("\n", "")  # the job's own directory, not a placeholder
    assert "of this box's floor" not in floor and "of this box's floor" not in verdict
