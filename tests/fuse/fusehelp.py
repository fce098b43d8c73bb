"""Helpers shared by the FUSE tests (fixtures live in conftest.py): mount a bucket with s3fs, run the CLI.

s3fs (Debian's package, installed by `make test`) mounts one bucket of the local S3 path-style, with a mode-600
password file. Nothing here skips: without s3fs or /dev/fuse the mount fails the test and says what to install,
because a FUSE test that silently skips tests nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

MOUNT_WAIT_S = 15.0


@dataclass(frozen=True)
class FuseMount:
    path: str  # the mount point
    bucket: str
    s3: object  # ckptbench.testing.s3local.LocalS3: a boto3 client on the same bucket, for what the mount hides


def ckptbench(*args, timeout: int = 300) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a fresh interpreter (a FUSE read in this process would share its GIL)."""
    return subprocess.run([sys.executable, "-m", "ckptbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def _is_mounted(path: str) -> bool:
    return subprocess.run(["mountpoint", "-q", path]).returncode == 0


def _unmount(path: str) -> None:
    """fusermount -u, then a lazy umount if the daemon is stuck: a test must never leave a mount behind."""
    for cmd in (["fusermount", "-u", path], ["umount", path], ["umount", "-l", path]):
        if not _is_mounted(path):
            return
        if shutil.which(cmd[0]):
            subprocess.run(cmd, capture_output=True, timeout=30)
    assert not _is_mounted(path), f"{path} is still mounted after fusermount -u, umount and umount -l"


@contextlib.contextmanager
def s3fs_mount(s3, bucket: str, workdir: str, *options: str):
    """s3fs BUCKET MOUNT over `s3` (a LocalS3), with extra `-o` options; unmounted on exit, even on failure."""
    missing = [t for t in ("s3fs", "mountpoint", "fusermount") if not shutil.which(t)]
    if missing:
        pytest.fail(f"the FUSE tests need {', '.join(missing)}: apt-get install s3fs (make test does)")
    if not os.path.exists("/dev/fuse"):
        pytest.fail("the FUSE tests need /dev/fuse (a container needs --device /dev/fuse --cap-add SYS_ADMIN)")
    passwd = os.path.join(workdir, "s3fs.passwd")
    fd = os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # s3fs refuses a password file others can read
    with os.fdopen(fd, "w") as f:
        f.write(f"{s3.env['AWS_ACCESS_KEY_ID']}:{s3.env['AWS_SECRET_ACCESS_KEY']}\n")
    mnt = os.path.join(workdir, "mnt")
    os.mkdir(mnt)
    cmd = ["s3fs", bucket, mnt, "-o", f"url={s3.direct_url}", "-o", "use_path_request_style",
           "-o", f"endpoint={s3.env['AWS_REGION']}", "-o", f"passwd_file={passwd}", "-o", "dbglevel=warn",
           *[a for opt in options for a in ("-o", opt)]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    try:
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not _is_mounted(mnt):
            if proc.returncode != 0 or time.monotonic() > deadline:
                pytest.fail(f"s3fs did not mount {bucket} on {mnt} (rc {proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip()[:500]}\ncommand: {' '.join(cmd)}")
            time.sleep(0.1)
        yield mnt
    finally:
        _unmount(mnt)
