"""The ranks of a distributed restore, as torchrun starts them: the process group, and the exchanges between
ranks — each with a deadline, so a rank that failed or hangs is named and no rank waits forever.

The exchanges go through the group's key-value store (the one torchrun's rendezvous made): a rank posts under
its own key, the waiting side polls for the keys it needs until the deadline and, when it passes, knows exactly
which ranks never posted. A collective would only say that it timed out.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

from ckptbench.errors import CkptbenchError

POLL_S = 0.02
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

    def gather(self, *parts, deadline_s: float | None = None) -> dict[int, object]:
        """Every rank's post under `parts`; RankFailure naming the ranks that had not posted by the deadline."""
        keys = {r: self.key(*parts, r) for r in range(self.size)}
        limit = time.monotonic() + (self.timeout_s if deadline_s is None else deadline_s)
        waiting = dict(keys)
        while waiting:
            waiting = {r: k for r, k in waiting.items() if not self.store.check([k])}
            if not waiting:
                break
            if time.monotonic() > limit:
                names = ", ".join(str(r) for r in sorted(waiting))
                raise RankFailure(f"rank(s) {names} did not reach '{parts[-1]}' within "
                                  f"{self.timeout_s if deadline_s is None else deadline_s:g} s: failed, hung or "
                                  "killed (see that rank's own output); raise --rank-timeout if it is only slow")
            time.sleep(POLL_S)
        return {r: json.loads(self.store.get(k)) for r, k in keys.items()}

    def wait_for(self, *parts, deadline_s: float | None = None):
        """The value rank 0 posted under `parts`, waiting for it up to the deadline."""
        k = self.key(*parts)
        limit = time.monotonic() + (self.timeout_s if deadline_s is None else deadline_s)
        while not self.store.check([k]):
            if time.monotonic() > limit:
                raise RankFailure(f"rank 0 did not post '{parts[-1]}' within {self.timeout_s:g} s: it failed or "
                                  "hangs (see its output)")
            time.sleep(POLL_S)
        return json.loads(self.store.get(k))

    def barrier(self, name: str, value=True, deadline_s: float | None = None) -> dict[int, object]:
        """Every rank posts `value` and waits for all the others' (which it returns)."""
        self.post(value, name, self.rank)
        return self.gather(name, deadline_s=deadline_s)


def under_torchrun() -> bool:
    return all(k in os.environ for k in _ENV)


def _int_env(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None and default is not None:
        return default
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise CkptbenchError(f"{name}={raw!r} in the environment: not a whole number; start the ranks with "
                             "torchrun") from None


def join(device: str, timeout_s: float) -> World:
    """This process's place in the group torchrun started: the process group (nccl for a CUDA device, gloo
    otherwise) initialized with `timeout_s` on every collective, and the store the ranks talk through."""
    if not under_torchrun():
        missing = [k for k in _ENV if k not in os.environ]
        raise CkptbenchError(f"--distributed runs one process per rank under torchrun (missing {', '.join(missing)}"
                             "): torchrun --nproc-per-node K -m ckptbench run SOURCE --distributed")
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    rank, size = _int_env("RANK"), _int_env("WORLD_SIZE")
    local = _int_env("LOCAL_RANK", rank)
    if not 0 <= rank < size:
        raise CkptbenchError(f"RANK={rank} is outside WORLD_SIZE={size}; start the ranks with torchrun")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        import torch

        torch.cuda.set_device(local)
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise CkptbenchError(f"rank {rank}: cannot join the process group ({first}); check MASTER_ADDR, "
                                 "MASTER_PORT and that every rank was started") from None
    store = distributed_c10d._get_default_store()  # the rendezvous store every rank already shares
    # one namespace per run: keys from an earlier run on a long-lived store (torchrun's agent) are not ours
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none") + "-" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return World(rank, size, local, socket.gethostname(), backend, store, timeout_s, f"ckptbench/{run}")


def leave(world: World) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
