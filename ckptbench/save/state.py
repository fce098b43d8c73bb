"""What `save` writes: the in-memory state of a profile (generated once, scaled like `gen --scale`) or of an
existing checkpoint directory (loaded with the restore's loaders), split over the ranks."""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptbench.core.errors import CkptbenchError, shown
from ckptbench.checkpoint.formats import CheckpointState
from ckptbench.checkpoint.detect import not_a_checkpoint
from ckptbench.checkpoint import layouts


@dataclass
class Loaded:
    state: CheckpointState
    assignment: list[list[str]]
    info: dict  # what the manifest of each save records about the model
    bytes: int  # tensor bytes: about what one save writes
    notes: list[str] = field(default_factory=list)


def _from_profile(name: str, scale: float) -> tuple[CheckpointState, dict]:
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import train_one_step

    p = profiles.load(name)
    p = p if scale == 1.0 else p.scaled(scale)
    if p.reference:
        raise CkptbenchError(f"profile {p.name} is a real-model shape for plan's arithmetic "
                             f"({p.total_bytes / 2**30:.0f} GiB); save a laptop-sized one (small, medium, large)")
    info = {"profile": p.name, "dims": vars(p.dims) | {}, "param_count": p.dims.param_count,
            "weights_dtype": p.weights_dtype, "optimizer_dtype": p.optimizer_dtype, "seed": 0}
    return train_one_step(p, seed=0), info


def checkpoint_of(directory: str, pick: str | None = None):
    """The listing of the one checkpoint a resume loads from `directory` (resume.choose: the largest step, the
    iteration a pointer names, `pick`), as run, inspect and load take it; one line when there is none to save."""
    from ckptbench.restore.resources import oom_precheck
    from ckptbench.sources.local import LocalSource

    listing = LocalSource(directory, checkpoint=True, pick=pick).list()
    if listing.format == "unknown":
        raise not_a_checkpoint(listing.source, listing.passed)
    oom_precheck(listing, "staged", "saving it", "save a smaller checkpoint, or a profile scaled to the size you need "
                 "(`save small TARGET --scale F`)")
    return listing


def _picked(lay) -> list[str]:
    """Which checkpoint of the folder is saved, and why, where the folder held more than one."""
    if lay is None or not lay.why:
        return []
    return [f"saved the state of {layouts.picked_name(lay.root, lay.tag)} ({lay.name}): "
            f"{layouts.picked_why(lay.root, lay.tag, lay.why)}"]


