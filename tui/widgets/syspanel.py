"""The system panel: limits, dirty pages, read-ahead, mount, CPU per core, memory, disk and TCP."""

from __future__ import annotations

from rich.table import Table
from textual.widgets import Static

from ckptbench.core.units import human_bytes, human_pct
from ckptbench.system.probes import options_once


def _b(n) -> str:
    return "?" if n is None else human_bytes(n)


def _pct(v) -> str:
    """A figure the sampler gives in percent, as every other share on screen reads."""
    return "?" if v is None else human_pct(v / 100)


def _f(v, fmt: str = "{}") -> str:
    return "?" if v is None else fmt.format(v)


class SystemPanel(Static):
    DEFAULT_CSS = """
    SystemPanel { width: 46; }
    """

    def show(self, s: dict) -> None:
        if s == getattr(self, "_shown", None):
            return
        self._shown = s
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold")
        t.add_column()
        nofile = s.get("ulimit_nofile") or [None, None]
        t.add_row("ulimit -n", f"{_f(nofile[0])} (hard {_f(nofile[1])}), {_f(s.get('fds_in_use'))} in use")
        t.add_row("dirty_ratio", f"{_f(s.get('dirty_ratio'))} % (background {_f(s.get('dirty_background_ratio'))} %)")
        t.add_row("Dirty/Writeback", f"{_b(s.get('dirty_bytes'))} / {_b(s.get('writeback_bytes'))}")
        t.add_row("read_ahead_kb", _f(s.get("read_ahead_kb")))
        t.add_row("mount", f"{_f(s.get('fs_type'))} on {_f(s.get('mount_point'))}")
        t.add_row("options", (options_once(s.get("mount_options")) or "?")[:60])
        cores = s.get("cpu_pct_per_core") or []
        t.add_row("CPU/core", "  ".join(f"{human_pct(c / 100):>5s}" for c in cores[:16]) or "?")
        t.add_row("RSS/avail", f"{_b(s.get('rss_bytes'))} / {_b(s.get('mem_available_bytes'))}")
        t.add_row("disk", f"util {_pct(s.get('disk_util_pct'))}, await {_f(s.get('disk_await_ms'), '{:.1f}')} ms")
        t.add_row("TCP retrans", _pct(s.get("tcp_retransmit_pct")))
        self.update(t)
