"""JSON a checkpoint holds, parsed as the libraries that read it parse it: UTF-8 text, no byte order mark.

json.loads given bytes guesses their encoding, and takes UTF-16, UTF-32 and a UTF-8 byte order mark; safetensors
(serde_json over the bytes) refuses all three, and transformers reads an index as UTF-8 text, where a BOM is no JSON.
A restore that parsed them would report a checkpoint the training job cannot resume from as restored. serde_json
(`serde=True`) also refuses what Python's json takes: NaN and Infinity, a number past a double (1e400), and nesting
deeper than its recursion limit; in a header field ckptbench does not read, each passed as a file safetensors refuses.
"""

from __future__ import annotations

import json
import math

BOM = b"\xef\xbb\xbf"
SERDE_DEPTH = 127  # levels of arrays and objects serde_json's default recursion limit lets through (128 fails)


def loads(raw: bytes, *, serde: bool = False) -> object:
    """The JSON document in `raw`; ValueError (json's, or UnicodeDecodeError) where it is not UTF-8 JSON, a byte
    order mark first included; RecursionError for nesting too deep, as json.loads. `serde`: as serde_json parses
    it (safetensors' header), also ValueError for the numbers and the nesting it refuses."""
    if bytes(raw[:3]) == BOM:
        raise ValueError("a UTF-8 byte order mark (EF BB BF) first")
    if b"\0" in bytes(raw[:4]):  # UTF-16 or -32 without a BOM decode as UTF-8 (NUL is valid), then fail as JSON
        raise ValueError("UTF-16 or UTF-32 (NUL bytes in its first four), not UTF-8")
    text = bytes(raw).decode("utf-8")
    if not serde:
        return json.loads(text)
    doc = json.loads(text, parse_constant=_constant, parse_float=_double, parse_int=_integer)
    _depth(doc)
    return doc


def _constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _double(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range ({text[:20]})")
    return v


def _integer(text: str) -> int:
    v = int(text)  # a u64 or i64, else serde_json reads it as a double: past one, out of range
    try:
        float(v)
    except OverflowError:
        raise ValueError(f"number out of range ({text[:20]}...)") from None
    return v


def _depth(doc) -> None:
    stack = [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > SERDE_DEPTH:
                raise ValueError(f"nested deeper than {SERDE_DEPTH} levels (serde_json's recursion limit)")
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))


def number(v) -> float | None:
    """`v` as a finite float where a parsed document gave a number (not a bool) a float holds; else None. JSON's and
    TOML's integers have no bound, and math.isfinite(10**400) raises OverflowError (a floor cache's measured_at, a
    rank's post, each a traceback once)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None
