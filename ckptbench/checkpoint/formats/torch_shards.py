"""torch.save shards loaded together: keys two files disagree on are refused naming both, DeepSpeed partitions kept
apart, and a Hugging Face index's weight map checked against what the shards hold (torch_format loads each file)."""

from __future__ import annotations

import math
import os
import re

import torch

from ckptbench.checkpoint import layouts, pointers
from ckptbench.checkpoint.formats.state import RANK_TAG, CheckpointState, FormatError
from ckptbench.checkpoint.formats import torch_format, trainer_json
from ckptbench.checkpoint.quote import quote

_ZERO = re.compile(r"^(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_(optim|model)_states\.pt$")

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _same(a, b) -> bool:
    """Equal in type, shape and every bit (a NaN equals itself: the same bytes saved twice agree)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        if not both or (a.dtype, a.shape) != (b.dtype, b.shape):
            return False
        try:
            return torch.equal(_bits(a), _bits(b))
        except RuntimeError:  # a layout with no flat bytes (sparse): compare the values
            return bool(torch.equal(a, b))
    try:
        return type(a) is type(b) and (bool(a == b) or repr(a) == repr(b))
    except Exception:  # an odd leaf whose == raises or is not a truth value: compare what it prints as
        return repr(a) == repr(b)


def _entries(state: CheckpointState):
    for name, t in state.model.items():
        yield "model", name, t
    for name, parts in state.optim.items():
        for k, t in parts.items():
            yield "optimizer state", f"{name}.{k}", t
    for name, v in state.extra.items():
        yield "entry", name, v


def check_agree(seen: dict, one: CheckpointState, path: str) -> None:
    """A key another file already gave must carry the same value: two files that disagree are not one checkpoint."""
    for kind, name, v in _entries(one):
        first = seen.setdefault((kind, name), (path, v))
        if first[0] != path and not _same(first[1], v):
            raise FormatError(f"{path}: {kind} {name[:80]!r} is also in {first[0]}, with a different value; the two "
                              "files are not one checkpoint: point at one checkpoint's files")


def hf_index_of(directory: str, buffers: dict | None,
                index: str = pointers.HF_INDEX) -> tuple[str, dict[str, str]] | None:
    """The Hugging Face index beside the shards (`index`: the .bin weights' or the safetensors'): from the bytes
    already read where there are some, else the file."""
    where = os.path.join(directory, index)
    raw = buffers.get(where) if buffers is not None else None
    if raw is not None:
        return where, pointers.parse_hf_index(bytes(raw), where)
    if os.path.isfile(where) and not os.path.islink(where):
        return where, pointers.read_hf_index(directory, index)
    return None


def check_index(where: str, weight_map: dict[str, str], held: dict[str, set[str]]) -> None:
    """The index and its shards agree: each weight in the shard the index names, each named shard loaded and
    holding no weight the index places elsewhere."""
    directory = os.path.dirname(where)
    named = {os.path.normpath(os.path.join(directory, s)) for s in set(weight_map.values())}
    missing = sorted(named - set(held))
    if missing:
        raise FormatError(f"{where}: names shard {os.path.basename(missing[0])[:80]!r}, which was not loaded "
                          "(missing from the checkpoint); re-copy it with all its shards")
    for name, shard in weight_map.items():
        path = os.path.normpath(os.path.join(directory, shard))
        if name not in held[path]:
            found = [p for p, names in held.items() if name in names]
            where_else = f"only {os.path.basename(found[0])} holds it" if found else "no shard holds it"
            raise FormatError(f"{where}: maps {name[:80]!r} to {shard[:80]!r}, but {where_else}; the index and its "
                              "shards disagree: re-copy the checkpoint")
    for path in sorted(named):
        stray = sorted(n for n in held[path] if n not in weight_map)
        if stray:
            raise FormatError(f"{path}: holds {stray[0][:80]!r}, which {os.path.basename(where)} does not name; "
                              "the index and its shards disagree: re-copy the checkpoint")


def _load_one(path: str, buffers: dict | None) -> CheckpointState:
    """One file, from the bytes already read where there are some: a torch.save, or the one JSON state file a
    Trainer keeps beside its torch.save state (trainer_state.json), which comes with them wherever they are loaded."""
    mod = trainer_json if os.path.basename(path) == trainer_json.NAME else torch_format
    return mod.load_buffer(buffers[path], path) if buffers is not None and path in buffers else mod.load_file(path)


def _merged(paths: list[str], buffers: dict | None) -> tuple[CheckpointState, dict[str, set[str]]]:
    """The files' states merged, a key two of them give different values refused; and each file's weight names."""
    state, seen, held = CheckpointState({}), {}, {}
    for path in paths:
        one = _load_one(path, buffers)
        check_agree(seen, one, path)
        held[os.path.normpath(path)] = set(one.model)
        state.merge(one)
    return state, held


def load_state_files(paths: list[str], buffers: dict | None = None) -> CheckpointState:
    """The state files beside a checkpoint's weights (a Trainer's optimizer.pt, scheduler.pt, rng_state.pth and
    trainer_state.json; Megatron's common.pt), merged as shards are: they hold no weight an index places, so the
    folder's index is checked against its shards, never against these (it names shards they are not)."""
    return _merged(paths, buffers)[0]


