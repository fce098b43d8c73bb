"""Which files of a checkpoint directory one restore reads, from the layout a trainer saved it in: DeepSpeed's
step directories with `latest`, Hugging Face's .bin shards with their index, a Hugging Face Trainer's
checkpoint-N directory, ckptbench's own rank shards.

The files that point at others (`latest`, an index) are the checkpoint's content, hence hostile: pointers.py reads
them within a small bound and confines every name in them before it selects anything. The selection works from the
member names and a bounded fetch of a small member, so a directory (read through confine) and an S3 prefix (a ranged
GET) share it. Free of torch: the listing uses it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from ckptbench.checkpoint.pointers import (HF_INDEX, ITER_DIGITS, LATEST, Fetch, confine_name, one_of, read_hf_index,
                                           read_latest, refuse)

HF_SINGLE = "pytorch_model.bin"
ST_INDEX = "model.safetensors.index.json"
TORCH_EXT = (".pt", ".pth", ".bin", ".ckpt")  # .ckpt: Lightning's (and Stable Diffusion's) torch.save
SHARD_EXT = {"safetensors": (".safetensors",), "torch": TORCH_EXT, "dcp": (".distcp",)}  # files holding tensors
DS_MODEL = re.compile(r"^(?:bf16_)?(?:zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt$")
DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_STEP_DIR = re.compile(r"^global_step\d+$")
_HF_SHARD = re.compile(r"^pytorch_model(?:-\d+-of-\d+)?\.bin$")
_ST_SHARD = re.compile(r"^model(?:-\d+-of-\d+)?\.safetensors$")
_HF_WEIGHTS = re.compile(r"^(?:(?:pytorch_model|adapter_model)(?:-\d+-of-\d+)?\.bin|"
                         r"(?:model|adapter_model)(?:-\d+-of-\d+)?\.safetensors|"
                         r"(?:pytorch_model\.bin|model\.safetensors)\.index\.json)$")
_OWN = re.compile(r"^(model|optim)_rank(\d+)\.pt$")
# Megatron-LM: <root>/latest_checkpointed_iteration.txt names iter_NNNNNNN (or release); each iteration holds a
# torch.save per model-parallel rank (mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt, distrib_optim.pt) or, saved as
# torch_dist, a DCP checkpoint (.metadata, *.distcp, common.pt)
# (iter_%07d: seven digits, more past iteration 9999999, as Megatron formats it; ITER_DIGITS at most)
_ITER_DIR = re.compile(r"^(?:iter_(?:\d{7}|[1-9]\d{7,%d})|release)$" % (ITER_DIGITS - 1))
MEGATRON_COMMON, MEGATRON_META = "common.pt", "metadata.json"  # beside a torch_dist iteration's DCP files
# FSDP's sharded state dict as Accelerate saves it (save_fsdp_model / save_fsdp_optimizer, which a Hugging Face Trainer
# calls under FSDP): a DCP checkpoint per model (pytorch_model_fsdp_N: {"model": …}) and per optimizer (optimizer_N:
# {"optimizer": …}), beside the Trainer's or Accelerate's other state files
FSDP_MODEL_DIR = re.compile(r"^pytorch_model_fsdp_(?:0|[1-9][0-9]{0,3})$")  # as Accelerate names them: no leading 0
FSDP_OPTIM_DIR = re.compile(r"^optimizer_(?:0|[1-9][0-9]{0,3})$")
# mp_rank_TT, then _PPP under pipeline parallelism, then _EEE under expert parallelism (Megatron's get_checkpoint_name):
# groups are the ranks it carries; mp_rank_TT_XXX is either, and only the saved args say which
MP_DIR = re.compile(r"^mp_rank_([0-9]{2})(?:_([0-9]{3}))?(?:_([0-9]{3}))?$")
# what transformers' Trainer, and Accelerate's save_state, save beside the weights; torch.save files among them hold
# state, keyed by their stem (state_stem). Accelerate's random_states_N.pkl is a plain pickle: never loaded; its
# custom_checkpoint_N.pkl, the state_dict of an object given to register_for_checkpointing, is a torch.save its
# resume loads, read here as every torch.save is (no code runs)
TRAINER_STATE = re.compile(r"^(?:(optimizer|scheduler|scaler)\.pt|(rng_state(?:_\d+)?)\.pth|"
                           r"((?:optimizer|scheduler|sampler)(?:_\d+)?)\.bin|(custom_checkpoint_\d{1,4})\.pkl|"
                           r"(trainer_state)\.json)$")  # a Trainer's state as JSON (formats/trainer_json)
TRAINER_MARKERS = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "optimizer.bin", "scheduler.bin",
                   "random_states_0.pkl")
TRAINING_ARGS = "training_args.bin"
SKIP_WHY = {TRAINING_ARGS: "a pickled TrainingArguments object: not state, and unpickling it could run code"}


@dataclass(frozen=True)
class Layout:
    """The files one restore reads (`files`, relative "/"-separated paths) and what they are."""

    # deepspeed, megatron, hf-trainer, accelerate, hf-bin, hf-safetensors, torch-shards, dcp, lightning, or files
    # (no layout known: every file)
    name: str
    files: tuple[str, ...]
    tag: str | None = None  # DeepSpeed's step, Megatron's iteration restored (None when pointed at it directly)
    ranks: tuple[int, ...] = ()
    model_files: tuple[str, ...] = ()
    optimizer_files: tuple[str, ...] = ()
    state_files: tuple[str, ...] = ()  # torch.save files loaded whole under their stem (optimizer.state.0.exp_avg)
    skipped: tuple[tuple[str, str], ...] = ()  # (file, why) of files present but deliberately not read
    root: str | None = None  # the checkpoint is this sub-folder (resume.choose): sources descend into it
    why: str = ""  # why this checkpoint, where the folder held several (resume.choose)
    unloaded: tuple[tuple[str, str], ...] = ()  # (file, why) read with the checkpoint but never deserialized
    dcp_dirs: tuple[str, ...] = ()  # sub-folders each holding a DCP checkpoint (FSDP's sharded model, optimizer)
    notes: tuple[str, ...] = ()  # what the restore leaves out that a resume would miss (FSDP without its optimizer)

    def describe(self) -> dict:
        return {"name": self.name, "tag": self.tag, "root": self.root, "why": self.why, "ranks": list(self.ranks), "model_files": list(self.model_files),
                "optimizer_files": list(self.optimizer_files), "state_files": list(self.state_files),
                "dcp_dirs": list(self.dcp_dirs), "notes": list(self.notes),
                "not_read": [{"path": p, "why": why} for p, why in self.skipped],
                "unloaded": [{"path": p, "why": why} for p, why in self.unloaded]}


def picked_name(root: str | None, tag: str | None) -> str:
    """The checkpoint chosen, as a line names it from the folder given: a Lightning .ckpt file with the folder above
    it (inspect said "picked the checkpoint at the top" of epoch=1-step=100.ckpt, run "restored checkpoints"), else
    its folder, else its tag."""
    if tag and tag.endswith(".ckpt"):
        return f"{root}/{tag}" if root else tag
    return root or tag or "the checkpoint at the top"


def picked_why(root: str | None, tag: str | None, why: str) -> str:
    """The why a line gives after picked_name, without that name said again at its head: the why chains each
    level's "folder: reason", so one level read "restored checkpoint-6 (hf-trainer): checkpoint-6: the highest
    checkpoint-N of 2, …" (layouts.md shows the line without the repeat). A chain of several levels keeps it all."""
    head = f"{picked_name(root, tag)}: "
    return why[len(head):] if why.startswith(head) and len(why) > len(head) else why


