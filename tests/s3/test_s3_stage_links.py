"""A staged S3 read into a stage directory that already holds links (a reused or shared --stage-dir): the temporary
file was opened by path, following a link at its name (`shard.bin.ckptbench-part` -> a file elsewhere, truncated and
overwritten, as root) or at a folder on its way (`sub` -> a folder elsewhere, written into). Now each folder below the
stage directory is opened without following a link and the temporary file is made new (O_EXCL | O_NOFOLLOW): a link
at its name is replaced, never written through; a link for a folder fails that file in one line, nothing written
elsewhere."""

from __future__ import annotations

import os

import pytest
from s3help import files_under

from ckptbench.sources import ReadOptions, s3read, s3source
from ckptbench.sources import s3 as s3mod

PREFIX = "ckpt/step-1"


@pytest.fixture(scope="module")
def objects(s3server):
    bucket = s3server.make_bucket()
    data = {"shard.bin": os.urandom(300_000), "sub/tail.bin": os.urandom(10_000)}
    direct = s3server.client(direct=True)
    for rel, body in data.items():
        direct.put_object(Bucket=bucket, Key=f"{PREFIX}/{rel}", Body=body)
    return bucket, data


def _read(bucket: str, stage: str, backend: str):
    u = s3mod.parse(f"s3://{bucket}/{PREFIX}")
    log = s3mod.RetryLog()
    client = s3mod.make_client(4, retry_log=log)
    h = s3source.start(client, u, s3mod.list_objects(client, u), ReadOptions(s3_client=backend), log, into="stage",
                       stage_dir=stage)
    res = h.wait(120)
    assert res is not None
    return res


@pytest.mark.parametrize("backend", ["threads", "crt"])
def test_a_link_at_a_temporary_name_is_replaced_not_written_through(s3env, objects, tmp_path, backend):
    bucket, data = objects
    stage, victim = tmp_path / "stage", tmp_path / "victim"
    victim.write_bytes(b"precious")
    stage.mkdir()
    os.symlink(victim, stage / f"shard.bin{s3read.STAGE_SUFFIX}")
    res = _read(bucket, str(stage), backend)
    assert not res.failed, [f.error for f in res.files]
    assert victim.read_bytes() == b"precious"
    assert files_under(stage) == data


@pytest.mark.parametrize("backend", ["threads", "crt"])
def test_a_link_for_a_folder_fails_that_file_and_writes_nothing_elsewhere(s3env, objects, tmp_path, backend):
    bucket, data = objects
    stage, elsewhere = tmp_path / "stage", tmp_path / "elsewhere"
    stage.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, stage / "sub")
    res = _read(bucket, str(stage), backend)
    failed = [f for f in res.files if f.error is not None]
    assert [f.path.rsplit("/", 2)[-2:] for f in failed] == [["sub", "tail.bin"]]
    assert os.listdir(elsewhere) == []
    assert (stage / "shard.bin").read_bytes() == data["shard.bin"]
