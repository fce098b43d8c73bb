"""`pack` / `unpack`: small files into a few .ckpack files and back, byte for byte; hostile member names refused."""

from __future__ import annotations

import json
import os
import shutil

import pytest

FORMATS = ["safetensors", "torch", "dcp"]


@pytest.fixture(scope="module")
def packed(h, ckpt, tmp_path_factory):
    """fmt -> (source checkpoint, packed copy, source snapshot taken before packing)."""
    root = tmp_path_factory.mktemp("packed")
    out = {}
    for fmt in FORMATS:
        src = ckpt(fmt, 4)
        before = h.snapshot(src)
        dst = root / fmt
        r = h.run_cli("pack", src, dst, "--target-files", "4")
        assert r.rc == 0, r.err
        out[fmt] = (src, str(dst), before)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_layout_and_manifest(h, packed, fmt):
    src, out, before = packed[fmt]
    assert h.snapshot(src) == before  # packing reads the source, never writes it
    src_man = h.read_manifest(src)
    src_files = h.files_under(src)
    small = {e["path"] for e in src_man["files"] if e["kind"] == "small"}
    assert len(small) == 16
    packed_small = {p for p in small if p.startswith("dataloader/")}  # the rest a loader opens by name: kept
    assert packed_small and "config.json" in small - packed_small
    names = os.listdir(out)
    packs = sorted(n for n in names if n.endswith(".ckpack"))
    assert 1 <= len(packs) <= 4
    out_files = h.files_under(out)
    assert not (packed_small & set(out_files))  # the data loader's files live only inside packs
    assert not any(p.startswith("dataloader/") for p in out_files)
    man = h.read_manifest(out)
    listed = {e["path"]: e for e in man["files"]}
    assert set(listed) == set(out_files) - {h.MANIFEST}
    for rel, e in listed.items():
        assert e["bytes"] == len(out_files[rel]) and e["digest"] == h.crc32c_hex(out_files[rel]), rel
    for p in packs:
        assert listed[p]["kind"] == "pack"
    assert set(man["packs"]) == set(packs)
    members: dict[str, bytes] = {}
    for p, index in man["packs"].items():
        blob = out_files[p]
        covered = 0
        for rel, entry in index.items():
            off, size = entry[0], entry[1]
            assert rel not in members
            members[rel] = blob[off:off + size]
            assert 0 <= off and off + size <= len(blob)
            covered += size
        assert covered == len(blob)  # no slack, no overlap: members tile the pack
    assert set(members) == packed_small
    for rel, data in members.items():
        assert data == src_files[rel], rel
    for rel in set(src_files) - packed_small - {h.MANIFEST}:  # shards, metadata, config stay as files, unchanged
        assert out_files[rel] == src_files[rel], rel


