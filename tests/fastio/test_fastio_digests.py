"""Whole-file digests against hashlib / crc32c / xxhash, read modes, Hasher, crc32c kernels."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import crc32c as crc32c_pkg
import pytest
import xxhash

import fastio
from fastio import _engine

ALGS = ("crc32c", "xxh64", "md5", "sha256")
MODES = ("pread", "mmap", "direct")


def _sizes(block: int, chunk: int) -> list[int]:
    return sorted({
        0, 1, 2, 7, 31, 33, 4095, 4097, 12345, 99991,
        block - 1, block, block + 1, 2 * block + 1,
        chunk - 1, chunk, chunk + 1, 3 * chunk - 1, 3 * chunk + 4097,
        40 * chunk + 123,  # ~40 chunks
    })


# (block_size, chunk_size): blocks of 4 KiB and of 64 KiB, small chunks so that files split.
CONFIGS = [(4096, 16384), (65536, 262144)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """For each config, one set of files at the interesting sizes, with reference digests."""
    rng = random.Random(99)
    out = {}
    for block, chunk in CONFIGS:
        d = tmp_path_factory.mktemp(f"corpus_{block}_{chunk}")
        entries = []
        for size in _sizes(block, chunk):
            data = rng.randbytes(size)
            p = d / f"s{size}.bin"
            p.write_bytes(data)
            entries.append((str(p), size, {a: _ref(a, data) for a in ALGS}))
        out[(block, chunk)] = entries
    return out


def _ref(alg, data):
    if alg == "crc32c":
        return f"{crc32c_pkg.crc32c(data):08x}"
    if alg == "xxh64":
        return xxhash.xxh64(data).hexdigest()
    return hashlib.new(alg, data).hexdigest()


@pytest.mark.parametrize("block,chunk", CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("alg", ALGS + ("none",))
def test_run_digests_match_references(corpus, alg, mode, block, chunk):
    entries = corpus[(block, chunk)]
    paths = [p for p, _, _ in entries]
    res = fastio.read_files(paths, concurrency=3, read=mode, hash=alg, block_size=block, chunk_size=chunk)
    assert not res.cancelled
    assert [f.path for f in res.files] == paths  # input order
    for (path, size, refs), f in zip(entries, res.files):
        assert f.error is None, (path, f.error)
        assert f.bytes == size, path
        assert f.digest == (None if alg == "none" else refs[alg]), (path, size)
        assert f.multipart_digest is None and f.part_digests == ()
    assert res.bytes == sum(size for _, size, _ in entries)
    assert res.hash == alg and res.read == mode


def test_read_modes_agree(corpus):
    entries = corpus[CONFIGS[0]]
    paths = [p for p, _, _ in entries]
    for alg in ALGS:
        got = {
            mode: [f.digest for f in fastio.read_files(paths, concurrency=2, read=mode, hash=alg,
                                                      block_size=4096, chunk_size=16384).files]
            for mode in MODES
        }
        assert got["pread"] == got["mmap"] == got["direct"], alg
        assert got["pread"] == [refs[alg] for _, _, refs in entries]


def test_file_spec_forms_are_equivalent(files):
    p = files.make(300_000)
    forms = [p, Path(p), os.fsencode(p), (p, 300_000), fastio.FileSpec(p, 300_000), fastio.FileSpec(p)]
    res = fastio.read_files(forms, hash="sha256", block_size=4096, chunk_size=65536)
    want = files.expect(p, "sha256")
    assert [f.digest for f in res.files] == [want] * len(forms)
    assert all(f.path == p for f in res.files)


def test_big_file_many_chunks_default_block(files):
    """A file far larger than chunk_size with a 1 MiB block (the default) and 8 MiB chunks."""
    p = files.make(3 * (8 << 20) + 12345)  # three 8 MiB chunks and a short tail
    for alg in ("crc32c", "xxh64", "md5"):
        res = fastio.read_files([p], concurrency=2, hash=alg, chunk_size=8 << 20)
        assert res.files[0].error is None
        assert res.files[0].digest == files.expect(p, alg), alg


# ---------------------------------------------------------------- known vectors


def test_known_vectors():
    assert _engine._crc32c(b"123456789") == 0xE3069283
    assert _engine._crc32c(b"123456789", impl="sw") == 0xE3069283
    if fastio.crc32c_hw_available():
        assert _engine._crc32c(b"123456789", impl="hw") == 0xE3069283
    assert _engine._crc32c(b"") == 0

    def hx(alg, data):
        h = fastio.Hasher(alg)
        h.update(data)
        return h.hexdigest()

    assert hx("crc32c", b"123456789") == "e3069283"
    assert hx("md5", b"abc") == "900150983cd24fb0d6963f7d28e17f72"
    assert hx("sha256", b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert hx("xxh64", b"") == "ef46db3751d8e999"
    assert fastio.Hasher("xxh64").hexdigest() == "ef46db3751d8e999"


def test_known_vectors_through_engine(tmp_path):
    p = tmp_path / "v.bin"
    p.write_bytes(b"123456789")
    e = tmp_path / "empty.bin"
    e.write_bytes(b"")
    assert fastio.read_files([str(p)], hash="crc32c").files[0].digest == "e3069283"
    a = tmp_path / "abc.bin"
    a.write_bytes(b"abc")
    assert fastio.read_files([str(a)], hash="md5").files[0].digest == "900150983cd24fb0d6963f7d28e17f72"
    assert fastio.read_files([str(e)], hash="xxh64").files[0].digest == "ef46db3751d8e999"


# ---------------------------------------------------------------- Hasher


@pytest.mark.parametrize("alg", ALGS)
def test_hasher_pieces_equal_whole(alg):
    rng = random.Random(alg)
    for size in (0, 1, 31, 32, 33, 1000, 65535, 65536, 65537, 300_001):
        data = rng.randbytes(size)
        whole = fastio.Hasher(alg)
        whole.update(data)
        for trial in range(3):
            cuts = sorted(rng.randrange(size + 1) for _ in range(rng.randrange(1, 12)))
            h = fastio.Hasher(alg)
            prev = 0
            for c in cuts + [size]:
                piece = data[prev:c]
                # mix the buffer types the hasher accepts
                h.update(piece if trial == 0 else bytearray(piece) if trial == 1 else memoryview(piece))
                prev = c
            assert h.digest() == whole.digest(), (alg, size, cuts)
        assert whole.hexdigest() == _ref(alg, data), (alg, size)


@pytest.mark.parametrize("alg", ALGS)
def test_hasher_is_non_destructive_and_copy_is_independent(alg):
    data = random.Random(5).randbytes(200_000)
    h = fastio.Hasher(alg)
    h.update(data[:70_000])
    first = h.hexdigest()
    assert h.hexdigest() == first  # reading the digest does not finish the state
    assert first == _ref(alg, data[:70_000])
    c = h.copy()
    h.update(data[70_000:])
    assert h.hexdigest() == _ref(alg, data)
    assert c.hexdigest() == first  # the copy did not see the later update
    c.update(b"xyz")
    assert c.hexdigest() == _ref(alg, data[:70_000] + b"xyz")
    assert h.hexdigest() == _ref(alg, data)
    assert h.digest().hex() == h.hexdigest()
    assert h.name == alg
    assert h.digest_size == len(h.digest()) == {"crc32c": 4, "xxh64": 8, "md5": 16, "sha256": 32}[alg]


# ---------------------------------------------------------------- crc32c kernels and combine


def _crc_cases():
    rng = random.Random(7)
    buf = rng.randbytes(3 * 8192 * 4 + 64)
    lengths = sorted({0, 1, 7, 8, 9, 63, 255, 256, 767, 768, 769, 1000, 3 * 256 * 2 + 5,
                      24575, 24576, 24577, 3 * 8192 * 2 + 17, 3 * 8192 * 4, 99_999})
    for n in lengths:
        for off in (0, 1, 3, 7):
            if off + n <= len(buf):
                yield memoryview(buf)[off:off + n]


def test_crc32c_hw_and_sw_agree():
    if not fastio.crc32c_hw_available():
        assert fastio.crc32c_impl() == "sw"
        with pytest.raises(fastio.FastIOError):
            _engine._crc32c(b"x", impl="hw")
        return
    seed = 0x12345678
    for view in _crc_cases():
        want = crc32c_pkg.crc32c(bytes(view))
        assert _engine._crc32c(view, impl="hw") == want, len(view)
        assert _engine._crc32c(view, impl="sw") == want, len(view)
        chained = crc32c_pkg.crc32c(bytes(view), seed)
        assert _engine._crc32c(view, seed, impl="hw") == chained
        assert _engine._crc32c(view, seed, impl="sw") == chained


def test_crc32c_sw_matches_package():
    for view in _crc_cases():
        assert _engine._crc32c(view, impl="sw") == crc32c_pkg.crc32c(bytes(view)), len(view)


def test_crc32c_combine_against_whole():
    rng = random.Random(11)
    for _ in range(60):
        a = rng.randbytes(rng.choice([0, 1, 5, 100, 4096, 70_000]))
        b = rng.randbytes(rng.choice([0, 1, 8, 333, 65536, 100_003]))
        c1, c2 = crc32c_pkg.crc32c(a), crc32c_pkg.crc32c(b)
        assert _engine._crc32c_combine(c1, c2, len(b)) == crc32c_pkg.crc32c(a + b)
    # many pieces folded left equal the whole
    data = rng.randbytes(500_000)
    cuts = sorted(rng.sample(range(1, len(data)), 20))
    acc = None
    prev = 0
    for c in cuts + [len(data)]:
        piece = data[prev:c]
        pc = crc32c_pkg.crc32c(piece)
        acc = pc if acc is None else _engine._crc32c_combine(acc, pc, len(piece))
        prev = c
    assert acc == crc32c_pkg.crc32c(data)


def test_crc32c_impl_default_and_forced_sw(files, pyrun):
    assert fastio.crc32c_impl() == ("hw" if fastio.crc32c_hw_available() else "sw")
    p = files.make(3 * 65536 + 11)
    code = (
        "import sys, fastio\n"
        "r = fastio.read_files([sys.argv[1]], hash='crc32c', block_size=65536, chunk_size=65536)\n"
        "print(fastio.crc32c_impl(), fastio.crc32c_hw_available(), r.files[0].digest)\n"
    )
    out = pyrun(code, p, env={"FASTIO_CRC32C": "sw"})
    assert out.returncode == 0, out.stderr
    impl, hw, digest = out.stdout.split()
    assert impl == "sw"
    assert hw == str(fastio.crc32c_hw_available())
    assert digest == files.expect(p, "crc32c")
