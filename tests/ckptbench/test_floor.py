"""The floor: the model's arithmetic with fixed rates, a real measurement of this box (small), and a cache that is
used only when it is this box's, this mount's and fresh."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from ckptbench.system import floor as fl
from floorhelp import fixed_floor as _floor
from floorhelp import held_s


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
    # a copy, not the device; into fresh memory, populating and then copying, one after the other: the parts add up
    assert hot["times_s"] == pytest.approx({"page cache": 1.0, "fresh memory": 8.0})
    assert hot["floor_s"] == pytest.approx(9.0)
    assert hot["binding"] == "fresh memory" and hot["gbps"] == pytest.approx(1.0)  # the binding part's own rate
    # from the page cache the hashing is the same cores' work as the landing: it adds (8 GB at 4 GB/s/core on 2)
    hashed = fl.model(_floor(copy=8.0, populate_4k=1.0, hash_crc32c=4.0), bytes_read=8 * 10**9, hot=True,
                      hash_alg="crc32c")
    assert hashed["floor_s"] == pytest.approx(9.0 + 1.0) and hashed["binding"] == "fresh memory"
    cold = fl.model(_floor(storage=1.0, populate_4k=9.0, hash_crc32c=4.0), bytes_read=8 * 10**9, hash_alg="crc32c")
    assert cold["floor_s"] == pytest.approx(8.0)  # the device's reads and the cores' work overlap
    into_fresh = _floor(storage=2.0, populate_4k=4.0)
    into_fresh.storage.fresh_gbps = 1.0  # the device's reads into fresh pages: slower where the two share the cores
    assert fl.model(into_fresh, bytes_read=8 * 10**9)["times_s"]["storage"] == pytest.approx(8.0)
    assert fl.model(into_fresh, bytes_read=8 * 10**9, destination=fl.REUSED)["times_s"]["storage"] == \
        pytest.approx(4.0)
    small = _floor(storage=0.2, populate_4k=1.0)
    small.storage.sample_bytes = 1 << 20  # a latency-bound sample is no bandwidth figure
    assert "storage" not in fl.model(small, bytes_read=10**9)["times_s"]


def test_a_digest_of_a_files_bytes_in_order_is_one_cores_work_per_file():
    """md5 over one file cannot be split over the cores: its floor is that file's bytes at one core's rate (a read
    of one file with md5 was held to half its floor on 2 cores and shown at 60 % of it); crc32c's chunks combine."""
    f = _floor(storage=100.0, hash_md5=0.5, hash_crc32c=0.5)
    sizes = [6 * 10**9, 10**9, 10**9]
    assert fl.largest_unit(sizes, "md5") == 6 * 10**9 and fl.largest_unit(sizes, "crc32c") == 0
    assert fl.largest_unit(sizes, "sha256", chunk=10**9) == 10**9  # per-chunk digests: a chunk is the unit
    one = fl.model(f, bytes_read=8 * 10**9, hash_alg="md5", cores=4, unit_bytes=fl.largest_unit(sizes, "md5"))
    assert one["times_s"]["cpu"] == pytest.approx(12.0)  # the 6 GB file alone, not 16 s over 4 cores = 4 s
    assert one["binding"] == "cpu" and "largest file" in one["how"] and "4 cores" not in one["how"]
    even = fl.model(f, bytes_read=8 * 10**9, hash_alg="md5", cores=4, unit_bytes=2 * 10**9)
    assert even["times_s"]["cpu"] == pytest.approx(4.0) and "on 4 cores" in even["how"]  # four 2 GB files: spread
    crc = fl.model(f, bytes_read=8 * 10**9, hash_alg="crc32c", cores=4, unit_bytes=fl.largest_unit(sizes, "crc32c"))
    assert crc["times_s"]["cpu"] == pytest.approx(4.0)


