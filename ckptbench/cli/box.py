"""Handlers of the commands about this box: sysinfo (the dashboard's system figures) and floor (what the box can
physically do for a restore)."""

from __future__ import annotations

import sys
import time

from ckptbench.cli.show import emit as _emit, say
from ckptbench.core.errors import CkptbenchError, name_source, printable, redact
from ckptbench.core.units import human_age, human_bytes, human_figure
from ckptbench.system import binding

NOT_MEASURED = "not measured — run `ckptbench floor SOURCE`"


def cmd_sysinfo(args) -> int:
    import time

    from ckptbench.sources import open_source, source_summary
    from ckptbench.system import floor as fl
    from ckptbench.system.live import SystemSampler

    if args.pick is not None and args.source is None:
        raise CkptbenchError("--pick chooses among the checkpoints of the folder SOURCE names: give SOURCE too")
    # without SOURCE, the box's figures and the current directory's mount: the system panel needs no checkpoint
    where = open_source(args.source, args.pick).describe() if args.source is not None else {}
    sampler = SystemSampler(args.source if args.source is not None else ".")
    sampler.sample()
    time.sleep(0.5)  # rates need two samples
    sampled = sampler.sample()
    if args.source is None:
        sampled["source"] = None
        where = {"fs_type": sampled["fs_type"], "mount_point": sampled["mount_point"]}
    summary = source_summary(args.source, args.pick) if args.source is not None else {}
    doc = summary | sampled | where  # the sampler sees no mount behind an s3:// URL
    if "mount_options" in doc:
        from ckptbench.system.probes import options_once

        doc["mount_options"] = options_once(doc["mount_options"])
    mount = fl.mount_key(where)
    doc["floor"] = cached_floor(mount, doc.get("bytes") or 0, args.source)  # from the cache only: measuring would
    # evict it
    if args.json:
        _emit(doc)
        return 0
    for k, v in doc.items():  # the source's path, its mount's source and options: words from elsewhere
        if k == "source" and v is None:
            say(f"{k:24s} none: the mount below is the current directory's")
        elif k == "checkpoint" and v is None:  # the folder is the checkpoint: nothing was chosen in it
            say(f"{k:24s} the source itself")
        elif k != "floor":
            say(f"{k:24s} {shown_field(k, v)}")
    print_cached_floor(doc["floor"])
    return 0


# figures whose key reads as a setting: beside dirty_ratio, "dirty_bytes 391 MiB" read as vm.dirty_bytes set (which
# would override the ratio); they are /proc/meminfo's pages waiting now
LIVE_NOT_SETTING = {"dirty_bytes": "Dirty in /proc/meminfo now, not vm.dirty_bytes",
                    "writeback_bytes": "Writeback in /proc/meminfo now"}


def shown_field(key: str, v) -> str:
    """A sysinfo figure as the dashboard and `check` show the same one: in its key's units (human_figure)."""
    if key == "ulimit_nofile" and isinstance(v, (list, tuple)) and len(v) == 2:
        return f"soft {human_figure(key, v[0])}, hard {human_figure(key, v[1])}"
    said = human_figure(key, v, {"residency"})
    return f"{said} ({LIVE_NOT_SETTING[key]})" if key in LIVE_NOT_SETTING else said


def cached_floor(mount: str, nbytes: int = 0, source: str | None = None) -> dict:
    """The floor figures cached for this box and `mount`, with their age; what is not cached says how to get it.
    The hot landing rate is a restore of `nbytes`'s (fresh memory at its size class, as `run` holds it)."""
    from ckptbench.system import floor as fl

    f = fl.cached(mount)
    box = {k: {"gbps": c.gbps, "min_gbps": c.min_gbps, "max_gbps": c.max_gbps, "age_s": c.age_s, "method": c.method}
           for k, c in f.ceilings.items()} if f is not None else None
    storage = None
    if f is not None and f.storage is not None:
        s = f.storage
        storage = {"gbps": s.gbps, "min_gbps": s.min_gbps, "max_gbps": s.max_gbps, "age_s": s.age_s,
                   "method": s.method, "sample_bytes": s.sample_bytes, "fresh_gbps": s.fresh_gbps or None,
                   "hot_gbps": s.hot_gbps or None, "hot_reused_gbps": s.hot_reused_gbps or None}
    why = fl.not_measured()
    missing = name_source(NOT_MEASURED if why == fl.NOT_MEASURED else why, source)  # the command names the source
    return {"mount": mount, "resource": fl.resource_of(mount), "box": box if box else missing,
            "storage": storage if storage else missing,
            "landing_hot_gbps": (fl.landing_gbps(f, hot=True, nbytes=nbytes)
                                 if f is not None and fl.resource_of(mount) != "network" else None),  # no page cache
            "busy": name_source(f.busy, source) if f is not None else ""}  # measured while other work held the cores


