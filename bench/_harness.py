"""What every benchmark script shares: progress lines, tool checks, the page cache set hot or cold and the disk
reads of a repeat, figures over repeats, targets, the report files.

A figure is a Series of repeats, shown and judged on its median; a Target sets one series against another (a ratio)
or against a bound; each script's report goes to stdout and to bench/out/<name>.md and .json.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "bench", "out")
sys.path.insert(0, ROOT)  # fastio is built in place in the repo root

from ckptbench.core.stats import spread  # noqa: E402

SETTLE_DEFAULT_S = 10.0
SETTLE_S = SETTLE_DEFAULT_S  # settle(): set by a script's --settle
HOT_MIN, COLD_MAX = 0.95, 0.05  # page-cache residency a hot repeat needs at least, a cold one at most
MiB, KiB, GiB = 1 << 20, 1 << 10, 1 << 30


def log(msg: str) -> None:
    """A progress line on stderr; stdout carries the report."""
    print(msg, file=sys.stderr, flush=True)


def missing(script: str, executables: Sequence[str] = (), modules: Sequence[str] = (),
            install: str = "") -> str | None:
    """One line saying what to install, or None when every executable and Python module is there."""
    for exe in executables:
        if shutil.which(exe) is None:
            return f"{script}: {exe} not found; install it with `apt-get install {exe}`"
    absent = [m for m in modules if not _importable(m)]
    if "fastio" in absent:
        return f"{script}: fastio is not built; run `make build` in the repo root"
    if absent:
        how = install or "pip install " + " ".join(absent)
        return f"{script}: missing Python package(s) {', '.join(absent)}; install with `{how}`"
    return None


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def settle() -> None:
    """Waits SETTLE_S before a timed run or a measurement of fresh memory, after the last process's memory (or the
    page cache's, evicted) was freed. On a VM with free page reporting (Firecracker, virtio-balloon; 2 MiB blocks,
    page_reporting_order 9 here) freed memory goes back to the host a few seconds after it is freed, and memory
    taken again before that populates several times faster: a C loop landing the 4 GiB set right after the
    previous one exited took 0.9 s, 2 s later 2.2, 5 s later 3.4, 10 s later 3.7-4.1, 20 s later 4.3-4.5
    (2026-12-05). A contender that starts in a millisecond (the C loop) won by that alone over one that imports
    for a second or two (every Python loader), and a restore in a new process after a failure lands in memory
    the host backs again. Every contender waits the same time after the last free."""
    if SETTLE_S > 0:
        time.sleep(SETTLE_S)


def make_hot(paths: Sequence[str]) -> float:
    """Reads the files into the page cache (2 pread workers, no hash); their residency after."""
    import fastio

    fastio.read_files(paths, concurrency=2, read="pread", hash="none")
    return fastio.residency(paths).fraction


def make_cold(paths: Sequence[str]) -> float:
    """Evicts the files from the page cache; their residency after."""
    import fastio

    fastio.evict(paths)
    return fastio.residency(paths).fraction


def disk_read_bytes(children: bool = False) -> int:
    """Bytes this process (or its waited-for children) made the kernel read from a block device: getrusage's
    ru_inblock, in 512-byte units, counted where reads are submitted to the device, so page-cache hits add
    nothing. A hot repeat that reads from the disk was not hot, whatever residency said before it began."""
    return resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_inblock * 512


def cache_dir(name: str) -> str:
    """Where a benchmark keeps its data set between runs: $XDG_CACHE_HOME (or ~/.cache)/ckptbench/<name>."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckptbench", name)


def child_env() -> dict[str, str]:
    """This environment with the repo root first on PYTHONPATH, so a child imports the fastio built in place."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


@dataclass(frozen=True)
class Shape:
    """A benchmark's file set: `big_files` files of `big_size` bytes and `small_files` of `small_size`."""

    big_files: int
    big_size: int
    small_files: int
    small_size: int

    @property
    def files(self) -> int:
        return self.big_files + self.small_files

    @property
    def total(self) -> int:
        return self.big_files * self.big_size + self.small_files * self.small_size

    def describe(self) -> str:
        return (f"{self.big_files} × {self.big_size // MiB} MiB + {self.small_files} × {self.small_size // KiB} KiB "
                f"= {self.total / MiB:.0f} MiB")


def held(condition: str, residency: float | None) -> bool:
    """The page-cache share before a repeat is what `condition` (hot or cold) needs; None (not measured) is not."""
    if residency is None:
        return False
    return residency >= HOT_MIN if condition == "hot" else residency <= COLD_MAX


@dataclass
class Series:
    """One figure over repeats and the condition they ran under; a script subclasses it for what its rows add."""

    key: str
    condition: str  # "hot" and "cold" are checked against `residency`; other conditions need no check
    unit: str
    samples: list[float] = field(default_factory=list)
    residency: list[float] = field(default_factory=list)  # page-cache share before each repeat
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float | None:
        return spread(self.samples)["median"]

    @property
    def min(self) -> float | None:
        return spread(self.samples)["min"]

    @property
    def max(self) -> float | None:
        return spread(self.samples)["max"]

    @property
    def verified(self) -> bool:
        """Every repeat ran in the cache state its condition names (hot or cold); other conditions always do."""
        if self.condition not in ("hot", "cold"):
            return True
        return bool(self.residency) and all(self._held(r) for r in self.residency)

    @property
    def ok(self) -> bool:
        """Every repeat passed its own check; series whose repeats are checked say otherwise."""
        return True

    def _held(self, residency: float) -> bool:
        return held(self.condition, residency)

    def unverified_because(self) -> str:
        bad = [r for r in self.residency if not self._held(r)]
        return f"residency {bad[0]:.2f}" if bad else "residency not measured"

    def condition_label(self) -> str:
        """The condition, or that the cache state was not confirmed, instead of calling the repeats hot or cold."""
        return self.condition if self.verified else f"{self.condition}? NOT VERIFIED ({self.unverified_because()})"

    def as_dict(self) -> dict:
        return asdict(self) | {"median": self.median, "min": self.min, "max": self.max, "verified": self.verified}


