"""Hostile input to results files, fifth pass: a link put in place of a results file while a run records, lines far
longer than any ckptbench writes, recorded numbers no run can have had (compare's --json was not JSON, history
printed 300 digits), credentials edited into recorded text, and compare's hint for the kind it compared.

Results files are written by the real CLI (run, save), then edited as a hostile user would."""

from __future__ import annotations

import csv
import json
import os
import shutil
import tracemalloc

import pytest
from clirun import assert_one_line_error, run_cli

from ckptbench.core.errors import CkptbenchError
from ckptbench.records import results

SECRET = "sEcReT"
HOSTILE_SOURCE = f"/x s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@b password={SECRET}"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, str]:
    """Two restore runs (one repeat each) and two save runs (--count 2) recorded by the CLI: {"restore": path,
    "save": path}, each with its .jsonl."""
    where = tmp_path_factory.mktemp("h5")
    ckpt = where / "ck"
    r = run_cli("gen", "small", ckpt, "--scale", "0.02", "--format", "safetensors")
    assert r.rc == 0, r.err
    out = {"restore": str(where / "r.csv"), "save": str(where / "save.csv")}
    for _ in range(2):
        # cold: plan --nodes takes a run's rate only where its bytes came from the storage (an as-is run of files
        # just written read the page cache)
        r = run_cli("run", ckpt, "--repeat", "1", "--cache", "cold", "--json", "--results", out["restore"])
        assert r.rc == 0, r.err
    for _ in range(2):
        r = run_cli("save", ckpt, where / "target", "--count", "2", "--json", "--results", out["save"])
        assert r.rc == 0, r.err
    return out


def _copy(recorded, tmp_path, kind: str = "restore") -> str:
    path = str(tmp_path / os.path.basename(recorded[kind]))
    shutil.copyfile(recorded[kind], path)
    shutil.copyfile(recorded[kind] + ".jsonl", path + ".jsonl")
    return path