def test_a_floor_of_a_few_milliseconds_says_fixed_costs_outweigh_it():
    f = _floor(storage=2.0, populate_4k=4.0)
    tiny = fl.restore_fields(f, bytes_read=116 << 10, measured_s=0.087, hash_alg="none")
    assert tiny["floor_s"] < 0.001 and "counts the bytes alone" in tiny["floor_note"]
    big = fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none")
    assert "counts the bytes alone" not in big["floor_note"]


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
        # tmpfs cannot be evicted: its figure is the page cache's, so it was not kept and is measured again
        assert not f.storage.cold and again.storage.measured_at != f.storage.measured_at
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
    # a box figure carries no storage figure's fields (a memory ceiling read `cold: true, fresh_gbps: 0`)
    assert not {"cold", "fresh_gbps", "hot_gbps", "sample_bytes"} & set(doc["ceilings"]["copy"]), doc["ceilings"]
    assert {"cold", "fresh_gbps", "sample_bytes"} <= set(doc["storage"])
    # the floor of a run that scans every floating byte (no model step): the scan is on the cores, so it is more
    assert doc["restore"]["floor_s_structural"] >= doc["restore"]["floor_s"]
    # what `run --cache hot` is held to, beside the cold floor (a new user saw one floor and a run held to another)
    assert doc["restore"]["floor_s_hot"] == fl.model(fl.cached(doc["mount"]), bytes_read=doc["restore"]["bytes"],
                                                     hash_alg=doc["restore"]["hash"], hot=True)["floor_s"]
    r = h.run_cli("floor", root)
    assert r.rc == 0 and "(cached figures)" in r.out and "bound by" in r.out, r.out
    assert "cold floor" in r.out and "from the page cache (--cache hot): floor" in r.out, r.out
    # a 256 KiB sample gives no storage figure: the cold floor says it counts memory and CPU only (it read as a cold
    # floor under the hot one, unexplained)
    cold = next(ln for ln in r.out.splitlines() if "cold floor" in ln)
    assert ("(no storage figure: memory and CPU only" in cold) == (not fl.storage_usable(fl.cached(doc["mount"]))), cold
    # the hot floor's parts, printed, add up to it (a new user was told they do and shown none)
    hot = next(ln for ln in r.out.splitlines() if "(--cache hot)" in ln)
    parts = [float(x) for x in re.findall(r"(\d+\.\d+) s", hot.split("; ")[1])]
    assert len(parts) >= 2 and sum(parts) == pytest.approx(doc["restore"]["floor_s_hot"], abs=0.002), hot
    assert set(doc["restore"]["times_s_hot"]) >= {"fresh memory"} and doc["restore"]["binding_hot"], doc["restore"]
    storage_row = next(ln for ln in r.out.splitlines() if ln.lstrip().startswith("storage "))
    # one read (a large sample) is said so, not as a range that says 1.839..1.839; several give their range
    assert ("(one sample," in storage_row) == (" 1 read(s) each" in storage_row), storage_row
    copy_row = next(ln for ln in r.out.splitlines() if ln.lstrip().startswith("copy "))
    assert ".." in copy_row and "one sample" not in copy_row, copy_row
    assert (tmp_path / "cache" / "ckptbench" / "floor.json").is_file()


def test_a_run_document_carries_its_floor_or_says_it_is_not_measured(tmp_path, monkeypatch, h, ckpt):
    import json as _json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = _json.loads(r.out)
    assert doc["floor_s"] is None and doc["efficiency"] is None and "ckptbench floor" in doc["floor_note"]
    assert "first step" not in doc["floor_note"], doc["floor_note"]  # no efficiency, so nothing held less the step
    now = time.time()
    c = {"gbps": 4.0, "min_gbps": 4.0, "max_gbps": 4.0, "method": "planted", "measured_at": now}
    keys = ("populate_4k", "populate_thp", "copy", "scan", "hash_crc32c", "hash_xxh64", "hash_md5", "hash_sha256")
    os.makedirs(tmp_path / "cache" / "ckptbench")
    with open(tmp_path / "cache" / "ckptbench" / "floor.json", "w") as f:
        _json.dump({"schema": fl.SCHEMA, "box": fl.box_key(), "ceilings": {k: c for k in keys}, "storage": {}}, f)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--cache", "hot", "--results", tmp_path / "R.csv")
    doc = _json.loads(r.out)
    parts = doc["floor_times_s"]
    assert doc["binding"] in parts and parts[doc["binding"]] == max(parts.values())
    assert doc["floor_s"] == pytest.approx(sum(parts.values()))  # from the page cache the parts add up
    # from the page cache into fresh memory: populated at 4 GB/s, then the copy at 4 GB/s, one after the other
    landing = parts["fresh memory"] + parts["page cache"]
    assert landing == pytest.approx(doc["bytes"] / 2e9, rel=0.01) and doc["binding"] in ("fresh memory", "page cache")
    assert doc["efficiency"] == pytest.approx(doc["floor_s"] / held_s(doc))  # the RTO less its model step
    assert held_s(doc) < doc["rto_s"] and "less its first step" in doc["floor_note"]
    r = h.run_cli("run", root, "--repeat", "1", "--cache", "hot", "--results", tmp_path / "R.csv")
    assert "  floor " in r.out and "bound by" in r.out and "% of it" in r.out, r.out


