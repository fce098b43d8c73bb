"""A Hugging Face Trainer's trainer_state.json: the state its resume reads back beside the weights and optimizer
(TrainerState.load_from_json: the global step it skips the data to, the epoch, the best metric and checkpoint, the
log history, the stateful callbacks' state), restored under `trainer_state.` as the file holds it. A file that
resume cannot parse is refused here, as it fails there; one it parses is restored whatever its keys (which keys a
TrainerState takes is the installed transformers' business, not the checkpoint's)."""

from __future__ import annotations

import json

from ckptbench.checkpoint.formats.state import CheckpointState, FormatError, flatten, read_regular

NAME = "trainer_state.json"
PREFIX = "trainer_state"
_FIX = "a Trainer's resume fails reading it: re-copy the checkpoint"


def load_file(path: str) -> CheckpointState:
    return load_buffer(read_regular(path, "a Trainer's state"), path)


def load_buffer(buf, where: str) -> CheckpointState:
    """The JSON object, flattened into `extra` (flatten's bounds on depth and key length hold): transformers reads
    the file as UTF-8 text and builds its state from the object's keys."""
    try:
        text = bytes(buf).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{where}: byte {exc.start} is not UTF-8 text; {_FIX}") from None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise FormatError(f"{where}: nested deeper than JSON parsers follow; {_FIX}") from None
    except ValueError as exc:  # JSONDecodeError, or an integer past Python's digit limit
        at = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise FormatError(f"{where}: not JSON ({getattr(exc, 'msg', None) or exc}{at}); {_FIX}") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: holds a JSON {type(obj).__name__}, not the object a Trainer's state is built "
                          f"from; {_FIX}")
    state = CheckpointState({})
    flat = state.extra
    try:
        for key, leaf in flatten(obj, PREFIX):
            # {"a.b": 1, "a": {"b": 2}} is two values to a resume, one flat key here: the later silently won
            if key in flat:
                raise FormatError(f"{key[len(PREFIX) + 1:][:80]!r}: two of its values have this name once nested "
                                  "keys are joined with dots (a key holding a dot, or an empty one, beside a nested "
                                  "key), and a restore keeps only one; rename one of them in the file")
            flat[key] = leaf
    except FormatError as exc:  # nested past MAX_DEPTH: the key it reached, and here, the file
        raise FormatError(f"{where}: {exc}") from None
    return state
