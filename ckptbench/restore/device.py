"""The device stage: the restored state moved to a GPU (pinned host memory, asynchronous copies)."""

from __future__ import annotations

from ckptbench.core.errors import CkptbenchError


def check_device(device: str) -> None:
    """Before any work: cpu, or cuda[:N] on a box that has it."""
    if device == "cpu":
        return
    name, _, index = device.partition(":")
    if name != "cuda" or (index and not index.isdigit()):
        raise CkptbenchError(f"--device {device!r}: use cpu or cuda[:N]")
    import torch

    if not torch.cuda.is_available():
        raise CkptbenchError(f"--device {device}: no CUDA device here; use --device cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise CkptbenchError(f"--device {device}: this box has {torch.cuda.device_count()} GPU(s)")


def to_device(restored, device: str, notes: dict) -> None:
    import torch

    if device == "cpu" or restored is None:
        notes["device"] = "cpu: nothing to move"
        return
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CkptbenchError(f"--device {device}: no CUDA device here; use --device cpu")
    r = restored
    # pinned host memory makes the copy a DMA the GPU can overlap
    for module_tensor in list(r.model.parameters()):
        module_tensor.data = module_tensor.data.pin_memory().to(device, non_blocking=True)
    for st in r.optimizer.state.values() if r.optimizer else ():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                st[k] = v.pin_memory().to(device, non_blocking=True)
    for name, m in r.master.items():
        m.data = m.data.pin_memory().to(device, non_blocking=True)
    torch.cuda.synchronize()