def test_over_the_floor_is_said_once_after_the_model_step_clause(tmp_path, monkeypatch, h, ckpt):
    """A floor planted far too low: the over-the-floor words end the note once, with the checkpoint's path in its
    command (the step's clause went in before them by removing a suffix that still said SOURCE: it was said twice)."""
    import json as _json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    c = {"gbps": 0.01, "min_gbps": 0.01, "max_gbps": 0.01, "method": "planted", "measured_at": time.time()}
    keys = ("populate_4k", "populate_thp", "copy", "scan", "hash_crc32c", "hash_xxh64", "hash_md5", "hash_sha256")
    os.makedirs(tmp_path / "cache" / "ckptbench")
    with open(tmp_path / "cache" / "ckptbench" / "floor.json", "w") as f:
        _json.dump({"schema": fl.SCHEMA, "box": fl.box_key(), "ceilings": {k: c for k in keys}, "storage": {}}, f)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--cache", "hot", "--results", tmp_path / "R.csv")
    note = _json.loads(r.out)["floor_note"]
    assert note.count("faster than the floor") == 1 and "less its first step" in note, note
    assert note.index("less its first step") < note.index("faster than the floor") and "SOURCE" not in note, note


def test_an_s3_source_is_keyed_by_endpoint_without_credentials_and_its_figure_is_the_network():
    where = {"fs_type": "s3", "mount_point": "http://alice:hunter2@s3.example:9000/?X-Amz-Signature=abc123#frag"}
    key = fl.mount_key(where)
    assert "hunter2" not in key and "abc123" not in key and "Signature" not in key and "s3.example:9000" in key
    assert fl.mount_key(where | {"bucket": "b1"}) != fl.mount_key(where | {"bucket": "b2"})  # per bucket when named
    assert fl.resource_of(key) == "network" and fl.mount_key({"fs_type": "ext4", "mount_point": "/"}) == "/ (ext4)"
    assert fl.resource_of("/ (ext4)") == "storage" and fl.resource_of(None) == "storage"
    f = _floor(storage=0.05, populate_4k=1.0)
    f.mount = key
    m = fl.model(f, bytes_read=10**9)
    assert m["binding"] == "network" and m["times_s"]["network"] == pytest.approx(20.0)
    doc = fl.restore_fields(f, bytes_read=10**9, measured_s=25.0, hash_alg="none")
    assert doc["binding"] == "network" and doc["binding_gbps"] == 0.05 and doc["efficiency"] == pytest.approx(0.8)
    f.storage = None
    partial = fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none")
    assert "no network figure for this endpoint" in partial["floor_note"]
    # a cold restore held to memory and CPU alone read as slow as 15 %: the floor is shown, no efficiency
    assert partial["efficiency"] is None and partial["floor_s"] and "no efficiency is given" in partial["floor_note"]
    hot = fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none", hot=True)
    assert hot["efficiency"] is not None  # from the page cache the storage is not in the way


def test_an_s3_source_names_its_bucket_so_each_bucket_of_an_endpoint_has_its_own_figure(monkeypatch):
    from ckptbench.sources.s3source import S3Source

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://alice:hunter2@s3.example:9000")
    where = S3Source("s3://ckpts-eu/run7/step-100").describe()  # parses the URL only: nothing is listed
    assert where["bucket"] == "ckpts-eu" and where["fs_type"] == "s3"
    key = fl.mount_key(where)
    assert key.endswith("/ckpts-eu (s3)") and "s3.example:9000" in key and "hunter2" not in key
    assert "run7" not in key  # one figure per bucket, whatever prefix or step is restored
    assert key != fl.mount_key(S3Source("s3://ckpts-us/run7").describe()) and fl.resource_of(key) == "network"
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    assert fl.mount_key(S3Source("s3://b/x").describe()) == "AWS/b (s3)"


