"""New-user pass 16: a restore whose digests differ from the manifest says FAILED (it said 'no reference to compare
with'); a checkpoint named from another working directory, or by a relative path, is the same checkpoint in the
records: check finds the knee a sweep recorded, compare finds the earlier run."""

from __future__ import annotations

import json
import os

import pytest
from clirun import run_proc


def _flip_last_shard(root) -> str:
    shard = sorted(f for f in os.listdir(root) if f.endswith(".safetensors"))[-1]
    path = os.path.join(root, shard)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    return shard


def test_a_digest_mismatch_is_failed_not_unreferenced(ckpt, h, tmp_path):
    bad = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "bad")
    shard = _flip_last_shard(bad)
    r = h.run_cli("run", bad, "--repeat", "2", "--results", "")
    assert r.rc == 1
    assert "FAILED: 2 of 2 repeat(s) did not restore the checkpoint whole (digest mismatch 2)" in r.out, r.out
    assert "no reference to compare with" not in r.out
    assert f"problem: {shard}: crc32c" in r.err
    good = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", "")
    assert good.rc == 0 and "digests: verified against the manifest" in good.out and "FAILED" not in good.out


@pytest.mark.usefixtures("box_floor")
def test_a_checkpoint_named_from_elsewhere_is_one_source_in_the_records(ckpt, tmp_path):
    src = ckpt("safetensors", 1)
    parent, name = os.path.split(src)
    results = tmp_path / "r.csv"
    r = _in(parent, "sweep", name, "--levels", "1,2", "--results", results)
    assert r.rc == 0, r.err
    knees = [json.loads(line) for line in open(f"{results}.jsonl") if '"knee"' in line]
    assert knees and knees[-1]["source"] == os.path.realpath(src)  # recorded resolved, not as typed
    check = _in(str(tmp_path), "check", src, "--results", results, "--json")
    conc = next(i for i in json.loads(check.out)["items"] if i["id"] == "concurrency")
    assert "measured knee" in json.dumps(conc["evidence"]), conc  # the knee swept as a relative path
    for where, named in ((parent, name), (str(tmp_path), src)):
        r = _in(where, "run", named, "--repeat", "1", "--results", results)
        assert r.rc == 0, r.err
    r = _in(str(tmp_path), "compare", results)
    assert r.rc in (0, 1) and "no earlier" not in r.err and "differ" not in r.out + r.err, r.out + r.err


