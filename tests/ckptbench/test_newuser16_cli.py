"""New-user pass 16, the command line: `read` of odd paths says what is wrong with which one; `floor` and `tui` refuse
a folder with no checkpoint as `run` does; run's (and the others') lines carry no terminal escape from a file name and
no URL's password; compare says when a side of one repeat left the noise unknown; `floor --write-to` says its files
went through the page cache."""

from __future__ import annotations

import functools
import json
import os
import shutil

import pytest
from clirun import assert_one_line_error, run_cli

OSC, WIPE = "\x1b]0;pwned\x07", "\x1b[2J"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("nu16c") / "ck"
    assert run_cli("gen", "small", path, "--scale", "0.02").rc == 0
    return str(path)


def _shard(ckpt: str) -> str:
    return os.path.join(ckpt, sorted(n for n in os.listdir(ckpt) if n.endswith(".safetensors"))[0])


def _texts(tmp_path) -> str:
    """A folder that holds no checkpoint: a note and a model card."""
    d = tmp_path / "notes"
    d.mkdir()
    (d / "a.txt").write_text("hello\n")
    (d / "README.md").write_text("# a model\n")
    return str(d)


# 1. read of odd paths

@pytest.mark.parametrize("order", ["file-first", "missing-first", "dir-first"])
def test_read_names_the_missing_path_and_what_to_point_at(ckpt, tmp_path, order):
    missing = str(tmp_path / "nope")
    args = {"file-first": (_shard(ckpt), missing), "missing-first": (missing, _shard(ckpt)),
            "dir-first": (ckpt, missing)}[order]
    assert_one_line_error(run_cli("read", *args),
                          f"{missing}: no such file or directory; point at a checkpoint directory or its files")


def test_read_of_a_link_to_nothing_says_so(tmp_path):
    link = tmp_path / "shard.safetensors"
    link.symlink_to(tmp_path / "gone")
    assert_one_line_error(run_cli("read", link), f"{link}: a symbolic link to nothing; point at a checkpoint")


@pytest.mark.parametrize("how, needle", [
    ("dir-twice", "{ck}: named twice, so its bytes would be read and counted twice"),
    ("dir-and-its-file", "{shard}: inside {ck}, also named"),
    ("file-and-its-dir", "{shard}: inside {ck}, also named"),
    ("file-twice-spelt-two-ways", "{shard2}: named twice (as {shard} too)"),
])
def test_read_of_a_path_named_twice_is_refused_before_it_counts_bytes_twice(ckpt, how, needle):
    shard = _shard(ckpt)
    shard2 = os.path.join(ckpt, ".", os.path.basename(shard))
    args = {"dir-twice": (ckpt, ckpt), "dir-and-its-file": (ckpt, shard), "file-and-its-dir": (shard, ckpt),
            "file-twice-spelt-two-ways": (shard, shard2)}[how]
    assert_one_line_error(run_cli("read", *args, "--json"), needle.format(ck=ckpt, shard=shard, shard2=shard2))


def test_read_of_two_directories_says_it_chose_no_checkpoint(ckpt, tmp_path):
    notes = _texts(tmp_path)
    r = run_cli("read", ckpt, notes)
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].startswith("read as named: every file of the 2 paths, no checkpoint chosen"), r.out
    floor = next(line for line in r.out.splitlines() if line.lstrip().startswith("floor"))
    assert f"{ckpt}, {notes}" not in floor, floor  # `ckptbench floor 'A, B'` is no command
    one = run_cli("read", ckpt)  # one directory: the checkpoint a resume loads, no such line
    assert one.rc == 0 and "read as named" not in one.out, one.out


def test_read_of_one_file_never_offers_a_floor_command_that_refuses_it(ckpt):
    shard = _shard(ckpt)
    r = run_cli("read", shard)
    assert r.rc == 0, r.err
    assert "`ckptbench floor SOURCE`" in r.out and f"ckptbench floor {shard}" not in r.out, r.out
    assert_one_line_error(run_cli("floor", shard), "not a directory")  # what it offered before
    r = run_cli("read", ckpt)  # a checkpoint directory is named: `floor` takes it
    assert f"`ckptbench floor {ckpt}`" in r.out, r.out


# 2. floor and tui refuse a folder with no checkpoint, with run's line