def _step_dirs(rels: list[str]) -> set[str]:
    """Top-level directories that hold one DeepSpeed step: global_stepN, or DeepSpeed's state files."""
    out = set()
    for r in rels:
        parts = r.split("/")
        if len(parts) >= 2 and _STEP_DIR.match(parts[0]):
            out.add(parts[0])
        elif len(parts) == 2 and (DS_MODEL.match(parts[1]) or DS_OPTIM.match(parts[1])):
            out.add(parts[0])
    return out


def _deepspeed(where: str, rels: list[str], top: set[str], steps: set[str], fetch: Fetch | None) -> Layout:
    if any(DS_MODEL.match(r) or DS_OPTIM.match(r) for r in top):  # pointed at one step directory
        tag, files, prefix = None, tuple(rels), ""
    else:
        tag = one_of(where, steps, "DeepSpeed step", LATEST, "its name",
                     lambda: read_latest(where, rels, fetch) if LATEST in top else None, fetch is None)
        prefix = tag + "/"
        if not any(r.startswith(prefix) and r.endswith(TORCH_EXT) for r in rels):
            raise refuse(os.path.join(where, LATEST) if LATEST in top else where,
                         f"the step directory {tag!r} holds no torch files",
                         "point at a step directory that holds DeepSpeed's model and optimizer states")
        files = tuple(r for r in rels if r.startswith(prefix) or r.split("/")[0] not in steps)  # other steps: not read
    names = [(r, r[len(prefix):]) for r in files if r.startswith(prefix) and "/" not in r[len(prefix):]]
    ranks = sorted({int(m.group(1)) for _, n in names if (m := DS_OPTIM.match(n))})
    why = "" if tag is None else (f"{tag}: the step `{LATEST}` names, as DeepSpeed's load_checkpoint takes it"
                                  if LATEST in top else f"{tag}: the only step")
    others = tuple((d, f"another step: DeepSpeed resumes {tag}") for d in sorted(steps - {tag})) if tag else ()
    return Layout("deepspeed", files, tag, tuple(ranks), tuple(r for r, n in names if DS_MODEL.match(n)),
                  tuple(r for r, n in names if DS_OPTIM.match(n)), trainer_state_files(files), others, why=why)


