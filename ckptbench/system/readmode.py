"""`--read auto`: the read path for local files, chosen per read from what the files and the cache show.

Measured on the project's machines: a cold read with O_DIRECT runs about twice the rate of pread (no page-cache
fill, no copy out of it, large requests straight to the device); a hot read with pread beats mmap (1.9× against
1.3× fio's rate; mmap pays a page fault per 4 KiB). So: direct when most bytes must come from the device and the
filesystem takes O_DIRECT at our alignment; pread otherwise. The choice and its reason go in every output.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import fastio

from ckptbench.core.options import AUTO
from ckptbench.core.units import human_pct
from ckptbench.system import probes

ALIGN = 4096  # fastio's O_DIRECT unit (buffers, offsets, request sizes)
HOT_SHARE = 0.5  # at least this share of the bytes resident: the read is served from memory


@dataclass(frozen=True)
class Choice:
    mode: str
    why: str  # "<short reason>: <the evidence>", the short part fit for a status line


def short(why: str) -> str:
    """The short reason of a `why` (what a status line shows)."""
    return why.split(": ", 1)[0]


def direct_refusal(path: str) -> str | None:
    """None when `path`'s filesystem serves an aligned O_DIRECT read, else why not (tmpfs, some FUSE mounts
    refuse the open or the read with EINVAL)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return f"the filesystem refuses O_DIRECT ({exc.strerror})"
    try:
        with mmap.mmap(-1, ALIGN) as buf:  # page-aligned, as O_DIRECT needs
            os.preadv(fd, [buf], 0)
    except OSError as exc:
        return f"an aligned O_DIRECT read fails ({exc.strerror})"
    finally:
        os.close(fd)
    return None


def choose(paths_sizes: list[tuple[str, int]], resident: float | None, block_size: int) -> Choice:
    """The read path for these local files, `resident` being the share of their bytes in the page cache now."""
    if not paths_sizes:
        return Choice("pread", "nothing to read: no files")
    if resident is not None and resident >= HOT_SHARE:
        return Choice("pread", f"cached: {human_pct(resident)} of the bytes are in the page cache, and pread copies "
                               "them out fastest; O_DIRECT would go back to the device")
    if block_size % ALIGN:
        return Choice("pread", f"unaligned: the block size {block_size} is not a multiple of {ALIGN}, which "
                               "O_DIRECT needs")
    largest = max(paths_sizes, key=lambda ps: ps[1])[0]
    mount = probes.mount_of(largest)
    if isinstance(mount, probes.Mount) and mount.fs_type.startswith("fuse"):
        return Choice("pread", f"FUSE: {mount.fs_type} takes O_DIRECT, but it stops at the daemon (which reads the "
                               "backend its own way), so it only skips the kernel's read-ahead")
    refusal = direct_refusal(largest)
    if refusal:
        return Choice("pread", f"no O_DIRECT: {refusal}")
    cached = "unknown" if resident is None else human_pct(resident)
    # "cold: 42 % of the bytes in the page cache" read as a contradiction to a new user: part-cached is said so
    some = resident is not None and resident >= 0.01
    return Choice("direct", f"{'mostly cold' if some else 'cold'}: {cached} of the bytes in the page cache"
                            f"{' (under half)' if some else ''}, so they come from the device, and O_DIRECT works "
                            "here (large aligned reads straight into the buffers, no page-cache copy)")
