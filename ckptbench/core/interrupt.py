"""An interrupt that a library swallowed: a Ctrl-C (or SIGTERM, which the CLI raises as one) that reaches the process
while torch reads a file comes out of torch as an AttributeError, which a format's loader then calls a corrupt shard.
`Heard` notes it as it arrives, so a run stops as interrupted (its finished repeats kept, exit 130) instead of
reporting a damaged file. Used by the single-process runner, by every rank of a distributed run, and by a sweep
(`stops_as_interrupted`)."""

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
