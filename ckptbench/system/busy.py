"""Whether the box was busy as its floor was measured: other work's share of the cores' time just before (the
0.2 s of /proc/stat ahead of it) and while it measured (the box's busy time less this process's own CPU time). Such
figures are low; the note is kept with them and said wherever they are used."""

from __future__ import annotations

import os
import time

from ckptbench.core.units import human_pct

BUSY_SHARE = 0.5  # of the cores' time taken by other work just before measuring: the figures would be low
BUSY_DURING = 0.25  # of the cores' time taken by other work while measuring (the measurement holds every core)


def _idle_total() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[3] + v[4], sum(v)  # idle and iowait; of user, nice, system, idle, iowait, irq, softirq, steal


def _busy_words(share: float) -> str:
    return (f"the box was busy ({human_pct(share)} of its cores' time taken by other work as it was measured): these "
            "figures may be low; `ckptbench floor SOURCE --remeasure` when it is quiet")


def busy(window_s: float = 0.2) -> str:
    """A note when other work held the cores as the box was about to be measured: the share of the cores' time that
    was not idle over `window_s` of /proc/stat (a VM's steal included), taken before, so the measurement's own
    threads are not counted (a load average taken after counted them, and called a quiet box busy)."""
    try:
        i0, t0 = _idle_total()
        time.sleep(window_s)
        i1, t1 = _idle_total()
    except (OSError, ValueError, IndexError):
        return ""
    share = 1 - (i1 - i0) / (t1 - t0) if t1 > t0 else 0.0
    return _busy_words(share) if share >= BUSY_SHARE else ""


class OtherWork:
    """The share of the cores' time other work took while this process measured: the box's busy time over the
    window (/proc/stat, a VM's steal included) less this process's own CPU time. Looking only before the
    measurement called a box quiet that two other jobs were loading (a hot read then ran at 168 % of its floor)."""

    def __init__(self):
        try:
            self.start = (*_idle_total(), _own_cpu_s())
        except (OSError, ValueError, IndexError):
            self.start = None

    def share(self) -> float:
        if self.start is None:
            return 0.0
        try:
            idle, total, own = (*_idle_total(), _own_cpu_s())
        except (OSError, ValueError, IndexError):
            return 0.0
        hz = os.sysconf("SC_CLK_TCK")
        span_s = (total - self.start[1]) / hz
        busy_s = span_s - (idle - self.start[0]) / hz
        return max(0.0, busy_s - (own - self.start[2])) / span_s if span_s > 0 else 0.0

    def note(self) -> str:
        share = self.share()
        return _busy_words(share) if share >= BUSY_DURING else ""


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system
