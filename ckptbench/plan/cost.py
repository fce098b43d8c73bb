"""The RTO in money: what the GPUs cost while they wait for a restore."""

from __future__ import annotations

from ckptbench.core.errors import CkptbenchError

DAYS_PER_MONTH = 30
# bounds that keep every figure finite (1e308 × 1e308 was inf, printed as null, then a crash): generous for real use
MAX_PRICE_PER_HOUR = 1e6
MAX_RESTORES_PER_DAY = 86400  # one a second


def restore_cost(rto_s: float, price_per_hour: float, spot_discount: float = 0.0, restores_per_day: float = 1.0) -> dict:
    """Per restore, per month and idle GPU hours per month, at the (spot-discounted) instance price."""
    if not 0 <= price_per_hour <= MAX_PRICE_PER_HOUR:
        raise CkptbenchError(f"--price-per-hour must be 0..{MAX_PRICE_PER_HOUR:.0f}, got {price_per_hour}")
    if not 0 <= spot_discount < 1:
        raise CkptbenchError(f"--spot-discount is a fraction 0..1 (0.7 = 70 % off), got {spot_discount}")
    if not 0 <= restores_per_day <= MAX_RESTORES_PER_DAY:
        raise CkptbenchError(f"--restores-per-day must be 0..{MAX_RESTORES_PER_DAY}, got {restores_per_day}")
    hourly = price_per_hour * (1 - spot_discount)
    per_restore = rto_s / 3600 * hourly
    idle_h = rto_s * restores_per_day * DAYS_PER_MONTH / 3600
    return {
        "price_per_hour": price_per_hour,
        "spot_discount": spot_discount,
        "effective_price_per_hour": hourly,
        "restores_per_day": restores_per_day,
        "per_restore": per_restore,
        "per_month": per_restore * restores_per_day * DAYS_PER_MONTH,
        "idle_gpu_hours_per_month": idle_h,
    }
