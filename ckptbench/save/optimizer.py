"""A foreign checkpoint's torch optimizer state (a training loop's `optimizer`, a Trainer's optimizer.pt, DCP's
`optimizer`), which loads into `extra` by flat key, moved under the weights' names so that `save` writes it.

torch keys its state by parameter index: index i is the i-th entry of param_groups' `params` lists, groups in order,
and restore's master_optimizer numbers the model's parameters the same way (enumerate over named_parameters). Here
that numbering is run backwards: by the param_names torch saved, else (weights from a pickle, which keeps the
model's order) one group by position against the model's floating tensors in order, several groups each in the
model's order where only one way fits; every state tensor's shape checked against its weight, and any names it
saved held against the position's (a wrapper's prefix aside). A mapping that is not certain is not made: the note
says why. Everything here is the file's: ids, names and counts are checked before use, and each step costs one pass
over the keys."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ckptbench.checkpoint.formats import CheckpointState
from ckptbench.core.errors import shown
from ckptbench.core.units import human_bytes

_INDEX = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)  # as int() writes a list index: not "01", not 5000 digits
_HEADS = 64  # the `state` components of one key tried as an optimizer's: a key with more is crafted
_NOTES = 4  # optimizers told one by one; the rest in one line (a crafted file can hold thousands)


def _quoted(text: str, n: int = 80) -> str:
    """A name from the file, quoted for a note (repr escapes what a terminal would run), long ones cut."""
    return repr(text[:n]) + ("…" if len(text) > n else "")


@dataclass
class Found:
    """One optimizer's state_dict as flat keys: its groups' parameter ids, and its state by id."""

    prefix: str  # "optimizer", "optimizer_states.0", "" for a file that is nothing but a state_dict
    groups: list[list[int | str]]  # param_groups' `params`: indices, or names where DCP saved them by name
    names: list[str | None]  # param_groups' `param_names` (torch >= 2.6 saves them), flattened like the ids
    state: dict[int | str, dict[str, torch.Tensor]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # the flat keys of its state tensors, as `extra` holds them
    clash: str = ""  # why its state cannot be told apart from another optimizer's, where it cannot
    listed: int = 0  # parameters its param_groups list (groups stays empty where that is more than find's limit)

    @property
    def ids(self) -> list[int | str]:
        return [i for g in self.groups for i in g]

    @property
    def where(self) -> str:
        return f"{self.prefix}.state" if self.prefix else "state"

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for p in self.state.values() for t in p.values())


def _param_key(key: str) -> tuple[str, str, int, int | None] | None:
    """(prefix, field, group, index) of `<prefix>.param_groups.<g>.params[.<i>]` (or param_names): a torch.save'd
    list is flattened to one key per entry (params.0, params.1), DCP keeps it whole (params); None for other keys.
    By hand, not by regex: a crafted file can hold a million of them."""
    head, sep, tail = key.rpartition("param_groups.")
    if not sep or (head and (head == "." or head[-1] != ".")):
        return None
    parts = tail.split(".", 3)
    if len(parts) not in (2, 3) or parts[1] not in ("params", "param_names") or not _INDEX.fullmatch(parts[0]):
        return None
    if len(parts) == 3 and not _INDEX.fullmatch(parts[2]):
        return None
    return head[:-1], parts[1], int(parts[0]), int(parts[2]) if len(parts) == 3 else None


def find(extra: dict, limit: int | None = None) -> list[Found]:
    """Every torch optimizer state_dict among a checkpoint's flat keys, found by its param_groups' params: lists
    indexed 0, 1, 2... as torch.save and DCP write them, of indices or names. `limit`: the most parameters one
    could map (the model's tensors); one that lists more is not collected id by id (a crafted list of 10**6)."""
    lists: dict[str, dict[tuple[str, int, int], object]] = {}
    seen: dict[str, int] = {}  # parameters listed, by prefix
    for key, v in extra.items():
        m = _param_key(key) if "param_groups." in key else None
        if m is None:
            continue
        prefix, what, g, i = m
        if i is not None:
            items, n = ((i, v),), 1
        elif isinstance(v, (list, tuple)):
            items, n = enumerate(v), len(v)
        else:
            continue
        entries = lists.setdefault(prefix, {})
        if what == "params":
            seen[prefix] = seen.get(prefix, 0) + n
        if limit is not None and seen.get(prefix, 0) > limit:
            entries.clear()
            continue
        for i, item in items:
            entries[(what, g, i)] = item
    out = []
    for prefix, entries in lists.items():
        if limit is not None and seen.get(prefix, 0) > limit:
            out.append(Found(prefix, [], [], listed=seen[prefix]))
            continue
        ids = {k[1:]: v for k, v in entries.items() if k[0] == "params"}
        if not ids or not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in ids.values()):
            continue  # not a torch optimizer's params list
        groups: dict[int, list] = {}  # an empty group leaves no key: group numbers may skip, list indices may not
        for (g, i), v in sorted(ids.items()):
            if i != len(groups.setdefault(g, [])):
                break  # a dict of crafted indices, not a list
            groups[g].append(v)
        else:
            names = [entries.get(("param_names", g, i)) for g, i in sorted(ids)]
            out.append(Found(prefix, [groups[g] for g in sorted(groups)],
                             [n if isinstance(n, str) else None for n in names], listed=len(ids)))
    _collect_state(out, extra)
    return out


