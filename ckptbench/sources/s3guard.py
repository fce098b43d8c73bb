"""Bounds on one S3 answer, whatever the server sends: the bytes botocore reads whole, and the time any answer takes.

botocore has a setting for neither. It reads an error answer's body whole into memory (and a listing page's, to
parse it): `convert_to_response_dict` takes `AWSResponse.content`, with no limit and no event in between. Its read
timeout is per socket read, so a body or header dripped a byte at a time never trips it. Both are bounded where
botocore's own reads happen: each connection of a client from `install` reads its answers (http.client's
`sock.makefile("rb")`) through `_Reader`, which counts and times them:

- an error answer (status 300 and above) is read no further than MAX_ERROR_ANSWER bytes: its body ends there and
  botocore parses what came (the status still says what failed). An answer botocore parses whole (a listing page)
  that runs past MAX_PARSED_ANSWER fails with AnswerTooLarge. Either way the socket is shut, so the rest is never
  read. A GET's body is not held here: its reader bounds it by the bytes it asked for.
- an answer, headers and body, must keep up an average of MIN_RATE bytes a second from its request: it may take
  SLOW_GRACE_S plus one second per MIN_RATE bytes it delivered, then it is cut with SlowAnswer (a timeout: botocore
  retries the request, ckptbench a part's body cut by it). A stalled one ends sooner, at the read timeout.
"""

from __future__ import annotations

import contextlib
import functools
import io
import socket
import threading
import time
import warnings

MAX_ERROR_ANSWER = 64 << 10  # S3's error answers are under 1 KiB; past this the status alone says what failed
MAX_PARSED_ANSWER = 16 << 20  # a listing page (1000 keys of at most 1 KiB, URL-encoded) is under 4 MiB
SLOW_GRACE_S = 60.0  # time any answer may take before it must have averaged MIN_RATE since its request
MIN_RATE = 16 << 10  # bytes a second: 256 connections sharing a 100 Mbit/s link get 3 times this

_answer = threading.local()  # parsed_whole: the request this thread sends next has its answer parsed whole


class SlowAnswer(TimeoutError):
    """An answer that fell below MIN_RATE after SLOW_GRACE_S (urllib3 and botocore report it as a read timeout)."""

    def __init__(self) -> None:
        super().__init__(f"the answer came slower than {MIN_RATE >> 10} KiB/s on average once its first "
                         f"{SLOW_GRACE_S:g} s were over (ckptbench's floor for one S3 answer)")


class AnswerTooLarge(OSError):
    """An answer parsed whole that ran past MAX_PARSED_ANSWER (urllib3 and botocore report it as a broken
    connection)."""

    def __init__(self) -> None:
        super().__init__(f"an answer of more than {MAX_PARSED_ANSWER >> 20} MiB, more than any S3 listing page holds")


def under(exc: BaseException | None, kind: type) -> BaseException | None:
    """The `kind` (SlowAnswer, AnswerTooLarge) under an error botocore or urllib3 raised for it, if that is what it
    was."""
    for _ in range(8):  # botocore's error wraps urllib3's, which wraps ours: a few links, never a loop
        if exc is None or isinstance(exc, kind):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class _Answers:
    """A connection's socket: its answers are read through `_Reader`; every other call goes to the socket."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self._timeout = sock.gettimeout()  # the read timeout urllib3 sets; a read near the deadline gets less
        self._applied = self._timeout
        self._restart()

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def _restart(self) -> None:
        self.sent_at = time.monotonic()
        self.received = 0
        self.left: int | None = None  # bytes the answer's body may still bring, where it is bounded
        self.refuse = False  # past the bound: AnswerTooLarge (an answer parsed whole), else the body ends there

    def settimeout(self, timeout) -> None:
        self._timeout = self._applied = timeout
        self._sock.settimeout(timeout)

    def gettimeout(self):
        return self._timeout

    def sendall(self, data, *args) -> None:
        self._sock.sendall(data, *args)
        self._restart()  # the answer's clock starts once the request (its last piece) is sent

    def makefile(self, mode="r", buffering=None, **kwargs):
        if mode != "rb":
            return self._sock.makefile(mode, buffering, **kwargs)
        raw = _Reader(self, self._sock.makefile("rb", buffering=0))
        return raw if buffering == 0 else io.BufferedReader(raw, buffering or io.DEFAULT_BUFFER_SIZE)

    def limit(self, nbytes: int, *, refuse: bool) -> None:
        self.left, self.refuse = nbytes, refuse

    def cut(self) -> None:
        """Nothing more is read from this connection, and it is never reused (the pool sees it closed)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def timeout_before(self, due: float) -> bool:
        """Sets the socket timeout for the next read: the read timeout, or less where the deadline is nearer (True:
        a timeout of that read is the deadline's)."""
        nearer = self._timeout is None or due < self._timeout
        want = due if nearer else self._timeout
        if want != self._applied:  # settimeout is a system call: only near the deadline does it change
            with contextlib.suppress(OSError):
                self._sock.settimeout(want)
            self._applied = want
        return nearer


