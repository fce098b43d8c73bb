"""A foreign checkpoint's non-tensor state, carried into what `save` writes so that a resume from it is the same
training state: the param_groups' hyper-parameters of each optimizer moved under its weights' names (lr, betas,
weight_decay, eps, a scheduler's initial_lr) become `hparams`, and the other plain values (a scheduler's state_dict,
epoch, global_step, the RNG states a resume reseeds from) the `trainer` state. Only values the safe readers already
made (nothing is unpickled here) and only what JSON holds, tuples kept as tuples where the format written can
(safetensors' JSON cannot), and torch RNG states (uint8 vectors) where it keeps tensors beside them: raw bytes a
reader would not unpickle, other numpy arrays and other objects are named in one note."""

from __future__ import annotations

import torch

from ckptbench.checkpoint.formats.state import CheckpointState, RawBytes, json_plain, nest, rng_tensor
from ckptbench.core.errors import shown

_IDS = ("params", "param_names")  # a group's parameter ids and their names: the weights' names replace both


def _group_head(f) -> str:
    return f"{f.where[:-len('state')]}param_groups."


def _groups(state: CheckpointState, f, names: dict) -> list[dict]:
    """Each param group of `f` (its keys in `extra`), in order, with its hyper-parameters and `params` its weights'
    names (an id no name was found for kept as it was)."""
    head = _group_head(f)
    tuples = {k[len(head):] for k in state.tuples if k.startswith(head)}  # Adam's betas
    groups, _ = nest({k[len(head):]: v for k, v in state.extra.items() if k.startswith(head)}, tuples)
    if isinstance(groups, dict):  # group numbers that skip (an empty group leaves no params key)
        # ASCII digits only: '²'.isdigit() holds and int('²') raises, as does int() of 5000 digits
        groups = [groups[g] for g in sorted(groups, key=lambda g: int(g) if g.isascii() and g.isdigit()
                                            and len(g) <= 9 else -1)]
    out = []
    for g in groups:
        if not isinstance(g, dict):
            continue
        ids = g.get("params")
        ids = ids if isinstance(ids, list) else []
        out.append({k: v for k, v in g.items() if k not in _IDS} | {"params": [names.get(i, i) for i in ids]})
    return out


def _why_not(value) -> str:
    if isinstance(value, RawBytes):
        return "bytes the safe reader did not unpickle"
    return f"a {type(value).__module__.split('.')[0]}.{type(value).__name__}, not plain data" \
        if type(value).__module__ != "builtins" else f"a {type(value).__name__}, which JSON does not hold"


def _rng_key(key: str) -> bool:
    """A key a trainer keeps RNG state under: HF's rng_state.cpu, a loop's cpu_rng_state, Lightning's rng_states."""
    low = key.lower()
    return "rng" in low or "random" in low


def rng_value(key: str, value, fmt: str):
    """`value` as carried where it is part of an RNG state, else None: a torch RNG state as it is (safetensors keeps
    no tensor beside its JSON: left to the note on tensors not saved), numpy's key array as the list of numbers
    np.random.set_state also takes."""
    if not _rng_key(key):
        return None
    if rng_tensor(value):
        return value if fmt != "safetensors" else None
    # numeric (the reader checked), and not complex: JSON holds no complex number, which the note then called
    # 'nested too deep'
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 1 and value.dtype.kind in "biuf":
        return value.tolist()
    return None


def carry(state: CheckpointState, mapped: list, left: set[str], fmt: str) -> list[str]:
    """Fills `state.hparams` (the param groups of the optimizers `adopt` moved) and `state.trainer` (every other
    plain value of `extra`, and its RNG states, nested again) and takes them out of `extra`; returns the one note on
    what is not carried. `left`: the keys of optimizer state left out (told in their own note); `fmt`: the format
    written."""
    groups, taken, gone = [], set(), set()
    moved = [(f, names) for f, names in mapped if names is not None]
    for f, names in mapped:
        keys = {k for k in state.extra if k.startswith(_group_head(f)) or k.startswith(f.where + ".")}
        if names is None:  # left out: its hyper-parameters go with its state, which its own note names
            gone |= keys
            continue
        groups += [g | ({"optimizer": f.prefix} if len(moved) > 1 else {}) for g in _groups(state, f, names)]
        taken |= keys
    if groups:
        state.hparams = {"param_groups": groups}
    plain, odd = {}, []
    for key, value in state.extra.items():
        rng = None if key in left or key in gone else rng_value(key, value, fmt)
        if rng is not None:
            plain[key] = rng
            continue
        if isinstance(value, torch.Tensor) or key in left or key in gone:
            continue  # tensors outside model and optimizer, and the optimizers left out, have their own notes
        if key in taken:
            if key.startswith(tuple(f.where + "." for f, _ in moved)):
                odd.append((key, "optimizer state that is not a tensor"))
            continue
        if json_plain(value):
            plain[key] = value
        else:
            odd.append((key, _why_not(value)))
    trainer, clashes = nest(plain, state.tuples)
    odd += [(k, "it clashes with another key") for k in clashes]
    for k in [k for k, v in trainer.items() if not json_plain(v, rng=True)]:  # nested past what a reader takes back
        odd.append((k, "nested too deep"))
        del trainer[k]
    state.trainer = {**state.trainer, **trainer}
    state.extra = {k: v for k, v in state.extra.items() if k not in plain and k not in taken}
    if not odd:
        return []
    key, why = odd[0]
    return [f"{len(odd)} non-tensor value(s) NOT saved (e.g. {shown(key)}: {why}); the plain values beside them "
            f"(a scheduler's state, epoch, global_step) are, as the save's trainer state"]
