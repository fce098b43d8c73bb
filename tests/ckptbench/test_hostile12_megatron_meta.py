"""Megatron's metadata.json is read as megatron-core reads it (json.load of the file opened as UTF-8 text): one that
names the torch_dist backend behind a byte order mark or in UTF-16 parsed with json.loads of bytes, so the restore
said ok of an iteration whose Megatron load fails. Now one line naming the file; the file as written still loads."""

from __future__ import annotations

import codecs
import os
import shutil

import pytest
from clirun import run_cli

MEGATRON = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures", "megatron_torch_dist", "iter_0000005")


@pytest.mark.parametrize("encode", [lambda t: codecs.BOM_UTF8 + t, lambda t: t.decode().encode("utf-16")],
                         ids=["utf8-bom", "utf16"])
def test_a_metadata_json_megatron_cannot_read_is_refused(tmp_path, encode):
    import json

    d = tmp_path / "iter_0000005"
    shutil.copytree(MEGATRON, d)
    raw = encode((d / "metadata.json").read_bytes())
    (d / "metadata.json").write_bytes(raw)
    with pytest.raises(ValueError):  # as megatron-core's maybe_load_config reads it
        with open(d / "metadata.json", encoding="utf-8") as f:
            json.load(f)
    for cmd in (("load",), ("run", "--repeat", "1", "--results", "")):
        r = run_cli(*cmd[:1], d, *cmd[1:])
        errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
        assert r.rc != 0 and "Traceback" not in r.err and len(errors) == 1, r.err
        assert "metadata.json: names the torch_dist backend behind a byte order mark or in UTF-16/32" in errors[0]


def test_a_metadata_json_naming_another_backend_is_not_megatrons(tmp_path):
    d = tmp_path / "iter_0000005"
    shutil.copytree(MEGATRON, d)
    assert run_cli("load", d).rc == 0
    (d / "metadata.json").write_bytes(codecs.BOM_UTF8 + b'{"sharded_backend": "zarr"}')
    assert run_cli("load", d).rc == 0  # not a torch_dist save whatever the encoding: read as plain DCP, as before