def _in(cwd: str, *args):
    """`ckptbench ARGS` run from `cwd`."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return run_proc(*args)
    finally:
        os.chdir(old)


def test_sysinfo_says_the_floor_was_measured_busy_and_names_the_source(tmp_path, ckpt, h, plant_floor):
    from ckptbench.system import floor as fl

    src = ckpt("safetensors", 1)
    f = plant_floor(4.0)
    f.busy = "the box was busy (planted by the test): `ckptbench floor SOURCE --remeasure` when it is quiet"
    fl._save(fl.cache_path(), f, {})
    r = h.run_cli("sysinfo", src)
    assert r.rc == 0, r.err
    line = next(ln for ln in r.out.splitlines() if ln.startswith("floor measured busy"))
    assert f"`ckptbench floor {src} --remeasure`" in line and "SOURCE" not in line
    assert f"run `ckptbench floor {src}`" in r.out  # the storage figure not measured: the command names it
    doc = json.loads(h.run_cli("sysinfo", src, "--json").out)
    assert "planted by the test" in doc["floor"]["busy"]


def test_floor_write_to_a_missing_directory_says_it_is_missing(tmp_path, h):
    r = h.run_cli("floor", "--write-to", tmp_path / "nope")
    assert r.rc == 2 and "nope: no such directory; --write-to names" in r.err
    (tmp_path / "file").write_text("x")
    assert "file: not a directory" in h.run_cli("floor", "--write-to", tmp_path / "file").err


def test_another_tools_jsonl_beside_the_results_file_is_not_appended_to(tmp_path, ckpt, h):
    results = tmp_path / "results.csv"
    theirs = tmp_path / "results.csv.jsonl"
    theirs.write_text('{"level": "info", "msg": "epoch 3"}\n')
    before = theirs.read_bytes()
    r = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results)
    assert r.rc == 2 and "results.csv.jsonl: not a ckptbench results file" in r.err, r.err
    assert theirs.read_bytes() == before and not results.exists()  # nothing written, nothing lost
    theirs.write_text("")  # an empty one is ours to start
    assert h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results).rc == 0
    assert json.loads(theirs.read_text().splitlines()[0])["run_id"]


def test_a_cancelled_repeat_is_not_counted_as_a_repeat(tmp_path, h):
    """A new user's run of 2 repeats, stopped in its third, read '3 repeats' in history."""
    from ckptbench.records import history, recorder
    from ckptbench.restore.runner import RepeatResult, RunOptions
    from ckptbench.system.pagecache import CacheCondition

    def rep(rto_s: float) -> RepeatResult:
        return RepeatResult(stages={"read": rto_s}, notes={}, rto_s=rto_s, bytes=10, files=1, files_restored=1,
                            read_gbps=1.0, engine_gbps=1.0, retries=0, errors={},
                            cache=CacheCondition("as-is", 0.0, True), peak_rss_bytes=1, cpu_s=0.0)

    path = str(tmp_path / "R.csv")
    rec = recorder.Recorder(path, "stopped1", "/ck", "safetensors", RunOptions(), {"date": "2024-01-01"})
    reps = [rep(1.0), rep(1.2)]
    for r in reps:
        rec.repeat(r)
    rec.stopped({"read": 0.1}, "cancelled")
    rec.finish(reps, {})
    (run,) = history.runs(path)
    assert run["repeats"] == 2 and run["cancelled"] == 1
    out = h.run_cli("history", path).out
    assert "2 repeats (+1 cancelled)" in out, out


def test_compare_takes_a_saves_rate_as_save_prints_it(tmp_path, h):
    """Save's sustained rate is its bytes over the median time until durable after the first save; compare took
    the median of the per-save rates, another figure for an even count of saves."""
    import statistics


    from ckptbench.records.results import read_rows

    path = str(tmp_path / "S.csv")
    for i in range(2):
        r = h.run_cli("save", "small", tmp_path / f"t{i}", "--scale", "0.02", "--no-fsync", "--count", "3",
                      "--results", path, "--json")
        assert r.rc == 0, r.err
        printed = json.loads(r.out)["sustained_gbps"]
    rows = [r for r in read_rows(path) if r["repeat"] != 1]  # after the first save
    newest = [r for r in rows if r["run_id"] == rows[-1]["run_id"]]
    want = statistics.median(r["bytes"] for r in newest) / statistics.median(r["durable_s"] for r in newest) / 1e9
    assert printed == pytest.approx(want)
    doc = json.loads(h.run_cli("compare", path, "--json").out)
    fig = next(f for f in doc["figures"] if f["figure"] == "write_gbps")
    assert fig["newest"]["median"] == pytest.approx(want)


def test_a_ctrl_c_a_loader_swallowed_stops_the_run_as_interrupted(ckpt, monkeypatch):
    """torch turns a Ctrl-C that lands in its read into an AttributeError, which the format's loader calls a corrupt
    shard: a single-process run reported a damaged file and exit 1 where the user had pressed Ctrl-C."""
    import os
    import signal


    from ckptbench.core.errors import CkptbenchError
    from ckptbench.restore import runner

    def execute(self):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the "loader" runs: its handler runs on return
        except KeyboardInterrupt:  # swallowed, as torch does, and turned into a load error
            raise CkptbenchError("model-00001-of-00001.safetensors: corrupt or truncated") from None
        raise AssertionError("the interrupt never came")

    monkeypatch.setattr(runner.Run, "execute", execute)
    with pytest.raises(KeyboardInterrupt):
        runner.run(ckpt("safetensors", 1), runner.RunOptions(), repeats=1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler given back