def _collect_state(found: list[Found], extra: dict) -> None:
    """Each state tensor (`<where>.<id>.<part>`) to the optimizer whose id it names (any id, for one that lists
    too many to map), in one pass over the keys; a key two optimizers could both claim (crafted nesting: an id that
    reads as another's `where`) goes to neither."""
    heads = {f.where: (f, {str(i): i for i in f.ids} if f.groups else None) for f in found}
    for key, v in extra.items():
        if not isinstance(v, torch.Tensor):
            continue
        owners = []
        for head, rest in _heads(key):
            if head in heads:
                f, known = heads[head]
                sid, _, part = rest.rpartition(".")  # a DCP id is a dotted name; a part never has a dot
                if known is None or sid in known:
                    owners.append((f, sid if known is None else known[sid], part))
        for f, i, part in owners:
            f.state.setdefault(i, {})[part] = v
            f.keys.append(key)
            if len(owners) > 1:
                f.clash = f"its state key {shown(key)} could be another optimizer's too: neither's for certain"


def _heads(key: str):
    """(`…state`, what follows its dot) for each `state` component of a flat key, the first _HEADS of them."""
    j, tried = key.find("state."), 0
    while j != -1 and tried < _HEADS:
        if j == 0 or key[j - 1] == ".":
            yield key[:j + 5], key[j + 6:]
            tried += 1
        j = key.find("state.", j + 1)


def _fits(parts: dict[str, torch.Tensor] | None, shape: torch.Size) -> bool:
    """Each state tensor shaped like the weight, but for scalars (AdamW's step); no state (never stepped) fits."""
    return parts is None or all(t.dim() == 0 or t.shape == shape for t in parts.values())


def _first_twice(items: list) -> object | None:
    seen = set()
    for x in items:
        if x in seen:
            return x
        seen.add(x)
    return None


def _by_name(f: Found, model: dict) -> tuple[dict | None, str]:
    """Ids that are names (DCP's), or indices with the param_names torch saved beside them; (None, "") where there
    are no names to go by."""
    names = [i if isinstance(i, str) else n for i, n in zip(f.ids, f.names)]
    if any(n is None for n in names):
        return None, ""
    twice = _first_twice(names)
    if twice is not None:
        return None, f"it names parameter {_quoted(twice)} more than once"
    missing = [n for n in names if n not in model]
    if missing:
        return None, f"it names parameter {_quoted(missing[0])}, which the model's weights do not hold"
    bad = [n for i, n in zip(f.ids, names) if not _fits(f.state.get(i), model[n].shape)]
    if bad:
        return None, (f"its state for {_quoted(bad[0])} is not shaped like that weight "
                      f"{tuple(model[bad[0]].shape)}")
    return dict(zip(f.ids, names)), "by the parameter names it saved"


def _disagrees(f: Found, found: dict) -> str:
    """Where the position's match contradicts the names it saved, why; "" where each saved name is its weight's,
    or is under one wrapper's prefix throughout (DDP's `module.`, torch.compile's `_orig_mod.`, on either side)."""
    wrap = None
    for i, saved in zip(f.ids, f.names):
        if saved is None:
            continue
        name = found[i]
        if saved == name:
            w = ("", "")
        elif saved.endswith("." + name):
            w = (saved[:-len(name)], "")
        elif name.endswith("." + saved):
            w = ("", name[:-len(saved)])
        else:
            w = None
        if w is None or wrap not in (None, w):
            return (f"its position gives the model's tensor {_quoted(name)} to the parameter it saved as "
                    f"{_quoted(saved)}")
        wrap = w
    return ""


