"""The ranks screen (a lane per rank of one distributed restore), reached from the history screen and from
`tui --results FILE --ranks`. Its run documents are made by the code `run --distributed` records with
(dist/summary.py: combine, summarize, record) from rank reports with fixed numbers, so they have the real shape."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from types import SimpleNamespace

from textual.containers import VerticalScroll
from textual.widgets import DataTable, ProgressBar, Static

from ckptbench.distributed.history import newest_dist_run, read_rates
from ckptbench.distributed.rank import RankReport
from ckptbench.distributed.summary import combine, record, summarize
from ckptbench.core.units import human_bytes
from tui.screens.history import HistoryScreen
from tui.screens.ranks import RankLane, RanksScreen, spark_cells

MB = 1_000_000
# end_s per rank, per repeat: the straggler is rank 1 in the first repeat and rank 2 in the second
ENDS = [[0.30, 0.52, 0.41, 0.33], [0.45, 0.31, 0.62, 0.40]]
BYTES = [120 * MB, 150 * MB, 90 * MB, 150 * MB]
ERROR = "model-00002.safetensors: unreadable (Input/output error)"
OPTIONS = SimpleNamespace(cache="cold", concurrency=8, read="auto", hash=None, block_size=1 << 20, device="cpu")


def report(rank: int, end_s: float, nbytes: int, *, failed: bool = False) -> dict:
    """One rank's report as the driver gathers it: read from 0.002 s to 80% of its end, sampled every 0.1 s."""
    start, read_end = 0.002, round(end_s * 0.8, 4)
    got = nbytes // 3 if failed else nbytes
    ticks = [round(start + 0.1 * k, 4) for k in range(1, 10) if start + 0.1 * k < read_end] + [read_end]
    timeline = [(t, int(got * (t - start) / (read_end - start))) for t in ticks]
    stages = {"list": 0.001, "read": read_end - start}
    if not failed:
        stages |= {"verify": 0.0001, "load": end_s - read_end - 0.002, "device": 0.0, "check": 0.0009}
    rep = RankReport(rank=rank, host=f"node-{rank // 2}", local_rank=rank % 2, status="failed" if failed else "ok",
                     error=ERROR if failed else None, how="its own files", stages=stages, read_start_s=start,
                     read_end_s=read_end, end_s=end_s, bytes_read=got, bytes_needed=nbytes, requests=4, files=4,
                     read_mode="direct", verified=not failed, tensors=10, timeline=timeline,
                     intervals={f"shard-{rank}.bin": [(0, got)]},
                     plan={"ours": {"requests": 4, "bytes": got, "bytes_per_request": got / 4, "backward_seeks": 0,
                                    "files_touched": 4}})
    doc = dataclasses.asdict(rep)
    doc["read_gbps"] = rep.read_gbps
    return doc


def dist_doc(run_id: str, ends=ENDS, nbytes=BYTES, failed: set[tuple[int, int]] = frozenset()) -> dict:
    """A run document as rank 0 records it; `failed` holds (repeat, rank) pairs that fail."""
    repeats = [combine([report(r, e, nbytes[r % len(nbytes)], failed=(i, r) in failed) for r, e in enumerate(row)])
               for i, row in enumerate(ends)]
    world = SimpleNamespace(size=len(ends[0]), backend="gloo")
    listing = SimpleNamespace(source="/data/ckpt/llama-like", format="torch")
    return summarize(run_id, listing, world, vars(OPTIONS), "part", 2, repeats, {"date": "2026-12-01T03:00:00+00:00"})


def recorded(tmp_path, *docs) -> str:
    path = str(tmp_path / "results.csv")
    for d in docs:
        record(path, d, OPTIONS)
    return path


def lanes(screen) -> list[RankLane]:
    return list(screen.query(RankLane))


def repeat_text(screen, h) -> str:
    return h.text_of(screen.query_one("#ranks-repeat", Static))


