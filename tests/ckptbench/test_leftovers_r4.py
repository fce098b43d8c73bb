"""Leftovers, round 4: a save whose preflight refused it left behind the empty TARGET folder it had created; pack and
unpack into a full disk said "I/O: No space left on device" without naming what they were writing; a mistyped
command or option was answered with the whole list of choices and no suggestion. Real files, the real CLI."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple

import pytest

from clirun import assert_one_line_error, run_cli

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


def _mount(tmp_path, options: str):
    """A real small filesystem: a tmpfs (the tests run as root), unmounted afterwards."""
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.fixture
def tmpfs(tmp_path):
    """1 MiB: a checkpoint's bytes do not fit."""
    yield from _mount(tmp_path, "size=1m")


@pytest.fixture(params=["size=1m", "size=64m,nr_inodes=6"], ids=["bytes", "inodes"])
def full(tmp_path, request):
    """Full of bytes (a write fails), or of inodes (creating a file fails, with the staging folder's name)."""
    yield from _mount(tmp_path, request.param)


def test_a_first_save_that_fills_the_disk_leaves_no_target_folder_behind(tmpfs):
    target = tmpfs / "t"
    r = run_cli("save", "small", target, "--scale", SCALE, "--results", "", "--force")  # past the preflight
    assert r.rc == 1 and "Traceback" not in r.err, r.err
    assert "no space left on the device while writing step-000001" in r.err, r.err
    assert os.listdir(tmpfs) == []


# pack and unpack into a full disk: the line names the file in OUT it was writing, and OUT is not left half-written

@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("packs")
    ck, out = root / "ck", root / "packed"
    r = run_cli("gen", "small", ck, "--scale", SCALE, "--format", "torch")
    assert r.rc == 0, r.err
    r = run_cli("pack", ck, out)
    assert r.rc == 0, r.err
    return ck, out


def _names_a_file_in(r, out) -> None:
    assert r.rc == 1 and "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1, r.err
    line = r.err_lines[0]
    assert line.startswith(f"ckptbench: error: {out}/") and "No space left on device" in line, line
    assert "free space" in line and "permissions" not in line and ".tmp-" not in line, line


@pytest.mark.parametrize("command", ["pack", "unpack"])
def test_pack_and_unpack_into_a_full_disk_name_the_file_they_were_writing(packed, full, command):
    source = packed[0] if command == "pack" else packed[1]
    out = full / "sub" / "out"
    r = run_cli(command, source, out)
    _names_a_file_in(r, out)
    assert os.listdir(full) == []  # nothing half-written: the staging folder and the parent made for it are gone


def test_a_manifest_written_to_a_full_disk_names_it(packed, tmpfs):
    from ckptbench.checkpoint import manifest as mf

    with open(tmpfs / "filler", "wb") as f:  # the disk filled to its last byte
        with pytest.raises(OSError):
            while True:
                f.write(b"x" * 65536)
                f.flush()
    (tmpfs / "ck").mkdir()
    with pytest.raises(OSError) as caught:
        mf.read(str(packed[0])).write(str(tmpfs / "ck"))
    assert caught.value.filename == str(tmpfs / "ck" / mf.MANIFEST_NAME)
    assert os.listdir(tmpfs / "ck") == []  # its temporary file is not left behind


# typos: the line names what was most likely meant, and stays one line with argparse's exit 2

@pytest.mark.parametrize("args, meant", [
    (["rn", "x"], "invalid choice: 'rn'; did you mean 'run'?"),
    (["sav", "small", "t"], "invalid choice: 'sav'; did you mean 'save'?"),
    (["sysinf"], "invalid choice: 'sysinf'; did you mean 'sysinfo'?"),
    (["run", "/nonexistent", "--concurency", "4"],
     "unrecognized arguments: --concurency 4; did you mean --concurrency?"),
    (["run", "/nonexistent", "--repat=3"], "unrecognized arguments: --repat=3; did you mean --repeat?"),
    (["save", "small", "t", "--no-fsnyc"], "did you mean --no-fsync?"),
    (["--verison"], "unrecognized arguments: --verison; did you mean --version?"),
    (["run", "/nonexistent", "--mode", "fsued"], "argument --mode: invalid choice: 'fsued'; did you mean 'fused'?"),
])
def test_a_typo_is_answered_with_what_was_meant(tmp_path, args, meant):
    r = run_cli(*args)
    assert_one_line_error(r, meant)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args, needle", [
    (["zzzz"], "invalid choice: 'zzzz' (choose from 'read', 'run'"),
    (["run", "/nonexistent", "--qqqqqq"], "unrecognized arguments: --qqqqqq (see ckptbench run --help)"),
    (["read", "/nonexistent", "--hash", "crc64"], "invalid choice: 'crc64' (choose from"),
])
def test_nothing_close_is_no_guess(args, needle):
    r = run_cli(*args)
    assert_one_line_error(r, needle)
    assert "did you mean" not in r.err


