"""into_memory=True: each file's bytes come back in ReadResult.buffers, in file order."""

from __future__ import annotations

import errno

import pytest

import fastio


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
@pytest.mark.parametrize("alg", ("none", "crc32c", "sha256"))
def test_buffers_hold_the_file_bytes(files, tmp_path, mode, alg):
    sizes = [0, 1, 4095, 4097, 16384, 5 * 16384 + 7, 300_001]
    paths = [files.make(s) for s in sizes]
    missing = str(tmp_path / "missing.bin")
    listing = [paths[0], missing, *paths[1:]]
    res = fastio.read_files(listing, concurrency=3, read=mode, hash=alg, block_size=4096,
                            chunk_size=16384, into_memory=True)
    assert len(res.buffers) == len(listing)
    assert res.buffers[1] is None and res.files[1].error.errno == errno.ENOENT
    for p, buf, f in zip(listing, res.buffers, res.files):
        if p == missing:
            continue
        assert f.error is None
        assert bytes(buf) == files.data[p], (p, len(files.data[p]))
        assert f.digest == files.expect(p, alg)


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "never"
    return text.split("[", 1)[1].split("]", 1)[0]


def _anon_huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds `address`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("mode", ("pread", "direct"))
def test_big_buffers_ask_for_huge_pages(files, mode):
    # A destination on 4 KiB pages costs a fault per page and splits each O_DIRECT block at the
    # device's segment limit; the buffers ask for transparent huge pages, which the kernel grants
    # whenever THP is not switched off ("never").
    import ctypes

    path = files.make(16 << 20)
    res = fastio.read_files([path], concurrency=2, read=mode, hash="crc32c", into_memory=True)
    buf = res.buffers[0]
    assert bytes(buf) == files.data[path]
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    huge = _anon_huge_kib(address)
    if _thp_mode() == "never":
        assert huge == 0
    else:
        assert huge >= 2048, f"{huge} KiB on huge pages (THP {_thp_mode()!r})"
