"""Format readers: checkpoints written by plain torch / safetensors calls, and files that are corrupt or hostile."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import struct

import pytest
import torch
from safetensors.torch import save_file

from ckptbench.checkpoint.model import GPT
from ckptbench.checkpoint.profiles import ModelDims
from ckptbench.core.units import human_bytes

PLAIN_DIMS = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=64)


def _one_line(r, *needles):
    assert r.rc != 0
    assert "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error:"), r.err
    for n in needles:
        assert n in r.err_lines[0], r.err


# ---- written by plain library calls, not by gen --------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_safetensors(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain-st")
    g = torch.Generator().manual_seed(7)
    a = {"encoder.weight": torch.randn(32, 16, generator=g), "encoder.bias": torch.randn(32, generator=g)}
    b = {"decoder.weight": torch.randn(16, 32, generator=g).to(torch.bfloat16)}
    save_file(a, str(root / "part-1.safetensors"))
    save_file(b, str(root / "part-2.safetensors"))
    return root, {**a, **b}


def test_plain_safetensors_without_manifest_loads_with_structural_check(h, plain_safetensors):
    root, tensors = plain_safetensors
    before = h.snapshot(root)
    r = h.run_cli("load", root, "--json")
    assert r.rc == 0, r.err
    out = json.loads(r.out)
    assert out["format"] == "safetensors"
    assert out["ok"] is True and out["structural_only"] is True and out["verified"] is False
    assert out["param_count"] == sum(t.numel() for t in tensors.values()) == 32 * 16 + 32 + 16 * 32
    assert h.snapshot(root) == before and not os.path.exists(root / h.MANIFEST)


def test_plain_safetensors_with_non_finite_values_fails_structural_check(h, tmp_path):
    save_file({"w": torch.tensor([1.0, float("nan"), 2.0])}, str(tmp_path / "m.safetensors"))
    r = h.run_cli("load", tmp_path, "--json")
    assert r.rc == 1
    out = json.loads(r.out)
    assert out["ok"] is False and any("w" in p and "non-finite" in p for p in out["problems"])


def test_verify_without_manifest_says_there_is_no_reference(h, plain_safetensors):
    root, _ = plain_safetensors
    r = h.run_cli("verify", root)
    assert r.rc == 3, r.err  # nothing to check against: neither a pass (0) nor a mismatch (1)
    assert "no manifest" in r.out and "no reference" in r.out and r.out.splitlines()[-1].startswith("NOT VERIFIED")
    nbytes = sum(os.path.getsize(p) for p in root.glob("*.safetensors"))  # a few KiB: it read "0.0 MiB"
    assert f": 2 files, {human_bytes(nbytes)}, 0 problem(s)" in r.out.splitlines()[-1], r.out
    j = h.run_cli("verify", root, "--json")
    doc = json.loads(j.out)
    assert doc["has_reference"] is False and doc["ok"] is True and doc["verified"] is False and doc["files"] == 2
    for rel, data in h.files_under(root).items():
        assert doc["digests"][rel] == h.crc32c_hex(data)


@pytest.fixture(scope="module")
def plain_gpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain-gpt")
    dims = ModelDims(PLAIN_DIMS["n_layer"], PLAIN_DIMS["n_embd"], PLAIN_DIMS["n_head"], PLAIN_DIMS["vocab_size"],
                     PLAIN_DIMS["n_positions"])
    torch.manual_seed(0)
    model = GPT(dims)
    torch.save(model.state_dict(), str(root / "pytorch_model.bin"))
    (root / "config.json").write_text(json.dumps({**PLAIN_DIMS, "architectures": ["GPT"]}))
    return root, model


def test_plain_torch_gpt_with_config_passes_full_check(h, plain_gpt):
    root, model = plain_gpt
    r = h.run_cli("load", root, "--json")
    assert r.rc == 0, r.err
    out = json.loads(r.out)
    assert out["format"] == "torch" and out["ok"] is True and out["problems"] == []
    assert out["param_count"] == sum(p.numel() for p in model.parameters())
    assert out["param_count"] == h.gpt_param_count(2, 64, 4, 300, 64)
    assert out["dtypes"] == {"weights": "float32"}
    assert out["finite_output"] is True  # the model was built and ran a forward step ...
    assert out["structural_only"] is False  # ... so this was the full check, not the structural one


def test_plain_torch_gpt_with_wrong_config_is_refused(h, plain_gpt, tmp_path):
    """The full check really builds the model from config.json: a config that does not fit fails."""
    root, _ = plain_gpt
    bad = tmp_path / "bad"
    h.copy_ckpt(root, bad)
    (bad / "config.json").write_text(json.dumps({**PLAIN_DIMS, "n_embd": 128, "n_head": 4}))
    r = h.run_cli("load", bad, "--json")
    _one_line(r, "does not fit the model")
    assert r.out == ""


# ---- corrupt safetensors --------------------------------------------------------------------------------------


def test_safetensors_header_length_corrupt_names_the_file(h, ckpt, tmp_path):
    """The manifest is made to agree with the corrupt bytes, so the loader itself meets them."""
    root = h.copy_ckpt(ckpt("safetensors", 4), tmp_path / "ck")
    rel = "model-00002-of-00004.safetensors"
    path = os.path.join(root, rel)
    data = bytearray(open(path, "rb").read())
    data[:8] = struct.pack("<Q", len(data) * 4)  # a header longer than the file
    open(path, "wb").write(bytes(data))
    h.refresh_manifest_entry(root, rel)
    assert h.run_cli("verify", root).rc == 0  # the manifest now agrees: only the loader can catch it
    r = h.run_cli("load", root)
    _one_line(r, rel)
    assert r.rc == 2


def test_safetensors_header_json_corrupt_with_no_verify(h, ckpt, tmp_path):
    root = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "ck")
    rel = "optimizer-00001-of-00001.safetensors"
    path = os.path.join(root, rel)
    data = bytearray(open(path, "rb").read())
    assert data[8:9] == b"{"
    data[8] = ord("[")
    open(path, "wb").write(bytes(data))
    r = h.run_cli("load", root, "--no-verify")
    _one_line(r, rel, "corrupt")


def test_safetensors_parse_header_bounds():
    from ckptbench.checkpoint.formats import FormatError
    from ckptbench.checkpoint.formats.safetensors_format import parse_header

    header = json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    good = struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0)
    doc, base = parse_header(good)
    assert base == 8 + len(header) and doc["t"]["shape"] == [2]
    with pytest.raises(FormatError):
        parse_header(good[:5])
    with pytest.raises(FormatError):
        parse_header(struct.pack("<Q", 1 << 40) + header)
    with pytest.raises(FormatError):
        parse_header(struct.pack("<Q", len(header)) + b"x" * len(header))


# ---- hostile pickle ---------------------------------------------------------------------------------------------


class RunsCode:
    """Unpickling this calls os.system: a torch file that would run code when loaded unsafely."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def _hostile_bytes(marker: str, tmp_path) -> bytes:
    path = tmp_path / "hostile.pt"
    torch.save({"wte.weight": torch.ones(2, 2), "payload": RunsCode(marker)}, str(path))
    return path.read_bytes()


