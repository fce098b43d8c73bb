"""From checkpoint files (or bytes already read) to a model and optimizer that run: load and check."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ckptbench.checkpoint import confine, layouts
from ckptbench.checkpoint import resume
from ckptbench.checkpoint import tree
from ckptbench.checkpoint import manifest as mf
from ckptbench.core import jsontext
from ckptbench.core.errors import CkptbenchError
from ckptbench.core.paths import require_checkpoint_dir
from ckptbench.checkpoint.formats import OPTIM_KEYS, CheckpointState, FormatError, detect, module_for
from ckptbench.checkpoint.model import GPT, build_on_meta, check_dims, master_optimizer, sample_batch
from ckptbench.checkpoint.members import read_member

if TYPE_CHECKING:
    from ckptbench.checkpoint.verify import VerifyReport
from ckptbench.checkpoint.profiles import ModelDims
from ckptbench.core.units import human_bytes
from ckptbench.checkpoint.detect import not_a_checkpoint
from ckptbench.restore.resources import oom_precheck


@dataclass
class Restored:
    model: GPT | None
    optimizer: torch.optim.Optimizer | None
    master: dict[str, torch.Tensor]
    state: CheckpointState


@dataclass(frozen=True)
class CheckReport:
    ok: bool
    param_count: int
    dtypes: dict[str, str]
    finite_output: bool | None
    optimizer_step: bool | None
    problems: tuple[str, ...]
    structural_only: bool
    summary: str = ""  # what was checked, in one line


SHARD_EXT = layouts.SHARD_EXT  # the files that hold tensors, by format (declared with the layouts)


def shard_files(directory: str, fmt: str, lay: layouts.Layout | None = None) -> list[str]:
    """The files that hold tensors, for this format, in a stable order; only those of the checkpoint its layout
    names (resume.choose's pick, DeepSpeed's `latest` step, the shards an index names, never training_args.bin)."""
    if lay is None:
        lay = resume.choose(directory, tree.rels(directory))
        directory = os.path.join(directory, lay.root) if lay.root else directory
    return [os.path.join(directory, r) for r in lay.files if r.endswith(SHARD_EXT[fmt])]


def _state_files(directory: str, lay: layouts.Layout | None) -> list[str]:
    """A Trainer's (or Accelerate's) torch.save state files (optimizer.pt, scheduler.pt, rng_state*.pth, scaler.pt,
    optimizer.bin) beside safetensors weights, Megatron's common.pt beside DCP files, as the layout names them."""
    if lay is None:
        lay = layouts.select(directory, tree.rels(directory))
    return [os.path.join(directory, r) for r in lay.state_files]


def _index_agrees(directory: str, buffers: dict | None, held: dict[str, set[str]]) -> None:
    """A safetensors index and the shards loaded agree, as a .bin index and its shards are checked to."""
    from ckptbench.checkpoint.formats.torch_shards import check_index, hf_index_of

    read = {os.path.normpath(p): b for p, b in buffers.items()} if buffers is not None else None
    for d in sorted({os.path.dirname(p) for p in held}):
        index = hf_index_of(d, read, layouts.ST_INDEX)
        if index is not None:
            check_index(*index, held)


def dcp_roots(directory: str, lay: layouts.Layout | None) -> list[str]:
    """The folders holding a DCP checkpoint's .metadata: the checkpoint's own, or, for FSDP's sharded state dict in
    a Trainer's or Accelerate's folder, each of its model and optimizer folders (the layout's, else the tree's)."""
    dirs = lay.dcp_dirs if lay is not None else layouts.fsdp_dirs(tree.rels(directory)) \
        if os.path.isdir(directory) else ()
    return [os.path.join(directory, d) for d in dirs] or [directory]