def _indexed(where: str, rels: list[str], index: str, shard: re.Pattern, fetch: Fetch | None) -> tuple[tuple, tuple]:
    """(files, weight files) per a Hugging Face index: every shard it names confined and listed; a stale shard the
    index drops is not read."""
    path = os.path.join(where, index)
    shards = sorted(set(read_hf_index(where, index, fetch).values()))
    listed = set(rels)
    for name in shards:
        confine_name(where, name, fetch is None)  # refuses a name that is not plain or leads outside
        if name not in listed:
            raise refuse(path, f"names shard {name[:80]!r}, which is missing from {where} (or not a "
                         "regular file)", "re-copy the checkpoint with all its shards")
    named = set(shards)
    return tuple(r for r in rels if r in named or not shard.match(r)), tuple(shards)


BELOW_WHY = ("weights in a sub-folder the index does not name (a repository's original/ checkpoint): "
             "from_pretrained reads only the index's shards")


def _below(lay: Layout) -> Layout:
    """An indexed model without the weight files in its sub-folders: transformers loads the index's shards and never
    opens them (Llama's original/consolidated.00.pth, as large as the model, was read with it: twice the RTO)."""
    gone = tuple(r for r in lay.files if "/" in r and r.endswith((*TORCH_EXT, ".safetensors", ".distcp"))
                 and r not in lay.model_files)
    if not gone:
        return lay
    return replace(lay, files=tuple(r for r in lay.files if r not in gone),
                   skipped=lay.skipped + tuple((r, BELOW_WHY) for r in gone))


def _hf_bin(where: str, rels: list[str], top: set[str], fetch: Fetch | None) -> Layout:
    if HF_INDEX not in top:
        return Layout("hf-bin", tuple(rels), model_files=(HF_SINGLE,))
    files, shards = _indexed(where, rels, HF_INDEX, _HF_SHARD, fetch)
    return _below(Layout("hf-bin", files, model_files=shards))


# Accelerate's save_state names the weights of its i-th prepared model (i >= 1) model_i.safetensors or
# pytorch_model_i.bin: each is that model's own state_dict, so two models both hold a `weight`
ACCELERATE_MODEL = re.compile(r"^(?:model_([1-9][0-9]{0,3})\.safetensors|pytorch_model_([1-9][0-9]{0,3})\.bin)$")


def model_prefix(name: str) -> str:
    """What the weights in the file `name` are keyed under: "model_1." for Accelerate's second model's file (one
    merged state kept only the last file's `weight`, or refused the two as two checkpoints), "" for any other."""
    m = ACCELERATE_MODEL.match(name)
    return f"model_{m.group(1) or m.group(2)}." if m else ""