@dataclass(kw_only=True)
class CheckedSeries(Series):
    """A series whose every repeat is checked: its status ("ok" or "failed"), the problems found, and the share of
    the set's bytes it read from the disk."""

    disk: list[float] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s == "ok" for s in self.status)


@dataclass(frozen=True)
class Target:
    """Met when the figure lies in [low, high]. The figure is the subject's median over the peer's, or with no peer
    the subject's own median (its worst repeat with `worst`)."""

    name: str
    subject: str
    peer: str | None = None
    low: float = -float("inf")
    high: float = float("inf")
    invert: bool = False  # peer / subject: a speed-up
    paired: bool = False  # the median of per-repeat ratios, for repeats run back to back in pairs
    worst: bool = False  # no peer: the largest repeat instead of the median
    shown: str = "{:.2f}×"  # how the report prints the figure


def rotated(items: list, round_index: int) -> list:
    """`items` started at position round_index (mod its length): who goes first changes every round."""
    if not items:
        return []
    k = round_index % len(items)
    return items[k:] + items[:k]


def figure(t: Target, series: Mapping[str, Series]) -> float | None:
    """The number `t` is judged on, or None when a series it needs has no repeats (or a zero median to divide by)."""
    s = series.get(t.subject)
    if s is None or not s.samples:
        return None
    if t.peer is None:
        return s.max if t.worst else s.median
    p = series.get(t.peer)
    if p is None or not p.samples:
        return None
    num, den = (p, s) if t.invert else (s, p)
    if t.paired and len(num.samples) == len(den.samples) and all(den.samples):
        return statistics.median(a / b for a, b in zip(num.samples, den.samples))
    return num.median / den.median if den.median else None


def judge(t: Target, series: Mapping[str, Series]) -> dict:
    """The verdict on `t`: met or MISSED, else why it could not be judged; with the figure and how it reads."""
    value = figure(t, series)
    verdict = {"target": t.name, "status": "not measured", "value": value}
    if value is not None:
        used = [series[t.subject]] + ([series[t.peer]] if t.peer else [])
        if not all(s.verified for s in used):
            status = "not verified (cache state)"
        elif not all(s.ok for s in used):
            status = "FAILED its check"
        else:
            status = "met" if t.low <= value <= t.high else "MISSED"
        verdict |= {"status": status, "detail": t.shown.format(value)}
    return verdict | {"subject": t.subject, "peer": t.peer}


def fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    """A figure as the tables print it: fixed digits and the unit if given; — when there is none."""
    if value is None:
        return "—"
    return f"{value:.{digits}f}" + (f" {unit}" if unit else "")


def series_table(series: Iterable[Series], head: Sequence[str], label: Callable[[Series], str],
                 number: Callable[[Series, float | None], str], more: Callable[[Series], list[str]]) -> list[str]:
    """A Markdown table, a row per series: condition, label, median, min–max, then `more`'s cells; `head` names
    every column."""
    rows = ["| " + " | ".join(head) + " |", "|---|---|---:|" + "---|" * (len(head) - 3)]
    for s in series:
        span = f"{number(s, s.min)}–{number(s, s.max)}" if s.samples else "—"
        rows.append("| " + " | ".join([s.condition_label(), label(s), number(s, s.median), span, *more(s)]) + " |")
    return rows


def section(title: str, items: Iterable[str]) -> list[str]:
    """A `## title` section of bullet lines, preceded by a blank line."""
    return ["", f"## {title}", ""] + [f"- {item}" for item in items]


def targets_section(verdicts: Iterable[dict]) -> list[str]:
    return section("Targets", (f"{v['status']}: {v['target']}" + (f" ({v['detail']})" if v.get("detail") else "")
                               for v in verdicts))


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def preface(date: str, machine: Mapping[str, object]) -> list[str]:
    """The lines the written report carries above the figures: when, and on what (the snapshot's own date, taken
    at the end, is left to the JSON record)."""
    facts = [f"- {k}: {v}" for k, v in machine.items() if k != "date"]
    return [f"Date: {date}", "", "Machine:", ""] + facts + [""]


def write_outputs(name: str, markdown: str, record: dict) -> None:
    """bench/out/<name>.md and bench/out/<name>.json."""
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, f"{name}.md"), "w") as f:
        f.write(markdown)
    with open(os.path.join(OUT_DIR, f"{name}.json"), "w") as f:
        json.dump(record, f, indent=2, default=str)
        f.write("\n")


def machine(directory: str, fio: str | None = None) -> dict:
    """ckptbench.system.env.snapshot of `directory`, plus what only the benchmarks report: fio's version, fastio's
    crc32c kernel."""
    from ckptbench.system import env

    facts = env.snapshot(directory)
    if fio is not None:
        facts["fio"] = fio_version(fio)
    facts["crc32c_kernel"] = _crc32c_kernel()
    return facts


def fio_version(fio: str) -> str:
    try:
        out = subprocess.run([fio, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"unknown ({fio}: {exc.strerror or exc})"
    return out.stdout.strip() or out.stderr.strip() or f"unknown ({fio} --version printed nothing)"


def _crc32c_kernel() -> str:
    try:
        import fastio
    except ImportError as exc:
        return f"unknown (fastio: {exc})"
    return fastio.crc32c_impl()
