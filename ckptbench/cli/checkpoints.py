"""Handlers of the commands about one checkpoint: inspect (headers only), verify (against its manifest), load (untimed
restore and check) — each on the checkpoint a resume loads, as `run` picks it."""

from __future__ import annotations

import json
import sys

from ckptbench.cli.show import emit as _emit, print_left, say


def cmd_inspect(args) -> int:
    from ckptbench.checkpoint.formats.inert import describe
    from ckptbench.checkpoint.layouts import picked_name, picked_why
    from ckptbench.restore.inspect import inspect
    from ckptbench.sources import open_source
    from ckptbench.core.errors import printable
    from ckptbench.core.units import human_bytes

    doc = inspect(open_source(args.source, args.pick), concurrency=args.concurrency, tensors=args.tensors)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    lay, plan = doc["layout"], doc["read_plan"]
    ranks = f"{lay['ranks']} rank(s), " if lay["ranks"] else ""
    step = "" if lay["name"] == "megatron" else "step "  # Megatron's tag names itself: iter_0000010
    layout = (f" ({lay['name']}{', ' + step + lay['tag'] if lay['tag'] else ''})"
              if lay["name"] not in ("files", doc["format"]) else "")
    if lay["why"]:  # the root is the checkpoint's folder name
        say(f"picked {picked_name(lay['root'], lay['tag'])}: {picked_why(lay['root'], lay['tag'], lay['why'])}")
    # every file the read plan counts: shards and the others (an index.json was in the plan's count and in no other)
    # the others' bytes said as theirs, the whole beside them: "(39.8 MiB)" read as the checkpoint's size (59.7 MiB)
    say(f"{doc['source']}: {doc['format']}{layout}, {ranks}{lay['shards']} shard file(s) and {lay['other_files']} "
        f"other file(s) ({human_bytes(lay['other_bytes'])} of them), {human_bytes(plan['bytes'])} in all, "
        f"{'a' if lay['manifest'] else 'no'} manifest")
    print(f"  {'group':10s} {'tensors':>8s} {'params':>14s} {'bytes':>11s}  dtypes")
    for name, g in doc["groups"].items():
        dts = ", ".join(f"{d} {human_bytes(b)}" for d, b in g["dtypes"].items())
        say(f"  {name:10s} {g['tensors']:8d} {g['params']:14,d} {human_bytes(g['bytes']):>11s}  {dts}")
    if lay["other_entries"]:
        print(f"  and {lay['other_entries']} non-tensor entries (scalars, configs, byte entries)")
    print_left(lay)  # with the notes
    if lay["kept_as_data"]:
        say(f"  {describe(lay['kept_as_data'])}")
    if args.tensors is not None:
        rows = doc["tensors"]
        like = doc.get("tensor_names_like")
        hint = f" (its names look like {', '.join(printable(n) for n in like)}: glob one of those)" if like else ""
        say(f"tensors{'' if args.tensors == '*' else ' matching ' + repr(args.tensors)}: {len(rows)}{hint}")
        names = [printable(t["name"]) for t in rows]  # a header's names are input from elsewhere: no escapes run
        width = min(60, max(map(len, names), default=4))
        for t, name in zip(rows, names):
            shape = "×".join(map(str, t["shape"])) or "scalar"
            say(f"  {name:{width}s} {t['dtype']:9s} {shape:>16s} {human_bytes(t['bytes']):>10s}  {t['group']:9s} "
                f"{t['file']}")
    amp = f"{plan['amplification']:.3f}×" if plan["amplification"] else "n/a"
    say(f"read plan: {plan['files']} file{'' if plan['files'] == 1 else 's'}, {human_bytes(plan['bytes'])}, largest "
        f"{plan['largest_file']['path']} ({human_bytes(plan['largest_file']['bytes'])}); read amplification {amp} "
        "(file bytes per tensor byte)")
    say(f"read path: {plan['read']} ({plan['read_why']})")
    say(f"check: {doc['check']}")
    return 0