def dcp_state(directory: str, lay: layouts.Layout | None, buffers: dict | None, load_root) -> CheckpointState:
    """A DCP checkpoint's state: each folder holding a .metadata (dcp_roots: its own, or FSDP's model and optimizer
    folders) loaded by `load_root(root, named, part)` (`named`: file name → bytes already read of that folder; `part`:
    whether other folders' states join it) and merged apart in order, as a resume gets them; one folder's state as
    it is. The whole-file load and the read by range (runner._from_pieces) both come through here."""
    roots = dcp_roots(directory, lay)
    state, before, keys = CheckpointState({}), [], set()
    for root in roots:
        named = {os.path.basename(p): b for p, b in (buffers or {}).items()
                 if b is not None and os.path.dirname(os.path.normpath(p)) == os.path.normpath(root)}
        one = load_root(root, named, len(roots) > 1)
        if len(roots) == 1:
            return one
        merge_apart(state, one, directory, os.path.basename(root), " or ".join(before))
        # the folders' own keys too, as saved: an optimizer byte entry named model.model.x kept its whole name while
        # the model's weight of that key lost DCP's `model.`, and the two passed as apart
        refuse_clash(keys, one.saved_keys, directory, os.path.basename(root), " or ".join(before))
        keys |= one.saved_keys
        before.append(os.path.basename(root))
    return state


def with_state_files(state: CheckpointState, directory: str, lay: layouts.Layout | None,
                     buffers: dict | None) -> CheckpointState:
    """`state` with the torch.save state files the layout names merged in (a Trainer's optimizer.pt, scheduler.pt,
    rng_state.pth; Megatron's common.pt beside DCP files), each read from `buffers` (path → bytes) where there."""
    files = _state_files(directory, lay)
    if files:
        from ckptbench.checkpoint.formats.torch_shards import load_state_files

        merge_apart(state, load_state_files(files, buffers), directory,
                     ", ".join(os.path.basename(f) for f in files[:3]), "its weights")
    return state


def _held(state: CheckpointState) -> set[str]:
    return {name for _, name, _ in state.tensors()} | set(state.extra)


def merge_apart(state: CheckpointState, other: CheckpointState, directory: str, what: str, where: str) -> None:
    """`other` merged into `state` when they share no name: merge lets the later win, so a common.pt holding a tensor
    under a weight's name was checked in its place (a NaN there failed a sound checkpoint, and a sound one passed
    a damaged weight), and a second pytorch_model_fsdp_N shadowed the first."""
    refuse_clash(_held(state), _held(other), directory, what, where)
    state.merge(other)


def refuse_clash(held: set[str], other: set[str], directory: str, what: str, where: str) -> None:
    """merge_apart's line, which inspect says too from the headers (it counted both copies where load refused)."""
    clash = held & other
    if clash:
        name = min(clash)
        raise FormatError(f"{directory}: {what} holds {name[:80]!r}, also in {where}; a resume takes one of "
                          f"the two, so which is restored is not known: the checkpoint is corrupt or crafted, or "
                          f"holds more than one checkpoint (point at one of its folders)")


def load_state(directory: str, fmt: str | None = None, buffers: dict[str, bytes] | None = None,
               shards: list[str] | None = None, lay: layouts.Layout | None = None) -> CheckpointState:
    """All shards merged into one state; from `buffers` (path → bytes already read) when given.

    `shards` names the shard paths when there is no directory to walk (an S3 prefix read into memory); `lay` the
    listing's layout (resume.choose, computed once), else it is chosen here from the directory. A Trainer's
    torch.save state beside safetensors weights is loaded too (into `extra`, under each file's stem). Files are
    opened one folder at a time from `directory` (confine.beneath): one swapped for a link since it was read is
    refused, not loaded as this checkpoint's."""
    with confine.beneath(directory):
        return _load_state(directory, fmt, buffers, shards, lay)