@pytest.mark.parametrize("cmd", ["floor", "tui"])
def test_floor_and_tui_refuse_a_folder_of_text_files_as_run_does(tmp_path, cmd):
    notes = _texts(tmp_path)
    ran = run_cli("run", notes, "--repeat", "1", "--results", "")
    assert_one_line_error(ran, "no safetensors, torch or torch.distributed.checkpoint files found")
    r = run_cli(cmd, notes)  # tui: before the terminal check, so the line is this one here too
    assert_one_line_error(r)
    assert r.err == ran.err


@pytest.mark.parametrize("cmd", ["floor", "tui"])
def test_floor_and_tui_refuse_an_empty_folder_as_run_does(tmp_path, cmd):
    empty = tmp_path / "empty"
    empty.mkdir()
    ran = run_cli("run", empty, "--repeat", "1", "--results", "")
    assert_one_line_error(ran, "holds no files")
    r = run_cli(cmd, empty)
    assert r.err == ran.err and r.rc == 2 and r.out == ""


# 3. no escape and no URL's password in a line

def _hostile(ckpt: str, tmp_path, name: str) -> str:
    """A copy of the checkpoint with one more small file, listed in its manifest with a wrong digest."""
    root = str(tmp_path / "hc")
    shutil.copytree(ckpt, root)
    with open(os.path.join(root, name), "w") as f:
        f.write("{}")
    path = os.path.join(root, "ckptbench.json")
    with open(path) as f:
        doc = json.load(f)
    doc["files"].append({"path": name, "bytes": 2, "digest": "00000000", "kind": "small", "rank": None})
    with open(path, "w") as f:
        json.dump(doc, f)
    return root


def test_runs_problem_lines_carry_no_escape_and_keep_the_digest(ckpt, tmp_path):
    root = _hostile(ckpt, tmp_path, f"tokenizer{OSC}{WIPE}.json")
    r = run_cli("run", root, "--repeat", "1", "--results", "")
    assert r.rc == 1, r.out + r.err
    assert "\x1b" not in r.out + r.err and "\x07" not in r.out + r.err
    # the name is a credential word's: redact over the line hid the digest (`tokenizer.json: <redacted>`)
    assert "  problem: tokenizer.json: crc32c " in r.err and "manifest says 00000000" in r.err, r.err
    r = run_cli("verify", root)  # verify's problem lines too
    assert r.rc == 1 and "\x1b" not in r.out + r.err and "tokenizer.json: crc32c " in r.err, r.err