def test_the_link_sweep_keeps_the_best_level_and_stops_where_the_link_is_full():
    asked = []

    def read(rates):
        def one(level):
            asked.append(level)
            return rates[level]
        return one

    c, note = fl.link_ceiling(read({4: 100e6, 16: 105e6, 64: 500e6}), 128 << 20, "planted")
    assert asked == [4, 16] and c.gbps == pytest.approx(0.105) and "concurrency 16 of 4, 16" in c.method
    assert c.sample_bytes == 128 << 20 and not note
    asked.clear()
    c, note = fl.link_ceiling(read({4: 1e8, 16: 2e8, 64: 1.9e8}), 1 << 20, "planted")
    assert asked == [4, 16, 64] and c.gbps == pytest.approx(0.2) and "latency" in note  # 1 MiB: no bandwidth figure
    mib = 1 << 20
    assert fl.link_sample([("a", 200 * mib), ("b", 100 * mib), ("c", 50 * mib)]) == [("a", 200 * mib), ("c", 50 * mib)]
    assert fl.link_sample([("a", 900 * mib), ("b", 300 * mib)]) == [("b", 300 * mib)]  # none fits: the smallest
    assert fl.thread_counts(1) == [1] and fl.thread_counts(6) == [1, 2, 4, 6] and fl.thread_counts(8) == [1, 2, 4, 8]


