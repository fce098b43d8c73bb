"""What the seventh new-user pass met with S3, against the session's local server.

- `floor s3://...` printed "landing (hot) ... what a hot restore's floor uses" and "from the page cache (--cache hot):
  floor 0.033 s" (and `--json` a `floor_s_hot`): an S3 source has no local page cache, a hot S3 run is never made
  (its cache line says NOT VERIFIED) and a run of it is held to the cold floor, so the figure held nothing to anything.
- `upload` said "uploaded 22 files to s3://..." and no more: not the bytes, the time or the rate, which every other
  command that moves a checkpoint says."""

from __future__ import annotations

import json
import os
import re

import pytest
from s3help import put_dir, run_cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path_factory.mktemp("nu7") / "ckpt"
    generate(profiles.load("small").scaled(0.02), str(root), force=True)
    return str(root)


@pytest.fixture(scope="module")
def url(s3server, ckpt) -> str:
    bucket = s3server.make_bucket()
    put_dir(s3server.client(direct=True), bucket, "ckpt", ckpt)
    return f"s3://{bucket}/ckpt"


def test_floor_of_an_s3_source_has_no_page_cache_figure(s3env, url, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rc, out, err = run_cli("floor", url)
    assert rc == 0, err
    assert "restore of s3://" in out and "cold floor" in out, out
    assert "from the page cache" not in out and "--cache hot" not in out, out
    assert "landing (hot)" not in out, out
    rc, out, err = run_cli("floor", url, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["restore"]["floor_s"] > 0 and doc["restore"]["source"] == url, doc["restore"]
    assert not {k for k in doc["restore"] if "hot" in k}, doc["restore"]
    assert doc["landing_hot_gbps"] is None, doc


def test_upload_says_its_bytes_time_and_rate(s3env, s3server, ckpt):
    bucket = s3server.make_bucket()
    rc, out, err = run_cli("upload", ckpt, f"s3://{bucket}/up")
    assert rc == 0, err
    nfiles = sum(len(names) for _, _, names in os.walk(ckpt))
    nbytes = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(ckpt) for n in names)
    line = out.strip()
    assert line.startswith(f"uploaded {nfiles} files"), line
    found = re.search(r"\(([\d.]+) MiB\) to s3://\S+ in ([\d.]+) s, ([\d.]+) GB/s$", line)
    assert found, line
    mib, secs, gbps = map(float, found.groups())
    assert mib == pytest.approx(nbytes / 2**20, abs=0.05), line
    assert secs > 0 and gbps == pytest.approx(nbytes / secs / 1e9, rel=0.05, abs=0.0006), line


def test_check_of_an_s3_source_claims_no_eviction(s3env, url):
    """check said "s3://...'s files were read cold for the checklist: they have left the page cache" and its
    Cold-cache item was unknown with the fix "run as a user who can open the files": nothing is cached locally,
    nothing was evicted, and no permission is missing."""
    rc, out, err = run_cli("check", url)
    assert rc in (0, 1), err
    assert "left the page cache" not in err, err
    rc, out, err = run_cli("check", url, "--json")
    item = next(i for i in json.loads(out)["items"] if i["id"] == "cold_cache")
    assert item["verdict"] == "ok" and "no local page cache" in item["fix"], item
    assert "user who can open" not in item["fix"], item