def lightning_file(paths) -> str | None:
    """The one Lightning .ckpt among `paths`, which names the checkpoint (two of one folder are two checkpoints); None
    where there is not exactly one. A run's record and a watch's name a Lightning restore by it alike."""
    ckpts = [p for p in paths if p.endswith(".ckpt")]
    return ckpts[0] if len(ckpts) == 1 else None


def state_stem(name: str) -> str | None:
    """The stem a Trainer's (or Accelerate's) state file's keys go under (optimizer.state.0.exp_avg), else None."""
    m = TRAINER_STATE.match(name)
    return next(g for g in m.groups() if g) if m else None


def trainer_state_files(rels) -> tuple[str, ...]:
    """The files a Hugging Face Trainer (or Accelerate) keeps its state in, at the top of the checkpoint: the
    torch.save files optimizer.pt, scheduler.pt, scaler.pt, rng_state*.pth, and trainer_state.json."""
    return tuple(r for r in rels if TRAINER_STATE.match(r))


def is_megatron_dist(top: set[str]) -> bool:
    """A Megatron torch_dist iteration: its DCP files with common.pt (the state that is not sharded, which a resume
    loads and merges) and metadata.json (the backend it was saved with) beside them."""
    return ".metadata" in top and MEGATRON_COMMON in top and MEGATRON_META in top


def is_trainer(top: set[str]) -> bool:
    """A Hugging Face Trainer's checkpoint-N directory: its state files beside model weights."""
    return any(m in top for m in TRAINER_MARKERS) and any(_HF_WEIGHTS.match(r) for r in top)


def _hf_trainer(where: str, rels: list[str], top: set[str], fetch: Fetch | None) -> Layout:
    files, weights = tuple(rels), tuple(sorted(r for r in top if (_HF_WEIGHTS.match(r) and not r.endswith(".json"))
                                               or ACCELERATE_MODEL.match(r)))
    for index, shard in ((ST_INDEX, _ST_SHARD), (HF_INDEX, _HF_SHARD)):
        if index in top:
            files, named = _indexed(where, list(files), index, shard, fetch)
            weights = tuple(r for r in weights if not shard.match(r)) + named
    # Accelerate's save_state: no trainer_state.json, its state as optimizer.bin, scheduler.bin, random_states_N.pkl
    name = "hf-trainer" if "trainer_state.json" in top or "optimizer.pt" in top else "accelerate"
    return Layout(name, files, model_files=tuple(sorted(weights)),
                  # Accelerate's optimizer_N.bin of its N+1-th optimizer too, which the restore loads as a state file
                  optimizer_files=tuple(r for r in trainer_state_files(sorted(top))
                                        if (state_stem(r) or "").partition("_")[0] == "optimizer"),
                  state_files=trainer_state_files(sorted(top)), unloaded=_plain_pickles(files))


def _fsdp(where: str, rels: list[str], top: set[str], dirs: tuple[str, ...]) -> Layout:
    """A Trainer's (trainer_state.json) or Accelerate's checkpoint of an FSDP run saved with SHARDED_STATE_DICT: the
    DCP folders are the model and the optimizer; the Trainer's scheduler.pt and rng_state_N.pth are loaded beside
    them; other sub-folders are not read."""
    cut = sorted({r.split("/")[0] for r in rels if r.count("/") == 1 and r.endswith(".distcp")
                  and (FSDP_MODEL_DIR.match(r.split("/")[0]) or FSDP_OPTIM_DIR.match(r.split("/")[0]))} - set(dirs))
    if cut:  # DCP writes .metadata last: the resume's load of this folder fails, and a restore without it is partial
        raise refuse(f"{where}/{cut[0]}", "DCP shards without their .metadata (a save cut short or still being "
                     "written): a resume of this checkpoint fails there", "restore an earlier checkpoint (--pick) or "
                     "finish the save")
    mine = [r for r in rels if "/" not in r or r.split("/")[0] in dirs]
    skipped = tuple((r, "not part of the FSDP checkpoint (its model and optimizer folders are read)")
                    for r in rels if "/" in r and r.split("/")[0] not in dirs)
    name = "hf-trainer" if "trainer_state.json" in top else "accelerate"
    states, notes = trainer_state_files(sorted(top)), ()
    if not any(FSDP_OPTIM_DIR.match(d) for d in dirs):
        _optimizer_folder_fails(where, {r.split("/")[0] for r in rels if "/" in r})
        notes = (_no_optimizer(top),)
        if name == "hf-trainer" and SCHEDULER in states:  # the resume loads the scheduler only with an optimizer
            states, mine = tuple(r for r in states if r != SCHEDULER), [r for r in mine if r != SCHEDULER]
            skipped += ((SCHEDULER, SCHEDULER_ALONE_WHY),)
    return Layout(name, tuple(mine), model_files=tuple(r for r in mine if FSDP_MODEL_DIR.match(r.split("/")[0])),
                  optimizer_files=tuple(r for r in mine if FSDP_OPTIM_DIR.match(r.split("/")[0])),
                  state_files=states, skipped=skipped, unloaded=_plain_pickles(mine), dcp_dirs=dirs, notes=notes)