def test_hostile_payload_really_runs_when_unpickled_unsafely(tmp_path):
    """The control: the payload used below does run code when loaded without weights_only."""
    marker = tmp_path / "ran"
    data = _hostile_bytes(str(marker), tmp_path)
    torch.load(str(tmp_path / "hostile.pt"), weights_only=False)
    assert marker.exists()
    assert data


def test_torch_checkpoint_with_code_running_pickle_is_refused(h, ckpt, tmp_path):
    root = h.copy_ckpt(ckpt("torch", 4), tmp_path / "ck")
    marker = tmp_path / "MARKER-code-ran"
    rel = "model_rank001.pt"
    open(os.path.join(root, rel), "wb").write(_hostile_bytes(str(marker), tmp_path))
    h.refresh_manifest_entry(root, rel)  # the manifest agrees: the loader must refuse on content
    assert h.run_cli("verify", root).rc == 0
    r = h.run_cli("load", root, "--optimizer-step")
    _one_line(r, rel, "refused")
    assert r.rc == 2
    assert not marker.exists()
    rp = h.run_proc("load", root, "--no-verify")
    _one_line(rp, rel, "refused")
    assert not marker.exists()


def test_torch_buffer_loader_refuses_code_running_pickle(tmp_path):
    from ckptbench.checkpoint.formats import FormatError
    from ckptbench.checkpoint.formats.torch_format import load_buffer

    marker = tmp_path / "MARKER"
    data = _hostile_bytes(str(marker), tmp_path)
    with pytest.raises(FormatError, match="refused"):
        load_buffer(data, "shard.pt")  # read-only bytes: the copying path
    with pytest.raises(FormatError, match="refused"):
        load_buffer(bytearray(data), "shard.pt")  # a writable read buffer: loaded in place
    assert not marker.exists()


def test_torch_buffer_loader_reports_a_truncated_shard(tmp_path):
    from ckptbench.checkpoint.formats import FormatError
    from ckptbench.checkpoint.formats.torch_format import load_buffer

    path = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, str(path))
    data = path.read_bytes()
    for buf in (data[: len(data) // 2], bytearray(data[: len(data) // 2])):
        with pytest.raises(FormatError, match="corrupt or truncated"):
            load_buffer(buf, "shard.pt")


def test_dcp_metadata_with_code_running_pickle_is_refused(h, ckpt, tmp_path):
    """DCP's .metadata is a pickle too: a crafted one must be refused, not unpickled."""
    root = h.copy_ckpt(ckpt("dcp", 1), tmp_path / "ck")
    marker = tmp_path / "MARKER-dcp-code-ran"
    with open(os.path.join(root, ".metadata"), "wb") as f:
        pickle.dump(RunsCode(str(marker)), f)
    h.refresh_manifest_entry(root, ".metadata")
    r = h.run_cli("load", root)
    _one_line(r, "refused")
    assert r.rc == 2
    assert not marker.exists()
    control = tmp_path / "control"  # the same payload does run code under plain pickle
    pickle.loads(pickle.dumps(RunsCode(str(control))))
    assert control.exists()


def test_torch_file_that_is_not_a_dict_is_refused(h, ckpt, tmp_path):
    root = h.copy_ckpt(ckpt("torch", 1), tmp_path / "ck")
    rel = "model_rank000.pt"
    torch.save([torch.ones(3)], os.path.join(root, rel))
    r = h.run_cli("load", root, "--no-verify")
    _one_line(r, rel, "not a state dict")


# ---- truncated shards, every format -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt, rel", [("safetensors", "model-00003-of-00004.safetensors"),
                                      ("torch", "optim_rank002.pt"),
                                      ("dcp", "__0_2.distcp")])
def test_truncated_shard_with_no_verify_is_one_line(h, ckpt, tmp_path, fmt, rel):
    """With verification off, the format reader meets the truncation: a clean one-line error, as a user sees it."""
    root = h.copy_ckpt(ckpt(fmt, 4), tmp_path / "ck")
    path = os.path.join(root, rel)
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    r = h.run_proc("load", root, "--no-verify")
    _one_line(r)
    assert r.rc == 2
    assert rel in r.err_lines[0] or root in r.err_lines[0]
