"""The NaN scan as the bytes land, attacked: crafted `scan` arguments, counts read the moment a file is listed as
done, headers of many tiny tensors cut by many chunk edges, an unreadable header, and NaNs planted where block and
chunk edges cut a value, for every kind and every read mode of a restore."""

from __future__ import annotations

import errno
import json
import os
import struct
import time

import pytest
import torch

import fastio
from fastio import OptionError
from ckptbench.checkpoint.formats import FormatError, safetensors_format
from ckptbench.restore import scan

NAN = {"bf16": b"\xc0\x7f", "f16": b"\x00\x7e", "f32": b"\x00\x00\xc0\x7f", "f64": b"\0" * 6 + b"\xf8\x7f",
       "c64": b"\x00\x00\xc0\x7f", "c128": b"\0" * 6 + b"\xf8\x7f", "f8_e4m3fn": b"\x7f", "f8_e5m2": b"\x7e",
       "f8_e4m3fnuz": b"\x80", "f8_e5m2fnuz": b"\x80", "f8_e8m0": b"\xff"}
UNIT = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 4, "c128": 8, "f8_e4m3fn": 1, "f8_e5m2": 1,
        "f8_e4m3fnuz": 1, "f8_e5m2fnuz": 1, "f8_e8m0": 1}
ELEM = UNIT | {"c64": 8, "c128": 16}


class _Int(int):
    """An int that says what its checker wants to hear."""


@pytest.mark.parametrize("bad, why", [
    ([(0, 2)], "offset, length, kind"),
    (["abc"], "offset, length, kind"),
    (5, "list of"),
    (None, "list of"),
    ([(0, 2, ["bf16"])], "unknown kind"),  # unhashable: was a TypeError
    ([(True, 2, "bf16")], "in order"),  # a bool is no offset, as a safetensors header's bool is none
    ([(0, True, "f8_e5m2")], "in order"),
    ([(_Int(0), 2, "bf16")], "in order"),
])
def test_malformed_scan_arguments_are_one_option_error(tmp_path, bad, why):
    p = tmp_path / "f"
    p.write_bytes(b"\0" * 4096)
    with pytest.raises(OptionError, match=why):
        fastio.start([str(p)], read="pread", hash="none", into_memory=True, scan={0: bad})
    with pytest.raises(OptionError, match="dict"):
        fastio.start([str(p)], read="pread", hash="none", into_memory=True, scan=[(0, 2, "bf16")])


def test_counts_are_final_the_moment_completed_lists_the_file(tmp_path):
    """A bf16 NaN cut by a chunk edge is counted when the file is finalized; `completed` listed the file (and
    scan_counts answered, without it) while the last worker was still finalizing: a NaN missed."""
    p = tmp_path / "shard.safetensors"
    data = bytearray(16 << 20)
    data[8191:8193] = NAN["bf16"]  # the region starts at byte 1: the chunk edge at 8192 cuts this value
    p.write_bytes(bytes(data))
    regions = [(1, 1 << 20, "bf16")] + [((2 << 20) + 2 * i, 2, "bf16") for i in range(60_000)]
    h = fastio.start([str(p)], read="pread", hash="none", into_memory=True, block_size=4096, chunk_size=4096,
                     concurrency=2, scan={0: regions})
    deadline = time.monotonic() + 60
    while not h.completed() and time.monotonic() < deadline:
        pass
    first = h.scan_counts(0)
    h.wait()
    assert first is not None and first[0] == 1 == h.scan_counts(0)[0]


def test_many_tiny_tensors_cut_by_many_chunk_edges_take_linear_time(tmp_path):
    """Every chunk edge was tried against every region: 16384 edges x 200k one-value tensors took seconds for a
    64 MiB file; the edges inside each region are few."""
    p = tmp_path / "shard.safetensors"
    data = bytearray(64 << 20)
    n = 200_000
    for i in range(0, n, 997):
        data[2 * i + 1:2 * i + 3] = NAN["bf16"]
    p.write_bytes(bytes(data))
    regions = [(2 * i + 1, 2, "bf16") for i in range(n)]
    t0 = time.perf_counter()
    h = fastio.start([str(p)], read="pread", hash="none", into_memory=True, block_size=4096, chunk_size=4096,
                     concurrency=2, scan={0: regions})
    assert not h.wait().failed
    took = time.perf_counter() - t0
    assert sum(h.scan_counts(0)) == len(range(0, n, 997))
    assert took < 3.0, f"{took:.1f} s"


def test_an_unreadable_header_is_left_to_the_read_and_named(tmp_path, monkeypatch):
    """A header that cannot be read (EIO) aborted the whole restore with a line naming no file; now the landing
    scan leaves that file to the read (which reports it), and a header read says which file."""
    good, bad = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    for p in (good, bad):
        safetensors_format.save_file({"w": torch.zeros(1 << 19)}, str(p))
    real = os.fdopen

    class Failing:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    def fdopen(fd, *a, **kw):
        f = real(fd, *a, **kw)
        return Failing(f) if os.readlink(f"/proc/self/fd/{fd}") == str(bad) else f

    monkeypatch.setattr(safetensors_format.os, "fdopen", fdopen)
    paths = [str(good), str(bad)]
    regions = scan.landing_regions([(p, os.path.getsize(p)) for p in paths])
    assert sorted(regions) == [0]
    with pytest.raises(FormatError, match=f"{bad}: cannot read its header"):
        safetensors_format.header_entries(str(bad))