def _load_state(directory: str, fmt: str | None, buffers: dict[str, bytes] | None, shards: list[str] | None,
                lay: layouts.Layout | None) -> CheckpointState:
    fmt = fmt or detect(directory)
    mod = module_for(fmt)
    if fmt == "dcp":
        state = dcp_state(directory, lay, buffers, lambda root, named, _part: mod.load_dir(root, buffers=named or None))
        return with_state_files(state, directory, lay, buffers)
    if lay is None and shards is None:
        lay = resume.choose(directory, tree.rels(directory))
        directory = os.path.join(directory, lay.root) if lay.root else directory
    paths = shards if shards is not None else shard_files(directory, fmt, lay)
    if fmt == "torch":  # checked across files: keys two files disagree on, a Hugging Face index's weight map
        from ckptbench.checkpoint.formats.torch_shards import load_shards, load_state_files

        state = load_shards(paths, buffers)
        # a state file no torch extension names (Accelerate's custom_checkpoint_N.pkl, the state of an object given
        # to register_for_checkpointing; a Trainer's trainer_state.json): the shards are the files a torch
        # extension names
        more = [f for f in _state_files(directory, lay) if not f.endswith(SHARD_EXT["torch"])]
        if more:
            merge_apart(state, load_state_files(more, buffers), directory,
                        ", ".join(os.path.basename(f) for f in more[:3]),
                        "its weights")
    else:
        from ckptbench.checkpoint.formats.torch_shards import check_agree

        state, held, seen = CheckpointState({}), {}, {}
        for path in paths:
            one = mod.load_buffer(buffers[path], path) if buffers is not None and path in buffers else \
                mod.load_file(path)
            check_agree(seen, one, path)  # the merge lets the later shard win, as torch shards are checked
            held[os.path.normpath(path)] = {name for _, name, _ in one.tensors()}
            state.merge(one)
        if fmt == "safetensors":  # each weight where the index says: one it names and no shard holds is a weight
            _index_agrees(directory, buffers, held)  # from_pretrained would leave at its random init
        with_state_files(state, directory, lay, buffers)
    if not any(True for _ in state.tensors()):
        raise FormatError(f"{directory}: no tensors found in its {fmt} files")
    return state


def tail_names(directory: str, man: mf.Manifest | None, rels: list[str] | None = None) -> list[str]:
    """The small files a trainer reads on resume: config, tokenizer, scheduler, RNG, data-loader state."""
    if man is not None:
        return [e.path for e in man.files if e.kind == "small"] + [r for i in man.packs.values() for r in i]
    if rels is None:
        rels = tree.rels(directory)
    return [r for r in rels if r.endswith((".json", ".idx", ".txt", ".model")) and not r.endswith(".index.json")
            and os.path.basename(r) != mf.MANIFEST_NAME]


def load_tail(directory: str, man: mf.Manifest | None, reader=None, rels: list[str] | None = None) -> dict[str, bytes]:
    """The tail's bytes, from packs when packed; `reader(rel)` supplies bytes already in memory."""
    read = reader or (lambda rel: read_member(directory, man, rel))
    return {rel: read(rel) for rel in tail_names(directory, man, rels)}


NAMES_PER_LAYER, NAMES_OUTSIDE_LAYERS = 12, 5  # ckptbench's GPT's state_dict: 12 tensors a block, 5 around them


def dims_of(man: mf.Manifest | None, tail: dict[str, bytes]) -> ModelDims | None:
    """The model's shape: from the manifest, else from a GPT config.json; None when unknown."""
    if man is not None and man.dims:
        return ModelDims(**man.dims)
    raw = tail.get("config.json")
    if raw is None:
        return None
    try:
        # UTF-8 text without a byte order mark, as transformers reads a config.json (json.loads of bytes took a BOM
        # and UTF-16: a shape the training job's own load of the file fails on)
        c = jsontext.loads(raw)
        return ModelDims(c["n_layer"], c["n_embd"], c["n_head"], c["vocab_size"], c["n_positions"])
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: a config.json 200000 '[' deep
        return None


NOT_OURS = "config.json gives a model shape, but these weights are another model's, not the GPT `ckptbench gen` writes"
NO_STEP = "the check stage runs a model step only on that GPT, and checks these tensors without one"


def model_dims(man: mf.Manifest | None, tail: dict[str, bytes], names) -> tuple[ModelDims | None, str]:
    """The model the check stage runs a step of, or None and why not. The manifest's shape is ckptbench's own
    model's; a config.json's is only when the weights' `names` are those of ckptbench's GPT of that shape (shapes
    that then differ fail the load): a Hugging Face GPT-2 has the same config fields over other weights."""
    dims = dims_of(man, tail)
    if dims is None or (man is not None and man.dims):
        return dims, ""
    check_dims(dims)  # a shape out of a manifest's bounds is refused in one line, whatever the weights
    theirs = set(names)
    want = NAMES_PER_LAYER * dims.layers + NAMES_OUTSIDE_LAYERS
    if len(theirs) != want:  # not ours, told before any model is built: 4096 layers of the largest shape took 20 s
        # to build on meta only to compare names
        # a user with their own GPT-2 read "not ckptbench's GPT's" as a fault of their checkpoint: said as what the
        # check stage can and cannot do
        return None, (f"{NOT_OURS} ({len(theirs)} tensors, where its GPT of {dims.layers} layers has {want}): "
                      f"{NO_STEP}")
    ours = set(build_on_meta(dims, "float32").state_dict())
    if theirs == ours:
        return dims, ""
    alien = sorted(theirs - ours) or sorted(ours - theirs)
    return None, (f"{NOT_OURS} (e.g. {alien[0][:60]!r} {'is not one of its' if theirs - ours else 'is missing'}): "
                  f"{NO_STEP}")