def load_shards(paths: list[str], buffers: dict | None = None) -> CheckpointState:
    """Every file merged into one state, from `buffers` (path -> bytes already read) where given, checked across
    files: a key two files give different values is refused naming both, and a Hugging Face index's weight map
    must say which shard holds each weight."""
    state, held = _merged(paths, buffers)
    check_complete(paths, state)
    read = {os.path.normpath(p): b for p, b in buffers.items()} if buffers is not None else None
    for directory in sorted({os.path.dirname(p) for p in held}):
        index = hf_index_of(directory, read)
        if index is not None:
            check_index(*index, held)
    return state


def check_complete(paths: list[str], state: CheckpointState) -> None:
    """The rank files of one save are all there (DeepSpeed's ZeRO partitions, Megatron's model-parallel ranks), by
    the sizes `state` says they saved: a load's and, from the files' pickles alone, inspect's and check's."""
    _zero_complete(paths, state)
    _megatron_complete(paths, state)


def _as_saved(key: str) -> str:
    """A key as its rank file saved it, less the rank tag it is kept under; a key of another file (a
    trainer_state.json's {"dp_world_size": 9}, any state file's `args`) never reads as a rank file's own, whose
    sizes say which rank files a whole save has."""
    head, _, rest = key.partition(".")
    return rest if rest and RANK_TAG.fullmatch(head) else key


def _zero_complete(paths: list[str], state: CheckpointState) -> None:
    """DeepSpeed's ZeRO partitions of one step are its data-parallel ranks 0..N-1, N the dp_world_size it saved: a
    resume has each rank torch.load its own (a missing one is FileNotFoundError there), and zero_to_fp32 refuses a
    count that is not N. Loaded apart, a step short of a partition restored as whole."""
    groups: dict[tuple[str, str, str], set[int]] = {}
    for path in paths:
        if (m := _ZERO.match(os.path.basename(path))) is not None:
            groups.setdefault((os.path.dirname(path), m.group(2), m.group(3)), set()).add(int(m.group(1)))
    sizes = {v for k, v in state.extra.items() if _as_saved(k) == "dp_world_size" and type(v) is int}
    for (folder, mp, kind), ranks in sorted(groups.items()):
        world = next(iter(sizes)) if len(sizes) == 1 else max(ranks) + 1
        # the first absent rank, never range(world) whole: a file's dp_world_size of 10**9 is not 10**9 ranks' work
        missing = [r for r in range(min(world, len(ranks) + 1)) if r not in ranks][:1]
        if missing or max(ranks) >= world:
            what = f"rank {missing[0]}'s is missing" if missing else f"rank {max(ranks)}'s is beyond them"
            raise FormatError(f"{folder}: DeepSpeed saved {kind} states of mp_rank_{mp} for {world} data-parallel "
                              f"rank(s), but {what} ({len(ranks)} found); the step is not one whole save (a resume "
                              "and zero_to_fp32 fail on it): re-copy the step")


def _sizes_saved(state: CheckpointState, name: str, folder: str) -> int | None:
    """The `args.<name>` every rank file saved (each under its mp_rank_ tag, torch_format._mp_tag); None where none
    did. Ranks that saved two are two saves' files."""
    sizes = {v for k, v in state.extra.items() if _as_saved(k) == f"args.{name}"
             and layouts.MP_DIR.match(k.partition(".")[0]) and type(v) is int and v > 0}
    if len(sizes) > 1:
        raise FormatError(f"{folder}: its model-parallel ranks saved {name} {' and '.join(map(str, sorted(sizes)))}: "
                          "two saves' ranks in one iteration, not one whole save: re-copy the iteration")
    return next(iter(sizes), None)


def _one_iteration(state: CheckpointState, folder: str) -> None:
    """Every rank file of an iteration saved the same `iteration`: a rank copied in from another iteration is that
    iteration's slice, and a resume would train on weights from two steps."""
    saved = {v for k, v in state.extra.items() if type(v) is int and k.partition(".")[2] == "iteration"
             and layouts.MP_DIR.match(k.partition(".")[0])}
    if len(saved) > 1:
        which = " and ".join(map(str, sorted(saved)[:4]))
        raise FormatError(f"{folder}: its model-parallel ranks saved iteration {which}: ranks of two iterations in "
                          "one, not one whole save: re-copy the iteration")


def _mp_name(rank: tuple[int, ...]) -> str:
    return f"mp_rank_{rank[0]:02d}" + "".join(f"_{r:03d}" for r in rank[1:])


