"""Fixtures for the FUSE tests: a local S3 (moto on 127.0.0.1, ckptbench.testing.s3local as the S3 tests use) and s3fs
mounts of fresh buckets on it, unmounted when the test or module ends, even on failure."""

from __future__ import annotations

import os

import pytest
from fusehelp import FuseMount, ckptbench, s3fs_mount

from ckptbench.testing.s3local import local_s3


@pytest.fixture(scope="session")
def fuse_s3():
    """One local S3 for the FUSE tests (moto straight, no shaping: s3fs's own requests are what is measured)."""
    with local_s3(latency_s=0.0) as s3:
        yield s3


@pytest.fixture
def s3fs_mounted(fuse_s3, tmp_path) -> FuseMount:
    """A fresh bucket mounted with s3fs at tmp_path/mnt, unmounted when the test ends."""
    bucket = fuse_s3.make_bucket()
    with s3fs_mount(fuse_s3, bucket, str(tmp_path)) as mnt:
        yield FuseMount(mnt, bucket, fuse_s3)


@pytest.fixture(scope="module")
def s3fs_ckpt(fuse_s3, tmp_path_factory) -> FuseMount:
    """A small generated checkpoint on an s3fs mount, shared by a module's tests (generating one takes seconds):
    FuseMount.path is the mount; the checkpoint is in MOUNT/ckpt."""
    bucket = fuse_s3.make_bucket()
    work = str(tmp_path_factory.mktemp("s3fs"))
    with s3fs_mount(fuse_s3, bucket, work) as mnt:
        gen = ckptbench("gen", "small", os.path.join(mnt, "ckpt"), "--scale", "0.05")
        assert gen.returncode == 0, f"gen onto the s3fs mount failed: {gen.stderr[-2000:]}"
        yield FuseMount(mnt, bucket, fuse_s3)
