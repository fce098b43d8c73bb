"""`read --multipart --json`, held against hashlib, crc32c and xxhash over the whole file and over its --chunk-size
parts: `multipart_digest` is the hash of the parts' raw digests with "-<parts>" (an S3 multipart ETag), and `digest`
is the plain whole-file digest wherever it can be had in the same pass (crc32c, a file of one part); a file of several
parts under md5, sha256 or xxh64 gets null, as docs/reference.md says. Without --multipart it is always the plain
digest."""

from __future__ import annotations

import hashlib
import json
import random

import crc32c
import pytest
import xxhash
from clirun import run_cli

BLOCK, CHUNK = 64 << 10, 256 << 10
SIZES = {"three_parts": 2 * CHUNK + 1000, "exact_two": 2 * CHUNK, "one_part": 5000, "empty": 0}
ORDERED = ("md5", "sha256", "xxh64")  # need a file's bytes in order: no whole digest from parallel parts


def _raw(alg: str, data: bytes) -> bytes:
    if alg == "crc32c":
        return crc32c.crc32c(data).to_bytes(4, "big")
    if alg == "xxh64":
        return xxhash.xxh64(data).digest()  # canonical: big-endian
    return hashlib.new(alg, data).digest()


def _parts(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("mp")
    rng = random.Random(14)
    out = {}
    for name, size in SIZES.items():
        data = rng.randbytes(size)
        (root / name).write_bytes(data)
        out[str(root / name)] = data
    return out


def _read(files, alg: str, *extra) -> dict[str, dict]:
    r = run_cli("read", *files, "--hash", alg, "--block-size", str(BLOCK), "--chunk-size", str(CHUNK), "--json",
                *extra)
    assert r.rc == 0, r.err
    return {f["path"]: f for f in json.loads(r.out)["files"]}


@pytest.mark.parametrize("alg", ["crc32c", *ORDERED])
def test_multipart_digest_is_the_hash_of_the_parts_digests(files, alg):
    got = _read(files, alg, "--multipart")
    for path, data in files.items():
        parts = _parts(data)
        etag = _raw(alg, b"".join(_raw(alg, p) for p in parts)).hex() + f"-{len(parts)}"
        assert got[path]["multipart_digest"] == etag, path
        whole = _raw(alg, data).hex()
        if alg in ORDERED and len(parts) > 1:
            assert got[path]["digest"] is None, path  # documented: a second in-order pass would double the read
        else:
            assert got[path]["digest"] == whole, path


def test_an_md5_multipart_digest_is_the_etag_s3_gives_a_multipart_upload(files):
    path = next(p for p in files if p.endswith("three_parts"))
    data = files[path]
    md5s = b"".join(hashlib.md5(data[i:i + CHUNK]).digest() for i in range(0, len(data), CHUNK))
    assert _read([path], "md5", "--multipart")[path]["multipart_digest"] == f"{hashlib.md5(md5s).hexdigest()}-3"


@pytest.mark.parametrize("alg", ["crc32c", *ORDERED])
def test_without_multipart_the_digest_is_the_plain_whole_file_digest(files, alg):
    got = _read(files, alg)
    for path, data in files.items():
        assert got[path]["digest"] == _raw(alg, data).hex(), path
        assert "multipart_digest" not in got[path]
