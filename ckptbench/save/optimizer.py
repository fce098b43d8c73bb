"""A foreign checkpoint's torch optimizer state (a training loop's `optimizer`, a Trainer's optimizer.pt, DCP's
`optimizer`), which loads into `extra` by flat key, moved under the weights' names so that `save` writes it.

torch keys its state by parameter index: index i is the i-th entry of param_groups' `params` lists, groups in order,
and restore's master_optimizer numbers the model's parameters the same way (enumerate over named_parameters). Here
that numbering is run backwards: by the param_names torch saved, else (weights from a pickle, which keeps the
model's order) one group by position against the model's floating tensors in order, several groups each in the
model's order where only one way fits; every state tensor's shape checked against its weight. A mapping that is
not certain is not made: the note says why."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ckptbench.checkpoint.formats import CheckpointState
from ckptbench.core.units import human_bytes

# a torch.save'd list is flattened to one key per entry (params.0, params.1); DCP keeps it whole (params)
_PARAM = re.compile(r"(?:(?P<prefix>.+)\.)?param_groups\.(?P<group>\d+)\.(?P<field>params|param_names)"
                    r"(?:\.(?P<i>\d+))?")


@dataclass
class Found:
    """One optimizer's state_dict as flat keys: its groups' parameter ids, and its state by id."""

    prefix: str  # "optimizer", "optimizer_states.0", "" for a file that is nothing but a state_dict
    groups: list[list[int | str]]  # param_groups' `params`: indices, or names where DCP saved them by name
    names: list[str | None]  # param_groups' `param_names` (torch >= 2.6 saves them), flattened like the ids
    state: dict[int | str, dict[str, torch.Tensor]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # the flat keys of its state tensors, as `extra` holds them

    @property
    def ids(self) -> list[int | str]:
        return [i for g in self.groups for i in g]

    @property
    def where(self) -> str:
        return f"{self.prefix}.state" if self.prefix else "state"

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for p in self.state.values() for t in p.values())


def find(extra: dict) -> list[Found]:
    """Every torch optimizer state_dict among a checkpoint's flat keys, found by its param_groups' params."""
    lists: dict[str, dict[tuple[str, int, int], object]] = {}
    for key, v in extra.items():
        m = _PARAM.fullmatch(key)
        if m is None or (m["i"] is None and not isinstance(v, (list, tuple))):
            continue
        entries = lists.setdefault(m["prefix"] or "", {})
        for i, item in ([(int(m["i"]), v)] if m["i"] is not None else enumerate(v)):
            entries[(m["field"], int(m["group"]), i)] = item
    out = []
    for prefix, entries in lists.items():
        ids = {k[1:]: v for k, v in entries.items() if k[0] == "params"}
        if not ids or not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in ids.values()):
            continue  # not a torch optimizer's params list
        groups: dict[int, list] = {}
        for (g, _), v in sorted(ids.items()):
            groups.setdefault(g, []).append(v)
        names = [entries.get(("param_names", g, i)) for g, i in sorted(ids)]
        f = Found(prefix, [groups[g] for g in sorted(groups)], [n if isinstance(n, str) else None for n in names])
        _collect_state(f, extra)
        out.append(f)
    return out


def _collect_state(f: Found, extra: dict) -> None:
    head = f.where + "."
    known = {str(i): i for i in f.ids}
    for key, v in extra.items():
        if not key.startswith(head) or not isinstance(v, torch.Tensor):
            continue
        sid, _, part = key[len(head):].rpartition(".")  # a DCP id is a dotted name; a part never has a dot
        if sid in known:
            f.state.setdefault(known[sid], {})[part] = v
            f.keys.append(key)


def _fits(parts: dict[str, torch.Tensor] | None, shape: torch.Size) -> bool:
    """Each state tensor shaped like the weight, but for scalars (AdamW's step); no state (never stepped) fits."""
    return parts is None or all(t.dim() == 0 or t.shape == shape for t in parts.values())


def _by_name(f: Found, model: dict) -> tuple[dict | None, str]:
    """Ids that are names (DCP's), or indices with the param_names torch saved beside them; (None, "") where there
    are no names to go by."""
    names = [i if isinstance(i, str) else n for i, n in zip(f.ids, f.names)]
    if any(n is None for n in names):
        return None, ""
    missing = [n for n in names if n not in model]
    if missing:
        return None, f"it names parameter {missing[0]!r}, which the model's weights do not hold"
    bad = [n for i, n in zip(f.ids, names) if not _fits(f.state.get(i), model[n].shape)]
    if bad:
        return None, f"its state for {bad[0]!r} is not shaped like that weight {tuple(model[bad[0]].shape)}"
    return dict(zip(f.ids, names)), "by the parameter names it saved"


def _in_order(f: Found, model: dict, floating: list[str]) -> tuple[dict | None, str]:
    """One group: its parameters are the model's, in order."""
    for k, (i, n) in enumerate(zip(f.ids, floating)):
        if not _fits(f.state.get(i), model[n].shape):
            shape = next(tuple(t.shape) for t in f.state[i].values() if t.dim())
            return None, (f"its parameter {k} ({f.where}.{i}, shape {shape}) does not line up with the model's "
                          f"tensor {k} ({n}, shape {tuple(model[n].shape)})")
    return dict(zip(f.ids, floating)), "by position in param_groups, against the model's tensors in order"


def _by_group(f: Found, model: dict, floating: list[str]) -> tuple[dict | None, str]:
    """Several groups, each a run of the model's parameters in its order (a Trainer's decay and no-decay groups,
    per-layer groups): each tensor goes to the one group whose next parameter fits it. Where two groups fit, both
    ways could be right (the groups' order need not be the model's), so there is no mapping: it would be a guess."""
    at = [0] * len(f.groups)
    out = {}
    for n in floating:
        shape = model[n].shape
        fit = [g for g, ids in enumerate(f.groups) if at[g] < len(ids) and _fits(f.state.get(ids[at[g]]), shape)]
        if len(fit) != 1:
            what = "none of" if not fit else f"{len(fit)} of"
            return None, (f"{what} its {len(f.groups)} param groups can take the model's tensor {n} (shape "
                          f"{tuple(shape)}) next, so which state belongs to which weight is not certain")
        g = fit[0]
        out[f.groups[g][at[g]]] = n
        at[g] += 1
    return out, f"group by group ({len(f.groups)} groups), each in the model's order, one way only"


def mapping(f: Found, model: dict, ordered: bool) -> tuple[dict | None, str]:
    """(id -> weight name, how it was matched), or (None, why no match is certain). `ordered`: the weights are in
    the model's order, as a pickled state dict keeps them (a safetensors file lists them by name)."""
    found, how = _by_name(f, model)
    if found is not None or any(isinstance(i, str) for i in f.ids):  # ids that are names have no order to go by
        return found, how
    if not ordered:  # same-shaped layers sorted by name (layers.10 before layers.2) would take each other's state
        return None, ("it keys its state by index and saved no parameter names, and the weights' files keep no "
                      "model order (safetensors lists them by name), so which state belongs to which weight is "
                      "not certain")
    floating = [n for n, t in model.items() if t.is_floating_point()]  # integer buffers are never parameters
    if len(f.ids) != len(floating):
        return None, (f"its param_groups list {len(f.ids)} parameter(s) and the model holds {len(floating)} "
                      "floating tensor(s), so its indices cannot be matched to names")
    return (_in_order if len(f.groups) == 1 else _by_group)(f, model, floating)


def _fold_step(state: CheckpointState, moved: dict[str, dict[str, torch.Tensor]]) -> str:
    """AdamW's per-parameter step, one scalar each and all equal after a plain loop, becomes the save's step (as
    ckptbench's own layout keeps it, and restore hands it back to every parameter); steps that differ stay."""
    steps = [p["step"] for p in moved.values() if "step" in p]
    if not steps or not all(t.numel() == 1 for t in steps):
        return ""
    values = {float(t.item()) for t in steps}
    v = values.pop() if len(values) == 1 else None
    if v is None or not v.is_integer() or v < 0 or state.step not in (0, int(v)):
        return "; their steps are not one count the save could keep once, so each is saved beside its moments"
    state.step = int(v)
    for p in moved.values():
        p.pop("step", None)
    return f"; their step ({int(v)}) is the save's step"


def adopt(state: CheckpointState, ordered: bool) -> tuple[list[str], set[str]]:
    """Moves every foreign optimizer's state from `extra` into `state.optim` where its ids map to weight names for
    certain (`ordered` as for `mapping`). Returns notes (what was kept and how, or what was left out and why) and
    the keys of the state left out (told in its own note, not again among the other tensors not saved)."""
    notes, left = [], set()
    for f in find(state.extra):
        if not f.state:
            continue
        names, how = mapping(f, state.model, ordered)
        taken = [n for n in (names or {}).values() if n in state.optim]
        if names is not None and taken:
            names, how = None, f"another optimizer's state is already kept for {taken[0]!r}"
        if names is None:
            notes.append(f"optimizer state {f.where}.* NOT saved ({len(f.keys)} tensor(s), "
                         f"{human_bytes(f.nbytes)}): {how}")
            left.update(f.keys)
            continue
        moved = {names[i]: dict(parts) for i, parts in f.state.items()}
        step = _fold_step(state, moved)
        state.optim.update(moved)
        for k in f.keys:
            del state.extra[k]
        notes.append(f"optimizer state {f.where}.* of {len(moved)} parameter(s) saved under their weights' names, "
                     f"matched {how}{step}")
    return notes, left