def test_a_problem_carrying_a_url_loses_its_password(ckpt, capsys):
    from ckptbench.cli import run as cli_run

    r = run_cli("run", ckpt, "--repeat", "1", "--results", "", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    doc["repeats"][0]["problems"] = [f"s3://b/k{WIPE}: GET http://ann:hunter2@minio:9000/b/k failed"]
    doc["notes"]["read"] = f"endpoint http://ann:hunter2@minio:9000{OSC}"
    cli_run.print_run(doc)
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err and "\x1b" not in out + err
    assert "  problem: s3://b/k: GET http://minio:9000/b/k failed" in err, err


def test_clean_redacts_only_the_words_that_can_carry_a_url():
    from ckptbench.cli.show import clean

    assert clean("tokenizer.json: crc32c 297bd0aa, manifest says 00000000") == \
        "tokenizer.json: crc32c 297bd0aa, manifest says 00000000"
    assert clean(f"x{WIPE}: proxy ann:pw@proxy:3128 refused") == "x: proxy proxy:3128 refused"
    assert clean("s3://bucket/model@main/x.bin: ok") == "s3://bucket/model@main/x.bin: ok"


# 4. compare says a side of one repeat has no noise estimate

def _results(tmp_path, base: list[float], new: list[float]) -> str:
    from ckptbench.records import results

    path = str(tmp_path / "R.csv")
    env = {"date": "2024-01-01T00:00:00", "tool_version": "1", "python": "3.11", "torch": "2", "safetensors": "0.4",
           "kernel": "6.1", "cpu_model": "cpu", "cpu_count": 8, "source_fs": "ext4"}
    for run_id, rtos in (("base", base), ("new", new)):
        results.append(path, [{"schema": results.SCHEMA, "kind": "restore", "run_id": run_id, "repeat": i + 1,
                               "timestamp": "2024-01-01T00:00:00", "source": "/ck", "format": "safetensors",
                               "mode": "fused", "status": "ok", "cache": "hot", "rto_s": t, "read_s": t,
                               "read_gbps": 1 / t, "bytes": 10, "env": env} for i, t in enumerate(rtos)])
    return path


@pytest.mark.parametrize("base, new, note", [
    ([1.0], [2.0], "one repeat each: noise unknown"),
    ([1.0, 1.01, 1.02], [2.0], "one repeat in the newest: its noise unknown"),
    ([1.0], [2.0, 2.01, 2.02], "one repeat in the baseline: its noise unknown"),
    ([1.0, 1.01, 1.02], [2.0, 2.01, 2.02], None),
], ids=["one-each", "one-newest", "one-baseline", "repeats-each"])
def test_a_regression_judged_without_noise_says_so(tmp_path, base, new, note):
    path = _results(tmp_path, base, new)
    r = run_cli("compare", path)
    assert r.rc == 1, r.out + r.err
    rto = next(line for line in r.out.splitlines() if line.split()[:1] == ["rto_s"])
    assert rto.rstrip().endswith(f"REGRESSION ({note})" if note else "REGRESSION"), rto
    assert ("no noise estimate" in r.err) == (note is not None), r.err
    doc = json.loads(run_cli("compare", path, "--json").out)
    fig = next(f for f in doc["figures"] if f["figure"] == "rto_s")
    assert fig["regression"] is True and fig["noise_note"] == note


def test_an_improvement_of_one_repeat_says_so_too(tmp_path):
    r = run_cli("compare", _results(tmp_path, [2.0], [1.0]))
    assert r.rc == 0, r.err
    rto = next(line for line in r.out.splitlines() if line.split()[:1] == ["rto_s"])
    assert rto.rstrip().endswith("improved (one repeat each: noise unknown)"), rto


# 5. floor --write-to says how its files were written

def test_floor_write_to_says_its_files_went_through_the_page_cache(tmp_path, plant_floor):
    from ckptbench.system import writefloor

    plant_floor(4.0)  # the restore side cached: only the write figure is measured
    opened, synced = [], []
    real_open, real_fsync = os.open, os.fsync

    def spy_open(path, flags, *a, **kw):
        fd = real_open(path, flags, *a, **kw)
        if ".ckptbench-floor-write-" in os.fspath(path):
            opened.append((fd, flags))
        return fd

    def spy_fsync(fd):
        synced.append(fd)
        return real_fsync(fd)

    out = tmp_path / "saves"
    out.mkdir()
    with pytest.MonkeyPatch.context() as mp:  # not the test's monkeypatch: undoing that would undo its cache folder
        mp.setattr(writefloor, "write_ceiling", functools.partial(writefloor.write_ceiling, size=8 << 20))
        mp.setattr(os, "open", spy_open)
        mp.setattr(os, "fsync", spy_fsync)
        r = run_cli("floor", "--write-to", out)
    assert r.rc == 0, r.err
    # what the line says is what was done: buffered (no O_DIRECT), every file fsync'd
    assert opened and not any(flags & getattr(os, "O_DIRECT", 0) for _, flags in opened)
    assert {fd for fd, _ in opened} <= set(synced)
    note = next(line for line in r.out.splitlines() if line.lstrip().startswith("note: the write figure"))
    assert "went through the page cache (buffered writes, no O_DIRECT" in note and "fsync'd" in note, note
    write = next(line for line in r.out.splitlines() if line.lstrip().startswith("write "))
    assert "(one sample, " in write, write  # one repeat a level: no range to give
    r = run_cli("floor", "--write-to", out, "--json")  # cached now: the document says it as well
    w = json.loads(r.out)["write"]
    assert w["through_page_cache"] is True and "page cache" in w["page_cache_note"]


def test_the_write_note_says_a_tmpfs_makes_nothing_durable(monkeypatch):
    from ckptbench.cli.box import write_path_note
    from ckptbench.system import probes

    monkeypatch.setattr(probes, "mount_of", lambda path, root="/": probes.Mount("/dev/shm", "tmpfs", "tmpfs", "rw", "0:1"))
    assert "on tmpfs the page cache is the storage and fsync makes nothing durable" in write_path_note("/dev/shm/x")
    monkeypatch.setattr(probes, "mount_of", lambda path, root="/": probes.Mount("/", "ext4", "/dev/sda1", "rw", "8:1"))
    said = write_path_note("/data")
    assert "so it is the rate to durable storage" in said and "tmpfs" not in said
