"""The device stage: the restored state moved to a GPU (pinned host memory, asynchronous copies)."""

from __future__ import annotations

from ckptbench.core.errors import CkptbenchError


def check_device(device: str) -> None:
    """Before any work: cpu, or cuda[:N] on a box that has it."""
    if device == "cpu":
        return
    name, _, index = device.partition(":")
    if name != "cuda" or (index and not (index.isascii() and index.isdigit() and len(index) <= 4)):  # int('²') raises
        raise CkptbenchError(f"--device {device!r}: use cpu or cuda[:N]")
    import torch

    if not torch.cuda.is_available():
        raise CkptbenchError(f"--device {device}: no CUDA device here; use --device cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise CkptbenchError(f"--device {device}: this box has {torch.cuda.device_count()} GPU(s)")


SLOTS = 4  # staging slots: the CPU fills one while the copy engine reads the others
SLOT_BYTES = 32 << 20  # a slot's fill by torch's parallel copy is ~1 ms on a GPU node: its event wait is noise


class HostRing:
    """Tensors moved to `device` through a few reused staging slots (pinned on a GPU): each tensor's bytes are copied
    into the current slot and sent from there asynchronously, and a slot is refilled only once its event says the
    device has read it. Per-tensor `pin_memory()` (what this stage did before) page-locks fresh host memory for every
    tensor, the whole state once more; a pageable copy stages through the driver's own buffers one call at a time.
    Which is fastest is measured on a GPU node (bench/device_checks.py, h2d-ring). Moved tensors are contiguous
    copies, independent of their sources."""

    def __init__(self, device: str, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES):
        import torch

        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"
        # pinned only on a GPU: a CPU destination (the ring's own tests) has no page-locking and no copy engine
        self.slots = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=self.gpu) for _ in range(slots)]
        self.events = [torch.cuda.Event() if self.gpu else None for _ in range(slots)]
        self.size, self.cur, self.fill = slot_bytes, 0, 0
        self.turns = 0  # slots handed over and refilled: what the tests count
        self.moved = 0  # bytes

    def move(self, t):
        """`t` on the device: a new contiguous tensor of its dtype and shape."""
        import torch

        if not t.is_cpu or t.layout != torch.strided or t.is_quantized:
            return t.to(self.device)  # not plain host bytes to stage: torch moves it whole
        src = t.contiguous()
        out = torch.empty(src.shape, dtype=src.dtype, device=self.device)
        if src.numel():
            self._put(src.reshape(-1).view(torch.uint8), out.reshape(-1).view(torch.uint8))
        return out

    def _put(self, src, dst) -> None:
        off, n = 0, src.numel()
        while off < n:
            if self.fill == self.size:
                self._next()
            k = min(n - off, self.size - self.fill)
            slot = self.slots[self.cur][self.fill:self.fill + k]
            slot.copy_(src[off:off + k])
            dst[off:off + k].copy_(slot, non_blocking=self.gpu)
            self.fill, off = self.fill + k, off + k
        self.moved += n

    def _next(self) -> None:
        """Hands the current slot to the device and takes the next, once the device has read what it held."""
        if self.gpu:
            self.events[self.cur].record()
        self.cur, self.fill = (self.cur + 1) % len(self.slots), 0
        self.turns += 1
        if self.gpu:
            self.events[self.cur].synchronize()  # never recorded yet: returns at once

    def finish(self) -> None:
        """Every copy landed (the clock stops after this)."""
        if self.gpu:
            import torch

            torch.cuda.synchronize(self.device)


def to_device(restored, device: str, notes: dict) -> None:
    import torch

    if device == "cpu" or restored is None:
        notes["device"] = "cpu: nothing to move"
        return
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CkptbenchError(f"--device {device}: no CUDA device here; use --device cpu")
    r, ring = restored, HostRing(device)
    for module_tensor in list(r.model.parameters()):
        module_tensor.data = ring.move(module_tensor.data)
    for st in r.optimizer.state.values() if r.optimizer else ():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                st[k] = ring.move(v)
    for name, m in r.master.items():
        m.data = ring.move(m.data)
    ring.finish()
    notes["device"] = ring_note(ring)


def ring_note(ring: HostRing) -> str:
    return (f"{ring.moved / 1e9:.3f} GB to {ring.device} through {len(ring.slots)} reused "
            f"{'pinned ' if ring.gpu else ''}{ring.size >> 20} MiB slots (asynchronous copies, synchronized)")
