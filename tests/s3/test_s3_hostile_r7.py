"""Hostile input, seventh round, S3 side: `upload` reads a checkpoint from elsewhere as root, so what it reads is
held to what the listing saw (regular files below the folder, none reached through a link) at the moment it opens
each one, as `run` and `read` are."""

from __future__ import annotations

import os
import threading

import pytest

from ckptbench.core.errors import CkptbenchError
from ckptbench.sources import s3 as s3mod

from test_s3_upload import bucket_contents

SECRET = b"root's secret: never leaves the box\n"


@pytest.fixture
def small_ckpt(tmp_path):
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path / "ckpt"
    generate(profiles.load("small").scaled(0.02), str(root), force=True)
    (root / "sub").mkdir()
    (root / "sub" / "notes.txt").write_bytes(b"the checkpoint's own notes\n")
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "notes.txt").write_bytes(SECRET)
    (secret / "config.json").write_bytes(SECRET)
    return root, secret


def _swap_after_listing(monkeypatch, swap):
    """The listing as upload takes it, with `swap` run once it is taken: what changes between the list and the
    opens."""
    listed = s3mod.tree.rels

    def rels(*a, **k):
        out = listed(*a, **k)
        swap()
        return out

    monkeypatch.setattr(s3mod.tree, "rels", rels)


@pytest.mark.parametrize("how", ["file", "folder"])
def test_upload_never_reads_through_a_link_swapped_in_after_listing(s3env, s3server, s3bucket, small_ckpt,
                                                                   monkeypatch, how):
    """upload opened each listed file by its path (boto3's upload_file), following links: a config.json (or a
    folder) swapped for a link to a file outside after the listing had root's file put in the bucket. Now each file
    is opened one component at a time from the folder, none followed: refused in one line, nothing of it uploaded."""
    root, secret = small_ckpt

    def swap():
        if how == "file":
            os.unlink(root / "config.json")
            os.symlink(secret / "config.json", root / "config.json")
        else:
            os.rename(root / "sub", root.parent / "sub-moved")
            os.symlink(secret, root / "sub")

    _swap_after_listing(monkeypatch, swap)
    with pytest.raises(CkptbenchError) as err:
        s3mod.upload(str(root), s3mod.parse(f"s3://{s3bucket}/p"), concurrency=4)
    line = str(err.value)
    assert "\n" not in line and ("config.json" in line if how == "file" else "notes.txt" in line), line
    assert err.value.exit_code in (1, 2)
    assert all(SECRET not in body for body in bucket_contents(s3server, s3bucket).values())


def test_upload_of_a_fifo_swapped_in_after_listing_is_refused_not_a_hang(s3env, s3bucket, small_ckpt, monkeypatch):
    """A FIFO put in a listed file's place: boto3's open blocked forever waiting for a writer (the upload hung)."""
    root, _ = small_ckpt

    def swap():
        os.unlink(root / "config.json")
        os.mkfifo(root / "config.json")

    _swap_after_listing(monkeypatch, swap)
    out: dict = {}

    def go():
        try:
            s3mod.upload(str(root), s3mod.parse(f"s3://{s3bucket}/p"), concurrency=4)
        except CkptbenchError as exc:
            out["err"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # unblock the hung open so the test process can end
        fd = os.open(root / "config.json", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(30)
        pytest.fail("upload blocked on a FIFO")
    assert "err" in out and "config.json" in str(out["err"]) and "\n" not in str(out["err"])


def test_upload_of_a_file_written_while_it_is_sent_is_refused_and_its_object_taken_back(s3env, s3server, s3bucket,
                                                                                        small_ckpt, monkeypatch):
    """A file another process goes on writing was read to its end, however far that went, and the object held a mix
    of two versions. Now each file is sent as it was when opened (its size then), and one that changed meanwhile is
    one line, exit 1, with its object removed (ours: we wrote it)."""
    root, _ = small_ckpt
    grown = root / "config.json"

    class Growing(s3mod._Upto):
        def read(self, n=-1):
            if not getattr(self, "wrote", False):  # once per file, and only config.json grows
                self.wrote = True
                if os.path.samestat(os.fstat(self.f.fileno()), os.stat(grown)):
                    with open(grown, "ab") as w:
                        w.write(b"x" * 4096)
            return super().read(n)

    monkeypatch.setattr(s3mod, "_Upto", Growing)
    with pytest.raises(CkptbenchError) as err:
        s3mod.upload(str(root), s3mod.parse(f"s3://{s3bucket}/p"), concurrency=4)
    line = str(err.value)
    assert "config.json" in line and "changed while it was uploaded" in line and "\n" not in line, line
    assert err.value.exit_code == 1
    assert "p/config.json" not in bucket_contents(s3server, s3bucket)


def test_upload_sends_each_file_as_it_was_when_opened(s3env, s3server, s3bucket, small_ckpt):
    """The bytes in the bucket are the files' own, no more (the bound reads exactly their size)."""
    root, _ = small_ckpt
    s3mod.upload(str(root), s3mod.parse(f"s3://{s3bucket}/p"), concurrency=4)
    got = bucket_contents(s3server, s3bucket)
    for path in root.rglob("*"):
        if path.is_file():
            assert got[f"p/{path.relative_to(root)}"] == path.read_bytes()
