"""The crafted S3 endpoint the hostile-server tests talk to: a small threaded HTTP server on 127.0.0.1 that answers
listings and GETs as each test says (botocore talks to it for real), and the credentials it must never see echoed."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ckptbench.sources import s3source

KEY_ID, SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FQoGZXIvYXdzEJr//////////wEaDHostileSessionToken0123456789abcdef"
PASSWORD = "pa55w0rd-in-the-url"
ETAG = "0123456789abcdef0123456789abcdef"


def failed_file(rc, err: str, *needles: str) -> None:
    """A read that ran and lost its file: exit 1, the failure on a line, no traceback."""
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert rc == 1, err
    assert any(all(n in line for n in needles) for line in err.splitlines()), err


def part_retries(monkeypatch, n: int) -> None:
    """Our retries per part (5 by default; no option sets them) for this test."""
    real = s3source.start
    monkeypatch.setattr(s3source, "start", lambda c, u, o, opts, log, **kw: real(
        c, u, o, dataclasses.replace(opts, part_retries=n), log, **kw))


def listing(entries, truncated: bool = False, token: str | None = None) -> bytes:
    """A ListObjectsV2 answer (keys URL-encoded, as botocore asks for); entries are (key, size) with size as text."""
    items = "".join(f"<Contents><Key>{quote(k, safe='/')}</Key><Size>{s}</Size><ETag>&quot;{ETAG}&quot;</ETag>"
                    f"</Contents>" for k, s in entries)
    nxt = f"<NextContinuationToken>{token}</NextContinuationToken>" if token else ""
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><EncodingType>url</EncodingType>'
            f"<IsTruncated>{str(truncated).lower()}</IsTruncated>{items}{nxt}</ListBucketResult>").encode()


def s3_error(status: int, code: str, message: str = "") -> tuple:
    return status, {}, f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(*s3_error(404, "NotFound"), head=True)

    def do_GET(self) -> None:
        app = self.server.app
        url = urlsplit(self.path)
        with app.lock:
            app.requests.append((self.path, dict(self.headers.items())))
            n = len(app.requests)
        if "list-type" in parse_qs(url.query):
            if app.list_get is not None:
                return app.list_get(self, n)
            return self._answer(200, {}, app.pages(n)) if callable(app.pages) else self._answer(*app.pages)
        key = unquote(url.path.split("/", 2)[2])
        return app.get(self, key, self.headers.get("Range"))

    def _answer(self, status: int, headers: dict, body: bytes, head: bool = False, length: int | None = None) -> None:
        self.send_response(status)
        for k, v in {"Content-Type": "application/xml", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(b"" if head else body)
            self.wfile.flush()


class Hostile:
    """The crafted endpoint: `pages(n)` answers the n-th request with a listing's bytes (or `pages` is a whole
    (status, headers, body) answer, or `list_get(handler, n)` answers it itself); `get(handler, key, range)` answers
    a GET. Every request is recorded, and `sent` has the bytes of each streamed body that reached the socket."""

    def __init__(self, tls=None) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, dict]] = []
        self.release = threading.Event()  # stalled answers wait on it: set when the test ends
        self.objects: dict[str, bytes] = {"ck/a.bin": bytes(range(256)) * 400}
        self.pages = lambda n: listing([(k, len(v)) for k, v in self.objects.items()])
        self.get = self.serve_range
        self.list_get = None
        self.sent: list[int] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.app = self
        if tls is not None:  # an ssl.SSLContext: the endpoint speaks HTTPS
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def serve_range(self, h: Handler, key: str, rng: str | None, *, whole: bool = False, extra: bytes = b"",
                    cut: int = 0) -> None:
        """What S3 does (206 with the bytes asked for), or what a broken one does: the whole object with 200
        (`whole`), `extra` bytes beyond it, or `cut` bytes fewer than its Content-Length says."""
        data = self.objects[key]
        start, end = 0, len(data) - 1
        if rng and not whole:
            start, end = (int(x) for x in rng.split("=", 1)[1].split("-"))
            end = min(end, len(data) - 1)
        body = data[start:end + 1] + extra
        headers = {"ETag": f'"{ETAG}"', "Content-Type": "application/octet-stream"}
        if cut:
            h.close_connection = True
        h._answer(206 if rng and not whole else 200, headers, body[:len(body) - cut], length=len(body))

    def stream(self, h: Handler, status: int, declared: int, actual: int, prefix: bytes = b"") -> None:
        """`status` with a Content-Length of `declared` bytes, then `prefix` and b"A"s up to `actual` bytes or until
        the client stops reading; the connection is closed after it. The bytes written go to `sent`."""
        h.send_response(status)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(declared))
        h.end_headers()
        block, sent = memoryview(b"A" * (1 << 20)), 0
        try:
            h.wfile.write(prefix)
            sent = len(prefix)
            while sent < actual and not self.release.is_set():
                sent += h.wfile.write(block[:actual - sent])
        except OSError:
            pass
        finally:
            h.close_connection = True
            with self.lock:
                self.sent.append(sent)

    def drip(self, h: Handler, whole: bytes, dripped: bytes, every: float, piece: int = 1) -> None:
        """`whole` written at once (a status line, headers), then `dripped`, `piece` bytes each `every` seconds, until
        it is all out, the client hangs up or the test ends; the connection is closed after it."""
        h.close_connection = True
        try:
            h.wfile.write(whole)
            h.wfile.flush()
            for i in range(0, len(dripped), piece):
                if self.release.wait(every):
                    return
                h.wfile.write(dripped[i:i + piece])
                h.wfile.flush()
        except OSError:
            pass

    def gets(self, key: str) -> list[dict]:
        return [headers for path, headers in self.requests if unquote(urlsplit(path).path) == f"/b/{key}"]

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(monkeypatch, tls=None):
    """A crafted endpoint, named with user-info in its URL, and AWS credentials in the environment, so that every
    test also checks that none of them reaches what it prints (the `hostile` fixture)."""
    server = Hostile(tls)
    endpoint = server.url.replace("://", f"://alice:{PASSWORD}@")
    for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
                 "AWS_SESSION_TOKEN": TOKEN, "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                 "AWS_MAX_ATTEMPTS": "2"}.items():  # 2: botocore's retries stay, and stay short
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_RETRY_MODE"):
        monkeypatch.delenv(k, raising=False)
    yield server
    server.close()


def no_credentials(*texts: str) -> None:
    for text in texts:
        for secret in (KEY_ID, SECRET, TOKEN, PASSWORD, "alice"):
            assert secret not in text, (secret, text)
