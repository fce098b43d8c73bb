"""Round 12 of trying ckptbench as a new user: the read path as it is explained."""

from __future__ import annotations


def test_a_part_cached_read_is_not_called_cold(tmp_path):
    """`run --cache as-is` with 42 % of the bytes cached said "read path: direct (cold: 42 % of the bytes in the
    page cache ...)"; a read with none cached is still plain "cold"."""
    from ckptbench.system import readmode

    disk = tmp_path / "shard.bin"
    disk.write_bytes(b"\0" * 10000)
    part = readmode.choose([(str(disk), 10000)], 0.42, 1 << 20)
    if part.mode != "direct":  # a filesystem without O_DIRECT (tmpfs): no cold read to name
        return
    assert readmode.short(part.why) == "mostly cold" and "42 %" in part.why and "(under half)" in part.why, part.why
    assert readmode.short(readmode.choose([(str(disk), 10000)], 0.0, 1 << 20).why) == "cold"
