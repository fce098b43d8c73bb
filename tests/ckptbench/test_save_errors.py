"""Bad input to `save`: each one clear line on stderr and a non-zero exit, nothing half-written, the previous save
intact. A full filesystem and a read-only one are real: small tmpfs mounts made here (the tests run as root)."""

from __future__ import annotations

import csv
import os
import subprocess

import pytest
from clirun import assert_one_line_error, run_cli

SCALE = "0.02"  # about 5 MiB a save: one fits in 8 MiB, two do not


@pytest.fixture
def tmpfs(tmp_path):
    """An 8 MiB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def one_line_failure(r, needle: str, rc: int = 1) -> None:
    assert r.rc == rc, r.err
    assert "Traceback" not in r.err
    errors = [line for line in r.err_lines if line.startswith("ckptbench: error: ")]
    assert len(errors) == 1 and needle in errors[0], r.err


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "dcp"])
def test_enospc_mid_save_removes_the_partial_save_and_keeps_the_previous(tmpfs, tmp_path, fmt):
    target, results = tmpfs / "t", tmp_path / "R.csv"
    r = run_cli("save", "small", target, "--scale", SCALE, "--format", fmt, "--keep", "1", "--count", "3",
                "--results", results, "--force")  # --force: past the free-space preflight, into a real ENOSPC
    one_line_failure(r, "no space left on the device while writing step-000002")
    assert "step-000001 is intact" in r.err
    assert os.listdir(target) == ["step-000001"]  # no temporary directory left
    v = run_cli("verify", target / "step-000001")
    assert v.rc == 0 and "OK:" in v.out, v.out + v.err
    with open(results, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(x["kind"], x["repeat"], x["status"]) for x in rows] == [("save", "1", "ok"), ("save", "2", "failed")]


def test_cancel_between_saves_from_another_thread(tmp_path):
    import threading

    from ckptbench.core.errors import Cancelled
    from ckptbench.save.series import SaveOptions, run_save

    cancel = threading.Event()
    seen, failure = [], []

    def on_save(t):
        seen.append(t.name)
        cancel.set()  # as a UI's stop key would, while the run goes on in its worker

    def work():
        try:
            run_save("small", str(tmp_path / "t"), SaveOptions(count=3), scale=float(SCALE), on_save=on_save,
                     cancel=cancel)
        except Cancelled as exc:
            failure.append(exc)

    th = threading.Thread(target=work)
    th.start()
    th.join(120)
    assert not th.is_alive() and len(failure) == 1 and seen == ["step-000001"]
    assert os.listdir(tmp_path / "t") == ["step-000001"]


def test_not_enough_space_stops_at_preflight_before_writing(tmpfs):
    target = tmpfs / "t"
    r = run_cli("save", "small", target, "--scale", SCALE, "--keep", "2", "--results", "")
    one_line_failure(r, "preflight failed: free space")
    assert "[FAIL] free space" in r.out
    assert not os.path.lexists(target)  # the folder this run made is taken back: nothing half-written is left


def test_read_only_target_stops_at_preflight(tmpfs, tmp_path):
    (tmpfs / "t").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    r = run_cli("save", "small", tmpfs / "t", "--scale", SCALE, "--results", tmp_path / "R.csv")
    one_line_failure(r, "preflight failed: rename")
    assert "Read-only file system" in r.err
    assert os.listdir(tmpfs / "t") == []
    assert not os.path.exists(tmp_path / "R.csv")  # nothing measured, nothing recorded
    r = run_cli("save", "small", tmpfs / "new", "--scale", SCALE, "--results", "")
    one_line_failure(r, "cannot create the target directory")


@pytest.mark.parametrize("args, needle", [
    (("--interval", "0"), "--interval"), (("--keep", "0"), "--keep"), (("--count", "0"), "--count"),
    (("--async",), "--format dcp"), (("--format", "dcp", "--stagger", "1"), "--stagger"),
    (("--stagger", "-1"), "--stagger")])
def test_bad_options_are_one_line_and_write_nothing(tmp_path, args, needle):
    r = run_cli("save", "small", tmp_path / "t", "--scale", SCALE, "--results", tmp_path / "R.csv", *args)
    assert_one_line_error(r, needle)
    assert os.listdir(tmp_path) == []


def test_target_inside_the_source_is_refused(tmp_path):
    src = tmp_path / "src"
    r = run_cli("gen", "small", src, "--scale", SCALE, "--ranks", "1")
    assert r.rc == 0, r.err
    before = sorted(os.listdir(src))
    r = run_cli("save", src, src / "saves", "--results", "")
    assert_one_line_error(r, "inside the source")
    assert sorted(os.listdir(src)) == before


def test_saves_are_not_recorded_in_a_schema_1_results_file(tmp_path):
    from ckptbench.records.results import COLUMNS_V1, read_rows

    old = tmp_path / "old.csv"
    old.write_text(",".join(COLUMNS_V1) + "\n")
    before = old.read_bytes()
    r = run_cli("save", "small", tmp_path / "t", "--scale", SCALE, "--results", old)
    assert_one_line_error(r, "schema-1")
    assert old.read_bytes() == before and not os.path.exists(tmp_path / "t")
    assert read_rows(str(old)) == []
