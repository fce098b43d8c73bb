"""The one door between the UI (tui/) and the domain: the UI is started here, imported lazily (headless commands never
load Textual), and asks here for the figures it shows that the domain works out."""

from __future__ import annotations


def run_app(name: str, *args, **kwargs) -> int:
    """The one door from the domain to the UI: handlers ask for the dashboard ("dashboard") or the watch app
    ("watch") here, so that only this composition root imports `tui`, lazily (headless commands never load
    Textual)."""
    from ckptbench.core.errors import CkptbenchError

    if not has_terminal():  # piped, it wrote escapes into the pipe and never ended
        raise CkptbenchError("the terminal UI needs a terminal, and this one's input or output is not one: run it "
                             "in a terminal, or headless with --json (`ckptbench run SOURCE --json`)")
    if name == "watch":
        from tui.watch_app import WatchApp as App
    else:
        from tui.app import CkptbenchApp as App
    App(*args, **kwargs).run()
    return 0


def has_terminal() -> bool:
    import sys

    return sys.stdin.isatty() and sys.stdout.isatty()


def restore_floor(source: str | None, opts, info: dict | None = None, doc: dict | None = None,
                  pick: str | None = None) -> dict | None:
    """A restore of `source` with `opts` held against this box's floor (restore/efficiency.py: from the figures
    `ckptbench floor` cached, never measured here, as that would evict the checkpoint), plus `bytes_read`. Before a
    run, the cache condition is `opts.cache` (as-is: the residency in `info`, the source's summary); with `doc`, a
    finished run's document, which carries its own. Before a run, also `loop`: the floor of a loop pass (a read into
    reused buffers, no landing), and `fresh_per_core`: the floor's fresh-memory rate a core, which the rate a read
    meets is set beside while it runs. Lists the source: call it from a worker. None when there is no source or it
    cannot be listed (the run says why)."""
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.restore import efficiency as eff
    from ckptbench.sources import open_source
    from ckptbench.system import floor as fl

    if doc is not None and "floor_s" in doc:
        out = {k: doc.get(k) for k in fl.FIELDS} | {"bytes_read": doc.get("bytes")}
        if doc.get("check") == "model step" and out["floor_s"] and out["efficiency"]:
            # the time the efficiency is over (efficiency.of_repeats: the RTO less the model's compute), so that the
            # screen names it: "floor / RTO" beside the RTO shown did not divide
            out["held_s"] = out["floor_s"] / out["efficiency"]
        return out
    if source is None:
        return None
    try:
        src = open_source(source, pick)
        listing = src.list()
    except (CkptbenchError, OSError):
        return None
    residency = (info or {}).get("residency")
    return eff.of_restore(src, listing, opts, residency=residency) | {
        "bytes_read": listing.bytes, "loop": eff.of_loop(src, listing, opts, residency=residency),
        "fresh_per_core": eff.fresh_reference(src, listing)}


def floor_share(fields: dict | None, read_gbps: float | None) -> float | None:
    """A read's rate over the floor's rate: how near the read runs to what binds it (None when either is unknown)."""
    rate = (fields or {}).get("floor_gbps")
    return read_gbps / rate if rate and read_gbps is not None else None


def efficiency(fields: dict | None, measured_s: float | None) -> float | None:
    """The floor's time over a measured one (a loop pass's RTO): 1.0 is this box's best."""
    from ckptbench.system import floor as fl

    return fl.efficiency((fields or {}).get("floor_s"), measured_s)


def record_knee(results_path: str | None, tuner, source: str, pick: str | None = None) -> str | None:
    """An auto-tune's knee on record in `results_path`, where the checklist's concurrency advice finds it (one truth
    for advice, as `sweep --results`); the line to show when it could not be recorded, else None."""
    from ckptbench.core.errors import CkptbenchError, printable, redact
    from ckptbench.restore.sweep import record_knee as record

    if not results_path:
        return None
    from ckptbench.sources import open_source

    try:
        # under the checkpoint of the folder a restore reads, as `sweep --results` records it and check looks it up
        record(results_path, tuner.result(open_source(source, pick).list().source))
    except (CkptbenchError, OSError) as exc:
        return printable(redact(f"the knee was not recorded in {results_path}: {exc}"))
    return None


def failure(exc: BaseException, what: str) -> str:
    """One printable, redacted line for a failure a screen shows: the package's own message when it has one, else
    `what` failed, the exception's type and its first line."""
    from ckptbench.core.errors import one_line

    return one_line(exc, what)
