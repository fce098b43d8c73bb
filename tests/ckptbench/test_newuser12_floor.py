"""Round 12 of trying ckptbench as a new user: the floor's notes and figures."""

from __future__ import annotations

import os

from clirun import run_cli


def test_a_checkpoint_too_small_to_measure_is_not_sent_to_remeasure(tmp_path, ckpt, plant_floor):
    """`floor` of a 38 MiB checkpoint on a mount whose storage figure came from a larger one said "`--remeasure`
    reads this checkpoint's"; doing so read its files cold (evicting them) and kept the mount's figure all the
    same: the note says the mount's figure is the one used, and why."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "shard.bin").write_bytes(os.urandom(1 << 20))
    plant_floor(source=big, storage_gbps=2.0)  # the mount's figure, kept from another checkpoint's full sample
    r = run_cli("floor", ckpt("safetensors", 1))
    assert r.rc == 0, r.err
    assert "--remeasure` reads this checkpoint's" not in r.out, r.out
    assert "measure latency more than bandwidth, so the mount's is the one used" in r.out, r.out
