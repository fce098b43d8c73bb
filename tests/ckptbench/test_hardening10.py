"""Hostile input, tenth round. Each input is made by the real library (torch.save, safetensors, DCP) and then
crafted where it must be; bad input is one line naming what and where and a non-zero exit, never a traceback."""

from __future__ import annotations

import warnings

import pytest
import torch
from clirun import assert_one_line_error, run_cli


@pytest.mark.parametrize("cmd", ["inspect", "load", "run"])
def test_dcp_quantized_tensor_is_one_line(tmp_path, h, cmd):
    """DCP saves a quantized tensor with only its dtype in the metadata (no scale or zero point): the empty tensor
    allocated for it had no quantizer, and its first narrow was torch's INTERNAL ASSERT as a traceback out of
    load (run wrapped it as 'could not be loaded')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 0, torch.qint8)
    src, _ = h.dcp_saved(tmp_path / "q", {"model": {"w": torch.randn(2, 2)}, "q": q})
    extra = ("--repeat", "1", "--results", "") if cmd == "run" else ()
    r = run_cli(cmd, src, *extra)
    assert_one_line_error(r, "entry 'q' is a torch.qint8 tensor")
