"""What the sixth new-user pass met with S3, against the session's local server.

- `upload` to a bucket that does not exist said "S3 error (S3UploadFailedError); retry later or check the endpoint":
  boto3 raises its wrapper inside its handler, so the client error is the wrapper's context, not its cause. It now
  says what `run` says of a missing bucket.
- `run s3://... --cache hot` said "page cache before the restore: none of it (hot: read in first, verified; ...)":
  nothing is read in, nothing can be resident, and a hot S3 read is not one; cold said "evicted first" of objects
  nothing evicted."""

from __future__ import annotations

import json

import pytest
from s3help import one_line_error, put_dir, run_cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path_factory.mktemp("nu6") / "ckpt"
    generate(profiles.load("small").scaled(0.02), str(root), force=True)
    return str(root)


def test_upload_to_a_missing_bucket_names_it(s3env, ckpt):
    rc, out, err = run_cli("upload", ckpt, "s3://ckptbench-nu6-no-such-bucket/ckpt")
    line = one_line_error(rc, err, "ckptbench-nu6-no-such-bucket", "does not exist")
    assert "S3UploadFailedError" not in line and out == "", line


@pytest.fixture(scope="module")
def url(s3server, ckpt) -> str:
    bucket = s3server.make_bucket()
    put_dir(s3server.client(direct=True), bucket, "ckpt", ckpt)
    return f"s3://{bucket}/ckpt"


def test_a_hot_s3_restore_is_not_called_verified_hot(s3env, url, tmp_path):
    rc, out, err = run_cli("run", url, "--cache", "hot", "--repeat", "1", "--results", tmp_path / "r.csv", "--json")
    assert rc == 0, err
    cache = json.loads(out)["cache"]
    assert cache["requested"] == "hot" and cache["residency_before"] == 0.0 and cache["verified"] is False, cache
    assert cache["local"] is False  # the text below goes by this field, not by a note's wording
    rc, out, err = run_cli("run", url, "--cache", "hot", "--repeat", "1", "--results", tmp_path / "r.csv")
    line = next(ln for ln in out.splitlines() if ln.startswith("page cache before the restore"))
    assert "hot: nothing local to read in, NOT VERIFIED" in line and "a hot read cannot be made" in line, line
    assert "read in first" not in line


def test_a_cold_s3_restore_does_not_claim_an_eviction(s3env, url, tmp_path):
    rc, out, err = run_cli("run", url, "--cache", "cold", "--repeat", "1", "--results", tmp_path / "r.csv")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("page cache before the restore"))
    assert "cold: nothing local to evict, verified" in line and "evicted first" not in line, line
