"""A new user's week of runs, saves and packs: `pack` carries the files a manifest does not list (they were dropped
without a word); `compare` tells a --no-fsync save from a durable one, and says what "the same way" it looked for."""

from __future__ import annotations

import os

from clirun import run_cli


def test_pack_keeps_the_files_the_manifest_does_not_list(h, ckpt, tmp_path):
    src = tmp_path / "src"
    h.copy_ckpt(ckpt("safetensors", 2), src)
    extra = {f"dataloader/extra{i}.idx": os.urandom(2000) for i in range(30)}
    for rel, data in extra.items():
        (src / rel).write_bytes(data)
    out, back = tmp_path / "packed", tmp_path / "back"
    r = run_cli("pack", src, out, "--target-files", "4")
    assert r.rc == 0, r.err
    members = {rel for index in h.read_manifest(out)["packs"].values() for rel in index}
    assert set(extra) <= members
    assert run_cli("verify", out).rc == 0
    assert run_cli("unpack", out, back).rc == 0
    for rel, data in extra.items():
        assert (back / rel).read_bytes() == data, rel