SCHEDULER = "scheduler.pt"
SCHEDULER_ALONE_WHY = ("a Trainer resume loads the scheduler only beside an optimizer state, and this checkpoint has "
                       "none: it starts both afresh")


def _no_optimizer(top: set[str]) -> str:
    """The note of an FSDP checkpoint without its optimizer folder. transformers' Trainer looks for an optimizer
    (optimizer.pt, optimizer.bin, or a folder with "optimizer" in its name) and, finding none, passes over the
    optimizer and the scheduler in silence, as after save_only_model, whose checkpoints the docs say cannot resume."""
    what = ("optimizer_0 is a file, not the DCP folder Accelerate writes" if "optimizer_0" in top
            else "no optimizer_0 folder (Accelerate's sharded optimizer state) is there")
    return (f"the optimizer is not restored: {what}; a Trainer resume from this checkpoint starts the optimizer and "
            "the scheduler afresh (as after save_only_model), so it is not the run that was saved")


def _optimizer_folder_fails(where: str, folders) -> None:
    """An FSDP checkpoint with a folder named for an optimizer that holds no DCP checkpoint: the Trainer, seeing a
    folder with "optimizer" in its name, loads optimizer_0 with Accelerate's load_fsdp_optimizer, which fails there."""
    bad = sorted(d for d in folders if "optimizer" in d)
    if bad:
        raise refuse(f"{where}/{bad[0]}", "a folder named for FSDP's sharded optimizer that holds no DCP checkpoint "
                     "(no .metadata): a Trainer resume loads the optimizer from optimizer_0 and fails there",
                     _REMOVE_OPTIMIZER)


def fsdp_unreadable(where: str, rels: list[str], odd: dict[str, str]) -> None:
    """One line for FSDP's model or optimizer folder that the listing cannot use (`odd`: a symlink, never followed;
    an empty folder), or a model folder missing beside the optimizer's: a resume loads from each (through the link,
    or failing on the empty or missing folder), where the restore passed over it, called the folder's state files
    "weight files" beside folders of checkpoints, or restored the weights alone in silence."""
    top = {r for r in rels if "/" not in r}
    optims = {r.split("/")[0] for r in rels if r.count("/") == 1 and r.endswith("/.metadata")
              and FSDP_OPTIM_DIR.match(r.split("/")[0])}
    if not fsdp_dirs(rels):  # no model folder: one named so that the listing cannot use, or none beside an optimizer
        model = next((d for d in sorted(odd) if FSDP_MODEL_DIR.match(d)), None)
        if model is not None:
            raise refuse(f"{where}/{model}", f"FSDP's sharded model folder {odd[model]}; a resume loads the model "
                         "from it", _ODD_TODO[odd[model].startswith("is a symlink")])
        weights = any(r.startswith("pytorch_model") or _HF_WEIGHTS.match(r) for r in top)  # a model saved whole
        if optims and any(m in top for m in TRAINER_MARKERS) and not weights:
            raise refuse(f"{where}/{min(optims)}", "FSDP's sharded optimizer without its model folder "
                         "(pytorch_model_fsdp_0): a resume loads the model from that folder and fails",
                         "restore an earlier checkpoint (--pick)")
        return
    optim = next((d for d in sorted(odd) if "optimizer" in d), None)
    if not optims and optim is not None:  # the Trainer sees a folder named for an optimizer and loads optimizer_0
        link = odd[optim].startswith("is a symlink")
        raise refuse(f"{where}/{optim}", f"FSDP's sharded optimizer folder {odd[optim]}; a Trainer resume loads the "
                     f"optimizer from it{'' if link else ' and fails there'}",
                     _ODD_TODO[True] if link else _REMOVE_OPTIMIZER)