def _from_directory(listing, fmt_out: str) -> tuple[CheckpointState, dict, list[str], int]:
    """The checkpoint's state, what its manifest records, notes on what is not saved, and where optimizer state is
    left out (its indices matched no weight names for certain) the bytes of every tensor not saved, else 0."""
    from ckptbench.restore.load import load_state, main_dtype
    from ckptbench.save import carry, optimizer

    directory, man, fmt = listing.source, listing.manifest, listing.format
    state = load_state(directory, fmt, lay=listing.layout)  # the shards its layout names, in its order
    if not state.model:
        raise CkptbenchError(f"{directory}: no model weights found to save; point at a checkpoint with weights")
    mapped: list = []
    notes, left = optimizer.adopt(state, ordered=fmt == "torch", fmt=fmt, mapped=mapped)
    notes[:0] = _picked(listing.layout)
    if left and not state.step:  # a Trainer's checkpoint-6 was saved as step 0, and nothing said why
        notes.append("the saves' step (their manifest's `step`) is 0, not the source's: a foreign checkpoint's step "
                     "is its optimizer's, which is left out")
    dropped = [k for k, v in state.extra.items() if hasattr(v, "numel") and k not in left
               and carry.rng_value(k, v, fmt_out) is None]
    if dropped:
        # an RNG state among them is kept by the formats that hold tensors beside the trainer state
        rng = [k for k in dropped if carry.rng_value(k, state.extra[k], "torch") is not None]
        notes.append(f"{len(dropped)} tensor(s) outside model and optimizer (e.g. {(rng or dropped)[0][:80]}) are not "
                     "saved" + (f"; {len(rng)} of them RNG state, which --format torch or dcp keeps" if rng else ""))
    notes += carry.carry(state, mapped, left, fmt_out)  # a resume needs the hyper-parameters, scheduler, RNG too
    if man is not None and man.dims:
        info = {"profile": man.profile, "dims": dict(man.dims), "param_count": man.param_count,
                "weights_dtype": man.weights_dtype, "optimizer_dtype": man.optimizer_dtype, "seed": man.seed}
    else:
        dtype = main_dtype(state)
        moments = CheckpointState({f"{n}.{k}": t for n, p in state.optim.items() for k, t in p.items()})
        info = {"profile": "unknown", "dims": {}, "param_count": sum(t.numel() for t in state.model.values()),
                "weights_dtype": dtype, "optimizer_dtype": main_dtype(moments) if moments.model else dtype, "seed": 0}
    out = sum(_nbytes(state.extra[k]) for k in {*left, *dropped} if k in state.extra) if left else 0
    return state, info, notes, out


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _check_storable(state: CheckpointState, fmt: str, what: str) -> None:
    """Every tensor of a dtype and under a name the format can write and ckptbench read back, said before the first
    save starts: the write would fail midway, blamed on the target (safetensors has no complex128), or a save said ok
    would be a checkpoint no reader loads (a tensor named __metadata__ or holding a lone surrogate in safetensors'
    header; a DCP key longer than the metadata reader takes)."""
    if fmt == "dcp":
        _check_dcp_names(state, what)
    if fmt != "safetensors":
        return
    from ckptbench.checkpoint.formats.safetensors_format import _DTYPES

    can = set(_DTYPES.values())
    tensors = [*state.model.items(), *((f"{n}.{k}", t) for n, p in state.optim.items() for k, t in p.items())]
    odd = next(((n, t.dtype) for n, t in tensors if t.dtype not in can), None)
    if odd is not None:
        raise CkptbenchError(f"{what}: tensor {odd[0][:80]!r} is {str(odd[1]).removeprefix('torch.')}, which "
                             "safetensors cannot store; save it with --format torch or --format dcp")
    for n, _ in tensors:
        why = "is the name safetensors keeps its metadata under" if n == "__metadata__" else \
            "is not text (it holds a lone surrogate)" if not _is_text(n) else ""
        if why:
            raise CkptbenchError(f"{what}: tensor name '{shown(n)}' {why}, so a safetensors file cannot hold it; "
                                 "save it with --format torch or --format dcp")


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_dcp_names(state: CheckpointState, what: str) -> None:
    """DCP stores each value under its path joined by dots: one longer than the metadata reader takes (a source's
    200000-character name) saved 'ok' and every restore of it then refused its .metadata as crafted."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    from ckptbench.checkpoint.formats.dcp_metadata import MAX_NAME
    from ckptbench.save.write import dcp_state

    flat, _ = flatten_state_dict(dcp_state(state))
    long = next((k for k in flat if len(k) > MAX_NAME), None)
    if long is not None:
        raise CkptbenchError(f"{what}: '{shown(long)}' is {len(long)} characters as a DCP key, over the {MAX_NAME} "
                             "ckptbench reads back; save it with --format torch or --format safetensors")


def source_dir(what: str) -> str | None:
    """`what` as a checkpoint directory to save, or None for a profile: a bare profile name is the profile even where
    a directory of that name is in the working directory (`gen small small` makes one; `save small T` then saved that
    folder, not the profile); `./small` names the folder."""
    import os

    from ckptbench.checkpoint import profiles

    if not os.path.isdir(what):
        return None
    bare = os.sep not in what and (not os.altsep or os.altsep not in what)
    return None if bare and what in profiles.available() else what


def load_what(what: str, opts, scale: float = 1.0, listing=None) -> Loaded:
    """The state of a profile, or of the checkpoint `listing` (checkpoint_of) names where `what` is a directory."""
    from ckptbench.checkpoint.generate import assign_ranks
    from ckptbench.core.units import human_bytes

    notes: list[str] = []
    left_out = 0
    if source_dir(what) is not None:
        if scale != 1.0:
            raise CkptbenchError("--scale resizes a profile; a checkpoint directory is saved as it is: drop --scale")
        state, info, notes, left_out = _from_directory(listing if listing is not None else checkpoint_of(what),
                                                       opts.format)
    else:
        state, info = _from_profile(what, scale)
    stray = [n for n in state.optim if n not in state.model]
    if stray:
        notes.append(f"optimizer state of {len(stray)} name(s) with no weight (e.g. {stray[0][:80]}) is not saved")
    state.optim = {n: parts for n, parts in state.optim.items() if n in state.model}
    _check_storable(state, opts.format, what)
    info["format"] = opts.format
    info["step"] = state.step  # the state's own step (a foreign optimizer's, folded by adopt), as its files say it
    size = sum(_nbytes(t) for t in state.model.values()) + sum(_nbytes(t) for p in state.optim.values()
                                                                for t in p.values())
    if left_out:  # the figures are the writes': they must not pass for the checkpoint's
        notes.append(f"with the optimizer state left out, throughput, interval and floor are for the "
                     f"{human_bytes(size)} of tensors each save writes, not the checkpoint's "
                     f"{human_bytes(size + left_out)}")
    return Loaded(state, assign_ranks(state, opts.ranks), info, size, notes)
