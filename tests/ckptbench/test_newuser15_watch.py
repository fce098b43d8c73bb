"""New-user trial 15, `ckptbench watch`: a process on the box whose name or command line is not UTF-8 crashes nothing;
a floor the loader beats by more than a good ceiling's spread does not overrule the loader's own diagnosis; a hot
mapped load's count is said to be a lower bound and --source is never advised when given; the floor note names the
checkpoint; a word that is not a PID and a bad --interval are one line before anything is probed or started."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time

from clirun import assert_one_line_error, run_cli, run_proc

SLEEP = shutil.which("sleep")


def _sleeper(name: bytes | str = "sleep") -> subprocess.Popen:
    """`sleep 60` under the command name `name` (`exec -a NAME`): bytes kept as they are, not UTF-8 where asked."""
    p = subprocess.Popen([name, "60"], executable=SLEEP)
    # Popen returns once exec closed its error pipe, which the kernel does before it places the new command line:
    # on a loaded box /proc/PID/cmdline read empty in that window and the search found nothing (full suite, once)
    for _ in range(1000):
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            if f.read():
                break
        time.sleep(0.005)
    return p


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.kill()
        p.wait()


def test_match_reads_command_lines_that_are_not_utf8():
    """A process named with bytes that are not UTF-8 (`exec -a $'sleep\\xff'`) made every `--match` a traceback."""
    from ckptbench.system import procstat

    tag = f"nu15-match-{os.getpid()}"
    odd = _sleeper(b"\xff\xfe" + tag.encode())  # its command line: "\xff\xfe<tag> 60"
    other = _sleeper()  # the watcher the search leaves out: a sibling, so `odd` is no descendant of it
    try:
        assert procstat.find(tag, exclude=other.pid) == odd.pid
        r = run_proc("watch", "--match", f"no-such-job-{os.getpid()}", "--no-verdict")
        assert_one_line_error(r, "no running process has it in its command line")
        twin = _sleeper(tag)
        try:
            r = run_proc("watch", "--match", tag, "--no-verdict")
            assert_one_line_error(r, "2 processes match")
            assert f"{odd.pid}: " in r.err and "\ufffd" in r.err  # shown with the bytes replaced
        finally:
            _stop(twin)
    finally:
        _stop(odd, other)


NAMED = """
    import ctypes, sys, time
    ctypes.CDLL(None).prctl(15, b"ld\\xff\\xfe(x) y", 0, 0, 0)  # PR_SET_NAME: /proc/PID/stat shows it raw
    print("named", flush=True)
    time.sleep(60)
"""


def test_a_process_whose_name_is_not_utf8_is_sampled():
    """Its comm in /proc/PID/stat (a thread name a loader sets) is the process's own bytes: a watch of it crashed."""
    from ckptbench.system import procstat

    job = subprocess.Popen([sys.executable, "-c", textwrap.dedent(NAMED)], stdout=subprocess.PIPE)
    try:
        assert job.stdout.readline() == b"named\n"
        with open(f"/proc/{job.pid}/stat", "rb") as f:
            assert b"\xff" in f.read()  # the kernel shows it raw: what the watch must read
        first = procstat.watchable(job.pid)
        assert first.pids[0] == job.pid and job.pid in first.threads and first.state in "RS"
        assert os.getpid() in procstat.ancestors(job.pid)
    finally:
        _stop(job)


def _safetensors(path, nbytes: int) -> None:
    """A one-tensor safetensors file of `nbytes` random bytes, written by hand (the format's header and data)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + os.urandom(nbytes))


def _one_thread_report(path: str, size: int):
    """A job that read `size` bytes of `path` with one thread at 100 % of a core, marked over one second."""
    from ckptbench.watch import sampler as watch

    reading = watch.Interval(0.0, 1.0, size, 0, 1.0, 1.0, 1, 0.0, 1 << 30, "reading", ckpt_files=1)
    return watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=size, disk_bytes=0, files={path: size},
                             intervals=[reading], phases=[], marks=[{"stage": "load", "t": 0.0},
                                                                    {"stage": "done", "t": 1.0}])


def test_a_floor_measured_low_does_not_overrule_the_loaders_diagnosis(tmp_path, plant_floor):
    """A floor the loader beat 1.7 times (the note: "a ceiling measured low") made a one-thread loader storage-bound,
    with "faster or striped storage" for its fix, beside "this storage gives 3x what the loader got"."""
    from ckptbench.watch import verdict

    src = tmp_path / "my ckpt"
    src.mkdir()
    shard = src / "model.safetensors"
    _safetensors(shard, 8 << 20)
    size = os.path.getsize(shard)
    plant_floor(8.0, src, storage_gbps=size / 1.7e9)  # the storage read at 1.7 s for a load of 1 s
    report = _one_thread_report(str(shard), size)
    probe = verdict.StorageProbe(2.0, "cold (verified)", 1, size)
    floor = verdict.floor_fields(report, [str(shard)])
    assert floor["binding"] == "storage" and floor["efficiency"] > 1.05, floor
    assert f"`ckptbench floor '{src}' --remeasure`" in floor["floor_note"]  # the path, as `run` names it
    assert "SOURCE" not in floor["floor_note"]
    v = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=floor)
    alone = verdict.judge(report, probe, cpus=2, mem_total=64 << 30)
    assert v.verdict == alone.verdict == "loader-cpu-bound" and v.fix == alone.fix != verdict.STORAGE_FIX
    assert "that floor is unreliable" in v.why and f"`ckptbench floor '{src}' --remeasure`" in v.why
    assert v.why.endswith(alone.why) and v.evidence["floor_unreliable"] is True
    # within a good ceiling's spread, the floor still says the storage binds (the re-read lands in reused buffers)
    plant_floor(8.0, src, storage_gbps=size / 0.95e9)
    at = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=verdict.floor_fields(report, [str(shard)]))
    assert at.verdict == "storage-bound" and "unreliable" not in at.why


HOT_MAPPER = """
    import mmap, sys, time
    for p in sys.argv[1:]:
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))  # every page, from the page cache
        time.sleep(0.5)  # held over several samples: the watch sees the mapping
        m.close()
