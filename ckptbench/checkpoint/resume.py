"""Which one checkpoint a resume loads from a folder that holds several, or a final model beside numbered ones.

One rule per container, applied level by level until one checkpoint remains, then layouts.select names its files:
- Megatron-LM: the iteration latest_checkpointed_iteration.txt names (else the only one);
- numbered folders (torchtitan's step-N, a Trainer's checkpoint-N, ckptbench save's step-NNNNNN): the largest N,
  as torchtitan's resume and Trainer's resume_from_checkpoint=True pick it, even beside a final model
  (trainer.save_model() at the top), which is then not read;
- DCP checkpoints under other names, and Lightning .ckpt files (each a whole checkpoint): last.ckpt, else the only
  one, else ambiguous;
- a folder whose checkpoint files all lie in one sub-folder (torchtitan's dump folder above checkpoint/,
  lightning_logs/version_0/checkpoints): that sub-folder.
Nothing is merged across checkpoints: where the rule cannot choose it is one line naming the candidates, and
`pick` (a sub-folder, a .ckpt file, or "." for the files at the top) chooses. Computed once per listing; every
command takes the Layout it returns.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from ckptbench.checkpoint import confine
from ckptbench.checkpoint import layouts
from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.layouts import Fetch, Layout

WEIGHT_EXT = (".safetensors", ".distcp", ".metadata", *layouts.TORCH_EXT)
# ASCII digits only: `\d` takes any Unicode digit, and step-١٠ is nobody's step 10
_NUMBERED = re.compile(r"^(?:step|checkpoint)-([0-9]+)$", re.ASCII)
LIGHTNING_LAST = "last.ckpt"
MAX_LEVELS = 8  # containers nested deeper than any trainer writes them
ONLY = "the only folder holding checkpoint files"


def _top(rels: list[str]) -> set[str]:
    return {r for r in rels if "/" not in r}


def _listed(names) -> str:
    names = sorted(names)
    return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")


def _ambiguous(where: str, what: str, candidates, how: str = "") -> CkptbenchError:
    return CkptbenchError(f"{where}: {what} ({_listed(candidates)}) and nothing saying which a resume loads; "
                          f"choose one with --pick NAME{how} or point at it")


def _holding(rels: list[str]) -> set[str]:
    """Top-level directories that hold checkpoint files (at any depth below them)."""
    return {r.split("/", 1)[0] for r in rels if "/" in r and r.endswith(WEIGHT_EXT)}


def _numbered(where: str, rels: list[str]) -> dict[int, str]:
    """step-N / checkpoint-N folders that hold checkpoint files, by N; two spellings of one N are ambiguous."""
    out: dict[int, str] = {}
    for d in sorted(_holding(rels)):
        m = _NUMBERED.match(d)
        if m is None:
            continue
        n = int(m.group(1))
        if n in out:
            raise _ambiguous(where, f"two folders number checkpoint {n}", (out[n], d))
        out[n] = d
    return out


def _level(where: str, rels: list[str], fetch: Fetch | None) -> tuple[str, str, tuple] | None:
    """(sub-folder to descend into, why, (other candidates, why not)) at this level, or None when `rels` is one
    checkpoint. Raises one line where the choice is ambiguous."""
    top = _top(rels)
    iters = layouts.iterations(rels)
    if iters and not any(layouts.MP_DIR.match(r.split("/")[0]) for r in rels if "/" in r):
        tag = layouts.megatron_iteration(where, rels, top, iters, fetch)
        why = (f"the iteration {layouts.MEGATRON_LATEST} names" if layouts.MEGATRON_LATEST in top
               else "the only iteration")
        return tag, why, tuple((d, f"another iteration: {why} is {tag}") for d in sorted(iters - {tag}))
    numbered = _numbered(where, rels)
    if numbered:
        n = max(numbered)
        tag = numbered[n]
        who = ("as Trainer's resume_from_checkpoint=True picks it (get_last_checkpoint)" if tag.startswith("checkpoint")
               else "as torchtitan's resume (load_step -1) and ckptbench save pick it")
        why = f"the highest {tag.split('-')[0]}-N of {len(numbered)}, {who}"
        passed = [(numbered[k], f"an older checkpoint: a resume takes {tag}") for k in sorted(numbered) if k != n]
        passed += [(d, f"not numbered as step-N or checkpoint-N (ASCII digits), so no candidate: a resume takes {tag}")
                   for d in sorted(_holding(rels) - set(numbered.values()))]
        finals = sorted(r for r in top if r.endswith(WEIGHT_EXT) and not layouts.skip_why(r))
        if finals:
            why += "; the final model at the top is not read (--pick . restores it)"
            passed += [(r, f"the final model (trainer.save_model), not the state a resume loads from {tag}")
                       for r in finals]
        return tag, why, tuple(passed)
    if any(r.endswith(WEIGHT_EXT) for r in top):
        return None  # a checkpoint at the top; its own layout says which of its files are read
    dcp = {r.split("/")[0] for r in rels if r.count("/") == 1 and r.endswith("/.metadata")}
    if len(dcp) > 1:
        raise _ambiguous(where, f"{len(dcp)} DCP checkpoints", dcp)
    holding = _holding(rels)
    if len(holding) == 1 and not layouts.is_one_checkpoint(rels):
        (tag,) = holding
        return tag, ONLY, ()
    return None


def _lightning(where: str, rels: list[str]) -> tuple[str, str, tuple] | None:
    """Several Lightning .ckpt files side by side are several whole checkpoints: last.ckpt (Lightning's
    ckpt_path="last"), else the only one, else ambiguous. Returns (file, why, passed) or None."""
    ckpts = sorted(r for r in _top(rels) if r.endswith(".ckpt"))
    if len(ckpts) < 2:
        return None
    if LIGHTNING_LAST in ckpts:
        tag, why = LIGHTNING_LAST, "last.ckpt, as Lightning's fit(ckpt_path=\"last\") resumes"
    else:
        raise _ambiguous(where, f"{len(ckpts)} Lightning checkpoints", ckpts, " (a .ckpt file)")
    return tag, why, tuple((r, f"another checkpoint: a resume takes {tag}") for r in ckpts if r != tag)


def _pick(where: str, rels: list[str], pick: str) -> tuple[str | None, list[str]]:
    """The user's choice: "." (the files at the top), a .ckpt file at the top, or a sub-folder (any depth)."""
    if pick in (".", "./"):
        return None, sorted(_top(rels))
    name = pick.strip("/")
    if not name or not confine.is_plain(name):
        raise CkptbenchError(f"--pick {pick[:80]!r}: not a plain path inside {where}; name one of the candidates "
                             "the ambiguity line lists, or '.' for the files at the top")
    if name in rels and name.endswith(".ckpt"):
        return None, [r for r in rels if r == name or not r.endswith(layouts.TORCH_EXT)]
    if not any(r.startswith(name + "/") for r in rels):
        raise CkptbenchError(f"--pick {pick[:80]!r}: no such folder of checkpoint files in {where}; name one of the "
                             "candidates the ambiguity line lists, or '.' for the files at the top")
    return name, []


