"""Terminal escapes recorded in results fields (a source path, a kernel string, a run id) never reach the terminal:
compare, history, plan and the TUI's history screen show them stripped."""

from __future__ import annotations

import asyncio
import re

from clirun import run_cli

from ckptbench.records import results

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
TITLE, WIPE = "\x1b]0;pwned\x07", "\x1b[2J"


def _row(run_id: str, rto: float, kernel: str, **extra) -> dict:
    env = {"date": "2024-01-01T00:00:00", "tool_version": "1", "python": "3.11", "torch": "2", "safetensors": "0.4",
           "kernel": kernel, "cpu_model": "cpu" + WIPE, "cpu_count": 8, "source_fs": "ext4"}
    return {"schema": results.SCHEMA, "kind": "restore", "run_id": run_id, "repeat": 1,
            "timestamp": "2024-01-01T00:00:00" + TITLE, "source": f"/ckpt/{TITLE}x{WIPE}", "format": "safetensors",
            "mode": "pipeline", "status": "ok", "cache": "hot", "rto_s": rto, "read_s": rto, "read_gbps": 1 / rto,
            "bytes": 10, "env": env} | extra


def _results(tmp_path) -> str:
    path = str(tmp_path / "R.csv")
    rows = [_row(f"base{WIPE}", 1.0, "6.1" + TITLE), _row(f"new\x9b2J{TITLE}", 2.0, "6.2\x1b[31m")]
    for r in rows:
        results.append(path, [r])
    return path


def _clean(text: str) -> None:
    assert not CONTROL.search(text.replace("\n", "")), repr(text)


def test_compare_prints_no_control_characters(tmp_path):
    path = _results(tmp_path)
    r = run_cli("compare", path)
    assert "REGRESSION" in r.out, r.out + r.err
    _clean(r.out)
    _clean(r.err)
    r = run_cli("compare", path, "--baseline", "nope")
    _clean(r.err)


def test_the_tui_history_screen_shows_no_escapes(tmp_path):
    from textual.app import App
    from textual.widgets import DataTable, Static

    from tui.screens.history import HistoryScreen

    path = _results(tmp_path)

    class One(App):
        results_path = path

        def on_mount(self) -> None:
            self.push_screen(HistoryScreen())

    async def go() -> None:
        app = One()
        async with app.run_test(size=(120, 30)) as pilot:
            screen = app.screen
            table = screen.query_one("#runs", DataTable)
            assert table.row_count == 2
            for i in range(2):
                for cell in table.get_row_at(i):
                    _clean(str(cell))
            await pilot.press("space", "down", "space", "c")
            await pilot.pause()
            text = str(screen.query_one("#comparison", Static).render())
            assert "against" in text
            _clean(text)

    asyncio.run(go())


def test_the_cli_error_line_carries_no_escapes(tmp_path):
    r = run_cli("save", "small", tmp_path / f"gone{TITLE}{WIPE}" / "t", "--scale", "0.02")
    assert r.rc == 2 and r.err.startswith("ckptbench: error:") and "gone" in r.err, r.err
    _clean(r.err)
