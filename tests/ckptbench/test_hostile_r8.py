"""Hostile input, eighth round: what the earlier rounds touched least — the environment a distributed rank starts in
(RANK, LOCAL_RANK, MASTER_ADDR as a user or a wrapper sets them, not as torchrun does). Bad input is one line naming
what and where, and a non-zero exit; never a run measured under a condition it did not set."""

from __future__ import annotations

import socket

import pytest

from clirun import assert_one_line_error, run_proc


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(ck, **env):
    """One rank of a one-rank world, started by hand with `env` over torchrun's variables."""
    base = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port())}
    return run_proc("run", ck, "--distributed", "--repeat", "1", "--results", "", "--cache", "cold",
                    "--rank-timeout", "10", timeout=180, env=base | env)


@pytest.mark.parametrize("env, needle", [
    ({"LOCAL_RANK": "7"}, "LOCAL_RANK=7 is outside 0..0"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 is outside 0..0"),
    ({"LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE=3 is outside 1..WORLD_SIZE=1"),
    ({"LOCAL_RANK": "\u0663"}, "LOCAL_RANK="),  # an Arabic-Indic 3: int() reads it, torchrun never writes it
])
def test_a_local_rank_no_torchrun_gives_is_refused(tmp_path, h, ckpt, env, needle):
    """One rank per node (local rank 0) sets the page cache for the node. A LOCAL_RANK outside the node (7 of a
    1-rank world, -1) had no rank evict: `--cache cold` ran on a fully cached checkpoint, exit 0, and said nothing of
    the condition. It is one line naming the variable, before anything is read."""
    ck = ckpt("torch", 1)
    r = _rank(ck, **env)
    assert_one_line_error(r, needle)
    assert "not a whole number" in r.err or "outside" in r.err


@pytest.mark.parametrize("addr, needle", [
    ("bad\x1b]0;owned\x07host", "not a host name or an IP address"),
    ("rank0 host", "not a host name or an IP address"),
    ("nosuchhost.invalid", "does not resolve"),
])
def test_a_master_addr_that_is_no_host_is_one_line(tmp_path, h, ckpt, addr, needle):
    """MASTER_ADDR went to torch as it was: one with escapes was written raw into torch's own log lines (a retitled
    terminal), and one that does not resolve gave torch's retries with C++ stack traces ("frame #0: c10::Error...")
    before our line. Now it is checked first: one line, the escapes shown as their repr, nothing from torch."""
    ck = ckpt("torch", 1)
    r = _rank(ck, MASTER_ADDR=addr)
    assert_one_line_error(r, needle)
    assert "\x1b" not in r.err and "\x07" not in r.err and "frame #" not in r.err


@pytest.mark.parametrize("port", ["99999", "0", "http", " 29500"])
def test_a_master_port_that_is_no_port_is_one_line(tmp_path, h, ckpt, port):
    ck = ckpt("torch", 1)
    assert_one_line_error(_rank(ck, MASTER_PORT=port), "MASTER_PORT=")


def test_rank_zero_spelt_00_still_checks_the_results_file(tmp_path, h, ckpt, monkeypatch):
    """The group read RANK=00 as rank 0, the CLI as another rank: the results file went unchecked until after the
    restore (and rank 0's interrupt line was left unsaid). Both read it alike now."""
    from ckptbench.distributed import group

    ck = ckpt("torch", 1)
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "results.csv").mkdir()  # a folder where the results file should be: refused up front
    base = {"RANK": "00", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port())}
    r = run_proc("run", ck, "--distributed", "--repeat", "1", "--results", tmp_path / "ro" / "results.csv",
                 "--rank-timeout", "10", timeout=180, env=base)
    assert r.rc != 0 and "Traceback" not in r.err and "results.csv" in r.err, r.err
    assert "rto" not in r.out.lower()  # refused before any restore
    for raw, want in (("0", 0), ("00", 0), ("3", 3), ("x", None), (" 0", None), ("\u0660", None)):
        monkeypatch.setenv("RANK", raw)
        assert group.rank_of_env() == want, raw


def test_match_reads_a_bounded_share_of_each_command_line(monkeypatch):
    """--match walks every process's command line: one pointed at a huge region (prctl PR_SET_MM) was read whole."""
    from ckptbench.system import procstat

    asked = []
    real = procstat._read_bytes

    def read(path, most=-1):
        if path.endswith("/cmdline"):
            asked.append(most)
        return real(path, most)

    monkeypatch.setattr(procstat, "_read_bytes", read)
    with pytest.raises(procstat.CkptbenchError):
        procstat.find("no-process-has-this-in-its-command-line-7f3a")
    assert asked and all(0 < m <= procstat.CMDLINE_MAX for m in asked)


def _posted(**changes):
    """A report as a rank posts it (report_doc through JSON, as the store carries it), with `changes`."""
    import json

    from ckptbench.distributed.rank import RankReport, report_doc

    rep = RankReport(1, "node-b", 0, stages={"read": 0.5, "load": 0.25}, intervals={"a.bin": [(0, 4096)]},
                     bytes_read=4096, bytes_needed=4096, end_s=0.8, read_end_s=0.6)
    doc = json.loads(json.dumps(report_doc(rep)))
    return doc | changes


@pytest.mark.parametrize("changes, what", [
    ({"rank": 0}, "it says it is rank 0"), ({"end_s": "soon"}, "end_s"), ({"bytes_read": -1}, "bytes_read is -1"),
    ({"stages": {"read": "x"}}, "a stage's seconds"), ({"intervals": {"a.bin": [[0]]}}, "byte ranges"),
    ({"verified": 1}, "verified"), ({"cache": [1]}, "cache condition")])
def test_a_rank_report_rank_0_cannot_read_is_one_line_naming_the_rank(changes, what):
    """Rank 0 combined the other ranks' posts as they came: anything on the network can write to torch's store, and
    a rank of another ckptbench posts other fields. A KeyError or TypeError on rank 0, a traceback; one line now."""
    from ckptbench.distributed.rank import read_report
    from ckptbench.distributed.summary import combine

    good = _posted()
    assert read_report(good, 1) is good and combine([good])["status"] == "ok"
    with pytest.raises(_error()) as err:
        read_report(_posted(**changes), 1)
    assert str(err.value).startswith("rank 1: its report cannot be read") and what in str(err.value)
    missing = _posted()
    del missing["stages"]
    with pytest.raises(_error(), match="stages is missing"):
        read_report(missing, 1)
    with pytest.raises(_error(), match="a list, not a report"):
        read_report([1, 2], 1)


def test_a_post_that_is_not_json_is_one_line_naming_the_rank():
    from ckptbench.distributed.group import _decoded

    assert _decoded(b'{"ok": true}', 3, "ready") == {"ok": True}
    with pytest.raises(_error(), match=r"rank 3's 'report' is not what a rank of ckptbench posts"):
        _decoded(b"\x00\xffnot json", 3, "report")


def _error():
    from ckptbench.core.errors import CkptbenchError

    return CkptbenchError
