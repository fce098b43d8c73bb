"""The structural check's finite-value scan: native (fastio), and done during a fused read, so the check stage is
left with little or nothing. Local safetensors files have their tensors counted by the read engine block by block as
they land (`landing_regions`), while the bytes are in the CPU's caches: 50 GB/s a core here for bf16, where the same
scan over a landed file reads it back from memory at 10. Files it cannot do that for (an object store's, small ones,
an mmap read) are scanned as the read completes them (`EarlyScan`).

A tensor is known by where its bytes are (address and length): a fused load builds its tensors over the very
buffers the read filled, so a region scanned during the read is recognised in the loaded state without any
bookkeeping by name.
"""

from __future__ import annotations

import hashlib
import os
import threading

import numpy as np
import torch

import fastio

KINDS = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "complex64": "c64",
         "complex128": "c128", "float8_e4m3fn": "f8_e4m3fn", "float8_e5m2": "f8_e5m2",
         "float8_e4m3fnuz": "f8_e4m3fnuz", "float8_e5m2fnuz": "f8_e5m2fnuz", "float8_e8m0fnu": "f8_e8m0"}


def kind_of(dtype: torch.dtype) -> str | None:
    """fastio's scan kind for a torch dtype; None for one it has no kernel for (or one that is not floating)."""
    return KINDS.get(str(dtype).removeprefix("torch."))


def _address(buf) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data if memoryview(buf).nbytes else 0


LANDING_MIN = 1 << 20  # a smaller file is scanned once landed: its header read first would cost more than it saves


class Landing(dict):
    """{file index: [(offset in the file, length, kind)]} for the read engine's `scan`, with `heads`: each file's
    bytes up to its data section as they were parsed, which its landed bytes must repeat for the counts to be its
    tensors' (a file rewritten between the two reads has other tensors at those offsets, maybe of another dtype)."""

    def __init__(self):
        super().__init__()
        self.heads: dict[int, tuple[int, bytes]] = {}  # (length, digest): a header of 300k tensors is megabytes


def landing_regions(paths_sizes: list[tuple[str, int]]) -> Landing:
    """The floating tensors of each safetensors file of LANDING_MIN bytes or more whose header parses (read here, a
    few KiB a file). A file whose header does not parse is left out: its load reports it, as ever."""
    from ckptbench.checkpoint.formats import FormatError
    from ckptbench.checkpoint.formats.safetensors_format import header_layout

    out = Landing()
    for i, (path, size) in enumerate(paths_sizes):
        if size < LANDING_MIN or not path.endswith(".safetensors"):
            continue
        try:
            head, entries = header_layout(path)
        except FormatError:
            continue
        base = len(head)
        regions = [(base + lo, hi - lo, kind) for dtype, _shape, lo, hi in sorted(entries.values(), key=lambda e: e[2])
                   if hi > lo and (kind := kind_of(dtype)) is not None]
        if regions and regions[-1][0] + regions[-1][1] <= size:  # changed since listed: the read says so, not this
            out[i], out.heads[i] = regions, (len(head), hashlib.blake2b(head).digest())
    return out


def landed_counts(handle, regions: Landing) -> dict[tuple[int, int], int]:
    """What the read engine counted, keyed as EarlyScan keys its counts: (address, bytes) of each tensor's region in
    the file's buffer; only files it finished without error, whose landed header is the one parsed (else the check
    scans their tensors itself)."""
    out = {}
    for i, regs in regions.items():
        counts, buf = handle.scan_counts(i), handle.buffer(i)
        length, digest = regions.heads[i]
        if counts is None or buf is None or hashlib.blake2b(buf[:length]).digest() != digest:
            continue
        start = _address(buf)
        out.update({(start + off, n): c for (off, n, _), c in zip(regs, counts)})
    return out


class EarlyScan:
    """Scans safetensors files as a fused read completes them, on a thread of its own (one native scan at a time,
    on the core the read leaves idle while the kernel faults pages in): `start(handle)` when the read starts,
    `stop()` when it ends. `counts` maps (address, bytes) of every region scanned to its count of NaN/Inf."""

    POLL_S = 0.01

    def __init__(self, names: list[str]):
        self.names = names
        self.seen: set[int] = set()
        self.counts: dict[tuple[int, int], int] = {}
        self.files = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, handle) -> None:
        self._thread = threading.Thread(target=self._run, args=(handle,), name="ckptbench-early-scan", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops polling and waits for a scan in progress; what was counted stays in `counts`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, handle) -> None:
        while not self._stop.wait(self.POLL_S):
            self.poll(handle)

    def poll(self, handle) -> None:
        from ckptbench.checkpoint.formats import FormatError
        from ckptbench.checkpoint.formats.safetensors_format import parse_header, tensor_entries

        for i in handle.completed():
            if i in self.seen:
                continue
            self.seen.add(i)
            buf = handle.buffer(i)
            if buf is None:
                continue
            try:  # the same checked parse the load uses; a bad file is the load's to report, not this scan's
                header, base = parse_header(buf, self.names[i])
                entries = tensor_entries(header, buf.nbytes - base, self.names[i])
            except FormatError:
                continue
            items, keys = [], []
            start = _address(buf)
            for dtype, _shape, lo, hi in entries.values():
                kind = kind_of(dtype)
                if kind is not None and hi > lo:
                    items.append((buf[base + lo:base + hi], kind))
                    keys.append((start + base + lo, hi - lo))
            for key, n in zip(keys, fastio.count_nonfinite(items, concurrency=1)):
                self.counts[key] = n
            self.files += 1


def _raw(t: torch.Tensor):
    """The tensor's bytes as a buffer, without a copy when it is contiguous (a fused load's views are)."""
    # reshape keeps a 1-d strided view (torch.save of w[::2]) as it is, and such a view has no bytes to view as uint8
    flat = t.detach().reshape(-1).contiguous()
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def nonfinite(tensors, concurrency: int, known: dict[tuple[int, int], int] | None = None
              ) -> tuple[int, int, dict[str, int], int]:
    """(floating tensors, their bytes, name -> count of NaN/Inf values, how many were already scanned) over
    (name, tensor) pairs; what `known` (an EarlyScan's counts) holds is not scanned again."""
    known = known or {}
    items, names, slow, early, bad = [], [], [], 0, {}
    nbytes = 0
    for name, t in tensors:
        if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            continue
        size = t.numel() * t.element_size()
        nbytes += size
        got = known.get((t.data_ptr(), size)) if t.is_contiguous() else None
        if got is not None:
            early += 1
            if got:
                bad[name] = got
            continue
        kind = kind_of(t.dtype)
        if kind is None:
            slow.append((name, t))  # a dtype the scan has no kernel for (complex32): torch checks it
        else:
            items.append((_raw(t), kind))
            names.append(name)
    counts = fastio.count_nonfinite(items, concurrency=max(1, min(concurrency, os.cpu_count() or 1)))
    bad.update({n: c for n, c in zip(names, counts) if c})
    bad.update({n: int((~torch.isfinite(t)).sum()) for n, t in slow if not bool(torch.isfinite(t).all())})
    return len(items) + len(slow) + early, nbytes, bad, early
