"""From a new user's pass: plan gave a small model's parameters in billions ("0.021 B"); `watch python -c pass`
(no `--`) was refused as "unrecognized arguments: -c pass", and a job's own `--json` or `--source` was taken as
watch's; a sweep stopped by Ctrl-C kept nothing of the levels it had read."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from clirun import run_cli, run_proc
from conftest import SCALE


# plan and gen: a parameter count in the unit that keeps it short

@pytest.mark.parametrize("n, text", [(21_130_240, "21.1 M"), (6_723_000_000, "6.7 B"), (64_991_000_000, "65.0 B"),
                                     (363_904, "363.9 K"), (999_960, "1.0 M"), (999_940, "999.9 K"), (512, "512")])
def test_a_count_reads_in_the_unit_that_keeps_it_short(n, text):
    from ckptbench.core.units import human_count

    assert human_count(n) == text


@pytest.mark.parametrize("profile, said", [("small", "small: 21.1 M parameters ("), ("7b", "7b: 6.7 B parameters (")])
def test_plan_says_a_models_parameters_in_millions_or_billions(profile, said):
    r = run_cli("plan", profile)
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].startswith(said), r.out
    assert "0.021 B" not in r.out


def test_plan_json_keeps_the_exact_count():
    from ckptbench.checkpoint import profiles

    r = run_cli("plan", "small", "--json")
    assert r.rc == 0, r.err
    params = json.loads(r.out)["params"]
    assert params == profiles.load("small").dims.param_count and isinstance(params, int)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small checkpoint of this module's own (the sweeps read it), and what gen said writing it."""
    target = tmp_path_factory.mktemp("nu17") / "ckpt"
    r = run_cli("gen", "small", target, "--scale", SCALE)
    assert r.rc == 0, r.err
    return str(target), r


def test_gen_says_the_parameters_in_the_unit_that_keeps_them_short(small):
    from ckptbench.checkpoint import profiles
    from ckptbench.core.units import human_count

    _, r = small
    count = profiles.load("small").scaled(float(SCALE)).dims.param_count
    assert f", {human_count(count)} parameters" in r.out and " K parameters" in r.out, r.out


# watch: a command given without `--` is the job's, every word of it

@pytest.mark.parametrize("argv, want", [
    (["watch", "true"], ["watch", "--", "true"]),
    (["watch", "python", "-c", "pass"], ["watch", "--", "python", "-c", "pass"]),
    (["watch", "--interval", "0.1", "--no-verdict", "sh", "--json"],
     ["watch", "--interval", "0.1", "--no-verdict", "--", "sh", "--json"]),
    (["watch", "--interval=0.1", "--res", "", "sh"], ["watch", "--interval=0.1", "--res", "", "--", "sh"]),
    (["watch", "--", "python", "-c", "pass"], ["watch", "--", "python", "-c", "pass"]),
    (["watch", "1234", "--json"], ["watch", "1234", "--json"]),  # a PID: the options after it are watch's
    (["watch", "12ab"], ["watch", "12ab"]),  # said not to be a PID, as before
    (["watch", "--match", "train.py"], ["watch", "--match", "train.py"]),
    (["watch", "-x", "true"], ["watch", "-x", "true"]),  # an option watch has not: argparse's one line
    (["run", "ckpt", "-c", "4"], ["run", "ckpt", "-c", "4"]),
])
def test_the_first_word_not_an_option_of_watch_starts_the_job(argv, want):
    from ckptbench.cli.root import job_after_dashes

    assert job_after_dashes(argv) == want


def test_watch_without_dashes_runs_the_job_with_its_own_options():
    """`-c`, `--json` and `--source` are the job's: before, `-c pass` was refused and `--json`/`--source` were
    taken as watch's (a --source of the job's made watch refuse a checkpoint it never meant)."""
    job = "import sys; print('job argv', sys.argv[1:])"
    r = run_proc("watch", "--no-verdict", "--results", "", "--interval", "0.05", sys.executable, "-c", job,
                 "--json", "--source", "nowhere")
    assert r.rc == 0, r.err
    assert "job argv ['--json', '--source', 'nowhere']" in r.out
    assert "watched " in r.out and "exit 0" in r.out  # watch's own text: its --json was not given


def test_watch_python_dash_c_without_dashes_is_watched():
    r = run_proc("watch", "--no-verdict", "--results", "", "--interval", "0.05", sys.executable, "-c", "pass")
    assert r.rc == 0, r.err
    assert "unrecognized" not in r.err and "watched " in r.out


# sweep: Ctrl-C keeps the reads that finished

def _interrupt_at(monkeypatch, call: int, swallow: bool = False) -> None:
    """The sweep's `call`-th read gets a Ctrl-C as it starts (the reads before it finished); `swallow`: as a client
    library would, turned into an error of ours."""
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.restore import sweep as sweep_mod

    real, calls = sweep_mod.read_source, []

    def read_source(*a, **kw):
        calls.append(1)
        if len(calls) == call:
            try:
                os.kill(os.getpid(), signal.SIGINT)  # its handler raises here, in the main thread
            except KeyboardInterrupt:
                if not swallow:
                    raise
                raise CkptbenchError("shard-00001.safetensors: read failed") from None
            raise AssertionError("the interrupt never came")
        return real(*a, **kw)

    monkeypatch.setattr(sweep_mod, "read_source", read_source)


