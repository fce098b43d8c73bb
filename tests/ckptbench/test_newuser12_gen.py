"""Round 12 of trying ckptbench as a new user: `gen` into a folder that already holds something."""

from __future__ import annotations

from clirun import assert_one_line_error, run_cli


def test_gen_into_a_folder_it_did_not_write_does_not_offer_force(tmp_path):
    """`gen small ./gpt2` over a save_pretrained folder said "not empty; pass --force to replace it"; with --force
    it then said --force replaces only a checkpoint gen wrote. The first answer is the one that holds."""
    target = tmp_path / "gpt2"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"\0" * 64)
    for extra in ((), ("--force",)):
        r = run_cli("gen", "small", target, "--scale", "0.02", *extra)
        assert_one_line_error(r, "not a checkpoint gen wrote")
        assert "pass --force" not in r.err, r.err
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors"]


def test_gen_over_its_own_checkpoint_still_offers_force(tmp_path):
    target = tmp_path / "small"
    assert run_cli("gen", "small", target, "--scale", "0.02").rc == 0
    assert_one_line_error(run_cli("gen", "small", target, "--scale", "0.02"), "pass --force to replace it")
    assert run_cli("gen", "small", target, "--scale", "0.02", "--force").rc == 0
