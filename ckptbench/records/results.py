"""results.csv: one row per repeat, append-only, each row carrying its environment; and reading it back.

Beside it, results.csv.jsonl: one JSON document per line, {"record": "repeat"} as each repeat ends and
{"record": "run"} (the summary) when the run ends; both files only ever grow.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
import tempfile

from ckptbench.core.errors import CkptbenchError, redact_all, shown
from ckptbench.core.paths import new_file_beside
from ckptbench.records.schema import (  # noqa: F401  (re-exported: what readers and writers of results use)
    SCHEMA, COLUMNS_V1, SAVE_COLUMNS, COLUMNS_V2, COLUMNS, KINDS, STATUSES, RESTORE_SETTINGS, SAVE_SETTINGS,
    SETTINGS, FIGURES, status_of, settings_of, row, document, recorded_text, plain, _SCHEMA_OF, _HEAD, _TEXT,
)

def _line(values: list) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def jsonl_path(path: str) -> str:
    """The run documents' file beside a results file."""
    return path + ".jsonl"


def _cannot(path: str, what: str, exc: OSError) -> CkptbenchError:
    return CkptbenchError(f"{recorded_text(path)}: cannot {what} ({exc.strerror}); choose a writable --results path")


def _check_appendable(path: str) -> None:
    """Opens `path` for append without creating or changing it; a missing file: its folder must take a new one."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.lexists(path):  # a link to nothing: append() could neither create it nor read it, after the run
            raise CkptbenchError(f"{recorded_text(path)}: a symbolic link to a missing file; choose another --results "
                                 "path") from None
        _check_creatable(path)
        return
    except OSError as exc:
        raise _cannot(path, "append to it", exc) from None
    if not stat.S_ISREG(st.st_mode):
        raise CkptbenchError(f"{recorded_text(path)}: not a regular file; choose another --results path")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO swapped in refuses
    except OSError as exc:
        raise _cannot(path, "append to it", exc) from None
    os.close(fd)


def _check_creatable(path: str) -> None:
    """Creates and removes a temporary file beside `path`, as append() does: no empty results file is left."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{name}.probe-", dir=folder)
    except OSError as exc:
        raise _cannot(path, "create the results file there", exc) from None
    os.close(fd)
    os.unlink(probe)


def check_writable(path: str, kind: str = "restore") -> None:
    """Before a run: both the results file and its .jsonl can be appended to (or created), and an existing
    results file is ours (same header) and takes this kind of row, so that nothing fails after the run and
    nothing lands in a foreign file."""
    _check_appendable(path)
    _check_appendable(jsonl_path(path))
    _check_ours(jsonl_path(path))
    if os.path.exists(path):
        read_rows(path)
        if kind != "restore" and header_of(path) == COLUMNS_V1:
            raise CkptbenchError(f"{recorded_text(path)}: a schema-1 results file holds restores only; record "
                                 f"{kind}s in a new --results path")


FIRST_LINE_MAX = 1 << 24  # a document of ours (a distributed run's, every rank's figures) is far smaller


