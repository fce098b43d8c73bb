"""What a series of saves is on record: its options, each save's timings, and the report the analysis makes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ckptbench.save.preflight import Check
from ckptbench.system.writeback import WritebackSample

HEADROOM = 1.25  # a safe interval leaves a quarter of the save's time spare for a slow one


@dataclass(frozen=True)
class SaveOptions:
    format: str = "safetensors"
    interval_s: float | None = None
    count: int = 3
    keep: int = 2
    ranks: int = 1
    stagger_s: float = 0.0
    async_save: bool = False
    fsync: bool = True


@dataclass
class SaveTiming:
    index: int
    name: str
    bytes: int
    blocking_s: float  # until training could continue: the whole save, or staging for --async
    written_s: float  # until the writes returned
    durable_s: float  # until files and directory were fsync'd and the save renamed into place
    overran: bool  # took longer than the interval: the next save would start late
    spans: list = field(default_factory=list)  # each rank's write: {rank, start_s, end_s, bytes}
    # this save's own page cache, from the samples taken since the save before it ended (None: no sample fell in it);
    # the run's, over every sample, are the report's
    dirty_peak_fraction: float | None = None
    throttled: bool | None = None


@dataclass
class SaveReport:
    target: str
    format: str
    bytes: int
    saves: list[SaveTiming]
    samples: list[WritebackSample]
    preflight: list[Check]
    sustained_gbps: float | None
    needed_gbps: float | None
    shortest_safe_interval_s: float | None
    dirty_peak_fraction: float | None
    throttled: bool
    write_amplification: float | None
    options: SaveOptions = field(default_factory=SaveOptions)
    stagger: dict | None = None
    notes: list[str] = field(default_factory=list)
    floor: dict = field(default_factory=dict)  # the saves against the box's write floor (system/writefloor.py)

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["options"] = asdict(self.options)
        return doc | doc.pop("floor")  # the floor fields at the top, as every kind's run document has them
