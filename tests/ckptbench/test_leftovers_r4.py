"""Leftovers, round 4: a save whose preflight refused it left behind the empty TARGET folder it had created; pack and
unpack into a full disk said "I/O: No space left on device" without naming what they were writing; a mistyped
command or option was answered with the whole list of choices and no suggestion. Real files, the real CLI."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple

import pytest

from clirun import run_cli

SCALE = "0.02"  # the small profile: about 5.5 MiB a save


# save: a refused preflight takes back only the folder this run made, and only while it is empty

@pytest.fixture
def no_free_space(tmp_path, monkeypatch):
    """The target's filesystem reports 1 MiB free (the free-space check then refuses); `on_probe(path)` runs at the
    probe, as another process acting while the save runs would."""
    usage = shutil.disk_usage
    seen = []

    def tiny(path):
        if str(path).startswith(str(tmp_path)):
            seen.append(str(path))
            for hook in tiny.hooks:
                hook(str(path))
            return namedtuple("usage", "total used free")(1 << 30, (1 << 30) - (1 << 20), 1 << 20)
        return usage(path)

    tiny.hooks = []
    monkeypatch.setattr(shutil, "disk_usage", tiny)
    return tiny


def _refused(r) -> None:
    assert r.rc == 1 and "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1 and "preflight failed: free space" in r.err_lines[0], r.err


def test_a_refused_preflight_removes_the_target_folder_it_created(tmp_path, no_free_space):
    target = tmp_path / "new-target"
    r = run_cli("save", "small", target, "--scale", SCALE, "--results", "")
    _refused(r)
    assert not os.path.lexists(target), os.listdir(target)
    assert sorted(os.listdir(tmp_path)) == []  # no scratch file, no staging folder either


def test_a_refused_preflight_keeps_a_target_folder_that_was_there(tmp_path, no_free_space):
    target = tmp_path / "mine"
    target.mkdir()
    r = run_cli("save", "small", target, "--scale", SCALE, "--results", "")
    _refused(r)
    assert target.is_dir() and os.listdir(target) == []


def test_a_refused_preflight_keeps_a_folder_it_made_once_something_else_is_in_it(tmp_path, no_free_space):
    target = tmp_path / "new-target"
    no_free_space.hooks.append(lambda path: (target / "notes.txt").write_text("the user's"))
    r = run_cli("save", "small", target, "--scale", SCALE, "--results", "")
    _refused(r)
    assert (target / "notes.txt").read_text() == "the user's"


def test_a_refused_preflight_keeps_a_folder_put_in_place_of_the_one_it_made(tmp_path, no_free_space):
    target = tmp_path / "new-target"

    def swap(path):
        os.rmdir(target)
        os.mkdir(target)  # empty, but another's: not the folder this run made

    no_free_space.hooks.append(swap)
    r = run_cli("save", "small", target, "--scale", SCALE, "--results", "")
    _refused(r)
    assert target.is_dir()


@pytest.fixture
def tmpfs(tmp_path):
    """A real full disk: a 1 MiB tmpfs (the tests run as root), unmounted afterwards."""
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_first_save_that_fills_the_disk_leaves_no_target_folder_behind(tmpfs):
    target = tmpfs / "t"
    r = run_cli("save", "small", target, "--scale", SCALE, "--results", "", "--force")  # past the preflight
    assert r.rc == 1 and "Traceback" not in r.err, r.err
    assert "no space left on the device while writing step-000001" in r.err, r.err
    assert os.listdir(tmpfs) == []
