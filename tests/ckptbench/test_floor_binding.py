"""What binds a floor is said one way everywhere: the resource, the rate the floor holds it to, and what that rate is
of. One device has several rates (into fresh memory, into reused buffers, its page cache's copy); a new user met
"bound by storage" at three of them in three commands and could not tell which was the box's."""

from __future__ import annotations

import pytest

from ckptbench.system import binding
from ckptbench.system import floor as fl

from floorhelp import fixed_floor

BOX = dict(populate_4k=10.0, populate_thp=10.0, copy=20.0, hash_crc32c=10.0, hash_xxh64=8.0, hash_sha256=0.5,
           scan=10.0)
GB = 10**9


def _floor(fresh: float = 0.0, hot: float = 0.0, hot_reused: float = 0.0, **rates) -> fl.Floor:
    f = fixed_floor(storage=4.0, **(BOX | rates))
    f.storage.fresh_gbps, f.storage.hot_gbps, f.storage.hot_reused_gbps = fresh, hot, hot_reused
    return f


def test_a_cold_restore_is_bound_by_storage_at_its_rate_into_fresh_memory_a_read_at_the_device_rate():
    f = _floor(fresh=1.5)
    restore = fl.restore_fields(f, bytes_read=3 * GB, measured_s=4.0, hash_alg="none")
    assert restore["binding"] == "storage" and restore["binding_gbps"] == 1.5  # floor's "into fresh" row
    assert binding.text(restore) == "storage (1.50 GB/s read into fresh memory)"
    read = fl.restore_fields(f, bytes_read=3 * GB, measured_s=1.0, hash_alg="none", destination=fl.REUSED)
    assert read["binding_gbps"] == 4.0  # floor's storage row: the device into reused buffers
    assert binding.text(read) == "storage (4.00 GB/s read into reused buffers)"
    unknown = _floor()  # no figure into fresh memory: the device's own, and said so
    assert binding.text(fl.restore_fields(unknown, bytes_read=GB, measured_s=1.0, hash_alg="none")) == \
        "storage (4.00 GB/s read into reused buffers)"


def test_a_hot_restore_names_its_largest_part_with_that_parts_rate_and_the_floor_rate_is_the_sum_of_the_parts():
    f = _floor(fresh=1.5, hot=8.0, hot_reused=14.0, populate_4k=2.0, populate_thp=2.0)
    hot = fl.restore_fields(f, bytes_read=4 * GB, measured_s=3.0, hash_alg="none", hot=True)
    assert hot["binding"] == "fresh memory" and binding.text(hot) == "fresh memory (2.00 GB/s populated)"
    assert hot["floor_s"] == pytest.approx(4 / 8.0 + 4 / 2.0) and hot["floor_gbps"] == pytest.approx(1.6)
    fast = _floor(hot=8.0, hot_reused=14.0, populate_4k=50.0, populate_thp=50.0)  # the copy binds: the mount's own, into populated pages
    assert binding.text(fl.restore_fields(fast, bytes_read=GB, measured_s=1.0, hash_alg="none", hot=True)) == \
        "page cache (8.00 GB/s copied into populated memory)"
    read = fl.restore_fields(f, bytes_read=GB, measured_s=1.0, hash_alg="none", hot=True, destination=fl.REUSED)
    assert binding.text(read) == "page cache (14.00 GB/s copied into a reused buffer)"
    stand_in = _floor()  # no page cache figure of the mount's: a memmove's rate, and the phrase says so
    said = binding.text(fl.restore_fields(stand_in, bytes_read=GB, measured_s=1.0, hash_alg="none", hot=True,
                                          destination=fl.REUSED))
    assert said == "page cache (20.00 GB/s a memmove's, standing in for the page cache's copy)"


def test_the_cpu_binds_with_its_cores_and_no_rate_and_no_binding_says_nothing():
    f = _floor(fresh=100.0, populate_4k=100.0, populate_thp=100.0, hash_sha256=0.5)
    m = fl.model(f, bytes_read=GB, hash_alg="sha256")
    assert m["binding"] == "cpu" and binding.of_model(m) == "cpu (1.00 GB/s hashing (sha256) on 2 cores)"
    both = fl.model(f, bytes_read=GB, hash_alg="sha256", floating_bytes=GB)  # a read never scans: said only here
    assert binding.of_model(both).startswith("cpu (") and "hashing (sha256) and scanning for NaN/Inf" in \
        binding.of_model(both)
    assert binding.text(fl.unmeasured()) == "" and binding.phrase("storage", None, "") == "storage"


def test_the_floor_line_shows_the_parts_that_make_it():
    """A hot floor named by its largest part's rate read as a floor that rate does not give (1008 MiB at 7.13 GB/s is
    0.148 s, the floor 0.251 s): the parts are printed, added where they add up."""
    from ckptbench.cli.show import floor_line

    hot = fl.restore_fields(_floor(hot=8.0, populate_4k=2.0, populate_thp=2.0), bytes_read=4 * GB, measured_s=3.0,
                            hash_alg="none", hot=True)
    line = floor_line(hot)
    assert "bound by fresh memory (2.00 GB/s populated); fresh memory 2.000 s + page cache 0.500 s ·" in line, line
    cold = fl.restore_fields(_floor(fresh=1.5), bytes_read=3 * GB, measured_s=4.0, hash_alg="none")
    assert "; storage 2.000 s, fresh memory 0.300 s ·" in floor_line(cold), floor_line(cold)
    assert binding.parts(1.0, {"storage": 1.0}) == ""


def test_every_document_kind_carries_what_its_binding_rate_is_of():
    assert "binding_how" in fl.FIELDS and set(fl.unmeasured()) == set(fl.FIELDS)
    fields = fl.restore_fields(_floor(fresh=1.5), bytes_read=GB, measured_s=1.0, hash_alg="none")
    assert set(fl.FIELDS) <= set(fields)


def test_the_floor_prints_its_figure_on_one_line_and_what_it_stands_on_a_clause_a_line():
    """The note as one parenthesis after the figure ran to 900 characters on one line; a clause a line now, split
    at its top-level "; " only (a parenthesis keeps its own)."""
    from ckptbench.cli.show import clauses, floor_lines

    assert clauses("a; b (c; d); e") == ["a", "b (c; d)", "e"]
    assert clauses("") == [] and clauses("one") == ["one"] and clauses("x (unclosed; y") == ["x (unclosed; y"]
    hot = fl.restore_fields(_floor(hot=8.0, populate_4k=2.0, populate_thp=2.0), bytes_read=4 * GB, measured_s=3.0,
                            hash_alg="none", hot=True)
    lines = floor_lines(hot)
    assert lines[0].startswith("  floor ") and "% of it" in lines[0] and hot["floor_note"] not in lines[0]
    assert [ln.strip() for ln in lines[1:]] == clauses(hot["floor_note"]) and len(lines) > 2
    assert all(ln.startswith("           ") for ln in lines[1:])
    assert floor_lines(fl.unmeasured()) == ["  floor: " + fl.unmeasured()["floor_note"]]