def restore(state: CheckpointState, dims: ModelDims, weights_dtype: str) -> Restored:
    """The model built on the meta device takes the checkpoint's tensors (assign=True, no second copy)."""
    model = build_on_meta(dims, weights_dtype)
    try:
        model.load_state_dict(state.model, strict=True, assign=True)
    except RuntimeError as exc:
        raise FormatError(f"checkpoint does not fit the model: {str(exc).splitlines()[0][:200]}") from None
    optimizer, master = None, {}
    if state.optim:
        missing = [n for n in state.model if n not in state.optim or set(state.optim[n]) != set(OPTIM_KEYS)]
        if missing:
            raise FormatError(f"optimizer state lacks {len(missing)} parameter(s), e.g. {missing[0]!r}")
        master = {n: state.optim[n]["master"].requires_grad_(True) for n in state.model}
        optimizer, master, names = master_optimizer(model, master)
        step = torch.tensor(float(state.step))
        sd = optimizer.state_dict()
        sd["state"] = {i: {"step": step.clone(), "exp_avg": state.optim[n]["exp_avg"],
                           "exp_avg_sq": state.optim[n]["exp_avg_sq"]} for i, n in enumerate(names)}
        optimizer.load_state_dict(sd)
    return Restored(model, optimizer, master, state)


def check(restored: Restored, man: mf.Manifest | None, *, optimizer_step: bool = False) -> CheckReport:
    """Parameter count and dtypes against the manifest; one forward step gives finite output."""
    problems: list[str] = []
    model = restored.model
    params = dict(model.named_parameters())
    count = sum(p.numel() for p in params.values())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params.values()})
    if man is not None and man.dims:
        if count != man.param_count:
            problems.append(f"parameter count {count} != manifest {man.param_count}")
        if dtypes != [man.weights_dtype]:
            problems.append(f"weight dtypes {dtypes} != manifest {man.weights_dtype}")
        odt = {str(t.dtype).removeprefix("torch.") for parts in restored.state.optim.values() for t in parts.values()}
        if restored.state.optim and odt != {man.optimizer_dtype}:
            problems.append(f"optimizer dtypes {sorted(odt)} != manifest {man.optimizer_dtype}")
    if any(p.is_meta for p in params.values()):
        problems.append("some parameters were never loaded (still on the meta device)")
        return CheckReport(False, count, {"weights": ",".join(dtypes)}, None, None, tuple(problems), man is None)
    device = next(iter(params.values())).device
    with torch.no_grad():
        out = model(sample_batch(model.dims, device=str(device)))
    finite = bool(torch.isfinite(out).all())
    if not finite:
        problems.append("forward step gave non-finite output")
    stepped = None
    if optimizer_step and restored.optimizer is not None:
        stepped = _optimizer_step(restored)
        if not stepped:
            problems.append("optimizer step changed no master weight or produced non-finite values")
    return CheckReport(not problems, count, {"weights": ",".join(dtypes)}, finite, stepped, tuple(problems), False)


def _optimizer_step(r: Restored) -> bool:
    """Mixed precision: gradients of the bf16 model, applied to the fp32 masters."""
    model = r.model
    idx = sample_batch(model.dims)
    logits = model(idx)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), idx[:, 1:].reshape(-1))
    loss.backward()
    before = {n: m.detach().clone() for n, m in r.master.items()}
    for n, p in model.named_parameters():
        r.master[n].grad = p.grad.float() if p.grad is not None else None
    r.optimizer.step()
    moved = any(not torch.equal(before[n], m) for n, m in r.master.items())
    finite = all(bool(torch.isfinite(m).all()) for m in r.master.values())
    return moved and finite


