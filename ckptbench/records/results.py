"""results.csv: one row per repeat, append-only, each row carrying its environment; and reading it back.

Beside it, results.csv.jsonl: one JSON document per line, {"record": "repeat"} as each repeat ends and
{"record": "run"} (the summary) when the run ends; both files only ever grow.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import stat
import tempfile

from ckptbench.core.errors import CkptbenchError, naming, redact_all, shown, write_refused_exit
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
    return CkptbenchError(f"{recorded_text(path)}: cannot {what} ({exc.strerror}); choose a writable --results path",
                          exit_code=write_refused_exit(exc))


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
    if os.path.islink(path):  # append() would refuse it after the run: it never writes through a link
        raise _linked(path)
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


# the longest line read: a document of ours is far shorter (a restore run's ~1.1 kB a repeat, a watch's ~300 B a
# sample: this is 15 hours of samples at the default interval); a sparse file's 256 MiB of NULs was read whole, as
# one line, at twice its size in memory
DOCUMENT_MAX = 1 << 26
ROW_MAX = 1 << 20  # a row of ours is ~1.1 kB, and csv refuses any one field over 128 kB


def _check_ours(target: str) -> None:
    """An existing .jsonl is appended to only when its first line is one of our documents (a run_id or a record
    tag): another tool's log named results.csv.jsonl had ckptbench's documents appended to it."""
    try:
        fd = _open_regular(target)
    except (FileNotFoundError, PermissionError):  # none yet; or one we may append to but not read
        return
    try:
        _check_ours_at(fd, target)
    finally:
        os.close(fd)


def _check_ours_at(fd: int, target: str) -> None:
    """_check_ours on the open file: the one that is about to be appended to."""
    first = bytearray()
    while len(first) <= DOCUMENT_MAX:
        chunk = os.pread(fd, 1 << 16, len(first))
        first += chunk
        if not chunk or b"\n" in chunk:
            break
    first = bytes(first.split(b"\n", 1)[0])
    if not first.strip():
        return  # empty: ours to start
    try:
        doc = json.loads(first)
    except (ValueError, RecursionError):
        doc = None
    if not (isinstance(doc, dict) and ("run_id" in doc or "record" in doc)):
        raise CkptbenchError(f"{recorded_text(target)}: not a ckptbench results file (its first line is not a "
                             "document of ours); name another --results path, or move that file away")


def _write_all(fd: int, data: bytes, path: str) -> None:
    """`data` appended whole or not at all: what a write cut short (a full disk) wrote is taken back, since half a row
    left every later read and append of the file refused. Only while the file ends with our bytes: a writer that
    appended since keeps its own."""
    start, written = os.fstat(fd).st_size, 0
    view = memoryview(data)
    try:
        with naming(recorded_text(path)):
            while view:
                n = os.write(fd, view)
                written, view = written + n, view[n:]
    except BaseException:
        with contextlib.suppress(OSError):
            if written and os.fstat(fd).st_size == start + written:
                os.ftruncate(fd, start)
        raise


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


def _linked(path: str) -> CkptbenchError:
    return CkptbenchError(f"{recorded_text(path)}: a symbolic link; results are never written through one (it can be "
                          "pointed at any file): name a regular file as --results, and see what else writes there")


def _open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """`path` opened without blocking and kept only if a regular file: a FIFO or a device named as a results file
    would block the open or the read, or never end it (told by the descriptor's type, so nothing swapped in after a
    check gets through). With O_NOFOLLOW, a symbolic link is refused in one line."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and flags & os.O_NOFOLLOW:
            raise _linked(path) from None
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
            return tuple(next(csv.reader(_capped(f, path, ROW_MAX, "row")), ()))
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot read ({exc.strerror}); {_NAME_ONE}") from None


