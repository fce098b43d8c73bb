"""A checkpoint under s3://bucket/prefix: paginated listing, the manifest, and ranged-GET reads."""

from __future__ import annotations

import dataclasses
import os

import fastio

from ckptbench.core import concurrency as conc
from ckptbench.checkpoint import pointers
from ckptbench.checkpoint import resume
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.detect import format_of
from ckptbench.system import probes
from ckptbench.system.pagecache import NO_PAGE_CACHE, CacheCondition
from ckptbench.core.errors import CkptbenchError
from ckptbench.sources import s3, s3read
from ckptbench.sources.base import Listing, ReadOptions

NO_CACHE = f"S3: {NO_PAGE_CACHE}, every read goes to the server"


class S3Source:
    scheme = "s3"
    has_page_cache = False
    files_on_disk = False

    def __init__(self, url: str, pick: str | None = None):
        self.pick = pick
        self.given = s3.parse(url)  # what the user named; the listing may descend (Megatron's iteration)
        self.s3url = self.given
        self.url = str(self.s3url).rstrip("/")
        self.retry_log = s3.RetryLog()
        self._client = None
        self._objects: dict[str, s3.S3Object] = {}

    def list(self) -> Listing:
        """The objects of the checkpoint its layout names (DeepSpeed's `latest` step, the shards an index names),
        the manifest when there is one, and the format. Each listing starts a fresh client and retry count, as a
        restarted job would."""
        self.retry_log = s3.RetryLog()
        # the pool holds as many connections as the most workers a live change can ask for
        self._client = s3.make_client(conc.MAX, retry_log=self.retry_log)
        self.s3url, self.url = self.given, str(self.given).rstrip("/")
        objects = s3.list_objects(self._client, self.s3url)
        self._objects = {o.rel: o for o in objects}
        lay = resume.choose(self.url, [o.rel for o in objects], self._fetch_small, self.pick)
        if lay.root is not None:  # the largest step, Megatron's iteration...: the checkpoint is that prefix
            self.s3url = s3.S3Url(self.s3url.bucket, self.s3url.key(lay.root))
            self.url = str(self.s3url)
            prefix = lay.root + "/"
            objects = [dataclasses.replace(o, rel=o.rel[len(prefix):]) for o in objects if o.rel.startswith(prefix)]
            self._objects = {o.rel: o for o in objects}
        # fetched no further than a manifest can be: its body is read whole before it is parsed
        raw = (self._fetch_small(mf.MANIFEST_NAME, mf.MAX_BYTES, "a manifest")
               if mf.MANIFEST_NAME in self._objects else None)
        man = mf.parse(raw, f"{self.url}/{mf.MANIFEST_NAME}") if raw is not None else None
        keep = set(lay.files)
        objects = [o for o in objects if o.rel in keep]
        pointers.check_sizes(self.url, [(o.rel, o.size) for o in objects])
        files = [fastio.FileSpec(f"{self.url}/{o.rel}", o.size) for o in objects]
        fmt = format_of(man, [o.rel for o in objects], self.url)
        return Listing(self.url, files, man, fmt, layout=resume.with_unloaded(lay, fmt))

    def _fetch_small(self, rel: str, limit: int, what: str) -> bytes:
        """A small member the layout names (`latest`, an index): refused by its listed size before any byte is
        fetched, then one ranged GET of at most limit + 1 bytes of the version listed (a larger one is refused)."""
        where = f"{self.url}/{rel}"
        obj = self._objects.get(rel)
        if obj is None:
            raise CkptbenchError(f"{where}: not in the listing of {self.url}; re-copy the checkpoint")
        if obj.size > limit:
            raise pointers.too_large(where, obj.size, limit, what)
        if obj.size == 0:  # a range of an empty object is not satisfiable: there is nothing to fetch
            return b""
        body = self._ranged_get(obj, where, limit)
        if len(body) > limit:
            raise pointers.too_large(where, None, limit, what)
        return body

    def _ranged_get(self, obj: s3.S3Object, where: str, limit: int, attempts: int = 5) -> bytes:
        """Bytes 0..limit of the object as listed (If-Match its ETag); a body cut mid-read is fetched again."""
        import time

        from botocore.exceptions import ClientError

        extra = {"IfMatch": f'"{obj.etag}"'} if obj.etag else {}
        attempt = 0
        while True:
            resp = None
            try:
                resp = self._client.get_object(Bucket=self.s3url.bucket, Key=obj.key, Range=f"bytes=0-{limit}",
                                               **extra)
                return resp["Body"].read(limit + 1)
            except s3.call_errors() as exc:
                cls = s3.classify(exc)
                # botocore retries the request, not a body that breaks after the headers: only that is ours
                if isinstance(exc, ClientError) or resp is None or cls not in (s3.CONNECTION_RESET, s3.TIMEOUT) \
                        or attempt == attempts - 1:
                    todo = ("it changed or vanished since it was listed: run again once the upload is whole"
                            if cls in (s3.CHANGED, s3.MISSING) else "retry, or check the endpoint")
                    raise CkptbenchError(f"{where}: cannot fetch ({cls}); {todo}", exit_code=1) from None
                self.retry_log.add(cls)
                time.sleep(0.05 * 2 ** attempt)
                attempt += 1

    def prepare_cache(self, listing: Listing, cache: str, *, drop_caches: bool = False) -> CacheCondition:
        if cache == "hot":  # nothing can be made resident: "hot, verified" with none of it cached said what was not
            return CacheCondition(cache, 0.0, False, f"{NO_CACHE}: a hot read cannot be made", local=False)
        return CacheCondition(cache, 0.0, True, NO_CACHE, local=False)

    def residency(self, listing: Listing) -> float | None:
        return None

    def choose_read(self, listing: Listing, opts: ReadOptions,
                    resident: float | None = None) -> tuple[ReadOptions, str]:
        """The local read modes do not apply to ranged GETs: nothing is picked, and the reason says so."""
        return opts, "S3: ranged GETs over HTTP; --read applies to local files only"

    def start_read(self, listing: Listing, opts: ReadOptions, *, into: str = "hash",
                   stage_dir: str | None = None, scan: dict | None = None) -> s3read.ObjectRead:
        if self._client is None:
            self.list()
        try:
            objects = [self._objects[listing.rel(f.path)] for f in listing.files]
        except KeyError as exc:
            raise CkptbenchError(f"{self.url}/{exc.args[0]}: not in this source's latest listing") from None
        return start(self._client, self.s3url, objects, opts, self.retry_log, into=into, stage_dir=stage_dir)

    def retry_classes(self) -> dict[str, int]:
        return dict(self.retry_log.counts)

    def mount(self, root: str = "/") -> probes.Unknown:
        return probes.Unknown("an S3 prefix is not mounted")

    def describe(self, root: str = "/") -> dict:
        """Where the bytes live: the endpoint (credentials stripped by endpoint_label) and the bucket, so the floor's
        network figure is kept per endpoint and bucket (buckets of one endpoint may sit in other regions)."""
        return {"fs_type": "s3", "mount_point": s3.endpoint_label() if s3.endpoint_url() else "AWS",
                "bucket": self.given.bucket}


def start(client, url: s3.S3Url, objects: list[s3.S3Object], opts: ReadOptions, retry_log: s3.RetryLog,
          *, into: str = "hash", stage_dir: str | None = None) -> s3read.ObjectRead:
    """The read with the chosen client: boto3 with our thread pool (`client`), or awscrt's native S3 client."""
    if into == "stage":
        if not stage_dir:
            raise CkptbenchError("--stage-dir is required to stage S3 objects locally")
        os.makedirs(stage_dir, exist_ok=True)
    if opts.s3_client == "crt":
        from ckptbench.sources.s3crt import CrtRead

        return CrtRead(url, objects, opts, retry_log, into=into, stage_dir=stage_dir)
    from ckptbench.sources.s3pool import ThreadPoolRead

    return ThreadPoolRead(client, url, objects, opts, retry_log, into=into, stage_dir=stage_dir)