def _in_order(f: Found, model: dict, floating: list[str]) -> tuple[dict | None, str]:
    """One group: its parameters are the model's, in order."""
    for k, (i, n) in enumerate(zip(f.ids, floating)):
        if not _fits(f.state.get(i), model[n].shape):
            shape = next(tuple(t.shape) for t in f.state[i].values() if t.dim())
            return None, (f"its parameter {k} ({shown(f.where)}.{shown(str(i))}, shape {shape}) does not line up "
                          f"with the model's tensor {k} ({shown(n)}, shape {tuple(model[n].shape)})")
    return dict(zip(f.ids, floating)), "by position in param_groups, against the model's tensors in order"


_NEVER = object()  # a parameter whose state holds two different shapes: it fits no weight


def _next_shape(parts: dict[str, torch.Tensor] | None):
    """The shape a parameter's weight must have, as _fits sees it: None for any (no state, scalars only)."""
    shapes = {tuple(t.shape) for t in (parts or {}).values() if t.dim()}
    return None if not shapes else shapes.pop() if len(shapes) == 1 else _NEVER


def _by_group(f: Found, model: dict, floating: list[str]) -> tuple[dict | None, str]:
    """Several groups, each a run of the model's parameters in its order (a Trainer's decay and no-decay groups,
    per-layer groups): each tensor goes to the one group whose next parameter fits it. Where two groups fit, both
    ways could be right (the groups' order need not be the model's), so there is no mapping: it would be a guess.
    The groups wait in buckets by the shape their next parameter needs, so each tensor costs one look-up."""
    at = [0] * len(f.groups)
    wild: set[int] = set()  # groups whose next parameter fits any shape
    by_shape: dict[object, set[int]] = {}

    def queue(g: int) -> None:
        if at[g] < len(f.groups[g]):
            want = _next_shape(f.state.get(f.groups[g][at[g]]))
            (wild if want is None else by_shape.setdefault(want, set())).add(g)

    for g in range(len(f.groups)):
        queue(g)
    out = {}
    for n in floating:
        shape = tuple(model[n].shape)
        bucket = by_shape.get(shape, set())
        fit = len(wild) + len(bucket)
        if fit != 1:
            what = "none of" if not fit else f"{fit} of"
            return None, (f"{what} its {len(f.groups)} param groups can take the model's tensor {shown(n)} (shape "
                          f"{shape}) next, so which state belongs to which weight is not certain")
        g = (wild or bucket).pop()
        out[f.groups[g][at[g]]] = n
        at[g] += 1
        queue(g)
    return out, f"group by group ({len(f.groups)} groups), each in the model's order, one way only"


# why a source's weights give no model order, by its format: the note names the source's real one
BY_NAME = {"safetensors": "safetensors lists them by name", "dcp": "DCP's metadata keys them by name"}


def mapping(f: Found, model: dict, ordered: bool, floating: list[str] | None = None,
            fmt: str = "safetensors") -> tuple[dict | None, str]:
    """(id -> weight name, how it was matched), or (None, why no match is certain). `ordered`: the weights are in
    the model's order, as a pickled state dict keeps them (a safetensors file lists them by name). `floating`:
    the model's floating tensors in order, where the caller has them already. `fmt`: the source's format, which
    the note names."""
    if f.listed > len(model):  # a name or a position each, never more
        return None, (f"its param_groups list {f.listed} parameter(s) and the model holds {len(model)} tensor(s), "
                      "so its indices cannot be matched to names")
    ids = f.ids
    twice = _first_twice(ids)
    if twice is not None:  # torch refuses a parameter in two places; one id, two weights: either could be wrong
        return None, (f"its param_groups list parameter {_quoted(str(twice))} more than once, so which state "
                      "belongs to which weight is not certain")
    named = [isinstance(i, str) for i in ids]
    if any(named) and not all(named):
        return None, "its param_groups mix indices and names, so which state belongs to which weight is not certain"
    found, how = _by_name(f, model)
    if found is not None or all(named):  # ids that are names have no order to go by
        return found, how
    if not ordered:  # same-shaped layers sorted by name (layers.10 before layers.2) would take each other's state
        by_name = BY_NAME.get(fmt, f"{fmt} lists them by name")
        return None, how or ("it keys its state by index and saved no parameter names, and the weights' files keep "
                             f"no model order ({by_name}), so which state belongs to which weight is not certain")
    if floating is None:
        floating = [n for n, t in model.items() if t.is_floating_point()]  # integer buffers are never parameters
    if len(ids) != len(floating):
        return None, how or (f"its param_groups list {len(ids)} parameter(s) and the model holds {len(floating)} "
                             "floating tensor(s), so its indices cannot be matched to names")
    found, by = (_in_order if len(f.groups) == 1 else _by_group)(f, model, floating)
    if found is None:
        return None, how or by
    contradiction = _disagrees(f, found)
    if contradiction:
        return None, (f"{how + '; ' if how else ''}{contradiction}, so which state belongs to which weight is not "
                      "certain")
    return found, by


