"""Round 12 of trying ckptbench as a new user: the floor's notes and figures."""

from __future__ import annotations

import os

from clirun import run_cli


def test_a_checkpoint_too_small_to_measure_is_not_sent_to_remeasure(tmp_path, ckpt, plant_floor):
    """`floor` of a 38 MiB checkpoint on a mount whose storage figure came from a larger one said "`--remeasure`
    reads this checkpoint's"; doing so read its files cold (evicting them) and kept the mount's figure all the
    same: the note says the mount's figure is the one used, and why."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "shard.bin").write_bytes(os.urandom(1 << 20))
    plant_floor(source=big, storage_gbps=2.0)  # the mount's figure, kept from another checkpoint's full sample
    r = run_cli("floor", ckpt("safetensors", 1))
    assert r.rc == 0, r.err
    assert "--remeasure` reads this checkpoint's" not in r.out, r.out
    assert "measure latency more than bandwidth, so the mount's is the one used" in r.out, r.out


def test_a_small_checkpoints_run_and_check_are_not_told_to_floor_that_checkpoint(tmp_path, ckpt, plant_floor):
    """A 38 MiB checkpoint's run said "no storage figure for this mount (`ckptbench floor tiny` on 64 MiB or more)"
    and check's fix "point `ckptbench floor tiny` ... at a larger checkpoint": the command named the checkpoint too
    small to give one. Both name a larger checkpoint on the mount instead, and say why."""
    import json

    plant_floor()  # the box's figures, no storage figure for the mount
    source = ckpt("safetensors", 1)
    r = run_cli("run", source, "--repeat", "1", "--cache", "cold", "--results", tmp_path / "r.csv", "--json")
    assert r.rc == 0, r.err
    note = json.loads(r.out)["floor_note"]
    assert f"`ckptbench floor {source}`" not in note, note
    assert "`ckptbench floor DIR` on a checkpoint of 64 MiB or more" in note and "measures latency" in note, note
    r = run_cli("check", source, "--json")
    item = next(i for i in json.loads(r.out)["items"] if i["id"] == "efficiency")
    assert item["verdict"] == "unknown" and source not in item["fix"], item
    assert "`ckptbench floor DIR` on a checkpoint of 64 MiB or more" in item["fix"], item


def test_a_small_checkpoints_kept_figure_is_not_sent_to_remeasure_its_own_files(ckpt, plant_floor):
    """`floor` of a 38 MiB checkpoint a second time said "the storage figure was read from this checkpoint's files
    and kept: `--remeasure` reads them again", beside "the 37 MiB sample measures latency more than bandwidth: the
    floor does not use it": reading them again gives the same unusable figure."""
    plant_floor()
    source = ckpt("safetensors", 1)
    assert run_cli("floor", source).rc == 0
    r = run_cli("floor", source)
    assert r.rc == 0, r.err
    assert "read from this checkpoint's files" in r.out and "--remeasure` reads them again" not in r.out, r.out
    assert "measures latency more than bandwidth" in r.out, r.out


def test_a_samples_size_is_said_as_the_restores_is(ckpt, plant_floor):
    """`floor tiny` said "restore of tiny (38.0 MiB)" and, of the same bytes, "the 37 MiB sample measures latency":
    the notes' sizes were cut to whole MiB where every other figure is rounded to a tenth."""
    import json

    from ckptbench.core.units import human_bytes

    plant_floor()
    r = run_cli("floor", ckpt("safetensors", 1), "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    said = f"a {human_bytes(doc['storage']['sample_bytes'])} sample measures latency"
    assert any(said in n for n in doc["notes"]), doc["notes"]


def test_the_storage_methods_sample_size_is_the_restores(ckpt, plant_floor):
    """The storage line said "the 2 largest file(s) of gpt2 (128 MiB)" above "restore of gpt2 (128.5 MiB)"."""
    import json

    from ckptbench.core.units import human_bytes

    plant_floor()
    doc = json.loads(run_cli("floor", ckpt("safetensors", 1), "--json").out)
    assert f"({human_bytes(doc['storage']['sample_bytes'])}) read cold" in doc["storage"]["method"], doc["storage"]