def test_the_guess_reaches_a_user_running_the_installed_command(h):
    r = h.run_proc("inspekt", "/nonexistent")
    assert_one_line_error(r, "did you mean 'inspect'?")


def test_a_place_the_system_refuses_exits_1_and_a_path_that_is_not_there_exits_2(tmp_path):
    """One rule for every command: gen's unwritable folder exited 2, save's 1, pack's 1 and --results' 2 for the
    same read-only mount. The system refusing (EROFS, EACCES, ENOSPC) is 1; a path as typed that cannot be one is 2."""
    import errno

    from ckptbench.core.errors import write_refused_exit
    from ckptbench.records import results

    for code in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
        assert write_refused_exit(OSError(code, os.strerror(code))) == 1, errno.errorcode[code]
    for code in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
        assert write_refused_exit(OSError(code, os.strerror(code))) == 2, errno.errorcode[code]
    ro = results._cannot(str(tmp_path / "r.csv"), "create the results file there",
                         OSError(errno.EROFS, "Read-only file system"))
    missing = results._cannot(str(tmp_path / "no" / "r.csv"), "create the results file there",
                              OSError(errno.ENOENT, "No such file or directory"))
    assert (ro.exit_code, missing.exit_code) == (1, 2)
    assert "Read-only file system" in str(ro) and "choose a writable --results path" in str(ro)


@pytest.fixture
def read_only(tmp_path):
    yield from _mount(tmp_path, "size=1m,ro")


@pytest.mark.parametrize("command", ["gen", "save", "pack", "run --results", "sweep --results"])
def test_every_command_meeting_a_read_only_mount_exits_1_in_one_line(packed, read_only, command):
    """A real read-only tmpfs: each command says so in one line and exits 1; nothing appears on the mount."""
    ck = packed[0]
    args = {"gen": ("gen", "small", read_only / "ck", "--scale", SCALE),
            "save": ("save", "small", read_only / "t", "--scale", SCALE, "--count", "1"),
            "pack": ("pack", ck, read_only / "p"),
            "run --results": ("run", ck, "--repeat", "1", "--results", read_only / "r.csv"),
            "sweep --results": ("sweep", ck, "--levels", "1,2", "--results", read_only / "r.csv")}[command]
    r = run_cli(*args)
    assert r.rc == 1 and "Traceback" not in r.err, (command, r.err)
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("ckptbench: error:"), r.err
    assert "Read-only file system" in r.err or "not writable" in r.err, r.err
    assert os.listdir(read_only) == []


def test_a_change_beyond_the_noise_but_under_the_threshold_is_labelled(tmp_path):
    """+4 % RTO with repeats that do not overlap, under --threshold 5: the line had no label at all, read by a user
    as "no change" or as not judged. It is real and not flagged: said so, exit 0."""
    from ckptbench.records import results

    env = {"date": "2026-01-01T00:00:00+00:00", "kernel": "6.1", "cpu_count": 2}
    settings = {"format": "safetensors", "mode": "fused", "cache": "cold", "concurrency": 8, "read": "pread",
                "hash": "", "block_size": 1 << 20, "device": "cpu"}
    path = str(tmp_path / "r.csv")
    for run_id, rto in (("base", 1.00), ("new", 1.04)):
        results.append(path, [results.row("restore", run_id, i, "/data/ck", settings,
                                           {"rto_s": rto + i * 0.001, "read_gbps": 1 / (rto + i * 0.001)}, env,
                                           status="ok", verified=True, success_rate=1.0) for i in (1, 2, 3)])
    r = run_cli("compare", path, "--threshold", "5")
    assert r.rc == 0, r.err
    rto = next(line for line in r.out.splitlines() if line.strip().startswith("rto_s"))
    assert "beyond noise, under --threshold" in rto and "REGRESSION" not in rto, r.out
    r = run_cli("compare", path, "--threshold", "3")
    assert r.rc == 1 and "REGRESSION" in r.out, r.out
