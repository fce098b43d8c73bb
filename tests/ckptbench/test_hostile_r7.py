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
    without one). A model's config is a few kB: one over the bound is one line naming it, before any of it is read."""
    ck = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "ck")
    os.truncate(os.path.join(ck, "config.json"), 256 * GiB)
    r = _capped("inspect", ck)
    assert_one_line_error(r, "config.json")
    r = _capped("check", ck, "--json")
    assert r.rc == 1 and "Traceback" not in r.err and "MemoryError" not in r.err, r.err
    assert "config.json" in r.out
