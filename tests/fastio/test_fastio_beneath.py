"""`beneath`: files opened below a folder one component at a time, none followed when it is a symbolic link — a
folder of a listing swapped for a link to elsewhere after the listing is not read through (O_NOFOLLOW alone guards
the last component only)."""

from __future__ import annotations

import os

import pytest

import fastio

MODES = ["pread", "direct", "mmap"]


@pytest.fixture
def tree(tmp_path):
    """ck/sub/f.bin and ck/top.bin, and outside it secret/f.bin, whose bytes must never be read through ck."""
    ck, secret = tmp_path / "ck", tmp_path / "secret"
    (ck / "sub").mkdir(parents=True)
    secret.mkdir()
    (ck / "sub" / "f.bin").write_bytes(os.urandom(3 * 4096))
    (ck / "top.bin").write_bytes(os.urandom(4096))
    (secret / "f.bin").write_bytes(b"not the checkpoint's" * 100)
    return ck, secret


def _swap(ck, secret) -> None:
    """What another user does between the listing and the read: the folder moved away, a link in its place."""
    os.rename(ck / "sub", ck / "sub.moved")
    os.symlink(secret, ck / "sub")


@pytest.mark.parametrize("mode", MODES)
def test_a_folder_swapped_for_a_link_is_not_read_through(tree, mode):
    ck, secret = tree
    paths = [str(ck / "sub" / "f.bin"), str(ck / "top.bin")]
    before = fastio.read_files(paths, read=mode, nofollow=True, beneath=str(ck))
    assert [f.error for f in before.files] == [None, None] and before.bytes == 4 * 4096
    _swap(ck, secret)
    res = fastio.read_files(paths, read=mode, nofollow=True, beneath=str(ck))
    swapped, top = res.files
    assert swapped.error is not None and swapped.error.errno == 40 and swapped.bytes == 0  # ELOOP
    assert "lies under, a symbolic link" in swapped.error.message
    assert top.error is None and top.bytes == 4096
    # the case it closes: O_NOFOLLOW alone followed the folder's link and read the other file
    assert fastio.read_files(paths[:1], read="pread", nofollow=True).files[0].bytes == (secret / "f.bin").stat().st_size


def test_a_worker_held_before_its_open_meets_the_swap_as_it_happens(tree):
    """The race itself: the listing checked, the worker about to open, the folder swapped meanwhile."""
    ck, secret = tree
    path = str(ck / "sub" / "f.bin")
    h = fastio.start([path], nofollow=True, beneath=str(ck), _faults={path: "hold"})
    _swap(ck, secret)
    h._release()
    res = h.wait()
    assert res.files[0].error is not None and res.files[0].error.errno == 40


def test_the_folder_given_may_itself_be_reached_through_a_link(tree, tmp_path):
    """The user's own path (/data -> /mnt/nvme) is theirs to give: only what lies below it is walked."""
    ck, _ = tree
    os.symlink(ck, tmp_path / "via")
    res = fastio.read_files([str(tmp_path / "via" / "sub" / "f.bin")], nofollow=True, beneath=str(tmp_path / "via"))
    assert res.files[0].error is None and res.files[0].bytes == 3 * 4096


@pytest.mark.parametrize("beneath, path", [("ck", "other/x"), ("ck", "ck"), ("ck", "ckx/y"), ("", "ck/x")])
def test_a_path_not_below_the_folder_is_an_option_error(tmp_path, beneath, path):
    with pytest.raises(fastio.OptionError):
        fastio.start([str(tmp_path / path)], beneath=str(tmp_path / beneath) if beneath else "")


def test_a_relative_folder_and_a_trailing_slash_work(tree, monkeypatch):
    ck, _ = tree
    monkeypatch.chdir(ck.parent)
    res = fastio.read_files(["ck/sub/f.bin", "ck/top.bin"], nofollow=True, beneath="ck/")
    assert [f.error for f in res.files] == [None, None]