def _first_missing(ranks: set[tuple[int, ...]], sizes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The first rank of the grid `sizes` not in `ranks` (all inside it), walked in order and never built whole: the
    sizes are the files' own (a tensor_model_parallel_size of 10**9), and each step past one held is a held one."""
    if math.prod(sizes) <= len(ranks):
        return None
    rank = [0] * len(sizes)  # an odometer, the last rank fastest (itertools.product takes each range whole first)
    while tuple(rank) in ranks:
        for axis in reversed(range(len(sizes))):
            rank[axis] += 1
            if rank[axis] < sizes[axis]:
                break
            rank[axis] = 0
    return tuple(rank)


def _rank_axes(state: CheckpointState, folder: str, ranks: set[tuple[int, ...]]) -> tuple[tuple[str, int], ...]:
    """(axis, size) of each rank a folder name carries: the sizes the ranks' args saved, else one past the largest
    rank held. mp_rank_TT_XXX is the pipeline rank or the expert rank, whichever parallelism the args say ran."""
    saved = {axis: _sizes_saved(state, f"{axis}_model_parallel_size", folder)
             for axis in ("tensor", "pipeline", "expert")}
    width = len(next(iter(ranks)))
    pipeline, expert = saved["pipeline"], saved["expert"]
    # Megatron adds _PPP only when pipeline parallelism ran and _EEE only when expert parallelism did: folders with
    # another count of ranks are not its names for those sizes (a resume looks for rank files that are not there)
    if pipeline is not None and expert is not None and width != 1 + (pipeline > 1) + (expert > 1):
        named = "mp_rank_TT" + ("_PPP" if pipeline > 1 else "") + ("_EEE" if expert > 1 else "")
        raise FormatError(f"{folder}: its model-parallel ranks saved pipeline size {pipeline} and expert size "
                          f"{expert}, which Megatron names {named}, but its rank folders are named "
                          f"{_mp_name(min(ranks))}; the iteration is not one whole save (a resume fails on it): "
                          "re-copy the iteration")
    if width == 3:
        axes = ("tensor", "pipeline", "expert")
    elif width == 1:
        axes = ("tensor",)
    else:
        ran = [axis for axis in ("pipeline", "expert") if (saved[axis] or 1) > 1]
        axes = ("tensor", ran[0] if len(ran) == 1 else "pipeline or expert")
    return tuple((axis, saved.get(axis) or max(r[i] for r in ranks) + 1) for i, axis in enumerate(axes))


def _megatron_complete(paths: list[str], state: CheckpointState) -> None:
    """Megatron's model-parallel ranks of one iteration are mp_rank_TT (tensor-parallel rank TT), with _PPP under
    pipeline parallelism and _EEE under expert parallelism, for every rank below each size its args saved, each
    holding the same files: each rank of a resume loads its own, and a missing one fails there. Loaded apart (their
    slices kept under their tags), an iteration short of one restored as whole."""
    held: dict[str, dict[str, set[str]]] = {}  # iteration folder -> rank folder -> its files
    for path in paths:
        rank = os.path.dirname(path)
        if layouts.MP_DIR.match(os.path.basename(rank)) is not None:
            held.setdefault(os.path.dirname(rank), {}).setdefault(os.path.basename(rank), set()).add(
                os.path.basename(path))
    for folder, files in sorted(held.items()):
        ranks = {tuple(int(g) for g in layouts.MP_DIR.match(name).groups() if g is not None) for name in files}
        widths = sorted({len(r) for r in ranks})
        if len(widths) > 1:
            shapes = " and ".join(_mp_name(min(r for r in ranks if len(r) == n)) for n in widths)
            raise FormatError(f"{folder}: holds rank folders of different parallel layouts together ({shapes}): two "
                              "saves' ranks in one iteration, not one whole save: re-copy the iteration")
        _one_iteration(state, folder)
        axes = _rank_axes(state, folder, ranks)
        sizes = tuple(size for _, size in axes)
        beyond = sorted(r for r in ranks if any(x >= size for x, size in zip(r, sizes)))
        missing = _first_missing(ranks - set(beyond), sizes)
        if missing or beyond:
            what = f"{_mp_name(missing)} is missing" if missing else f"{_mp_name(beyond[0])} is beyond them"
            size = ", ".join(f"{axis}{'-parallel' if axis == 'tensor' else ''} size {n}" for axis, n in axes)
            raise FormatError(f"{folder}: Megatron saved model-parallel ranks for {size}, but {what} ({len(ranks)} "
                              "found); the iteration is not one whole save (a resume fails on it): re-copy the "
                              "iteration")
        every = set().union(*files.values())  # and the same files: distrib_optim.pt under the distributed optimizer
        for rank, names in sorted(files.items()):
            if names != every:
                raise FormatError(f"{folder}: {rank} holds no {quote(min(every - names))}, which other "
                                  "model-parallel ranks saved; the iteration is not one whole save (a resume fails "
                                  "on it): re-copy the iteration")
