"""A shaping proxy for a local S3: moto answers S3 calls in microseconds, which hides exactly what a restore
benchmark must see: the first-byte latency of every GET, a per-connection throughput ceiling, and the 503 SlowDown /
connection-reset faults that real S3 hands out under load. `ShapingProxy` adds those in front of moto (s3local.py),
per request and per connection, so throughput grows with concurrency the way it does against S3. It binds to
127.0.0.1 only.

Design decisions:
* Request bodies stream upstream as they arrive: by Content-Length, or re-framed chunk by chunk when the client
  sends Transfer-Encoding: chunked (botocore may, for aws-chunked uploads over HTTPS).
* Response bodies stream in CHUNK pieces. An upstream Content-Length is forwarded; a body without one (chunked,
  or read-until-close; moto sends lengths today) is re-chunked, so nothing is buffered whole and the client
  connection stays keep-alive.
* A "reset" fault happens at one of two points, chosen at random per fault: "before" (request body drained,
  nothing forwarded, connection reset) or "mid" (forwarded, headers and part of the body sent, then reset).
  A response with no body can only be reset "before". A mid-body reset reaches a boto3 caller from
  StreamingBody.read(), where botocore's retries do not apply: readers must retry body reads themselves.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import secrets
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOST = "127.0.0.1"
CHUNK = 64 * 1024
# Headers that describe one hop, not the message; the proxy frames each hop itself. Expect is answered by the
# proxy (http.server sends the 100 Continue), and SigV4 never signs it, so dropping it keeps signatures valid.
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "transfer-encoding",
               "expect"}
SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b"<Message>Please reduce your request rate.</Message><Resource>%s</Resource>"
                 b"<RequestId>%s</RequestId></Error>")


class _TokenBucket:
    """Pacing: holds at most one CHUNK of credit, so a stream's rate is capped from its start. One per connection,
    and one shared by all (the link): takers share the debt, so together they get the rate, each a fair part; the
    link holds `window_s` of credit too, as a link's buffer does, so a sleeper woken late does not lose the rate."""

    def __init__(self, window_s: float = 0.0) -> None:
        self.tokens = float(CHUNK)
        self.stamp = time.monotonic()
        self.lock = threading.Lock()
        self.window_s = window_s

    def take(self, n: int, rate: float | None) -> None:
        with self.lock:
            now = time.monotonic()
            if not rate:  # unlimited: keep the bucket full for when a cap is set live
                self.tokens, self.stamp = float(CHUNK), now
                return
            self.tokens = min(max(float(CHUNK), rate * self.window_s), self.tokens + (now - self.stamp) * rate) - n
            self.stamp = now
            debt = -self.tokens
        if debt > 0:  # wait until the refill pays it back (outside the lock); the next take() counts the wait
            time.sleep(debt / rate)


