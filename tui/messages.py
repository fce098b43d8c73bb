"""Messages from worker threads to the screens (threads never touch widgets directly)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class RunFinished(Message):
    doc: dict
    source_info: dict | None = None
    floor: dict | None = None  # ckptbench.cli.ui.restore_floor for the run: its efficiency
    listing: object | None = None  # the run's Listing: what its digests were checked against


@dataclass
class SourceListed(Message):
    listing: object  # ckptbench.sources.Listing of the dashboard's source: its manifest says what verify checks


@dataclass
class RunFailed(Message):
    error: str
    source_info: dict | None = None  # the source measured again: a run that failed for it changed it, or found so


@dataclass
class SourceMeasured(Message):
    source_info: dict  # the source counted again after its folder changed (deleted, emptied, refilled)


@dataclass
class RunCancelled(Message):
    pass


@dataclass
class ChecklistItem(Message):
    index: int
    item: dict


@dataclass
class ChecklistDone(Message):
    doc: dict


@dataclass
class SweepPoint(Message):
    level: int
    gbps: float

    def can_replace(self, message: Message) -> bool:
        return False


@dataclass
class SweepDone(Message):
    result: dict


@dataclass
class WorkFailed(Message):
    error: str


@dataclass
class LoopEnded(Message):
    passes: int
    error: str | None = None
    source_info: dict | None = None  # the source measured again after the loop (its residency moved)


@dataclass
class TuneLevel(Message):
    concurrency: int
    label: str  # "c=8 1.9 GB/s"

    def can_replace(self, message: Message) -> bool:
        return False


@dataclass
class TuneDone(Message):
    concurrency: int
    gbps: float


@dataclass
class SaveTimed(Message):
    timing: object  # ckptbench.save.report.SaveTiming: one save's blocking, written and durable times


@dataclass
class SaveFinished(Message):
    report: dict  # SaveReport.to_json()


@dataclass
class SaveFailed(Message):
    error: str


@dataclass
class SaveCancelled(Message):
    reason: str


@dataclass
class FloorKnown(Message):
    fields: dict  # ckptbench.cli.ui.restore_floor: the restore's floor from the box's cached figures
