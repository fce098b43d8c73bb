"""Which one checkpoint a resume loads from a folder that holds several, or a final model beside numbered ones.

One rule per container, applied level by level until one checkpoint remains, then layouts.select names its files:
- Megatron-LM: the iteration latest_checkpointed_iteration.txt names (else the only one);
- numbered folders (torchtitan's step-N, a Trainer's checkpoint-N, ckptbench save's step-NNNNNN): the largest N,
  as torchtitan's resume and Trainer's resume_from_checkpoint=True pick it, even beside a final model
  (trainer.save_model() at the top), which is then not read; a largest N that holds no checkpoint files, or is a
  symlink, is one line (the library would pick it, ckptbench cannot restore it);
- DCP checkpoints under other names, and Lightning .ckpt files (each a whole checkpoint): last.ckpt, else the only
  one, else ambiguous;
- a folder whose checkpoint files all lie in one sub-folder (torchtitan's dump folder above checkpoint/,
  lightning_logs/version_0/checkpoints): that sub-folder; several such sub-folders (version_0, version_1) are
  several checkpoints: ambiguous.
Nothing is merged across checkpoints: where the rule cannot choose it is one line naming the candidates, and
`pick` (a sub-folder, a .ckpt file, or "." for the files at the top) chooses. Computed once per listing; every
command takes the Layout it returns. Every path it names is relative to the folder it was given.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import replace

from ckptbench.checkpoint import confine, layouts, pointers
from ckptbench.checkpoint.layouts import Layout
from ckptbench.checkpoint.pointers import Fetch
from ckptbench.checkpoint.quote import quote
from ckptbench.core.errors import CkptbenchError

WEIGHT_EXT = (".safetensors", ".distcp", ".metadata", *layouts.TORCH_EXT)
# ASCII digits only: `\d` takes any Unicode digit, and step-١٠ is nobody's step 10
_NUMBERED = re.compile(r"^(?:step|checkpoint)-([0-9]+)$", re.ASCII)
LIGHTNING_LAST = "last.ckpt"
MAX_LEVELS = 8  # containers nested deeper than any trainer writes them
ONLY = "the only folder holding checkpoint files"
# a top-level file that makes several sub-folders one checkpoint (a diffusers pipeline's components)
BINDERS = ("model_index.json",)


def _top(rels: list[str]) -> set[str]:
    return {r for r in rels if "/" not in r}


def _listed(names) -> str:
    """Names as --pick takes them; one with a control character quoted, escapes shown: printed bare, a folder
    named "b\\nckptbench: error: …" read as a second error, and "c\\x1b[31mred" as "cred", which --pick cannot
    find."""
    names = sorted(names)
    shown = [n if n.isprintable() else quote(n, 80) for n in names[:4]]
    return ", ".join(shown) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")


class _Ambiguous(CkptbenchError):
    """Several checkpoints where the rule cannot choose: one line naming them and how to pick one. `under` is the
    path from the folder the user named down to `where`, which --pick takes its names below."""

    def __init__(self, where: str, what: str, candidates, files: bool = False, under: str = ""):
        self.parts = (where, what, tuple(candidates), files)
        name = f"{under}/NAME" if under else "NAME"
        # a .ckpt file cannot be pointed at (a command takes a folder): --pick alone chooses it
        how = f"--pick {name} (a .ckpt file)" if files else f"--pick {name} or point at it"
        super().__init__(f"{where}: {what} ({_listed(candidates)}) and nothing saying which a resume loads; "
                         f"choose one with {how}")

    def below(self, under: str) -> _Ambiguous:
        return _Ambiguous(*self.parts, under=under)


def _ambiguous(where: str, what: str, candidates, files: bool = False) -> CkptbenchError:
    return _Ambiguous(where, what, candidates, files)


def _holding(rels: list[str]) -> set[str]:
    """Top-level directories that hold checkpoint files (at any depth below them)."""
    return {r.split("/", 1)[0] for r in rels if "/" in r and r.endswith(WEIGHT_EXT)}


def _numbered(where: str, names) -> dict[int, str]:
    """step-N / checkpoint-N among `names`, by N; two spellings of one N are ambiguous."""
    out: dict[int, str] = {}
    for d in sorted(names):
        m = _NUMBERED.match(d)
        if m is None:
            continue
        n = int(m.group(1))
        if n in out:
            raise _ambiguous(where, f"two folders number checkpoint {n}", (out[n], d))
        out[n] = d
    return out


def _candidates(rels: list[str]) -> list[str]:
    """What --pick can name at the top of a folder: its sub-folders that hold checkpoint files, its .ckpt files, and
    "." when it holds checkpoint files itself."""
    top = _top(rels)
    return sorted(_holding(rels)) + sorted(r for r in top if r.endswith(".ckpt")) + (
        ["."] if any(r.endswith(WEIGHT_EXT) and not r.endswith(".ckpt") for r in top) else [])


def _level(where: str, rels: list[str], fetch: Fetch | None, odd: dict[str, str]
           ) -> tuple[str, str, tuple] | None:
    """(sub-folder to descend into, why, ((other candidate, why not), ...)) at this level, or None when `rels` is one
    checkpoint. `odd`: sub-folders at this level the listing could not use (a symlink, an empty folder), by name,
    with what they are. Raises one line where the choice is ambiguous or the one a library takes cannot be read."""
    top = _top(rels)
    layouts.fsdp_unreadable(where, rels, odd)
    iters = layouts.iterations(rels)
    if iters and not any(layouts.MP_DIR.match(r.split("/")[0]) for r in rels if "/" in r):
        tag = pointers.megatron_iteration(where, rels, top, iters, fetch)
        why = (f"the iteration {pointers.MEGATRON_LATEST} names" if pointers.MEGATRON_LATEST in top
               else "the only iteration")
        return tag, why, tuple((d, f"another iteration: {why} is {tag}") for d in sorted(iters - {tag}))
    holding = _holding(rels)
    folders = {r.split("/", 1)[0] for r in rels if "/" in r} | set(odd)
    numbered = _numbered(where, folders)
    # DCP writes .metadata last: a step-N with shards and no .metadata is a save cut short or still being written,
    # and torchtitan's resume (_find_load_step counts a step-N only with its .metadata) takes the step before it
    unfinished = {n: d for n, d in numbered.items() if d.startswith("step-") and f"{d}/.metadata" not in rels
                  and any(r.startswith(f"{d}/") and r.endswith(".distcp") for r in rels)}
    numbered = {n: d for n, d in numbered.items() if n not in unfinished}
    usable = {n: d for n, d in numbered.items() if d in holding}
    if usable:
        n = max(numbered)
        if n not in usable:  # the library takes the largest N and would fail on it: so does the restore, saying why
            d = numbered[n]
            what = odd.get(d) or "holds no checkpoint files (a save cut short?)"
            raise CkptbenchError(f"{os.path.join(where, d)}: the newest checkpoint, which a resume picks, {what}; "
                                 f"--pick {usable[max(usable)]} restores the newest complete one, or remove or "
                                 "finish that folder")
        tag = usable[n]
        who = ("as Trainer's resume_from_checkpoint=True picks it (get_last_checkpoint)" if tag.startswith("checkpoint")
               else "as torchtitan's resume (load_step -1) and ckptbench save pick it")
        why = f"the highest {tag.split('-')[0]}-N of {len(usable)}, {who}"
        passed = [(usable[k], f"an older checkpoint: a resume takes {tag}") for k in sorted(usable) if k != n]
        passed += [(d, f"DCP shards without their .metadata (a save cut short or still being written): torchtitan's "
                       f"resume skips it and takes {tag}") for d in unfinished.values()]
        passed += [(d, f"not numbered as step-N or checkpoint-N (ASCII digits), so no candidate: a resume takes {tag}")
                   for d in sorted(holding - set(usable.values()) - set(unfinished.values()))]
        finals = sorted(r for r in top if r.endswith(WEIGHT_EXT) and not layouts.skip_why(r))
        if finals:
            why += "; the final model at the top is not read (--pick . restores it)"
        passed += [(r, f"the final model (trainer.save_model), not the state a resume loads from {tag}"
                    if r in finals else f"beside the checkpoints, not part of {tag}") for r in sorted(top)]
        return tag, why, tuple(passed)
    if any(r.endswith(WEIGHT_EXT) for r in top):
        rivals = _checkpoints_below(where, rels, holding, fetch) if holding and not layouts.is_one_checkpoint(
            rels) and not top & set(BINDERS) and _loose(where, top, fetch) else []
        if rivals:
            # loose weight files beside folders of checkpoints: restored as one, they were read together and the
            # format taken from a sub-folder's (a new user's extra.pt beside dcp/ restored as one "dcp" checkpoint)
            loose = [r for r in top if r.endswith(WEIGHT_EXT)]
            raise _ambiguous(where, f"{_kind(loose)} at the top ({_listed(loose)}) beside {len(rivals)} "
                                    f"folder{'s' if len(rivals) > 1 else ''} of checkpoints: {len(rivals) + 1} "
                                    "candidates", rivals + ["."])
        return None  # a checkpoint at the top; its own layout says which of its files are read
    dcp = {r.split("/")[0] for r in rels if r.count("/") == 1 and r.endswith("/.metadata")}
    if len(dcp) > 1:
        raise _ambiguous(where, f"{len(dcp)} DCP checkpoints", dcp)
    if len(holding) == 1 and not layouts.is_one_checkpoint(rels):
        (tag,) = holding
        return tag, ONLY, tuple((r, f"beside {tag}, not part of the checkpoint") for r in sorted(top))
    if len(holding) > 1 and not layouts.is_one_checkpoint(rels) and not top & set(BINDERS):
        # lightning_logs/version_0 and version_1, two runs side by side: two checkpoints, never one
        raise _ambiguous(where, f"{len(holding)} folders of checkpoints", holding)
    return None


def _kind(files: list[str]) -> str:
    """What loose files at the top are: a Trainer's state files (scheduler.pt, rng_state_N.pth) are no weights."""
    state = sum(bool(layouts.TRAINER_STATE.match(r)) for r in files)
    return "state files" if state == len(files) else "weight files" if not state else "weight and state files"


