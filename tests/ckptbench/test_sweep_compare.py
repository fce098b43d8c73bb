"""`ckptbench sweep` (throughput per concurrency and the knee) and `ckptbench compare` (newest run against a
baseline, beyond threshold and beyond noise, loud about environment differences)."""

from __future__ import annotations

import csv
import json
import shutil
import statistics

import pytest
from clirun import Run, assert_one_line_error, run_cli

from ckptbench.core.errors import CkptbenchError
from ckptbench.records.deltas import MIN_SECONDS

SCALE = "0.02"
STAGE_COLUMNS = ["list_s", "read_s", "verify_s", "load_s", "device_s", "check_s"]


Result = Run
cli = run_cli


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    target = tmp_path_factory.mktemp("sc-ckpt") / "ckpt"
    r = cli("gen", "small", target, "--scale", SCALE, "--format", "safetensors", "--ranks", "2")
    assert r.rc == 0, r.err
    return str(target)


# --- sweep ---

def test_sweep_json_reports_every_level_and_a_knee_among_them(ckpt):
    r = cli("sweep", ckpt, "--levels", "4,1,2", "--repeat", "1", "--cache", "hot", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["levels"] == [1, 2, 4]
    assert set(doc["gbps"]) == {"1", "2", "4"}
    medians = {int(k): v["median"] for k, v in doc["gbps"].items()}
    assert all(m > 0 for m in medians.values())
    assert all(v["n"] == 1 for v in doc["gbps"].values())
    assert doc["knee"] in (1, 2, 4) and doc["best"] in (1, 2, 4)
    assert medians[doc["best"]] == max(medians.values())
    within = [lv for lv in sorted(medians) if medians[lv] >= 0.9 * medians[doc["best"]]]
    assert doc["knee"] == within[0]
    assert doc["recommendation"] == f"--concurrency {doc['knee']}"
    assert doc["cache"] == "hot" and doc["cache_verified"] is True
    # what each read did, as `read` says it (a level and `read -c` at that level differed by the hash, unsaid)
    assert doc["hash"] == "none" and doc["read"] == "pread" and "page cache" in doc["read_why"], doc


def test_sweep_text_marks_the_knee(ckpt):
    r = cli("sweep", ckpt, "--levels", "1,2", "--repeat", "1", "--cache", "hot", "--hash", "xxh64")
    assert r.rc == 0, r.err
    assert "; hash xxh64; read path pread;" in r.out.splitlines()[0], r.out
    marked = [line for line in r.out.splitlines() if "knee" in line and "←" in line]
    assert len(marked) == 1
    assert "recommendation: --concurrency" in r.out


@pytest.mark.parametrize("levels", ["1,x", "0", "", "1,2000"])
def test_sweep_bad_levels_exit_2_with_one_line(ckpt, levels):
    assert_one_line_error(cli("sweep", ckpt, "--levels", levels, "--repeat", "1"), "--levels")


def test_sweep_missing_source_exits_2(tmp_path):
    assert_one_line_error(cli("sweep", tmp_path / "nope", "--levels", "1", "--repeat", "1"), "nope")


@pytest.mark.parametrize(
    "medians, margin, expected",
    [
        ({1: 1.0, 8: 4.0, 16: 5.4, 32: 5.5}, 0.1, (16, 32)),
        # 5.0 is within 10 % of 5.5 (5.0 >= 4.95): the knee is already at 8
        ({1: 1.0, 8: 5.0, 16: 5.4, 32: 5.5}, 0.1, (8, 32)),
        ({1: 1.0, 8: 5.0, 16: 5.4, 32: 5.5}, 0.0, (32, 32)),
        ({1: 1.0, 8: 5.0, 16: 5.4, 32: 5.5}, 0.5, (8, 32)),
        ({1: 6.0, 8: 2.0, 16: 6.5}, 0.1, (1, 16)),  # not monotonic: the smallest level that is close enough
        ({64: 3.0, 1: 0.5, 16: 2.9}, 0.1, (16, 64)),  # keys in any order
        ({4: 2.0}, 0.1, (4, 4)),
    ],
)
def test_knee_on_hand_made_medians(medians, margin, expected):
    from ckptbench.restore.sweep import knee

    assert knee(medians, margin) == expected


def test_knee_default_margin_is_ten_percent():
    from ckptbench.restore.sweep import knee

    assert knee({1: 8.9, 2: 10.0}) == (2, 2)
    assert knee({1: 9.1, 2: 10.0}) == (1, 2)


@pytest.mark.parametrize("text, expected", [("1,8,16", [1, 8, 16]), ("16, 1 ,8,8", [1, 8, 16]), ("1024", [1024])])
def test_parse_levels(text, expected):
    from ckptbench.restore.sweep import parse_levels

    assert parse_levels(text) == expected


@pytest.mark.parametrize("text", ["1,x", "0", "", ",", "-1,4", "1,1025", "2.5"])
def test_parse_levels_rejects(text):
    from ckptbench.restore.sweep import parse_levels

    with pytest.raises(CkptbenchError, match="--levels"):
        parse_levels(text)


# --- compare ---

def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def recorded(ckpt, tmp_path_factory):
    """A results file holding two real runs of two repeats each."""
    path = tmp_path_factory.mktemp("compare") / "R.csv"
    ids = []
    for _ in range(2):
        r = cli("run", ckpt, "--repeat", "2", "--json", "--results", path)
        assert r.rc == 0, r.err
        ids.append(json.loads(r.out)["run_id"])
    return path, ids


def crafted(recorded, tmp_path, make_rows) -> str:
    """A copy of the recorded file plus rows appended through results.append: make_rows(baseline rows) -> rows."""
    from ckptbench.records import results

    src, ids = recorded
    path = tmp_path / "R.csv"
    shutil.copy(src, path)
    base = [r for r in read_csv(src) if r["run_id"] == ids[-1]]
    rows = make_rows([dict(r, env=json.loads(r["env"])) for r in base])
    results.append(str(path), rows)
    return str(path)


def test_compare_two_real_runs_follows_threshold_and_noise(recorded):
    """The verdict, judged here from the CSV: worse by more than 5 % and every new repeat worse than every old."""
    path, ids = recorded
    rows = read_csv(path)
    figures = ["rto_s", *STAGE_COLUMNS, "peak_rss_bytes", "cpu_s"]
    regressed = []
    rto = statistics.median(float(r["rto_s"]) for r in rows if r["run_id"] == ids[0])
    for fig in figures:
        b = [float(r[fig]) for r in rows if r["run_id"] == ids[0]]
        n = [float(r[fig]) for r in rows if r["run_id"] == ids[1]]
        mb, mn = statistics.median(b), statistics.median(n)
        # seconds: a change under a millisecond, or a stage's under 1 % of the RTO, is too small to count
        least = max(0.001, 0.01 * rto if fig != "rto_s" else 0.0) if fig.endswith("_s") else 0.0
        if mb and (mn - mb) / mb * 100 > 5 and min(n) > max(b) and mn - mb >= least:
            regressed.append(fig)
    b = [float(r["read_gbps"]) for r in rows if r["run_id"] == ids[0]]
    n = [float(r["read_gbps"]) for r in rows if r["run_id"] == ids[1]]
    if (statistics.median(n) - statistics.median(b)) / statistics.median(b) * 100 < -5 and max(n) < min(b):
        regressed.append("read_gbps")
    r = cli("compare", path, "--json")
    doc = json.loads(r.out)
    assert doc["baseline"] == ids[0] and doc["newest"] == ids[1]
    # no floor was cached for these runs (the module's own cache): efficiency, which this does not judge, is absent
    assert "efficiency" not in json.dumps(doc["figures"])
    assert sorted(doc["regressions"]) == sorted(regressed)
    assert r.rc == (1 if regressed else 0)


def test_compare_identical_rerun_exits_0(recorded, tmp_path):
    path = crafted(recorded, tmp_path, lambda base: [dict(r, run_id="same") for r in base])
    r = cli("compare", path)
    assert r.rc == 0, r.err
    assert "REGRESSION" not in r.out
    assert "WARNING" not in r.out
    assert f"newest same against baseline {recorded[1][-1]}" in r.out


def test_compare_doubled_times_is_a_regression_naming_rto(recorded, tmp_path):
    def slower(base):
        out = []
        for r in base:
            row = dict(r, run_id="slow")
            for fig in ["rto_s", *STAGE_COLUMNS]:
                row[fig] = repr(2 * max(float(b[fig]) for b in base))
            out.append(row)
        return out

    path = crafted(recorded, tmp_path, slower)
    r = cli("compare", path)
    assert r.rc == 1
    assert "rto_s" in r.err and "regression" in r.err
    rto_line = [line for line in r.out.splitlines() if line.split()[:1] == ["rto_s"]]
    assert len(rto_line) == 1 and "REGRESSION" in rto_line[0]
    doc = json.loads(cli("compare", path, "--json").out)
    assert "rto_s" in doc["regressions"] and "read_s" in doc["regressions"]
    rto = next(f for f in doc["figures"] if f["figure"] == "rto_s")
    assert rto["change_pct"] >= 100 - 1e-9


def test_compare_json_says_each_figures_verdict_in_the_texts_words(recorded, tmp_path):
    """--json had the flags (regression, improved, too_small …) and not the verdict the text prints beside each
    figure: a script had to re-derive it, and could say otherwise."""
    def slower(base):
        return [dict(r, run_id="slow", rto_s=repr(2 * max(float(b["rto_s"]) for b in base))) for r in base]

    path = crafted(recorded, tmp_path, slower)
    text = cli("compare", path).out.splitlines()
    figures = json.loads(cli("compare", path, "--json").out)["figures"]
    assert next(f for f in figures if f["figure"] == "rto_s")["verdict"] == "REGRESSION"
    for f in figures:
        line = next(ln for ln in text if ln.split()[:1] == [f["figure"]])
        if f["verdict"] is None:
            assert not line.rstrip().endswith(")") and "REGRESSION" not in line and "improved" not in line, line
        else:
            assert f["verdict"] in line, (f, line)


def test_compare_change_within_threshold_exits_0(recorded, tmp_path):
    def a_bit_slower(base):
        return [dict(r, run_id="bit", **{f: repr(float(r[f]) * 1.02) for f in ["rto_s", *STAGE_COLUMNS]})
                for r in base]

    path = crafted(recorded, tmp_path, a_bit_slower)
    r = cli("compare", path, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["regressions"] == []
    rto = next(f for f in doc["figures"] if f["figure"] == "rto_s")
    assert rto["change_pct"] == pytest.approx(2.0)
    # the same change against a 1 % threshold is a regression when it is also beyond the noise
    strict = cli("compare", path, "--threshold", "1", "--json")
    base = sorted(float(r["rto_s"]) for r in read_csv(recorded[0]) if r["run_id"] == recorded[1][-1])
    beyond = min(base) * 1.02 > max(base)
    # a change of the median under compare's MIN_SECONDS is the timer's grain, never a regression (a fresh-clone run
    # recorded RTOs of about 20 ms, whose 2 % is 0.4 ms)
    beyond = beyond and statistics.median(base) * 0.02 >= MIN_SECONDS
    assert ("rto_s" in json.loads(strict.out)["regressions"]) == beyond


def test_compare_big_change_within_the_noise_is_not_a_regression(recorded, tmp_path):
    def noisy(base):
        lo = min(float(r["rto_s"]) for r in base)
        hi = max(float(r["rto_s"]) for r in base)
        rows = [dict(r, run_id="noisy") for r in base]
        rows[0]["rto_s"], rows[1]["rto_s"] = repr(lo), repr(10 * hi)  # median far up, best repeat as good as before
        return rows

    path = crafted(recorded, tmp_path, noisy)
    r = cli("compare", path, "--json")
    assert r.rc == 0, r.err
    rto = next(f for f in json.loads(r.out)["figures"] if f["figure"] == "rto_s")
    assert rto["change_pct"] > 5
    assert rto["regression"] is False and rto["beyond_noise"] is False


def test_compare_warns_loudly_when_the_environment_differs(recorded, tmp_path):
    def other_kernel(base):
        return [dict(r, run_id="otherk", env=dict(r["env"], kernel="0.0.1-elsewhere")) for r in base]

    path = crafted(recorded, tmp_path, other_kernel)
    r = cli("compare", path)
    assert r.rc == 0, r.err
    assert "WARNING" in r.out
    kernel_lines = [line for line in r.out.splitlines() if "kernel" in line]
    assert kernel_lines and "0.0.1-elsewhere" in kernel_lines[0]
    doc = json.loads(cli("compare", path, "--json").out)
    assert doc["env_diff"]["kernel"][1] == "0.0.1-elsewhere"


def test_compare_warns_when_settings_differ(recorded, tmp_path):
    path = crafted(recorded, tmp_path, lambda base: [dict(r, run_id="staged", mode="staged") for r in base])
    r = cli("compare", path)
    assert "WARNING" in r.out
    assert any("mode" in line and "staged" in line for line in r.out.splitlines())


def test_compare_ignores_failed_runs(recorded, tmp_path):
    def failed(base):
        return [dict(r, run_id="broken", status="failed", rto_s=repr(100 * float(r["rto_s"]))) for r in base]

    path = crafted(recorded, tmp_path, failed)
    doc = json.loads(cli("compare", path, "--json").out)
    assert doc["newest"] == recorded[1][-1] and doc["baseline"] == recorded[1][0]
    assert "broken" not in (doc["newest"], doc["baseline"])


def test_compare_ignores_a_failed_run_with_its_error_counts(recorded, tmp_path):
    """A failed run as `run` records it: status failed and an errors column such as digest_mismatch=1."""
    def failed(base):
        return [dict(r, run_id="broken", status="failed", errors="digest_mismatch=1", success_rate="0.95")
                for r in base]

    path = crafted(recorded, tmp_path, failed)
    r = cli("compare", path, "--json")
    # the two real runs may differ by machine noise: what matters here is which runs were compared
    assert r.rc in (0, 1), r.err
    doc = json.loads(r.out)
    assert doc["newest"] == recorded[1][-1] and doc["baseline"] == recorded[1][0]


def test_compare_explicit_baseline(recorded, tmp_path):
    path = crafted(recorded, tmp_path, lambda base: [dict(r, run_id="third") for r in base])
    doc = json.loads(cli("compare", path, "--baseline", recorded[1][0], "--json").out)
    assert doc["baseline"] == recorded[1][0] and doc["newest"] == "third"


def test_compare_unknown_baseline_exits_2(recorded):
    assert_one_line_error(cli("compare", recorded[0], "--baseline", "nosuchrun"), "nosuchrun")


def test_compare_newest_as_baseline_exits_2(recorded):
    assert_one_line_error(cli("compare", recorded[0], "--baseline", recorded[1][-1]), "--baseline")


def test_compare_negative_threshold_exits_2(recorded):
    assert_one_line_error(cli("compare", recorded[0], "--threshold", "-1"), "--threshold")


def test_compare_with_only_one_run_exits_2(recorded, tmp_path):
    src, ids = recorded
    path = tmp_path / "one.csv"
    with open(src) as f:
        lines = f.readlines()
    rows = read_csv(src)
    keep = 1 + sum(1 for r in rows if r["run_id"] == ids[0])
    path.write_text("".join(lines[:keep]))
    assert_one_line_error(cli("compare", path), "two")


def test_compare_missing_file_exits_2(tmp_path):
    assert_one_line_error(cli("compare", tmp_path / "none.csv"), "none.csv")


def test_a_sweep_records_its_knee_where_the_checklist_reads_it(ckpt, tmp_path):
    from ckptbench.restore.sweep import recorded_knee

    results = str(tmp_path / "R.csv")
    r = cli("sweep", ckpt, "--levels", "1,2", "--repeat", "1", "--cache", "hot", "--json", "--results", results)
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    knee = recorded_knee(results, doc["source"])
    assert knee is not None and knee.knee == doc["knee"] and knee.how == "sweep"


def test_compare_an_improvement_beyond_the_noise_says_improved_not_within_noise(recorded, tmp_path):
    def faster(base):
        return [dict(r, run_id="fast", **{f: repr(min(float(b[f]) for b in base) / 3) for f in ["rto_s", *STAGE_COLUMNS]})
                for r in base]

    path = crafted(recorded, tmp_path, faster)
    r = cli("compare", path)
    assert r.rc == 0, r.err
    rto = next(line for line in r.out.splitlines() if line.split()[:1] == ["rto_s"])
    assert rto.rstrip().endswith("improved") and "within noise" not in rto
    doc = json.loads(cli("compare", path, "--json").out)
    assert next(f for f in doc["figures"] if f["figure"] == "rto_s")["improved"] is True


def test_compare_one_repeat_a_side_says_the_noise_is_unknown(recorded, tmp_path):
    path = crafted(recorded, tmp_path, lambda base: [dict(base[0], run_id="one")])
    src = read_csv(recorded[0])
    keep = [r for r in src if r["run_id"] == recorded[1][-1]][:1] + [r for r in read_csv(path) if r["run_id"] == "one"]
    with open(path, "w", newline="") as f:  # the baseline cut to one repeat too
        w = csv.DictWriter(f, fieldnames=list(src[0]))
        w.writeheader()
        w.writerows(keep)
    r = cli("compare", path)
    assert r.rc == 0, r.err
    assert "noise unknown" in r.out and "within noise" not in r.out


def test_compare_defaults_to_the_last_run_made_the_same_way(recorded, tmp_path):
    def hot_then_cold(base):
        return [dict(r, run_id="other-cache", cache="cold") for r in base] + [dict(r, run_id="again") for r in base]

    path = crafted(recorded, tmp_path, hot_then_cold)
    doc = json.loads(cli("compare", path, "--json").out)
    assert doc["newest"] == "again" and doc["baseline"] == recorded[1][-1]  # not the cold run just before it


def test_compare_a_change_too_small_to_matter_is_no_regression(recorded, tmp_path):
    """A verify stage of 0.004 s read +12 % REGRESSION and failed a build on a tenth of a millisecond."""
    def slower_verify(base):
        return [dict(r, run_id="slower", verify_s=repr(float(r["verify_s"]) * 1.5 + 0.0004)) for r in base]

    path = crafted(recorded, tmp_path, slower_verify)
    doc = json.loads(cli("compare", path, "--json").out)
    verify = next(f for f in doc["figures"] if f["figure"] == "verify_s")
    assert "verify_s" not in doc["regressions"] and verify["too_small"], verify
    assert "too small to matter" in cli("compare", path).out


def test_compare_never_holds_another_checkpoint_as_the_default_baseline(recorded, tmp_path):
    """A restore of a torch checkpoint against a safetensors one was a +11479 % REGRESSION and failed the build."""
    path = crafted(recorded, tmp_path, lambda base: [dict(r, run_id="elsewhere", source="/other/ckpt") for r in base])
    r = cli("compare", path)
    assert r.rc == 2 and "no earlier restore run of /other/ckpt" in r.err and "--baseline RUN" in r.err, r.err
    named = cli("compare", path, "--baseline", recorded[1][-1])  # asked for: held, with the difference said
    assert "WARNING" in named.out and "source" in named.out, named.out

