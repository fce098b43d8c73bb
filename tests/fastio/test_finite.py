"""count_nonfinite against torch: every bit pattern of the 8- and 16-bit kinds, random bit patterns of every kind with
NaN and Inf put at the edges of buffers, chunks and claims, read-only inputs, the errors, the portable kernel, and a
Python thread that keeps running while a scan runs.

The reference is torch.isfinite on the values widened to float64 (complex ones as their real and imaginary parts):
widening is exact, and torch.isfinite has no kernel for most float8 kinds (and calls every e8m0 pattern finite).
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time

import numpy as np
import pytest
import torch

import fastio
from fastio import _engine

DTYPE = {
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "c64": torch.complex64,
    "c128": torch.complex128,
    "f8_e4m3fn": torch.float8_e4m3fn,
    "f8_e5m2": torch.float8_e5m2,
    "f8_e4m3fnuz": torch.float8_e4m3fnuz,
    "f8_e5m2fnuz": torch.float8_e5m2fnuz,
    "f8_e8m0": torch.float8_e8m0fnu,
}
KINDS = fastio.FINITE_KINDS
CHUNK = _engine._FINITE_CHUNK
NAN, INF = float("nan"), float("inf")


def elem_size(kind: str) -> int:
    return torch.empty(0, dtype=DTYPE[kind]).element_size()


def nonfinite_flags(t: torch.Tensor) -> torch.Tensor:
    """Per element (per component for complex), True where torch says NaN or ±Inf."""
    parts = torch.view_as_real(t) if t.is_complex() else t
    return ~torch.isfinite(parts.to(torch.float64))


def ref_count(t: torch.Tensor) -> int:
    return int(nonfinite_flags(t).sum())


def raw(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a numpy view (the buffer count_nonfinite reads)."""
    return t.contiguous().view(torch.uint8).numpy()


def random_bits(kind: str, n: int, rng: np.random.Generator) -> torch.Tensor:
    """n elements of uniformly random bit patterns: every sign, exponent and payload, NaN and Inf among them."""
    if n == 0:
        return torch.empty(0, dtype=DTYPE[kind])  # numpy gives an empty array stride 0, which view() refuses
    data = rng.integers(0, 256, n * elem_size(kind), dtype=np.uint8)
    return torch.from_numpy(data).view(DTYPE[kind])


def specials(kind: str) -> torch.Tensor:
    """NaN, +Inf and -Inf as the kind stores them (kinds without Inf turn it into NaN or their largest value)."""
    if kind in ("c64", "c128"):
        vals = torch.tensor([complex(NAN, 0), complex(1, INF), complex(-INF, NAN), complex(0, -INF)])
    else:
        vals = torch.tensor([NAN, INF, -INF, -NAN])
    return vals.to(DTYPE[kind])


def inject(t: torch.Tensor, kind: str, positions, rng: np.random.Generator) -> None:
    """Writes a random one of the kind's specials at each position, byte-wise (float8 has no index_put)."""
    size = elem_size(kind)
    rows = t.view(torch.uint8).view(-1, size)
    pats = specials(kind).view(torch.uint8).view(-1, size)
    for p in positions:
        rows[p] = pats[int(rng.integers(len(pats)))]


