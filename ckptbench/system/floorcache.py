"""The floor's cache: this box's figures (and each mount's storage figure, each save target's write figure) kept in
the user's cache directory, keyed by the box (kernel, CPU model and count, memory, GPUs); read back only as far as
it is well formed, in range, this box's and younger than a day. The file is written by us, but anyone who can write
the user's cache can write it: every entry is checked as hostile (valid_ceiling). floor.py measures and models.
"""

from __future__ import annotations

import json
import os
import platform

import fastio

from ckptbench.core.errors import printable, redact
from ckptbench.system.ceilings import DEVICE_FIGURES, Ceiling, gpu_models, large_size

MAX_AGE_S = 86400.0
# the box figures a floor needs, all of them: a cache missing any is measured again (measure) or not used (cached)
BOX_FIGURES = ("populate_4k", "populate_thp", "copy", "scan", *(f"hash_{a}" for a in fastio.HASHES if a != "none"))
SCHEMA = 4  # 2: population measured on fresh samples; storage into fresh memory; 3: hashes on a block in the caches;
# 4: the finite scan on a block in the caches too
OVER_FLOOR = 1.05  # an efficiency above this is beyond the spread of a good ceiling: the ceiling is what is wrong


def box_key() -> dict:
    """What the box figures belong to: another kernel, CPU or memory size is another box."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    import psutil

    return {"kernel": platform.release(), "cpu": model, "cores": os.cpu_count(),
            "memory": psutil.virtual_memory().total, "gpus": gpu_models()}


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG rule: a relative path is ignored (it would write wherever we stand)
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckptbench", "floor.json")


CACHE_MAX = 1 << 20  # a cache of one box and a few dozen mounts is a few kB: anything larger is not ours
MOUNTS_MAX = 64  # storage figures kept, the freshest first
BUSY_MAX = 300  # the line saying what held the cores while the floor was measured


def shown_text(text: str, limit: int) -> str:
    """A string from the cache as `floor`, `sysinfo` and their JSON show it: redacted whole (a cut can hide the "@"
    of a URL's user:password), printable, then cut: a planted one carried a key to the screen and the records."""
    return printable(redact(text))[:limit]


def _load_cache(path: str) -> dict:
    """The cache as far as it has the expected shape: a section of another type is dropped (then measured again),
    never trusted. The file is written by us, but anyone who can write the user's cache can write it."""
    import stat

    try:  # never blocks (a FIFO planted at the name) and never reads more than a cache can be (/dev/zero)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > CACHE_MAX:
            return {}
        doc = json.loads(os.read(fd, CACHE_MAX + 1))
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("box"), dict):
        return {}
    busy = doc.get("busy")
    busy = shown_text(busy, BUSY_MAX) if isinstance(busy, str) else ""
    return {"schema": SCHEMA, "box": doc["box"]} | {k: doc[k] for k in ("ceilings", "storage", "write")
                                                    if isinstance(doc.get(k), dict)} | ({"busy": busy} if busy else {})


METHOD_MAX = 600  # a method line's characters: a longer one was not written by us
MIN_GBPS, MAX_GBPS = 1e-4, 1e4  # 100 kB/s .. 10 TB/s: a cached rate outside any box's range is damaged, not measured


def valid_ceiling(entry, now: float) -> Ceiling | None:
    """A cached (or printed: `floor --json`) ceiling, when it is well formed, in range and younger than a day; else
    None (measured again)."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    try:
        raw = [entry[k] for k in ("gbps", "min_gbps", "max_gbps", "measured_at")] + [entry.get("sample_bytes", 0)]
        if not all(map(number, raw)):
            return None
        rates, at, sample = [float(v) for v in raw[:3]], float(raw[3]), int(raw[4])
        method = entry["method"]
        into_fresh, hot, cold = entry.get("fresh_gbps", 0.0), entry.get("hot_gbps", 0.0), entry.get("cold", True)
        hot_reused = entry.get("hot_reused_gbps", 0.0)
        if not all(number(v) and (not v or MIN_GBPS <= v <= MAX_GBPS) for v in (into_fresh, hot, hot_reused)) or \
                cold is not True:
            return None  # a figure that was not read cold is never kept: one that says so was written by hand
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if not isinstance(method, str) or not all(MIN_GBPS <= r <= MAX_GBPS for r in rates) or not \
            rates[1] <= rates[0] <= rates[2] or not 0 <= sample <= 1 << 50 or not 0 <= now - at <= MAX_AGE_S:
        return None  # NaN and infinities fail the range checks too
    if float(into_fresh) > rates[2] * OVER_FLOOR:  # into fresh memory is never faster than into reused buffers
        return None
    if hot_reused and (not hot or hot > hot_reused * OVER_FLOOR):  # measured together, and a copy that stays in
        return None  # the CPU's caches is never slower than one into memory: not written by us
    of_files = entry.get("of_files", "")
    if not (isinstance(of_files, str) and len(of_files) <= 16 and all(c in "0123456789abcdef" for c in of_files)):
        of_files = ""  # not one of ours: then not known whose files it read
    return Ceiling(*rates, shown_text(method, METHOD_MAX), at, sample, fresh_gbps=float(into_fresh),
                   hot_gbps=float(hot), hot_reused_gbps=float(hot_reused), of_files=of_files)


def known_figure(key: str) -> bool:
    """A ceiling the floor knows: the box's, a size class of fresh memory, a GPU's link. Anything else in a cache
    was not written by us and is not carried."""
    return key in BOX_FIGURES or key in DEVICE_FIGURES or bool(large_size(key))


def write_cache(path: str, doc: dict) -> str | None:
    """The cache file replaced whole (a reader sees the old one or the new one, never half of one); why it could
    not be written, or None (then the figures are measured again next time). The temporary file is created under a
    name nobody could have planted a link at (core/paths.new_file_beside), and only a file created here is ever
    removed."""
    from ckptbench.core.paths import replace_whole

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    return replace_whole(path, json.dumps(doc))