def _loose(where: str, top: set[str], fetch: Fetch | None) -> bool:
    """Whether the files at the top form no checkpoint layout of their own (no index, no trainer's or library's
    names: plain files), so that folders of checkpoints beside them are candidates, not parts of the model (a
    Hugging Face repository's original/ beside its indexed shards is not read, and not a rival)."""
    try:
        return layouts.select(where, sorted(top), fetch).name == "files"
    except CkptbenchError:  # the top's own files claim a layout and say something impossible: that layout's line
        return False


def _checkpoints_below(where: str, rels: list[str], holding: set[str], fetch: Fetch | None) -> list[str]:
    """The sub-folders among `holding` whose own files form a checkpoint layout (DCP's .metadata, an index, a
    trainer's names): checkpoints of their own. Plain weight files in a sub-folder are part of a file set."""
    out = []
    for d in sorted(holding):
        inside = [r[len(d) + 1:] for r in rels if r.startswith(d + "/")]
        sub = f"{where.rstrip('/')}/{d}"
        try:
            within = None if fetch is None else (lambda rel, limit, what, d=d: fetch(f"{d}/{rel}", limit, what))
            if layouts.select(sub, inside, within).name != "files":
                out.append(d)
        except CkptbenchError:  # its own files claim a layout (and say something impossible): a checkpoint still
            out.append(d)
    return out


