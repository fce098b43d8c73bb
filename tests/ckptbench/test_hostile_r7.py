"""Hostile checkpoints, seventh round: what the earlier rounds left open in less-travelled places (inspect's and
check's reads of the small files, ...). Each input is made by the real library and then crafted; bad input is one
line naming what and where, and a non-zero exit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

from clirun import Run, assert_one_line_error

GiB = 1 << 30


def _capped(*args, memory: int = 4 * GiB, timeout: int = 120) -> Run:
    """The CLI in a fresh interpreter whose address space is capped: a read that grows without bound ends in a
    MemoryError there, not in the OOM killer on the test's box."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    proc = subprocess.run([sys.executable, "-m", "ckptbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def test_inspect_and_check_bound_their_read_of_config_json(tmp_path, h, ckpt):
    """inspect ("headers only") and check read a config.json whole for the model's shape, however large: a sparse
    config.json claiming 256 GiB was read into memory (a MemoryError traceback under a cap; the OOM killer, exit 137,
    without one). A model's config is a few kB: one over the bound is one line naming it, before any of it is read.
    Twice the interpreter's 4 GiB cap shows a whole read as well as 256 GiB does, and check's page-cache probes
    walk every page a file claims (256 GiB took 15 s of them)."""
    ck = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "ck")
    os.truncate(os.path.join(ck, "config.json"), 8 * GiB)
    r = _capped("inspect", ck)
    assert_one_line_error(r, "config.json")
    r = _capped("check", ck, "--json")
    assert r.rc == 1 and "Traceback" not in r.err and "MemoryError" not in r.err, r.err
    assert "config.json" in r.out


def _fake_proc(tmp_path, mountinfo: bytes):
    root = tmp_path / "root"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "mountinfo").write_bytes(mountinfo)
    return root


def test_a_mount_point_that_is_not_utf8_fails_no_probe(tmp_path):
    """mountinfo shows a mount point's bytes as they are (only space, tab, newline and backslash escaped): one
    mount at a name that is not UTF-8 anywhere on the box (a user's FUSE mount, a stick with a Latin-1 label) made
    run, read, sysinfo and check a UnicodeDecodeError traceback before anything was read, whatever the checkpoint.
    A probe fails soft; the checkpoint under such a mount is still found on it."""
    from ckptbench.system import probes

    root = _fake_proc(tmp_path, b"21 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
                                b"46 21 0:41 / /mnt/caf\xe9 rw,relatime - tmpfs none rw\n")
    assert probes.mount_of("/data/x", str(root)).fs_type == "ext4"
    m = probes.mount_of(os.fsdecode(b"/mnt/caf\xe9/ckpt"), str(root))
    assert isinstance(m, probes.Mount) and m.fs_type == "tmpfs"


def test_a_process_named_in_bytes_that_are_not_utf8_is_listed(tmp_path):
    """check's scanning-agents item names the processes holding files open under the checkpoint by their comm, which
    a process sets to any bytes (prctl PR_SET_NAME): one named \\xff was a UnicodeDecodeError traceback out of check."""
    from ckptbench.system import probes

    root = _fake_proc(tmp_path, b"")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"x")
    pid = root / "proc" / "4242"
    (pid / "fd").mkdir(parents=True)
    os.symlink(ck / "model.safetensors", pid / "fd" / "3")
    (pid / "comm").write_bytes(b"\xff\xfeagent\x1b[2J\n")
    found = probes.openers(str(ck), str(root))
    assert [(p, n) for p, _, n in found] == [(4242, 1)]
    assert "agent" in found[0][1]


def _outer_with_a_swap(tmp_path, h, ckpt, monkeypatch, after: str, before: bool = False):
    """outer/checkpoint-5 (a copy of a real checkpoint, picked as a Trainer's resume picks it) and, outside, a
    checkpoint of other weights; once `after` (a function of ckptbench, patched) has run, checkpoint-5 is swapped for a
    link to the outside one (or as it starts, `before`): what changes between the listing (or the read) and the
    loader's open."""
    import importlib

    import torch
    from safetensors.torch import save_file

    outer = tmp_path / "outer"
    inner = h.copy_ckpt(ckpt("safetensors", 1), outer / "checkpoint-5")
    other = tmp_path / "elsewhere"
    h.copy_ckpt(inner, other)
    for name in os.listdir(other):
        if name.startswith("model-") and name.endswith(".safetensors"):
            save_file({"outside.secret": torch.zeros(3)}, str(other / name))
    module, owner, name = after.rsplit(".", 2)
    try:
        mod = getattr(importlib.import_module(module), owner)
    except ImportError:
        mod = importlib.import_module(f"{module}.{owner}")
    real = getattr(mod, name)

    def swap():
        if os.path.isdir(inner) and not os.path.islink(inner):
            os.rename(inner, tmp_path / "moved")
            os.symlink(other, inner)

    def swapped(*a, **k):
        if before:
            swap()
        out = real(*a, **k)
        swap()
        return out

    monkeypatch.setattr(mod, name, swapped)
    return outer


def test_inspect_never_reads_through_a_folder_swapped_for_a_link(tmp_path, h, ckpt, monkeypatch):
    """inspect opened each shard by its path with O_NOFOLLOW, which guards the last component only: the checkpoint's
    folder swapped for a link to another after the listing had inspect read the other's headers (names, shapes) as
    this checkpoint's. The shard is opened one folder at a time from the checkpoint, as confine and fastio open one:
    one line, the link named."""
    outer = _outer_with_a_swap(tmp_path, h, ckpt, monkeypatch, "ckptbench.sources.local.LocalSource.list")
    r = h.run_cli("inspect", outer, "--tensors")
    assert "outside.secret" not in r.out
    assert_one_line_error(r, "symbolic link", rc=2)


def test_a_staged_restore_never_loads_through_a_folder_swapped_for_a_link(tmp_path, h, ckpt, monkeypatch):
    """A staged restore reads and hashes the files (fastio, beneath the folder), then loads from the files by path:
    the folder swapped for a link between the two had the other checkpoint's weights loaded as this one's."""
    outer = _outer_with_a_swap(tmp_path, h, ckpt, monkeypatch, "ckptbench.restore.load.load_state", before=True)
    r = h.run_cli("run", outer, "--mode", "staged", "--repeat", "1", "--results", "", "--cache", "as-is")
    assert r.rc != 0 and "Traceback" not in r.err
    assert "symbolic link" in r.err, r.err
