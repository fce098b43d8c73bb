"""The floor: the model's arithmetic with fixed rates, a real measurement of this box (small), and a cache that is
used only when it is this box's, this mount's and fresh."""

from __future__ import annotations

import json
import os
import time

import pytest

from ckptbench.system import floor as fl


def _floor(**gbps) -> fl.Floor:
    now = time.time()
    f = fl.Floor({"cores": 2})
    for k, v in gbps.items():
        c = fl.Ceiling(v, v, v, "fixed", now)
        if k == "storage":
            c.sample_bytes = fl.STORAGE_SAMPLE
            f.storage = c
        else:
            f.ceilings[k] = c
    return f


def test_the_floor_is_the_largest_resource_time_and_names_it():
    f = _floor(storage=2.0, populate_4k=1.0, populate_thp=4.0, hash_crc32c=5.0, scan=10.0)
    m = fl.model(f, bytes_read=8 * 10**9, floating_bytes=8 * 10**9, hash_alg="crc32c")
    assert m["times_s"] == pytest.approx({"storage": 4.0, "fresh memory": 2.0, "cpu": (1.6 + 0.8) / 2})
    assert m["binding"] == "storage" and m["floor_s"] == pytest.approx(4.0)
    slow_memory = _floor(storage=8.0, populate_4k=0.5, populate_thp=1.0)
    m = fl.model(slow_memory, bytes_read=8 * 10**9)
    assert m["binding"] == "fresh memory" and m["floor_s"] == pytest.approx(8.0)  # the faster of 4 KiB and THP
    reused = fl.model(slow_memory, bytes_read=8 * 10**9, destination=fl.REUSED)
    assert reused["binding"] == "storage" and "fresh memory" not in reused["times_s"]
    assert fl.efficiency(4.0, 5.0) == pytest.approx(0.8) and fl.efficiency(None, 5.0) is None
    hot = fl.model(_floor(storage=2.0, copy=8.0, populate_4k=1.0), bytes_read=8 * 10**9, hot=True)
    assert hot["times_s"] == pytest.approx({"page cache": 1.0, "fresh memory": 8.0})  # a copy, not the device
    small = _floor(storage=0.2, populate_4k=1.0)
    small.storage.sample_bytes = 1 << 20  # a latency-bound sample is no bandwidth figure
    assert "storage" not in fl.model(small, bytes_read=10**9)["times_s"]


def test_a_real_measurement_of_this_box_on_a_tmpfs_file(tmp_path):
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    data = os.path.join(shm, f"ckptbench-floor-{os.getpid()}")
    with open(data, "wb") as f:
        f.write(os.urandom(8 << 20))
    try:
        cache = str(tmp_path / "floor.json")
        t0 = time.monotonic()
        f = fl.measure([(data, 8 << 20)], "tmpfs", path=cache, size=32 << 20)
        assert time.monotonic() - t0 < 60
        for key in ("populate_4k", "populate_thp", "copy", "scan", "hash_crc32c", "hash_md5"):
            c = f.ceilings[key]
            assert 0 < c.min_gbps <= c.gbps <= c.max_gbps and c.method and c.age_s < 60, key
        assert f.storage is not None and f.storage.gbps > 0 and not f.cached
        again = fl.measure([(data, 8 << 20)], "tmpfs", path=cache, size=32 << 20)
        assert again.cached and again.ceilings["copy"].gbps == f.ceilings["copy"].gbps
        assert again.storage.measured_at == f.storage.measured_at  # the mount's figure, from the cache
    finally:
        os.unlink(data)