def _lightning(where: str, rels: list[str]) -> tuple[str, str, tuple] | None:
    """Several Lightning .ckpt files side by side are several whole checkpoints: last.ckpt (Lightning's
    ckpt_path="last"), else the only one, else ambiguous. Returns (file, why, passed) or None."""
    ckpts = sorted(r for r in _top(rels) if r.endswith(".ckpt"))
    if len(ckpts) < 2:
        return None
    if LIGHTNING_LAST not in ckpts:
        raise _ambiguous(where, f"{len(ckpts)} Lightning checkpoints", ckpts, files=True)
    tag, why = LIGHTNING_LAST, "last.ckpt, as Lightning's fit(ckpt_path=\"last\") resumes"
    return tag, why, tuple((r, f"another checkpoint: a resume takes {tag}") for r in ckpts if r != tag)


def _bad_pick(where: str, pick: str, what: str, rels: list[str]) -> CkptbenchError:
    return CkptbenchError(f"--pick {pick[:80]!r}: {what} in {where}; choose one of {_listed(_candidates(rels))} "
                          "(a sub-folder, a .ckpt file, or '.' for the checkpoint at the top)")


def _pick(where: str, rels: list[str], pick: str) -> tuple[str, list[str], list[tuple[str, str]], str | None]:
    """The user's choice as (root, its members, what is passed over, a .ckpt file chosen): "." (the files at the
    top), a sub-folder at any depth, or a .ckpt file at any depth."""
    if pick.strip() in (".", "./"):
        # the files at the top and the sub-folders that hold no checkpoint of their own (a Trainer's dataloader
        # state, which a manifest at the top lists: left out, they were "missing" from the checkpoint picked)
        rivals = _holding(rels)
        only = sorted(r for r in rels if "/" not in r or r.split("/", 1)[0] not in rivals)
        if rivals and not any(r.endswith(WEIGHT_EXT) for r in only):  # a Trainer's output_dir with no final model:
            # it was run's "no safetensors, torch or … files found; point at a checkpoint directory", pointed at one
            raise _bad_pick(where, pick, "no checkpoint files at the top", rels)
        return "", only, [(d, "not picked (--pick .)") for d in sorted(rivals)], None
    name = posixpath.normpath(pick.strip()) if pick.strip() else ""
    if not name or name == "." or not confine.is_plain(name):
        raise _bad_pick(where, pick, "not a plain path inside the folder", rels)
    head = name.split("/")[0]
    passed = [(d, "not picked (--pick)") for d in sorted(_holding(rels)) if d != head]
    passed += [(r, "not picked (--pick)") for r in sorted(_top(rels)) if r != name]
    if name in rels:
        if not name.endswith(".ckpt"):
            raise _bad_pick(where, pick, "a file that is not a Lightning .ckpt", rels)
        root, _, file = name.rpartition("/")
        inside = [r[len(root) + 1:] if root else r for r in rels if not root or r.startswith(root + "/")]
        only = [r for r in inside if r == file or ("/" not in r and not r.endswith(layouts.TORCH_EXT))]
        passed += [(f"{root}/{r}" if root else r, "not picked (--pick)") for r in inside
                   if "/" not in r and r.endswith(".ckpt") and r != file]
        # once each: a .ckpt beside the one picked at the top is one of _top's and one of `inside`, and was listed
        # twice as "not read"
        return root, only, list(dict.fromkeys(p for p in passed if p[0] not in (head, name))), file
    if not any(r.startswith(name + "/") and r.endswith(WEIGHT_EXT) for r in rels):
        what = "a folder that holds no checkpoint files" if any(r.startswith(name + "/") for r in rels) else \
            "no such folder"
        raise _bad_pick(where, pick, what, rels)
    prefix = name + "/"
    return name, [r[len(prefix):] for r in rels if r.startswith(prefix)], passed, None


