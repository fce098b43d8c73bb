"""A staging folder's marker names the pid namespace its writer ran in: containers with host networking share the
host's name and a checkpoint volume, not their pids, so a live writer's pid in another container read as a dead one
here, and the next gen or save into the same place removed that writer's staging folder under it. Now a marker of
another namespace (or of none, as written before) is never judged: its folder stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ckptbench.core import staging


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _marked(parent, base: str, **fields) -> str:
    name = f".{base}.tmp-{staging.host()}-{fields['pid']}"
    os.mkdir(parent / name)
    (parent / name / "part.bin").write_bytes(b"half")
    doc = {"folder": name, "host": staging.host(), **fields}
    (parent / name / staging.MARKER).write_text(json.dumps(doc))
    return name


def test_a_marker_of_another_pid_namespace_is_not_judged_here(tmp_path):
    dead = _dead_pid()
    other = _marked(tmp_path, "ck", pid=dead, pidns="pid:[1]")  # another container's: its pid means nothing here
    old = _marked(tmp_path, "ck2", pid=dead)  # no namespace: a marker written before it was recorded
    assert staging.reap_stale(str(tmp_path), "ck") == []
    assert staging.reap_stale(str(tmp_path), "ck2") == []
    for n in (other, old):
        assert (tmp_path / n / "part.bin").read_bytes() == b"half"


def test_a_marker_of_this_namespace_and_a_dead_pid_is_removed(tmp_path):
    name = _marked(tmp_path, "ck", pid=_dead_pid(), pidns=staging.pid_space())
    assert staging.reap_stale(str(tmp_path), "ck") == [str(tmp_path / name)]
    assert not (tmp_path / name).exists()


def test_the_marker_gen_and_save_write_names_this_namespace(tmp_path):
    tmp = staging.make_staging(str(tmp_path / "ck"))
    doc = json.loads((tmp_path / os.path.basename(tmp) / staging.MARKER).read_text())
    assert doc["pidns"] == os.readlink("/proc/self/ns/pid") and doc["pid"] == os.getpid()