def cmd_verify(args) -> int:
    from ckptbench.checkpoint.verify import verify
    from ckptbench.cli.settings import require_checkpoint
    from ckptbench.cli.show import print_pick
    from ckptbench.core.errors import EXIT_UNCHECKED
    from ckptbench.core.units import human_bytes
    from ckptbench.restore.load import require_dir
    from ckptbench.sources.local import LocalSource

    require_dir(args.directory)
    listing = LocalSource(args.directory, checkpoint=True, pick=args.pick).list()
    # a folder of text files (or /etc) is no checkpoint: run's line, exit 2 — it was read whole and said
    # "NOT VERIFIED", exit 3, as a checkpoint with no manifest is
    require_checkpoint(listing)
    rep = verify(listing, concurrency=args.concurrency)
    lay = listing.layout.describe() if listing.layout is not None else None
    if args.json:
        _emit({"ok": rep.ok, "verified": rep.verified, "has_reference": rep.has_reference, "source": rep.source,
               "why": rep.why, "layout": lay, "files": rep.files, "bytes": rep.bytes,
               "problems": [{"path": p, "problem": w} for p, w in rep.problems], "digests": rep.digests,
               "unlisted": list(rep.unlisted)})
    else:
        print_pick(lay, verb="checking")
        if not rep.has_reference:  # the source, the files' names and the problems are the checkpoint's words
            say(f"{rep.source}: no manifest with digests, so no reference: {rep.files} files read and their "
                "digests computed, nothing checked against them")
        if rep.unlisted:
            say(f"{rep.source}: {len(rep.unlisted)} file(s) not in the manifest, so not verified (first "
                f"{rep.unlisted[0]})")
        for rel, what in rep.problems:
            say(f"  {rel}: {what}", sys.stderr)
        word = "MISMATCH" if not rep.ok else "OK" if rep.verified else "NOT VERIFIED"
        print(f"{word}: {rep.files} files, {human_bytes(rep.bytes)}, {len(rep.problems)} problem(s)")
    return 1 if not rep.ok else 0 if rep.verified else EXIT_UNCHECKED


def _what_ran(c, asked: bool) -> str:
    """The model check in words: the forward step's output, and the optimizer step asked for (or why none ran)."""
    fwd = {True: "finite", False: "NOT finite", None: "not run"}[c.finite_output]
    words = f"one forward step: output {fwd}"
    if asked and c.optimizer_step is None:
        return words + "; no optimizer step: the checkpoint holds no optimizer state to step"
    if c.optimizer_step is not None:
        words += ("; one optimizer step: the master weights moved, all finite" if c.optimizer_step
                  else "; one optimizer step: FAILED (no master weight moved, or a value is not finite)")
    return words


def cmd_load(args) -> int:
    from ckptbench.cli.show import print_pick
    from ckptbench.core.units import human_count
    from ckptbench.restore.load import restore_dir

    out = restore_dir(args.directory, verify=not args.no_verify, optimizer_step=args.optimizer_step, pick=args.pick)
    c = out.check
    if args.json:
        _emit({"source": out.source, "format": out.format, "ok": c.ok, "param_count": c.param_count,
               "dtypes": c.dtypes, "finite_output": c.finite_output, "optimizer_step": c.optimizer_step,
               "problems": list(c.problems), "structural_only": c.structural_only, "summary": c.summary,
               "tail_files": out.tail_files,
               "layout": out.layout.describe() if out.layout is not None else None,
               "verified": None if out.verify is None else out.verify.verified})
    else:
        print_pick(out.layout.describe() if out.layout is not None else None)
        ref = "" if out.verify is None or out.verify.has_reference else " (no manifest: digests had no reference)"
        if out.verify is not None and out.verify.unlisted:
            ref = (f" ({len(out.verify.unlisted)} file(s) not in the manifest, so not verified: "
                   f"{out.verify.unlisted[0]})")
        kind = "structural check" if c.structural_only else "check"
        # the small files are those a trainer reads on resume beside the tensors ("1 small files" said neither)
        tail = f"{out.tail_files} small file{'' if out.tail_files == 1 else 's'} read beside the tensors"
        say(f"{out.format}: {human_count(c.param_count)} parameters {c.dtypes['weights']}, {tail}; "
            f"{kind} {'passed' if c.ok else 'FAILED'}{ref}")  # ref names an unlisted file
        if not c.structural_only:  # what the check ran, as --json's finite_output and optimizer_step say it: the
            # line read the same with --optimizer-step as without, and where no optimizer state was there to step
            say(f"  {_what_ran(c, args.optimizer_step)}")
        if c.summary:
            say(f"  {c.summary}")
        for p in c.problems:
            say(f"  {p}", sys.stderr)
    return 0 if c.ok else 1