"""


def test_a_hot_mapped_load_is_a_lower_bound_and_source_is_not_advised_when_given(tmp_path):
    """A hot load of 1008 MiB in 0.39 s read "388.3 MiB ... 0.87 GB/s" as its rate (with no floor cached, nothing
    said the count was short), and the note asked for the `--source DIR` the user had given."""
    src = tmp_path / "ckpt"
    src.mkdir()
    shards = [src / f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for s in shards:
        _safetensors(s, 16 << 20)  # just written: in the page cache
    job = tmp_path / "load.py"
    job.write_text(textwrap.dedent(HOT_MAPPER))
    r = run_proc("watch", "--no-verdict", "--results", "", "--interval", "0.05", "--source", src, "--",
                 sys.executable, job, *shards)
    assert r.rc == 0, r.err
    assert "read at least " in r.out and ": at least " in r.out, r.out
    assert "a lower bound: it mapped its files from the page cache" in r.out
    assert "--source DIR" not in r.out
    assert "this box's floor is not measured yet" in r.out  # said whether or not a floor is cached
    r = run_proc("watch", "--json", "--no-verdict", "--results", "", "--interval", "0.05", "--source", src, "--",
                 sys.executable, job, *shards)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["count_note"].startswith("it mapped its files from the page cache")  # headless too


def test_a_count_known_short_never_asks_for_the_source_it_was_given(tmp_path):
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    shard = tmp_path / "model.safetensors"
    _safetensors(shard, 8 << 20)
    size = os.path.getsize(shard)
    ivs = [watch.Interval(t, t + 0.25, 0, 0, 1.0, 1.0, 1, 0.0, 1 << 30, "faulting", mapped_bytes=512 << 10)
           for t in (0.0, 0.25)]
    for hot in (True, False):
        report = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=1 << 20, disk_bytes=0 if hot else 1 << 20,
                                   files={str(shard): size}, intervals=ivs, phases=[], mapped=[str(shard)],
                                   residency_first={str(shard): 1.0 if hot else 0.0})
        assert report.hot is hot
        assert "--source DIR" in verdict.lower_bound(report)  # not given: the way to count it whole
        named = watch.WatchReport(**{**report.__dict__, "source": str(tmp_path)})
        said = verdict.lower_bound(named)
        assert said.startswith("the job maps its files" if hot else "the job's bytes are undercounted"), said
        v = verdict.judge(named, verdict.StorageProbe(20.0, "cold (verified)", 1, size), cpus=2, mem_total=1 << 40)
        assert v.verdict == "unknown" and "--source" not in said + v.why + v.fix, (said, v)


def test_a_word_that_starts_like_a_pid_is_not_started_as_a_command():
    """`watch 12ab` started a program named 12ab ("cannot start (No such file or directory)")."""
    assert_one_line_error(run_cli("watch", "12ab", "--no-verdict"), "'12ab' is not a PID")


def test_the_interval_is_checked_before_the_process_is_looked_for_or_started(tmp_path):
    """`watch 1 --interval 0` said /proc/1/io was unreadable; `-- COMMAND` with it started the job, then refused."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert_one_line_error(run_cli("watch", gone.pid, "--interval", "0"), "--interval 0: give 0.01..60 seconds")
    flag = tmp_path / "started"
    r = run_cli("watch", "--interval", "0", "--", sys.executable, "-c", f"open({str(flag)!r}, 'w')")
    assert_one_line_error(r, "--interval 0: give 0.01..60 seconds")
    assert not flag.exists()
