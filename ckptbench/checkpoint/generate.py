"""`gen`: writes a real sample checkpoint of a profile — a trained-one-step model, its optimizer, the small-file tail — atomically."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import threading
from typing import Callable

import fastio
import torch

from ckptbench.checkpoint import manifest as mf
from ckptbench.core import staging
from ckptbench.core.staging import staging_name  # noqa: F401  (gen's staging name, as the tests name it)
from ckptbench.core.errors import EXIT_REFUSED_BY_SYSTEM, Cancelled, CkptbenchError
from ckptbench.core.units import human_count
from ckptbench.checkpoint.formats import CheckpointState, module_for
from ckptbench.checkpoint.model import DTYPES, GPT, master_optimizer, sample_batch
from ckptbench.checkpoint.profiles import FORMATS, Profile
from ckptbench.checkpoint.quote import quote

HPARAMS = {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}
Progress = Callable[[str], None]


def _init_nonzero(model: GPT, seed: int) -> None:
    """Random everywhere: default init leaves biases at zero, which a reader could 'restore' for free."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.02
            p.copy_(noise + 1.0 if name.endswith("weight") and p.dim() == 1 else noise)


def train_one_step(profile: Profile, seed: int) -> CheckpointState:
    """A real optimizer step, so the AdamW state is what a trainer would save; on one thread, so that a seed writes
    the same bytes in any process: the matmuls' reductions split another way on another thread count (one thread
    and two wrote other bytes here), and MKL picks fewer threads than asked when the cores are busy (MKL_DYNAMIC: a
    test comparing two gens of one seed failed once under load). The step is small; gen's time is its writing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _step(profile, seed)
    finally:
        torch.set_num_threads(threads)


def _step(profile: Profile, seed: int) -> CheckpointState:
    torch.manual_seed(seed)
    model = GPT(profile.dims)
    _init_nonzero(model, seed)
    opt, master, names = master_optimizer(model, {n: p for n, p in model.named_parameters()}, lr=HPARAMS["lr"])
    idx = sample_batch(profile.dims, seed=seed)
    logits = model(idx)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    wdtype = DTYPES[profile.weights_dtype]
    odtype = DTYPES[profile.optimizer_dtype]
    weights = {n: master[n].detach().to(wdtype).contiguous() for n in names}
    optim = {}
    for i, n in enumerate(names):
        st = opt.state[opt.param_groups[0]["params"][i]]
        optim[n] = {"master": master[n].detach().to(odtype).contiguous(),
                    "exp_avg": st["exp_avg"].to(odtype), "exp_avg_sq": st["exp_avg_sq"].to(odtype)}
    return CheckpointState(weights, optim, step=1, hparams=dict(HPARAMS))


def assign_ranks(state: CheckpointState, ranks: int) -> list[list[str]]:
    """Each parameter to the rank holding the fewest bytes so far (largest first): ZeRO-style balance."""
    load = [0] * ranks
    out: list[list[str]] = [[] for _ in range(ranks)]
    for name in sorted(state.model, key=lambda n: -state.model[n].numel()):
        r = min(range(ranks), key=lambda i: load[i])
        out[r].append(name)
        load[r] += state.model[name].numel()
    order = list(state.model)
    return [sorted(names, key=order.index) for names in out]


def write_small_files(directory: str, profile: Profile, ranks: int, seed: int) -> list[tuple[str, str, int | None]]:
    """config, tokenizer, scheduler, RNG states and data-loader positions — the tail of a real checkpoint."""
    rng = random.Random(seed)
    d = profile.dims
    out: list[tuple[str, str, int | None]] = []

    def put(rel: str, data: bytes, rank: int | None = None) -> None:
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        out.append((rel, "small", rank))

    config = {"architectures": ["GPT"], "n_layer": d.layers, "n_embd": d.hidden, "n_head": d.heads,
              "vocab_size": d.vocab, "n_positions": d.seq_len, "torch_dtype": profile.weights_dtype}
    put("config.json", json.dumps(config, indent=1).encode())
    vocab = {f"tok{rng.getrandbits(40):010x}_{i}": i for i in range(d.vocab)}
    put("tokenizer.json", json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab}}).encode())
    put("tokenizer_config.json", json.dumps({"model_max_length": d.seq_len, "tokenizer_class": "GPTTokenizer"}).encode())
    put("special_tokens_map.json", json.dumps({"bos_token": "<s>", "eos_token": "</s>"}).encode())
    put("generation_config.json", json.dumps({"max_new_tokens": 64, "temperature": 0.7}).encode())
    sched = {"last_epoch": 1, "base_lrs": [HPARAMS["lr"]], "warmup_steps": 2000, "total_steps": 100000}
    put("scheduler.json", json.dumps(sched).encode())
    for r in range(ranks):
        put(f"rng_state_{r}.json", json.dumps({"python": rng.getrandbits(64), "torch_seed": seed + r,
                                                 "cuda_seed": seed + 1000 + r}).encode(), r)
    left = max(0, profile.small_files - len(out))
    for i in range(left):
        r = i % ranks
        indices = rng.randbytes(rng.randint(16 << 10, 96 << 10))
        put(f"dataloader/rank{r:03d}_worker{i // ranks:04d}.idx", indices, r)
    return out


def _check_target(directory: str, need: int, force: bool) -> str:
    target = os.path.abspath(directory)
    parent = os.path.dirname(target)
    if os.path.exists(target) and not os.path.isdir(target):
        raise CkptbenchError(f"{directory}: exists and is not a directory")
    if os.path.isdir(target) and os.listdir(target):
        # --force replaces a checkpoint gen wrote, never whatever else a folder holds (`gen small . --force`); asked
        # first, so that --force is offered only where it works (a new user's save_pretrained folder was told "pass
        # --force", and --force then refused it)
        if not os.path.isfile(os.path.join(target, "ckptbench.json")):
            raise CkptbenchError(f"{directory}: not empty and not a checkpoint gen wrote (no ckptbench.json); "
                                 "--force replaces only those: choose an empty or new directory")
        _only_listed(directory, target)
        if not force:
            raise CkptbenchError(f"{directory}: not empty; pass --force to replace it or choose an empty directory")
    if not os.path.isdir(parent):
        raise CkptbenchError(f"{parent}: no such directory; create it first")
    if not os.access(parent, os.W_OK):
        raise CkptbenchError(f"{parent}: not writable; choose a directory you can write to",
                             exit_code=EXIT_REFUSED_BY_SYSTEM)
    free = shutil.disk_usage(parent).free
    if free < need:
        raise CkptbenchError(f"{parent}: {free / 2**30:.2f} GiB free, the checkpoint needs {need / 2**30:.2f} GiB; "
                             "free space or use --scale", exit_code=EXIT_REFUSED_BY_SYSTEM)
    return target


def _only_listed(directory: str, target: str) -> None:
    """Every entry below `target` is one its manifest lists (or a folder on the way to one): a ckptbench.json alone
    ('{}', or one beside files the user added since) made --force delete everything else the folder held."""
    try:
        man = mf.read(target)
    except CkptbenchError as exc:
        raise CkptbenchError(f"{exc}; --force replaces only a checkpoint gen wrote: choose an empty or new "
                             "directory", exit_code=exc.exit_code) from None
    rel = mf.unlisted(target, man)
    if rel is not None:
        raise CkptbenchError(f"{directory}: holds {quote(rel)}, which its ckptbench.json does not list; "
                             "--force replaces only a checkpoint gen wrote, whole: move it out, or "
                             "choose an empty or new directory")


def generate(profile: Profile, directory: str, *, fmt: str | None = None, ranks: int | None = None, seed: int = 0,
             force: bool = False, digest: str = "crc32c", progress: Progress | None = None,
             cancel: threading.Event | None = None, on_reaped: Progress | None = None) -> mf.Manifest:
    """`on_reaped(path)`: once per leftover of a killed gen removed before this one stages (reap_stale_staging)."""
    fmt = fmt or profile.format
    given, ranks = ranks, ranks or profile.world_size
    if fmt not in FORMATS:
        raise CkptbenchError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if not 1 <= ranks <= 4096:  # a profile's world_size may be up to MAX_RANK for plan: say where it came from
        raise CkptbenchError(f"--ranks must be 1..4096, got {ranks}" if given else
                             f"profile {profile.name!r}: checkpoint.world_size {ranks} is more ranks than gen writes "
                             "(1..4096): give --ranks N, or use the profile with plan only")
    if digest not in ("crc32c", "md5"):
        raise CkptbenchError(f"manifest digest must be crc32c or md5, got {digest!r}")
    need = int(profile.total_bytes * 1.1) + profile.small_files * (100 << 10) + (64 << 20)
    target = _check_target(directory, need, force)
    say = progress or (lambda _msg: None)

    def check_cancel() -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("generation cancelled; nothing was written")

    for path in reap_stale_staging(target):
        if on_reaped is not None:
            on_reaped(path)
    tmp = None
    try:
        tmp = staging.make_staging(target)
        say(f"building the model ({human_count(profile.dims.param_count)} parameters) and taking one AdamW step")
        state = train_one_step(profile, seed)
        check_cancel()
        assignment = assign_ranks(state, ranks)
        say(f"writing {fmt} shards for {ranks} rank(s)")
        written = module_for(fmt).write(tmp, state, assignment)
        del state
        check_cancel()
        say(f"writing {profile.small_files} small files")
        written += write_small_files(tmp, profile, ranks, seed)
        say("hashing for the manifest")
        result = fastio.read_files([os.path.join(tmp, rel) for rel, _, _ in written], hash=digest, concurrency=4)
        if result.failed:
            bad = result.failed[0]
            raise CkptbenchError(f"{bad.path}: could not be read back after writing ({bad.error.message})")
        entries = tuple(mf.FileEntry(rel, f.bytes, f.digest, kind, rank)
                        for (rel, kind, rank), f in zip(written, result.files))
        man = mf.Manifest(format=fmt, profile=profile.name, dims=vars(profile.dims) | {}, param_count=profile.dims.param_count,
                          weights_dtype=profile.weights_dtype, optimizer_dtype=profile.optimizer_dtype,
                          world_size=ranks, seed=seed, hash=digest, files=entries)
        man.write(tmp)
        staging.unmark(tmp)
        _fsync_tree(tmp)
        check_cancel()
        _swap_in(tmp, target)
        return man
    except BaseException:
        if tmp is not None:  # never a folder this gen did not make
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def reap_stale_staging(target: str) -> list[str]:
    """Removes the staging folders of `target` that dead `gen`s on this host made (staging.reap_stale: only those
    holding our marker), and the set-aside old checkpoint of a swap that died between its renames once the new one is
    in place; returns their paths."""
    parent, base = os.path.split(target)
    removed = staging.reap_stale(parent, re.escape(base))
    old = re.compile(rf"\.{re.escape(base)}\.tmp-{re.escape(staging.host())}-(?P<pid>[0-9]{{1,10}})(?:-[0-9a-f]{{8}})?\.old")
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for n in sorted(names):
        m = old.fullmatch(n)
        path = os.path.join(parent, n)
        # the target gen replaced, set aside: empty or a checkpoint gen wrote (_check_target let nothing else be)
        if m is None or staging.alive(int(m["pid"])) or not os.path.isdir(target) or not _replaced(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _replaced(path: str) -> bool:
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        if not os.listdir(path):
            return True
        # what _check_target let --force replace, whole: a ckptbench.json beside other files is not
        return stat.S_ISREG(os.lstat(os.path.join(path, mf.MANIFEST_NAME)).st_mode) and \
            mf.unlisted(path, mf.read(path)) is None
    except (OSError, CkptbenchError):
        return False


def _fsync_tree(root: str) -> None:
    for dirpath, _, names in os.walk(root):
        for n in names:
            fd = os.open(os.path.join(dirpath, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _swap_in(tmp: str, target: str) -> None:
    """Old checkpoint aside, new one in, old one removed: a crash never leaves a half checkpoint at target."""
    old = None
    if os.path.isdir(target):
        old = f"{tmp}.old"
        os.rename(target, old)
        try:  # checked again as set aside: what was put into it while gen wrote (minutes) is the user's, not ours
            _only_listed(target, old)
        except BaseException:
            os.rename(old, target)
            raise
    try:
        os.rename(tmp, target)
    except BaseException:
        if old:
            os.rename(old, target)
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)
