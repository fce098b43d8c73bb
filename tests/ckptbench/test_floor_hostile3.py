"""The size-class and GPU-link figures under hostile input: a planted floor.json's odd populate_at_ keys, a source
listed far larger than the box can populate, a container's memory limit, a GPU another process holds."""

from __future__ import annotations

import json
import os
import sys
import time
from types import SimpleNamespace

import pytest

from ckptbench.system import ceilings
from ckptbench.system import floor as fl
from floorhelp import fixed_floor as _floor

GiB = 1 << 30


def _entry(gbps: float = 4.0, **change) -> dict:
    return {"gbps": gbps, "min_gbps": gbps, "max_gbps": gbps, "method": "planted", "measured_at": time.time() - 60,
            **change}


def _plant(extra: dict) -> None:
    doc = {"schema": fl.SCHEMA, "box": fl.box_key(), "storage": {},
           "ceilings": {k: _entry() for k in fl.BOX_FIGURES} | extra}
    os.makedirs(os.path.dirname(fl.cache_path()), exist_ok=True)
    with open(fl.cache_path(), "w") as f:
        json.dump(doc, f)


@pytest.mark.parametrize("digits", ["\u00b2", "\u0663", "\u00b9\u00b2", "01024", "00000001", "0"])
def test_a_size_key_is_ascii_digits_as_the_floor_writes_them(digits):
    """'²'.isdigit() is True and int('²') raises; '٣' and '01024' parse but the floor never writes them."""
    assert fl.large_size(f"populate_at_{digits}m") == 0
    assert not fl.known_figure(f"populate_at_{digits}m")
    assert fl.large_size("populate_at_1024m") == GiB


def test_a_planted_superscript_key_is_no_traceback_in_any_command(tmp_path, h, ckpt):
    _plant({"populate_at_\u00b2m": _entry()})
    f = fl.cached()
    assert f is not None and "populate_at_\u00b2m" not in f.ceilings
    root = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "ck")
    r = h.run_cli("sysinfo", root)
    assert r.rc == 0 and "Traceback" not in r.err, r.err


def test_a_key_that_collides_with_a_size_class_does_not_stand_for_it():
    """populate_at_01024m read as 1 GiB would replace the real populate_at_1024m (the last one in the file wins)."""
    _plant({"populate_at_1024m": _entry(5.0, sample_bytes=GiB), "populate_at_01024m": _entry(0.001, sample_bytes=GiB)})
    f = fl.cached()
    assert f is not None and fl.populate_gbps(f, GiB) == 5.0


def test_a_size_figure_whose_sample_is_not_its_size_is_not_used():
    f = _floor(populate_4k=5.0, copy=10.0)
    f.ceilings["populate_at_4096m"] = fl.Ceiling(2.0, 2.0, 2.0, "planted", time.time(), sample_bytes=0)
    assert fl.populate_gbps(f, 4 * GiB) == 5.0
    assert "measured at 0 MiB" not in fl.size_note(f, 4 * GiB)


def _cgroup(tmp_path, limit: int, used: int) -> str:
    (tmp_path / "memory.max").write_text(f"{limit}\n")
    (tmp_path / "memory.current").write_text(f"{used}\n")
    return str(tmp_path)


def test_the_size_class_sample_minds_a_containers_memory_limit(tmp_path, monkeypatch):
    """psutil sees the box, not the container: a 16 GiB sample in a container with less left is an OOM kill."""
    import psutil

    monkeypatch.setattr(ceilings, "LARGE_MIN", 32 << 20)  # the real path, at a size a test can afford
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=1 << 40, total=real.total))
    monkeypatch.setattr(ceilings, "CGROUP", _cgroup(tmp_path, 100 << 20, 36 << 20))  # 64 MiB left
    c, held = ceilings.populate_large(64 << 20, cores=1)
    try:
        assert held is not None and len(held) == 32 << 20 and c.sample_bytes == 32 << 20  # half of what is left
    finally:
        held.close()
    monkeypatch.setattr(ceilings, "CGROUP", _cgroup(tmp_path, 100 << 20, 60 << 20))  # 40 MiB left: 20 to spare
    assert ceilings.populate_large(64 << 20, cores=1) == (None, None)