def structural_check(state: CheckpointState, concurrency: int = 8,
                     known: dict[tuple[int, int], int] | None = None, optimizer_step: bool = False) -> CheckReport:
    """For a checkpoint with no model to run (no manifest or known config): every floating value finite,
    optimizer parts shaped like their weights. Says so in its summary: no model step was run. `known`: what an
    EarlyScan already counted during the read."""
    from ckptbench.restore.scan import nonfinite

    floating, nbytes, found, early = nonfinite(((n, t) for _, n, t in state.tensors()), concurrency, known)
    kinds = {n: value_kind(g, n, t) for g, n, t in state.tensors() if n in found}
    bad = {n: c for n, c in found.items() if kinds[n] != BOOKKEEPING}
    normal = sorted(n for n in found if kinds[n] == BOOKKEEPING)
    problems = [f"{name}: {n} non-finite value(s) in {kinds[name]}" for name, n in sorted(bad.items())[:20]]
    if len(bad) > 20:
        problems.append(f"... and {len(bad) - 20} more tensor(s) with non-finite values")
    for name, parts in state.optim.items():
        w = state.model.get(name)
        for k, t in parts.items():
            if w is not None and t.shape != w.shape:
                problems.append(f"{name}.{k}: shape {tuple(t.shape)} != weight {tuple(w.shape)}")
    problems += foreign_moment_shapes(state)
    count = sum(t.numel() for t in state.model.values())
    during = f" ({early} of them during the read)" if early else ""
    kept = (f"; {len(normal)} bookkeeping value(s) hold NaN/Inf on purpose, as their library saves them (e.g. "
            f"{_tail(normal[0])}): normal, not corruption" if normal else "")
    # a weights-only file has no moments to speak of (a foreign optimizer's are in `extra`, named as such)
    moments = any(value_kind(g, n, t) == MOMENTS for g, n, t in state.tensors() if t.is_floating_point())
    where = "weights or optimizer moments" if moments else "weights"
    if not floating:
        summary = "structural check, no model step: no floating tensors, so nothing was scanned for NaN/Inf"
    else:
        tensors = f"{floating} floating tensor{'' if floating == 1 else 's'}"
        summary = (f"structural check, no model step: {tensors} ({human_bytes(nbytes)}) scanned natively for "
                   f"NaN/Inf{during}, "
                   f"{f'none found in {where}' if not bad else f'{len(bad)} with non-finite values'}{kept}")
    if optimizer_step:  # asked for, and no model to step: said, not left to the reader of "no model step"
        summary += f"; {NO_OPTIMIZER_STEP}"
    return CheckReport(not problems, count, {"weights": main_dtype(state)}, None, None, tuple(problems), True,
                       summary)


NO_OPTIMIZER_STEP = ("--optimizer-step not run: this check has no model to step (that takes one process and "
                     "ckptbench's manifest or a config.json of its GPT)")
WEIGHTS, MOMENTS, BOOKKEEPING = "weights", "optimizer moments", "bookkeeping"
FQN_STATE = "optimizer.state."  # a foreign optimizer keyed by parameter name (FSDP's and DCP's, torchtitan's)
# the per-parameter parts torch.optim keeps in the parameter's own shape (Adam/AdamW/Lion, SGD, RMSprop, Adagrad,
# Adadelta, NAdam/RAdam, ASGD): only these are held to it. Others are not that shape by design: Adafactor's row_var
# and col_var (transformers': exp_avg_sq_row/_col) factor it, bitsandbytes' qmap/absmax quantize it
MIRRORED_PARTS = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "grad_avg",
                            "sum", "acc_delta", "mu_product", "ax", "prev"})


def foreign_moment_shapes(state: CheckpointState) -> list[str]:
    """A foreign optimizer's moments (optimizer.state.<weight's name>.<part>, in `extra`) whose weight the state
    holds under that name and whose shape is not the weight's: an optimizer_0 of another model beside FSDP's model
    folder was restored 'ok'. Moments keyed by index (optimizer.state.0.exp_avg) name no weight, and parts not in
    the weight's shape by design (MIRRORED_PARTS says which are), are not held."""
    problems = []
    for name, t in state.extra.items():
        if not name.startswith(FQN_STATE) or not isinstance(t, torch.Tensor) or t.numel() <= 1:
            continue
        weight, _, part = name[len(FQN_STATE):].rpartition(".")
        if part not in MIRRORED_PARTS:
            continue
        w = state.model.get(weight)
        if isinstance(w, torch.Tensor) and t.shape != w.shape:
            problems.append(f"{name[:120]}: shape {tuple(t.shape)} != weight {tuple(w.shape)}")
    return problems[:20]


