"""Figures as people write them and read them: byte sizes ("1M", "64KiB" in, "1.5 GiB" out), shares ("82 %"),
ages ("12 min") and counts ("21.1 M"), one format each for every command and the dashboard."""

from __future__ import annotations

import math
import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# ASCII: a str pattern's \d also matches '١' and '৪', which float() then reads as digits no one typed
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE | re.ASCII)


def parse_size(text: str) -> int:
    """'1M', '1MiB', '512k', '4096' → bytes (binary units). Raises ValueError on anything else."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 512K, 1M, 1GiB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _pct_places(fraction: float) -> tuple[float, int]:
    pct = round(fraction * 100, 9)  # 0.415 * 100 is 41.4999…: unrounded it would read 41 %, not 42 %
    places = 1 if abs(pct) < 9.95 else 0
    # halves up, as a person rounds: format() rounds them to even, so 0.285 read 28 % beside 0.2853's 29 %
    return math.copysign(math.floor(abs(pct) * 10 ** places + 0.5) / 10 ** places, pct), places


def pct_shown(fraction: float) -> float:
    """The percent human_pct writes for `fraction`, as a number (0.666 → 67.0, 0.054 → 5.4): what a change between
    two shown shares is taken from, so that it is the difference a reader makes of them."""
    return _pct_places(fraction)[0]


def human_pct(fraction: float, *, signed: bool = False) -> str:
    """A share (0.82) as the text writes it: "82 %", with the space the README and docs use; `signed` for a change.
    Under 10 % one decimal stays, so a residency of 0.4 % does not read as none."""
    shown, places = _pct_places(fraction)
    return f"{shown:{'+' if signed else ''}.{places}f} %"


def human_age(seconds: float) -> str:
    """How long ago a cached figure was measured, in the unit that keeps it short: "45 s", "12 min", "3.1 h",
    "2.0 d"."""
    s = max(0.0, seconds)  # a clock set back makes a fresh figure's age negative: it is still fresh
    if s < 59.5:
        return f"{s:.0f} s"
    if s < 59.5 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def human_count(n: float) -> str:
    """A count (a model's parameters) in the unit that keeps it short, as the field writes it: "21.1 M", "6.7 B",
    "360.2 K"; a small profile's 21 M read as "0.021 B" when every count was given in billions."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div * 0.99995:  # 999,960 reads "1.0 M", not "1000.0 K"
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f}"


def human_money(amount: float) -> str:
    """An amount in the currency of the price given, to the cent, and to 3 significant digits under one: a small
    checkpoint's restore at 9.60/h read "0.00 per restore", as if it cost nothing."""
    if amount <= 0:
        return "0"
    if amount >= 1:
        return f"{amount:,.2f}"
    text = f"{amount:.{max(2, 2 - math.floor(math.log10(amount)))}f}"
    whole, cents = text.split(".")
    return f"{whole}.{cents[:2]}{cents[2:].rstrip('0')}"  # 0.05, not 0.0500


def human_gbps(gbps: float) -> str:
    """A rate in GB/s to 3 significant digits ("0.00495", "21.7", "1,110"): 2 decimals read a small profile's
    0.005 GB/s as 0.00, and a request rate's 1110.18 GB/s said more than it knew."""
    if gbps <= 0:
        return "0"
    return f"{gbps:,.{max(0, 2 - math.floor(math.log10(gbps)))}f}"


def human_figure(key: str, value, shares: frozenset | set = frozenset()) -> str:
    """A named figure as the text shows it, in the units its key names (documents keep the raw number): a new user
    read `checkpoint_bytes=1057075490`, `open_per_s=103005.7`, `[0.0, 2.0]` and `True` as noise. `shares` are the
    keys whose value is a fraction (shown as a percent)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "unknown"
    if isinstance(value, (list, tuple)):
        return ", ".join(human_figure(key, v, shares) for v in value)
    if isinstance(value, dict):  # a histogram, a daemon's options: the dashboard showed {'<64KiB': 23, ...}
        return ", ".join(f"{k}: {human_figure(str(k), v, shares)}" for k, v in value.items()) or "none"
    if not isinstance(value, (int, float)):
        return str(value)
    if key in shares:
        return human_pct(value)
    if key.endswith("bytes"):
        return human_bytes(value)
    if key.endswith("_pct") or "_pct_" in key:
        return f"{value:.{1 if abs(value) < 9.95 else 0}f} %"
    if key.endswith("_gbps") or key.startswith("gbps_"):  # check's gbps_at_current=2.118 stood beside
        # measured_gbps=0.74 GB/s in one evidence line, a rate without its unit
        return f"{value:.2f} GB/s"
    if key.endswith("_per_s"):
        return f"{value:,.0f}/s"
    if key.endswith("_ms"):
        return f"{value:.1f} ms"
    if key.endswith("_s"):
        if 0 < abs(value) < 0.01:  # a stage of 0.4 ms read as 0.000 s, beside a change of +12 %
            return f"{value * 1e3:.2f} ms"
        return f"{value:.3f} s" if value < 100 else f"{value:,.0f} s"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)