def print_cached_floor(doc: dict) -> None:
    rows = list(doc["box"].items()) if isinstance(doc["box"], dict) else []
    if not rows:
        print(f"{'floor (this box)':24s} {doc['box']}")
    for name, c in rows:
        print(f"{'floor ' + name:24s} {c['gbps']:.3f} GB/s ({human_age(c['age_s'])} old)")
    s = doc["storage"]
    label = f"floor {doc['resource']}"
    mount = printable(doc["mount"])
    print(f"{label:24s} " + (f"{s['gbps']:.3f} GB/s for {mount} ({human_age(s['age_s'])} old)"
                             if isinstance(s, dict) else f"{s} (for {mount})"))
    if isinstance(s, dict) and s.get("fresh_gbps"):
        print(f"{'  into fresh memory':24s} {s['fresh_gbps']:.3f} GB/s (what a cold restore's floor uses)")
    if isinstance(s, dict) and s.get("hot_gbps"):
        print(f"{'  from the page cache':24s} {s['hot_gbps']:.3f} GB/s (its copy into populated memory"
              + (f"; into a reused buffer, a read's, {s['hot_reused_gbps']:.3f}" if s.get("hot_reused_gbps") else "")
              + ")")
    if doc.get("busy"):
        say(f"{'floor measured busy':24s} {doc['busy']}")
    if doc.get("landing_hot_gbps"):
        print(f"{'floor landing (hot)':24s} {doc['landing_hot_gbps']:.3f} GB/s (fresh memory populated, then copied "
              "into from the page cache: what a hot restore's floor uses)")


def _link_reader(source, listing, s3_client: str = "threads"):
    """What the floor's network figure reads for a source that is not files on a mount: its largest objects, up
    to floor.LINK_SAMPLE, through the source's own client (`s3_client`: threads or crt), hashed with none (the
    link, not the CPU, is measured). Returns read(concurrency) -> bytes/s, the sample's bytes and how it reads."""
    import dataclasses

    from ckptbench.sources import ReadOptions, drive
    from ckptbench.system import floor as fl

    chosen = dict(fl.link_sample([(f.path, f.size or 0) for f in listing.files]))
    sample = dataclasses.replace(listing, files=[f for f in listing.files if f.path in chosen])
    part = ReadOptions(s3_client=s3_client).part_size

    def read(level: int) -> float:
        opts = ReadOptions(concurrency=level, hash="none", s3_client=s3_client)
        driven = drive(lambda: source.start_read(sample, opts, into="hash"))
        if driven.result.failed:
            bad = driven.result.failed[0]
            raise CkptbenchError(f"{bad.path}: unreadable ({bad.error.message}); the floor reads the source's own "
                                 "objects")
        return driven.engine_gbps * 1e9

    what = (f"the source's {len(chosen)} largest object(s) read through its S3 client ({_client_words(s3_client)}) "
            f"in {part >> 20} MiB ranged GETs")
    return read, sum(chosen.values()), what


def _client_words(s3_client: str) -> str:
    return f"--s3-client {s3_client}"


def other_client_note(storage, s3_client: str) -> str:
    """A note when the cached network figure was measured through another S3 client than the one asked for (the
    cache keeps one figure per endpoint and bucket, whichever client measured it)."""
    import re

    found = re.search(r"--s3-client (\w+)", storage.method) if storage is not None else None
    if found is None or found.group(1) == s3_client:
        return ""
    return (f"this network figure was measured with --s3-client {found.group(1)}: `ckptbench floor SOURCE "
            f"--s3-client {s3_client} --remeasure` measures it with {s3_client}")


def again(note: str, args) -> str:
    """A floor note with its `ckptbench floor SOURCE --remeasure` the command this one was, measuring again: without
    a SOURCE (`floor --write-to DIR`) the placeholder was left for the user to fill."""
    import shlex

    def quoted(text: str) -> str:
        return shlex.quote(printable(redact(text)))

    words = ["ckptbench floor"] + ([quoted(args.source)] if args.source is not None else [])
    words += ["--pick", quoted(args.pick)] if getattr(args, "pick", None) else []
    words += ["--write-to", quoted(args.write_to)] if getattr(args, "write_to", None) else []
    note = note.replace("`ckptbench floor SOURCE --remeasure`", f"`{' '.join(words)} --remeasure`")
    return name_source(note, args.source)