@pytest.mark.parametrize("fmt", FORMATS)
def test_packed_checkpoint_loads_and_verifies(h, packed, fmt):
    src, out, _ = packed[fmt]
    before = h.snapshot(out)
    r = h.run_cli("load", out, "--optimizer-step", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["ok"] is True and doc["structural_only"] is False and doc["verified"] is True
    assert doc["tail_files"] == 16
    assert doc["param_count"] == h.read_manifest(src)["param_count"]
    v = h.run_cli("verify", out)
    assert v.rc == 0 and "OK" in v.out
    assert h.snapshot(out) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_unpack_gives_back_every_file(h, packed, fmt, tmp_path):
    src, out, _ = packed[fmt]
    out2 = tmp_path / "unpacked"
    r = h.run_cli("unpack", out, out2)
    assert r.rc == 0, r.err
    got, want = h.files_under(out2), h.files_under(src)
    assert set(got) == set(want)
    for rel in want:
        if rel != h.MANIFEST:
            assert got[rel] == want[rel], rel
    # the manifest says the same about every file, and has no packs any more
    new_man, src_man = h.read_manifest(out2), h.read_manifest(src)
    assert new_man["packs"] == {}
    key = lambda m: {e["path"]: (e["bytes"], e["digest"], e["kind"], e["rank"]) for e in m["files"]}
    assert key(new_man) == key(src_man)
    assert {k: v for k, v in new_man.items() if k != "files"} == {k: v for k, v in src_man.items() if k != "files"}
    assert h.run_cli("verify", out2).rc == 0


def test_pack_into_non_empty_out_is_refused(h, packed, tmp_path):
    src, _, before = packed["torch"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_bytes(b"k")
    r = h.run_cli("pack", src, out)
    assert r.rc == 2 and len(r.err_lines) == 1 and "not empty" in r.err
    assert h.listing(tmp_path) == ["out", "out/keep"]
    assert h.snapshot(src) == before


@pytest.mark.parametrize("evil", ["../evil", "/abs/evil", "dataloader/../../evil", "../../../../../../tmp/evil"])
def test_unpack_refuses_member_outside_out(h, packed, tmp_path, evil):
    _, out, _ = packed["safetensors"]
    crafted = tmp_path / "crafted"
    shutil.copytree(out, crafted)
    man = h.read_manifest(crafted)
    pack_file = sorted(man["packs"])[0]
    index = man["packs"][pack_file]
    victim = sorted(index)[0]
    if evil.startswith("/abs"):
        evil = str(tmp_path / "abs" / "evil")  # an absolute path the test owns, so it can look for it
    index[evil] = index.pop(victim)
    h.write_manifest(crafted, man)
    before = h.snapshot(crafted)
    tmp_evil_existed = os.path.lexists("/tmp/evil")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    out2 = sandbox / "inner" / "out2"
    r = h.run_proc("unpack", crafted, out2)
    assert r.rc == 1  # hostile content, as confine reports it: not a usage error
    assert "Traceback" not in r.err and len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error:") and evil in r.err_lines[0]
    assert h.listing(sandbox) == []  # OUT2 not created, nothing beside it
    assert not (tmp_path / "abs").exists()
    assert not (tmp_path / "evil").exists() and os.path.lexists("/tmp/evil") == tmp_evil_existed
    assert sorted(os.listdir(tmp_path)) == ["crafted", "sandbox"]
    assert h.snapshot(crafted) == before


def test_unpack_refuses_kept_file_outside_out(h, packed, tmp_path):
    _, out, _ = packed["torch"]
    crafted = tmp_path / "crafted"
    shutil.copytree(out, crafted)
    man = h.read_manifest(crafted)
    shard = next(e for e in man["files"] if e["kind"] == "model")
    shard["path"] = "../" + shard["path"]
    h.write_manifest(crafted, man)
    out2 = tmp_path / "out2"
    r = h.run_cli("unpack", crafted, out2)
    assert r.rc == 1 and len(r.err_lines) == 1 and "outside" in r.err and "Traceback" not in r.err
    assert sorted(os.listdir(tmp_path)) == ["crafted"]


def test_unpack_of_unpacked_checkpoint_is_one_line(h, ckpt, tmp_path):
    r = h.run_cli("unpack", ckpt("torch", 4), tmp_path / "o")
    assert r.rc == 2 and len(r.err_lines) == 1 and "no packs" in r.err
    assert os.listdir(tmp_path) == []


def test_pack_of_checkpoint_without_manifest(h, tmp_path):
    """A plain torch.save checkpoint plus its config and a data loader's state: packed, it still restores (the
    config stays a file, the data loader's state is read from the pack)."""
    import torch

    from ckptbench.checkpoint.model import GPT
    from ckptbench.checkpoint.profiles import ModelDims

    src = tmp_path / "plain"
    src.mkdir()
    torch.manual_seed(1)
    model = GPT(ModelDims(1, 32, 2, 128, 16))
    torch.save(model.state_dict(), str(src / "pytorch_model.bin"))
    (src / "config.json").write_text(json.dumps({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 128,
                                                 "n_positions": 16}))
    (src / "dataloader").mkdir()
    (src / "dataloader" / "pos.idx").write_bytes(b"\x01" * 100)
    before = h.snapshot(src)
    out = tmp_path / "packed"
    assert h.run_cli("pack", src, out, "--target-files", "4").rc == 0
    assert sorted(os.listdir(out)) == sorted(["ckptbench.json", "config.json", "pack-00001-of-00001.ckpack",
                                              "pytorch_model.bin"])
    man = h.read_manifest(out)
    assert man["packs"]["pack-00001-of-00001.ckpack"]["dataloader/pos.idx"][:2] == [0, 100]
    r = h.run_cli("load", out, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["ok"] is True and doc["finite_output"] is True and doc["tail_files"] == 2
    assert doc["param_count"] == sum(p.numel() for p in model.parameters())
    back = tmp_path / "back"
    assert h.run_cli("unpack", out, back).rc == 0
    got = h.files_under(back)
    assert set(got) == {"config.json", "dataloader/pos.idx", "pytorch_model.bin", h.MANIFEST}
    assert got["config.json"] == (src / "config.json").read_bytes()
    assert got["pytorch_model.bin"] == (src / "pytorch_model.bin").read_bytes()
    assert h.snapshot(src) == before