def _count(t: torch.Tensor) -> int | None:
    """A step tensor's value as a whole count a save can keep (0 <= n < 2**63, as every reader takes it), exactly
    (an int64 past 2**53 is not rounded through a float); None for anything else (NaN, 1.5, a bool, complex)."""
    if t.numel() != 1 or t.is_complex() or t.dtype == torch.bool:
        return None
    v = t.item()
    if isinstance(v, float):
        if not v.is_integer():  # NaN and inf too
            return None
        v = int(v)
    return v if 0 <= v < 1 << 63 else None


def _fold_step(state: CheckpointState, moved: dict[str, dict[str, torch.Tensor]]) -> str:
    """AdamW's per-parameter step, one scalar each and all equal after a plain loop, becomes the save's step (as
    ckptbench's own layout keeps it, and restore hands it back to every parameter); steps that differ stay."""
    steps = [p["step"] for p in moved.values() if "step" in p]
    if not steps or not all(t.numel() == 1 for t in steps):
        return ""
    values = {_count(t) for t in steps}
    v = values.pop() if len(values) == 1 else None
    if v is None or state.step not in (0, v):
        return "; their steps are not one count the save could keep once, so each is saved beside its moments"
    state.step = v
    for p in moved.values():
        p.pop("step", None)
    return f"; their step ({v}) is the save's step"


def adopt(state: CheckpointState, ordered: bool, fmt: str = "safetensors",
          mapped: list | None = None) -> tuple[list[str], set[str]]:
    """Moves every foreign optimizer's state from `extra` into `state.optim` where its ids map to weight names for
    certain (`ordered` and `fmt`, the source's format, as for `mapping`). Returns notes (what was kept and how, or
    what was left out and why) and the keys of the state left out (told in its own note, not again among the other
    tensors not saved). `mapped` gets (Found, id -> weight name, or None where left out) of each optimizer found
    (save/carry.py takes the param_groups' hyper-parameters of those moved)."""
    notes, left = [], set()
    floating = [n for n, t in state.model.items() if t.is_floating_point()]  # integer buffers are never parameters
    more = {True: [0, 0, 0], False: [0, 0, 0]}  # saved or not, past the notes told one by one: count, tensors, bytes
    for f in find(state.extra, len(state.model)):
        if not f.state and not f.clash:
            continue
        names, how = (None, f.clash) if f.clash else mapping(f, state.model, ordered, floating, fmt)
        taken = [n for n in (names or {}).values() if n in state.optim]
        if names is not None and taken:
            names, how = None, f"another optimizer's state is already kept for {_quoted(taken[0])}"
        told = len(notes) < _NOTES
        if mapped is not None:
            mapped.append((f, names))
        if names is None:
            if told:
                notes.append(f"optimizer state {shown(f.where)}.* NOT saved ({len(f.keys)} tensor(s), "
                             f"{human_bytes(f.nbytes)}): {how}")
            left.update(f.keys)
        else:
            moved = {names[i]: dict(parts) for i, parts in f.state.items()}
            step = _fold_step(state, moved)
            state.optim.update(moved)
            for k in f.keys:
                del state.extra[k]
            if told:
                notes.append(f"optimizer state {shown(f.where)}.* of {len(moved)} parameter(s) saved under their "
                             f"weights' names, matched {how}{step}")
        if not told:
            tally = more[names is not None]
            tally[0] += 1
            tally[1] += len(f.keys)
            tally[2] += f.nbytes
    for saved, (count, tensors, nbytes) in more.items():
        if count:
            what = "saved under their weights' names" if saved else "NOT saved"
            notes.append(f"and {count} more optimizer state(s) {what} ({tensors} tensor(s), {human_bytes(nbytes)})")
    return notes, left