def test_a_size_class_the_box_cannot_come_near_is_not_populated(monkeypatch):
    """A source listed at 1 TiB (a sparse file) had half the box's available memory populated on every `floor`, for
    a figure no restore of that size is held to (it is not within a factor of two of the class)."""
    import psutil

    monkeypatch.setattr(ceilings, "LARGE_MIN", 32 << 20)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=80 << 20))
    populated = []
    monkeypatch.setattr(ceilings, "populate", lambda region, n, start=0, length=None:
                        populated.append(len(region) - start if length is None else length) or (1e9, "x"))
    assert ceilings.populate_large(1 << 40, cores=1) == (None, None) and populated == []
    c, held = ceilings.populate_large(64 << 20, cores=1)  # 40 MiB free for a 64 MiB class: in whole LARGE_MINs, 32
    held.close()
    assert c.sample_bytes == 32 << 20 and populated == [32 << 20]  # within a factor of two: it serves the class


def test_a_size_the_box_could_only_come_near_is_measured_once_not_on_every_floor(tmp_path, monkeypatch):
    import json
    import time

    import psutil

    monkeypatch.setattr(ceilings, "LARGE_MIN", 32 << 20)
    total = psutil.virtual_memory().total
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=150 << 20, total=total))  # 64
    monkeypatch.setattr(ceilings, "populate", lambda region, n, *at: (1e9, "x"))
    measured = []
    real = ceilings.populate_large
    monkeypatch.setattr(fl, "populate_large", lambda nbytes, cores=None: measured.append(nbytes) or real(nbytes, 1))
    cache = str(tmp_path / "floor.json")
    entry = {"gbps": 5.0, "min_gbps": 5.0, "max_gbps": 5.0, "method": "planted", "measured_at": time.time()}
    with open(cache, "w") as f:
        json.dump({"schema": fl.SCHEMA, "box": fl.box_key(), "storage": {},
                   "ceilings": {k: entry for k in fl.BOX_FIGURES}}, f)
    fl.measure(path=cache, restore_bytes=128 << 20)  # a 128 MiB class; the box reaches 64
    again = fl.measure(path=cache, restore_bytes=128 << 20)
    assert len(measured) == 1 and "populate_at_64m" in again.ceilings
    assert fl.populate_gbps(again, 128 << 20) == pytest.approx(1.0)  # the 64 MiB figure serves the 128 MiB restore


def test_a_gpu_another_process_holds_is_a_note_not_a_traceback(tmp_path, monkeypatch):
    """The box a restore is benchmarked on is often one whose GPU is in use: torch's out-of-memory (a
    RuntimeError) took the whole `floor` with it, its other figures unsaved."""

    def oom(*_, **__):
        raise RuntimeError("CUDA out of memory. Tried to allocate 256.00 MiB\nmore lines")

    fake = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True, get_device_name=lambda i: "x"),
                           empty=oom, ones=oom, uint8="uint8")
    monkeypatch.setitem(sys.modules, "torch", fake)
    box = {k: fl.Ceiling(2.0, 2.0, 2.0, "m", time.time()) for k in fl.BOX_FIGURES}
    monkeypatch.setattr(fl, "memory_ceilings", lambda size=0, **_: dict(box))
    monkeypatch.setattr(fl, "cpu_ceilings", lambda: {})
    monkeypatch.setattr(fl, "box_key", lambda: {"cores": 2, "gpus": ["NVIDIA H200"]})
    f = fl.measure(path=str(tmp_path / "floor.json"))
    assert not set(fl.DEVICE_FIGURES) & set(f.ceilings) and f.kept
    assert any("out of memory" in n and "\n" not in n for n in f.notes), f.notes