_ODD_TODO = {True: "point at a copy made with `cp -rL` (a link is never followed: nothing outside the checkpoint is "
                   "read)",
             False: "restore an earlier checkpoint (--pick), or finish the save"}
_REMOVE_OPTIMIZER = "restore an earlier checkpoint (--pick), or remove the folder to restore the weights alone"


PLAIN_PICKLE_WHY = "a plain pickle (Accelerate's RNG states): read, never unpickled, since unpickling can run code"


def _plain_pickles(files) -> tuple[tuple[str, str], ...]:
    """The .pkl files read and never loaded: all but the torch.save ones a state file names (custom_checkpoint_N)."""
    return tuple((r, PLAIN_PICKLE_WHY) for r in files if r.endswith(".pkl") and not TRAINER_STATE.match(r))


SCRIPT_WHY = "a Python script (DeepSpeed copies zero_to_fp32.py beside its steps): code, not state; no resume reads it"


DOC_WHY = "documentation (a model card): no resume reads it"


def skip_why(rel: str) -> str | None:
    name = os.path.basename(rel)
    return SKIP_WHY.get(name) or (SCRIPT_WHY if name.endswith(".py") else DOC_WHY if name.endswith(".md") else None)


def _skip(lay: Layout) -> Layout:
    """Never read, wherever they lie: a Trainer's training_args.bin (a pickled object, not state) and scripts."""
    skipped = tuple((r, why) for r in lay.files if (why := skip_why(r)))
    if not skipped:
        return lay
    gone = {r for r, _ in skipped}
    return replace(lay, files=tuple(r for r in lay.files if r not in gone), skipped=lay.skipped + skipped)


def select(where: str, rels: list[str], fetch: Fetch | None = None) -> Layout:
    """The layout of the checkpoint at `where`, whose members (relative paths) are `rels`, and the members of it a
    restore reads. `fetch` reads a small member (`latest`, an index) within its bound; without it, `where` is a
    directory on disk, read through confine. One line (CkptbenchError) when the layout's own files say something
    impossible or ambiguous."""
    rels, twins = _prefer_safetensors(rels)
    lay = _skip(_select(where, rels, fetch))
    return replace(lay, skipped=lay.skipped + twins) if twins else lay


BIN_TWIN_WHY = "the weights again, as torch.save; their safetensors copy is read instead, as transformers does"


def _prefer_safetensors(rels: list[str]) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    """A Hugging Face directory that ships its weights both as safetensors and as pytorch_model*.bin (many do):
    transformers loads the safetensors and never opens the .bin, so a restore that read both would read the
    weights twice. Returns the members without the .bin weights (and their index), and those, with why."""
    top = {r for r in rels if "/" not in r}
    if ST_INDEX not in top and not any(_ST_SHARD.match(r) for r in top):
        return rels, ()
    twins = {r for r in top if _HF_SHARD.match(r) or r == HF_INDEX}
    if not twins:
        return rels, ()
    return [r for r in rels if r not in twins], tuple((r, BIN_TWIN_WHY) for r in sorted(twins))


def iterations(rels: list[str]) -> set[str]:
    """Top-level Megatron iteration directories: iter_NNNNNNN or release, holding rank directories or DCP."""
    out = set()
    for r in rels:
        parts = r.split("/")
        if _ITER_DIR.match(parts[0]) and (len(parts) == 3 and MP_DIR.match(parts[1]) and r.endswith(".pt")
                                          or len(parts) == 2 and parts[1] == ".metadata"):
            out.add(parts[0])
    return out


