"""The ranks of a distributed restore, as torchrun starts them: the process group, and the exchanges between
ranks — each with a deadline, so a rank that failed or hangs is named and no rank waits forever.

The exchanges go through the group's key-value store (the one torchrun's rendezvous made): a rank posts under
its own key, the waiting side waits in the store for all the keys it needs (one request, answered when the last
arrives) until the deadline and, when it passes, asks key by key which ranks never posted. A collective would
only say that it timed out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

from ckptbench.core.errors import CkptbenchError, name_source, shown

_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class RankFailure(CkptbenchError):
    """One or more ranks failed or did not answer in time; the message names them."""


@dataclass
class World:
    rank: int
    size: int
    local_rank: int
    host: str
    backend: str
    store: object
    timeout_s: float
    prefix: str

    def key(self, *parts) -> str:
        return "/".join((self.prefix,) + tuple(str(p) for p in parts))

    def post(self, value, *parts) -> None:
        self.store.set(self.key(*parts), json.dumps(value, default=str))

    def _wait(self, keys: list[str], seconds: float) -> bool:
        """Whether every key is there within `seconds`: the store's own wait (the server answers when the last
        key is set, so ranks waiting on one barrier are released together, and no rank polls)."""
        try:
            self.store.wait(keys, timedelta(seconds=max(seconds, 0.001)))
            return True
        except RuntimeError:  # DistStoreError: the deadline passed
            return False

    def gather_some(self, *parts, deadline_s: float | None = None,
                    fetch: bool = True) -> tuple[dict[int, object], str | None]:
        """The posts under `parts` of every rank that posted by the deadline (none fetched with `fetch` False: a
        barrier needs only to know they are there), and a line naming those that did not (None when all did)."""
        keys = {r: self.key(*parts, r) for r in range(self.size)}
        wait = self.timeout_s if deadline_s is None else deadline_s
        if self._wait(list(keys.values()), wait):
            waiting: set[int] = set()
        else:  # key by key only now, to name the ranks that never posted
            waiting = {r for r, k in keys.items() if not self.store.check([k])}
        present = [r for r in keys if r not in waiting] if fetch else []
        raw = self.store.multi_get([keys[r] for r in present]) if present else []
        got = {r: _decoded(v, r, parts[-1]) for r, v in zip(present, raw)}
        if not waiting:
            return got, None
        names = ", ".join(str(r) for r in sorted(waiting))
        return got, (f"rank(s) {names} did not reach '{parts[-1]}' within {wait:g} s: failed, hung or killed (see "
                     "that rank's own output); raise --rank-timeout if it is only slow")

    def gather(self, *parts, deadline_s: float | None = None) -> dict[int, object]:
        """Every rank's post under `parts`; RankFailure naming the ranks that had not posted by the deadline."""
        got, missing = self.gather_some(*parts, deadline_s=deadline_s)
        if missing:
            raise RankFailure(missing)
        return got

    def wait_for(self, *parts, deadline_s: float | None = None):
        """The value rank 0 posted under `parts`, waiting for it up to the deadline."""
        k = self.key(*parts)
        wait = self.timeout_s if deadline_s is None else deadline_s
        if not self._wait([k], wait):
            raise RankFailure(f"rank 0 did not post '{parts[-1]}' within {wait:g} s: it failed or hangs (see its "
                              "output)")
        return _decoded(self.store.get(k), 0, parts[-1])  # anything on the network can write it, as a rank's post

    def barrier(self, name: str, deadline_s: float | None = None) -> None:
        """Every rank posts its arrival and waits for all the others'; RankFailure naming those that never came."""
        self.post(True, name, self.rank)
        _, missing = self.gather_some(name, deadline_s=deadline_s, fetch=False)
        if missing:
            raise RankFailure(missing)


