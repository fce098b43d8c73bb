"""safetensors shards in the Hugging Face layout (model-0000i-of-0000N + index), optimizer shards beside them."""

from __future__ import annotations

import json
import math
import os
import struct

import torch
from safetensors.torch import save_file

from ckptbench.checkpoint import layouts
from ckptbench.checkpoint.formats.state import (OPTIM_KEYS, CheckpointState, FormatError, holds_shape, json_plain,
                                                open_regular, read_regular)
from ckptbench.checkpoint.quote import quote
from ckptbench.core import jsontext

INDEX = "model.safetensors.index.json"
# safetensors' dtype codes that torch holds as whole bytes (the sub-byte F4/F6 codes are not read by ckptbench)
_TORCH_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
                "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "U16": "uint16",
                "U32": "uint32", "U64": "uint64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn",
                "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
                "F8_E5M2FNUZ": "float8_e5m2fnuz"}
_DTYPES = {code: getattr(torch, n) for code, n in _TORCH_NAMES.items()
           if isinstance(getattr(torch, n, None), torch.dtype)}  # an older torch lacks some
MAX_HEADER = 100 << 20
MAX_DIMS = 64  # torch's operators stop at 64 dimensions
_CRAFTED = "the file is corrupt or crafted"


def shard_name(kind: str, rank: int, world: int) -> str:
    return f"{kind}-{rank + 1:05d}-of-{world:05d}.safetensors"


def write(directory: str, state: CheckpointState, assignment: list[list[str]]) -> list[tuple[str, str, int | None]]:
    world = len(assignment)
    written, weight_map = [], {}
    for rank, names in enumerate(assignment):
        model_file = shard_name("model", rank, world)
        save_file({n: state.model[n].contiguous() for n in names}, os.path.join(directory, model_file),
                  metadata={"format": "pt"})
        weight_map.update({n: model_file for n in names})
        optim_file = shard_name("optimizer", rank, world)
        tensors = {f"{n}.{k}": state.optim[n][k].contiguous() for n in names for k in OPTIM_KEYS}
        meta = optimizer_meta({"step": state.step, "hparams": state.hparams})
        save_file(tensors, os.path.join(directory, optim_file), metadata=meta)
        written += [(model_file, "model", rank), (optim_file, "optimizer", rank)]
    total = sum(t.numel() * t.element_size() for t in state.model.values())
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    written.append((INDEX, "meta", None))
    return written


def optimizer_meta(doc: dict) -> dict[str, str]:
    """The optimizer shard's metadata: `doc` (step, hparams, trainer_state) as JSON, and where it holds tuples (Adam's
    betas, Python's RNG state, which random.setstate takes only as a tuple) their paths under "tuples", since JSON
    writes a tuple as a list; the reader turns those lists back."""
    paths = _tuple_paths(doc)
    # one metadata key: safetensors orders several keys at random, which would break same-seed digests
    return {"ckptbench_optimizer": json.dumps(doc | ({"tuples": paths} if paths else {}), sort_keys=True)}


def _tuple_paths(doc) -> list[list]:
    """The path (dict keys and list indices from the root) of every tuple in `doc`, deepest first."""
    out, stack = [], [(doc, [])]
    while stack:
        node, path = stack.pop()
        if type(node) is tuple:
            out.append(path)
        items = dict.items(node) if isinstance(node, dict) else enumerate(node) if type(node) in (list, tuple) else ()
        stack.extend((v, path + [k]) for k, v in items if isinstance(v, (dict, list, tuple)))
    return sorted(out, key=len, reverse=True)


def _child(node, key, bad: str):
    if isinstance(node, dict) and type(key) is str and key in node:
        return node[key]
    if type(node) is list and type(key) is int and 0 <= key < len(node):
        return node[key]
    raise FormatError(bad)


def _as_tuples(doc: dict, paths, bad: str) -> None:
    """Turns the lists at `paths` (optimizer_meta's "tuples") back into tuples, deepest first so that a tuple's
    parent is still a list when it is set; a path that names no list is crafted."""
    if not isinstance(paths, list) or not all(isinstance(p, list) and p for p in paths):
        raise FormatError(bad)
    for path in sorted(paths, key=len, reverse=True):
        parent = doc
        for key in path[:-1]:
            parent = _child(parent, key, bad)
        if type(_child(parent, path[-1], bad)) is not list:
            raise FormatError(bad)
        parent[path[-1]] = tuple(parent[path[-1]])


