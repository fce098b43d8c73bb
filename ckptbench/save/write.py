"""One atomic save: ranks (threads) write their shards into a temporary directory inside the target, files and
directory are fsync'd, a manifest is added, and the directory is renamed to its final name; timed three ways."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass

import fastio
import torch

from ckptbench.checkpoint import manifest as mf
from ckptbench.core.errors import Cancelled, CkptbenchError
from ckptbench.checkpoint.formats import CheckpointState
from ckptbench.core.staging import MARKER, make_staging, unmark

Written = list[tuple[str, str, int | None]]  # (relative path, kind, rank)


@dataclass
class RankSpan:
    rank: int
    start_s: float  # from the save's start
    end_s: float
    bytes: int


@dataclass
class WriteOutcome:
    blocking_s: float | None  # async: until the state was staged; None for a synchronous save
    written_s: float
    durable_s: float
    bytes: int
    spans: list[RankSpan]


CHUNK = 8 << 20  # bytes per write call


def _write_all(fd: int, view: memoryview) -> None:
    for start in range(0, view.nbytes, CHUNK):
        part = view[start:start + CHUNK]
        while part:
            part = part[os.write(fd, part):]


def write_safetensors(path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file written straight from the tensors' memory: safetensors' own save_file first copies every
    tensor into a bytes object, which would time this machine's page faults, not the storage."""
    from ckptbench.checkpoint.formats.safetensors_format import _TORCH_NAMES

    codes = {getattr(torch, n): code for code, n in _TORCH_NAMES.items() if hasattr(torch, n)}
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, memoryview(len(raw).to_bytes(8, "little") + raw))
        for t in tensors.values():
            if t.numel():
                _write_all(fd, memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))
    finally:
        os.close(fd)


def _plain_state(state: CheckpointState) -> dict:
    """What every rank's optimizer file carries beside the tensors: the step, the optimizer's hyper-parameters and,
    where the source had one, the training loop's state (scheduler, epoch, global_step); each rank's file alone
    resumes the whole of it, as step and hparams always did."""
    return {"step": state.step, "hparams": state.hparams} | ({"trainer_state": state.trainer} if state.trainer else {})


def _write_rank_safetensors(tmp: str, state: CheckpointState, names: list[str], rank: int, world: int) -> Written:
    from ckptbench.checkpoint.formats.safetensors_format import optimizer_meta, shard_name

    model_file, optim_file = shard_name("model", rank, world), shard_name("optimizer", rank, world)
    write_safetensors(os.path.join(tmp, model_file), {n: state.model[n] for n in names}, {"format": "pt"})
    # every part the state holds, as the torch and DCP writers save them: a foreign optimizer's moments need not be
    # ckptbench's three (SGD's momentum_buffer, AMSGrad's max_exp_avg_sq)
    tensors = {f"{n}.{k}": t for n in names for k, t in state.optim.get(n, {}).items()}
    write_safetensors(os.path.join(tmp, optim_file), tensors, optimizer_meta(_plain_state(state)))
    return [(model_file, "model", rank), (optim_file, "optimizer", rank)]


def _write_rank_torch(tmp: str, state: CheckpointState, names: list[str], rank: int, world: int) -> Written:
    from ckptbench.checkpoint.formats.torch_format import shard_names

    model_file, optim_file = shard_names(rank)
    torch.save({n: state.model[n] for n in names}, os.path.join(tmp, model_file))
    optim = {"state": {n: state.optim[n] for n in names if n in state.optim}} | _plain_state(state)
    torch.save(optim, os.path.join(tmp, optim_file))
    return [(model_file, "model", rank), (optim_file, "optimizer", rank)]


