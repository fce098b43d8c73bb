"""Hostile input, ninth round: what the earlier rounds left in newer or less-travelled places. Each input is made by
the real library and then crafted; bad input is one line naming what and where and a non-zero exit, or is read as
far as it is plain data, never a traceback."""

from __future__ import annotations

import pytest
import torch
from clirun import run_cli


def _trained(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return model, opt.state_dict()


def test_save_carries_param_groups_keyed_by_any_name(tmp_path):
    """save SOURCE orders a torch.save'd optimizer's param_groups by their numbers: groups saved as a dict with a key
    '²' (isdigit() holds, int() raises) were a ValueError traceback out of carry. A key that is no list index is
    carried as a group after the numbered ones."""
    model, sd = _trained()
    sd["param_groups"] = {"0": sd["param_groups"][0], "\u00b2": {"lr": 1.0}, "9" * 5000: {"lr": 2.0}}
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": sd, "epoch": 1}, src / "checkpoint.pt")
    r = run_cli("save", src, tmp_path / "t", "--count", "1", "--results", "")
    assert r.rc == 0 and "Traceback" not in r.err, r.err
    assert "optimizer state optimizer.state.* of 4 parameter(s) saved" in r.out + r.err


def test_pack_and_unpack_leave_a_folder_already_under_their_staging_name(tmp_path, ckpt):
    """pack and unpack stage OUT in `.OUT.tmp-PID` and removed whatever was there first ("a dead process's, with our
    pid"): in a container pids repeat, and anyone who can write OUT's parent can plant one, so a folder of the user's
    own files under that name was deleted with them. save stopped doing this (df05b06); now pack and unpack stage
    under another name and leave it as it was."""
    import os

    src = ckpt("safetensors", 2)
    for cmd, source, out in (("pack", src, tmp_path / "packed"), ("unpack", tmp_path / "packed", tmp_path / "back")):
        planted = tmp_path / f".{out.name}.tmp-{os.getpid()}"
        planted.mkdir()
        (planted / "mine.txt").write_text("the user's own")
        r = run_cli(cmd, source, out)
        assert r.rc == 0, r.err
        assert (planted / "mine.txt").read_text() == "the user's own", cmd
        assert out.is_dir() and not any(p.name.startswith(f".{out.name}.tmp-") and p != planted
                                        for p in tmp_path.iterdir())


def test_gen_leaves_a_folder_already_under_its_staging_name(tmp_path):
    """gen staged in `.DIR.tmp-HOST-PID` and rmtree'd whatever was there first, as pack did: a folder of the user's own
    files under this process's name went with it. It is left alone now."""
    import os

    from ckptbench.checkpoint.generate import staging_name

    out = tmp_path / "ck"
    planted = staging_name(str(out))
    os.mkdir(planted)
    with open(os.path.join(planted, "mine.txt"), "w") as f:
        f.write("the user's own")
    r = run_cli("gen", "small", out, "--scale", "0.05")
    assert r.rc == 0, r.err
    with open(os.path.join(planted, "mine.txt")) as f:
        assert f.read() == "the user's own"
    assert (out / "ckptbench.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ck", os.path.basename(planted)])


def test_a_started_run_naming_no_pid_a_process_can_have_is_history_not_a_traceback(tmp_path, ckpt):
    """history and compare ask whether a run started on record and never ended still runs: its `started` document's
    pid went to os.kill as it was, and a .jsonl edited by hand with a pid of 2**40 was an OverflowError traceback.
    A pid no process can have is one this host cannot check."""
    import json

    ck = ckpt("safetensors", 2)
    results = tmp_path / "results.csv"
    assert run_cli("run", ck, "--repeat", "1", "--results", results).rc == 0
    jsonl = tmp_path / "results.csv.jsonl"
    docs = [json.loads(line) for line in jsonl.read_text().splitlines()]
    run_id = docs[0]["run_id"]
    for pid in (2 ** 40, 10 ** 30):
        for d in docs:
            if d["record"] == "started":
                d["process"]["pid"] = pid
        jsonl.write_text("".join(json.dumps(d) + "\n" for d in docs if d["record"] != "run"))
        r = run_cli("history", results)
        assert r.rc == 0 and "Traceback" not in r.err, r.err
        assert run_id in r.out and "no end on record" in r.out
        r = run_cli("compare", results, "--newest", run_id)
        assert "Traceback" not in r.err and r.rc in (0, 2), r.err