async def test_a_lane_per_rank_and_the_straggler_is_the_rank_that_ended_last(make_app, h):
    doc = dist_doc("d15t00000001")
    app = make_app(None)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = RanksScreen(doc)
        await app.push_screen(screen)
        await pilot.pause()
        shown = lanes(screen)
        assert len(shown) == doc["world_size"] == 4
        last = max(range(4), key=lambda r: ENDS[0][r])  # from the test's own numbers, not slowest_rank
        assert [lane.rank for lane in shown if lane.has_class("-straggler")] == [last] == [1]
        assert "straggler" in h.text_of(screen.query_one("#lane-1 .lane-end-s", Static))
        assert "straggler" not in h.text_of(screen.query_one("#lane-0 .lane-end-s", Static))
        # a rank's stages total its own time, not the run's RTO (which ends with the straggler): four lanes read
        # "RTO" four ways for one run
        stages = str(screen.query_one("#lane-0 .lane-stages").render())
        own = sum(doc["repeats"][0]["ranks"][0]["stages"].values())
        assert "RTO" not in stages and f"this rank {own:.3f}s" in stages, stages
        # bars against the largest rank's bytes (150 MB): rank 2 read 90 of them
        bar = screen.query_one("#lane-2 .lane-bar", ProgressBar)
        assert (bar.progress, bar.total) == (90 * MB, 150 * MB)
        assert "largest rank's" in repeat_text(screen, h)
        head = h.text_of(screen.query_one("#ranks-run", Static))
        assert "4 ranks on 2 nodes" in head and "resharded from 2 ranks" in head and "gloo" in head
        assert f"median {doc['rto_stats']['median']:.3f} s" in head and "read amplification 1.00" in head


async def test_brackets_step_between_repeats(make_app, h):
    app = make_app(None)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = RanksScreen(dist_doc("d15t00000002"))
        await app.push_screen(screen)
        await pilot.pause()
        assert "repeat 1/2" in repeat_text(screen, h) and "RTO 0.520 s" in repeat_text(screen, h)
        await pilot.press("right_square_bracket")
        assert "repeat 2/2" in repeat_text(screen, h) and "RTO 0.620 s" in repeat_text(screen, h)
        assert [lane.rank for lane in lanes(screen) if lane.has_class("-straggler")] == [2]
        await pilot.press("right_square_bracket")  # past the last repeat: stays there
        assert "RTO 0.620 s" in repeat_text(screen, h)
        await pilot.press("left_square_bracket")
        assert "RTO 0.520 s" in repeat_text(screen, h)
        await pilot.press("escape")
        assert not isinstance(app.screen, RanksScreen)


async def test_a_failed_rank_shows_its_error(make_app, h):
    doc = dist_doc("d15t00000003", failed={(1, 3)})
    app = make_app(None)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = RanksScreen(doc)
        await app.push_screen(screen)
        await pilot.pause()
        error = screen.query_one("#lane-3 .lane-error", Static)
        assert not error.display and not screen.query_one("#lane-3", RankLane).has_class("-failed")
        await pilot.press("right_square_bracket")
        assert error.display and ERROR in h.text_of(error)
        assert screen.query_one("#lane-3", RankLane).has_class("-failed")
        assert not screen.query_one("#lane-0 .lane-error", Static).display
        assert "failed" in repeat_text(screen, h)
        # it read a third of its share: the figures say of how much
        assert f" of {human_bytes(150 * MB)} ·" in h.text_of(screen.query_one("#lane-3 .lane-figures", Static))
        assert " of " not in h.text_of(screen.query_one("#lane-0 .lane-figures", Static))
        # a failed repeat has no straggler: no lane is marked
        assert not [lane for lane in lanes(screen) if lane.has_class("-straggler")]


async def test_64_ranks_scroll_and_every_lane_keeps_its_rows(make_app, h):
    ends = [[0.2 + 0.001 * r for r in range(64)]]
    doc = dist_doc("d15t00000004", ends=ends)
    app = make_app(None)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = RanksScreen(doc)
        await app.push_screen(screen)
        await pilot.pause()
        shown = lanes(screen)
        assert len(shown) == 64
        assert all(lane.size.height >= 3 for lane in shown)  # squeezed lanes would be unreadable
        scroller = screen.query_one("#ranks-lanes", VerticalScroll)
        assert scroller.max_scroll_y > 0
        assert shown[-1].has_class("-straggler")
        scroller.scroll_end(animate=False)
        await pilot.pause()
        assert scroller.scroll_y == scroller.max_scroll_y
        assert shown[-1].region.intersection(scroller.region).height >= 3  # the last lane is now on screen