# an optimizer file's parts beyond AdamW's (SGD's momentum, AMSGrad's, steps that differ by parameter: a save of a
# foreign optimizer writes them): read back as the optimizer's, not as weights
PARTS = (*OPTIM_KEYS, "momentum_buffer", "max_exp_avg_sq", "step")


def _split(name: str) -> tuple[str, str | None]:
    for k in PARTS:
        if name.endswith("." + k):
            return name[: -len(k) - 1], k
    return name, None


def _add(state: CheckpointState, name: str, tensor: torch.Tensor, optimizer_file: bool) -> None:
    base, part = _split(name) if optimizer_file else (name, None)
    if part:
        state.optim.setdefault(base, {})[part] = tensor
    else:
        state.model[name] = tensor


def _whole(v) -> bool:
    """A count or offset as JSON gives it: an int (not a bool) in 0..2**63-1."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _check_length(head: bytes, size: int, name: str) -> int:
    """The header length the first 8 bytes give, checked to fit in a file of `size` bytes."""
    if len(head) < 8:
        raise FormatError(f"{name}: {size} bytes, shorter than a safetensors header length; the file is truncated")
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER:
        raise FormatError(f"{name}: safetensors header length {n} is over the {MAX_HEADER >> 20} MiB a header may "
                          "hold; the file is corrupt or crafted")
    if 8 + n > size:
        raise FormatError(f"{name}: safetensors header length {n} does not fit in {size} bytes; the file is corrupt")
    return n


def parse_header(buf, name: str = "safetensors buffer") -> tuple[dict, int]:
    """(header, data offset) of a safetensors buffer, with every bound checked; `name` is the file it came from."""
    mv = memoryview(buf).cast("B")
    n = _check_length(bytes(mv[:8]), mv.nbytes, name)
    try:
        header = jsontext.loads(mv[8 : 8 + n], serde=True)
    except (ValueError, RecursionError) as exc:
        if bytes(mv[8:11]) == jsontext.BOM:
            raise FormatError(f"{name}: safetensors header starts with a UTF-8 byte order mark (EF BB BF), which "
                              "safetensors refuses (a tool rewrote the header); copy the file again from where the "
                              "training job wrote it") from None
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:80]
        raise FormatError(f"{name}: safetensors header is not valid UTF-8 JSON, which safetensors refuses ({why}); "
                          "the file is corrupt") from None
    if not isinstance(header, dict):
        raise FormatError(f"{name}: safetensors header is a JSON {type(header).__name__}, not an object of tensors; "
                          f"{_CRAFTED}")
    if not _unicode(header):
        raise FormatError(f"{name}: safetensors header holds a lone surrogate (an escape such as \\ud800), which is "
                          f"not text and which safetensors refuses; {_CRAFTED}")
    return header, 8 + n


def _unicode(doc) -> bool:
    """Every string of a parsed header (keys too) is text: JSON's "\\ud800" escape parses to a lone surrogate that
    safetensors refuses and no terminal can print (the tensor names reach inspect's output)."""
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _entry(name: str, key: str, info) -> tuple[torch.dtype, list[int], int, int]:
    """(dtype, shape, start, end) of one header entry, each field checked as safetensors checks it."""
    where = f"{name}: tensor {quote(key)}"
    if not isinstance(info, dict):
        raise FormatError(f"{where} has a header entry that is not an object; {_CRAFTED}")
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    dtype = _DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise FormatError(f"{where} has dtype {str(code)[:40]!r}, not a whole-byte safetensors dtype (F32, BF16, "
                          f"I64, ...); {_CRAFTED}, or its dtype is one ckptbench does not read")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_whole(d) for d in shape):
        raise FormatError(f"{where} has shape {str(shape)[:60]}, not a list of at most {MAX_DIMS} whole numbers; "
                          f"{_CRAFTED}")
    if not holds_shape(shape):
        raise FormatError(f"{where} has shape {str(shape)[:60]}: more elements than a tensor can hold; {_CRAFTED}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o) for o in offsets):
        raise FormatError(f"{where} has data_offsets {str(offsets)[:60]}, not two whole numbers; {_CRAFTED}")
    start, end = offsets
    if start > end:
        raise FormatError(f"{where} has data_offsets [{start}, {end}], which run backwards; {_CRAFTED}")
    need = math.prod(shape) * dtype.itemsize
    if end - start != need:
        raise FormatError(f"{where} spans {end - start} bytes, its shape {shape} of {code} needs {need}; {_CRAFTED}")
    return dtype, shape, start, end


def tensor_entries(header: dict, data_len: int, name: str) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    """Every tensor of a parsed header, checked as safetensors checks a file: each entry well-formed, and the
    tensors, in offset order, tiling the data section exactly (no overlap, no gap, nothing past its end)."""
    _meta_types(header.get("__metadata__"), name)
    entries = {key: _entry(name, key, info) for key, info in header.items() if key != "__metadata__"}
    end = 0
    for key, (_, _, start, stop) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if start != end:
            what = "overlaps the tensor before it" if start < end else "leaves a gap before it"
            raise FormatError(f"{name}: tensor {quote(key)} starts at data byte {start}, expected {end}: it {what}; "
                              f"{_CRAFTED}")
        end = stop
    if end != data_len:
        raise FormatError(f"{name}: the tensors cover {end} of its {data_len} data bytes; the file is truncated, "
                          "padded or crafted")
    return entries


def _meta_types(meta, name: str) -> None:
    if meta is not None and (not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values())):
        raise FormatError(f"{name}: safetensors __metadata__ is not a map of strings; {_CRAFTED}")


