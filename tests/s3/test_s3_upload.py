"""`ckptbench upload DIR s3://bucket/prefix`: every file, byte for byte, multipart above the part size, CRC32C on
all; and the local S3 every test talks to stays on this machine."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import crc32c
import pytest
from s3help import files_under

from ckptbench.sources import s3 as s3mod

MiB = 1 << 20
LOOPBACK = "127.0.0.1"


def b64(crc: int) -> str:
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def bucket_contents(s3server, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """Every object under the prefix, read with boto3 straight from moto (not through ckptbench)."""
    direct = s3server.client(direct=True)
    out = {}
    for page in direct.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", ()):
            out[o["Key"]] = direct.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> str:
    """A generated small checkpoint plus one 11 MiB file (three 5 MiB parts) in a subfolder."""
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path_factory.mktemp("upload") / "ckpt"
    generate(profiles.load("small").scaled(0.02), str(root), force=True)
    (root / "extra").mkdir()
    (root / "extra" / "big.bin").write_bytes(os.urandom(11 * MiB + 777))
    return str(root)


def test_upload_puts_every_file_multipart_with_crc32c(s3server, s3bucket, ckpt_dir, tmp_path):
    """As a user runs it (a fresh process, credentials from the environment): keys and bytes, multipart ETags,
    CRC32C checksums; and the credentials appear nowhere in what it prints."""
    env = dict(os.environ, **s3server.env)
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "upload", ckpt_dir, f"s3://{s3bucket}/runs/step-7",
                           "--part-size", "5M", "-c", "8"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    local = files_under(ckpt_dir)
    assert f"uploaded {len(local)} files" in proc.stdout
    for secret in (s3server.env["AWS_SECRET_ACCESS_KEY"], s3server.env["AWS_ACCESS_KEY_ID"]):
        assert secret not in proc.stdout and secret not in proc.stderr
    assert "Traceback" not in proc.stderr

    remote = bucket_contents(s3server, s3bucket)
    assert remote == {f"runs/step-7/{rel}": data for rel, data in local.items()}

    direct = s3server.client(direct=True)
    for rel, data in local.items():
        head = direct.head_object(Bucket=s3bucket, Key=f"runs/step-7/{rel}", ChecksumMode="ENABLED")
        etag = head["ETag"].strip('"')
        assert "ChecksumCRC32C" in head, rel
        if len(data) > 5 * MiB:
            assert etag.endswith(f"-{-(-len(data) // (5 * MiB))}"), (rel, etag)
            # composite: the CRC32C of the parts' CRC32Cs (real S3 appends "-3"; moto leaves the suffix off)
            parts = [data[i:i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
            composite = crc32c.crc32c(b"".join(crc32c.crc32c(p).to_bytes(4, "big") for p in parts))
            assert head["ChecksumCRC32C"].split("-")[0] == b64(composite), rel
        else:
            assert "-" not in etag and etag == hashlib.md5(data).hexdigest(), rel
            assert head["ChecksumCRC32C"] == b64(crc32c.crc32c(data)), rel
    assert any(len(d) > 5 * MiB for d in local.values())  # the multipart branch above did run


def test_uploaded_checkpoint_reads_back_identically(s3server, s3env, s3bucket, ckpt_dir, tmp_path):
    """upload → stage-read into a directory: the same files, byte for byte (no prefix: keys are the rels)."""
    from ckptbench.sources import ReadOptions, s3read, s3source

    url = s3mod.parse(f"s3://{s3bucket}")
    assert sorted(s3mod.upload(ckpt_dir, url, concurrency=4, part_size=5 * MiB)) == sorted(files_under(ckpt_dir))
    log = s3mod.RetryLog()
    client = s3mod.make_client(4, retry_log=log)
    objs = s3mod.list_objects(client, url)
    res = s3source.start(client, url, objs, ReadOptions(concurrency=4, part_size=2 * MiB), log, into="stage",
                       stage_dir=str(tmp_path / "back")).wait(60)
    assert res is not None and not res.failed
    assert files_under(tmp_path / "back") == files_under(ckpt_dir)


def run_cli(capsys, *args):
    from ckptbench.cli import root as cli

    try:
        rc = cli.main([str(a) for a in args])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_upload_part_size_below_s3_minimum(s3server, s3env, s3bucket, ckpt_dir, capsys):
    rc, _, err = run_cli(capsys, "upload", ckpt_dir, f"s3://{s3bucket}/p", "--part-size", "4M")
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "5 MiB" in err and "Traceback" not in err
    assert bucket_contents(s3server, s3bucket) == {}  # refused before anything was put


def test_upload_of_a_missing_directory(s3env, s3bucket, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "upload", tmp_path / "nope", f"s3://{s3bucket}/p")
    assert rc == 2 and "no such directory" in err and len(err.strip().splitlines()) == 1


def test_upload_to_a_missing_bucket_is_one_line(s3env, ckpt_dir, capsys):
    """A user error (a typo in the bucket name) gets the one-line exit 2, not a boto3 traceback."""
    rc, _, err = run_cli(capsys, "upload", ckpt_dir, "s3://no-such-bucket-ckptbench-upload/p")
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "no-such-bucket-ckptbench-upload" in lines[0], err



@pytest.fixture
def own_ckpt(tmp_path) -> str:
    """A small generated checkpoint of this test's own, to add a crafted file to."""
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path / "ckpt"
    generate(profiles.load("small").scaled(0.02), str(root), force=True)
    return str(root)


