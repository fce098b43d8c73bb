"""Hostile input, eleventh round: JSON a checkpoint holds in an encoding its readers refuse. json.loads given bytes
guesses the encoding and takes a UTF-8 byte order mark, UTF-16 and UTF-32; safetensors and transformers do not, so
the restore said ok of a checkpoint the training job cannot load."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from clirun import assert_one_line_error, run_cli
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

ENCODINGS = {"bom": lambda text: b"\xef\xbb\xbf" + text.encode(), "utf-16": lambda text: text.encode("utf-16"),
             "utf-32-le": lambda text: text.encode("utf-32-le")}


def _reencoded(path, encode) -> None:
    """The safetensors file at `path` with its header re-encoded (padded to 8 bytes; the data offsets are relative
    to the header's end, so they still hold)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = encode(raw[8:8 + n].decode().rstrip(" "))
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n:])


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("cmd", ["inspect", "run"])
def test_a_safetensors_header_safetensors_refuses_is_one_line(tmp_path, encoding, cmd):
    d = tmp_path / "ck"
    d.mkdir()
    save_file({"w": torch.ones(4, 4)}, str(d / "model.safetensors"))
    _reencoded(d / "model.safetensors", ENCODINGS[encoding])
    with pytest.raises(SafetensorError):  # the library itself: what a resume meets
        load_file(str(d / "model.safetensors"))
    extra = ("--repeat", "1", "--results", str(tmp_path / "R.csv")) if cmd == "run" else ()
    r = run_cli(cmd, d, *extra)
    want = "byte order mark (EF BB BF), which safetensors refuses" if encoding == "bom" else \
        "not valid UTF-8 JSON, which safetensors refuses"
    assert_one_line_error(r, want)


def test_a_safetensors_index_with_a_byte_order_mark_is_one_line(tmp_path):
    """transformers reads the index as UTF-8 text, where a BOM is no JSON: its load fails, so the restore does too."""
    d = tmp_path / "ck"
    d.mkdir()
    save_file({"a": torch.ones(2)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(2)}, str(d / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(index).encode())
    with pytest.raises(ValueError):
        json.loads((d / "model.safetensors.index.json").read_text(encoding="utf-8"))  # as transformers reads it
    r = run_cli("run", d, "--repeat", "1", "--results", str(tmp_path / "R.csv"))
    assert_one_line_error(r, "model.safetensors.index.json")
    assert "UTF-8" in r.err


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_a_manifest_in_another_encoding_is_one_line(tmp_path, h, ckpt, encoding):
    """ckptbench writes its manifest as UTF-8 JSON; json.loads of the bytes took it re-encoded (a BOM, UTF-16, -32),
    so a manifest rewritten elsewhere passed as the one ckptbench wrote."""
    d = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "ck")
    doc = h.read_manifest(d)
    (tmp_path / "ck" / h.MANIFEST).write_bytes(ENCODINGS[encoding](json.dumps(doc)))
    r = run_cli("verify", d)
    assert_one_line_error(r, h.MANIFEST)
    assert ("byte order mark" if encoding == "bom" else "utf-8") in r.err.lower()
    h.write_manifest(d, doc)  # the same manifest as UTF-8: verified
    assert run_cli("verify", d).rc == 0


def test_a_config_json_with_a_byte_order_mark_gives_no_model_shape():
    """transformers reads a config.json as UTF-8 text, where a BOM is no JSON (its load of the file fails): the shape
    it would give is not taken from it."""
    from ckptbench.restore import load

    cfg = json.dumps({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 300, "n_positions": 64})
    with pytest.raises(ValueError):
        json.loads((b"\xef\xbb\xbf" + cfg.encode()).decode("utf-8"))  # as transformers reads it
    assert load.dims_of(None, {"config.json": cfg.encode()}).layers == 2
    for encode in ENCODINGS.values():
        assert load.dims_of(None, {"config.json": encode(cfg)}) is None
