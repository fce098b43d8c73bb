"""A checkpoint under s3://bucket/prefix: paginated listing, the manifest, and ranged-GET reads."""

from __future__ import annotations

from dataclasses import replace

import fastio

from ckptbench import concurrency as conc
from ckptbench import manifest as mf
from ckptbench.detect import format_of
from ckptbench import probes, readmode
from ckptbench.conditions import CacheCondition
from ckptbench.errors import CkptbenchError
from ckptbench.sources import s3, s3read
from ckptbench.sources.base import Listing, ReadOptions

NO_CACHE = "S3: no local page cache, every read goes to the server"


class S3Source:
    scheme = "s3"
    has_page_cache = False
    files_on_disk = False

    def __init__(self, url: str):
        self.s3url = s3.parse(url)
        self.url = str(self.s3url).rstrip("/")
        self.retry_log = s3.RetryLog()
        self._client = None
        self._objects: dict[str, s3.S3Object] = {}

    def list(self) -> Listing:
        """Each listing starts a fresh client and retry count, as a restarted job would."""
        self.retry_log = s3.RetryLog()
        # the pool holds as many connections as the most workers a live change can ask for
        self._client = s3.make_client(conc.MAX, retry_log=self.retry_log)
        objects = s3.list_objects(self._client, self.s3url)
        self._objects = {o.rel: o for o in objects}
        raw = (s3.get_bytes(self._client, self.s3url, mf.MANIFEST_NAME, self.retry_log)
               if mf.MANIFEST_NAME in self._objects else None)
        man = mf.parse(raw, f"{self.url}/{mf.MANIFEST_NAME}") if raw is not None else None
        files = [fastio.FileSpec(f"{self.url}/{o.rel}", o.size) for o in objects]
        return Listing(self.url, files, man, format_of(man, [o.rel for o in objects], self.url))

    def prepare_cache(self, listing: Listing, cache: str, *, drop_caches: bool = False) -> CacheCondition:
        return CacheCondition(cache, 0.0, True, NO_CACHE)

    def residency(self, listing: Listing) -> float | None:
        return None

    def choose_read(self, listing: Listing, opts: ReadOptions) -> tuple[ReadOptions, str]:
        """The local read modes do not apply to ranged GETs: `auto` stands as pread, which nothing reads."""
        why = "S3: ranged GETs over HTTP; --read applies to local files only"
        return (replace(opts, read="pread") if opts.read == readmode.AUTO else opts), why

    def start_read(self, listing: Listing, opts: ReadOptions, *, into: str = "hash",
                   stage_dir: str | None = None) -> s3read.ObjectRead:
        if self._client is None:
            self.list()
        try:
            objects = [self._objects[listing.rel(f.path)] for f in listing.files]
        except KeyError as exc:
            raise CkptbenchError(f"{self.url}/{exc.args[0]}: not in this source's latest listing") from None
        return s3read.start(self._client, self.s3url, objects, opts, self.retry_log, into=into, stage_dir=stage_dir)

    def retry_classes(self) -> dict[str, int]:
        return dict(self.retry_log.counts)

    def mount(self, root: str = "/") -> probes.Unknown:
        return probes.Unknown("an S3 prefix is not mounted")

    def describe(self, root: str = "/") -> dict:
        return {"fs_type": "s3", "mount_point": s3.endpoint_label() if s3.endpoint_url() else "AWS"}
