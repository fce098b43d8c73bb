"""Hostile input, ninth round: what the earlier rounds left in newer or less-travelled places. Each input is made by
the real library and then crafted; bad input is one line naming what and where and a non-zero exit, or is read as
far as it is plain data, never a traceback."""

from __future__ import annotations

import torch
from clirun import run_cli


def _trained(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return model, opt.state_dict()


def test_save_carries_param_groups_keyed_by_any_name(tmp_path):
    """save SOURCE orders a torch.save'd optimizer's param_groups by their numbers: groups saved as a dict with a key
    '²' (isdigit() holds, int() raises) were a ValueError traceback out of carry. A key that is no list index is
    carried as a group after the numbered ones."""
    model, sd = _trained()
    sd["param_groups"] = {"0": sd["param_groups"][0], "\u00b2": {"lr": 1.0}, "9" * 5000: {"lr": 2.0}}
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": sd, "epoch": 1}, src / "checkpoint.pt")
    r = run_cli("save", src, tmp_path / "t", "--count", "1", "--results", "")
    assert r.rc == 0 and "Traceback" not in r.err, r.err
    assert "optimizer state optimizer.state.* of 4 parameter(s) saved" in r.out + r.err
