"""The local S3 test server: moto behind the shaping proxy (latency, per-connection bandwidth, faults)."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import botocore.exceptions
import botocore.retries.standard
import pytest

from ckptbench.testing.s3local import HOST, ShapingProxy, local_s3, start_moto

MiB = 1024 * 1024
# botocore's "max_attempts" counts retries after the first try; "total_max_attempts" counts every try.
NO_RETRY = {"mode": "standard", "total_max_attempts": 1}


def _hostport(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def _raw_get(s3, bucket: str, key: str) -> tuple[bytes, BaseException | None]:
    """GET a presigned URL over a bare socket; return what arrived and how the stream ended (None = clean EOF)."""
    url = s3.client().generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
    parts = urlsplit(url)
    got = b""
    with socket.create_connection(_hostport(s3.endpoint_url), timeout=5) as sock:
        sock.sendall(f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
        try:
            while data := sock.recv(65536):
                got += data
        except OSError as exc:
            return got, exc
    return got, None


def test_put_get_list_head_round_trip(s3server, s3bucket):
    client = s3server.client()
    objects = {f"ckpt/shard-{i}.bin": os.urandom(1000 * (i + 1)) for i in range(3)}
    for key, data in objects.items():
        client.put_object(Bucket=s3bucket, Key=key, Body=data)
    for key, data in objects.items():
        assert client.get_object(Bucket=s3bucket, Key=key)["Body"].read() == data
        assert client.head_object(Bucket=s3bucket, Key=key)["ContentLength"] == len(data)
    listed = client.list_objects_v2(Bucket=s3bucket, Prefix="ckpt/")["Contents"]
    assert {o["Key"]: o["Size"] for o in listed} == {k: len(v) for k, v in objects.items()}
    # The objects went through the proxy, which saw and counted the bodies.
    assert s3server.proxy.counters()["bytes_out"] >= sum(map(len, objects.values()))


def test_env_and_credentials(s3server, s3faulty):
    env = s3server.env
    assert env["AWS_ENDPOINT_URL"] == s3server.endpoint_url != s3server.direct_url
    assert env["AWS_ACCESS_KEY_ID"] == "testing-key-id"
    assert env["AWS_REGION"] == "us-east-1" and env["AWS_EC2_METADATA_DISABLED"] == "true"
    assert len(env["AWS_SECRET_ACCESS_KEY"]) >= 20
    assert s3faulty(fault_rate=0.0).env["AWS_SECRET_ACCESS_KEY"] != env["AWS_SECRET_ACCESS_KEY"]
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ or os.environ["AWS_SECRET_ACCESS_KEY"] != \
        env["AWS_SECRET_ACCESS_KEY"]  # local_s3 set nothing process-wide


def test_first_byte_latency_and_request_counter(s3server, s3bucket):
    client = s3server.client()
    client.put_object(Bucket=s3bucket, Key="small", Body=b"tiny")
    before = s3server.proxy.counters()["requests"]
    start = time.monotonic()
    resp = client.get_object(Bucket=s3bucket, Key="small")
    elapsed = time.monotonic() - start
    assert resp["Body"].read() == b"tiny"
    assert elapsed >= s3server.proxy.latency_s
    assert s3server.proxy.counters()["requests"] == before + 1
    s3server.proxy.latency_s = 0.15  # live: the next request already waits longer
    try:
        start = time.monotonic()
        client.head_object(Bucket=s3bucket, Key="small")
        assert time.monotonic() - start >= 0.15
    finally:
        s3server.proxy.latency_s = 0.02


def test_bandwidth_cap_per_connection(s3faulty):
    rate = 8 * MiB
    s3 = s3faulty(fault_rate=0.0, bandwidth_bps=rate)
    bucket = s3.make_bucket()
    data = os.urandom(2 * MiB)
    s3.client(direct=True).put_object(Bucket=bucket, Key="blob", Body=data)

    def timed_get(client) -> float:
        start = time.monotonic()
        assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == data
        return time.monotonic() - start

    one = timed_get(s3.client())
    assert one >= 0.2  # 2 MiB at 8 MiB/s is 0.25 s, less the first 64 KiB of burst credit
    clients = [s3.client(), s3.client()]  # two clients: two connections, each with its own cap
    start = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        each = list(pool.map(timed_get, clients))
    both = time.monotonic() - start
    assert min(each) >= 0.2  # the cap holds on every connection...
    assert both < 2 * 0.2  # ...but it is per connection: two streams move 4 MiB sooner than one stream could


def test_fault_slowdown_reaches_boto3_as_slowdown(s3faulty):
    s3 = s3faulty(fault_rate=1.0, fault_kinds=("slowdown",))
    bucket = s3.make_bucket()
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.client(retries=NO_RETRY).get_object(Bucket=bucket, Key="anything")
    assert info.value.response["Error"]["Code"] == "SlowDown"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert s3.proxy.counters()["faults"] == {"slowdown": 1, "reset": 0}
    # The error is well formed on the wire, and a PUT's body is drained so the connection stays usable.
    conn = http.client.HTTPConnection(*_hostport(s3.endpoint_url), timeout=5)
    for method, body in (("PUT", b"x" * 100_000), ("GET", None)):
        conn.request(method, f"/{bucket}/k", body=body)
        resp = conn.getresponse()
        payload = resp.read()
        assert resp.status == 503 and resp.getheader("Content-Type") == "application/xml"
        assert int(resp.getheader("Content-Length")) == len(payload)
        assert b"<Code>SlowDown</Code>" in payload and b"Please reduce your request rate." in payload


def test_fault_reset_before_response(s3faulty):
    s3 = s3faulty(fault_rate=1.0, fault_kinds=("reset",), reset_points=("before",))
    bucket = s3.make_bucket()
    s3.client(direct=True).put_object(Bucket=bucket, Key="k", Body=b"z" * 1000)
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        s3.client(retries=NO_RETRY).get_object(Bucket=bucket, Key="k")
    got, ended = _raw_get(s3, bucket, "k")
    assert got == b"" and isinstance(ended, ConnectionResetError)  # an RST, not an orderly EOF
    assert s3.proxy.counters()["resets"] == {"before": 2, "mid": 0}


def test_fault_reset_mid_body(s3faulty):
    s3 = s3faulty(fault_rate=1.0, fault_kinds=("reset",), reset_points=("mid",))
    bucket = s3.make_bucket()
    data = os.urandom(300_000)
    s3.client(direct=True).put_object(Bucket=bucket, Key="k", Body=data)
    resp = s3.client(retries=NO_RETRY).get_object(Bucket=bucket, Key="k")  # the headers arrive intact...
    assert resp["ContentLength"] == len(data)
    with pytest.raises(botocore.exceptions.ResponseStreamingError):
        resp["Body"].read()  # ...and the body breaks off, where botocore's retries cannot help
    got, ended = _raw_get(s3, bucket, "k")
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and 0 < len(body) < len(data) and body == data[:len(body)]
    assert isinstance(ended, ConnectionResetError)
    assert s3.proxy.counters()["resets"] == {"before": 0, "mid": 2}


def test_standard_retries_ride_out_faults(s3faulty, monkeypatch):
    # The retry decisions stay botocore's; only its back-off sleeps (1 s scale for SlowDown) are shortened.
    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "_DEFAULT_BACKOFF_CONFIG",
                        {"throttling_base_scale": 0.005, "non_throttling_base_scale": 0.002})
    s3 = s3faulty(fault_rate=0.3, seed=7, reset_points=("before",))
    bucket = s3.make_bucket()
    objects = {f"o{i}": os.urandom(2000 + i) for i in range(30)}
    direct = s3.client(direct=True)
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    client = s3.client(retries={"mode": "standard", "max_attempts": 10})
    for key, data in objects.items():
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    counters = s3.proxy.counters()
    assert counters["faults"]["slowdown"] > 0 and counters["faults"]["reset"] > 0
    assert counters["requests"] == 30 + sum(counters["faults"].values())  # every fault cost exactly one retry


def test_chunked_request_body_is_forwarded(s3server, s3bucket):
    conn = http.client.HTTPConnection(*_hostport(s3server.endpoint_url), timeout=5)
    pieces = [b"a" * 1000, os.urandom(200_000), b"z"]
    conn.request("PUT", f"/{s3bucket}/chunky", body=iter(pieces), encode_chunked=True)
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200
    assert s3server.client().get_object(Bucket=s3bucket, Key="chunky")["Body"].read() == b"".join(pieces)


def test_upstream_down_gives_502():
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener now
        probe.bind((HOST, 0))
        dead = f"http://{HOST}:{probe.getsockname()[1]}"
    proxy = ShapingProxy(dead, latency_s=0.0)
    proxy.start()
    try:
        conn = http.client.HTTPConnection(*_hostport(proxy.url), timeout=5)
        conn.request("GET", "/bucket/key")
        resp = conn.getresponse()
        assert resp.status == 502 and b"upstream error" in resp.read()
    finally:
        proxy.stop()


def test_everything_binds_to_loopback(s3server):
    proxy_sock = s3server.proxy._server.socket
    moto_sock = s3server.moto_server._server.socket
    assert proxy_sock.getsockname()[0] == HOST and moto_sock.getsockname()[0] == HOST
    assert _hostport(s3server.endpoint_url) == proxy_sock.getsockname()
    assert _hostport(s3server.direct_url) == moto_sock.getsockname()


def test_stop_releases_ports_and_threads():
    with local_s3(latency_s=0.0) as s3:
        bucket = s3.make_bucket()
        s3.client().put_object(Bucket=bucket, Key="k", Body=b"v")  # leaves keep-alive connections open
        ports = [_hostport(s3.endpoint_url)[1], _hostport(s3.direct_url)[1]]
        proxy = s3.proxy
    assert not proxy._thread.is_alive()
    assert not s3.moto_server._thread.is_alive()
    for port in ports:  # a listener still open would make this bind fail, SO_REUSEADDR or not
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, port))
            sock.listen()


def test_start_moto_alone():
    server, url = start_moto()
    try:
        with socket.create_connection(_hostport(url), timeout=5):
            pass
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection(_hostport(url), timeout=1)


def test_cli_prints_endpoint_and_env():
    out = subprocess.run([sys.executable, "-m", "ckptbench.testing.s3local", "--latency-ms", "5", "--bandwidth-mbps",
                          "100", "--seconds", "0.2"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"export AWS_ENDPOINT_URL=http://{HOST}:" in out.stdout
    assert "export AWS_SECRET_ACCESS_KEY=" in out.stdout and "export AWS_REGION=us-east-1" in out.stdout
    assert "textual" not in out.stderr
