"""inspect counted an RNG state's elements as entries of the checkpoint: a Trainer's rng_state_N.pth was 631
non-tensor entries (Python's 625-int tuple, numpy's counters; numpy's key array in no count at all). An RNG state is
one 'other' entry now, as the restore holds it (group_of: other), and torch's RNG tensor stays an 'other' tensor."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from clirun import run_cli

from ckptbench.checkpoint.formats.state import rng_state_of

RNG = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures", "trainer_fsdp_sharded", "checkpoint-2",
                   "rng_state_0.pth")


def _doc(d) -> dict:
    r = run_cli("inspect", d, "--json")
    assert r.rc == 0, r.err
    return json.loads(r.out)


def test_a_trainers_rng_state_file_is_a_few_states_not_hundreds_of_entries(tmp_path):
    torch.save({"w": torch.ones(3, 3)}, tmp_path / "model.pt")
    shutil.copy(RNG, tmp_path / "rng_state_0.pth")
    held = torch.load(RNG, weights_only=False)
    doc = _doc(tmp_path)
    states = [k for k, v in held.items() if not isinstance(v, torch.Tensor)]  # python, numpy
    assert doc["layout"]["other_entries"] == len(states), doc["layout"]["other_entries"]
    assert {t["name"]: t["group"] for t in doc["tensors"]} == {"w": "model", "rng_state_0.cpu": "other"}


def test_a_loops_numpy_state_is_one_entry_and_other_values_count_each(tmp_path):
    torch.save({"model": {"w": torch.ones(2)}, "numpy_rng_state": np.random.get_state(), "steps": [1, 2, 3]},
               tmp_path / "checkpoint.pt")
    assert _doc(tmp_path)["layout"]["other_entries"] == 1 + 3


@pytest.mark.parametrize("key, state", [("rng_state_0.python.1.17", "rng_state_0.python"),
                                        ("rng_state_0.numpy.1", "rng_state_0.numpy"),
                                        ("numpy_rng_state.1", "numpy_rng_state"),
                                        ("optimizer.state.0.exp_avg", None), ("strng.weight", None)])
def test_rng_state_of(key, state):
    assert rng_state_of(key) == state
