"""results.csv: one row per repeat, append-only, each row carrying its environment; and reading it back."""

from __future__ import annotations

import csv
import io
import json
import os

from ckptbench.errors import CkptbenchError

SCHEMA = 1
STAGES = ("list", "read", "verify", "load", "device", "check")
COLUMNS = tuple(
    ["schema", "run_id", "repeat", "timestamp", "source", "format", "mode", "status", "cache", "cache_verified",
     "residency_before", "residency_after", "concurrency", "read", "hash", "block_size", "device"]
    + [f"{s}_s" for s in STAGES]
    + ["rto_s", "bytes", "files", "files_restored", "read_gbps", "success_rate", "retries", "errors",
       "peak_rss_bytes", "cpu_s", "env"]
)


def _line(values: list) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def check_writable(path: str) -> None:
    """Before a run: an existing file must be ours (same header), so nothing is appended to a foreign file."""
    if os.path.exists(path):
        read_rows(path)
    else:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise CkptbenchError(f"{path}: cannot create the results file there; choose a writable --results path")


def append(path: str, rows: list[dict]) -> None:
    """Appends rows with one write each to an O_APPEND file: a crash loses at most the row being written."""
    if not os.path.exists(path):
        header = _line(list(COLUMNS))
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another writer created it meanwhile: then keep theirs
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    read_rows(path)  # refuses a foreign or damaged file before touching it
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for row in rows:
            values = [json.dumps(row[c], sort_keys=True) if c == "env" else row.get(c, "") for c in COLUMNS]
            os.write(fd, _line(values).encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_rows(path: str) -> list[dict]:
    """Rows as dicts with numbers parsed and env decoded; one clear error for anything that is not our file."""
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise CkptbenchError(f"{path}: empty; not a ckptbench results file")
            if tuple(header) != COLUMNS:
                raise CkptbenchError(f"{path}: not a ckptbench results file of schema {SCHEMA} (its header differs); "
                                     "use another --results path")
            rows = []
            for lineno, values in enumerate(reader, start=2):
                if len(values) != len(COLUMNS):
                    raise CkptbenchError(f"{path}:{lineno}: malformed row ({len(values)} fields, expected "
                                         f"{len(COLUMNS)}); repair or move the file")
                rows.append(_parse(dict(zip(COLUMNS, values)), path, lineno))
            return rows
    except UnicodeDecodeError:
        raise CkptbenchError(f"{path}: not a text file; not a ckptbench results file") from None
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot read ({exc.strerror})") from None


def _parse(row: dict, path: str, lineno: int) -> dict:
    out = dict(row)
    try:
        out["env"] = json.loads(row["env"]) if row["env"] else {}
        for k, v in row.items():
            if k in ("env", "run_id", "timestamp", "source", "format", "mode", "status", "cache", "read", "hash",
                     "device", "cache_verified", "errors"):
                continue
            out[k] = float(v) if v not in ("", "None") else None
    except ValueError:
        raise CkptbenchError(f"{path}:{lineno}: malformed value; repair or move the file") from None
    return out
