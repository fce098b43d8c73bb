"""Does the checkpoint load: its headers and layout read as `inspect` reads them (restore/inspect.py, the parsers a
restore uses), so the checklist never passes a checkpoint `run` refuses."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.core.errors import CkptbenchError, printable
from ckptbench.core.verdicts import Verdict

ID, TITLE = "loads", "Checkpoint loads"
WHY = ("a restore parses every header before it uses a byte of data: a truncated, damaged or foreign file fails it, "
       "however fast the storage")
FIX = ("replace the file named (copy the checkpoint again from where it was saved, or restore the one before it): a "
       "restore refuses it; `ckptbench inspect SOURCE` shows the same error")
NOT_PROBED = (f"the checkpoint does not load (the '{TITLE}' item says why): its files' pages were not probed, as "
              "no restore reads them")
NOT_LOADED = (f"the checkpoint does not load (the '{TITLE}' item says why), so there is no restore to hold against "
              "the floor and no concurrency to tune: fix that item first")


@dataclass(frozen=True)
class Headers:
    """What reading the headers found: inspect's document, or the one line a restore would stop with, or neither
    (an object store: check reads no headers from one)."""

    doc: dict | None = None
    error: str | None = None
    reason: str = "the headers were not read"  # why neither, when neither


def read(source, listing) -> Headers:
    """The headers read as inspect reads them. A source with no checkpoint at all raises inspect's (and run's) one
    line: that is bad input, not an item."""
    from ckptbench.restore.inspect import inspect

    if not source.files_on_disk and listing.format != "unknown":
        return Headers(reason="check reads headers from local files only")
    try:
        return Headers(doc=inspect(source))
    except CkptbenchError as exc:
        if listing.format == "unknown":
            raise
        return Headers(error=printable(str(exc)))
    except OSError as exc:  # a file that vanished or cannot be opened between the listing and its header
        return Headers(error=printable(f"{exc.filename or listing.source}: {exc.strerror or exc}"))


DIGEST_WHY = "a restore checks each file's digest against the manifest: a file whose bytes changed fails it"
DIGEST_FIX = ("replace the files named (copy the checkpoint again from where it was saved, or restore the one before "
              "it): a restore refuses them; `ckptbench verify SOURCE` checks every file against the manifest")


def judge(h: Headers, probe=None) -> Verdict:
    """fail with the error line when the headers do not parse, or with each file the check's short restore (`probe`,
    checklist/efficiency.RestoreProbe) read whole whose digest is not the manifest's; ok with what they hold, and how
    many digests matched; unknown where none were read."""
    if h.error is not None:
        return Verdict(ID, TITLE, "fail", {"error": h.error}, WHY, FIX)
    if probe is not None and probe.mismatches:
        return Verdict(ID, TITLE, "fail", {"digest_mismatch": list(probe.mismatches[:20]),
                                           "mismatch_count": len(probe.mismatches),
                                           "digests_matched": probe.digests_matched}, DIGEST_WHY, DIGEST_FIX)
    if h.doc is None:
        return Verdict(ID, TITLE, "unknown", {"reason": h.reason}, WHY,
                       "`ckptbench run SOURCE` parses every header as it restores")
    d = h.doc
    ev = {"format": d["format"], "layout": d["layout"]["name"], "shards": d["layout"]["shards"],
          "tensors": sum(g["tensors"] for g in d["groups"].values()), "params": d["params"],
          "payload_bytes": d["read_plan"]["payload_bytes"]}
    if probe is not None and probe.digests_matched:  # the short restore's files read whole, against the manifest
        ev["digests_matched"] = probe.digests_matched
    return Verdict(ID, TITLE, "ok", ev, WHY, "none")