def _tail(name: str, n: int = 80) -> str:
    """A long flat key with its bracketed state names folded (callbacks.ModelCheckpoint{…}.kth_value), and by its
    end where it is still long, where it says what it is."""
    name = re.sub(r"\{[^{}]*\}", "{…}", name)
    return name if len(name) <= n else "…" + name[-n:]


def value_kind(group: str, name: str, t: torch.Tensor) -> str:
    """Where NaN/Inf means corruption (a model weight, an optimizer moment) and where a library puts it on purpose:
    a scalar outside the weights (Lightning's ModelCheckpoint kth_value/best_model_score = ±inf, a loss scaler's or
    an optimizer's inf sentinel, a scheduler's last value) and anything that is neither weights nor optimizer."""
    if group == "model":
        return WEIGHTS
    if group == "optimizer" and t.numel() > 1:
        return MOMENTS
    return BOOKKEEPING


def require_dir(directory: str) -> None:
    require_checkpoint_dir(directory)


def main_dtype(state: CheckpointState) -> str:
    counts: dict[torch.dtype, int] = {}
    for t in state.model.values():
        counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    return str(max(counts, key=counts.get)).removeprefix("torch.") if counts else "float32"


@dataclass(frozen=True)
class RestoreOutcome:
    format: str
    verify: VerifyReport | None
    check: CheckReport
    tail_files: int
    tail_bytes: int
    layout: layouts.Layout | None = None
    source: str = ""  # the checkpoint restored (below the directory given, where it held several)


def restore_dir(directory: str, *, verify: bool = True, optimizer_step: bool = False,
                concurrency: int = 8, pick: str | None = None) -> RestoreOutcome:
    """Verify, load the tail and the shards, restore into model and optimizer, check — untimed building blocks, on
    the checkpoint a resume loads (resume.choose, as `run` picks it). Its files are opened below `directory`, no
    folder followed (confine.beneath)."""
    with confine.beneath(directory):
        return _restore_dir(directory, verify=verify, optimizer_step=optimizer_step, concurrency=concurrency,
                            pick=pick)


def _restore_dir(directory: str, *, verify: bool, optimizer_step: bool, concurrency: int,
                 pick: str | None) -> RestoreOutcome:
    from ckptbench.sources.local import LocalSource
    from ckptbench.checkpoint.verify import verify as verify_dir

    require_dir(directory)
    listing = LocalSource(directory, checkpoint=True, pick=pick).list()
    directory, man, lay = listing.source, listing.manifest, listing.layout
    if listing.format == "unknown":
        raise not_a_checkpoint(directory, listing.passed)
    oom_precheck(listing, "staged", "loading it", "load a smaller checkpoint, or restore it per rank under torchrun")
    fmt = listing.format
    ver = verify_dir(listing, concurrency=concurrency) if verify else None
    if ver is not None and ver.has_reference and not ver.ok:
        rel, what = ver.problems[0]
        raise CkptbenchError(f"{directory}: {len(ver.problems)} file(s) do not match the manifest, first "
                             f"{rel}: {what}; regenerate or re-copy the checkpoint")
    tail = load_tail(directory, man, rels=listing.rels)
    state = load_state(directory, fmt, shards=[f.path for f in listing.files if f.path.endswith(SHARD_EXT[fmt])],
                       lay=lay)
    dims, _ = model_dims(man, tail, state.model)
    if dims is None:
        report = structural_check(state, concurrency, optimizer_step=optimizer_step)
    else:
        dtype = man.weights_dtype if man is not None and man.weights_dtype else main_dtype(state)
        report = check(restore(state, dims, dtype), man, optimizer_step=optimizer_step)
    return RestoreOutcome(fmt, ver, report, len(tail), sum(len(b) for b in tail.values()), lay, directory)