def _safetensors_index(tmp: str, state: CheckpointState, assignment: list[list[str]]) -> Written:
    from ckptbench.checkpoint.formats.safetensors_format import INDEX, shard_name

    world = len(assignment)
    weight_map = {n: shard_name("model", r, world) for r, names in enumerate(assignment) for n in names}
    total = sum(t.numel() * t.element_size() for t in state.model.values())
    with open(os.path.join(tmp, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return [(INDEX, "meta", None)]


def _ranks_write(fmt: str, tmp: str, state: CheckpointState, assignment: list[list[str]], stagger_s: float,
                 t0: float, cancel: threading.Event | None) -> tuple[Written, list[RankSpan]]:
    """One thread per rank, rank r starting r × stagger_s after the save began; the first failure is raised."""
    write_rank = _write_rank_safetensors if fmt == "safetensors" else _write_rank_torch
    world = len(assignment)
    results: list[Written | None] = [None] * world
    spans: list[RankSpan | None] = [None] * world
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            if stagger_s and cancel is not None and cancel.wait(r * stagger_s):
                return
            if stagger_s and cancel is None:
                time.sleep(r * stagger_s)
            start = time.perf_counter() - t0
            out = write_rank(tmp, state, assignment[r], r, world)
            end = time.perf_counter() - t0
            size = sum(os.path.getsize(os.path.join(tmp, rel)) for rel, _, _ in out)
            results[r], spans[r] = out, RankSpan(r, start, end, size)
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"ckptbench-save-rank{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if cancel is not None and cancel.is_set():
        raise Cancelled("save cancelled; the partial save was removed")
    written = [w for out in results for w in (out or [])]
    if fmt == "safetensors":
        written += _safetensors_index(tmp, state, assignment)
    return written, [s for s in spans if s is not None]


def dcp_state(state: CheckpointState) -> dict:
    """Non-tensor values go into the state dict as DCP's users put them (DCP stores each as a byte entry)."""
    plain = {"hparams": state.hparams, "trainer_state": state.trainer}
    return {"model": state.model, "optim": state.optim, "step": torch.tensor(state.step)} | \
        {k: v for k, v in plain.items() if v}


def _dcp_write(tmp: str, state: CheckpointState, ranks: int, async_save: bool,
               t0: float) -> tuple[Written, float | None]:
    """DCP with `ranks` writer threads; async: `async_save` in this process (no process group: no_dist=True), and
    the blocking time is when it returns, after staging. Files are fsync'd by the caller, like the other formats."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from ckptbench.checkpoint.formats.dcp_format import _quiet

    writer = FileSystemWriter(tmp, sync_files=False, thread_count=ranks)
    blocking = None
    with _quiet():
        if async_save:
            future = dcp.async_save(dcp_state(state), storage_writer=writer, no_dist=True)
            blocking = time.perf_counter() - t0
            future.result()
        else:
            dcp.save(dcp_state(state), storage_writer=writer, no_dist=True)
    names = sorted(n for n in os.listdir(tmp) if n != MARKER)
    written = [(n, "model", i) for i, n in enumerate(n for n in names if n.endswith(".distcp"))]
    written += [(n, "meta", None) for n in names if not n.endswith(".distcp")]
    return written, blocking


def fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest(tmp: str, written: Written, info: dict, world: int) -> float:
    """Hashes the files (from the page cache, just written) and writes the manifest; returns the seconds spent, which
    the caller leaves out of the durable time: a trainer's save does not hash."""
    t = time.perf_counter()
    result = fastio.read_files([os.path.join(tmp, rel) for rel, _, _ in written], hash="crc32c", concurrency=4)
    if result.failed:
        bad = result.failed[0]
        raise CkptbenchError(f"{bad.path}: could not be read back after writing ({bad.error.message})", exit_code=1)
    entries = tuple(mf.FileEntry(rel, f.bytes, f.digest, kind, rank)
                    for (rel, kind, rank), f in zip(written, result.files))
    man = mf.Manifest(format=info["format"], profile=info["profile"], dims=info["dims"],
                      param_count=info["param_count"], weights_dtype=info["weights_dtype"],
                      optimizer_dtype=info["optimizer_dtype"], world_size=world, seed=info.get("seed", 0),
                      hash="crc32c", files=entries, step=info.get("step", 1))
    man.write(tmp)
    return time.perf_counter() - t


def _target_state(target: str) -> int | None:
    """ENOSPC or EROFS when the target is full or read-only now, before the partial save is removed: torch's and
    DCP's writers report only that a write failed, not why."""
    try:
        st = os.statvfs(target)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS
    return errno.ENOSPC if st.f_bavail * st.f_frsize < (1 << 20) else None


def _publish(tmp: str, final: str) -> None:
    """Renames the finished save into place; a name taken meanwhile (rename says "Directory not empty") is another
    writer's save to the same target, told as such."""
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
        target, name = os.path.split(final)
        raise CkptbenchError(f"{target}: {name} appeared while this save was being written (another save or "
                             "process writing to the same target?); this save was removed and theirs left as it "
                             "is; give each writer its own target", exit_code=1) from None


def write_save(target: str, name: str, state: CheckpointState, assignment: list[list[str]], info: dict, *,
               async_save: bool = False, stagger_s: float = 0.0, fsync: bool = True,
               cancel: threading.Event | None = None) -> WriteOutcome:
    """Writes TARGET/name atomically; on any failure the temporary directory is removed and nothing else changes."""
    final = os.path.join(target, name)
    tmp = None
    fmt = info["format"]
    t0 = time.perf_counter()
    try:
        tmp = make_staging(final)  # under another name when one is there, which is left alone
        if fmt == "dcp":
            written, blocking = _dcp_write(tmp, state, len(assignment), async_save, t0)
            spans = []
        else:
            written, spans = _ranks_write(fmt, tmp, state, assignment, stagger_s, t0, cancel)
            blocking = None
        written_s = time.perf_counter() - t0
        if cancel is not None and cancel.is_set():
            raise Cancelled("save cancelled; the partial save was removed")
        if fsync:
            for rel, _, _ in written:
                fsync_path(os.path.join(tmp, rel))
        hash_s = _manifest(tmp, written, info, len(assignment))
        unmark(tmp)
        if fsync:
            fsync_path(tmp, directory=True)
        _publish(tmp, final)
        if fsync:
            fsync_path(target, directory=True)
        durable_s = time.perf_counter() - t0 - hash_s
    except BaseException as exc:
        code = _target_state(target) if isinstance(exc, Exception) or type(exc).__name__ == "CheckpointException" \
            else None
        if tmp is not None:  # never a folder this save did not make
            shutil.rmtree(tmp, ignore_errors=True)
        if code is not None and not isinstance(exc, (OSError, CkptbenchError)):  # ours already say what happened
            raise OSError(code, os.strerror(code), final) from exc
        raise
    size = sum(os.path.getsize(os.path.join(final, rel)) for rel, _, _ in written)
    return WriteOutcome(blocking, written_s, durable_s, size, spans)
