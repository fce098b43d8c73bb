"""watch of a job in another mount namespace (a container): the names its /proc links show reach other files here, or
a FIFO whose open blocks. Only the job's own files are read and counted; watch ends when the job does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a safetensors file the job writes where it stands, then reads by read() calls or through a mapping with no
# descriptor left (ctypes: Python's mmap keeps a duplicate open), held across several samples
JOB = """
    import ctypes, json, os, struct, sys, time
    path, how = sys.argv[1], sys.argv[2]
    head = json.dumps({"t": {"dtype": "F32", "shape": [262144], "data_offsets": [0, 1048576]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + os.urandom(1 << 20))
    size = os.path.getsize(path)
    if how == "read":
        f = open(path, "rb")
        f.read(1 << 19)
        time.sleep(1.5)
        f.read()
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        fd = os.open(path, os.O_RDONLY)
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        os.close(fd)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        sum(ctypes.string_at(addr, size)[::4096])  # every page touched
        time.sleep(1.5)
"""


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    return r.returncode == 0


needs_unshare = pytest.mark.skipif(not _unshare_works(), reason="needs unshare -m (root or user namespaces)")


def _watch(tmp_path, job: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    """watch --json of `job`; a hang fails the test at the timeout rather than blocking the suite."""
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--json", "--no-verdict", "--interval", "0.05",
                           "--results", str(tmp_path / "r.csv"), "--", *job],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr
    return proc, json.loads(proc.stdout)


def _job(tmp_path) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(JOB))
    return str(path)


def _in_namespace(tmp_path, there: str, how: str) -> list[str]:
    """The job in a private mount namespace with a tmpfs over `there`'s folder: its file is not the one here."""
    folder = os.path.dirname(there)
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs none "$1" && exec "$2" "$3" "$4" "$5"', "sh", folder, sys.executable, _job(tmp_path),
            there, how]


@needs_unshare
@pytest.mark.parametrize("how", ["read", "map"])
def test_a_job_in_another_mount_namespace_over_a_fifo_here_ends_and_the_fifo_is_never_opened(tmp_path, how):
    there = tmp_path / "ns" / "x.safetensors"
    there.parent.mkdir()
    os.mkfifo(there)  # what the job's name reaches here: an open of it blocks until a writer comes
    proc, doc = _watch(tmp_path, _in_namespace(tmp_path, str(there), how))
    assert doc["exit_code"] == 0, proc.stderr  # the job did write and read its own file, in its namespace
    assert doc["files"] == {} and doc["mapped"] == [] and doc["unseen"] == []
    said = json.dumps({k: v for k, v in doc.items() if k != "command"})  # the command names it, as the user did
    assert "x.safetensors" not in said


@needs_unshare
@pytest.mark.parametrize("how", ["read", "map"])
def test_another_file_here_under_the_jobs_name_is_not_counted_as_the_jobs(tmp_path, how):
    there = tmp_path / "ns" / "x.safetensors"
    there.parent.mkdir()
    there.write_bytes(b"decoy" * 1000)  # a regular file, a checkpoint by its name, but not what the job holds
    proc, doc = _watch(tmp_path, _in_namespace(tmp_path, str(there), how))
    assert doc["exit_code"] == 0, proc.stderr
    assert str(there) not in doc["files"] and str(there) not in doc["mapped"]
    assert there.read_bytes() == b"decoy" * 1000  # the job wrote its own, on its tmpfs


@pytest.mark.parametrize("how", ["read", "map"])
def test_the_same_job_in_this_namespace_still_has_its_checkpoint_found(tmp_path, how):
    here = tmp_path / "x.safetensors"
    proc, doc = _watch(tmp_path, [sys.executable, _job(tmp_path), str(here), how])
    assert doc["exit_code"] == 0, proc.stderr
    assert doc["files"] == {str(here): here.stat().st_size}
    assert (str(here) in doc["mapped"]) == (how == "map")
    assert doc["bytes"] >= 1 << 19  # at least the half read after the first samples saw it
