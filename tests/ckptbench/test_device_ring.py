"""The device stage's staging ring: every tensor's bytes arrive whole and in order through the reused slots, whatever
its size against a slot's (several tensors in one slot, one tensor over several, the ring wrapping round). On this
box the destination is the CPU (no GPU: no pinning, no events); a GPU node runs the same code to cuda in
bench/device_checks.py (h2d-ring), against per-tensor pin_memory and pageable copies."""

from __future__ import annotations

import torch

from ckptbench.restore.device import HostRing, ring_note


def _tensors():
    g = torch.Generator().manual_seed(7)
    return [
        torch.randn(3000, generator=g),  # 12 000 B: several share a slot
        torch.randn(50, 70, generator=g, dtype=torch.float64),  # 28 000 B: spans a slot boundary
        torch.randint(0, 255, (100_001,), generator=g, dtype=torch.uint8),  # over several slots, odd length
        torch.randn(4, 5, generator=g).to(torch.bfloat16),
        torch.rand(999, generator=g) > 0.5,  # bool
        torch.randn(0, 8, generator=g),  # empty
        torch.tensor(3.25),  # a 0-d scalar
        torch.randn(64, 32, generator=g).t(),  # not contiguous
        torch.arange(10, dtype=torch.int64)[::3],  # strided view
    ]


def test_every_tensor_arrives_whole_through_a_small_ring():
    ring = HostRing("cpu", slots=3, slot_bytes=16 << 10)
    srcs = _tensors()
    moved = [ring.move(t) for t in srcs]
    ring.finish()
    for src, out in zip(srcs, moved):
        assert out.dtype == src.dtype and out.shape == src.shape and out.is_contiguous()
        assert torch.equal(out, src)
    assert ring.moved == sum(t.numel() * t.element_size() for t in srcs)
    assert ring.turns >= ring.moved // (16 << 10) > len(ring.slots)  # it wrapped round, more than once


def test_moved_tensors_own_their_bytes():
    """A slot is reused at once: a moved tensor must not be a view of it, nor of its source."""
    ring = HostRing("cpu", slots=2, slot_bytes=4096)
    a, b = torch.ones(2048), torch.full((2048,), 2.0)
    ma, mb = ring.move(a), ring.move(b)
    a.zero_()
    for s in ring.slots:
        s.fill_(0xFF)
    assert torch.equal(ma, torch.ones(2048)) and torch.equal(mb, torch.full((2048,), 2.0))


def test_the_note_says_what_moved_and_how():
    ring = HostRing("cpu", slots=2, slot_bytes=1 << 20)
    ring.move(torch.zeros(1 << 18))
    note = ring_note(ring)
    assert note.startswith("0.001 GB to cpu through 2 reused 1 MiB slots") and "pinned" not in note


def test_what_is_not_plain_bytes_is_moved_whole_by_torch():
    ring = HostRing("cpu", slots=2, slot_bytes=4096)
    t = torch.randn(4, 4).to_sparse()
    out = ring.move(t)
    assert ring.moved == 0 and out.layout == t.layout and torch.equal(out.to_dense(), t.to_dense())