def _meta(state: CheckpointState, meta, where: str) -> None:
    """Step and hyperparameters from the optimizer shard's metadata (a map of strings, as safetensors requires)."""
    bad = f"{where}: optimizer metadata is not valid; the shard was not written by a trainer we know"
    _meta_types(meta, where)
    try:
        doc = json.loads(meta.get("ckptbench_optimizer", "{}"))
    except (ValueError, RecursionError):
        raise FormatError(bad) from None
    if not isinstance(doc, dict):
        raise FormatError(bad)
    step, hparams, trainer = doc.get("step", meta.get("step", 0)), doc.get("hparams", {}), doc.get("trainer_state", {})
    if isinstance(step, str) and step.isascii() and step.isdigit() and len(step) < 19:
        step = int(step)
    if not _whole(step) or not all(isinstance(d, dict) and json_plain(d) for d in (hparams, trainer)):
        raise FormatError(bad)
    if "tuples" in doc:
        _as_tuples({"hparams": hparams, "trainer_state": trainer}, doc["tuples"], bad)
    state.step, state.hparams, state.trainer = step, hparams, trainer


def load_buffer(buf, name: str) -> CheckpointState:
    """Tensors straight over an in-memory shard (no copy): the fused pipeline reads each file once. The header
    is checked whole before any tensor is built, so every tensor lies inside the buffer and no two share bytes."""
    header, base = parse_header(buf, name)
    mv = memoryview(buf).cast("B")
    entries = tensor_entries(header, mv.nbytes - base, name)
    state = CheckpointState({})
    is_optim = os.path.basename(name).startswith("optimizer")
    prefix = layouts.model_prefix(os.path.basename(name))
    for key, (dtype, shape, start, end) in entries.items():
        count = math.prod(shape)
        flat = torch.frombuffer(mv, dtype=dtype, count=count, offset=base + start) if count else torch.empty(0, dtype=dtype)
        _add(state, prefix + key, flat.view(shape), is_optim)
    _meta(state, header.get("__metadata__") or {}, name)
    return state


def header_entries(path: str) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    """Every tensor of a shard file, (dtype, shape, start, end), from its header alone, checked as load_buffer
    checks it: the same one-line errors in every path, and a FIFO or device refused instead of opened."""
    return header_layout(path)[1]


def header_layout(path: str) -> tuple[bytes, dict[str, tuple[torch.dtype, list[int], int, int]]]:
    """(the file's first bytes up to its data section, header_entries): a tensor's bytes are the file's
    [len(head) + start, len(head) + end)."""
    with open_regular(path, "a safetensors shard") as (f, st):
        try:  # an unreadable file is named, as an unopenable one is (a bare OSError lost which file it was)
            head = f.read(8)
            _check_length(head, st.st_size, path)  # before reading: a crafted length must not size the read
            head += f.read(struct.unpack("<Q", head)[0])
        except OSError as exc:
            raise FormatError(f"{path}: cannot read its header ({exc.strerror or exc}); the file or its storage "
                              "is failing") from None
        header, base = parse_header(head, path)
    return head[:base], tensor_entries(header, st.st_size - base, path)


def load_file(path: str) -> CheckpointState:
    """Reads one shard into memory and loads it as a read buffer is, checked whole first (read_regular): safetensors'
    own loader maps the file by name, so a file truncated while in use killed the process (SIGBUS) on the copy,
    and one replaced after the header check was loaded unchecked."""
    return load_buffer(read_regular(path, "a safetensors shard"), path)
