"""The floor's cache is input like any other: a damaged or planted floor.json is measured again, never trusted and
never a traceback; a figure that was not read cold is never kept; a cache that cannot be written is said."""

from __future__ import annotations

import json
import os
import time

import pytest

from ckptbench.system import floor as fl
from ckptbench.system import pagecache

GOOD = {"gbps": 2.0, "min_gbps": 1.9, "max_gbps": 2.1, "method": "planted", "measured_at": None}


def _write(doc: dict) -> None:
    os.makedirs(os.path.dirname(fl.cache_path()), exist_ok=True)
    with open(fl.cache_path(), "w") as f:
        f.write(json.dumps(doc))


def _doc(ceilings=None, storage=None) -> dict:
    return {"schema": fl.SCHEMA, "box": fl.box_key(), "ceilings": ceilings, "storage": storage}


def _good(**change) -> dict:
    return dict(GOOD, measured_at=time.time()) | change


@pytest.mark.parametrize("entry", [
    _good(gbps=1e300, max_gbps=1e300), _good(gbps=1e-300, min_gbps=1e-300), _good(gbps=float("inf")),
    _good(min_gbps=float("nan")), _good(measured_at=10 ** 400), _good(sample_bytes=float("inf")),
    _good(gbps="2"), _good(method=7), _good(min_gbps=3.0), {"gbps": 2.0}, _good(fresh_gbps=float("inf")),
    _good(fresh_gbps="1"), _good(fresh_gbps=1e-9), _good(hot_gbps=float("nan")), _good(hot_gbps=[8]),
    _good(hot_gbps=1e9), _good(hot_reused_gbps=float("inf")), _good(hot_reused_gbps="9"),
], ids=["huge", "tiny", "inf", "nan", "huge-int-date", "inf-sample", "text-rate", "method-number", "min-above",
        "partial", "inf-into-fresh", "text-into-fresh", "tiny-into-fresh", "nan-page-cache", "list-page-cache",
        "huge-page-cache", "inf-page-cache-reused", "text-page-cache-reused"])
def test_a_damaged_ceiling_is_not_used(entry):
    whole = {k: _good() for k in fl.BOX_FIGURES}
    _write(_doc(whole))
    assert fl.cached().ceilings["copy"].gbps == 2.0
    _write(_doc(whole | {"copy": entry}))
    assert fl.cached() is None  # no floor on part of the figures: the run says it is not measured


@pytest.mark.parametrize("doc", [_doc([1, 2]), _doc("x"), _doc({"copy": [1]}, [3]), {"schema": fl.SCHEMA, "box": 3},
                                 [1], "text"], ids=["ceilings-list", "ceilings-text", "storage-list", "box-int",
                                                    "list", "string"])
def test_a_cache_of_the_wrong_shape_is_no_cache_and_no_traceback(tmp_path, h, ckpt, doc):
    _write(doc)
    assert fl.cached("x") is None or not fl.cached("x").ceilings
    root = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "ck")
    for args in (("run", root, "--repeat", "1", "--results", tmp_path / "R.csv"), ("sysinfo", root)):
        r = h.run_cli(*args)
        assert r.rc == 0 and "Traceback" not in r.err, r.err


@pytest.mark.parametrize("kind", ["fifo", "zero", "huge"])
def test_a_cache_that_is_not_a_small_regular_file_is_not_read(kind):
    """A FIFO at the cache's name would block every command, /dev/zero or a huge file would fill the memory."""
    path = fl.cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    else:
        with open(path, "w") as f:
            f.write(json.dumps(_doc({k: _good() for k in fl.BOX_FIGURES})) + " " * (fl.CACHE_MAX + 1))
    assert fl.cached() is None and fl._load_cache(path) == {}


def test_remeasuring_keeps_other_mounts_figures_and_drops_hand_made_ones(monkeypatch):
    now = time.time()
    box = {k: fl.Ceiling(2.0, 2.0, 2.0, "m", now) for k in fl.BOX_FIGURES}
    monkeypatch.setattr(fl, "memory_ceilings", lambda size=0: box)
    monkeypatch.setattr(fl, "cpu_ceilings", lambda: {})
    other = _good(sample_bytes=1 << 30)
    _write(_doc({k: _good() for k in fl.BOX_FIGURES}, {"/data (xfs)": other, "/hand (ext4)": other | {"cold": False},
                                                       "/fast (ext4)": other | {"fresh_gbps": 500.0}}))
    fl.measure(None, None, remeasure=True)
    kept = fl._load_cache(fl.cache_path())["storage"]
    assert list(kept) == ["/data (xfs)"]  # not cold by its own word, or faster into fresh memory than at all: gone


def test_an_escape_in_a_cached_method_never_reaches_the_terminal():
    _write(_doc({k: _good() for k in fl.BOX_FIGURES} | {"copy": _good(method="\x1b]0;pwned\x07\x1b[2J")}))
    assert "\x1b" not in fl.cached().ceilings["copy"].method