def test_a_run_says_why_a_cached_floor_is_not_used(tmp_path, monkeypatch, h, ckpt):
    """Stale or another box's: said so, with its age, not "not measured yet" (a new user's floor of two days before
    read as never measured)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    os.makedirs(tmp_path / "cache" / "ckptbench")
    keys = ("populate_4k", "populate_thp", "copy", "scan", *(f"hash_{a}" for a in ("crc32c", "xxh64", "md5",
                                                                                   "sha256")))

    def note_with(box, at) -> str:
        c = {"gbps": 4.0, "min_gbps": 4.0, "max_gbps": 4.0, "method": "planted", "measured_at": at}
        with open(fl.cache_path(), "w") as f:
            json.dump({"schema": fl.SCHEMA, "box": box, "ceilings": {k: c for k in keys}, "storage": {}}, f)
        r = h.run_cli("run", ckpt("safetensors", 1), "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
        doc = json.loads(r.out)
        assert doc["floor_s"] is None, doc["floor_note"]
        return doc["floor_note"]

    note = note_with(fl.box_key(), time.time() - 2.5 * fl.MAX_AGE_S)
    assert "stale (measured 2.5 d ago" in note and "not measured yet" not in note, note
    note = note_with(fl.box_key() | {"kernel": "another"}, time.time())
    assert "another box's" in note and "not measured yet" not in note, note
    os.unlink(fl.cache_path())
    r = h.run_cli("run", ckpt("safetensors", 1), "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert "not measured yet" in json.loads(r.out)["floor_note"]  # no cache at all: not measured


def test_a_stale_or_foreign_network_figure_is_measured_again_not_used(tmp_path, monkeypatch):
    cache = str(tmp_path / "floor.json")
    now = time.time()
    keys = ("populate_4k", "populate_thp", "copy", "scan", *(f"hash_{a}" for a in ("crc32c", "xxh64", "md5",
                                                                                   "sha256")))
    box = {k: {"gbps": 5.0, "min_gbps": 5.0, "max_gbps": 5.0, "method": "planted", "measured_at": now} for k in keys}
    mine = fl.mount_key({"fs_type": "s3", "mount_point": "http://127.0.0.1:1"})
    calls = []

    def read(level):
        calls.append(level)
        return 50e6

    def plant(key, at, box_key=None):
        entry = {"gbps": 0.099, "min_gbps": 0.099, "max_gbps": 0.099, "method": "planted", "measured_at": at,
                 "sample_bytes": 128 << 20}
        with open(cache, "w") as f:
            json.dump({"schema": fl.SCHEMA, "box": box_key or fl.box_key(), "ceilings": box,
                       "storage": {key: entry}}, f)

    def network(mount=mine):
        calls.clear()
        f = fl.measure(mount=mount, read=read, read_bytes=100 << 20, path=cache)
        return f.storage.gbps, bool(calls)

    monkeypatch.setattr(fl, "memory_ceilings", lambda size=0: {})
    monkeypatch.setattr(fl, "cpu_ceilings", lambda: {})
    plant(mine, now)
    assert network() == (0.099, False)  # this endpoint's, fresh: used, nothing read
    assert fl.cached(mine, path=cache).storage.gbps == 0.099 and fl.cached(mine, path=cache).resource == "network"
    other = fl.mount_key({"fs_type": "s3", "mount_point": "http://127.0.0.1:2"})
    assert network(other) == (pytest.approx(0.05), True)  # another endpoint's: measured
    plant(mine, now - 2 * fl.MAX_AGE_S)
    assert network() == (pytest.approx(0.05), True)  # stale: measured again
    plant(mine, now, fl.box_key() | {"cores": -1})
    assert network() == (pytest.approx(0.05), True)  # another box's: measured again
    saved = json.load(open(cache))["storage"]
    assert saved[mine]["gbps"] == pytest.approx(0.05) and "127.0.0.1:1" in mine


def test_sysinfo_shows_the_cached_floor_and_never_measures_it(tmp_path, monkeypatch):
    from ckptbench.cli import box

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(fl, "measure", lambda *a, **k: pytest.fail("sysinfo measured the floor"))
    doc = box.cached_floor("/ (ext4)")
    assert doc["box"] == box.NOT_MEASURED and doc["storage"] == box.NOT_MEASURED and "ckptbench floor" in doc["box"]
    now = time.time()
    c = {"gbps": 4.0, "min_gbps": 4.0, "max_gbps": 4.0, "method": "planted", "measured_at": now - 7200}
    os.makedirs(tmp_path / "ckptbench")
    with open(tmp_path / "ckptbench" / "floor.json", "w") as f:
        json.dump({"schema": fl.SCHEMA, "box": fl.box_key(),
                   "ceilings": {k: c for k in fl.BOX_FIGURES} | {"populate_at_4096m": c | {"gbps": 1.0, "min_gbps": 1.0,
                                                                                          "sample_bytes": 4 << 30}},
                   "storage": {"/ (ext4)": c | {"sample_bytes": 1 << 30, "fresh_gbps": 2.0}}}, f)
    # SOURCE's size: its fresh memory at its size class, as `floor SOURCE` and `run` hold it (1 then 4 GB/s)
    assert box.cached_floor("/ (ext4)", 4 << 30)["landing_hot_gbps"] == pytest.approx(0.8)
    doc = box.cached_floor("/ (ext4)")
    assert doc["box"]["copy"]["gbps"] == 4.0 and doc["box"]["copy"]["age_s"] == pytest.approx(7200, abs=60)
    assert doc["storage"]["gbps"] == 4.0 and doc["resource"] == "storage" and doc["storage"]["fresh_gbps"] == 2.0
    assert doc["landing_hot_gbps"] == pytest.approx(2.0)  # populated at 4 GB/s, then copied into at 4
    assert box.cached_floor("/data (xfs)")["storage"] == box.NOT_MEASURED  # another mount's figure is not this one's
    with open(tmp_path / "ckptbench" / "floor.json") as f:
        kept = json.load(f)
    kept["storage"]["/ (ext4)"]["hot_gbps"] = 1.0  # this mount's page cache copies out slower than the memmove
    with open(tmp_path / "ckptbench" / "floor.json", "w") as f:
        json.dump(kept, f)
    doc = box.cached_floor("/ (ext4)")
    assert doc["storage"]["hot_gbps"] == 1.0 and doc["landing_hot_gbps"] == pytest.approx(0.8)  # 1 / (1/4 + 1/1)


def test_floor_reads_the_link_through_the_s3_client_asked_for(monkeypatch):
    import ckptbench.sources as sources
    from types import SimpleNamespace

    from ckptbench.cli import box

    asked = []

    def start_read(sample, opts, into):
        asked.append((opts.s3_client, opts.concurrency, opts.hash, into, [f.path for f in sample.files]))
        return None

    done = SimpleNamespace(result=SimpleNamespace(failed=[]), engine_gbps=0.5)
    monkeypatch.setattr(sources, "drive", lambda start: (start(), done)[1])
    import fastio

    listing = sources.Listing("s3://b/c", [fastio.FileSpec("s3://b/c/a", 100 << 20)], None, "safetensors")
    read, nbytes, what = box._link_reader(SimpleNamespace(start_read=start_read), listing, "crt")
    assert read(16) == 0.5e9 and nbytes == 100 << 20 and "(--s3-client crt)" in what
    assert asked == [("crt", 16, "none", "hash", ["s3://b/c/a"])]
    cached = fl.Ceiling(0.1, 0.1, 0.1, what, time.time(), 100 << 20)
    assert box.other_client_note(cached, "crt") == "" and box.other_client_note(None, "crt") == ""
    note = box.other_client_note(cached, "threads")
    assert note.startswith("this network figure was measured with --s3-client crt") and "--remeasure" in note
    assert box.other_client_note(fl.Ceiling(0.1, 0.1, 0.1, "read cold with pread", time.time()), "crt") == ""


def test_population_samples_are_held_within_a_budget(monkeypatch):
    """Samples are held so that none reuses another's freed pages, but never more than the budget at once."""
    from ckptbench.system import ceilings

    live, peak = [], [0]

    class Region(bytearray):
        pass

    def make():
        r = Region(1 << 20)
        live.append(r)
        peak[0] = max(peak[0], sum(map(len, live)))
        return r

    monkeypatch.setattr(ceilings, "_hold_budget", lambda: 3 << 20)
    monkeypatch.setattr(ceilings, "populate", lambda region, n, *at: (1e9 * n, "fixed"))
    rates, how, threads = ceilings._best(make, live.remove, cores=4, repeats=3)
    assert peak[0] == 3 << 20 and not live  # 5 samples (sweep), at most 3 held, every one closed at the end
    assert threads == 4 and rates == [4e9] * 3 and how == "fixed"


