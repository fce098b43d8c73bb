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


def test_compare_says_a_no_fsync_save_is_not_made_as_a_durable_one(ckpt, tmp_path):
    import json

    src, results = ckpt("safetensors", 2), tmp_path / "results.csv"
    durable = run_cli("save", src, tmp_path / "a", "--count", "2", "--results", results)
    fast = run_cli("save", src, tmp_path / "b", "--count", "2", "--no-fsync", "--results", results)
    assert durable.rc == 0 and fast.rc == 0, durable.err + fast.err
    r = run_cli("compare", results)
    assert "WARNING" in r.out and "fsync: yes → no" in r.out, r.out
    doc = json.loads(run_cli("compare", results, "--json").out)
    assert doc["env_diff"]["fsync"] == [True, False], doc["env_diff"]


def test_compare_says_what_its_default_baseline_had_to_share(ckpt, tmp_path):
    src, results = ckpt("safetensors", 2), tmp_path / "results.csv"
    for cache in ("hot", "cold"):
        assert run_cli("run", src, "--cache", cache, "--repeat", "1", "--results", results).rc == 0
    r = run_cli("compare", results)
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1, r.err
    for said in ("with format safetensors and cache cold", "had cache hot", "--baseline RUN"):
        assert said in r.err, (said, r.err)


def _small_files_item(source) -> dict:
    import json

    r = run_cli("check", source, "--json")
    return next(i for i in json.loads(r.out)["items"] if i["id"] == "small_files")


def test_check_advises_pack_only_where_pack_packs_something(h, ckpt, tmp_path):
    import torch
    from safetensors.torch import save_file

    weights = tmp_path / "weights"  # 150 one-tensor files: small, and every one opened by name
    weights.mkdir()
    for i in range(150):
        save_file({f"layer{i}.w": torch.zeros(16, 16)}, str(weights / f"part-{i:04d}.safetensors"))
    it = _small_files_item(weights)
    assert it["verdict"] == "warn" and it["evidence"]["packable_files"] == 0, it
    assert "ckptbench pack" not in it["fix"].split(",")[0] and "max_shard_size" in it["fix"], it["fix"]
    r = run_cli("pack", weights, tmp_path / "packed")
    assert r.rc == 2 and "nothing to pack" in r.err

    loader = tmp_path / "loader"  # the same count of small files in a data loader's folder: pack packs them
    h.copy_ckpt(ckpt("safetensors", 2), loader)
    for i in range(150):
        (loader / "dataloader" / f"extra{i}.idx").write_bytes(b"x" * 100)
    for i in range(1000):
        (loader / "dataloader" / f"more{i}.idx").write_bytes(b"y" * 10)
    it = _small_files_item(loader)
    assert it["verdict"] == "warn" and it["fix"].startswith("ckptbench pack "), it


def test_history_tells_a_no_fsync_save_from_a_durable_one(ckpt, tmp_path):
    import json

    src, results = ckpt("safetensors", 2), tmp_path / "results.csv"
    for extra in ((), ("--no-fsync",)):
        assert run_cli("save", src, tmp_path / "t", "--count", "2", "--results", results, *extra).rc == 0
    durable, fast = run_cli("history", results).out.splitlines()
    assert "  sync  " in durable and "no fsync" not in durable, durable
    assert "  sync/no fsync  " in fast, fast
    assert [r["fsync"] for r in json.loads(run_cli("history", results, "--json").out)["runs"]] == [True, False]


def test_history_names_where_a_save_wrote_beside_what_it_saved(ckpt, tmp_path):
    """Two save runs of one checkpoint to two targets read as the same line: the target was not on it."""
    import json

    src, results = ckpt("safetensors", 2), tmp_path / "results.csv"
    for t in ("fast-disk", "slow-disk"):
        assert run_cli("save", src, tmp_path / t, "--count", "1", "--no-fsync", "--results", results).rc == 0
    lines = run_cli("history", results).out.splitlines()
    assert [f"{src} → {tmp_path / t}" in line for line, t in zip(lines, ("fast-disk", "slow-disk"))] == [True, True]
    assert [r["target"] for r in json.loads(run_cli("history", results, "--json").out)["runs"]] == [
        str(tmp_path / "fast-disk"), str(tmp_path / "slow-disk")]


def test_plan_judges_an_interval_by_the_newest_durable_save_not_a_no_fsync_one(ckpt, tmp_path):
    import json

    src, results = ckpt("safetensors", 2), tmp_path / "results.csv"
    assert run_cli("save", src, tmp_path / "t", "--count", "2", "--results", results).rc == 0
    durable = json.loads(run_cli("history", results, "--json").out)["runs"][0]["run_id"]
    assert run_cli("save", src, tmp_path / "t", "--count", "2", "--no-fsync", "--results", results).rc == 0
    doc = json.loads(run_cli("plan", "small", "--interval", "60", "--results", results, "--json").out)
    assert doc["save"]["measured"]["run_id"] == durable, doc["save"]

    only = tmp_path / "only.csv"
    assert run_cli("save", src, tmp_path / "u", "--count", "2", "--no-fsync", "--results", only).rc == 0
    r = run_cli("plan", "small", "--interval", "60", "--results", only)
    assert r.rc == 0 and "--no-fsync" in r.out and "no save measured" not in r.out and "GB/s sustained to" not in r.out


def test_a_no_fsync_save_gives_no_write_amplification(ckpt, tmp_path):
    import json

    r = run_cli("save", ckpt("safetensors", 2), tmp_path / "t", "--count", "2", "--no-fsync", "--results", "",
                "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["write_amplification"] is None, doc["write_amplification"]
    assert any("write amplification is not known" in n for n in doc["notes"]), doc["notes"]
