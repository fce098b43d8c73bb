"""One figure of two runs compared: its change, whether it is beyond the run-to-run noise and the threshold, and
how a figure, a change and a setting read to a person."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ckptbench.core.errors import redact, shown
from ckptbench.core.stats import spread
from ckptbench.core.units import human_figure, human_pct, pct_shown
from ckptbench.records.schema import in_range, plain

SHARES = {"efficiency"}  # a fraction in the documents, a percent wherever a person reads it


@dataclass(frozen=True)
class FigureDelta:
    figure: str
    baseline: dict
    newest: dict
    change_pct: float | None
    regression: bool
    beyond_noise: bool  # the two runs' repeats do not overlap, whichever way the change went
    improved: bool = False
    noise_known: bool = True  # each side had two or more repeats: one repeat has no range to be within

    too_small: bool = False  # a change under what can matter (a timer's grain, a sliver of the RTO)

    @property
    def verdict(self) -> str:
        """How the text tells it: REGRESSION, improved, too small to matter, beyond noise but under --threshold,
        within noise, or that one repeat a side gives no noise to judge (where one side had repeats, their spread did
        judge: said so)."""
        if self.regression:
            return "REGRESSION"
        if self.improved:
            return "improved"
        if self.too_small:
            return "too small to matter"
        if self.baseline.get("n") == self.newest.get("n") == 1:
            return "one repeat each: noise unknown"
        if self.beyond_noise:  # a real change, but under --threshold: a blank read as "no change" (or unjudged)
            return "beyond noise, under --threshold" if self.change_pct else ""
        return "within noise" if self.noise_known else "within the other run's spread"

    @property
    def noise_note(self) -> str:
        """Beside a REGRESSION or an improvement that a side of one repeat let the threshold decide: that side has
        no range, so no noise estimate (a one-repeat run was a REGRESSION with nothing to say so). Else ""."""
        if not (self.regression or self.improved) or self.noise_known:
            return ""
        one_base, one_new = self.baseline.get("n") == 1, self.newest.get("n") == 1
        if one_base and one_new:
            return "one repeat each: noise unknown"
        return f"one repeat in the {'newest' if one_new else 'baseline'}: its noise unknown"


def figure_text(figure: str, value: float) -> str:
    """A compared figure's median in the units its name says (bytes, seconds, GB/s, a share): 4 significant digits
    printed a 4.2 GB peak RSS as 4.2e+09."""
    return human_figure(figure, value, SHARES)


def change_text(change_pct: float | None, figure: str = "", baseline: float | None = None,
                newest: float | None = None) -> str:
    """A figure's change as a percent of the baseline's; a share's (the efficiency) in percentage points: 110 % to
    93 % read "-16 %", which a reader takes for the points it is not. The points are those between the two percents
    as shown: 67 % to 50 % (0.666 to 0.502) read "-16 pts" beside them, taken from the unrounded shares."""
    if figure in SHARES and baseline is not None and newest is not None:
        return human_pct((pct_shown(newest) - pct_shown(baseline)) / 100, signed=True).replace(" %", " pts")
    return "" if change_pct is None else human_pct(change_pct / 100, signed=True)


def shown_value(key: str, value):
    """A recorded value as it may be shown: results fields are text anyone could have written (a terminal escape in a
    source path or a kernel string would retitle or wipe the terminal, a `password=` in an env value was printed
    whole); a number one a run can have had (NaN in a recorded env was NaN in --json, not JSON)."""
    value = plain(value)  # non-finite numbers None, text valid UTF-8
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not in_range(key, value):
        value = f"{value:g}"  # a cpu_count of 1e300 is no count: said as recorded, not in 300 digits
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return shown(redact(value if isinstance(value, str) else json.dumps(value, sort_keys=True)), 200)


# settings recorded as numbers: the CSV reads them back as floats, and `concurrency: 8.0 → 2.0` read as a fraction
WHOLE_SETTINGS = ("concurrency", "block_size", "ranks")


def setting_value(key: str, value):
    """A recorded setting as the run was given it: a whole number whole."""
    if key in WHOLE_SETTINGS and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def setting_text(key: str, before, after) -> str:
    """One line of what differs between two compared runs, each value in its unit: a hash left to the default was
    an empty field, and the box's floor a bare 0.7797 among the settings."""
    def text(value) -> str:
        if key == "hash" and value in ("", None):
            return "the manifest's (no --hash)"
        if value in ("", None):
            return "none"
        if key == "block_size" and isinstance(value, (int, float)):
            return human_figure("block_bytes", value)
        return human_figure(key, value)

    if key == "floor_s":
        return (f"this box's floor for the restore: {text(before)} → {text(after)} (the box itself did more or "
                "less, or other bytes were held to it; the efficiency says how much of the change is the restore's)")
    if key == "bytes":
        return f"bytes: {text(before)} → {text(after)} (the floor is sized on them)"
    if key == "fsync":
        return f"fsync: {text(before)} → {text(after)} (without it, a save's 'durable' time ends at the rename)"
    return f"{key}: {text(before)} → {text(after)}"


MIN_SECONDS = 0.001  # a change in seconds under this is the timer's grain and the scheduler's, not the restore's
MIN_RTO_SHARE = 0.01  # a stage's change under this share of the RTO changes no restore anyone waits for


def delta(fig: str, base: list, new: list, higher_better: bool, threshold_pct: float,
           min_abs: float = 0.0, medians: tuple | None = None) -> FigureDelta | None:
    """`min_abs`: the least change of the median that can count (a verify stage of 0.004 s read +12 % REGRESSION
    and failed the run's CI on a tenth of a millisecond). `medians`: each side's figure where it is not the median
    of its repeats' values (their min and max still judge the noise)."""
    b, n = spread(base), spread(new)
    if b["median"] is None or n["median"] is None:
        return None
    if medians is not None:
        b, n = b | {"median": medians[0]}, n | {"median": medians[1]}
    change = (n["median"] - b["median"]) / b["median"] * 100 if b["median"] else None
    if change is not None and not math.isfinite(change):  # over a baseline of 5e-324 s: +inf %, Infinity in --json
        change = None
    small = abs(n["median"] - b["median"]) < min_abs
    worse = change is not None and not small and (change < -threshold_pct if higher_better else change > threshold_pct)
    better = change is not None and not small and (change > threshold_pct if higher_better
                                                   else change < -threshold_pct)
    # beyond noise: every repeat of one run is past every repeat of the other (an improvement read "within noise"
    # when only the worse direction was tested); with one repeat a side the threshold alone decides
    beyond = n["max"] < b["min"] or n["min"] > b["max"]
    known = b.get("n", 2) > 1 and n.get("n", 2) > 1
    return FigureDelta(fig, b, n, change, bool(worse and beyond), beyond, bool(better and beyond), known,
                       bool(small and change))
