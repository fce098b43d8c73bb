"""How the read benchmark measures: its settings, a row of its tables (Measure), and Bench, which sets the page
cache hot or cold before each repeat and runs fastio, fio, the thread pool and the reference loop over the file
set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import _peers
from _harness import MiB, Series, log

BLOCK = 1 * MiB
HOT_WORKERS = 2
COLD_CONCURRENCY = 16
RSS_BASE = 64 * MiB


@dataclass(kw_only=True)
class Measure(Series):
    """A row of the read tables (condition: hot, cold, memory, rss): the tool, its settings, the row it is set
    against."""

    tool: str
    config: str
    peer: str | None = None
    short: str = ""  # how the ratio column names this row when it is the peer


class Bench:
    def __init__(self, files: list[tuple[str, int]], repeat: int, fio: str):
        import fastio

        self.fastio = fastio
        self.files = files
        self.paths = [p for p, _ in files]
        self.total = sum(s for _, s in files)
        self.repeat = repeat
        self.fio = fio
        self.results: dict[str, Measure] = {}
        self.digests: dict[str, dict[str, str]] = {}
        self.load: list[float] = []  # 1-minute load average at start and end
        self.other = _peers.OtherWork()  # CPU other processes take: other work skews the figures

    def residency(self) -> float:
        return self.fastio.residency(self.paths).fraction

    def make_hot(self) -> float:
        self.fastio.read_files(self.files, hash="none", concurrency=HOT_WORKERS)
        return self.residency()

    def make_cold(self) -> float:
        self.fastio.evict(self.paths)
        return self.residency()

    def prepare(self, condition: str) -> float | None:
        if condition == "hot":
            return self.make_hot()
        if condition == "cold":
            return self.make_cold()
        return None

    def measure(self, m: Measure, run: Callable[[], _peers.Timed]) -> Measure:
        """`repeat` runs, each after setting up and checking the page-cache state."""
        log(f"  {m.condition:5} {m.tool} {m.config}")
        for _ in range(self.repeat):
            res = self.prepare(m.condition)
            if res is not None:
                m.residency.append(res)
            t = run()
            if t.bytes != self.total:
                raise RuntimeError(f"{m.key}: read {t.bytes} bytes, the file set has {self.total}")
            m.samples.append(t.bytes / t.seconds / 1e9)
        self.results[m.key] = m
        return m

    def fastio_run(self, read: str, hash: str, concurrency: int) -> _peers.Timed:
        r = self.fastio.read_files(self.files, read=read, hash=hash, concurrency=concurrency,
                                   block_size=BLOCK)
        if r.failed:
            f = r.failed[0]
            raise RuntimeError(f"fastio {read}/{hash}: {len(r.failed)} files failed, "
                               f"e.g. {f.path}: {f.error}")
        if hash == "md5":
            self.digests[f"fastio-{read}"] = {f.path: f.digest for f in r.files}
        return _peers.Timed(r.bytes, r.seconds)

    def fio_run(self, **kw) -> _peers.Timed:
        return _peers.run_fio(self.fio, self.files, block_size=BLOCK, **kw)[0]

    def pool_run(self) -> _peers.Timed:
        t, self.digests["pool"] = _peers.thread_pool_md5(self.paths, HOT_WORKERS)
        return t

    def loop_run(self) -> _peers.Timed:
        t, self.digests["reference"] = _peers.reference_md5_loop(self.paths)
        return t
