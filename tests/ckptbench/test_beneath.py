"""A folder of a checkpoint swapped for a symbolic link between the listing (or the manifest's check) and the read:
the read does not go through it. O_NOFOLLOW guarded the last component only, so `dataloader/` swapped for a link to
another folder had its files read from there (and with equal bytes, "verified")."""

from __future__ import annotations

import os
import shutil

import pytest
from clirun import run_cli

from ckptbench.checkpoint import confine
from ckptbench.sources import local


@pytest.fixture
def ck(tmp_path):
    d = tmp_path / "ck"
    r = run_cli("gen", "small", d, "--scale", "0.02")
    assert r.rc == 0, r.err
    assert any((d / "dataloader").iterdir())
    return d


def _swap(ck, elsewhere) -> None:
    """`dataloader/` becomes a link to a copy of it outside the checkpoint (equal bytes: the digests would match,
    so only the open can tell)."""
    if not os.path.islink(ck / "dataloader"):
        shutil.copytree(ck / "dataloader", elsewhere)
        os.rename(ck / "dataloader", ck.parent / "moved")
        os.symlink(elsewhere, ck / "dataloader")


def _swap_before_reading(monkeypatch, ck, elsewhere):
    """The race, made certain: the listing (and the manifest's check of each member) done, the swap, the read."""
    from ckptbench.checkpoint import verify

    start_read, member = local.LocalSource.start_read, verify._member

    def swap_then_read(self, *args, **kwargs):
        _swap(ck, elsewhere)
        return start_read(self, *args, **kwargs)

    def checked_then_swap(directory, e):
        found = member(directory, e)
        if e.path.startswith("dataloader/"):
            _swap(ck, elsewhere)
        return found

    monkeypatch.setattr(local.LocalSource, "start_read", swap_then_read)
    monkeypatch.setattr(verify, "_member", checked_then_swap)


@pytest.mark.parametrize("command", ["verify", "run"])
def test_a_folder_swapped_for_a_link_after_the_listing_is_not_read_through(ck, tmp_path, monkeypatch, command):
    _swap_before_reading(monkeypatch, ck, tmp_path / "elsewhere")
    args = ("verify", ck) if command == "verify" else ("run", ck, "--repeat", "1", "--results", tmp_path / "r.csv")
    r = run_cli(*args)
    assert r.rc == 1 and "Traceback" not in r.err, (r.out, r.err)
    said = r.out + r.err
    assert "dataloader/" in said and "symbolic link" in said, said


def test_a_member_whose_folder_became_a_link_after_resolve_is_not_opened(ck, tmp_path):
    """confine.open_member: resolve saw a plain folder; the open walks it and meets the link."""
    real = confine.resolve(str(ck), "dataloader/rank000_worker0000.idx")
    shutil.copytree(ck / "dataloader", tmp_path / "elsewhere")
    os.rename(ck / "dataloader", tmp_path / "moved")
    os.symlink(tmp_path / "elsewhere", ck / "dataloader")
    base = os.path.realpath(ck)
    with pytest.raises(OSError) as caught:
        confine._open_beneath(base, real[len(base) + 1:])
    assert caught.value.errno == 40  # ELOOP
    fd = confine.open_member(str(ck), "model.safetensors.index.json")  # a plain member still opens
    os.close(fd)