def test_upload_of_a_file_whose_name_is_not_utf8_is_one_line_and_puts_nothing(s3server, s3env, s3bucket, own_ckpt,
                                                                             capsys):
    """A checkpoint unpacked from elsewhere may hold a name that is not UTF-8: boto3 raised UnicodeEncodeError (a
    traceback) with the other files already in the bucket."""
    with open(os.path.join(os.fsencode(own_ckpt), b"notes-\xff\xfe.txt"), "wb") as f:
        f.write(b"x")
    rc, _, err = run_cli(capsys, "upload", own_ckpt, f"s3://{s3bucket}/p")
    assert rc == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "not UTF-8" in err and "notes-" in err, err
    assert bucket_contents(s3server, s3bucket) == {}


def test_upload_whose_keys_would_pass_s3s_bound_puts_nothing(s3server, s3env, s3bucket, own_ckpt, capsys):
    """S3 refuses a key over 1024 bytes (KeyTooLongError) file by file, mid-upload: refused before the first put."""
    rc, _, err = run_cli(capsys, "upload", own_ckpt, f"s3://{s3bucket}/{'p' * 1000}")
    assert rc == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "1024" in err and len(err) < 600, err
    assert bucket_contents(s3server, s3bucket) == {}


# ---- nothing leaves this machine ----


def test_local_s3_endpoints_are_loopback_and_metadata_is_off(s3server, s3faulty):
    for server in (s3server, s3faulty(fault_rate=0.0)):
        env = server.env
        assert urlsplit(env["AWS_ENDPOINT_URL"]).hostname == LOOPBACK
        assert urlsplit(server.direct_url).hostname == LOOPBACK
        assert env["AWS_EC2_METADATA_DISABLED"] == "true"  # no IMDS probe to 169.254.169.254 for credentials
        assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]  # static: no credential-chain lookups


def test_ckptbench_clients_resolve_to_the_loopback_endpoint(s3env):
    from ckptbench.sources import ReadOptions, s3crt

    client = s3mod.make_client(4)
    assert urlsplit(client.meta.endpoint_url).hostname == LOOPBACK
    _crt, host = s3crt._crt_client(ReadOptions(s3_client="crt"))
    assert host.split(":")[0] == LOOPBACK


def test_upload_and_read_connect_only_to_loopback(s3server, s3env, s3bucket, ckpt_dir, monkeypatch, capsys):
    """Every socket connect of an upload and an S3 read (boto3 path) goes to 127.0.0.1."""
    seen = []
    real_connect = socket.socket.connect

    def guarded(self, address):
        seen.append(address)
        if self.family in (socket.AF_INET, socket.AF_INET6):
            assert address[0] in (LOOPBACK, "::1", "localhost"), f"connect to {address}"
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    rc, _, err = run_cli(capsys, "upload", ckpt_dir, f"s3://{s3bucket}/g", "--part-size", "5M")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "read", f"s3://{s3bucket}/g", "--part-size", "1M")
    assert rc == 0, err
    assert seen and all(a[0] == LOOPBACK for a in seen if isinstance(a, tuple))