def _edit_rows(path: str, edit) -> None:
    """edit(row as a dict) on every row, written back as the CSV it was."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = rows[0]
    for values in rows[1:]:
        one = dict(zip(head, values))
        edit(one)
        values[:] = [one[c] for c in head]
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


def _edit_runs(path: str, edit) -> None:
    """edit(document) on every run document of the .jsonl, written back as JSON (NaN as Python writes it)."""
    with open(path + ".jsonl") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    for d in docs:
        if d.get("record") == "run":
            edit(d)
    with open(path + ".jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)


def _strict_json(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in --json"))


def _ids(path: str) -> list[str]:
    return list(dict.fromkeys(r["run_id"] for r in results.read_rows(path)))


# --- 1. never written through a link put in place after the check ---------------------------------------------------

def _swap_in_link(path: str, to: str) -> None:
    """`path` replaced by a symbolic link to `to` in one rename, as `ln -s; mv -T` does it."""
    os.symlink(to, path + ".new")
    os.replace(path + ".new", path)


def test_a_link_swapped_in_for_the_documents_after_the_check_is_refused(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    results.check_writable(path)  # before the run: a regular file of ours
    _swap_in_link(path + ".jsonl", str(victim))
    with pytest.raises(CkptbenchError, match="r.csv.jsonl: a symbolic link; results are never written through one"):
        results.append_document(path, {"record": "run", "run_id": "late"})
    assert victim.read_text() == "precious\n"


def test_a_link_to_nothing_planted_after_the_check_creates_nothing(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    os.unlink(path + ".jsonl")  # no documents yet: the first append creates the file
    results.check_writable(path)
    target = tmp_path / "made-by-root.txt"
    _swap_in_link(path + ".jsonl", str(target))
    with pytest.raises(CkptbenchError, match="a symbolic link"):
        results.append_document(path, {"record": "run", "run_id": "late"})
    assert not target.exists()


def test_a_results_file_swapped_for_a_link_to_a_copy_is_refused(recorded, tmp_path):
    """The victim is a copy of the results file: checked by following the link, it passed as ours."""
    path = _copy(recorded, tmp_path)
    victim = tmp_path / "victim.csv"
    shutil.copyfile(path, victim)
    before = victim.read_bytes()
    results.check_writable(path)
    row = results.read_rows(path)[0]
    _swap_in_link(path, str(victim))
    with pytest.raises(CkptbenchError, match="a symbolic link"):
        results.append(path, [row | {"run_id": "late", "repeat": 1}])
    assert victim.read_bytes() == before


def test_a_link_put_in_place_between_the_rows_check_and_the_write_is_refused(recorded, tmp_path, monkeypatch):
    """The swap lands after append() checked the file is ours and before it writes: the write path is the real one."""
    path = _copy(recorded, tmp_path)
    victim = tmp_path / "victim.csv"
    shutil.copyfile(path, victim)
    before = victim.read_bytes()
    row = results.read_rows(path)[0]
    checked = results._rows_in

    def check_then_swap(*args, **kwargs):
        got = checked(*args, **kwargs)
        _swap_in_link(path, str(victim))
        return got

    monkeypatch.setattr(results, "_rows_in", check_then_swap)
    with pytest.raises(CkptbenchError, match="replaced while being appended to"):
        results.append(path, [row | {"run_id": "late", "repeat": 1}])
    assert victim.read_bytes() == before


@pytest.mark.parametrize("which", ["", ".jsonl"])
def test_a_results_link_is_refused_before_the_run(recorded, tmp_path, which):
    """append() refuses a link when it writes: the check before the run says so first, not after the run."""
    path = _copy(recorded, tmp_path)
    real = tmp_path / "real"
    os.replace(path + which, real)
    os.symlink(real, path + which)
    with pytest.raises(CkptbenchError, match=f"r.csv{which}: a symbolic link"):
        results.check_writable(path)


def test_documents_still_append_to_a_file_of_ours(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    with open(path + ".jsonl", "ab") as f:
        f.write(b'{"record": "repeat", "torn')  # a crash's half line: the next document starts on its own line
    results.append_document(path, {"record": "run", "run_id": "next"})
    assert results.read_documents(path, "run")[-1]["run_id"] == "next"


# --- 2. a line longer than any ckptbench writes ----------------------------------------------------------------------

@pytest.mark.parametrize("command", ["history", "compare"])
def test_a_sparse_run_of_nuls_after_the_documents_is_one_line_and_not_read_whole(recorded, tmp_path, command):
    """256 MiB of NULs (truncate -s +256M) was read as one line: 550 MB of memory, then skipped as torn."""
    path = _copy(recorded, tmp_path)
    lines = sum(1 for _ in open(path + ".jsonl", "rb"))
    os.truncate(path + ".jsonl", os.path.getsize(path + ".jsonl") + (256 << 20))
    tracemalloc.start()
    try:
        r = run_cli(command, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_one_line_error(r, f"r.csv.jsonl:{lines + 1}: a line over 64 MiB, longer than any document")
    assert peak < 200 << 20, f"{peak >> 20} MiB"


def test_a_nul_line_in_the_rows_is_one_line(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    lines = sum(1 for _ in open(path, "rb"))
    os.truncate(path, os.path.getsize(path) + (16 << 20))
    assert_one_line_error(run_cli("history", path), f"r.csv:{lines + 1}: a line over 1 MiB, longer than any row")


def test_a_long_document_of_ours_is_read_back(recorded, tmp_path):
    """The cap is far above what a run writes: a run document of 20 000 repeats (~22 MB, over the old first-line
    limit too) still reads, and documents still append after it."""
    path = str(tmp_path / "r.csv")
    one = results.read_documents(recorded["restore"], "run")[0]
    many = one | {"run_id": "long", "repeats": one["repeats"] * 20_000}
    results.append_document(path, many)
    results.append_document(path, {"record": "run", "run_id": "after"})
    assert os.path.getsize(path + ".jsonl") > 16 << 20
    docs = results.read_documents(path, "run")
    assert [d["run_id"] for d in docs] == ["long", "after"] and len(docs[0]["repeats"]) == 20_000


# --- 3. compare --json is JSON ----------------------------------------------------------------------------------------

def test_compare_a_floor_of_1e308_gives_no_infinite_efficiency(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    _edit_runs(path, lambda d: d.update(floor_s=1e308, efficiency=0.5))
    r = run_cli("compare", "--json", path)
    assert r.rc in (0, 1), r.err
    doc = _strict_json(r.out)
    assert "efficiency" not in [f["figure"] for f in doc["figures"]]
    text = run_cli("compare", path)
    assert "inf" not in text.out and "nan" not in text.out


def test_compare_a_nan_in_a_recorded_env_is_null_in_json(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    newest = _ids(path)[-1]

    def nan_torch(row):
        if row["run_id"] == newest:
            row["env"] = json.dumps(json.loads(row["env"]) | {"torch": float("nan"), "cpu_count": 1e300})

    _edit_rows(path, nan_torch)
    r = run_cli("compare", "--json", path)
    assert r.rc in (0, 1), r.err
    diff = _strict_json(r.out)["env_diff"]
    assert diff["torch"][1] is None and diff["cpu_count"][1] == "1e+300"
    assert "0" * 50 not in run_cli("compare", path).out  # 1e300 cores are not printed digit by digit


# --- 4. history takes only what compare takes -------------------------------------------------------------------------

def test_history_a_check_stage_of_minus_1e300_holds_no_run_for_1e300_s(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    _edit_rows(path, lambda row: row.update(check_s="-1e300"))
    _edit_runs(path, lambda d: d.update(check="model step"))
    assert_one_line_error(run_cli("compare", path), "records check_s -1e+300, out of range")
    r = run_cli("history", "--json", path)
    assert r.rc == 0, r.err
    runs = _strict_json(r.out)["runs"]
    assert len(runs) == 2 and all(run["held_s"] is None and 0 < run["figure_s"] < 100 for run in runs)
    text = run_cli("history", path)
    assert text.rc == 0 and "0" * 50 not in text.out and "less the model's first step" not in text.out


@pytest.mark.parametrize("efficiency", [1e308, -5, float("nan")])
def test_history_an_efficiency_no_run_can_have_is_none(recorded, tmp_path, efficiency):
    path = _copy(recorded, tmp_path)
    _edit_runs(path, lambda d: d.update(floor_s=0.01, efficiency=efficiency))
    r = run_cli("history", "--json", path)
    assert r.rc == 0, r.err
    assert [run["efficiency"] for run in _strict_json(r.out)["runs"]] == [None, None]
    text = run_cli("history", path)
    assert "efficiency" not in text.out and "inf" not in text.out


def test_history_an_efficiency_a_run_can_have_is_shown(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    _edit_runs(path, lambda d: d.update(floor_s=0.01, efficiency=0.5))
    assert "efficiency 50 %" in run_cli("history", path).out


# --- 5. credentials edited into recorded text ----------------------------------------------------------------------

def test_history_json_redacts_a_recorded_source(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    _edit_rows(path, lambda row: row.update(source=HOSTILE_SOURCE))
    for args in (("--json",), ()):
        r = run_cli("history", *args, path)
        assert r.rc == 0, r.err
        assert SECRET not in r.out and "AKIA" not in r.out and "password=<redacted>" in r.out


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_plan_nodes_redacts_the_newest_run_it_did_not_use(recorded, tmp_path, args):
    path = _copy(recorded, tmp_path)
    _edit_rows(path, lambda row: row.update(source=HOSTILE_SOURCE))
    r = run_cli("plan", "7b", "--nodes", "4", "--storage", "fsx-lustre", "--results", path, *args)
    assert r.rc == 0, r.err
    assert "not fsx-lustre (lustre), the storage this plan is for" in r.out
    assert SECRET not in r.out and "AKIA" not in r.out and "password=<redacted>" in r.out


def test_plan_nodes_redacts_the_run_it_measured_from(recorded, tmp_path):
    from ckptbench.plan.scale import measured_rank_read

    path = _copy(recorded, tmp_path)
    _edit_rows(path, lambda row: row.update(source=HOSTILE_SOURCE, run_id=f"token={SECRET}-{row['run_id']}"))
    got = measured_rank_read(path)
    assert got["source"] == "measured-restore"
    assert SECRET not in json.dumps(got) and "password=<redacted>" in got["where"]


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_compare_redacts_recorded_settings_and_environment(recorded, tmp_path, args):
    path = _copy(recorded, tmp_path)
    newest = _ids(path)[-1]

    def leak(row):
        if row["run_id"] == newest:
            row["hash"] = f"token={SECRET}"
            row["env"] = json.dumps(json.loads(row["env"]) | {"cpu_model": f"x password={SECRET}"})

    _edit_rows(path, leak)
    r = run_cli("compare", path, *args)
    assert r.rc in (0, 1), r.err
    assert SECRET not in r.out + r.err
    said = _strict_json(r.out)["env_diff"] if args else r.out
    assert "token=<redacted>" in str(said) and "password=<redacted>" in str(said)


# --- 6. the hint names the option of the kind compared ----------------------------------------------------------------

def _regressed(path: str, slower: str, faster: str | None = None) -> tuple[str, str]:
    """(newest, baseline): the two runs recorded, oldest as the baseline, with the newest's `slower` figure set to 3×
    the baseline's largest (and its `faster` figure to a third of the baseline's smallest). Three times its own
    figure was not always a regression: the first save of a fresh process has been 3× slower than the second."""
    baseline, newest = _ids(path)
    with open(path, newline="") as f:
        base = [row for row in csv.DictReader(f) if row["run_id"] == baseline]
    worst = 3 * max(float(row[slower]) for row in base)
    least = min(float(row[faster]) for row in base) / 3 if faster else None

    def edit(row):
        if row["run_id"] == newest:
            row[slower] = str(worst)
            if faster:
                row[faster] = str(least)

    _edit_rows(path, edit)
    return newest, baseline


def test_compare_two_saves_of_one_repeat_names_count_not_repeat(recorded, tmp_path):
    path = _copy(recorded, tmp_path, "save")
    newest, baseline = _regressed(path, "durable_s", "write_gbps")
    r = run_cli("compare", path, "--newest", newest, "--baseline", baseline)
    assert r.rc == 1, r.err
    assert "--count 4 or more on both runs" in r.err and "--repeat" not in r.err


def test_compare_two_restores_of_one_repeat_names_repeat(recorded, tmp_path):
    path = _copy(recorded, tmp_path)
    newest, baseline = _regressed(path, "rto_s")
    r = run_cli("compare", path, "--newest", newest, "--baseline", baseline)
    assert r.rc == 1, r.err
    assert "--repeat 3 or more on both runs" in r.err


def test_every_kind_has_its_own_way_to_more_samples():
    """The hint was one text for all: a watch has no option for more samples, and says so."""
    from ckptbench.records.compare import MORE_SAMPLES
    from ckptbench.records.schema import KINDS

    assert set(MORE_SAMPLES) == set(KINDS)
    assert "--repeat" not in MORE_SAMPLES["save"] and "--count" in MORE_SAMPLES["save"]
    assert "noise stays unknown" in MORE_SAMPLES["watch"]