def fsdp_dirs(rels: list[str]) -> tuple[str, ...]:
    """The sub-folders of FSDP's sharded state dict (Accelerate's pytorch_model_fsdp_N and, beside one, optimizer_N),
    each a DCP checkpoint: () where no pytorch_model_fsdp_N holds a .metadata."""
    dcp = {r.split("/")[0] for r in rels if r.count("/") == 1 and r.endswith("/.metadata")}
    models = {d for d in dcp if FSDP_MODEL_DIR.match(d)}
    return tuple(sorted(models | {d for d in dcp if FSDP_OPTIM_DIR.match(d)})) if models else ()


def is_one_checkpoint(rels: list[str]) -> bool:
    """Sub-folders that are parts of one checkpoint, not checkpoints of their own: DeepSpeed's step folders under
    `latest`, Megatron's model-parallel rank folders, FSDP's sharded model and optimizer folders."""
    top = {r for r in rels if "/" not in r}
    return bool(_step_dirs(rels)) or LATEST in top or any(
        MP_DIR.match(r.split("/")[0]) for r in rels if "/" in r) or bool(fsdp_dirs(rels))


def _select(where: str, rels: list[str], fetch: Fetch | None) -> Layout:
    top = {r for r in rels if "/" not in r}
    mp = tuple(r for r in rels if r.count("/") == 1 and MP_DIR.match(r.split("/")[0]) and r.endswith(".pt"))
    if mp:  # pointed at one Megatron iteration: a torch.save per model-parallel rank
        return Layout("megatron", tuple(rels), model_files=mp)
    steps = _step_dirs(rels)
    if steps or any(DS_MODEL.match(r) or DS_OPTIM.match(r) for r in top) or (
            LATEST in top and any("/" in r and r.endswith(TORCH_EXT) for r in rels)):
        return _deepspeed(where, rels, top, steps, fetch)
    if fsdp := fsdp_dirs(rels):
        return _fsdp(where, rels, top, fsdp)
    if is_trainer(top):
        return _hf_trainer(where, rels, top, fetch)
    if HF_INDEX in top or HF_SINGLE in top:
        return _hf_bin(where, rels, top, fetch)
    own = [(m.group(1), int(m.group(2)), r) for r in sorted(top) if (m := _OWN.match(r))]
    if own:
        return Layout("torch-shards", tuple(rels), ranks=tuple(sorted({k for _, k, _ in own})),
                      model_files=tuple(r for kind, _, r in own if kind == "model"),
                      optimizer_files=tuple(r for kind, _, r in own if kind == "optim"))
    if ST_INDEX in top:  # every shard the index names is there and inside, or the restore would be partial
        files, shards = _indexed(where, rels, ST_INDEX, _ST_SHARD, fetch)
        return _below(Layout("hf-safetensors", files, model_files=shards))
    if ".metadata" in top:  # Megatron's torch_dist keeps what is not sharded (iteration, args, scheduler) in common.pt
        return Layout("dcp", tuple(rels), state_files=(MEGATRON_COMMON,) if is_megatron_dist(top) else ())
    if any(r.endswith(".ckpt") for r in top):
        return Layout("lightning", tuple(rels))
    if any(_ST_SHARD.match(r) or r.startswith("adapter_model.") for r in top):
        _no_index(where, top)
        return Layout("hf-safetensors", tuple(rels))
    return Layout("files", tuple(rels))


_ST_PART = re.compile(r"^model-([0-9]+)-of-([0-9]+)\.safetensors$")


def _no_index(where: str, top: set[str]) -> None:
    """Shards of a sharded model with no index beside them must be all its shards, 1 to N as their names count
    them: with no index to name them, one shard of two restored as the whole model."""
    parts = {(int(m.group(1)), int(m.group(2))) for r in top if (m := _ST_PART.match(r))}
    counts = {n for _, n in parts}
    if not parts or len(counts) == 1 and {i for i, _ in parts} == set(range(1, max(counts) + 1)):
        return
    n = max(counts)
    gone = min(set(range(1, n + 1)) - {i for i, _ in parts}, default=None)
    what = (f"model-{gone:05d}-of-{n:05d}.safetensors is missing" if gone is not None and len(counts) == 1
            else f"the shards' names count {' and '.join(map(str, sorted(counts)))} shards")
    raise refuse(where, f"{what}, and no {ST_INDEX} says which weights the shards hold (from_pretrained loads no "
                 "sharded model without it)", "re-copy the checkpoint with every shard and its index")
