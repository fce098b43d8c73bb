"""Every rank's progress while a distributed restore runs, seen from rank 0.

Each rank posts its stage and bytes under its own key (on every stage change, and at most every POST_S during
the read); rank 0 reads all the keys in one request every SHOW_S and hands a summary to whoever shows it. The
cost is one small write per rank per POST_S and one batched read on rank 0, whatever the number of ranks.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

POST_S = 0.5
SHOW_S = 0.5


class Poster:
    """This rank's side: stage changes and read progress, throttled."""

    def __init__(self, world, key: tuple):
        self.world, self.key = world, key
        self.stage, self.bytes, self.needed, self.last = "ready", 0, 0, 0.0

    def _post(self) -> None:
        self.last = time.monotonic()
        self.world.post({"s": self.stage, "b": self.bytes, "n": self.needed}, *self.key, "live", self.world.rank)

    def on_stage(self, name: str) -> None:
        self.stage = name
        self._post()

    def on_bytes(self, done: int, needed: int) -> None:
        self.bytes, self.needed = done, needed
        if time.monotonic() - self.last >= POST_S:
            self._post()


@dataclass
class Summary:
    """What all ranks are doing now: how many in each stage, bytes so far against bytes to read, the rank
    furthest behind (least of its share read) and its fraction."""

    stages: dict[str, int]
    bytes: int
    needed: int
    behind: int | None
    behind_fraction: float | None
    seconds: float


def read_post(raw) -> dict | None:
    """A rank's post as Poster writes it ({"s": stage, "b": bytes read, "n": bytes to read}), else None (left out of
    the view): anything on the network can write to torch's store, and a post of other fields or no JSON was a
    TypeError or ValueError traceback out of rank 0's live view, which then showed nothing more."""
    try:
        p = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(p, dict) or not isinstance(p.get("s"), str) or not all(
            type(p.get(k)) is int and 0 <= p[k] < 1 << 63 for k in ("b", "n")):  # unbounded, 10**400 / 1 overflowed
        return None
    return p


def summarize(posts: dict[int, dict], seconds: float) -> Summary:
    stages: dict[str, int] = {}
    for p in posts.values():
        stages[p["s"]] = stages.get(p["s"], 0) + 1
    reading = {r: p["b"] / p["n"] for r, p in posts.items() if p["s"] in ("ready", "list", "read") and p["n"]}
    behind = min(reading, key=reading.get) if reading else None
    return Summary(stages, sum(p["b"] for p in posts.values()), sum(p["n"] for p in posts.values()), behind,
                   reading.get(behind) if behind is not None else None, seconds)


class Watcher:
    """Rank 0's side: a thread reading every rank's post for one repeat until stopped."""

    def __init__(self, world, key: tuple, show):
        self.world, self.key, self.show = world, key, show
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="ckptbench-live", daemon=True)
        self.t0 = time.monotonic()

    def __enter__(self) -> "Watcher":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop_event.set()
        self.thread.join()
        return False

    def _loop(self) -> None:
        keys = [self.world.key(*self.key, "live", r) for r in range(self.world.size)]
        while not self.stop_event.wait(SHOW_S):
            if not self.world.store.check(keys):  # some rank has not posted yet: nothing whole to show
                continue
            raw = enumerate(self.world.store.multi_get(keys))
            posts = {r: p for r, v in raw if (p := read_post(v)) is not None}
            self.show(summarize(posts, time.monotonic() - self.t0))