def _named_from(root: str, call):
    """call(), its ambiguity's candidates named for --pick from the folder given: they are below `root`."""
    try:
        return call()
    except _Ambiguous as exc:
        raise (exc.below(root) if root else exc) from None


def choose(where: str, rels: list[str], fetch: Fetch | None = None, pick: str | None = None,
           odd: dict[str, str] | None = None) -> Layout:
    """The one checkpoint a resume loads below `where` (whose members are `rels`) and the files of it a restore
    reads, relative to `root` (None: the checkpoint is `where` itself). `fetch` reads a small member (`latest`, an
    index, Megatron's iteration file) of the folder it is given as rel; None: `where` is a directory on disk. `odd`:
    folders the listing holds no files of, by relative path, with what they are ("is a symlink", "is empty")."""
    odd = odd or {}
    root, whys, passed, chosen = "", [], [], None

    def at(rel: str) -> str:
        return os.path.join(where, rel) if rel else where

    def fetch_in(prefix: str) -> Fetch | None:
        if fetch is None or not prefix:
            return fetch
        return lambda rel, limit, what: fetch(f"{prefix}/{rel}", limit, what)

    def odd_in(prefix: str) -> dict[str, str]:
        p = prefix + "/" if prefix else ""
        return {k[len(p):]: v for k, v in odd.items() if k.startswith(p) and "/" not in k[len(p):]}

    if pick is not None:
        root, rels, passed, chosen = _pick(where, rels, pick)
        whys = [f"--pick {pick}"]
    megatron, only = None, ""  # megatron: the iteration folder Megatron's tracker file named
    for _ in range(MAX_LEVELS):
        step = _named_from(root, lambda: _level(at(root), rels, fetch_in(root), odd_in(root)))
        if step is None:
            break
        tag, why, others = step
        passed += [(f"{root}/{d}" if root else d, w) for d, w in others]
        megatron = tag if "iteration" in why else megatron
        if why == ONLY:  # wrappers say so once, with their whole path
            only = f"{only}/{tag}" if only else tag
        else:
            whys += [f"{only}: {ONLY}"] if only else []
            whys.append(f"{tag}: {why}")
            only = ""
        root = f"{root}/{tag}" if root else tag
        prefix = tag + "/"
        rels = [r[len(prefix):] for r in rels if r.startswith(prefix)]
    else:
        raise CkptbenchError(f"{where}: checkpoint folders nested deeper than {MAX_LEVELS} levels; point at the "
                             "checkpoint itself")
    whys += [f"{only}: {ONLY}"] if only else []
    one = None if chosen else _named_from(root, lambda: _lightning(at(root), rels))
    if one is not None:
        chosen, why, others = one
        passed += [(f"{root}/{d}" if root else d, w) for d, w in others]
        whys.append(why)
    if chosen:
        rels = [r for r in rels if r == chosen or not r.endswith(".ckpt")]
    lay = layouts.select(at(root), rels, fetch_in(root))
    if megatron and any(r == ".metadata" or r.endswith(".distcp") for r in rels):
        # megatron-core loads a torch_dist iteration's metadata.json and common.pt with its DCP files (the iteration,
        # args and scheduler are in common.pt alone): one missing fails the resume, or restores without them
        absent = [f for f in (".metadata", layouts.MEGATRON_META, layouts.MEGATRON_COMMON) if f not in rels]
        if absent:
            raise CkptbenchError(f"{at(root)}: a Megatron torch_dist iteration (DCP files) holds no {absent[0]} as a "
                                 "regular file, which megatron-core loads with them; the iteration is not one whole "
                                 "save: re-copy it")
    if megatron:  # the iteration is the tag, as DeepSpeed's step is; a torch_dist one is named for Megatron too
        lay = replace(lay, name="megatron" if lay.name in ("files", "dcp") else lay.name, tag=megatron)
    within = tuple((f"{root}/{p}" if root else p, w) for p, w in lay.skipped)  # named from the folder given
    return replace(lay, root=root or None, why="; ".join(whys + [lay.why] if lay.why else whys),
                   skipped=tuple(passed) + within,
                   tag=lay.tag or chosen)


_LOADED_EXT = {"safetensors": (".safetensors",), "torch": layouts.TORCH_EXT, "dcp": (".distcp", ".metadata")}


def with_unloaded(lay: Layout, fmt: str) -> Layout:
    """The layout with every file it reads but no loader of `fmt` deserializes named in `unloaded` (a torch.save file
    beside safetensors weights that is no trainer state, Megatron's common.pt beside DCP files): read, timed, and
    said, never silently dropped."""
    loaded = _LOADED_EXT.get(fmt, ())
    known = {r for r, _ in lay.unloaded} | set(lay.state_files)
    extra = tuple((r, f"a {os.path.splitext(r)[1]} file beside {fmt} weights: read, not deserialized (no resume "
                      "state ckptbench knows is in it)")
                  for r in lay.files if r.endswith(WEIGHT_EXT) and not r.endswith(loaded) and r not in known)
    return replace(lay, unloaded=lay.unloaded + extra) if extra else lay
