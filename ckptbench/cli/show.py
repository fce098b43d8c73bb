"""What every command prints about the checkpoint it chose: which one, why, and what it left or did not load."""

from __future__ import annotations

import json
import re
import sys

from ckptbench.core.errors import printable, redact
from ckptbench.core.units import human_pct
from ckptbench.system import binding

_URLISH = re.compile(r"\S*(?:://|@)\S*")  # a word that can be a URL, or user:password@host


def clean(text) -> str:
    """A line carrying text from elsewhere (a checkpoint's file names and headers, a remote's error, a results file)
    as a terminal may show it: escapes and control characters gone, and each word that can carry a URL's credentials
    redacted. Only those words: redact over the whole line took `tokenizer.json: crc32c …` for a credential named
    tokenizer and hid the digest."""
    return _URLISH.sub(lambda m: redact(m.group(0)), printable(text))


def say(text: str = "", file=None) -> None:
    """One line out, clean: what every command prints that a checkpoint, a remote or a results file put words in."""
    print(clean(text), file=file or sys.stdout)


def print_pick(lay: dict | None, stream=None, verb: str = "restored") -> None:
    """Which checkpoint was restored and why, what was left unread and what was read but never deserialized."""
    if not lay:
        return
    stream = stream or sys.stdout
    if lay.get("why"):  # the root and the tag are the checkpoint's names (a `latest` file's text)
        from ckptbench.checkpoint.layouts import picked_name, picked_why

        root, tag = lay.get("root"), lay.get("tag")
        say(f"{verb} {picked_name(root, tag)} ({lay['name']}): {picked_why(root, tag, lay['why'])}", stream)
    print_left(lay, stream)


def print_left(lay: dict, stream=None) -> None:
    """What the chosen checkpoint left unread (another step, a symlink, a FIFO) and read but never deserialized;
    the names as the checkpoint has them, made printable (they are input from elsewhere)."""
    stream = stream or sys.stdout
    skipped = lay.get("not_read", [])
    for skip in skipped[:8]:
        say(f"  not read: {skip['path']} ({skip['why']})", stream)
    if len(skipped) > 8:
        print(f"  not read: ... and {len(skipped) - 8} more (--json lists them)", file=stream)
    for u in lay.get("unloaded", []):
        say(f"  read, not loaded: {u['path']} ({u['why']})", stream)
    for note in lay.get("notes", []):
        say(f"  note: {note}", stream)


def digests_line(doc: dict, where: str = "") -> str:
    """What a restore's digests came to: verified, FAILED (a file differed from the manifest, was missing or could not
    be read: a reference there was, and the restore did not match it) or NOT VERIFIED (nothing to compare with). A
    mismatch had been said 'no reference to compare with', beside an RTO, with the word failed nowhere."""
    if doc["verified"]:
        return "digests: verified against the manifest"
    failed = [r for r in doc.get("repeats", []) if r.get("status") == "failed"]
    if failed or doc.get("status") == "failed":
        errors = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in (doc.get("errors") or {}).items())
        many = f"{len(failed)} of {len(doc['repeats'])} repeat(s)" if failed else "the restore"
        return (f"FAILED: {many} did not restore the checkpoint whole{where}" + (f" ({errors})" if errors else "")
                + "; the problems below name the files, and a failed repeat's time is not a restore's")
    return f"digests: NOT VERIFIED (no reference to compare with{where}; see the verify note)"


def emit(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_recorded(path: str | None, run_id: str, what: str = "run", comparable: bool = True) -> None:
    """Where a run went on record, and how to find it again: a results file nobody was told of was found later in
    the working directory, and a run id never printed could not be named to `compare --baseline`. A run compare
    passes over (a watch that saw no checkpoint read) is said to be one."""
    if not path:
        return
    from ckptbench.core.errors import printable
    from ckptbench.records.compare import default_baseline

    shown = printable(path)
    if not comparable:
        then = "it measured no restore (no checkpoint read seen), so `ckptbench compare` passes over it"
    elif (base := default_baseline(path, run_id)) is not None:
        then = f"`ckptbench compare {shown}` holds it against {printable(base)}, the last one like it"
    else:  # compare would only refuse: the first run in a file, or the first with this cache or source
        then = (f"no earlier {what} like it is on record for `ckptbench compare {shown}` to hold it against: run it "
                f"again the same way, or name a baseline with --baseline RUN (`ckptbench history {shown}` lists them)")
    print(f"recorded: {what} {run_id} in {shown} (its document in {shown}.jsonl); " + then)


def floor_lines(doc: dict) -> list[str]:
    """floor_line, then its note's clauses, a line each, indented under it."""
    if doc.get("floor_s") is None:
        return [floor_line(doc)]
    return [floor_line(doc)] + [f"           {c}" for c in clauses(doc.get("floor_note") or "")]


def floor_line(doc: dict) -> str:
    """The line that holds a measured time (a restore's RTO, a read's wall time, a save's until durable) against
    what the box can do (floor_lines adds what it stands on)."""
    if doc.get("floor_s") is None:
        return f"  floor: {doc.get('floor_note') or 'unknown'}"
    return f"  floor    {doc['floor_s']:9.3f} s, bound by {binding.bound(doc)}{efficiency_text(doc)}"


def efficiency_text(doc: dict) -> str:
    """" · 82 % of it" after a floor's figure (and the box as the run met it, where that is apart); "" with none."""
    eff = f" · {human_pct(doc['efficiency'])} of it" if doc.get("efficiency") is not None else ""
    from ckptbench.system.floor import met_off

    met = doc.get("floor_as_met")
    if eff and met_off(met) and met["efficiency"] is not None:
        eff += f" ({human_pct(met['efficiency'])} of the box as this run met it)"  # the note says why
    return eff


def sweep_floor_lines(floor: dict) -> list[str]:
    """A sweep's floor as `sweep` and the sweep screen say it: its rate (said once where it is the binding resource's,
    as nothing adds to it) and what binds it, then its note's clauses; the note alone where no floor was measured."""
    rate, own = floor.get("floor_gbps"), floor.get("binding_gbps")
    if not rate:
        return [f"floor: {floor.get('floor_note') or 'unknown'}"]
    head = "" if own and abs(own - rate) <= 0.005 * rate else f"{rate:.2f} GB/s, "
    first = f"floor: {head}bound by {binding.text(floor)}"
    # a clause the first line says already is not said again ("into reused buffers" was, on the next line)
    notes = [c for c in clauses(floor.get("floor_note") or "") if c.split(" (")[0] not in first]
    return [first] + [f"       {c}" for c in notes]


def clauses(note: str) -> list[str]:
    """A note's clauses, split at its top-level "; " (never inside parentheses): one printed line each. The note as
    one parenthesis ran to 900 characters after the floor's figure, where a new user stopped reading."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(note):
        depth += (ch == "(") - (ch == ")") if ch in "()" else 0
        if depth <= 0 and note.startswith("; ", i):
            out.append(note[start:i])
            start = i + 2
    out.append(note[start:])
    return [c.strip() for c in out if c.strip()]


def print_floor(doc: dict) -> None:
    for line in floor_lines(doc):  # its note names the source
        say(line)