def test_a_stale_or_foreign_cache_is_measured_again_not_used(tmp_path, monkeypatch):
    cache = str(tmp_path / "floor.json")
    now = time.time()
    entry = {"gbps": 99.0, "min_gbps": 99.0, "max_gbps": 99.0, "method": "planted", "measured_at": now}
    keys = ("populate_4k", "populate_thp", "copy", "scan", *(f"hash_{a}" for a in ("crc32c", "xxh64", "md5",
                                                                                   "sha256")))
    monkeypatch.setattr(fl, "memory_ceilings", lambda size=0: {k: fl.Ceiling(1.0, 1.0, 1.0, "measured", now)
                                                               for k in keys[:3]})
    monkeypatch.setattr(fl, "cpu_ceilings", lambda: {k: fl.Ceiling(1.0, 1.0, 1.0, "measured", now) for k in keys[3:]})

    def plant(box, at):
        with open(cache, "w") as f:
            json.dump({"schema": fl.SCHEMA, "box": box, "ceilings": {k: entry | {"measured_at": at} for k in keys},
                      "storage": {}}, f)

    plant(fl.box_key(), now)
    assert fl.measure(path=cache).ceilings["copy"].gbps == 99.0  # this box's, fresh: used
    plant(fl.box_key() | {"kernel": "another"}, now)
    assert fl.measure(path=cache).ceilings["copy"].gbps == 1.0  # another box's: measured again
    plant(fl.box_key(), now - 2 * fl.MAX_AGE_S)
    assert fl.measure(path=cache).ceilings["copy"].gbps == 1.0  # stale: measured again
    plant(fl.box_key(), now)
    assert fl.measure(path=cache, remeasure=True).ceilings["copy"].gbps == 1.0  # asked: measured again


def test_the_floor_command_measures_once_then_says_it_is_cached(tmp_path, monkeypatch, h):
    import json as _json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "ck"
    root.mkdir()
    from safetensors.torch import save_file
    import torch

    save_file({"w": torch.randn(256, 256)}, str(root / "model.safetensors"))
    r = h.run_cli("floor", root, "--json")
    assert r.rc == 0, r.err
    doc = _json.loads(r.out)
    assert not doc["cached"] and doc["storage"]["gbps"] > 0 and doc["restore"]["binding"] in doc["restore"]["times_s"]
    assert doc["restore"]["floor_s"] == max(doc["restore"]["times_s"].values())
    r = h.run_cli("floor", root)
    assert r.rc == 0 and "(cached figures)" in r.out and "bound by" in r.out, r.out
    assert (tmp_path / "cache" / "ckptbench" / "floor.json").is_file()


def test_a_run_document_carries_its_floor_or_says_it_is_not_measured(tmp_path, monkeypatch, h, ckpt):
    import json as _json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = _json.loads(r.out)
    assert doc["floor_s"] is None and doc["efficiency"] is None and "ckptbench floor" in doc["floor_note"]
    now = time.time()
    c = {"gbps": 4.0, "min_gbps": 4.0, "max_gbps": 4.0, "method": "planted", "measured_at": now}
    keys = ("populate_4k", "populate_thp", "copy", "scan", "hash_crc32c", "hash_xxh64", "hash_md5", "hash_sha256")
    os.makedirs(tmp_path / "cache" / "ckptbench")
    with open(tmp_path / "cache" / "ckptbench" / "floor.json", "w") as f:
        _json.dump({"schema": fl.SCHEMA, "box": fl.box_key(), "ceilings": {k: c for k in keys}, "storage": {}}, f)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--cache", "hot", "--results", tmp_path / "R.csv")
    doc = _json.loads(r.out)
    assert doc["binding"] in doc["floor_times_s"] and doc["floor_s"] == max(doc["floor_times_s"].values())
    assert doc["floor_s"] == pytest.approx(doc["bytes"] / 4e9, rel=0.5)  # the page cache's copy, at 4 GB/s
    assert doc["efficiency"] == pytest.approx(doc["floor_s"] / doc["rto_s"])
    r = h.run_cli("run", root, "--repeat", "1", "--cache", "hot", "--results", tmp_path / "R.csv")
    assert "  floor " in r.out and "bound by" in r.out and "% of it" in r.out, r.out
