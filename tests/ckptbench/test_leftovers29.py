"""Leftovers from earlier passes, each found with a real checkpoint and then fixed."""

from __future__ import annotations

import dataclasses
import os
import pickle

import torch

from ckptbench.checkpoint.formats import FormatError, dcp_format
from ckptbench.checkpoint.quote import quote


def test_an_offset_past_any_file_is_named_by_its_length_not_as_an_int(tmp_path, h):
    """A DCP storage entry whose offset is 10**400 was refused as `offset <a int>`: the line did not say what was
    wrong with the number. It now gives its length, as it does for every number too long to print whole."""
    directory, meta = h.dcp_saved(tmp_path / "ck", {"w": torch.randn(4, 4)})
    key = next(iter(meta.storage_data))
    meta.storage_data[key] = dataclasses.replace(meta.storage_data[key], offset=10 ** 400)
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    try:
        dcp_format.load_dir(directory)
    except FormatError as exc:
        assert "offset <an int of about 401 digits>" in str(exc), exc
    else:
        raise AssertionError("an offset of 10**400 was taken")
    r = h.run_cli("inspect", directory)
    assert r.rc != 0 and len(r.err_lines) == 1 and "401 digits" in r.err, r.err
    assert quote(-(10 ** 300)) == "<an int of about 301 digits>" and quote(2 ** 255) == repr(2 ** 255)
