"""S3 reads: ranged GETs hashed as they stream, for every digest, both clients and every destination;
memory bounded in a read-only run; S3's own checksums (CRC32C, ETag MD5) checked.

Reference digests come from hashlib, the crc32c and xxhash packages, never from ckptbench or fastio.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys

import crc32c
import pytest
from s3help import files_under
import xxhash

from ckptbench.sources import s3 as s3mod
from ckptbench.sources import ReadOptions, s3read, s3source

MiB = 1 << 20
PREFIX = "ckpt/step-1"
PARTIAL = s3read.STAGE_SUFFIX


def ref_digest(alg: str, data: bytes) -> str:
    if alg == "crc32c":
        return f"{crc32c.crc32c(data):08x}"
    if alg == "xxh64":
        return xxhash.xxh64(data).hexdigest()
    return hashlib.new(alg, data).hexdigest()


def b64_crc32c(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


@pytest.fixture(scope="module")
def objects(s3server) -> tuple[str, dict[str, bytes]]:
    """A bucket holding a multi-part object (at 1 MiB parts), a small one, an empty one, one in a subfolder."""
    bucket = s3server.make_bucket()
    data = {
        "shard-0.bin": os.urandom(3 * MiB + 12345),
        "small.json": b'{"step": 1}' * 37,
        "empty.bin": b"",
        "sub/dir/tail.bin": os.urandom(200_000),
    }
    direct = s3server.client(direct=True)
    for rel, body in data.items():
        direct.put_object(Bucket=bucket, Key=f"{PREFIX}/{rel}", Body=body)
    # a sibling prefix that must not be read: "step-1" is a prefix of "step-10" as a string
    direct.put_object(Bucket=bucket, Key="ckpt/step-10/other.bin", Body=b"not mine")
    return bucket, data


def read(url: str, *, into: str = "hash", stage_dir: str | None = None, backend: str = "threads", **opts):
    """List and read through the code under test; returns (result, handle, objects listed)."""
    u = s3mod.parse(url)
    log = s3mod.RetryLog()
    client = s3mod.make_client(8, retry_log=log)
    listed = s3mod.list_objects(client, u)
    h = s3source.start(client, u, listed, ReadOptions(s3_client=backend, **opts), log, into=into, stage_dir=stage_dir)
    res = h.wait(120)
    assert res is not None, "read did not finish in 120 s"
    return res, h, listed


def rel_of(path: str, bucket: str) -> str:
    base = f"s3://{bucket}/{PREFIX}/"
    assert path.startswith(base), path
    return path[len(base):]


def test_listing_is_the_prefix_only(s3env, objects):
    bucket, data = objects
    u = s3mod.parse(f"s3://{bucket}/{PREFIX}/")
    assert (u.bucket, u.prefix) == (bucket, PREFIX)
    listed = s3mod.list_objects(s3mod.make_client(4), u)
    assert {o.rel: o.size for o in listed} == {rel: len(b) for rel, b in data.items()}
    assert [o.key for o in listed] == sorted(o.key for o in listed)


@pytest.mark.parametrize("backend", ["threads", "crt"])
@pytest.mark.parametrize("into", ["hash", "memory", "stage"])
@pytest.mark.parametrize("alg", ["crc32c", "md5", "sha256", "xxh64"])
def test_read_digests_match_local_hashes(s3env, objects, tmp_path, alg, into, backend):
    bucket, data = objects
    stage = tmp_path / "stage"
    res, h, _ = read(f"s3://{bucket}/{PREFIX}", concurrency=4, part_size=1 * MiB, hash=alg, into=into,
                     stage_dir=str(stage) if into == "stage" else None, backend=backend)
    got = {rel_of(f.path, bucket): f for f in res.files}
    assert set(got) == set(data)
    for rel, body in data.items():
        f = got[rel]
        assert f.error is None, (rel, f.error)
        assert f.bytes == len(body), rel
        assert f.digest == ref_digest(alg, body), rel
    assert res.bytes == sum(map(len, data.values()))
    assert not res.failed and not res.cancelled
    assert h.error_classes() == {}
    if backend == "threads":
        # 4 parts for the 3 MiB + object, 1 GET for each of the others: ranged GETs, not whole-object ones
        assert res.final.reads >= 4 + 3
    if into == "memory":
        assert len(res.buffers) == len(res.files)
        for f, buf in zip(res.files, res.buffers):
            assert bytes(buf) == data[rel_of(f.path, bucket)]
    if into == "stage":
        assert files_under(stage) == data
        assert not [p for p in files_under(stage) if p.endswith(PARTIAL)]


def test_read_cli_json_digests(s3env, objects, capsys):
    """`ckptbench read s3://...` (in process): digests in the JSON equal the local ones, many ranged GETs."""
    from ckptbench.cli import root as cli

    bucket, data = objects
    rc = cli.main(["read", f"s3://{bucket}/{PREFIX}", "--hash", "sha256", "--part-size", "512K", "-c", "4",
                   "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["files_failed"] == 0 and doc["files_ok"] == len(data)
    assert {rel_of(f["path"], bucket): f["digest"] for f in doc["files"]} == \
        {rel: ref_digest("sha256", b) for rel, b in data.items()}
    assert doc["bytes"] == sum(map(len, data.values()))
    assert "Traceback" not in err


_MEMORY_PROBE = r"""
import json, sys, threading, time
import psutil
from ckptbench.sources import ReadOptions, s3, s3read, s3source


