"""New-user pass 15, the dashboard's checklist (`k`): the same items as `ckptbench check` (whether the checkpoint
loads first, the restore efficiency last), each fix naming the checkpoint where check names it, and the floor from
this box's cache only: the screen never measures it.

Checkpoints come from `ckptbench gen` (conftest); a floor is planted in the test's own cache (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import time

from textual.widgets import Static

from ckptbench.checklist import efficiency as eff
from ckptbench.checklist.rules import RULES
from ckptbench.system import floor as fl

from tui.screens.checklist import ChecklistScreen

IDS = ["loads"] + [r.__name__ for r in RULES] + ["efficiency"]  # check's items off a FUSE mount


def plant_floor(source: str, gbps: float = 4.0) -> bytes:
    """This box's floor cache with every figure at `gbps`, `source`'s mount's storage figure too; its bytes."""
    import fastio

    from ckptbench.sources import open_source

    now = time.time()
    keys = ("populate_4k", "populate_thp", "copy", "scan", *(f"hash_{a}" for a in fastio.HASHES if a != "none"))
    f = fl.Floor(fl.box_key(), {k: fl.Ceiling(gbps, gbps, gbps, "planted by the test", now) for k in keys})
    f.mount = fl.mount_key(open_source(source).describe())
    f.storage = fl.Ceiling(gbps, gbps, gbps, "planted by the test", now, fl.STORAGE_SAMPLE)
    fl._save(fl.cache_path(), f, {})
    with open(fl.cache_path(), "rb") as fh:
        return fh.read()


async def checklist_of(app, pilot, h) -> ChecklistScreen:
    await pilot.press("k")
    screen = app.screen
    assert isinstance(screen, ChecklistScreen)
    await app.workers.wait_for_complete()
    await h.wait_until(pilot, lambda: screen.doc is not None, "the checklist to finish", 60)
    return screen


def _matches(ids: list[str]) -> bool:
    return len(ids) == len(IDS) and all(want.startswith(got) for want, got in zip(IDS, ids))


async def test_the_screen_shows_checks_items_with_the_checkpoint_named(make_app, small_ckpt, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = await checklist_of(app, pilot, h)
        ids = [i["id"] for i in screen.items]
        assert _matches(ids), ids
        assert [i["id"] for i in screen.doc["items"]] == ids
        for item in screen.items:
            assert "SOURCE" not in item["fix"], item
        conc = screen.items[ids.index("concurrency")]
        assert f"`ckptbench check {small_ckpt} --quick-sweep`" in conc["fix"]
        effi = screen.items[-1]
        assert effi["title"] == "Restore efficiency" and effi["verdict"] == "unknown"
        assert f"`ckptbench floor {small_ckpt}`" in effi["fix"]  # no floor cached: said how to measure it
        assert not os.path.exists(fl.cache_path())  # and the screen measured none itself
        await pilot.press(*["down"] * (len(ids) - 1))
        shown = h.text_of(screen.query_one("#detail", Static))
        assert shown.startswith("Restore efficiency") and f"ckptbench floor {small_ckpt}" in shown


async def test_with_a_cached_floor_the_short_restore_is_held_to_it(make_app, small_ckpt, h):
    planted = plant_floor(small_ckpt)
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = await checklist_of(app, pilot, h)
        ev = screen.items[-1]["evidence"]
        assert screen.items[-1]["id"] == "efficiency" and ev["floor_cached"] is True
        assert ev["ceilings"]["storage"]["method"] == "planted by the test" and ev["measured_s"] > 0
        assert ev["sample_bytes"] > 0 and "efficiency" in ev
        if ev["floor_s"] < fl.FIXED_COSTS_S:  # this 18 MiB checkpoint at 4 GB/s: as run's note says
            assert screen.items[-1]["verdict"] == "unknown" and ev["reason"] == eff.TOO_SMALL
    with open(fl.cache_path(), "rb") as fh:
        assert fh.read() == planted  # read, never measured again


async def test_a_truncated_shard_fails_the_first_item_on_screen(make_app, small_ckpt, h, tmp_path):
    bad = shutil.copytree(small_ckpt, tmp_path / "trunc")
    shard = sorted(p for p in os.listdir(bad) if p.startswith("model-") and p.endswith(".safetensors"))[0]
    os.truncate(os.path.join(bad, shard), os.path.getsize(os.path.join(bad, shard)) // 2)
    app = make_app(str(bad))
    async with app.run_test(size=h.SIZE) as pilot:
        screen = await checklist_of(app, pilot, h)
        loads = screen.items[0]
        assert loads["id"] == "loads" and loads["verdict"] == "fail"
        assert shard in loads["evidence"]["error"] and "truncated" in loads["evidence"]["error"]
        assert screen.doc["ok"] is False
        effi = screen.items[-1]
        assert effi["verdict"] == "unknown" and "--concurrency" not in effi["fix"]
        assert h.text_of(screen.query_one("#detail", Static)).startswith("Checkpoint loads")


async def test_a_folder_named_like_markup_is_shown_as_text(make_app, small_ckpt, h, tmp_path):
    """The evidence and fixes quote the checkpoint's path: 'bad[/x]' raised MarkupError in the detail pane."""
    odd = shutil.copytree(small_ckpt, tmp_path / "bad[/x]" / "[red]ck")
    app = make_app(str(odd))
    async with app.run_test(size=h.SIZE) as pilot:
        screen = await checklist_of(app, pilot, h)
        for i in range(len(screen.items)):
            screen.show(i)  # each item's detail renders
        await pilot.pause()
        shown = h.text_of(screen.query_one("#detail", Static))
        assert str(odd) in shown  # the last item's fix names the folder as it is