def choose(where: str, rels: list[str], fetch: Fetch | None = None, pick: str | None = None) -> Layout:
    """The one checkpoint a resume loads below `where` (whose members are `rels`) and the files of it a restore
    reads, relative to `root` (None: the checkpoint is `where` itself). `fetch` reads a small member (`latest`, an
    index, Megatron's iteration file) of the folder it is given as rel; None: `where` is a directory on disk."""
    root, whys, passed = "", [], []

    def sub(tag: str, more: list[str]) -> list[str]:
        prefix = tag + "/"
        return [r[len(prefix):] for r in more if r.startswith(prefix)]

    def at(rel: str) -> str:
        return os.path.join(where, rel) if rel else where

    def fetch_in(prefix: str) -> Fetch | None:
        if fetch is None or not prefix:
            return fetch
        return lambda rel, limit, what: fetch(f"{prefix}/{rel}", limit, what)

    if pick:
        tag, only = _pick(where, rels, pick)
        if tag is None:
            passed = [(r, "not picked (--pick)") for r in rels if r not in set(only) and "/" not in r]
            passed += [(d + "/", "not picked (--pick)") for d in sorted(_holding(rels))]
            rels, whys = only, [f"--pick {pick}"]
        else:
            root, rels, whys = tag, sub(tag, rels), [f"--pick {pick}"]
    megatron, only = False, ""
    for _ in range(MAX_LEVELS):
        step = _level(at(root), rels, fetch_in(root) if fetch is not None else None)
        if step is None:
            break
        tag, why, others = step
        passed += [(f"{root}/{d}" if root else d, w) for d, w in others]
        megatron |= "iteration" in why
        if why == ONLY:  # wrappers say so once, with their whole path
            only = f"{only}/{tag}" if only else tag
        else:
            whys += [f"{only}: {ONLY}"] if only else []
            whys.append(f"{tag}: {why}")
            only = ""
        root = f"{root}/{tag}" if root else tag
        rels = sub(tag, rels)
    else:
        raise CkptbenchError(f"{where}: checkpoint folders nested deeper than {MAX_LEVELS} levels; point at the "
                             "checkpoint itself")
    whys += [f"{only}: {ONLY}"] if only else []
    if not (pick or "").endswith(".ckpt"):  # a .ckpt the user picked is the checkpoint already
        one = _lightning(at(root), rels)
        if one is not None:
            tag, why, others = one
            passed += [(f"{root}/{d}" if root else d, w) for d, w in others]
            whys.append(why)
            rels = [r for r in rels if r == tag or not r.endswith(".ckpt")]
    lay = layouts.select(at(root), rels, fetch_in(root) if fetch is not None else None)
    if megatron and lay.name in ("files", "dcp"):  # a torch_dist iteration
        lay = replace(lay, name="megatron")
    return replace(lay, root=root or None, why="; ".join(whys), skipped=tuple(passed) + lay.skipped)


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