def write_path_note(directory: str) -> str:
    """How the write figure's sample reached the storage, in words (writefloor: buffered os.write calls, then an fsync
    of each file inside the clock, then the files deleted): it went through the page cache, which a reader of "GB/s
    written" could not tell from an O_DIRECT figure. On a tmpfs the page cache is the storage, and fsync a no-op."""
    from ckptbench.system import probes

    fs = getattr(probes.mount_of(directory), "fs_type", "")
    said = ("its files went through the page cache (buffered writes, no O_DIRECT, as a save writes), each fsync'd "
            "before the clock stopped")
    said += (f"; on {fs} the page cache is the storage and fsync makes nothing durable: this is memory's rate, not a "
             "disk's" if fs in ("tmpfs", "ramfs") else ", so it is the rate to durable storage")
    return f"the write figure: {said}; they were deleted after, their cached pages with them"


def cmd_floor(args) -> int:
    from ckptbench.system import floor as fl

    files, mount, listing, link = None, None, None, {}
    if args.source is not None:  # an empty SOURCE is a mistake to say, not "no source"
        from ckptbench.cli.settings import check_s3_only, require_checkpoint
        from ckptbench.sources import open_source

        check_s3_only(args, args.source)
        source = open_source(args.source, args.pick)
        listing = source.list()
        require_checkpoint(listing)  # a folder of text files has no restore floor: run's line, before a measurement
        mount = fl.mount_key(source.describe())
        if source.files_on_disk:
            files = [(f.path, f.size or 0) for f in listing.files]
            if not sum(size for _, size in files):  # measure's line named neither the source nor what to do
                raise CkptbenchError(f"{printable(args.source)}: every file is empty, so there is nothing to read for "
                                     "the floor's storage figure; point it at a checkpoint whose files hold their "
                                     "bytes")
        else:
            read, nbytes, what = _link_reader(source, listing, args.s3_client)
            link = {"read": read, "read_bytes": nbytes, "read_what": what}
    nbytes = listing.bytes if listing is not None else 0
    t0 = time.time()
    f = fl.measure(files, mount, remeasure=args.remeasure, restore_bytes=nbytes, **link)  # fresh memory at its size
    if files and not args.json and f.storage is not None and f.storage.measured_at >= t0:  # read now: it changed
        # the box, said as watch says it (after, so that an error stays the one line it is)
        print(f"note: {printable(args.source)}'s files were read cold to measure its storage: they have left the "
              "page cache (a job restoring from them now reads from storage)", file=sys.stderr)
    if link and (note := other_client_note(f.storage, args.s3_client)):
        f.notes.append(note)
    doc = f.to_json()
    write = None
    if args.write_to:  # the save side: measured after the restore side, so its dirty pages do not slow that one
        from dataclasses import asdict

        from ckptbench.system import writefloor

        wmount, write = writefloor.measure_write(args.write_to, remeasure=args.remeasure)
        doc["write"] = asdict(write) | {"age_s": write.age_s, "mount": wmount, "through_page_cache": True,
                                        "page_cache_note": write_path_note(args.write_to)}
    if listing is not None:
        from ckptbench.restore.efficiency import hash_of

        hash_alg = hash_of(None, listing)  # what a restore computes
        unit = fl.largest_unit((x.size for x in listing.files), hash_alg)  # one core's hashing alone
        doc["restore"] = {"source": listing.source, "bytes": listing.bytes, "hash": hash_alg,
                          **fl.model(f, bytes_read=listing.bytes, hash_alg=hash_alg, unit_bytes=unit)}  # as `run`'s
        # the floors of the other runs `floor` cannot tell from this one: without a model step (the structural
        # check scans every floating byte), from the page cache (`run --cache hot`), onto a GPU (--device cuda)
        variants = {"floor_s_structural": {"floating_bytes": nbytes}}
        if files is not None:  # an object store has no local page cache: a hot run of it is never made
            variants |= {"floor_s_hot": {"hot": True},
                         "floor_s_hot_structural": {"hot": True, "floating_bytes": nbytes}}
        variants |= {"floor_s_device": {"device_bytes": nbytes}} if "h2d_pinned" in f.ceilings else {}
        for key, kw in variants.items():
            m = fl.model(f, bytes_read=nbytes, hash_alg=hash_alg, unit_bytes=unit, **kw)
            doc["restore"][key] = m["floor_s"]
            if key == "floor_s_hot":  # its parts too: they add up, and a user checks that they do
                doc["restore"] |= {"binding_hot": m["binding"], "binding_hot_gbps": m["gbps"],
                                   "binding_hot_how": m["how"], "times_s_hot": m["times_s"]}
    doc["landing_hot_gbps"] = None if link else fl.landing_gbps(f, hot=True, nbytes=nbytes)  # S3: no page cache
    if args.json:
        _emit(doc)
        return 0 if f.kept else 1
    print(f"this box: {doc['box']['cores']} cores, {human_bytes(doc['box']['memory'])}, kernel {doc['box']['kernel']}"
          f"{' (cached figures)' if f.cached else ''}")
    rows = list(f.ceilings.items()) + ([(f.resource, f.storage)] if f.storage else [])
    width = max([14] + [len(name) for name, _ in rows])  # populate_at_4096m: the columns stay aligned
    for name, c in rows:
        spread = "one sample" if c.min_gbps == c.max_gbps else f"{c.min_gbps:.3f}..{c.max_gbps:.3f}"  # not a range
        print(f"  {name:{width}s} {c.gbps:7.3f} GB/s  ({spread}, {human_age(c.age_s)} old)  {printable(c.method)}")
    if f.storage is not None:
        print(f"  ({f.resource} for {printable(mount)})")
        if f.storage.fresh_gbps:
            print(f"  {'into fresh':{width}s} {f.storage.fresh_gbps:7.3f} GB/s  the {f.resource} figure read into "
                  "fresh memory: what a cold restore's floor uses")
        if f.storage.hot_gbps:
            print(f"  {'page cache':{width}s} {f.storage.hot_gbps:7.3f} GB/s  this mount's page cache copied out "
                  "(pread) into populated memory" + (f"; into a reused buffer (a read's) "
                                                     f"{f.storage.hot_reused_gbps:.3f} GB/s"
                                                     if f.storage.hot_reused_gbps else ""))
    if (land := doc["landing_hot_gbps"]) is not None:
        own = f.storage is not None and f.storage.hot_gbps
        print(f"  {'landing (hot)':{width}s} {land:7.3f} GB/s  fresh memory populated, then copied into from the "
              "page cache: what a hot restore's floor uses" + ("" if own else " (the copy a memmove's: `ckptbench "
                                                               "floor SOURCE` measures a mount's page cache)"))
    if write is not None:
        spread = "one sample" if write.min_gbps == write.max_gbps else f"{write.min_gbps:.3f}..{write.max_gbps:.3f}"
        print(f"  {'write':{width}s} {write.gbps:7.3f} GB/s  ({spread}, {human_age(write.age_s)} old)  "
              f"{printable(write.method)} (for {printable(doc['write']['mount'])})")
        say(f"  note: {doc['write']['page_cache_note']}")
    for note in f.notes:
        print(f"  note: {printable(again(note, args))}")
    r = doc.get("restore")
    if r and r["floor_s"] is not None:
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in r["times_s"].items())
        partial = "" if fl.storage_usable(f) else " (no storage figure: memory and CPU only, so under the hot one)"
        print(f"restore of {printable(r['source'])} ({human_bytes(r['bytes'])}): cold floor {r['floor_s']:.3f} s"
              f"{partial}, bound by {binding.of_model(r)}; {parts}")
        if r.get("floor_s_hot"):
            scan = r.get("floor_s_hot_structural") or 0.0
            hot = " + ".join(f"{k} {v:.3f} s" for k, v in (r.get("times_s_hot") or {}).items())
            said = binding.phrase(r["binding_hot"], r["binding_hot_gbps"], r["binding_hot_how"])
            print(f"  from the page cache (--cache hot): floor {r['floor_s_hot']:.3f} s, bound by {said}; {hot}"
                  + (f"; {scan:.3f} s with the structural check's scan" if scan > r["floor_s_hot"] * 1.005 else ""))
        if r["floor_s_structural"] and r["floor_s_structural"] > r["floor_s"] * 1.005:
            print(f"  with the structural check's NaN/Inf scan (a run without a model step): floor "
                  f"{r['floor_s_structural']:.3f} s")
        if r.get("floor_s_device"):
            print(f"  moved to the GPU as well (--device cuda): floor {r['floor_s_device']:.3f} s")
    return 0 if f.kept else 1
