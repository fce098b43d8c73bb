"""The one live line (bytes done of total, rate now and on average, one ETA) and its four users: run, dist, watch,
save. Driven with a fake terminal."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from ckptbench.core.progress import ProgressLine, Rates, eta_s, live_line


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def last(stream: Tty) -> str:
    return stream.getvalue().split("\r")[-1].strip()


def test_eta_is_what_is_left_at_the_average_rate():
    assert eta_s(25, 100, 5.0) == pytest.approx(15.0)
    assert eta_s(0, 100, 5.0) is None and eta_s(100, 100, 5.0) is None and eta_s(10, None, 1.0) is None


def test_rates_now_and_average_on_one_clock():
    r = Rates()
    assert r.update(1.0, 2_000_000_000) == pytest.approx((2.0, 2.0))
    assert r.update(2.0, 3_000_000_000) == pytest.approx((1.0, 1.5))
    assert r.update(0.5, 500_000_000) == pytest.approx((1.0, 1.0))  # a clock that went back: a new read


def test_line_shows_progress_rates_and_eta():
    text = live_line(250 * 2**20, 1000 * 2**20, 1.5, 1.25, 12.0, head="[1] ", tail="  x")
    assert text.startswith("[1]  25 %") and "1.50 GB/s now" in text and "1.25 avg" in text and "ETA 12s" in text
    assert text.endswith("  x")
    assert "ETA" not in live_line(5, None, 0.0, 0.0, None)
    for done, share in ((0, "0.0 %"), (50, "5.0 %"), (250, " 25 %"), (1000, "100 %")):  # one width from 0 to 100 %
        assert live_line(done, 1000, 1.0, 1.0, None).startswith(share + " ")


def test_silent_when_not_a_terminal_and_clear_leaves_a_clean_line():
    quiet = io.StringIO()
    ProgressLine(quiet).progress(1, 2, 1.0)
    assert quiet.getvalue() == ""
    tty = Tty()
    line = ProgressLine(tty)
    line.progress(500, 1000, 1.0, head="h ")
    line.clear()
    assert tty.getvalue().endswith("\r") and line.width == 0


def _snap(done, planned, elapsed, finished=False):
    return SimpleNamespace(bytes=done, bytes_planned=planned, elapsed_s=elapsed, finished=finished, files_done=1,
                           files_failed=0, files_total=2, active_workers=4, concurrency=8, retries=0,
                           latency_us=lambda q: 100.0)


def test_run_line_is_the_shared_line():
    from ckptbench.cli.run import StageProgress

    tty = Tty()
    p = StageProgress(tty)
    p.repeat = 1
    p("read", _snap(2_000_000_000, 4_000_000_000, 1.0))
    assert last(tty).startswith("[1] read") and "2.00 GB/s now" in last(tty) and "ETA 1s" in last(tty)
    p("read", _snap(4_000_000_000, 4_000_000_000, 2.0, finished=True))
    assert "ETA" not in last(tty)


def test_dist_line_is_the_shared_line():
    from ckptbench.cli.dist import RanksLine
    from ckptbench.distributed.live import Summary

    tty = Tty()
    RanksLine(tty)(2, Summary({"read": 3, "done": 1}, 1_000_000_000, 4_000_000_000, 3, 0.1, 1.0))
    text = last(tty)
    assert text.startswith("[2] ranks: read 3 done 1 |") and " 25 %" in text and "ETA 3s" in text
    assert "behind: rank 3 at 10 %" in text


def test_watch_line_is_the_shared_line_with_the_average_since_reading_began(monkeypatch):
    from ckptbench.cli import watch as cli_watch

    tty = Tty()
    monkeypatch.setattr(cli_watch.sys, "stderr", tty)
    line = cli_watch._LiveLine(total=4_000_000_000)
    sample = SimpleNamespace(rss_bytes=2**20, files=["a"])

    def interval(t0, t1, n, phase="reading"):
        return SimpleNamespace(t0=t0, t1=t1, bytes=n, disk_bytes=0, gbps=n / (t1 - t0) / 1e9, phase=phase,
                               cpu_cores=1.0, top_thread_cores=0.5)

    line(interval(0.0, 5.0, 0, phase="importing"), sample)
    line(interval(5.0, 6.0, 1_000_000_000), sample)
    text = last(tty)
    assert " 25 %" in text and "1.00 avg" in text and "ETA 3s" in text and "files open 1" in text
    assert "(busiest thread 50 %)" in text


def test_save_line_is_the_shared_line(monkeypatch):
    from ckptbench.cli import save as cli_save

    tty, out = Tty(), io.StringIO()
    line = cli_save.SaveLine(4, tty)
    line.begin()
    line.saved(SimpleNamespace(bytes=1000), lambda: out.write("save 1\n"))
    assert out.getvalue() == "save 1\n"
    text = last(tty)
    assert text.startswith("save 2/4") and " 25 %" in text
    line.sample(SimpleNamespace(dirty_bytes=1024, writeback_bytes=1024))
    assert "dirty+writeback 2.0 KiB" in last(tty)
