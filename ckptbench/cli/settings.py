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
