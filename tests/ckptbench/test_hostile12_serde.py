"""A safetensors header is parsed as safetensors' serde_json parses it: Python's json took NaN, Infinity, numbers past
a double (1e400, a 400-digit integer) and nesting past serde_json's recursion limit; in a header field ckptbench does
not read, each restored ok a file safetensors refuses to open. Each is now the one line of a header that is not
JSON; what serde_json takes (1e308, 2**64, 127 levels) still loads. Each case is checked against safetensors itself."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from clirun import run_cli
from safetensors import safe_open
from safetensors.torch import save_file


def _with_field(tmp_path, literal: str) -> str:
    """A file safetensors wrote, its first tensor's header entry given one more field holding `literal`."""
    d = tmp_path / "ckpt"
    d.mkdir()
    path = d / "model.safetensors"
    save_file({"w": torch.ones(4)}, str(path))
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    text = json.dumps(header).replace('"data_offsets"', f'"x": {literal}, "data_offsets"', 1).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return str(d)


def _safetensors_opens(d: str) -> bool:
    try:
        with safe_open(f"{d}/model.safetensors", "pt") as f:
            f.get_tensor("w")
    except Exception:  # noqa: BLE001 - safetensors' own error type varies by version
        return False
    return True


@pytest.mark.parametrize("literal,why", [
    ("NaN", "NaN is not a JSON number"), ("-Infinity", "-Infinity is not a JSON number"),
    ("1e400", "number out of range"), ("1" + "0" * 400, "number out of range"),
    ("[" * 126 + "]" * 126, "nested deeper than 127 levels"),
], ids=["nan", "-infinity", "1e400", "int-400-digits", "nested-128"])
def test_what_serde_json_refuses_is_refused(tmp_path, literal, why):
    d = _with_field(tmp_path, literal)
    assert not _safetensors_opens(d)
    for cmd in ("load", "inspect"):
        r = run_cli(cmd, d)
        errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
        assert r.rc != 0 and "Traceback" not in r.err and len(errors) == 1, r.err
        assert "safetensors header is not valid UTF-8 JSON, which safetensors refuses" in errors[0] and why in errors[0]


@pytest.mark.parametrize("literal", ["1e308", str(2**64), "[" * 125 + "]" * 125, "0.1e-400"],
                         ids=["1e308", "2**64", "nested-127", "underflow"])
def test_what_serde_json_takes_still_loads(tmp_path, literal):
    d = _with_field(tmp_path, literal)
    assert _safetensors_opens(d)
    r = run_cli("load", d)
    assert r.rc == 0, r.err
