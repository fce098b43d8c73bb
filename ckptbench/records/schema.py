"""The results' one vocabulary: the columns of every schema, the kinds, the status words, the settings declared once,
what each rate means, and the one row and document builders every kind uses."""

from __future__ import annotations

import math

from ckptbench.core.stages import STAGES
from ckptbench.core.paths import source_identity
from ckptbench.system import floor

SCHEMA = 3
# schema 1 (restores only) and schema 2 are still read and appended to, each in its own columns; schema 2 added `kind`
# and the save figures, schema 3 `verified` and `aggregate_gbps` (a schema-2 dist row kept its aggregate in read_gbps)
COLUMNS_V1 = tuple(
    ["schema", "run_id", "repeat", "timestamp", "source", "format", "mode", "status", "cache", "cache_verified",
     "residency_before", "residency_after", "concurrency", "read", "hash", "block_size", "device"]
    + [f"{s}_s" for s in STAGES]
    + ["rto_s", "bytes", "files", "files_restored", "read_gbps", "success_rate", "retries", "errors",
       "peak_rss_bytes", "cpu_s", "env"]
)
SAVE_COLUMNS = ("target", "ranks", "stagger_s", "interval_s", "blocking_s", "written_s", "durable_s", "write_gbps",
                "overran", "dirty_peak_fraction", "throttled", "write_amplification")
COLUMNS_V2 = ("schema", "kind") + COLUMNS_V1[1:-1] + SAVE_COLUMNS + ("env",)
COLUMNS = COLUMNS_V2[:-1] + ("verified", "aggregate_gbps", "env")
_SCHEMA_OF = {COLUMNS_V1: 1, COLUMNS_V2: 2, COLUMNS: 3}
KINDS = ("restore", "save", "watch", "dist")  # watch: a restore ckptbench did not run (watch/results.py);
# dist: a distributed restore under torchrun, one row per repeat for all its ranks (distributed/summary.py)

# Every kind's rows and documents say how a repeat or run ended in these words: `ok` (done, and verified where the
# kind verifies), `unverified` (done, but no reference digest matched), `failed`, `cancelled`.
STATUSES = ("ok", "unverified", "failed", "cancelled")
# What a run was asked to do, declared once: restore and dist take the first from their RunOptions, save the second.
RESTORE_SETTINGS = ("mode", "cache", "concurrency", "read", "hash", "block_size", "device")
SAVE_SETTINGS = ("mode", "target", "ranks", "stagger_s", "interval_s")
SETTINGS = ("format",) + RESTORE_SETTINGS + SAVE_SETTINGS[1:]
# The rates, one clock each (the name means the same in every kind, row and document):
#   read_gbps      one process's bytes over its read stage's wall time (restore; each rank of a dist; watch: the
#                  job's reading window, first read to last)
#   engine_gbps    the reader's own clock, first open to last byte (no start-up, no close-out); documents only
#   aggregate_gbps all ranks' bytes over the span from the first rank's read start to the last rank's read end (dist)
#   write_gbps     a save's bytes over its time until durable (save)
_HEAD = ("schema", "kind", "run_id", "repeat", "timestamp", "source", "status", "verified", "success_rate", "env")
FIGURES = tuple(c for c in COLUMNS if c not in _HEAD and c not in SETTINGS)
_TEXT = {"env", "run_id", "timestamp", "source", "format", "mode", "status", "cache", "read", "hash", "device",
         "cache_verified", "errors", "kind", "target", "overran", "throttled", "verified"}


# The most a recorded figure can be: a count, a size or seconds (an exabyte; 30 billion years), and a rate (10 TB/s).
# Beyond, or below zero, it was damaged or written by hand, not measured.
MAX_FIGURE = 1e18
MAX_GBPS = 1e4


def in_range(column: str, value) -> bool:
    """Whether a parsed figure of results.csv can have been measured: a number from 0 to its column's most."""
    top = MAX_GBPS if column.endswith("_gbps") else MAX_FIGURE
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= top


# Why a run document has no floor when its kind did not work one out (a kind that does puts its own fields in)
NO_FLOOR = {"save": "`ckptbench floor --write-to DIR` measures the write rate a save is held against"}


def status_of(status: str, verified: bool | None) -> str:
    """The shared word for how a repeat or run ended: a finished one with nothing matched is `unverified`;
    `verified` None means the kind has nothing to verify (a save, a watched job)."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    return "unverified" if status == "ok" and verified is False else status


def settings_of(opts, names: tuple[str, ...] = RESTORE_SETTINGS) -> dict:
    """The settings named in `names` as a run's options hold them."""
    return {n: getattr(opts, n) if n != "hash" else (opts.hash or "") for n in names}


def row(kind: str, run_id: str, repeat: int, source: str, settings: dict, figures: dict, env: dict, *,
        status: str, verified: bool | None, success_rate: float | None) -> dict:
    """The one results.csv row builder, for every kind: the head, the settings the run was made with, its figures."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    unknown = set(settings) - set(SETTINGS) | set(figures) - set(FIGURES)
    if unknown:
        raise ValueError(f"not results.csv settings or figures: {sorted(unknown)}")
    return {"schema": SCHEMA, "kind": kind, "run_id": run_id, "repeat": repeat, "timestamp": env["date"],
            "source": recorded_text(source_identity(source)), "status": status_of(status, verified),
            "verified": "" if verified is None else verified,
            "success_rate": "" if success_rate is None else success_rate} | settings | figures | {"env": env}


def document(record: str, kind: str, run_id: str, source: str, body: dict, env: dict, *, status: str,
             verified: bool | None, success_rate: float | None, repeat: int | None = None) -> dict:
    """The one document builder (`record` "repeat" or "run"), for every kind: the same head and status words."""
    head = {"record": record, "kind": kind, "schema": SCHEMA, "run_id": run_id}
    if repeat is not None:
        head["repeat"] = repeat
    head |= {"source": recorded_text(source_identity(source)), "status": status_of(status, verified), "verified": verified,
             "success_rate": success_rate}
    if record == "run":  # every kind's run is held against the box's floor, or says why it is not
        body = floor.unmeasured(f"no floor for this {kind}: {NO_FLOOR.get(kind, 'not worked out')}") | body
    return plain(head | {k: v for k, v in body.items() if k not in head} | {"env": env})


def recorded_text(text: str) -> str:
    """`text` as valid UTF-8: bytes that are not (a path's surrogate escapes) become backslash escapes, e.g. \\xff."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # lone surrogates that are not escaped bytes
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def plain(value):
    """`value` as JSON allows it: non-finite floats become null, text valid UTF-8, anything else its str."""
    if isinstance(value, str):
        return recorded_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, dict):
        return {recorded_text(str(k)): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return recorded_text(str(value))