def test_a_sweep_repeats_the_best_count_and_any_count_that_beat_its_median():
    from ckptbench.system import ceilings

    calls = []

    def steady(n):
        calls.append(n)
        return n * 1e9

    assert ceilings.sweep([1, 2, 4], steady, 3) == ([4e9] * 3, 4)
    assert calls == [1, 2, 4, 4, 4]  # one sample a count, the repeats at the best only
    # one lucky sample at 1 thread: its repeats fall to 1 GB/s, and 2 threads' single sample (4) beat that median, so
    # 2 threads are repeated too and win on their median
    seq = {1: iter([5e9, 1e9, 1e9]), 2: iter([4e9, 4e9, 4e9])}
    calls.clear()
    assert ceilings.sweep([1, 2], lambda n: calls.append(n) or next(seq[n]), 3) == ([4e9] * 3, 2)
    assert sorted(calls) == [1, 1, 1, 2, 2, 2]


def test_the_hold_budget_minds_a_containers_memory_limit(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import psutil

    from ckptbench.system import ceilings

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=4 << 30))  # the box: 4 GiB free
    (tmp_path / "memory.max").write_text(f"{1 << 30}\n")
    (tmp_path / "memory.current").write_text(f"{(1 << 30) - (400 << 20)}\n")
    monkeypatch.setattr(ceilings, "CGROUP", str(tmp_path))
    assert ceilings._hold_budget() == 100 << 20  # a quarter of the 400 MiB left under the limit
    (tmp_path / "memory.max").write_text("max\n")
    assert ceilings._hold_budget() == 1 << 30  # no limit: a quarter of the box's
    monkeypatch.setattr(ceilings, "CGROUP", str(tmp_path / "none"))
    assert ceilings._hold_budget() == 1 << 30  # no cgroup v2 at all


