"""Handlers of the commands about this box: sysinfo (the dashboard's system figures) and floor (what the box can
physically do for a restore)."""

from __future__ import annotations

from ckptbench.cli.show import emit as _emit
from ckptbench.core.errors import CkptbenchError


def cmd_sysinfo(args) -> int:
    from ckptbench.sources import source_summary
    from ckptbench.system.live import SystemSampler

    from ckptbench.sources import open_source

    open_source(args.source)
    sampler = SystemSampler(args.source)
    sampler.sample()
    import time

    time.sleep(0.5)  # rates need two samples
    doc = source_summary(args.source) | sampler.sample()
    if args.json:
        _emit(doc)
    else:
        for k, v in doc.items():
            print(f"{k:24s} {v}")
    return 0


def cmd_floor(args) -> int:
    from ckptbench.core.units import human_bytes
    from ckptbench.system import floor as fl

    files, mount, listing = None, None, None
    if args.source:
        from ckptbench.sources import open_source

        source = open_source(args.source, args.pick)
        listing = source.list()
        if not source.files_on_disk:
            raise CkptbenchError(f"{listing.source}: the floor reads a checkpoint's own files from a mount; for S3, "
                                 "measure the box without SOURCE (the link's figure is not measured yet)")
        files = [(f.path, f.size or 0) for f in listing.files]
        mount = fl.mount_key(source.describe())
    f = fl.measure(files, mount, remeasure=args.remeasure)
    doc = f.to_json()
    if listing is not None:
        man = listing.manifest
        hash_alg = man.hash if man is not None else "none"  # what a restore computes: the manifest's digest, or none
        doc["restore"] = {"source": listing.source, "bytes": listing.bytes, "hash": hash_alg,
                          **fl.model(f, bytes_read=listing.bytes, floating_bytes=listing.bytes, hash_alg=hash_alg)}
    if args.json:
        _emit(doc)
        return 0
    print(f"this box: {doc['box']['cores']} cores, {human_bytes(doc['box']['memory'])}, kernel {doc['box']['kernel']}"
          f"{' (cached figures)' if f.cached else ''}")
    rows = list(f.ceilings.items()) + ([("storage", f.storage)] if f.storage else [])
    for name, c in rows:
        print(f"  {name:14s} {c.gbps:7.2f} GB/s  ({c.min_gbps:.2f}..{c.max_gbps:.2f}, {c.age_s:5.0f} s old)  {c.method}")
    for note in f.notes:
        print(f"  note: {note}")
    r = doc.get("restore")
    if r and r["floor_s"] is not None:
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in r["times_s"].items())
        print(f"restore of {r['source']} ({human_bytes(r['bytes'])}): floor {r['floor_s']:.3f} s, bound by "
              f"{r['binding']} ({parts})")
    return 0
