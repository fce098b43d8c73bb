"""Parsed arguments into the domain's options: each field taken by its declared name, so a setting added to
ReadOptions or RunOptions reaches every command that declares its flag without another list of names here."""

from __future__ import annotations

from dataclasses import fields


def read_options(args, **over):
    """A ReadOptions from the read flags `args` has (the others keep ReadOptions' defaults)."""
    from ckptbench.sources import ReadOptions

    given = {f.name: getattr(args, f.name) for f in fields(ReadOptions) if getattr(args, f.name, None) is not None}
    return ReadOptions(**given | over)


def run_options(args, **over):
    """A restore's RunOptions from `args` and `over`: its own settings, and the read settings in its ReadOptions
    (`hash` is the restore's own: None there means the manifest's; the ReadOptions is given one per run)."""
    from ckptbench.restore.runner import RunOptions

    own_names = {f.name for f in fields(RunOptions)} - {"reading"}
    own = {n: getattr(args, n) for n in own_names if hasattr(args, n)} | {k: v for k, v in over.items() if k in own_names}
    read = {k: v for k, v in over.items() if k not in own_names}
    return RunOptions(**own, reading=read_options(args, **read | {"hash": "crc32c"}))


def check_drop_caches(args) -> None:
    """--drop-caches empties the page cache before a cold read; with --cache hot or as-is it was ignored without a
    word, so the two together are refused as contradictory."""
    if getattr(args, "drop_caches", False) and args.cache != "cold":
        from ckptbench.core.errors import CkptbenchError

        raise CkptbenchError(f"--drop-caches with --cache {args.cache}: it empties the page cache before a cold read "
                             "only; add --cache cold, or leave --drop-caches out")


def check_s3_only(args, sources) -> None:
    """The options only an s3:// source reads (its client, its ranged GETs' size, a staging directory) given for a
    local one were ignored without a word (a new user asked `floor --s3-client crt` of a local checkpoint): refused,
    as contradictory."""
    from ckptbench.core import options
    from ckptbench.core.errors import CkptbenchError

    if any(str(s).startswith("s3://") for s in ([sources] if isinstance(sources, str) else sources)):
        return
    given = [f"{flag} {shown}" for flag, value, default, shown in (
        ("--s3-client", getattr(args, "s3_client", None), options.S3_CLIENT.default, getattr(args, "s3_client", None)),
        ("--part-size", getattr(args, "part_size", None), options.PART_SIZE.default, getattr(args, "part_size", None)),
        ("--stage-dir", getattr(args, "stage_dir", None), None, "DIR"),
    ) if value is not None and value != default]
    if given:
        raise CkptbenchError(f"{', '.join(given)}: only for an s3:// source, and this one is a local path; leave "
                             f"{'it' if len(given) == 1 else 'them'} out")


def check_cost_options(args) -> None:
    """--spot-discount and --restores-per-day turn the RTO into money with --price-per-hour; without it they were
    ignored without a word."""
    from ckptbench.core import options
    from ckptbench.core.errors import CkptbenchError

    if getattr(args, "price_per_hour", None) is not None:
        return
    given = [flag for flag, value, default in (
        ("--spot-discount", getattr(args, "spot_discount", None), options.SPOT_DISCOUNT.default),
        ("--restores-per-day", getattr(args, "restores_per_day", None), options.RESTORES_PER_DAY.default),
    ) if value is not None and value != default]
    if given:
        # "--spot-discount price the RTO with …" read as a broken sentence: say what each needs
        raise CkptbenchError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} --price-per-hour (the "
                             f"RTO's cost is priced from it): add --price-per-hour USD, or leave "
                             f"{'it' if len(given) == 1 else 'them'} out")


def require_checkpoint(listing) -> None:
    """A source that holds no checkpoint (a directory of text files) refused with the line `run` refuses it with:
    the format's own (detect.detect_names), naming the source. `floor` measured it and `tui` opened on it."""
    if listing.format != "unknown":
        return
    from ckptbench.checkpoint.detect import detect_names

    detect_names([f.path for f in listing.files], listing.source)  # raises: no name of a checkpoint format is there
