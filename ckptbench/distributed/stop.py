"""A distributed restore stopped by Ctrl-C or SIGTERM: what an interrupted rank posts so that no other rank waits on
it, and rank 0's document of the repeats that finished (kept, as a single-process run keeps its finished repeats).

torchrun hands its Ctrl-C to every rank. A rank blocked in a wait on the store hears the signal only when the wait
returns (the wait is one call into the store's client), so an interrupted rank first posts what the others may be
waiting on for the repeat under way and the next: its arrival at the start barrier, a failed report and, on rank 0,
a verdict that stops the run. Every wait then ends at once instead of at its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass


STOPPED = "interrupted (Ctrl-C or SIGTERM)"  # an interrupted rank's error, as rank 0 names it among the problems


@dataclass
class Under:
    """The repeat under way on this rank (its key) and the one after it: an interrupted rank posts for both, since
    the others may be at either."""

    key: tuple | None = None
    then: tuple | None = None


def _post_absent(world, value, *parts) -> None:
    if not world.store.check([world.key(*parts)]):  # a post already made (a report, a verdict) stays as it was
        world.post(value, *parts)


def unblock(world, at: Under, why: str = STOPPED) -> None:
    """Posts what the other ranks may wait on from this one; best effort (the store may be gone with its host)."""
    from ckptbench.distributed.rank import RankReport, report_doc

    failed = report_doc(RankReport(world.rank, world.host, world.local_rank, status="failed", error=why))
    try:
        for key in (k for k in (at.key, at.then) if k is not None):
            if world.rank == 0:
                _post_absent(world, {"ok": False, "why": why, "stopped": True}, *key, "verdict")
            _post_absent(world, {"ok": False, "error": why}, *key, "ready", world.rank)
            _post_absent(world, failed, *key, "report", world.rank)
    except (RuntimeError, OSError):  # the store is unreachable: nobody can be waiting on it
        pass


def document(run_id: str, source, opts, options: dict, policy: str, world, reps: list[dict], at: Under,
             repeats: int, env: dict) -> dict:
    """Rank 0's run document of the repeats that finished, status `cancelled`, saying where the run stopped; held
    against the floor as a finished run is."""
    from ckptbench.checkpoint.shares import saved_world
    from ckptbench.distributed.summary import summarize
    from ckptbench.restore import efficiency

    listing = source.list()
    doc = summarize(run_id, listing, world, options, policy, saved_world(listing), reps, env)
    under = at.key[1] if at.key is not None and at.key[1] > len(reps) else None  # None: stopped after the last
    doc.update(status="cancelled", first_collective_s=None,
               interrupted={"repeat": under, "repeats": repeats, "finished": len(reps)})
    if reps:
        doc |= efficiency.of_ranks(source, listing, opts, doc)
    return doc


__all__ = ["STOPPED", "Under", "document", "unblock"]
