"""JSON a checkpoint holds, parsed as the libraries that read it parse it: UTF-8 text, no byte order mark.

json.loads given bytes guesses their encoding, and takes UTF-16, UTF-32 and a UTF-8 byte order mark; safetensors
(serde_json over the bytes) refuses all three, and transformers reads an index as UTF-8 text, where a BOM is no JSON.
A restore that parsed them would report a checkpoint the training job cannot resume from as restored.
"""

from __future__ import annotations

import json

BOM = b"\xef\xbb\xbf"


def loads(raw: bytes) -> object:
    """The JSON document in `raw`; ValueError (json's, or UnicodeDecodeError) where it is not UTF-8 JSON, a byte
    order mark first included; RecursionError for nesting too deep, as json.loads."""
    if bytes(raw[:3]) == BOM:
        raise ValueError("a UTF-8 byte order mark (EF BB BF) first")
    return json.loads(bytes(raw).decode("utf-8"))
