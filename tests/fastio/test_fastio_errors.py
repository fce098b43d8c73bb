"""Per-file failures: each is recorded on its own file (never raised) and the other files in the
same run still come back with correct digests."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile

import pytest

import fastio

MODES = ("pread", "mmap", "direct")
SMALL = dict(block_size=4096, chunk_size=16384)


def _check_good(files, res, good_paths, alg):
    by_path = {}
    for f in res.files:
        by_path.setdefault(f.path, []).append(f)
    for p in good_paths:
        for f in by_path[p]:
            assert f.error is None, (p, f.error)
            assert f.bytes == len(files.data[p])
            assert f.digest == files.expect(p, alg), p


def _the(res, path):
    [f] = [f for f in res.files if f.path == path]
    return f


def _good_set(files):
    # a mix of sizes, one of them split into several chunks
    return [files.make(s) for s in (0, 5000, 70_000, 12 * 16384 + 3)]


@pytest.mark.parametrize("mode", MODES)
def test_missing_file_enoent(files, tmp_path, mode):
    good = _good_set(files)
    missing = str(tmp_path / "does-not-exist.bin")
    paths = [good[0], missing, *good[1:]]
    res = fastio.read_files(paths, concurrency=2, read=mode, hash="sha256", **SMALL)
    f = _the(res, missing)
    assert f.error is not None and f.error.errno == errno.ENOENT
    assert f.digest is None
    assert res.failed == (f,)
    assert res.final.files_failed == 1 and res.final.files_done == len(good)
    _check_good(files, res, good, "sha256")


@pytest.mark.parametrize("mode", MODES)
def test_directory_eisdir(files, tmp_path, mode):
    good = _good_set(files)
    d = tmp_path / "adir"
    d.mkdir()
    res = fastio.read_files([*good, str(d)], concurrency=2, read=mode, hash="crc32c", **SMALL)
    f = _the(res, str(d))
    assert f.error is not None and f.error.errno == errno.EISDIR
    assert f.digest is None
    _check_good(files, res, good, "crc32c")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("alg", ("crc32c", "md5"))
def test_planned_size_bigger_than_file_enodata(files, mode, alg):
    good = _good_set(files)
    short = files.make(3 * 16384 + 10)
    planned = fastio.FileSpec(short, 6 * 16384)  # the plan says more bytes than there are
    res = fastio.read_files([good[0], planned, *good[1:]], concurrency=2, read=mode, hash=alg, **SMALL)
    f = _the(res, short)
    assert f.error is not None and f.error.errno == errno.ENODATA
    assert f.digest is None
    _check_good(files, res, good, alg)


def test_planned_then_deleted_enoent(files):
    good = _good_set(files)
    gone = files.make(40_000)
    spec = fastio.FileSpec(gone, 40_000)
    os.unlink(gone)
    res = fastio.read_files([spec, *good], concurrency=2, hash="md5", **SMALL)
    assert _the(res, gone).error.errno == errno.ENOENT
    _check_good(files, res, good, "md5")


@pytest.mark.parametrize("mode", MODES)
def test_vanishes_and_shrinks_between_stat_and_read(files, gate, tmp_path, mode):
    """start() stats every path; the files change before the (only) worker gets to them."""
    good = _good_set(files)
    vanish = files.make(50_000)
    shrink = files.make(5 * 16384)
    fifo = str(tmp_path / "named.fifo")
    os.mkfifo(fifo)
    h = fastio.start([gate.path, fifo, vanish, good[0], shrink, *good[1:]], concurrency=1, read=mode,
                     hash="sha256", _faults=gate.faults, **SMALL)
    try:
        os.unlink(vanish)
        os.truncate(shrink, 16384 + 100)
    finally:
        gate.release(h)
    res = h.wait(timeout=30)
    assert res is not None
    # the fifo is not a regular file: a failure of its own, not a hang (no writer ever opens it)
    assert _the(res, fifo).error is not None
    assert _the(res, vanish).error.errno == errno.ENOENT
    assert _the(res, shrink).error.errno == errno.ENODATA
    _check_good(files, res, good, "sha256")


@pytest.mark.parametrize("mode", ("pread", "mmap"))
def test_file_truncated_while_being_read(files, mode):
    """Truncating a file under the engine (pread: short read; mmap: SIGBUS) fails that file with
    ENODATA and the process survives. Racy by nature, so it retries until the truncation lands
    mid-read; every attempt must give either the right digest or ENODATA."""
    size = 24 << 20
    good = _good_set(files)
    victim = files.make(size)
    original = files.data[victim]
    hit = 0
    for attempt in range(12):
        with open(victim, "wb") as fh:
            fh.write(original)
        h = fastio.start([victim, *good], concurrency=1, read=mode, hash="md5", block_size=65536,
                         chunk_size=1 << 20)
        while True:
            s = h.snapshot()
            if s.bytes > 0 or s.finished:
                break
        os.truncate(victim, 65536)
        res = h.wait(timeout=30)
        assert res is not None
        f = _the(res, victim)
        if f.error is None:
            assert f.digest == files.expect(victim, "md5")  # finished before the truncation
        else:
            assert f.error.errno == errno.ENODATA, f.error
            hit += 1
        _check_good(files, res, good, "md5")
        if hit >= 2:
            break
    assert hit >= 1, "the truncation never landed while the file was being read"


@pytest.mark.parametrize("mode", MODES)
def test_injected_eio(files, mode):
    good = _good_set(files)
    bad = files.make(10 * 16384)
    res = fastio.read_files([*good, bad], concurrency=2, read=mode, hash="crc32c",
                            _faults={bad: (errno.EIO, 5 * 16384 + 1, 1)}, **SMALL)
    f = _the(res, bad)
    assert f.error is not None and f.error.errno == errno.EIO
    assert f.digest is None
    assert res.final.files_failed == 1
    _check_good(files, res, good, "crc32c")


def test_injected_eio_before_fault_offset_is_harmless(files):
    """A fault armed past the end of the file never fires."""
    p = files.make(20_000)
    res = fastio.read_files([p], hash="md5", _faults={p: (errno.EIO, 20_000, 5)}, **SMALL)
    assert res.files[0].error is None
    assert res.files[0].digest == files.expect(p, "md5")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("err", (errno.EINTR, errno.EAGAIN))
def test_transient_errors_are_retried(files, mode, err):
    good = _good_set(files)
    flaky = files.make(7 * 16384 + 99)
    res = fastio.read_files([good[0], flaky, *good[1:]], concurrency=2, read=mode, hash="sha256",
                            _faults={flaky: (err, 2 * 16384, 3)}, **SMALL)
    f = _the(res, flaky)
    assert f.error is None, f.error
    assert f.digest == files.expect(flaky, "sha256")
    assert f.attempts == 1 + 3
    assert res.retries == 3
    _check_good(files, res, good, "sha256")
    assert all(_the(res, p).attempts == 1 for p in good)


@pytest.mark.parametrize("mode", ("pread", "direct"))
def test_transient_retry_limit(files, mode):
    """Up to 16 retries per call: 16 consecutive EINTRs are survived, 17 fail the file."""
    ok = files.make(30_000)
    bad = files.make(30_000)
    res = fastio.read_files([ok, bad], concurrency=1, read=mode, hash="xxh64",
                            _faults={ok: (errno.EINTR, 0, 16), bad: (errno.EINTR, 0, 17)}, **SMALL)
    f_ok, f_bad = res.files
    assert f_ok.error is None and f_ok.digest == files.expect(ok, "xxh64")
    assert f_ok.attempts == 17
    assert f_bad.error is not None and f_bad.error.errno == errno.EINTR
    assert res.retries == 32


_EMFILE_CHILD = r"""
import json, os, resource, sys
import fastio