def edges(n: int, size: int, chunk: int = CHUNK) -> list[int]:
    """First, last, and both sides of every chunk boundary of an n-element buffer."""
    out = {0, n - 1}
    for k in range(1, n * size // chunk + 1):
        b = k * chunk // size
        out.update(p for p in (b - 1, b, b + 1) if 0 <= p < n)
    return sorted(out)


def test_kinds_are_the_documented_ones():
    assert KINDS == tuple(DTYPE)
    assert fastio.count_nonfinite is _engine.count_nonfinite


@pytest.mark.parametrize("kind", [k for k in KINDS if elem_size(k) <= 2])
def test_every_bit_pattern_of_the_narrow_kinds(kind):
    """65536 patterns of f16 and bf16, 256 of each float8: each as its own item, then all in one."""
    codes = np.arange(1 << 8 * elem_size(kind), dtype=np.uint16 if elem_size(kind) == 2 else np.uint8)
    t = torch.from_numpy(codes).view(DTYPE[kind])
    want = nonfinite_flags(t).tolist()
    data = raw(t).tobytes()
    size = elem_size(kind)
    got = fastio.count_nonfinite([(data[i * size:(i + 1) * size], kind) for i in range(len(want))], concurrency=2)
    wrong = [hex(i) for i, (g, w) in enumerate(zip(got, want)) if g != int(w)]
    assert not wrong, f"{kind}: patterns counted wrong: {wrong[:20]}"
    assert fastio.count_nonfinite([(data, kind)]) == [sum(want)]


def test_bit_rules_agree_with_the_specs():
    """The widened reference against the rules each format's definition gives, so the reference is checked too."""
    b16 = torch.arange(1 << 16, dtype=torch.int32)
    assert torch.equal(nonfinite_flags(b16.to(torch.int16).view(torch.bfloat16)), (b16 & 0x7F80) == 0x7F80)
    assert torch.equal(nonfinite_flags(b16.to(torch.int16).view(torch.float16)), (b16 & 0x7C00) == 0x7C00)
    b8 = torch.arange(256, dtype=torch.int32)
    u8 = b8.to(torch.uint8)
    rules = {
        "f8_e4m3fn": (b8 & 0x7F) == 0x7F,
        "f8_e5m2": (b8 & 0x7C) == 0x7C,
        "f8_e4m3fnuz": b8 == 0x80,
        "f8_e5m2fnuz": b8 == 0x80,
        "f8_e8m0": b8 == 0xFF,
    }
    for kind, rule in rules.items():
        assert torch.equal(nonfinite_flags(u8.view(DTYPE[kind])), rule), kind
    # where torch has a direct isfinite kernel it agrees with the widened reference
    for dtype in (torch.float16, torch.bfloat16):
        t = b16.to(torch.int16).view(dtype)
        assert torch.equal(~torch.isfinite(t), nonfinite_flags(t))
    t = u8.view(torch.float8_e5m2)
    assert torch.equal(~torch.isfinite(t), nonfinite_flags(t))


@pytest.mark.parametrize("kind", KINDS)
def test_random_buffers_with_specials_at_the_edges(kind):
    """Random bit patterns over more than two chunks, an odd element count, specials on every chunk seam."""
    rng = np.random.default_rng(KINDS.index(kind))
    size = elem_size(kind)
    n = (2 * CHUNK + CHUNK // 3) // size | 1
    t = random_bits(kind, n, rng)
    inject(t, kind, edges(n, size) + list(rng.integers(0, n, 64)), rng)
    want = ref_count(t)
    for c in (1, 2, 3, 8):
        assert fastio.count_nonfinite([(raw(t), kind)], concurrency=c) == [want], f"concurrency {c}"


@pytest.mark.parametrize("kind", KINDS)
def test_small_buffers_odd_lengths(kind):
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 5, 7, 31, 33, 63, 65, 127, 129, 1001):
        t = random_bits(kind, n, rng)
        inject(t, kind, [0, n - 1], rng)
        assert fastio.count_nonfinite([(raw(t), kind)]) == [ref_count(t)], f"{kind} x{n}"


@pytest.mark.parametrize("kind", KINDS)
def test_all_specials_and_all_finite(kind):
    """5 MiB of nothing but specials: more hits in a row than a narrow per-lane counter holds (255, 65535)."""
    n = (5 << 20) // elem_size(kind) + 3
    t = specials(kind).repeat(n // 4 + 1)[:n].contiguous()
    nan = torch.full((n,), complex(NAN, NAN) if t.is_complex() else NAN).to(DTYPE[kind])
    assert fastio.count_nonfinite([(raw(t), kind), (raw(nan), kind)]) == [ref_count(t), ref_count(nan)]
    assert ref_count(nan) == n * (2 if t.is_complex() else 1)
    z = torch.zeros(n * elem_size(kind), dtype=torch.uint8).view(DTYPE[kind])  # all bits 0: finite in every kind
    assert fastio.count_nonfinite([(raw(z), kind)]) == [ref_count(z)] == [0]


def test_pieces_sum_to_the_whole():
    """Split at random element boundaries, in one call or many, the counts add up to the count of the whole."""
    rng = np.random.default_rng(3)
    for kind in KINDS:
        size = elem_size(kind)
        n = 3 * CHUNK // (2 * size) + 11
        t = random_bits(kind, n, rng)
        buf = memoryview(raw(t))
        cuts = [0, *sorted(int(x) for x in rng.integers(0, n, 9)), n]
        pieces = [(buf[a * size:b * size], kind) for a, b in zip(cuts, cuts[1:])]
        whole = fastio.count_nonfinite([(buf, kind)])[0]
        assert whole == ref_count(t)
        assert sum(fastio.count_nonfinite(pieces, concurrency=2)) == whole
        assert sum(fastio.count_nonfinite([p])[0] for p in pieces) == whole


def test_claims_that_span_items_and_end_mid_element():
    """A thread's claim spans small items and ends where the budget left is less than one element of the next."""
    rng = np.random.default_rng(11)
    layout = [
        ("f8_e5m2", CHUNK - 5),
        ("c128", (2 * CHUNK + 48) // 16),
        ("f16", 3),
        ("f8_e8m0", 0),
        ("c64", CHUNK // 8 - 1),
        *[(KINDS[i % len(KINDS)], int(rng.integers(0, 300))) for i in range(3000)],
        ("bf16", CHUNK // 2 + 1),
        ("f64", 1),
    ]
    tensors = []
    for kind, n in layout:
        t = random_bits(kind, n, rng)
        if n:
            inject(t, kind, edges(n, elem_size(kind)), rng)
        tensors.append(t)
    want = [ref_count(t) for t in tensors]
    items = [(raw(t), kind) for t, (kind, _) in zip(tensors, layout)]
    for c in (1, 2, 5):
        assert fastio.count_nonfinite(items, concurrency=c) == want, f"concurrency {c}"


def test_read_only_and_other_buffers(tmp_path):
    rng = np.random.default_rng(5)
    t = random_bits("bf16", 100_003, rng)
    inject(t, "bf16", [0, 100_002], rng)
    want = ref_count(t)
    data = raw(t).tobytes()
    frozen = np.frombuffer(data, dtype=np.uint16)
    assert not frozen.flags.writeable
    path = tmp_path / "w.bin"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        bufs = [data, bytearray(data), memoryview(data), memoryview(bytearray(data)).toreadonly(), frozen,
                t.view(torch.int16).numpy(), mm]
        assert fastio.count_nonfinite([(b, "bf16") for b in bufs]) == [want] * len(bufs)


def test_empty_inputs():
    assert fastio.count_nonfinite([]) == []
    assert fastio.count_nonfinite(iter([])) == []
    assert fastio.count_nonfinite([(b"", k) for k in KINDS]) == [0] * len(KINDS)
    assert fastio.count_nonfinite(((b"\x00\x7f", "bf16") for _ in range(3)), concurrency=1) == [0, 0, 0]


def _raises(items, match, **kw):
    with pytest.raises(fastio.OptionError, match=match) as e:
        fastio.count_nonfinite(items, **kw)
    assert isinstance(e.value, ValueError) and e.value.errno == 22
    assert "\n" not in str(e.value)
    return str(e.value)


def test_errors_name_the_item():
    ok = (b"\x00" * 8, "f32")
    _raises([ok, (b"\x00" * 3, "bf16")], r"item 1: 3 bytes is not a whole number of bf16 elements \(2 bytes each\)")
    _raises([ok, ok, (b"\x00" * 24, "c128")], r"item 2: 24 bytes .* c128 elements \(16 bytes each\)")
    _raises([ok, (b"\x00" * 4, "c64")], r"item 1: .* c64")
    _raises([ok, ok, ok, (b"", "float32")], r"item 3: unknown kind 'float32': choose one of f16, bf16")
    _raises([(b"", None)], r"item 0: unknown kind None")
    _raises([ok, b"abcd"], r"item 1: expected a \(buffer, kind\) pair")
    _raises([ok, (b"", "f32", 1)], r"item 1: expected a \(buffer, kind\) pair")
    _raises([ok, (12345, "f32")], r"item 1: not a contiguous buffer")
    _raises([(np.zeros((4, 4), np.float32)[:, ::2], "f32")], r"item 0: not a contiguous buffer")


@pytest.mark.parametrize("bad", [0, -1, fastio.MAX_CONCURRENCY + 1])
def test_bad_concurrency(bad):
    _raises([(b"\x00" * 4, "f32")], rf"concurrency must be 1\.\.{fastio.MAX_CONCURRENCY}, got {bad}", concurrency=bad)


def test_buffers_are_released_on_success_and_on_error():
    """A bytearray cannot be resized while its buffer is exported: resizing afterwards proves the release."""
    grow = [bytearray(64) for _ in range(3)]
    fastio.count_nonfinite([(b, "f64") for b in grow])
    with pytest.raises(fastio.OptionError, match="item 3"):
        fastio.count_nonfinite([(b, "f32") for b in grow] + [(b"\x00", "f32")])
    for b in grow:
        b.extend(b"\x00" * 8)
        assert len(b) == 72


def test_kernel_in_use():
    """FASTIO_FINITE=sw selects the portable kernel; otherwise the vector one where the CPU has it."""
    impl = _engine._finite_impl()
    if os.environ.get("FASTIO_FINITE") == "sw":
        assert impl == "sw"
    else:
        assert impl in ("avx2", "sw")


def test_portable_kernel_gives_the_same_counts(pyrun):
    """This module again, in a fresh interpreter that runs the portable kernel (the hardware path's fallback)."""
    # the tests whose counts come from the kernel; argument checks, errors and buffer lifetimes do not depend on it
    kernel = ("bit_pattern or bit_rules or random_buffers or small_buffers or all_specials or pieces or claims or "
              "read_only or empty")
    code = f"import sys, pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', {kernel!r}, " \
           "'tests/fastio/test_finite.py']))"
    out = pyrun(code, env={"FASTIO_FINITE": "sw"}, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout


class Ticker(threading.Thread):
    """Counts loop turns; each turn sleeps, so the thread never holds the GIL against one that wants it."""

    def __init__(self):
        super().__init__(daemon=True)
        self.n = 0
        self.stop = False

    def run(self):
        while not self.stop:
            self.n += 1
            time.sleep(0.0001)


def _turns_during(call) -> int:
    """The ticker's turns while `call` runs in this thread. The switch interval is set so long that this thread
    never hands the GIL over on a timer: the ticker can turn only while `call` itself has released the GIL."""
    ticker = Ticker()
    old = sys.getswitchinterval()
    ticker.start()
    try:
        while ticker.n < 5:
            time.sleep(0.001)
        sys.setswitchinterval(1000.0)
        time.sleep(0.01)  # a ticker already waiting for the GIL waits on the old interval: let it through first
        n0 = ticker.n
        call()
        n1 = ticker.n
    finally:
        sys.setswitchinterval(old)
        ticker.stop = True
        ticker.join()
    return n1 - n0


def test_gil_is_released_for_the_scan():
    """A scan of 2 GiB (one 256 MiB buffer eight times) on one thread lets the ticker run many turns; Python code
    of the same kind of length, which holds the GIL, lets it run none: the measure tells the two apart."""
    t = torch.full((128 << 20,), 1.5, dtype=torch.bfloat16)
    t[-1] = NAN
    buf = raw(t)
    got = []
    turns = _turns_during(lambda: got.append(fastio.count_nonfinite([(buf, "bf16")] * 8, concurrency=1)))
    assert got == [[1] * 8]
    held = _turns_during(lambda: sum(range(3_000_000)))
    assert held == 0, "the control should starve the ticker"
    assert turns >= 10, f"the ticker turned {turns} times during the scan"