class _UpstreamConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        # Also on http.client's automatic reconnects: headers and body are separate sends (see _Handler.setup).
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True  # a client that keeps its connection open must not keep the process alive
    request_queue_size = 128  # socketserver's 5 drops a burst of 16 connects, costing each a ~1 s SYN retry

    def __init__(self, proxy: "ShapingProxy") -> None:
        self.proxy = proxy
        self.open_sockets: set[socket.socket] = set()
        self.open_lock = threading.Lock()
        super().__init__((HOST, 0), _Handler)

    def handle_error(self, request, client_address) -> None:
        # A client hanging up mid-response (a cancelled read) is routine here, not worth a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so latency is paid per request, not per connection setup
    server: _ProxyServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes; with Nagle on, the second waits for the client's delayed
        # ACK (~40 ms) and would swamp the latency being simulated.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proxy = self.server.proxy
        self.bucket = _TokenBucket()
        self.upstream: http.client.HTTPConnection | None = None  # one per client connection, opened lazily
        self.reset_on_finish = False
        with self.server.open_lock:
            self.server.open_sockets.add(self.connection)

    def finish(self) -> None:
        with self.server.open_lock:
            self.server.open_sockets.discard(self.connection)
        self._close_upstream()
        if self.reset_on_finish:
            self._reset()
        else:
            super().finish()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - keep test and benchmark output clean
        pass

    # Every method goes through the same path: S3 uses GET/PUT/HEAD/POST/DELETE.
    def do_GET(self) -> None:
        self._proxy_one()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_OPTIONS = do_PATCH = do_GET

    def _proxy_one(self) -> None:
        t0 = time.monotonic()
        fault, point = self.proxy._draw_fault()
        if fault == "slowdown":
            self._drain_body()
            self._send_slowdown(t0)
        elif fault == "reset" and point == "before":
            self._drain_body()
            self._schedule_reset()
        else:
            self._forward(t0, reset_mid=fault == "reset")

    def _forward(self, t0: float, reset_mid: bool) -> None:
        try:
            resp = self._send_upstream()
        except (OSError, http.client.HTTPException) as exc:
            self._close_upstream()
            self._send_simple(502, f"upstream error: {exc!r}".encode(), "text/plain", t0)
            self.close_connection = True  # the request body may be half-read: the stream is out of sync
            return
        has_body = self.command != "HEAD" and resp.status not in (204, 304) and resp.getheader("Content-Length") != "0"
        if reset_mid and not has_body:
            self.proxy._count("resets", "before")  # nothing to cut in the middle of: reset before the response
            self._close_upstream()
            self._schedule_reset()
            return
        if reset_mid:
            self.proxy._count("resets", "mid")
        self._relay(resp, t0, has_body, reset_mid)

    def _send_upstream(self) -> http.client.HTTPResponse:
        """Send the request line, the client's headers untouched (signature included), then stream the body."""
        if self.upstream is None:
            up = urlsplit(self.proxy.upstream_url)
            self.upstream = _UpstreamConnection(up.hostname, up.port, timeout=60)
        conn = self.upstream
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        for name, value in self.headers.items():
            if name.lower() not in HOP_HEADERS:
                conn.putheader(name, value)
        if chunked:
            conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for piece in self._body_pieces():
            conn.send(b"%X\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            conn.send(b"0\r\n\r\n")
        return conn.getresponse()

    def _body_pieces(self):
        """Yield the request body in pieces, de-framing a chunked body; nothing is held whole."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers: botocore puts its checksums inside the aws-chunked body, not here
                    return
                data = self.rfile.read(size)
                self.rfile.readline()  # the CRLF after each chunk
                yield data
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0:
            data = self.rfile.read(min(CHUNK, left))
            if not data:
                raise ConnectionError("client closed mid-body")
            left -= len(data)
            yield data

    def _drain_body(self) -> None:
        for _ in self._body_pieces():  # read and drop, so the next request on this connection parses cleanly
            pass

    def _relay(self, resp: http.client.HTTPResponse, t0: float, has_body: bool, reset_mid: bool) -> None:
        length = resp.getheader("Content-Length")
        rechunk = has_body and length is None  # upstream chunked or read-until-close: frame it ourselves
        self._wait_first_byte(t0)
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in HOP_HEADERS:
                self.send_header(name, value)
        if rechunk:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not has_body:
            resp.read()
            return
        # A mid-body reset sends at most half of the body, so the client is always left short.
        # (Unknown length: up to half a CHUNK, and never the closing 0-chunk.)
        budget = None if not reset_mid else max(1, int(length) // 2) if length else CHUNK // 2
        sent = 0
        while budget is None or sent < budget:
            piece = resp.read(CHUNK if budget is None else min(CHUNK, budget - sent))
            if not piece:
                break
            self._write_paced(b"%X\r\n%s\r\n" % (len(piece), piece) if rechunk else piece, len(piece))
            sent += len(piece)
        if reset_mid:
            self._close_upstream()  # the rest of the upstream body is abandoned with this connection
            self._schedule_reset()
        elif rechunk:
            self.wfile.write(b"0\r\n\r\n")
        if resp.will_close:
            self._close_upstream()

    def _write_paced(self, data: bytes, payload: int) -> None:
        self.bucket.take(payload, self.proxy.bandwidth_bps)
        self.proxy._link.take(payload, self.proxy.link_bps)
        self.wfile.write(data)
        self.proxy._count("bytes_out", n=payload)

    def _send_slowdown(self, t0: float) -> None:
        resource = self.path.split("?")[0].encode().replace(b"&", b"&amp;").replace(b"<", b"&lt;")
        self._send_simple(503, SLOWDOWN_BODY % (resource, secrets.token_hex(8).upper().encode()), "application/xml", t0)

    def _send_simple(self, status: int, body: bytes, ctype: str, t0: float) -> None:
        self._wait_first_byte(t0)
        self.send_response_only(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self._write_paced(body, len(body))

    def _wait_first_byte(self, t0: float) -> None:
        """S3's time to first byte: no response byte leaves before latency_s after the request arrived."""
        delay = t0 + self.proxy.latency_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _schedule_reset(self) -> None:
        # The reset happens in finish(): http.server still flushes wfile after the handler returns, and
        # socketserver's shutdown_request would send a FIN (a clean EOF) before any RST we could cause here.
        self.reset_on_finish = True
        self.close_connection = True

    def _reset(self) -> None:
        """Close with SO_LINGER 0: the kernel sends RST, so the client sees ECONNRESET, not an orderly EOF."""
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for f in (self.wfile, self.rfile):  # makefile() objects hold references that would defer the close
            with contextlib.suppress(OSError, ValueError):
                f.close()
        self.connection.close()

    def _close_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None


class ShapingProxy:
    """HTTP/1.1 keep-alive proxy adding S3-like latency, per-connection bandwidth, a link cap and faults in front of
    upstream.

    latency_s, bandwidth_bps (bytes per second per client connection; None = unlimited), link_bps (bytes per second
    over all connections together, as a real link has one capacity; None = unlimited), fault_rate and fault_kinds
    may be changed while it runs; each request reads them afresh.
    """

    def __init__(self, upstream_url: str, latency_s: float = 0.020, bandwidth_bps: float | None = None,
                 fault_rate: float = 0.0, fault_kinds: tuple[str, ...] = ("slowdown", "reset"),
                 seed: int | None = None, link_bps: float | None = None) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        self.link_bps = link_bps
        self._link = _TokenBucket(window_s=0.05)
        self.fault_rate = fault_rate
        self.fault_kinds = tuple(fault_kinds)
        self.reset_points: tuple[str, ...] = ("before", "mid")  # narrow to test one failure point
        self._rng = random.Random(seed)
        self._lock = threading.Lock()  # guards the counters and the shared random generator
        self.requests = 0
        self.bytes_out = 0  # response body bytes written to clients
        self.faults = {"slowdown": 0, "reset": 0}
        self.resets = {"before": 0, "mid": 0}
        self.url: str | None = None  # set by start()
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        self._server = _ProxyServer(self)
        self.url = "http://%s:%d" % self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="s3-shaping-proxy", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop accepting, close the listening socket and cut open client connections so their threads end."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with server.open_lock:
            conns = list(server.open_sockets)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def counters(self) -> dict:
        """A consistent snapshot of the counters."""
        with self._lock:
            return {"requests": self.requests, "bytes_out": self.bytes_out, "faults": dict(self.faults),
                    "resets": dict(self.resets)}

    def _draw_fault(self) -> tuple[str | None, str | None]:
        """Count the request and decide its fate: (None, None), ("slowdown", None) or ("reset", point|None)."""
        with self._lock:
            self.requests += 1
            if not self.fault_kinds or self._rng.random() >= self.fault_rate:
                return None, None
            kind = self._rng.choice(self.fault_kinds)
            if kind == "slowdown":
                self.faults["slowdown"] += 1
                return kind, None
            self.faults["reset"] += 1
            point = self._rng.choice(self.reset_points)
            if point == "before":
                self.resets["before"] += 1
                return kind, point
            return kind, None  # "mid" is counted once the response shows whether it has a body to cut

    def _count(self, attr: str, key: str | None = None, n: int = 1) -> None:
        with self._lock:
            if key is None:
                setattr(self, attr, getattr(self, attr) + n)
            else:
                getattr(self, attr)[key] += n