def _for_append(path: str, create: bool = False) -> tuple[int, bool]:
    """(fd, readable) of `path` opened to append at the moment of writing: never through a symbolic link (one planted
    after the check before the run had root append to, or create, the file it named), a regular file, and still the
    file its name names. Readable where permitted, so that what is checked is the file written."""
    flags = os.O_APPEND | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd, readable = _open_regular(path, flags | os.O_RDWR), True
    except PermissionError:  # one we may append to but not read
        fd, readable = _open_regular(path, flags | os.O_WRONLY), False
    try:
        _still_named(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd, readable


def _still_named(fd: int, path: str) -> None:
    """The open file is the one `path` names now (same device and inode): a file or link put in its place since it
    was opened or checked is refused, nothing written."""
    try:
        now = os.lstat(path)
    except OSError:
        now = None
    st = os.fstat(fd)
    if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise CkptbenchError(f"{recorded_text(path)}: replaced while being appended to (another file or a link put in "
                             "its place); nothing written: see what else writes there, or choose another --results")


def _ends_a_line(fd: int, size: int) -> bool:
    """Whether the file's last byte ends a line."""
    return os.pread(fd, 1, size - 1) == b"\n"


def _in_schema(row: dict, columns: tuple[str, ...]) -> dict:
    """An old file keeps its schema, so its rows stay readable by older versions: a dist row's aggregate goes
    where schema 2 kept it."""
    row["schema"] = _SCHEMA_OF[columns]
    if columns != COLUMNS and row["kind"] == "dist":
        row["read_gbps"] = row.get("aggregate_gbps", "")
    return row


def append(path: str, rows: list[dict]) -> None:
    """Appends rows with one write each to an O_APPEND file: a crash loses at most the row being written."""
    if not os.path.lexists(path):  # a link to nothing is refused below, never made a file through
        fd, tmp = new_file_beside(path)
        try:
            _write_all(fd, _line(list(COLUMNS)).encode("utf-8"), path)
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
    fd, readable = _for_append(path)
    try:
        if not readable:
            raise CkptbenchError(f"{recorded_text(path)}: cannot read it to check it is ours; make it readable or "
                                 "choose another --results path")
        columns, _ = _rows_in(path, fd)  # refuses a foreign or damaged file before touching it: the very one written
        if columns == COLUMNS_V1 and any(row.get("kind", "restore") != "restore" for row in rows):
            raise CkptbenchError(f"{recorded_text(path)}: a schema-1 results file holds restores only; record saves "
                                 "in a new --results path")
        _still_named(fd, path)
        for given in rows:
            one = _in_schema(redact_all({"kind": "restore"} | given), columns)  # no credential is ever recorded
            values = [json.dumps(plain(one[c]), sort_keys=True, allow_nan=False) if c == "env"
                      else plain(one.get(c, "")) for c in columns]
            _write_all(fd, _line(values).encode("utf-8"), path)
        os.fsync(fd)
    finally:
        os.close(fd)


def append_document(path: str, doc: dict) -> None:
    """Appends one JSON document as one line of the results file's .jsonl, fsync'd before returning."""
    target = jsonl_path(path)
    line = json.dumps(plain(redact_all(doc)), allow_nan=False) + "\n"  # every kind's document, credentials out
    fd, readable = _for_append(target, create=True)
    try:
        size = os.fstat(fd).st_size
        if size and readable:
            _check_ours_at(fd, target)  # a foreign file put in its place since the check before the run
            if not _ends_a_line(fd, size):
                line = "\n" + line  # a line torn by a crash stays apart from this one
        _write_all(fd, line.encode("utf-8"), target)
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
            for line in _capped(f, jsonl_path(path), DOCUMENT_MAX, "document"):
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


def _capped(f, path: str, most: int, what: str):
    """The text file's lines, each read only up to `most` characters: a longer one is refused in one line."""
    lineno = 0
    while line := f.readline(most + 1):
        lineno += 1
        if len(line) > most:
            raise CkptbenchError(f"{recorded_text(path)}:{lineno}: a line over {most >> 20} MiB, longer than any "
                                 f"{what} ckptbench writes (damaged, or not a results file); repair or move the file")
        yield line


def read_rows(path: str) -> list[dict]:
    """Rows as dicts with numbers parsed and env decoded; one clear error for anything that is not our file."""
    return _rows_in(path)[1]


def _rows_in(path: str, fd: int | None = None) -> tuple[tuple[str, ...], list[dict]]:
    """The header and rows of the results file at `path`, or of the one open at `fd` (read from its start)."""
    reader = None
    try:
        with (_open_text(path) if fd is None else open(os.dup(fd), encoding="utf-8", newline="")) as f:
            if fd is not None:
                f.seek(0)
            reader = csv.reader(_capped(f, path, ROW_MAX, "row"))
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
            return columns, rows
    except csv.Error as exc:  # e.g. a field over csv's size limit
        where = f":{reader.line_num}" if reader is not None else ""
        raise CkptbenchError(f"{path}{where}: malformed row ({exc}); repair or move the file") from None
    except UnicodeDecodeError:
        raise CkptbenchError(f"{path}: not a text file; not a ckptbench results file") from None
    except FileNotFoundError:
        raise CkptbenchError(f"{path}: {NO_RESULTS}") from None
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot read ({exc.strerror}); {_NAME_ONE}") from None


_NAME_ONE = "name a results file run, save or watch wrote"
# compare and history alike (compare said "cannot read (No such file or directory)")
NO_RESULTS = "no such results file; `ckptbench run`, `save` and `watch` write one (--results PATH), or name the one " \
             "they wrote"


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
