"""A hostile S3 endpoint's answers, bounded whatever it sends (ckptbench/sources/s3guard.py): an error or a listing
page gigabytes long is read no further than its bound, and an answer dripped a byte at a time (its headers or its
body) is cut once it has averaged less than the floor rate past the grace, in seconds here (the bounds lowered),
with one line naming the prefix or a failed file naming the key. botocore talks to the crafted server for real."""

from __future__ import annotations

import ssl
import subprocess
import threading
import time
import tracemalloc

import pytest
import s3hostile
from s3help import one_line_error, run_cli
from s3hostile import ETAG, failed_file, listing, no_credentials, part_retries

import ckptbench.cli.run  # noqa: F401  (imported before any per-test stream redirection)
from ckptbench.sources import s3 as s3mod
from ckptbench.sources import s3guard

HUGE = 2 << 30  # the Content-Length the endpoint claims
SENT = 128 << 20  # what it sends of it before it closes (botocore, unbounded, read all of it into memory)
KEPT = 40 << 20  # a bounded read stops far below SENT: its bound, plus what the kernel's socket buffers took in


def traced(*args) -> tuple[int, str, str, int]:
    """run_cli, and the most memory Python held at once while it ran."""
    tracemalloc.start()
    try:
        rc, out, err = run_cli(*args)
        return rc, out, err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def within(seconds: float, *args) -> tuple[int, str, str, float]:
    """run_cli in a thread, which must end within `seconds` (before the bound, a drip held it for hours)."""
    box = {}
    t0 = time.monotonic()
    worker = threading.Thread(target=lambda: box.update(result=run_cli(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"ckptbench {' '.join(map(str, args))} still running after {seconds} s"
    return (*box["result"], time.monotonic() - t0)


def test_the_bounds_are_installed_on_this_botocore():
    """make_client's connections are s3guard's (install says False, with a warning, on a botocore without the
    seam: this test is then what fails)."""
    client = s3mod.make_client()
    classes = client._endpoint.http_session._pool_classes_by_scheme
    assert all(issubclass(p.ConnectionCls, s3guard._Bounded) for p in classes.values()), classes
    assert s3guard.install(client) is True  # a second install changes nothing


# --- an answer too large to hold -----------------------------------------------------------------------------------

def test_a_huge_error_answer_to_a_get(hostile):
    """A 500 whose body claims 2 GiB (and sends 128 MiB): botocore read it whole into memory, on every attempt.
    Now each attempt reads at most MAX_ERROR_ANSWER of it, the status still classes the failure, and the file
    fails naming the key."""
    hostile.get = lambda h, key, rng: hostile.stream(h, 500, HUGE, SENT, prefix=b"<Error><Code>InternalError</Code>"
                                                                                b"<Message>")
    rc, out, err, peak = traced("read", "s3://b/ck")
    failed_file(rc, err, "s3://b/ck/a.bin", "server_error", "HTTP 500")
    # botocore's 2 attempts; the second one's count may not be in yet when the client has given up (the server's
    # thread still writing into a closed socket): what is held to the bound is each attempt that was counted
    assert 1 <= len(hostile.sent) <= 2 and max(hostile.sent) < KEPT, hostile.sent
    assert peak < KEPT, peak
    no_credentials(out, err)


@pytest.mark.parametrize("status, prefix, words", [
    (503, b"<Error><Code>SlowDown</Code><Message>", "S3 error (throttling)"),
    (200, b'<?xml version="1.0"?><ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>ck/',
     "more than any S3 listing page holds"),
])
def test_a_huge_listing_answer(hostile, status, prefix, words):
    """A listing's error, or a page, 2 GiB long: botocore read each whole to parse it. Now an error is read to
    MAX_ERROR_ANSWER (its status still classes it) and a page is refused past MAX_PARSED_ANSWER (a real one is under
    4 MiB), on each of botocore's attempts; the listing ends in one line."""
    hostile.list_get = lambda h, n: hostile.stream(h, status, HUGE, SENT, prefix=prefix)
    rc, out, err, peak = traced("read", "s3://b/ck")
    line = one_line_error(rc, err, "s3://b/ck", words)
    assert len(line) < 400
    assert hostile.sent and max(hostile.sent) < KEPT, hostile.sent
    assert peak < 2 * KEPT, peak  # a page up to its bound is parsed, and parsing holds it twice
    no_credentials(out, err)


# --- an answer too slow to wait for --------------------------------------------------------------------------------

@pytest.fixture
def quick(monkeypatch):
    """The grace lowered from a minute to half a second: the floor rate stays."""
    monkeypatch.setattr(s3guard, "SLOW_GRACE_S", 0.5)


def test_a_body_dripped_a_byte_at_a_time(hostile, monkeypatch, quick):
    """Headers, then the body a byte every 20 ms: no read waits the read timeout, so it never timed out, and
    100 KiB took an hour and a half per attempt. Now each attempt is cut at the grace: the file fails as a timeout
    that says why, after our bounded retries of a body."""
    size = len(hostile.objects["ck/a.bin"])
    head = f'HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nETag: "{ETAG}"\r\n\r\n'.encode()
    hostile.get = lambda h, key, rng: hostile.drip(h, head, b"x" * size, 0.02)
    part_retries(monkeypatch, 1)
    rc, out, err, took = within(20, "read", "s3://b/ck")
    failed_file(rc, err, "s3://b/ck/a.bin", "timeout", f"slower than {s3guard.MIN_RATE >> 10} KiB/s")
    assert len(hostile.gets("ck/a.bin")) == 2  # ours: the first attempt and 1 retry
    assert took < 10, took
    no_credentials(out, err)


def test_a_get_whose_headers_drip_is_not_retried_twice_over(hostile, quick):
    """The headers of every GET dripped: botocore retries each cut answer (AWS_MAX_ATTEMPTS=2), and that is all.
    Before, ckptbench retried the part's exhausted GET 5 times more (12 answers waited for, not 2): ours are for a
    body cut after its headers."""
    hostile.get = lambda h, key, rng: hostile.drip(h, b"HTTP/1.1 200 OK\r\n", b"X-Drip: " + b"a" * 10000, 0.02)
    rc, out, err, took = within(20, "read", "s3://b/ck")
    failed_file(rc, err, "s3://b/ck/a.bin", "timeout", "slower than")
    assert len(hostile.gets("ck/a.bin")) == 2
    assert took < 10, took
    no_credentials(out, err)


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_listing_dripped_a_byte_at_a_time(hostile, quick, where):
    """A listing's headers, or its page, a byte every 20 ms: never done before. Now botocore's 2 attempts are each
    cut at the grace, and the listing ends in one line naming the prefix and the endpoint, never its user-info."""
    page = listing([("ck/a.bin", 10)])
    if where == "headers":
        whole, dripped = b"HTTP/1.1 200 OK\r\n", b"X-Drip: " + b"a" * 10000 + b"\r\n\r\n"
    else:
        whole, dripped = f"HTTP/1.1 200 OK\r\nContent-Length: {len(page)}\r\n\r\n".encode(), page
    hostile.list_get = lambda h, n: hostile.drip(h, whole, dripped, 0.02)
    rc, out, err, took = within(20, "read", "s3://b/ck")
    one_line_error(rc, err, "s3://b/ck", "127.0.0.1", "sent its answer too slowly", "slower than")
    assert len(hostile.requests) == 2
    assert took < 10, took
    no_credentials(out, err)


def test_a_slow_answer_that_keeps_the_floor_is_read(hostile, monkeypatch):
    """The bound is a floor rate, not a deadline: an answer that takes four times the grace is read whole, because
    each byte buys time (here 100 KiB at about 100 KiB/s, the grace 0.25 s and the floor 4 KiB/s)."""
    monkeypatch.setattr(s3guard, "SLOW_GRACE_S", 0.25)
    monkeypatch.setattr(s3guard, "MIN_RATE", 4096)
    data = hostile.objects["ck/a.bin"]
    head = f'HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\nETag: "{ETAG}"\r\n\r\n'.encode()
    hostile.get = lambda h, key, rng: hostile.drip(h, head, data, 0.01, piece=1024)
    rc, out, err, took = within(20, "read", "s3://b/ck")
    assert rc == 0 and "Traceback" not in err, err
    assert took > 4 * 0.25, took
    assert len(hostile.gets("ck/a.bin")) == 1


# --- the same over HTTPS (the socket is then an SSLSocket) -------------------------------------------------------------

@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and its key."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d / "key.pem",
                    "-out", d / "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.fixture
def hostile_tls(monkeypatch, cert):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*cert)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert[0]))
    yield from s3hostile.serve(monkeypatch, tls=ctx)


def test_over_https_a_read_is_whole_and_a_drip_is_cut(hostile_tls, monkeypatch, quick):
    rc, _, err = run_cli("read", "s3://b/ck")
    assert rc == 0 and "Traceback" not in err, err
    hostile_tls.list_get = lambda h, n: hostile_tls.drip(h, b"HTTP/1.1 200 OK\r\n", b"X-Drip: " + b"a" * 10000, 0.02)
    rc, out, err, took = within(20, "read", "s3://b/ck")
    one_line_error(rc, err, "s3://b/ck", "https://127.0.0.1", "sent its answer too slowly")
    assert took < 10, took
    no_credentials(out, err)