def test_an_interrupted_sweep_prints_and_records_the_levels_it_read(small, tmp_path, monkeypatch):
    from ckptbench.records.results import read_documents
    from ckptbench.restore.sweep import recorded_knee

    src, _ = small
    results = str(tmp_path / "r.csv")
    r = run_cli("sweep", src, "--levels", "1,2", "--repeat", "1", "--results", results)  # a whole one first
    assert r.rc == 0, r.err
    _interrupt_at(monkeypatch, 3)  # levels 1,2,4 twice: 1 and 2 read once, stopped as 4 starts
    r = run_cli("sweep", src, "--levels", "1,2,4", "--repeat", "2", "--results", results)
    assert r.rc == 130
    assert len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    line = r.err_lines[0]
    assert line.startswith("ckptbench: interrupted during read 3 of 6 (concurrency 4, repeat 1 of 2): 2 read(s) "
                           "finished, of concurrency 1, 2"), line
    assert f"recorded in {results} as an interrupted sweep" in line
    rows = [s.split() for s in r.out.splitlines() if s.strip()[:1].isdigit()]
    assert [(row[0], row[1]) for row in rows] == [("1", "1"), ("2", "1")], r.out  # level, reads
    assert "← knee" not in r.out and "recommendation" not in r.out
    assert "knee: none, the sweep was interrupted" in r.out and "concurrency 4 not read" in r.out
    kept = read_documents(results, "knee")[-1]
    assert (kept["status"], kept["knee"], sorted(kept["gbps"]), kept["reads"]) == ("cancelled", None, ["1", "2"],
                                                                                    {"1": 1, "2": 1})
    assert kept["interrupted"]["not_read"] == [4]
    # what check advises from: the whole sweep before it, not the interrupted one
    measured = recorded_knee(results, src)
    assert measured is not None and sorted(measured.gbps) == [1, 2]


def test_an_interrupted_sweep_json_says_cancelled_and_gives_no_knee(small, tmp_path, monkeypatch):
    src, _ = small
    results = str(tmp_path / "r.csv")
    _interrupt_at(monkeypatch, 2)
    r = run_cli("sweep", src, "--levels", "1,2", "--repeat", "1", "--json", "--results", results)
    assert r.rc == 130 and len(r.err_lines) == 1, r.err
    doc = json.loads(r.out)
    assert (doc["status"], doc["knee"], doc["recommendation"], doc["levels"]) == ("cancelled", None, None, [1])
    assert doc["interrupted"] == {"reads": 1, "of": 2, "repeats": 1, "under": {"repeat": 1, "level": 2},
                                  "not_read": [2]}
    from ckptbench.restore.sweep import recorded_knee

    assert recorded_knee(results, src) is None  # nothing whole on record: check advises from no knee


def test_a_ctrl_c_turned_into_an_error_stops_the_sweep_as_interrupted(small, tmp_path, monkeypatch):
    """A library that swallows the Ctrl-C and raises an error of ours: the sweep stops as interrupted (130), its
    finished read kept, not as a failed read (exit 1)."""
    src, _ = small
    _interrupt_at(monkeypatch, 2, swallow=True)
    r = run_cli("sweep", src, "--levels", "1,2", "--repeat", "1")
    assert r.rc == 130, r.err
    assert r.err_lines[-1].startswith("ckptbench: interrupted during read 2 of 2") and "not recorded (no --results)" \
        in r.err_lines[-1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler given back


def test_an_interrupt_before_any_read_finished_keeps_nothing(small, tmp_path, monkeypatch):
    src, _ = small
    results = str(tmp_path / "r.csv")
    _interrupt_at(monkeypatch, 1)
    r = run_cli("sweep", src, "--levels", "1,2", "--results", results)
    assert r.rc == 130 and r.out == ""
    assert r.err_lines == ["ckptbench: interrupted during read 1 of 6 (concurrency 1, repeat 1 of 3): nothing "
                           "measured, nothing recorded"]
    assert not os.path.exists(results + ".jsonl")


def test_ctrl_c_to_a_sweep_as_a_user_sends_it(small, tmp_path):
    """The real thing: a sweep in its own process, its level lines on a terminal, SIGINT once the first is out."""
    src, _ = small
    results = str(tmp_path / "r.csv")
    master, slave = pty.openpty()  # stderr a terminal: the sweep says each read as it finishes
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "sweep", src, "--levels", "1,2", "--repeat", "500",
                             "--results", results], stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 120
    try:
        while b"concurrency    1:" not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, seen
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 4096)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    err = seen.decode(errors="replace")
    assert proc.returncode == 130, err
    said = [s for s in err.splitlines() if s.startswith("ckptbench:")]
    assert len(said) == 1 and "interrupted" in said[0] and "as an interrupted sweep" in said[0], err
    assert "Traceback" not in err
    assert "knee: none, the sweep was interrupted" in out
    from ckptbench.records.results import read_documents

    kept = read_documents(results, "knee")
    assert len(kept) == 1 and kept[0]["status"] == "cancelled" and kept[0]["knee"] is None
    assert "1" in kept[0]["gbps"] and kept[0]["interrupted"]["reads"] >= 1


def test_an_option_the_command_does_not_know_sends_the_user_to_that_commands_help():
    """`run --concurency 4` (a typo) said "(see ckptbench --help)", whose list has no run option."""
    r = run_cli("run", "/nonexistent", "--concurency", "4")
    assert r.rc == 2 and r.err_lines == ["ckptbench: error: unrecognized arguments: --concurency 4; did you mean "
                                         "--concurrency? (see ckptbench run --help)"], r.err
    r = run_cli("--bogus")
    assert r.rc == 2 and r.err_lines[-1].endswith("(see ckptbench --help)"), r.err
    r = run_cli("read", "/nonexistent", "--password=sEcReT")  # a mistyped option can carry a secret: never shown
    assert r.rc == 2 and "sEcReT" not in r.err and "(see ckptbench read --help)" in r.err, r.err