def _decoded(raw: bytes, rank: int, what: str):
    """A rank's post as JSON: anything on the network can write to torch's store, and text that is not JSON was a
    traceback on rank 0."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # nesting deeper than the parser's recursion: no rank's post either
        raise CkptbenchError(f"rank {rank}'s '{what}' is not what a rank of ckptbench posts ({len(raw)} bytes that are "
                             "not JSON); run the same ckptbench on every node, and keep the rendezvous port "
                             "(MASTER_PORT) to the job's hosts") from None


def under_torchrun() -> bool:
    return all(k in os.environ for k in _ENV)


_WHOLE = re.compile(r"-?[0-9]{1,9}")  # ASCII only: int() also takes " 1", "1_0" and "٣" (a rank torchrun never sets)
# a host name or an IP address (IPv6 in brackets or bare, with a zone): what torch hands to getaddrinfo and writes
# into its own log lines unfiltered, so a value with escapes or spaces never reaches it
_ADDR = re.compile(r"[A-Za-z0-9._%:\[\]-]{1,253}")


def _int_env(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None and default is not None:
        return default
    if raw is None or not _WHOLE.fullmatch(raw):
        raise CkptbenchError(f"{name}={shown(repr(raw), 40)} in the environment: not a whole number; start the "
                             "ranks with torchrun") from None
    return int(raw)


def rank_of_env() -> int | None:
    """RANK as `join` reads it (None where it reads none): whether this process is rank 0, before it joins."""
    raw = os.environ.get("RANK", "0")
    return int(raw) if _WHOLE.fullmatch(raw) else None


def _place(rank: int, size: int) -> int:
    """LOCAL_RANK, checked against the node's and the world's size: one rank per node (local rank 0) sets the page
    cache for the node, so a local rank that no torchrun gives (7 of a 2-rank world, -1) left a cold run unevicted
    and said nothing of it."""
    local = _int_env("LOCAL_RANK", rank)
    node = _int_env("LOCAL_WORLD_SIZE", size)
    if not 1 <= node <= size:
        raise CkptbenchError(f"LOCAL_WORLD_SIZE={node} is outside 1..WORLD_SIZE={size}; start the ranks with torchrun")
    if not 0 <= local < node:
        raise CkptbenchError(f"LOCAL_RANK={local} is outside 0..{node - 1} (LOCAL_WORLD_SIZE={node}, WORLD_SIZE="
                             f"{size}); start the ranks with torchrun")
    return local


def _rendezvous_at() -> str:
    """MASTER_ADDR:MASTER_PORT, checked before torch is given them: an address that is no host name or does not
    resolve, or a port out of range, is one line here (torch retried it with C++ stack traces, and printed the
    address, escapes and all, in its own log lines)."""
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if not _ADDR.fullmatch(addr):
        raise CkptbenchError(f"MASTER_ADDR={shown(repr(addr), 60)} in the environment: not a host name or an IP "
                             "address; set it to rank 0's host (torchrun sets it)")
    if not _WHOLE.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise CkptbenchError(f"MASTER_PORT={shown(repr(port), 40)} in the environment: not a port (1..65535); "
                             "set it to the rendezvous port (torchrun sets it)")
    try:
        socket.getaddrinfo(addr.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise CkptbenchError(f"MASTER_ADDR={addr}: does not resolve ({getattr(exc, 'strerror', None) or exc}); "
                             "set it to rank 0's host (torchrun sets it)") from None
    return f"{addr}:{port}"


WAIT_SAY_S = 10.0  # a rank still waiting for the rendezvous this long says so, once (rank 0 imports in seconds)


def _await_listener(rank: int, at: str, timeout_s: float) -> None:
    """Returns once something listens at the rendezvous `at` (host:port), or raises after `timeout_s`. Why: torch's
    client waited the whole timeout in silence, then retried (another timeout), and printed C++ stack traces
    before any line of ours; a rank whose rank 0 never started, or that was pointed elsewhere, is named here."""
    host, port = at.rsplit(":", 1)
    start = time.monotonic()
    said, last = False, ""
    while True:
        left = timeout_s - (time.monotonic() - start)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(5.0, left))):
                return  # closed at once: the store takes a client that leaves before it speaks
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise CkptbenchError(f"rank {rank}: nothing listens at the rendezvous {at} after {timeout_s:g} s "
                                 f"({last}); check that rank 0 was started and that MASTER_ADDR and MASTER_PORT "
                                 "name it (torchrun sets both), or give it longer with --rank-timeout")
        if not said and waited >= WAIT_SAY_S:
            print(f"ckptbench: rank {rank}: waiting for the rendezvous at {at} ({last}); giving up after "
                  f"{timeout_s:g} s", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.25)


@contextlib.contextmanager
def _torch_log_held():
    """torch's C++ log lines (c10d's connect errors and retries, with stack traces) held back while the group forms:
    written out after a success, as they came; dropped on a failure, which our one line says. The process's stderr
    itself is redirected (the C++ side writes to the descriptor, not to sys.stderr)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to hold (started with 2>&-): nothing to keep back
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if ok and held.tell():
                held.seek(0)
                os.write(2, held.read(1 << 20))


def join(device: str, timeout_s: float, command: str = "run", source: str | None = None) -> World:
    """This process's place in the group torchrun started: the process group (nccl for a CUDA device, gloo
    otherwise) initialized with `timeout_s` on every collective, and the store the ranks talk through. Outside
    torchrun, one line naming `command` and `source` as the user gave them (`sweep --distributed` was told to start
    `ckptbench run SOURCE --distributed`)."""
    if not under_torchrun():
        missing = [k for k in _ENV if k not in os.environ]
        how = name_source(f"`torchrun --nproc-per-node K -m ckptbench {command} SOURCE --distributed`", source)
        raise CkptbenchError(f"--distributed runs one process per rank under torchrun (missing {', '.join(missing)}"
                             f"): {how.strip('`')}")
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    rank, size = _int_env("RANK"), _int_env("WORLD_SIZE")
    if not 0 <= rank < size:
        raise CkptbenchError(f"RANK={rank} is outside WORLD_SIZE={size}; start the ranks with torchrun")
    local = _place(rank, size)
    at = _rendezvous_at()
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        import torch

        torch.cuda.set_device(local)
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none") + "-" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if dist.is_initialized():
        store = distributed_c10d._get_default_store()
    else:
        if rank or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # rank 0 hosts the store otherwise
            _await_listener(rank, at, timeout_s)
        try:  # the store torch's env:// rendezvous gives (torchrun's agent store, or one rank 0 hosts)
            with _torch_log_held():
                store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=size,
                                                   timeout=timedelta(seconds=timeout_s)))
        except (RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise CkptbenchError(f"rank {rank}: cannot reach the rendezvous at {at} ({first}); check that every rank "
                                 "was started") from None
    # one namespace per run: keys from an earlier run on a long-lived store (torchrun's agent) are not ours
    world = World(rank, size, local, socket.gethostname(), backend, store, timeout_s, f"ckptbench/{run}")
    if not dist.is_initialized():
        # every rank arrives before the process group is built: its constructor would wait for a missing rank
        # with no name to give; this names it
        world.barrier("joined")
        try:
            with _torch_log_held():
                dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                        timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise CkptbenchError(f"rank {rank}: cannot join the process group ({first}); check MASTER_ADDR, "
                                 "MASTER_PORT and that every rank was started") from None
    return world


def leave(world: World) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
