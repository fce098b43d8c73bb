"""Loop mode and auto-tune on real reads of a small file set: passes are counted, cancel ends the loop within the
pass in hand, concurrency changes reach the read in hand and later passes, and the tuner's knee is the sweep's
knee on the rates it measured (each rate recomputed here from the recorded samples)."""

from __future__ import annotations

import os
import threading

import pytest

from ckptbench.core import concurrency as conc
from ckptbench.restore.autotune import AutoTune, Level, attach, ladder
from ckptbench.core.errors import CkptbenchError
from ckptbench.restore.loop import ReadLoop, Sample
from ckptbench.sources import ReadOptions, open_source
from ckptbench.restore.sweep import knee

FILES, FILE_SIZE = 4, 4 << 20


@pytest.fixture(scope="module")
def file_set(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("loop")
    for i in range(FILES):
        (root / f"part-{i}.bin").write_bytes(os.urandom(FILE_SIZE))
    return str(root)


def opts(concurrency: int = 1) -> ReadOptions:
    return ReadOptions(concurrency=concurrency, read="pread", hash="crc32c")


def run_in_thread(loop: ReadLoop, **kw) -> threading.Thread:
    t = threading.Thread(target=loop.run, kwargs=kw, daemon=True)
    t.start()
    return t


def test_loop_reads_every_byte_once_per_pass(file_set):
    loop = ReadLoop(file_set, opts(2))
    done = []
    assert loop.run(max_passes=3, on_pass=done.append) == 3
    assert [p.pass_no for p in done] == [1, 2, 3] and loop.passes == 3 and loop.status == "stopped"
    for p in done:
        assert p.bytes == FILES * FILE_SIZE and p.files_failed == 0 and p.concurrency == 2
        assert p.read_gbps == pytest.approx(p.bytes / p.seconds / 1e9)
    assert loop.snapshot() is None and loop.live_concurrency() is None  # between passes: no read in hand


def test_each_pass_carries_its_list_and_read_stages_and_its_rto(file_set):
    """issue #24 item 6c: the dashboard's stage box shows each pass's breakdown and RTO from these."""
    loop = ReadLoop(file_set, opts(2))
    seen = []
    loop.watch(lambda s: seen.append((loop.stage, dict(loop.stages))))
    done = []
    loop.run(max_passes=2, on_pass=done.append)
    for p in done:
        assert set(p.stages) == {"list", "read"} and p.stages["read"] == p.seconds and p.stages["list"] > 0
        assert p.rto_s == pytest.approx(p.stages["list"] + p.stages["read"])
    assert seen and all(stage == "read" and set(stages) == {"list"} for stage, stages in seen)  # mid-read
    assert done[0].stages["list"] != done[1].stages["list"]  # each pass lists again, as a restore does
    assert loop.stage is None and loop.stages == {}


def test_cancel_from_a_pass_ends_the_loop_with_that_pass(file_set):
    loop = ReadLoop(file_set, opts())
    samples: list[Sample] = []

    def watcher(s: Sample) -> None:
        samples.append(s)
        if s.pass_no == 5:
            loop.cancel()

    loop.watch(watcher)
    passes = loop.run()  # no max_passes: only cancel ends it
    assert passes in (4, 5)  # the fifth pass is cancelled, or had already read its last byte
    assert max(s.pass_no for s in samples) == 5 and loop.status == "stopped"


def test_cancel_from_another_thread_ends_a_running_loop(file_set):
    loop = ReadLoop(file_set, opts())
    reached = threading.Event()
    loop.watch(lambda s: reached.set() if s.pass_no >= 3 else None)
    t = run_in_thread(loop)
    assert reached.wait(30), "the loop never reached its third pass"
    loop.cancel()
    at_cancel = loop.passes
    t.join(30)
    assert not t.is_alive() and loop.status == "stopped"
    assert at_cancel <= loop.passes <= at_cancel + 1


def test_set_concurrency_reaches_the_pass_in_hand_and_later_passes(file_set):
    loop = ReadLoop(file_set, opts(1))
    samples: list[Sample] = []
    results = []

    def watcher(s: Sample) -> None:
        samples.append(s)
        if s.pass_no == 2 and s.bytes == 0 and loop.opts.concurrency == 1:
            assert loop.set_concurrency(3) == 3  # what the live read now has in force

    loop.watch(watcher)
    loop.run(max_passes=4, on_pass=results.append)
    assert [p.concurrency for p in results] == [1, 3, 3, 3]
    assert {s.concurrency for s in samples if s.pass_no >= 3} == {3}
    assert loop.set_concurrency(10**6) == conc.MAX  # clamped to the one bound


def test_cold_loop_prepares_the_cache_before_every_pass(file_set):
    src = open_source(file_set)
    asked = []
    real = src.prepare_cache

    def prepare_cache(listing, cache, **kw):
        asked.append(cache)
        return real(listing, cache, **kw)

    src.prepare_cache = prepare_cache
    done = []
    ReadLoop(src, opts(), cache="cold").run(max_passes=3, on_pass=done.append)
    assert asked == ["cold"] * 3
    assert all(p.cache.startswith("cold") for p in done)


def test_a_missing_source_fails_in_one_line(tmp_path):
    loop = ReadLoop(str(tmp_path / "absent"), opts())
    with pytest.raises(CkptbenchError):
        loop.run(max_passes=1)
    assert loop.status == "failed" and loop.passes == 0


# -- auto-tune -------------------------------------------------------------------------------------------------


def test_ladder_doubles_up_to_the_bound():
    assert ladder(64) == [1, 2, 4, 8, 16, 32, 64]
    assert ladder(48) == [1, 2, 4, 8, 16, 32, 48]
    assert ladder()[-1] == conc.MAX and ladder(1) == [1]


def record(file_set, levels: list[int], per_level_s: float) -> list[Sample]:
    """Samples of a real loop that holds each of `levels` for `per_level_s` of reader time, in order."""
    loop = ReadLoop(file_set, opts(levels[0]))
    samples: list[Sample] = []
    state = {"i": 0, "held": 0.0}

    def watcher(s: Sample) -> None:
        prev = samples[-1] if samples else None
        samples.append(s)
        if prev and prev.pass_no == s.pass_no and s.concurrency == prev.concurrency == levels[state["i"]]:
            state["held"] += s.seconds - prev.seconds
        if state["held"] >= per_level_s:
            state["i"] += 1
            state["held"] = 0.0
            if state["i"] == len(levels):
                loop.cancel()
            else:
                loop.set_concurrency(levels[state["i"]])

    loop.watch(watcher)
    t = run_in_thread(loop)
    t.join(120)
    assert not t.is_alive()
    return samples


def rate_by_hand(samples: list[Sample], level: int, settle_s: float, hold_s: float) -> float:
    """The rate at `level` as the docstring of autotune defines it: same-pass intervals at that level, the first
    `settle_s` of them dropped, until `hold_s` is measured."""
    settled = measured = 0.0
    nbytes = 0
    for a, b in zip(samples, samples[1:]):
        if a.pass_no != b.pass_no or a.concurrency != level or b.concurrency != level or b.seconds <= a.seconds:
            continue
        if settled < settle_s:
            settled += b.seconds - a.seconds
            continue
        measured += b.seconds - a.seconds
        nbytes += b.bytes - a.bytes
        if measured >= hold_s:
            return nbytes / measured / 1e9
    raise AssertionError(f"level {level} was not held for {hold_s} s in the recording")


def test_the_tuner_stops_at_the_sweeps_knee_on_a_recorded_real_read(file_set):
    levels = [1, 2, 4, 8]
    samples = record(file_set, levels, per_level_s=1.0)  # more than settle + hold + one interval
    tuner = AutoTune(levels, settle_s=0.1, hold_s=0.4)
    finished = [lv for s in samples if (lv := tuner.feed(s)) is not None]
    assert tuner.done and finished == tuner.measured
    assert [m.concurrency for m in finished] == levels[:len(finished)]
    for m in finished:
        assert m.seconds >= 0.4 and m.gbps > 0
        assert m.gbps == pytest.approx(rate_by_hand(samples, m.concurrency, 0.1, 0.4), rel=1e-9)
    rates = {m.concurrency: m.gbps for m in finished}
    assert tuner.knee == knee(rates)[0]
    # it stopped at the first level that did not pay: every earlier level was still the knee of what came before
    for i in range(1, len(finished)):
        assert knee({m.concurrency: m.gbps for m in finished[:i]})[0] == finished[i - 1].concurrency
    last = finished[-1].concurrency
    assert knee(rates)[0] != last or last == levels[-1]


def test_attached_tuner_walks_a_live_loop_and_leaves_it_at_the_knee(file_set):
    loop = ReadLoop(file_set, opts(8))
    tuner = AutoTune([1, 2, 4, 8, 16], settle_s=0.05, hold_s=0.3)
    seen: list[Level] = []
    ended: list[Level] = []

    def done(lv: Level) -> None:
        ended.append(lv)
        loop.cancel()

    attach(loop, tuner, on_level=seen.append, on_done=done)
    assert loop.opts.concurrency == 1  # the walk starts at the bottom of the ladder
    t = run_in_thread(loop)
    t.join(120)
    assert not t.is_alive() and tuner.done
    assert seen == tuner.measured and [m.concurrency for m in seen] == [1, 2, 4, 8, 16][:len(seen)]
    assert len(ended) == 1 and ended[0].concurrency == tuner.knee == knee(tuner.rates)[0]
    assert loop.opts.concurrency == tuner.knee
    assert all(m.seconds >= 0.3 and m.label == f"c={m.concurrency} {m.gbps:.1f} GB/s" for m in seen)

