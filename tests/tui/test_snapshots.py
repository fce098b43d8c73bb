"""SVG snapshots of the screens at a fixed terminal size, made deterministic: no live numbers on screen.

The dashboard gets a fixed source summary and a fixed system sample in place of the live probes; the indeterminate
progress bar is drawn without animation; the checklist screen is fed fixed items; the prompt's cursor does not
blink. Baselines live in __snapshots__/ (regenerate with --snapshot-update after a deliberate change)."""

from __future__ import annotations

from textual.widgets import Input

from tui.messages import ChecklistItem

SIZE = (120, 40)

SOURCE = "/data/ckpt/small-7b-like"
SOURCE_INFO = {"source": SOURCE, "files": 22, "bytes": 18_660_000, "residency": 0.25, "fs_type": "ext4",
               "mount_point": "/data"}
SYSTEM_SAMPLE = {
    "source": SOURCE, "fs_type": "ext4", "mount_point": "/data", "mount_options": "rw,relatime,errors=remount-ro",
    "ulimit_nofile": [1024, 524288], "fds_in_use": 17, "dirty_ratio": 20, "dirty_background_ratio": 10,
    "dirty_bytes": 12 << 20, "writeback_bytes": 0, "mem_available_bytes": 48 << 30, "rss_bytes": 612 << 20,
    "read_ahead_kb": 128, "cpu_pct_per_core": [12.0, 3.0, 97.0, 0.0], "disk_util_pct": 41.5, "disk_await_ms": 0.8,
    "tcp_retransmit_pct": 0.02,
}

ITEMS = [
    ("concurrency", "Concurrency", "warn", {"concurrency": 2, "knee": 16}, "--concurrency 16 (the knee of the sweep)"),
    ("small_files", "Small files", "ok", {"files": 22, "small": 16}, "none"),
    ("network_path", "Network path", "unknown", {"s3": None}, "run with the endpoint set"),
    ("mount_options", "Mount options", "ok", {"fs_type": "ext4"}, "none"),
    ("limits", "Limits and interference", "fail", {"ulimit_nofile": 64, "files": 22}, "ulimit -n 65536"),
    ("oom", "Memory headroom", "ok", {"need": "18 MiB", "available": "48 GiB"}, "none"),
    ("device_mapping", "Device mapping", "unknown", {"gpus": 0}, "run on the training host"),
    ("cold_cache", "Cold cache", "ok", {"residency_now": 0.25, "evict_residency": 0.0}, "none"),
    ("write_side", "Write side", "warn", {"dirty_ratio": 20}, "sysctl -w vm.dirty_background_ratio=5"),
]


def item(i: int) -> dict:
    id_, title, verdict, evidence, fix = ITEMS[i]
    return {"id": id_, "title": title, "verdict": verdict, "evidence": evidence,
            "why": f"why {title.lower()} matters, in one line", "fix": fix}


def app_without_source():
    from ckptbench.restore.runner import RunOptions
    from tui.app import CkptbenchApp

    app = CkptbenchApp(None, RunOptions(), results_path="/nonexistent/results.csv")
    app.animation_level = "none"  # the indeterminate progress bar is drawn full, not at a time-dependent offset
    return app


def dashboard_app():
    """The dashboard before a run, with a fixed source and system sample instead of the live probes."""
    from ckptbench.restore.runner import RunOptions
    from tui.app import CkptbenchApp

    app = CkptbenchApp(None, RunOptions.make(concurrency=16, cache="cold"), results_path="/nonexistent/results.csv")
    app.animation_level = "none"
    app.source = SOURCE
    app.source_info = dict(SOURCE_INFO)
    app.system_sample = lambda: dict(SYSTEM_SAMPLE)
    return app


async def show_system_now(pilot) -> None:
    """The system panel fills on a 1 s tick: fill it now, so the screenshot does not depend on that tick."""
    pilot.app.screen.poll_system()
    await pilot.pause()


def test_help_screen(snap_compare):
    assert snap_compare(app_without_source(), press=["question_mark"], terminal_size=SIZE)


def test_dashboard_before_a_run(snap_compare):
    assert snap_compare(dashboard_app(), terminal_size=SIZE, run_before=show_system_now)


def test_dashboard_without_source(snap_compare):
    assert snap_compare(app_without_source(), terminal_size=SIZE)


def test_number_prompt(snap_compare):
    async def open_prompt(pilot):
        await pilot.press("c")
        pilot.app.screen.query_one("#number", Input).cursor_blink = False
        await pilot.pause()

    assert snap_compare(app_without_source(), terminal_size=SIZE, run_before=open_prompt)


def test_checklist_with_fixed_items(snap_compare):
    async def feed(pilot):
        await pilot.press("k")  # no source: the screen gathers nothing and waits
        screen = pilot.app.screen
        for i in range(len(ITEMS)):
            screen.post_message(ChecklistItem(i, item(i)))
        await pilot.pause()
        await pilot.press("down", "down", "down", "down")  # the detail pane shows the failing item

    assert snap_compare(app_without_source(), terminal_size=SIZE, run_before=feed)
