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
    assert set(lay.state_files) == {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}
    assert "training_args.bin" not in lay.files and "model.safetensors" in lay.files
    passed = dict(lay.skipped)
    assert "checkpoint-9" in passed and "checkpoint-2" in passed and "highest checkpoint-N" in lay.why


def test_a_final_model_beside_checkpoints_is_not_merged_and_pick_dot_restores_it():
    rels = _trainer(1) + _trainer(2) + ["model.safetensors", "config.json", "training_args.bin"]
    lay = resume.choose("/out", rels)
    assert lay.root == "checkpoint-2" and "model.safetensors" in dict(lay.skipped) and "--pick ." in lay.why
    top = resume.choose("/out", rels, pick=".")
    assert top.root is None and set(top.files) == {"model.safetensors", "config.json"}
    assert "checkpoint-1" in dict(top.skipped) and "checkpoint-2" in dict(top.skipped)


def test_torchtitan_dump_folder_descends_to_the_highest_step():
    rels = [f"checkpoint/step-{n}/{f}" for n in (9, 10) for f in (".metadata", "__0_0.distcp", "__1_0.distcp")]
    lay = resume.choose("/dump", rels + ["config.toml"])
    assert lay.root == "checkpoint/step-10" and lay.name == "dcp"
    assert set(lay.files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert dict(lay.skipped)["checkpoint/step-9"] == "an older checkpoint: a resume takes step-10"
    assert "checkpoint/step-10" not in dict(lay.skipped) and "config.toml" in dict(lay.skipped)


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


@pytest.mark.parametrize("pick", ["../x", "/etc", "nope", "a/../../b", "", "a/.metadata"])
def test_pick_outside_or_missing_is_one_line_naming_the_candidates(pick):
    with pytest.raises(CkptbenchError, match=r"--pick .*choose one of a, b "):
        resume.choose("/d", ["a/.metadata", "b/.metadata"], pick=pick)


def test_pick_of_a_subfolder_names_what_else_it_passes_over():
    rels = _trainer(3) + _trainer(9) + ["model.safetensors"]
    lay = resume.choose("/out", rels, pick="./checkpoint-3")
    assert lay.root == "checkpoint-3" and {"checkpoint-9", "model.safetensors"} <= set(dict(lay.skipped))
    assert "checkpoint-3/training_args.bin" in dict(lay.skipped)  # named from the folder given


def test_two_lightning_runs_side_by_side_are_two_checkpoints_never_one():
    rels = ["lightning_logs/version_0/checkpoints/epoch=0-step=2.ckpt",
            "lightning_logs/version_1/checkpoints/epoch=3-step=8.ckpt"]
    with pytest.raises(CkptbenchError, match=r"2 folders of checkpoints \(version_0, version_1\)"):
        resume.choose("/l", rels)
    lay = resume.choose("/l", rels, pick="lightning_logs/version_1/checkpoints/epoch=3-step=8.ckpt")
    assert lay.root == "lightning_logs/version_1/checkpoints" and lay.files == ("epoch=3-step=8.ckpt",)
    assert "lightning_logs/version_0" in dict(lay.skipped) or "lightning_logs" not in dict(lay.skipped)


def test_a_diffusers_pipeline_is_one_checkpoint_of_several_folders():
    rels = ["model_index.json", "unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors"]
    lay = resume.choose("/p", rels)
    assert lay.root is None and set(lay.files) == set(rels)


@pytest.mark.parametrize("what, odd", [("is a symlink", {"checkpoint-10": "is a symlink (only what lies inside "
                                                                          "the folder is read)"}),
                                       ("is empty", {"checkpoint-10": "is empty"})])
def test_a_newest_checkpoint_that_cannot_be_read_is_one_line_not_an_older_one(what, odd):
    rels = _trainer(3) + _trainer(9)
    with pytest.raises(CkptbenchError, match=rf"checkpoint-10: the newest checkpoint, which a resume picks, {what}.*"
                                             r"--pick checkpoint-9"):
        resume.choose("/out", rels, odd=odd)
    rels += ["checkpoint-10/trainer_state.json"]  # a save cut short: no weights
    with pytest.raises(CkptbenchError, match="holds no checkpoint files"):
        resume.choose("/out", rels)
    assert resume.choose("/out", rels, pick="checkpoint-9").root == "checkpoint-9"


def test_deepspeed_says_which_step_and_lists_the_others():
    ds = ["latest"] + [f"global_step{n}/mp_rank_00_model_states.pt" for n in (1, 2)]
    lay = resume.choose("/ds", ds, fetch=lambda rel, limit, what: b"global_step2")
    assert lay.tag == "global_step2" and "`latest` names" in lay.why
    assert dict(lay.skipped) == {"global_step1": "another step: DeepSpeed resumes global_step2"}


def test_on_disk_a_symlinked_or_empty_newest_checkpoint_is_seen_by_the_listing(tmp_path):
    """The directory walk lists files only and never follows a symlink: the folders it cannot show still count."""
    from ckptbench.sources.local import LocalSource

    out = tmp_path / "out"
    for n in (3, 9):
        (out / f"checkpoint-{n}").mkdir(parents=True)
        (out / f"checkpoint-{n}" / "model.safetensors").write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_bytes(b"x")
    (out / "checkpoint-10").symlink_to(elsewhere)
    with pytest.raises(CkptbenchError, match="checkpoint-10: the newest checkpoint, which a resume picks, is a symlink"):
        LocalSource(str(out), checkpoint=True).list()
    (out / "checkpoint-10").unlink()
    (out / "checkpoint-10").mkdir()
    with pytest.raises(CkptbenchError, match="checkpoint-10: the newest checkpoint, which a resume picks, is empty"):
        LocalSource(str(out), checkpoint=True).list()
    listing = LocalSource(str(out), checkpoint=True, pick="checkpoint-9").list()
    assert listing.source == str(out / "checkpoint-9")


def test_a_dcp_step_without_its_metadata_is_skipped_as_torchtitan_skips_it():
    """A new user's step-200 half written (shards, no .metadata yet) beside a whole step-100: the restore picked
    step-200 and failed with 'no ... torch.distributed.checkpoint files found', where torchtitan loads step-100."""
    rels = [f"step-100/{f}" for f in (".metadata", "__0_0.distcp")] + ["step-200/__0_0.distcp"]
    lay = resume.choose("/t", rels)
    assert lay.root == "step-100" and lay.name == "dcp"
    assert "torchtitan's resume skips it" in dict(lay.skipped)["step-200"]
    rels += ["step-200/.metadata"]  # the save finished
    assert resume.choose("/t", rels).root == "step-200"


def test_loose_weight_files_beside_folders_of_checkpoints_are_ambiguous_and_pick_chooses():
    """A new user's folder: dcp/ (a DCP checkpoint), st/ (a safetensors file) and an extra.pt at the top. It was
    restored as one "dcp" checkpoint reading all three (the format taken from dcp/.metadata)."""
    rels = ["dcp/.metadata", "dcp/__0_0.distcp", "st/x.safetensors", "extra.pt"]
    with pytest.raises(CkptbenchError, match=r"weight files at the top \(extra\.pt\) beside 1 folder of "
                                             r"checkpoints: 2 candidates \(\., dcp\).*--pick NAME"):
        resume.choose("/d", rels)
    # plain weight files in a sub-folder are part of a file set (`read` of any files), not a rival checkpoint
    assert resume.choose("/d", ["f0.bin", "f2.bin", "sub/f1.bin", "sub/f3.bin"]).root is None
    assert resume.choose("/d", rels, pick="dcp").name == "dcp"
    top = resume.choose("/d", rels, pick=".")
    assert top.files == ("extra.pt",) and {"dcp", "st"} <= set(dict(top.skipped))


def test_an_indexed_model_beside_a_folder_of_other_weights_is_the_indexed_model(tmp_path):
    """A Hugging Face repository with its original weights in original/ (Llama's consolidated.00.pth): the index at
    the top names the model; original/ is not a rival checkpoint, so this is no ambiguity."""
    import json

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    rels = ["model.safetensors.index.json", "model-00001-of-00001.safetensors", "config.json",
            "original/consolidated.00.pth", "original/params.json"]
    lay = resume.choose(str(tmp_path), rels)  # not ambiguous: the top is one checkpoint by its index
    assert lay.root is None and lay.name == "hf-safetensors" and "model-00001-of-00001.safetensors" in lay.files


def test_an_indexed_models_original_weights_in_a_sub_folder_are_not_read(tmp_path):
    """transformers' from_pretrained reads the index's shards; Llama's original/consolidated.00.pth (as large as the
    model) was read with them, doubling the RTO of a restore of the repository."""
    import json

    from ckptbench.checkpoint import layouts

    for index, shard in (("model.safetensors.index.json", "model-00001-of-00001.safetensors"),
                         ("pytorch_model.bin.index.json", "pytorch_model-00001-of-00001.bin")):
        d = tmp_path / index
        d.mkdir()
        (d / index).write_text(json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
        rels = [index, shard, "config.json", "original/consolidated.00.pth", "original/params.json"]
        lay = resume.choose(str(d), rels)
        assert shard in lay.files and "config.json" in lay.files, lay.files
        assert "original/consolidated.00.pth" not in lay.files
        assert dict(lay.skipped)["original/consolidated.00.pth"] == layouts.BELOW_WHY