async def test_history_marks_dist_runs_and_enter_opens_their_lanes(make_app, tmp_path, h):
    older, newer = dist_doc("d15t000000a1"), dist_doc("d15t000000a2", ends=[[0.3, 0.2]], nbytes=[MB])
    app = make_app(None)
    app.results_path = recorded(tmp_path, older, newer)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        table = app.screen.query_one("#runs", DataTable)
        modes = [table.get_row_at(i)[4] for i in range(table.row_count)]
        assert modes == ["dist ×4 part", "dist ×2 part"]
        await pilot.press("down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, RanksScreen) and app.screen.doc["run_id"] == "d15t000000a2"
        assert len(lanes(app.screen)) == 2


def test_read_rates_and_the_lane_spark():
    rank = {"read_start_s": 0.0, "timeline": [[0.1, 100 * MB], [0.2, 300 * MB], [0.2, 300 * MB]]}
    assert read_rates(rank) == [(0.0, 0.1, 1.0), (0.1, 0.2, 2.0)]
    assert read_rates({"read_start_s": 0.0, "timeline": []}) == []
    # on a 0.4 s axis in 4 cells: half height, full height, then nothing read
    assert spark_cells(read_rates(rank), 0.4, 4, 2.0) == "▄█  "


def _tui(args) -> tuple[int, str]:
    from ckptbench.cli import root as cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["tui", *args])
    return rc, err.getvalue()


def test_ranks_without_a_dist_run_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "results.csv"
    (tmp_path / "results.csv.jsonl").write_text(json.dumps({"record": "run", "kind": "restore", "run_id": "x"}) + "\n")
    rc, err = _tui(["--results", str(path), "--ranks"])
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "no distributed run recorded" in err and "Traceback" not in err
    rc, err = _tui(["--results", str(tmp_path / "none.csv"), "--ranks"])
    assert rc == 2 and len(err.splitlines()) == 1 and "no such file" in err, err


def test_ranks_opens_the_newest_dist_run(tmp_path, monkeypatch):
    from ckptbench.cli import ui
    from tui.app import CkptbenchApp

    path = recorded(tmp_path, dist_doc("d15t000000b1"), dist_doc("d15t000000b2", ends=[[0.3, 0.2]]))
    started = []
    monkeypatch.setattr(CkptbenchApp, "run", lambda self: started.append(self.ranks))
    monkeypatch.setattr(ui, "has_terminal", lambda: True)  # the test's output is captured: no terminal, and no UI runs
    rc, err = _tui(["--results", path, "--ranks"])
    assert rc == 0, err
    assert [d["run_id"] for d in started] == ["d15t000000b2"] == [newest_dist_run(path)["run_id"]]


async def test_the_app_opens_on_the_ranks_screen_when_given_a_run(tmp_path, h):
    from tui.app import CkptbenchApp

    doc = dist_doc("d15t000000c1")
    app = CkptbenchApp(None, results_path=str(tmp_path / "results.csv"), ranks=doc)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, RanksScreen) and app.screen.doc is doc


def test_ranks_screen_snapshot(snap_compare, h):
    from tui.app import CkptbenchApp

    doc = dist_doc("d15t00000005", ends=ENDS + [[0.35, 0.5, 0.44, 0.2]], failed={(2, 3)})
    doc["dcp_reader"] = {"bytes": 612 * MB, "amplification": 1.19, "requests": 96, "backward_seeks": 12}
    app = CkptbenchApp(None, results_path="/nonexistent/results.csv", ranks=doc)
    app.animation_level = "none"

    async def first_repeat(pilot):
        await pilot.pause()
        assert re.search(r"repeat 1/3", h.text_of(pilot.app.screen.query_one("#ranks-repeat", Static)))

    assert snap_compare(app, terminal_size=h.SIZE, run_before=first_repeat)