@pytest.mark.parametrize("env", ["\u00b2", "\u0663", "9" * 5000], ids=["superscript-2", "arabic-3", "5000-digits"])
def test_aws_max_attempts_that_int_cannot_read_is_not_honoured(monkeypatch, env):
    """AWS_MAX_ATTEMPTS was honoured when str.isdigit() held: '²' holds it and int() raises, as it does past 4300
    digits, so every S3 command was a ValueError traceback before its first request. Such a value is not a sensible
    number: ckptbench's own retries stand, as for 'lots' (and for an Arabic-Indic 3, which int() reads and no AWS
    tool writes: ASCII digits, as RANK is read)."""
    from ckptbench.sources import s3

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", env)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    client = s3.make_client(2)
    assert client.meta.config.retries["total_max_attempts"] == s3.MAX_ATTEMPTS + 1


@pytest.mark.parametrize("device", ["cuda:\u00b2", "cuda:" + "9" * 5000], ids=["superscript-2", "5000-digits"])
def test_a_device_index_int_cannot_read_is_one_line(monkeypatch, device):
    """--device cuda:² passed str.isdigit() and int() raised on a GPU box: a ValueError traceback before the restore."""
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.restore.device import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(CkptbenchError, match="use cpu or cuda"):
        check_device(device)


def test_rank_0s_live_view_leaves_out_a_post_no_rank_wrote(monkeypatch):
    """Rank 0 reads every rank's live post from torch's store (anything on the network can write to it): a post that
    was not JSON, or held other fields, was a traceback out of the live view's thread, and the view showed nothing
    more for that repeat. Such a post is left out; the others are still summed."""
    import json
    import threading
    import time

    from ckptbench.distributed import live

    good = json.dumps({"s": "read", "b": 10, "n": 40}).encode()
    for bad in (b"\xff not json", b"[1, 2]", json.dumps({"s": "read", "b": "x", "n": 1}).encode(),
                json.dumps({"s": "read", "b": 1}).encode(), json.dumps({"s": ["r"], "b": 1, "n": 2}).encode()):
        class Store:
            def check(self, keys):
                return True

            def multi_get(self, keys):
                return [good, bad]

        class World:
            size, store = 2, Store()

            def key(self, *parts):
                return "/".join(map(str, parts))

        failed, shown = [], []
        monkeypatch.setattr(threading, "excepthook", lambda a: failed.append(a.exc_value))
        monkeypatch.setattr(live, "SHOW_S", 0.01)
        with live.Watcher(World(), ("r", 1), shown.append):
            time.sleep(0.1)
        assert not failed, (bad, failed)
        assert shown and shown[-1].bytes == 10 and shown[-1].needed == 40 and shown[-1].stages == {"read": 1}


@pytest.mark.parametrize("posted", [b"\xff not json", b"[true]", b'{"ok": "yes"}', b"{}"])
def test_a_verdict_no_rank_0_wrote_is_one_line_on_the_other_ranks(posted):
    """The other ranks wait for rank 0's verdict on each repeat in torch's store (anything on the network can write to
    it): they decoded it as it came and took ["ok"] of it, so a post that was not JSON or not rank 0's was a
    ValueError, TypeError or KeyError traceback on every one of them. One line naming rank 0's post now."""
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.distributed import driver
    from ckptbench.distributed.group import World

    class Store:
        def wait(self, keys, timeout):
            pass

        def get(self, key):
            return posted

    world = World(rank=1, size=2, local_rank=1, host="h", backend="gloo", store=Store(), timeout_s=5, prefix="p")
    with pytest.raises(CkptbenchError, match="rank 0's 'verdict'"):
        driver._verdict(world, ("r", 1))
    if posted.startswith(b"\xff"):  # what every wait on rank 0 reads: 'finished' too
        with pytest.raises(CkptbenchError, match="rank 0's 'finished'"):
            world.wait_for("finished")
