"""One-time costs of a process (imports, torch's first operations), paid before any restore's clock starts.

A restore timed in a fresh process would otherwise charge a second of imports and first-call set-up to its
load stage and point at the wrong bottleneck. The warm-up restores a tiny model in memory through the same
code (formats, meta-device build, assign, optimizer, forward step) and is reported apart from the RTO.
"""

from __future__ import annotations

import io
import threading
import time

_lock = threading.Lock()
_done = False


def warm_up() -> float:
    """Seconds spent warming up this process: the first call does the work, later calls return 0.0."""
    global _done
    with _lock:
        if _done:
            return 0.0
        t0 = time.perf_counter()
        _tiny_restore()
        _done = True
        return time.perf_counter() - t0


def _tiny_restore() -> None:
    import safetensors.torch
    import torch
    import torch.distributed.checkpoint  # noqa: F401  (its import alone takes a large share)

    from ckptbench.restore import load as restore
    from ckptbench.checkpoint.formats import CheckpointState, dcp_format, safetensors_format, torch_format  # noqa: F401
    from ckptbench.checkpoint.model import GPT, master_optimizer
    from ckptbench.checkpoint.profiles import ModelDims

    dims = ModelDims(layers=1, hidden=16, heads=2, vocab=64, seq_len=8)
    torch.manual_seed(0)
    model = GPT(dims).to(torch.bfloat16)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, master, names = master_optimizer(model)
    optim = {n: {"master": master[n].detach(), "exp_avg": torch.zeros_like(master[n]),
                 "exp_avg_sq": torch.zeros_like(master[n])} for n in names}
    blob = bytearray(safetensors.torch.save(weights))
    state = safetensors_format.load_buffer(blob, "model.safetensors")
    saved = io.BytesIO()
    torch.save(weights, saved)
    torch_format.load_buffer(bytearray(saved.getvalue()), "warmup.pt")
    state = CheckpointState(state.model, optim, step=1)
    restored = restore.restore(state, dims, "bfloat16")
    restore.check(restored, None)
    restore.structural_check(state)