def test_sysinfo_text_gives_figures_a_reader_can_read(tmp_path, h):
    """A new user read `residency 0.2500010246406397` and `disk_await_ms 0.22727272727272727`."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "a.bin").write_bytes(os.urandom(1 << 20))
    r = h.run_cli("sysinfo", tmp_path / "ck")
    assert r.rc == 0, r.err
    assert not re.search(r"\d\.\d{6,}", r.out), r.out  # no float printed to its last digit
    assert re.search(r"^residency\s+\S+", r.out, re.M), r.out
    from ckptbench.cli.box import shown_field as shown

    assert shown("ratio", 0.2500010246406397) == "0.250" and shown("disk_await_ms", 0.22727272727272727) == "0.2 ms"
    assert shown("fds_in_use", 22) == "22" and shown("fs_type", "ext4") == "ext4"
    # no Python spelling: a list, a bool (a new user read `[0.0, 2.0]` and `True`)
    assert shown("cpu_pct_per_core", [0.0, 12.5]) == "0.0 %, 12 %" and shown("has_page_cache", True) == "yes"
    assert shown("ulimit_nofile", [1024, 4096]) == "soft 1024, hard 4096"
    assert not re.search(r"[\[\]]|True|False", r.out), r.out
    # the residency and the sizes as the dashboard shows them (it said 25 % and sysinfo 0.25 for one residency)
    assert re.search(r"^residency\s+\d+(\.\d)? %$", r.out, re.M), r.out
    assert re.search(r"^bytes\s+1\.0 MiB$", r.out, re.M), r.out


def test_floor_and_sysinfo_say_a_figures_age_in_one_format(monkeypatch, capsys):
    """`floor` said "63 s old" and sysinfo "0.0 h old" for one cached figure."""
    from types import SimpleNamespace

    from ckptbench.cli import box

    now = time.time()
    f = fl.Floor(fl.box_key(), {"copy": fl.Ceiling(4.0, 4.0, 4.0, "planted", now - 63),
                                "scan": fl.Ceiling(8.0, 8.0, 8.0, "planted", now - 2 * 3600)}, cached=True)
    monkeypatch.setattr(fl, "measure", lambda *a, **k: f)
    args = SimpleNamespace(source=None, pick=None, remeasure=False, write_to=None, json=False, s3_client="threads")
    assert box.cmd_floor(args) == 0
    out = capsys.readouterr().out
    assert "(one sample, 1 min old)" in out and "(one sample, 2.0 h old)" in out, out
    box.print_cached_floor({"mount": "/ (ext4)", "resource": "storage", "box": {"copy": {"gbps": 4.0, "age_s": 63}},
                            "storage": {"gbps": 1.0, "age_s": 3 * 86400}, "landing_hot_gbps": None})
    out = capsys.readouterr().out
    assert "4.000 GB/s (1 min old)" in out and "1.000 GB/s for / (ext4) (3.0 d old)" in out, out


def test_a_storage_figure_measured_again_from_a_larger_sample_says_it_replaces_the_mounts(tmp_path):
    """`check` measures the floor for its own checkpoint: where the mount's kept figure came from a smaller sample,
    the storage figure is measured again and replaces it for the mount. That was silent (its evidence said
    floor_cached), and a new user's unchanged run moved from 70 % to 137 % of its floor."""
    import json

    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(8 << 20))
    cache = str(tmp_path / "floor.json")
    first = fl.measure([(str(data), 8 << 20)], "disk-test", path=cache, size=32 << 20)
    assert first.storage_now and not any("replaces it" in n for n in first.notes)  # none kept: nothing replaced
    kept = fl.measure([(str(data), 8 << 20)], "disk-test", path=cache, size=32 << 20)
    assert kept.cached and not kept.storage_now  # the same sample: the kept figure is used
    doc = json.loads(open(cache).read())
    doc["storage"]["disk-test"]["sample_bytes"] = 4 << 20  # kept from a smaller checkpoint on the mount
    with open(cache, "w") as f:
        json.dump(doc, f)
    again = fl.measure([(str(data), 8 << 20)], "disk-test", path=cache, size=32 << 20)
    assert again.cached and again.storage_now and again.storage.sample_bytes == 8 << 20
    assert any("measured now, from a larger sample (8.0 MiB) than the 4.0 MiB kept" in n and "replaces it for this mount" in n
               for n in again.notes), again.notes
