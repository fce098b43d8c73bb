"""What every command prints about the checkpoint it chose: which one, why, and what it left or did not load."""

from __future__ import annotations

import json
import sys

from ckptbench.core.errors import printable
from ckptbench.core.units import human_pct
from ckptbench.system import binding


def print_pick(lay: dict | None, stream=None, verb: str = "restored") -> None:
    """Which checkpoint was restored and why, what was left unread and what was read but never deserialized."""
    if not lay:
        return
    stream = stream or sys.stdout
    if lay.get("why"):
        what = lay.get("root") or lay.get("tag") or "the files at the top"
        print(f"{verb} {what} ({lay['name']}): {lay['why']}", file=stream)
    print_left(lay, stream)


def print_left(lay: dict, stream=None) -> None:
    """What the chosen checkpoint left unread (another step, a symlink, a FIFO) and read but never deserialized;
    the names as the checkpoint has them, made printable (they are input from elsewhere)."""
    stream = stream or sys.stdout
    skipped = lay.get("not_read", [])
    for skip in skipped[:8]:
        print(f"  not read: {printable(skip['path'])} ({printable(skip['why'])})", file=stream)
    if len(skipped) > 8:
        print(f"  not read: ... and {len(skipped) - 8} more (--json lists them)", file=stream)
    for u in lay.get("unloaded", []):
        print(f"  read, not loaded: {printable(u['path'])} ({printable(u['why'])})", file=stream)


def emit(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_recorded(path: str | None, run_id: str, what: str = "run") -> None:
    """Where a run went on record, and how to find it again: a results file nobody was told of was found later in
    the working directory, and a run id never printed could not be named to `compare --baseline`."""
    if not path:
        return
    from ckptbench.core.errors import printable

    shown = printable(path)
    print(f"recorded: {what} {run_id} in {shown} (its document in {shown}.jsonl); `ckptbench compare {shown}` holds "
          "the newest against the last one like it")


def floor_line(doc: dict) -> str:
    """The line that holds a measured time (a restore's RTO, a read's wall time, a save's until durable) against
    what the box can do."""
    if doc.get("floor_s") is None:
        return f"  floor: {doc.get('floor_note') or 'unknown'}"
    eff = f" · {human_pct(doc['efficiency'])} of it" if doc.get("efficiency") is not None else ""
    return f"  floor    {doc['floor_s']:9.3f} s, bound by {binding.bound(doc)}{eff} ({doc['floor_note']})"


def print_floor(doc: dict) -> None:
    print(floor_line(doc))