first, *rest = sys.argv[1:]
# fill every free descriptor slot under a low limit, so the engine's open() fails with EMFILE
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
fillers = []
try:
    while True:
        fillers.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
h = fastio.start([first, *rest], concurrency=1, hash="md5", block_size=4096, chunk_size=16384)
# once the first file has given up, free one slot: the next file's open retries then succeed
while h.snapshot().files_failed < 1 and not h.done():
    pass
os.close(fillers.pop())
r = h.wait(timeout=60)
for fd in fillers:
    os.close(fd)
print(json.dumps({"files": [[f.path, f.error.errno if f.error else 0, f.digest, f.attempts] for f in r.files],
                  "retries": r.retries}))
"""


def test_too_many_open_files_emfile(files, pyrun):
    first = files.make(20_000)
    rest = [files.make(s) for s in (1000, 50_000)]
    out = pyrun(_EMFILE_CHILD, first, *rest)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    (p0, e0, d0, a0), *others = got["files"]
    assert p0 == first
    assert e0 == errno.EMFILE
    assert d0 is None
    assert a0 > 1  # the open was retried before it gave up
    for (p, e, d, a), want in zip(others, rest):
        assert p == want and e == 0
        assert d == files.expect(want, "md5")
    assert got["retries"] >= a0 - 1


def _run_as_nobody(paths):
    """Forks; the child drops to uid/gid 65534 and reads `paths` with the already-imported fastio
    (the interpreter's own files under /root are not readable to that user, so no new process).
    Returns the child's [path, errno, digest] rows."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            r = fastio.read_files(paths, concurrency=2, hash="sha256", block_size=4096, chunk_size=16384)
            rows = [[f.path, f.error.errno if f.error else 0, f.digest] for f in r.files]
            with os.fdopen(wfd, "w") as out:
                out.write(json.dumps({"uid": os.getuid(), "rows": rows}))
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd) as inp:
        text = inp.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(text)


