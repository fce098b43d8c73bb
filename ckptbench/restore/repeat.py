"""One repeat of a restore, as data: the settings it runs with (RunOptions, its read settings a ReadOptions) and
what it gives (RepeatResult). runner.py runs it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ckptbench.core.errors import CkptbenchError
from ckptbench.core.options import RESTORE_MODES as MODES  # spelled once, in core
from ckptbench.sources import ReadOptions
from ckptbench.system import pagecache as conditions

_AUTO_READ = ReadOptions(read="auto")  # a restore's read path: chosen per repeat from the cache and the filesystem


@dataclass(frozen=True)
class RunOptions:
    """A restore's settings: how it loads (mode, cache, device, ...) and how it reads, a ReadOptions, whose fields are
    declared and checked there once. `hash` stays here: None means the manifest's digest, which only a restore
    knows (a ReadOptions always names one)."""

    mode: str = "fused"
    cache: str = "as-is"
    reading: ReadOptions = _AUTO_READ
    hash: str | None = None  # None: the manifest's hash, else crc32c
    device: str = "cpu"
    drop_caches: bool = False
    optimizer_step: bool = False
    stage_dir: str | None = None  # S3: download here (temporary names, renamed when whole and verified)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise CkptbenchError(f"unknown mode {self.mode!r}: choose staged or fused")
        if self.cache not in conditions.CACHE_MODES:
            raise CkptbenchError(f"--cache {self.cache!r}: choose cold, hot or as-is")
        self.read_options(self.hash or "crc32c")

    @classmethod
    def make(cls, **settings) -> "RunOptions":
        """Options from flat settings (as the CLI and the TUI hold them): ReadOptions' fields go to `reading`."""
        return cls().but(**settings)

    def but(self, **changes) -> "RunOptions":
        """These options with `changes`, each to where it is declared (a read setting to `reading`)."""
        mine = {k: v for k, v in changes.items() if k != "reading" and k in _OWN}
        read = {k: v for k, v in changes.items() if k in _READ}
        unknown = set(changes) - set(mine) - set(read) - {"reading"}
        if unknown:
            raise TypeError(f"not a restore setting: {sorted(unknown)}")
        reading = changes.get("reading", self.reading)
        if "block_size" in read and "chunk_size" not in read:
            read["chunk_size"] = None  # derived from the block size: derived again, as a new ReadOptions would
        return replace(self, **mine, reading=replace(reading, **read) if read else reading)

    def read_options(self, alg: str) -> ReadOptions:
        return replace(self.reading, hash=alg)

    def settings(self) -> dict:
        """The flat view documents record: this restore's own settings and the read settings it was made with."""
        return {k: getattr(self, k) for k in _OWN if k != "reading"} | {k: getattr(self.reading, k) for k in _SHOWN}

    # the read settings a restore is known by, read through from `reading` (never stored twice)
    concurrency = property(lambda self: self.reading.concurrency)
    read = property(lambda self: self.reading.read)
    block_size = property(lambda self: self.reading.block_size)
    part_size = property(lambda self: self.reading.part_size)
    s3_client = property(lambda self: self.reading.s3_client)


_OWN = tuple(f.name for f in fields(RunOptions))
_READ = tuple(f.name for f in fields(ReadOptions) if f.name != "hash")
_SHOWN = ("concurrency", "read", "block_size", "part_size", "s3_client")


@dataclass
class RepeatResult:
    stages: dict[str, float]
    notes: dict[str, str]
    rto_s: float
    bytes: int
    files: int
    files_restored: int
    read_gbps: float  # bytes over the read stage's wall time
    engine_gbps: float  # the reader's own rate, first open to last byte
    retries: int
    errors: dict[str, int]
    cache: conditions.CacheCondition
    peak_rss_bytes: int
    cpu_s: float
    status: str = "ok"
    problems: list[str] = field(default_factory=list)
    retry_classes: dict[str, int] = field(default_factory=dict)
    warmup_s: float = 0.0  # one-time process costs paid before this repeat's clock started (not in the RTO)
    verified: bool = False  # every file's digest matched a reference (the manifest's, in its own hash)
    read_mode: str = ""  # the read path this repeat used (what `auto` picked)
    read_why: str = ""
    check_kind: str = ""  # "model step" (a forward pass of the restored model) or "structural" (no model to run)
    populated_bytes: int = 0  # fresh destination bytes the read populated, and its workers' CPU time in it: the
    populate_cpu_s: float = 0.0  # rate this box gave fresh memory at in this repeat (fastio.Snapshot)

    @property
    def success_rate(self) -> float:
        return self.files_restored / self.files if self.files else 0.0

