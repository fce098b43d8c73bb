"""An interrupt that a library swallowed: a Ctrl-C (or SIGTERM, which the CLI raises as one) that reaches the process
while torch reads a file comes out of torch as an AttributeError, which a format's loader then calls a corrupt shard.
`Heard` notes it as it arrives, so a run stops as interrupted (its finished repeats kept, exit 130) instead of
reporting a damaged file. Used by the single-process runner, by every rank of a distributed run, and by a sweep
(`stops_as_interrupted`). The other way round, `signals_held`: a block an interrupt waits for (a record being
written)."""

from __future__ import annotations

from contextlib import contextmanager

from ckptbench.core.errors import CkptbenchError


class Heard:
    """Notes the Ctrl-C or SIGTERM that reaches this rank while in use (main thread only), and raises it as the
    handler it wraps does. A KeyboardInterrupt raised while torch's loader is reading comes out of torch as an
    AttributeError, which the format's loader then calls a corrupt shard: `raise_if_heard` raises the interrupt
    again, and the rank stops as interrupted instead of reporting a damaged file."""

    def __init__(self):
        self.exc: BaseException | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "Heard":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous = signal.getsignal(signum)
                if callable(previous):  # only a signal that raises (Ctrl-C; SIGTERM as the CLI sets it)
                    self._previous[signum] = previous
                    signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc) -> bool:
        import signal

        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False

    def _handler(self, signum, frame) -> None:
        try:
            self._previous[signum](signum, frame)
        except BaseException as exc:
            self.exc = exc
            raise

    def raise_if_heard(self) -> None:
        if self.exc is not None:
            raise self.exc


@contextmanager
def stops_as_interrupted():
    """A block that stops as interrupted when a Ctrl-C or SIGTERM reached it, whatever a library made of it (swallowed,
    or turned into one of our errors such as a corrupt shard): its caller keeps what finished before it."""
    with Heard() as heard:
        try:
            yield heard
        except CkptbenchError:
            heard.raise_if_heard()
            raise
        heard.raise_if_heard()


@contextmanager
def signals_held():
    """A block that a Ctrl-C or SIGTERM does not cut short (main thread only): one heard meanwhile is raised, as its
    handler raises it, once the block has ended. A record written inside it (a save's document and its row) is on
    record whole: an interrupt between the two left a document with no row."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    heard: list[tuple[int, object]] = []
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):  # only a signal that raises (Ctrl-C; SIGTERM as the CLI sets it)
            previous[signum] = handler
            signal.signal(signum, lambda n, frame: heard.append((n, frame)))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if heard:
        signum, frame = heard[0]
        previous[signum](signum, frame)
