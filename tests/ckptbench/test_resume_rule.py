"""resume.choose: the one rule for which checkpoint a resume loads, over member names alone (as the S3 listing and the
directory walk give them). The libraries' own checkpoints are in tests/compat; here, the rule's edges."""

from __future__ import annotations

import pytest

from ckptbench.checkpoint import resume
from ckptbench.core.errors import CkptbenchError


def _trainer(n: int) -> list[str]:
    return [f"checkpoint-{n}/{f}" for f in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                                            "trainer_state.json", "training_args.bin", "config.json")]


def test_trainer_output_dir_takes_the_highest_checkpoint_numerically_with_its_whole_state():
    rels = _trainer(9) + _trainer(10) + _trainer(2)
    lay = resume.choose("/out", rels)
    assert lay.root == "checkpoint-10" and lay.name == "hf-trainer"
    assert set(lay.state_files) == {"optimizer.pt", "scheduler.pt", "rng_state.pth"}
    assert "training_args.bin" not in lay.files and "model.safetensors" in lay.files
    passed = dict(lay.skipped)
    assert "checkpoint-9" in passed and "checkpoint-2" in passed and "highest checkpoint-N" in lay.why


def test_a_final_model_beside_checkpoints_is_not_merged_and_pick_dot_restores_it():
    rels = _trainer(1) + _trainer(2) + ["model.safetensors", "config.json", "training_args.bin"]
    lay = resume.choose("/out", rels)
    assert lay.root == "checkpoint-2" and "model.safetensors" in dict(lay.skipped) and "--pick ." in lay.why
    top = resume.choose("/out", rels, pick=".")
    assert top.root is None and set(top.files) == {"model.safetensors", "config.json"}
    assert "checkpoint-1/" in dict(top.skipped) and "checkpoint-2/" in dict(top.skipped)


def test_torchtitan_dump_folder_descends_to_the_highest_step():
    rels = [f"checkpoint/step-{n}/{f}" for n in (9, 10) for f in (".metadata", "__0_0.distcp", "__1_0.distcp")]
    lay = resume.choose("/dump", rels + ["config.toml"])
    assert lay.root == "checkpoint/step-10" and lay.name == "dcp"
    assert set(lay.files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert dict(lay.skipped) == {"checkpoint/step-9": "an older checkpoint: a resume takes step-10"}


@pytest.mark.parametrize("names", [["step-10", "step-010"], ["step-5", "step-05"]])
def test_two_spellings_of_one_step_are_ambiguous(names):
    rels = [f"{d}/.metadata" for d in names]
    with pytest.raises(CkptbenchError, match="two folders number checkpoint"):
        resume.choose("/d", rels)


def test_non_ascii_digits_are_not_step_numbers():
    rels = ["step-10/.metadata", "step-10/__0_0.distcp", "step-１２３/.metadata", "step-１２３/__0_0.distcp"]
    lay = resume.choose("/d", rels)  # not "step 123 is the newest": step-10 is, and the other is named
    assert lay.root == "step-10" and "ASCII digits" in dict(lay.skipped)["step-１２３"]


def test_lightning_last_ckpt_wins_and_several_others_are_ambiguous():
    lay = resume.choose("/l", ["epoch=0-step=2.ckpt", "last.ckpt"])
    assert lay.files == ("last.ckpt",) and lay.name == "lightning"
    with pytest.raises(CkptbenchError, match=r"2 Lightning checkpoints .*--pick"):
        resume.choose("/l", ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"])
    lay = resume.choose("/l", ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"], pick="epoch=1-step=4.ckpt")
    assert lay.files == ("epoch=1-step=4.ckpt",)


def test_lightning_logs_folder_descends_to_its_only_checkpoint():
    rels = ["lightning_logs/version_0/checkpoints/epoch=1-step=4.ckpt", "lightning_logs/version_0/hparams.yaml"]
    lay = resume.choose("/l", rels)
    assert lay.root == "lightning_logs/version_0/checkpoints" and lay.files == ("epoch=1-step=4.ckpt",)


def test_deepspeed_and_megatron_folders_are_one_checkpoint_not_wrappers():
    ds = ["latest", "global_step2/mp_rank_00_model_states.pt", "global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    lay = resume.choose("/ds", ds, fetch=lambda rel, limit, what: b"global_step2")
    assert lay.name == "deepspeed" and lay.root is None and lay.tag == "global_step2"
    mp = ["mp_rank_00/model_optim_rng.pt"]
    assert resume.choose("/m", mp).name == "megatron"


@pytest.mark.parametrize("pick", ["../x", "/etc", "nope", "a/../../b"])
def test_pick_outside_or_missing_is_one_line(pick):
    with pytest.raises(CkptbenchError, match="--pick"):
        resume.choose("/d", ["a/.metadata", "b/.metadata"], pick=pick)
