"""Entries of a checkpoint that are not regular files (a symlink, a FIFO) are never read, and every command that
lists the checkpoint says so by name instead of passing over them in silence."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from clirun import run_cli

ESCAPE = "\x1b]0;owned\x07"  # a terminal title change hidden in a file name


def _checkpoint(tmp_path) -> str:
    """A real safetensors checkpoint beside a symlink to a file outside it, a FIFO, and a symlink whose name holds an
    escape sequence."""
    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(ck / "model.safetensors"))
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"s" * 10_000)
    os.symlink(outside, ck / "link.bin")
    os.mkfifo(ck / "pipe.bin")
    os.symlink(outside, ck / f"esc{ESCAPE}.bin")
    return str(ck)


def _said(text: str) -> list[str]:
    return [line for line in text.splitlines() if "not read:" in line]


def test_inspect_and_run_name_what_they_pass_over(tmp_path):
    ck = _checkpoint(tmp_path)
    for args in (("inspect", ck), ("run", ck, "--repeat", "1", "--results", str(tmp_path / "R.csv"))):
        r = run_cli(*args)
        assert r.rc == 0, r.err
        said = _said(r.out)
        assert any("link.bin" in s and "symbolic link" in s for s in said), r.out
        assert any("pipe.bin" in s and "FIFO" in s for s in said), r.out
        assert len(said) == 3 and "\x1b" not in r.out and "\x07" not in r.out, said  # the name said, not run
    r = run_cli("run", ck, "--repeat", "1", "--json", "--results", str(tmp_path / "R.csv"))
    doc = json.loads(r.out)
    assert doc["bytes"] == os.path.getsize(os.path.join(ck, "model.safetensors"))  # nothing read through the links
    assert {d["path"] for d in doc["layout"]["not_read"]} >= {"link.bin", "pipe.bin", f"esc{ESCAPE}.bin"}


def test_a_plain_read_names_them_too(tmp_path):
    ck = _checkpoint(tmp_path)
    names = sorted(["link.bin", "pipe.bin", f"esc{ESCAPE}.bin"])
    r = run_cli("read", ck, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert sorted(d["path"] for d in doc["layout"]["not_read"]) == names  # a checkpoint's layout says them
    assert doc["bytes"] == os.path.getsize(os.path.join(ck, "model.safetensors"))
    other = tmp_path / "other.bin"
    other.write_bytes(b"x" * 100)
    r = run_cli("read", ck, str(other), "--json")  # no one checkpoint: the read itself says them
    doc = json.loads(r.out)
    assert sorted(os.path.basename(d["path"]) for d in doc["not_read"]) == names
    assert doc["bytes"] == os.path.getsize(os.path.join(ck, "model.safetensors")) + 100
    for args in ((ck,), (ck, str(other))):
        r = run_cli("read", *args)
        assert len(_said(r.out)) == 3 and "\x1b" not in r.out, r.out


def test_another_steps_entries_are_not_this_ones(tmp_path):
    """A symlink inside a step a resume does not load is that step's business: the chosen step's listing leaves
    it out."""
    root = tmp_path / "run"
    for step in ("checkpoint-100", "checkpoint-200"):
        (root / step).mkdir(parents=True)
        save_file({"w": torch.ones(64)}, str(root / step / "model.safetensors"))
    os.symlink(root / "checkpoint-200" / "model.safetensors", root / "checkpoint-100" / "alias.safetensors")
    r = run_cli("inspect", str(root))
    assert r.rc == 0, r.err
    assert "alias.safetensors" not in r.out and "checkpoint-200" in r.out, r.out


def test_inspect_prints_a_hostile_tensor_name_without_its_escape(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({f"w{ESCAPE}": torch.ones(4)}, str(ck / "model.safetensors"))
    r = run_cli("inspect", str(ck), "--tensors", "*")
    assert r.rc == 0, r.err
    assert "float32" in r.out and "\x1b" not in r.out and "\x07" not in r.out, r.out
    assert json.loads(run_cli("inspect", str(ck), "--json", "--tensors", "*").out)["tensors"][0]["name"] == f"w{ESCAPE}"


def test_a_folder_of_links_only_says_what_to_do(tmp_path):
    """A Hugging Face cache snapshot: every file a relative symlink into the repo's blobs folder."""
    from clirun import assert_one_line_error

    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    save_file({"w": torch.ones(8)}, str(repo / "blobs" / "f00d"))
    os.symlink("../../blobs/f00d", snap / "model.safetensors")
    for cmd in ("run", "inspect", "read"):
        assert_one_line_error(run_cli(cmd, str(snap)), "only 1 symbolic link(s)")
