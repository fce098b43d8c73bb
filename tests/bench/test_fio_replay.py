"""The restore benchmark sets our read stage against fio replaying the same reads: check that fio really
reads every byte of a mixed-size set (a bs-based job file skips files smaller than bs and partial tails)."""

from __future__ import annotations

import os
import shutil

import pytest

import _peers

SIZES = [0, 1, 4095, 4096, 70_000, (1 << 20) - 1, 1 << 20, 3 * (1 << 20) + 7, 5 * (1 << 20)]


def _files(tmp_path, sizes=SIZES):
    out = []
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i:02d}.bin"
        p.write_bytes(os.urandom(size))
        out.append((str(p), size))
    return out


def test_plan_covers_every_byte_once_in_chunk_units(tmp_path):
    files = _files(tmp_path)
    plan = _peers.replay_plan(files, jobs=3, block=1 << 18, chunk=1 << 20)
    assert len(plan) == 3
    seen: dict[str, list[tuple[int, int]]] = {}
    for units in plan:
        for path, off, length in units:
            assert off % (1 << 20) == 0 and 0 < length <= 1 << 20
            seen.setdefault(path, []).append((off, length))
    for path, size in files:
        spans = sorted(seen.get(path, []))
        covered = 0
        for off, length in spans:
            assert off == covered, (path, spans)  # no gap, no overlap
            covered += length
        assert covered == size
    loads = [sum(n for _, _, n in units) for units in plan]
    assert max(loads) - min(loads) <= 1 << 20  # largest-first onto the lightest job


def test_iolog_reads_in_blocks_with_a_short_last_read():
    text = _peers.iolog([("/d/a", 0, 10), ("/d/b", 4, 9)], block=4)
    assert text.splitlines() == [
        "fio version 2 iolog", "/d/a add", "/d/b add",
        "/d/a open", "/d/a read 0 4", "/d/a read 4 4", "/d/a read 8 2", "/d/a close",
        "/d/b open", "/d/b read 4 4", "/d/b read 8 4", "/d/b read 12 1", "/d/b close",
    ]


def test_paths_fio_cannot_name_are_refused(tmp_path):
    with pytest.raises(ValueError, match="space"):
        _peers.run_fio_replay("fio", [(str(tmp_path / "a b"), 1)], jobs=1, block=4096, chunk=4096)


def test_fio_replays_every_byte(tmp_path):
    fio = shutil.which("fio")
    assert fio, "fio is needed (make test installs it: apt-get install fio)"
    files = _files(tmp_path)
    timed, extra = _peers.run_fio_replay(fio, files, jobs=3, block=1 << 18, chunk=1 << 20)
    assert timed.bytes == sum(s for _, s in files)
    assert timed.seconds >= 0 and extra["jobs"] == 3 and extra["groups"] == 1

