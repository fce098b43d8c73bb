"""multipart=True: per-chunk digests and the S3-style digest of digests."""

from __future__ import annotations

import hashlib

import pytest

import fastio

ALGS = ("crc32c", "xxh64", "md5", "sha256")
BLOCK = 4096
CHUNK = 16384


def _parts(data: bytes, chunk: int) -> list[bytes]:
    if not data:
        return [b""]
    return [data[i:i + chunk] for i in range(0, len(data), chunk)]


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
@pytest.mark.parametrize("alg", ALGS)
def test_multipart_digests(files, ref_digest_raw, alg, mode):
    sizes = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK, 7 * CHUNK + 333, 40 * CHUNK + 1]
    paths = [files.make(s) for s in sizes]
    res = fastio.read_files(paths, concurrency=3, read=mode, hash=alg, block_size=BLOCK,
                            chunk_size=CHUNK, multipart=True)
    for path, f in zip(paths, res.files):
        data = files.data[path]
        parts = _parts(data, CHUNK)
        raw_parts = [ref_digest_raw(alg, p) for p in parts]
        assert f.error is None, f.error
        assert f.bytes == len(data)
        assert list(f.part_digests) == [r.hex() for r in raw_parts], (path, len(data))
        want_mp = f"{ref_digest_raw(alg, b''.join(raw_parts)).hex()}-{len(parts)}"
        assert f.multipart_digest == want_mp, (path, len(data))
        if len(parts) == 1 or alg == "crc32c":
            # a single part, or crc32c (combined from the parts): the plain whole-file digest
            assert f.digest == ref_digest_raw(alg, data).hex(), (path, len(data))
        else:
            assert f.digest is None


def test_multipart_md5_matches_s3_etag_construction(files):
    """The S3 ETag recipe spelled out with hashlib: md5(concat(md5(part))) + '-N'."""
    p = files.make(3 * CHUNK + 100)
    data = files.data[p]
    concat = b"".join(hashlib.md5(data[i:i + CHUNK]).digest() for i in range(0, len(data), CHUNK))
    f = fastio.read_files([p], hash="md5", block_size=BLOCK, chunk_size=CHUNK, multipart=True).files[0]
    assert f.multipart_digest == hashlib.md5(concat).hexdigest() + "-4"
    assert len(f.part_digests) == 4


def test_crc32c_split_without_multipart_is_whole_file_digest(files, ref):
    """crc32c files split into chunks across workers (no multipart) still give the whole-file crc."""
    paths = [files.make(s) for s in (40 * CHUNK + 17, 9 * CHUNK, 3 * CHUNK - 1)]
    res = fastio.read_files(paths, concurrency=4, hash="crc32c", block_size=BLOCK, chunk_size=CHUNK)
    for p, f in zip(paths, res.files):
        assert f.digest == ref("crc32c", files.data[p])
        assert f.multipart_digest is None and f.part_digests == ()