def _check_ours(target: str) -> None:
    """An existing .jsonl is appended to only when its first line is one of our documents (a run_id or a record
    tag): another tool's log named results.csv.jsonl had ckptbench's documents appended to it."""
    try:
        fd = _open_regular(target)
    except (FileNotFoundError, PermissionError):  # none yet; or one we may append to but not read
        return
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            first = f.readline(FIRST_LINE_MAX)
    finally:
        os.close(fd)
    if not first.strip():
        return  # empty: ours to start
    try:
        doc = json.loads(first)
    except (ValueError, RecursionError):
        doc = None
    if not (isinstance(doc, dict) and ("run_id" in doc or "record" in doc)):
        raise CkptbenchError(f"{recorded_text(target)}: not a ckptbench results file (its first line is not a "
                             "document of ours); name another --results path, or move that file away")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path: str) -> None:
    """A new file's name is durable only once its folder is synced; best effort, as some filesystems refuse."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """`path` opened without blocking and kept only if a regular file: a FIFO or a device named as a results file
    would block the open or the read, or never end it (told by the descriptor's type, so nothing swapped in after a
    check gets through)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: a FIFO opened to write with no reader
            raise
        raise CkptbenchError(f"{recorded_text(path)}: not a regular file; not a ckptbench results file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CkptbenchError(f"{recorded_text(path)}: not a regular file; not a ckptbench results file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_text(path: str):
    return open(_open_regular(path), encoding="utf-8", newline="")


def header_of(path: str) -> tuple[str, ...]:
    """The columns an existing results file was started with (schema 1 or 2)."""
    try:
        with _open_text(path) as f:
            return tuple(next(csv.reader(f), ()))
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot read ({exc.strerror}); {_NAME_ONE}") from None


def _ends_a_line(path: str, size: int) -> bool:
    """Whether the file's last byte ends a line (an unreadable file is taken on trust)."""
    try:
        with open(path, "rb") as f:
            f.seek(size - 1)
            return f.read(1) == b"\n"
    except OSError:
        return True


def _in_schema(row: dict, columns: tuple[str, ...]) -> dict:
    """An old file keeps its schema, so its rows stay readable by older versions: a dist row's aggregate goes
    where schema 2 kept it."""
    row["schema"] = _SCHEMA_OF[columns]
    if columns != COLUMNS and row["kind"] == "dist":
        row["read_gbps"] = row.get("aggregate_gbps", "")
    return row


def append(path: str, rows: list[dict]) -> None:
    """Appends rows with one write each to an O_APPEND file: a crash loses at most the row being written."""
    if not os.path.exists(path):
        fd, tmp = new_file_beside(path)
        try:
            _write_all(fd, _line(list(COLUMNS)).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path, follow_symlinks=False)  # fails if another writer created it meanwhile: keep theirs
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        _fsync_dir(path)
    read_rows(path)  # refuses a foreign or damaged file before touching it
    columns = header_of(path)
    if columns == COLUMNS_V1 and any(row.get("kind", "restore") != "restore" for row in rows):
        raise CkptbenchError(f"{recorded_text(path)}: a schema-1 results file holds restores only; record saves in "
                             "a new --results path")
    fd = _open_regular(path, os.O_WRONLY | os.O_APPEND)
    try:
        for given in rows:
            one = _in_schema(redact_all({"kind": "restore"} | given), columns)  # no credential is ever recorded
            values = [json.dumps(plain(one[c]), sort_keys=True, allow_nan=False) if c == "env"
                      else plain(one.get(c, "")) for c in columns]
            _write_all(fd, _line(values).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def append_document(path: str, doc: dict) -> None:
    """Appends one JSON document as one line of the results file's .jsonl, fsync'd before returning."""
    target = jsonl_path(path)
    line = json.dumps(plain(redact_all(doc)), allow_nan=False) + "\n"  # every kind's document, credentials out
    fd = _open_regular(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size and not _ends_a_line(target, size):
            line = "\n" + line  # a line torn by a crash stays apart from this one
        _write_all(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    if size == 0:
        _fsync_dir(target)


def read_documents(path: str, record: str | None = None) -> list[dict]:
    """The documents in a results file's .jsonl, oldest first; only `record` ("repeat" or "run") when given.

    Documents written before records were tagged are runs; a line torn by a crash is skipped."""
    docs = []
    try:
        with _open_text(jsonl_path(path)) as f:
            for line in f:
                try:
                    doc = json.loads(line)
                except (ValueError, RecursionError):  # torn by a crash, or nested past any document of ours
                    continue
                if isinstance(doc, dict) and (record is None or doc.get("record", "run") == record):
                    docs.append(doc)
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise CkptbenchError(f"{jsonl_path(path)}: not a text file; not a ckptbench results file") from None
    except OSError as exc:
        raise CkptbenchError(f"{jsonl_path(path)}: cannot read ({exc.strerror}); {_NAME_ONE}") from None
    return docs


def read_rows(path: str) -> list[dict]:
    """Rows as dicts with numbers parsed and env decoded; one clear error for anything that is not our file."""
    try:
        with _open_text(path) as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise CkptbenchError(f"{path}: empty; not a ckptbench results file")
            columns = tuple(header)
            if columns not in _SCHEMA_OF:
                raise CkptbenchError(f"{path}: not a ckptbench results file of schema 1 to {SCHEMA} (its header "
                                     "differs); name a results file ckptbench wrote")
            rows, seen = [], set()
            for lineno, values in enumerate(reader, start=2):
                if len(values) != len(columns):
                    raise CkptbenchError(f"{path}:{lineno}: malformed row ({len(values)} fields, expected "
                                         f"{len(columns)}); repair or move the file")
                row = dict.fromkeys(COLUMNS, "") | {"kind": "restore"} | dict(zip(columns, values))
                rows.append(_once(_parse(_from_schema(row, columns), path, lineno), seen, path, lineno))
            return rows
    except csv.Error as exc:  # e.g. a field over csv's size limit
        raise CkptbenchError(f"{path}:{reader.line_num}: malformed row ({exc}); repair or move the file") from None
    except UnicodeDecodeError:
        raise CkptbenchError(f"{path}: not a text file; not a ckptbench results file") from None
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot read ({exc.strerror}); {_NAME_ONE}") from None


_NAME_ONE = "name a results file run, save or watch wrote"


def _once(row: dict, seen: set, path: str, lineno: int) -> dict:
    """A run's repeat is on record once: a run id used again (two files joined, rows copied) merged two runs into
    one, and a regression compared as within noise."""
    key = (row["run_id"], row["kind"], row["repeat"])
    if key in seen:
        repeat = "?" if row["repeat"] is None else f"{row['repeat']:.0f}"
        raise CkptbenchError(f"{path}:{lineno}: run {shown(row['run_id'], 40)!r} has repeat {repeat} twice (a run id "
                             "used again: files joined or rows copied); repair or move the file")
    seen.add(key)
    return row


def _from_schema(row: dict, columns: tuple[str, ...]) -> dict:
    """An older row in today's meanings: a schema-2 dist row's read_gbps was its aggregate; an unverified one says
    so by its status."""
    if columns == COLUMNS:
        return row
    if row["kind"] == "dist":
        row["aggregate_gbps"], row["read_gbps"] = row["read_gbps"], ""
    if row["status"] == "unverified":
        row["verified"] = "False"
    return row


def _parse(row: dict, path: str, lineno: int) -> dict:
    out = dict(row)
    out["verified"] = {"True": True, "False": False}.get(row["verified"])
    try:
        out["env"] = json.loads(row["env"]) if row["env"] else {}
        if not isinstance(out["env"], dict):
            raise ValueError("env is not an object")
    except (ValueError, RecursionError):
        raise CkptbenchError(f"{path}:{lineno}: malformed value (env is not a JSON object); repair or move the "
                             "file") from None
    for k, v in row.items():
        if k in _TEXT:
            continue
        try:
            x = float(v) if v not in ("", "None") else None
        except ValueError:
            raise CkptbenchError(f"{path}:{lineno}: malformed value ({k} is {shown(v, 40)!r}, not a number); repair "
                                 "or move the file") from None
        out[k] = x if x is None or math.isfinite(x) else None  # nan (older files) is unknown, never a figure
    if out["repeat"] is not None and not (out["repeat"] == int(out["repeat"]) >= 1):
        raise CkptbenchError(f"{path}:{lineno}: malformed value (repeat is {shown(row['repeat'], 40)!r}, not a whole "
                             "number from 1); repair or move the file")
    return out
