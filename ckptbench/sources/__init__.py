"""Where a checkpoint's bytes come from: the one seam between the domain and storage.

`open_source(url)` gives a Source (a local path on any mount, or s3://bucket/prefix); a Source lists (a
Listing) and starts reads (a ReadHandle); `drive` runs any handle to its end with progress, cancel and
error translation. Nothing outside this package asks which kind of source it has.
"""

from __future__ import annotations

from ckptbench.sources.base import Listing, ReadHandle, ReadOptions, Source
from ckptbench.sources.drive import PROGRESS_INTERVAL_S, Driven, drive


def open_source(url: str, pick: str | None = None) -> Source:
    """A Source for a checkpoint directory (any mount) or an s3:// prefix; `pick` chooses among the checkpoints a
    folder holds (resume.choose)."""
    if url.startswith("s3://"):
        from ckptbench.sources.s3source import S3Source

        return S3Source(url, pick)
    from ckptbench.sources.local import LocalSource

    return LocalSource(url, checkpoint=True, pick=pick)


def open_targets(targets: list[str], pick: str | None = None) -> Source:
    """What a plain read names: one s3:// prefix, or local files and directories together (one directory is the
    checkpoint a resume loads from it, as every command picks it; `pick` chooses)."""
    from ckptbench.core.errors import CkptbenchError

    remote = [t for t in targets if t.startswith("s3://")]
    if remote:
        if len(targets) != 1:
            raise CkptbenchError("read takes one s3:// prefix at a time, without local paths")
        return open_source(remote[0], pick)
    from ckptbench.sources.local import LocalSource

    return LocalSource(targets, pick=pick)


def source_summary(source: str, pick: str | None = None) -> dict:
    """What the dashboard header shows about the source: the checkpoint of the folder a restore reads (None when the
    folder is the checkpoint), files, bytes, where it lives, residency now; `pick` as open_source's."""
    src = open_source(source, pick)
    listing = src.list()
    residency = src.residency(listing)
    lay = listing.layout.describe() if listing.layout is not None else {}
    if lay.get("why"):  # a folder of several checkpoints: the one a restore of it reads, as run names it
        from ckptbench.checkpoint.layouts import picked_name

        lay["checkpoint"] = picked_name(lay.get("root"), lay.get("tag"))
    return {"source": source, "checkpoint": lay.get("checkpoint"), "files": len(listing.files), "bytes": listing.bytes,
            "residency": residency if residency is not None else 0.0,
            "has_page_cache": src.has_page_cache, **src.describe()}



# the seam's names, and the two modules other folders may use directly: local (a local listing for verify, the
# ranks' reads) and s3 (upload, the S3 demo)
__all__ = ["PROGRESS_INTERVAL_S", "Driven", "Listing", "ReadHandle", "ReadOptions", "Source", "drive",
           "open_source", "open_targets", "source_summary", "local", "s3"]