class _Reader(io.RawIOBase):
    """An answer's bytes as they come off the socket, counted against the byte bound and timed against the rate."""

    def __init__(self, owner: _Answers, raw) -> None:
        self._owner, self._raw = owner, raw

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int | None:
        s = self._owner
        view = memoryview(b).cast("B")
        if s.left is not None:
            if s.left <= 0:
                s.cut()
                if s.refuse:
                    raise AnswerTooLarge()
                return 0  # the body ends here for http.client: what came is what botocore parses
            view = view[:s.left]
        due = s.sent_at + SLOW_GRACE_S + s.received / MIN_RATE - time.monotonic()
        if due <= 0:
            s.cut()
            raise SlowAnswer()
        deadline_first = s.timeout_before(due)
        try:
            n = self._raw.readinto(view)
        except TimeoutError:
            if deadline_first:
                s.cut()
                raise SlowAnswer() from None
            raise
        if n:
            s.received += n
            if s.left is not None:
                s.left -= n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Bounded:
    """Mixed into botocore's connection classes: the socket wrapped once connected, each answer's bound set once
    its status is known."""

    def connect(self) -> None:
        super().connect()
        self.sock = _Answers(self.sock)

    def getresponse(self):
        sock = self.sock  # http.client lets go of it when the answer closes the connection
        resp = super().getresponse()
        if isinstance(sock, _Answers):
            if resp.status >= 300:
                sock.limit(MAX_ERROR_ANSWER, refuse=False)
            elif getattr(_answer, "parsed_whole", False):
                sock.limit(MAX_PARSED_ANSWER, refuse=True)
        return resp


@functools.lru_cache(maxsize=None)
def _pool_class(pool: type) -> type:
    conn = type(f"Bounded{pool.ConnectionCls.__name__}", (_Bounded, pool.ConnectionCls), {})
    return type(f"Bounded{pool.__name__}", (pool,), {"ConnectionCls": conn})


def _mark(request=None, **_kw) -> None:
    """botocore's before-send, in the thread that then sends: whether this answer is parsed whole."""
    _answer.parsed_whole = request is not None and not getattr(request, "stream_output", True)


def install(client) -> bool:
    """Bounds every answer `client` reads (see the module's doc); False, with a warning, where botocore no longer
    has the seams used (its http session's pool classes, shared with its pool managers, which make pools on first
    use: there is no public way to choose the connection class)."""
    classes = getattr(getattr(getattr(client, "_endpoint", None), "http_session", None),
                      "_pool_classes_by_scheme", None)
    if not isinstance(classes, dict) or not all(isinstance(getattr(p, "ConnectionCls", None), type)
                                                for p in classes.values()):
        warnings.warn("this botocore has no seam for ckptbench's bounds on S3 answers: an error answer's size and "
                      "a slow answer's time are unbounded", RuntimeWarning, stacklevel=2)
        return False
    for scheme, pool in list(classes.items()):
        if not issubclass(pool.ConnectionCls, _Bounded):
            classes[scheme] = _pool_class(pool)
    client.meta.events.register("before-send.s3", _mark)
    return True