def test_permission_denied_eacces(ref):
    """Root is never denied, so the run happens in a child that has dropped to uid/gid 65534."""
    d = tempfile.mkdtemp(prefix="fastio-eacces-", dir="/tmp")
    try:
        os.chmod(d, 0o755)
        import random

        rng = random.Random(3)
        blobs = {}
        for name, mode in (("open1.bin", 0o644), ("secret.bin", 0o600), ("open2.bin", 0o644)):
            p = os.path.join(d, name)
            blobs[p] = rng.randbytes(40_000 if name != "open2.bin" else 5 * 16384 + 1)
            with open(p, "wb") as fh:
                fh.write(blobs[p])
            os.chmod(p, mode)
        secret = os.path.join(d, "secret.bin")
        assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600 and os.stat(secret).st_uid == 0
        paths = [os.path.join(d, n) for n in ("open1.bin", "secret.bin", "open2.bin")]
        child = _run_as_nobody(paths)
        assert child["uid"] == 65534
        got = child["rows"]
        assert [g[0] for g in got] == paths
        for p, e, dg in got:
            if p == secret:
                assert e == errno.EACCES and dg is None
            else:
                assert e == 0 and dg == ref("sha256", blobs[p])
    finally:
        shutil.rmtree(d)


@pytest.mark.parametrize("mode", MODES)
def test_fifo_device_and_pseudo_file_fail_at_once(tmp_path, mode):
    """Nothing that is not a real regular file is read: a FIFO nobody writes (the open must not block), a
    character device (no end), a procfs file (its size is not real)."""
    fifo = str(tmp_path / "f.fifo")
    os.mkfifo(fifo)
    paths = [fifo, "/dev/zero", "/proc/self/status"]
    res = fastio.start(paths, concurrency=2, read=mode, hash="crc32c").wait(timeout=10)
    assert res is not None, "a worker hung on a special file"
    for p in paths:
        f = _the(res, p)
        assert f.error is not None and f.error.errno == errno.EINVAL and f.bytes == 0, (p, f)
    if mode != "direct":  # procfs refuses O_DIRECT at open already
        assert "pseudo-file" in _the(res, "/proc/self/status").error.message
