"""What a restore costs the box: memory it will need (checked before reading), peak RSS and CPU time."""

from __future__ import annotations

import psutil

from ckptbench.core.errors import CkptbenchError
from ckptbench.sources import Listing
from ckptbench.system import probes


def memory_needed(listing: Listing, mode: str) -> int:
    """What the loader will hold at its peak: the checkpoint's bytes, plus one shard's copy while staged loads it."""
    total = listing.bytes
    if mode == "staged":
        return total + max(((f.size or 0) for f in listing.files), default=0)
    return total


_PER_RANK = "safetensors shards, or restore per rank under torchrun"
_RESTORE_FIX = {"staged": f"--mode fused (tensors over the read buffers, no second copy), {_PER_RANK}",
                "fused": f"a box with more memory, or {_PER_RANK}"}  # a fused restore was told to use --mode fused


def oom_precheck(listing: Listing, mode: str, doing: str | None = None, fix: str | None = None) -> None:
    """One line before reading when the checkpoint cannot fit in memory: `doing` what holds it (a restore of `mode`
    by default; save and load read it whole, as staged does) and the `fix` (by default, the restore's for `mode`)."""
    fix = fix or _RESTORE_FIX.get(mode, _PER_RANK)
    need = memory_needed(listing, mode)
    avail = psutil.virtual_memory().available
    if need > avail * 0.9:
        raise CkptbenchError(
            f"{listing.source}: {doing or f'a {mode} restore'} holds about {need / 2**30:.1f} GiB, "
            f"{avail / 2**30:.1f} GiB is available; stop before reading. Fix: {fix}")


class PeakRSS:
    """Peak RSS of this repeat: resets the kernel's high-water mark when it may, else samples."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.sampled = 0
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = True
        except OSError:
            self.reset = False

    def sample(self) -> None:
        self.sampled = max(self.sampled, self.proc.memory_info().rss)

    def peak(self) -> int:
        self.sample()
        return max(self.sampled, probes.own_peak_rss()) if self.reset else self.sampled


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system