def test_a_storage_figure_that_was_not_cold_is_shown_but_neither_kept_nor_used(tmp_path, monkeypatch):
    files = []
    for i in range(2):
        p = tmp_path / f"shard-{i}.bin"
        p.write_bytes(os.urandom(1 << 20) * 40)
        files.append((str(p), 40 << 20))
    real = pagecache.prepare

    def stays_cached(paths, requested, **kw):  # as for a user who may not evict: the files stay in the page cache
        c = real(paths, "hot")
        return pagecache.CacheCondition("cold", c.residency_before, False, "eviction refused")

    monkeypatch.setattr(pagecache, "prepare", stays_cached)
    monkeypatch.setattr(fl, "memory_ceilings", lambda size=0: {k: fl.Ceiling(4, 4, 4, "fixed", time.time())
                                                              for k in ("populate_4k", "populate_thp", "copy")})
    f = fl.measure(files, "/x (ext4)")
    assert f.storage is not None and not f.storage.cold and "NOT cold" in f.storage.method
    assert any("neither kept nor used" in n for n in f.notes)
    assert not fl.storage_usable(f) and "storage" not in fl.model(f, bytes_read=80 << 20)["times_s"]
    assert fl.cached("/x (ext4)").storage is None  # not kept: a later run is not held against the page cache


def test_a_cache_that_cannot_be_written_is_said_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(fl, "memory_ceilings", lambda size=0: {})
    monkeypatch.setattr(fl, "cpu_ceilings", lambda: {})
    os.makedirs(fl.cache_path())  # floor.json is a directory
    f = fl.measure()
    assert any("cannot keep these figures" in n for n in f.notes), f.notes
    assert os.listdir(os.path.dirname(fl.cache_path())) == ["floor.json"]  # no temporary file left
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the cache's parent is a file
    assert any("cannot keep these figures" in n for n in fl.measure().notes)


def test_a_restore_faster_than_its_floor_says_the_ceiling_is_what_is_wrong():
    now = time.time()
    f = fl.Floor({"cores": 2}, {"copy": fl.Ceiling(1.0, 1.0, 1.0, "fixed", now)})
    fields = fl.restore_fields(f, bytes_read=10 ** 9, measured_s=0.5, hash_alg="none", hot=True,
                               destination=fl.REUSED)
    assert fields["efficiency"] == pytest.approx(2.0) and "--remeasure" in fields["floor_note"]
    fields = fl.restore_fields(f, bytes_read=10 ** 9, measured_s=1.0, hash_alg="none", hot=True,
                               destination=fl.REUSED)
    assert "--remeasure" not in fields["floor_note"]


def test_a_relative_cache_home_is_ignored_and_empty_files_are_no_sample(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", "rel/cache")  # the XDG rule: it would write wherever the user stands
    monkeypatch.setenv("HOME", str(tmp_path))
    assert fl.cache_path() == str(tmp_path / ".cache" / "ckptbench" / "floor.json")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    from ckptbench.core.errors import CkptbenchError

    with pytest.raises(CkptbenchError, match="none to read"):
        fl.measure([(str(empty), 0)], "/ (ext4)")


def test_a_run_with_a_cache_it_cannot_write_says_so_not_to_run_floor_again(tmp_path, monkeypatch):
    """A new user whose cache was read-only ran `floor` (it said it could not keep its figures), then `run`, which
    sent them back to `floor`: round in circles."""
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(ro))
    assert fl.unmeasured()["floor_note"] == fl.NOT_MEASURED  # writable: not measured yet, measure it
    monkeypatch.setattr(fl.os, "access", lambda path, mode: not str(path).startswith(str(ro)))  # root passes modes
    note = fl.restore_fields(None, bytes_read=1, measured_s=1.0, hash_alg="none")["floor_note"]
    assert f"{ro} is not writable" in note and "XDG_CACHE_HOME" in note
    from ckptbench.cli import box

    assert "is not writable" in box.cached_floor("/ (ext4)")["box"]


def test_figures_measured_while_busy_say_so_for_as_long_as_they_are_used(tmp_path, monkeypatch):
    """The busy note was said once, when measured; the cached figures were then used for a day without it (a new
    user's `floor` said it, the next one did not, and a run beating that floor was told nothing)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    now = time.time()
    box = {k: fl.Ceiling(4.0, 4.0, 4.0, "fixed", now) for k in fl.BOX_FIGURES}
    monkeypatch.setattr(fl, "memory_ceilings", lambda **kw: {k: c for k, c in box.items() if not k.startswith("h")})
    monkeypatch.setattr(fl, "cpu_ceilings", lambda: {k: c for k, c in box.items() if k.startswith("h")})
    monkeypatch.setattr(fl.OtherWork, "note", lambda self: "")  # the box as this test says, not as the suite loads it
    monkeypatch.setattr(fl, "_busy", lambda: "the box was busy (load 3.4 on 2 cores): these figures may be low")
    first = fl.measure()
    assert first.busy and any("was busy" in n for n in first.notes)
    monkeypatch.setattr(fl, "_busy", lambda: "")
    again = fl.measure()
    assert again.cached and any("was busy" in n and "when these figures were measured" in n for n in again.notes)
    note = fl.restore_fields(fl.cached(), bytes_read=10**9, measured_s=0.1, hash_alg="none", hot=True)["floor_note"]
    assert "while the box was busy" in note
    fl.measure(remeasure=True)  # measured again, quiet: the note goes with the old figures
    assert not fl.cached().busy