def _shard(path, tensors: dict[str, tuple[str, int]], code: dict[str, str], pad: int
           ) -> dict[str, tuple[int, int, str]]:
    """A raw safetensors file of zero-filled tensors (e8m0's zero is finite too) whose data starts `pad` bytes
    later than its JSON needs: every tensor at an odd file offset. {name: (file offset, bytes, kind)}."""
    hdr = {}
    hdr["i"] = {"dtype": "I64", "shape": [3], "data_offsets": [0, 24]}  # an integer tensor: not scanned
    hdr["z"] = {"dtype": "BF16", "shape": [0], "data_offsets": [24, 24]}  # zero-length: nothing to scan
    at = 24
    for name, (kind, n) in tensors.items():
        hdr[name] = {"dtype": code[kind], "shape": [n], "data_offsets": [at, at + n * ELEM[kind]]}
        at += n * ELEM[kind]
    head = json.dumps(hdr).encode() + b" " * pad
    base = 8 + len(head)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"\0" * at)
    return {k: (base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0], tensors[k][0])
            for k, v in hdr.items() if k in tensors}


def test_a_restore_finds_a_nan_cut_by_a_block_and_a_chunk_edge_in_every_kind_and_read_mode(tmp_path):
    """One NaN per tensor, in the value a 4096-byte block edge (or the 8192-byte chunk edge) cuts, tensors at odd
    file offsets; zero-length and integer tensors beside them. Each read mode, fused and staged, names each
    tensor once."""
    from ckptbench.restore import runner

    code = {"bf16": "BF16", "f16": "F16", "f32": "F32", "f64": "F64", "c64": "C64", "f8_e4m3fn": "F8_E4M3",
            "f8_e5m2": "F8_E5M2", "f8_e4m3fnuz": "F8_E4M3FNUZ", "f8_e5m2fnuz": "F8_E5M2FNUZ", "f8_e8m0": "F8_E8M0"}
    kinds = [k for k in code if code[k] in safetensors_format._DTYPES]  # an older torch lacks some float8s
    tensors = {f"t{i}.w": (k, 120_001 // ELEM[k] + 1) for i, k in enumerate(kinds)}
    path = tmp_path / "model.safetensors"
    where = _shard(path, tensors, code, pad=3)
    data = bytearray(path.read_bytes())
    for off, n, kind in where.values():
        u = UNIT[kind]
        edge = (off // 8192 + 1) * 8192 + (4096 if kind in ("f32", "c64") else 0)  # a chunk edge, or a block's
        q = off + (edge - 1 - off) // u * u  # the value holding the byte before the edge: cut when u > 1
        assert off <= q and q + u <= off + n
        data[q:q + u] = NAN[kind]
    path.write_bytes(bytes(data))
    assert len(data) >= scan.LANDING_MIN
    want = sorted(f"{name}: 1 non-finite value(s) in weights" for name in tensors)
    for read, mode in (("pread", "fused"), ("direct", "fused"), ("mmap", "fused"), ("pread", "staged")):
        opts = runner.RunOptions.make(cache="hot", read=read, mode=mode, block_size=4096, chunk_size=8192)
        rep = runner.run(str(tmp_path), opts, repeats=1)[0]
        assert rep.status == "failed" and sorted(rep.problems) == want, (read, mode, rep.problems)
        if read != "mmap" and mode == "fused":  # counted by the engine as the blocks landed
            assert f"({len(tensors)} of them during the read)" in rep.notes["check"], rep.notes["check"]


_SHORT_READS = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/types.h>
/* pread returning at most SHORT_READ bytes, as a FUSE or network filesystem may */
ssize_t pread(int fd, void *buf, size_t len, off_t off)
{
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (!real)
        real = (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
    size_t most = strtoul(getenv("SHORT_READ"), NULL, 10);
    return real(fd, buf, len < most ? len : most, off);
}
ssize_t pread64(int fd, void *buf, size_t len, off_t off) __attribute__((alias("pread")));
"""


def test_short_reads_count_a_value_a_chunk_edge_cuts_once(tmp_path):
    """Reads that return a byte at a time: the f64 the chunk edge at 4096 cuts (six bytes before it, its exponent
    after) was counted by the second block of the chunk after the edge (its exponent alone reads as Inf) and again
    once the file was done: one NaN reported as two."""
    import shutil
    import subprocess
    import sys
    import sysconfig

    cc = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the short-read shim")
    src, shim = tmp_path / "short.c", tmp_path / "short.so"
    src.write_text(_SHORT_READS)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(src), "-ldl"], check=True)
    data = bytearray(8192)
    data[4090:4098] = NAN["f64"]  # the region starts at byte 2: this f64 is [4090, 4098)
    p = tmp_path / "shard.bin"
    p.write_bytes(bytes(data))
    script = ("import fastio, sys\n"
              "h = fastio.start([sys.argv[1]], read='pread', hash='none', into_memory=True, block_size=4096,"
              " chunk_size=4096, concurrency=2, scan={0: [(2, 8184, 'f64')]})\n"
              "assert not h.wait().failed\n"
              "print(h.scan_counts(0)[0])\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, LD_PRELOAD=str(shim), SHORT_READ="1")
    out = subprocess.run([sys.executable, "-c", script, str(p)], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"]