def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) * 1024


def reset_hwm():
    try:  # "5" resets this process's VmHWM to its current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


url = s3.parse(sys.argv[1])
log = s3.RetryLog()
client = s3.make_client(4, retry_log=log)
objs = s3.list_objects(client, url)
out = {}
for alg in ("crc32c", "sha256"):
    proc, sampled, stop = psutil.Process(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            sampled[0] = max(sampled[0], proc.memory_info().rss)
            time.sleep(0.002)

    exact = reset_hwm()
    base = proc.memory_info().rss
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    h = s3source.start(client, url, objs, ReadOptions(concurrency=4, part_size=1 << 20, hash=alg), log, into="hash")
    res = h.wait()
    stop.set()
    t.join()
    peak = max(sampled[0], status_kib("VmHWM") if exact else 0)
    out[alg] = {"digest": res.files[0].digest, "bytes": res.bytes, "error": str(res.files[0].error),
                "growth": peak - base, "reads": res.final.reads, "exact": exact}
print(json.dumps(out))
"""


def test_read_only_memory_is_bounded(s3server, s3bucket):
    """A 64 MiB object read into a hash with 1 MiB parts at concurrency 4, in a fresh process: the peak RSS during
    the read (the kernel's VmHWM, reset right before the read, and RSS sampled every 2 ms) rises far less than the
    object's size over the RSS measured right before the read. (ru_maxrss is useless here: importing boto3 and
    fastio already set it far above what the read needs.)"""
    size = 64 * MiB
    body = os.urandom(size)
    direct = s3server.client(direct=True)
    direct.put_object(Bucket=s3bucket, Key="big/blob.bin", Body=body)
    try:
        proc = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, f"s3://{s3bucket}/big"],
                              env=dict(os.environ, **s3server.env), capture_output=True, text=True, timeout=120)
    finally:
        direct.delete_object(Bucket=s3bucket, Key="big/blob.bin")  # moto holds it in this process
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    for alg, r in doc.items():
        assert r["error"] == "None", r
        assert r["bytes"] == size
        assert r["digest"] == ref_digest(alg, body)
        assert r["reads"] >= 64  # one ranged GET per MiB
        # a reader holding the object would grow by >= 64 MiB; concurrency x part is 4 MiB
        assert r["growth"] < 40 * MiB, f"{alg}: RSS high-water mark grew {r['growth'] / MiB:.1f} MiB"


# ---- S3's own checksums ----


@pytest.mark.parametrize("into", ["hash", "stage"])
def test_single_part_crc32c_checksum_is_verified(s3server, s3env, s3bucket, tmp_path, into):
    body = os.urandom(300_000)
    direct = s3server.client(direct=True)
    direct.put_object(Bucket=s3bucket, Key="c/one.bin", Body=body, ChecksumAlgorithm="CRC32C")
    assert direct.head_object(Bucket=s3bucket, Key="c/one.bin", ChecksumMode="ENABLED")["ChecksumCRC32C"] == \
        b64_crc32c(body)
    res, h, _ = read(f"s3://{s3bucket}/c", part_size=1 * MiB, hash="sha256", into=into,
                     stage_dir=str(tmp_path / "st") if into == "stage" else None)
    (f,) = res.files
    assert f.error is None and f.digest == ref_digest("sha256", body)
    # the comparison against S3's CRC32C happened (a digest without it would leave this None)
    assert h.objs[0].verified_s3 is True


@pytest.mark.parametrize("into", ["hash", "stage"])
def test_object_disagreeing_with_its_s3_checksum_fails(s3server, s3env, s3bucket, tmp_path, into):
    """moto stores a client-supplied checksum without checking it (real S3 would refuse the PUT): that stands in
    for an object corrupted at rest or in transit. The file must fail as checksum_mismatch, never count as read."""
    body = os.urandom(100_000)
    good = os.urandom(5000)
    wrong = b64_crc32c(body + b"x")
    direct = s3server.client(direct=True)
    direct.put_object(Bucket=s3bucket, Key="c/bad.bin", Body=body, ChecksumAlgorithm="CRC32C",
                      ChecksumCRC32C=wrong)
    direct.put_object(Bucket=s3bucket, Key="c/good.bin", Body=good, ChecksumAlgorithm="CRC32C")
    assert direct.head_object(Bucket=s3bucket, Key="c/bad.bin", ChecksumMode="ENABLED")["ChecksumCRC32C"] == wrong
    stage = tmp_path / "st"
    res, h, _ = read(f"s3://{s3bucket}/c", part_size=1 * MiB, hash="crc32c", into=into, part_retries=1,
                     stage_dir=str(stage) if into == "stage" else None)
    by = {f.path.rsplit("/", 1)[-1]: f for f in res.files}
    assert by["good.bin"].error is None and by["good.bin"].digest == ref_digest("crc32c", good)
    bad = by["bad.bin"]
    assert bad.error is not None and bad.digest is None
    assert bad.error.message.startswith(s3mod.CHECKSUM), bad.error.message
    assert h.error_classes() == {s3mod.CHECKSUM: 1}
    if into == "stage":
        assert files_under(stage) == {"good.bin": good}  # no bad.bin, no partial file


def test_md5_etag_verification_single_and_multipart(s3server, s3env, s3bucket, tmp_path):
    """--hash md5: a single-part object's ETag is its MD5; a multipart one's is the MD5 of the part MD5s,
    checkable when the read's parts are the upload's parts."""
    single = os.urandom(700_000)
    multi = os.urandom(11 * MiB + 4321)
    src = tmp_path / "src"
    src.mkdir()
    (src / "single.bin").write_bytes(single)
    (src / "multi.bin").write_bytes(multi)
    url = s3mod.parse(f"s3://{s3bucket}/m")
    s3mod.upload(str(src), url, concurrency=4, part_size=5 * MiB)
    etags = {o.rel: o.etag for o in s3mod.list_objects(s3mod.make_client(4), url)}
    assert etags["single.bin"] == hashlib.md5(single).hexdigest()
    assert etags["multi.bin"].endswith("-3")
    res, h, listed = read(str(url), part_size=5 * MiB, hash="md5", concurrency=4)
    assert [f.error for f in res.files] == [None, None]
    assert {o.o.rel: o.digest for o in h.objs} == {"multi.bin": hashlib.md5(multi).hexdigest(),
                                                   "single.bin": hashlib.md5(single).hexdigest()}
    assert {o.o.rel: o.verified_s3 for o in h.objs} == {"multi.bin": True, "single.bin": True}
