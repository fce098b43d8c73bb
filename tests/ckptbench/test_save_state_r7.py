"""save SOURCE, new-user round 7: a training loop's torch.save ({model, optimizer (AdamW), lr_scheduler, epoch,
global_step}) is saved whole enough to resume: the optimizer's hyper-parameters, the scheduler's state, epoch and
global_step come back from every format, read by ckptbench and by the tools a user would reach for, and the manifest's
step is the one the save's note names. Non-tensor values beyond plain data are named in one note, never unpickled."""

from __future__ import annotations

import copy
import io
import json
import os

import numpy as np
import pytest
import torch
from clirun import run_cli

from ckptbench.restore.load import load_state


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _train(model, opt, sched, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 8, generator=g)).square().sum().backward()
        opt.step()
        sched.step()


def _loop(model):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-7)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The checkpoint on disk and the live objects it was saved from."""
    where = tmp_path_factory.mktemp("r7src")
    model = _model()
    opt, sched = _loop(model)
    _train(model, opt, sched, 3, seed=1)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict(),
                "epoch": 2, "global_step": 3}, where / "checkpoint.pt")
    return str(where), model, opt, sched


def _plain(x):
    """Tuples as lists: JSON, and the flat keys the safe reader gives, keep no tuples (torch takes either)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _save(source_dir, tmp_path, fmt: str) -> tuple[str, dict]:
    target = tmp_path / f"t-{fmt}"
    r = run_cli("save", source_dir, target, "--count", "1", "--format", fmt, "--json",
                "--results", tmp_path / "r.csv")
    assert r.rc == 0, r.err
    return str(target / "step-000001"), json.loads(r.out)


def _user_read(step: str, fmt: str) -> tuple[dict, dict, int, dict, dict]:
    """(weights, optimizer state by weight name, step, hparams, trainer state) read the way a user of the format
    does, without ckptbench."""
    if fmt == "torch":
        model = torch.load(os.path.join(step, "model_rank000.pt"), weights_only=True)
        optim = torch.load(os.path.join(step, "optim_rank000.pt"), weights_only=True)
        return model, optim["state"], optim["step"], optim["hparams"], optim["trainer_state"]
    if fmt == "safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        model = load_file(os.path.join(step, "model-00001-of-00001.safetensors"))
        path = os.path.join(step, "optimizer-00001-of-00001.safetensors")
        doc = json.loads(safe_open(path, "pt").metadata()["ckptbench_optimizer"])
        state: dict = {}
        for key, t in load_file(path).items():
            name, part = key.rsplit(".", 1)
            state.setdefault(name, {})[part] = t
        return model, state, doc["step"], doc["hparams"], doc["trainer_state"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = os.path.join(os.path.dirname(step), "whole.pt")
    dcp_to_torch_save(step, out)
    sd = torch.load(out, weights_only=True)
    return sd["model"], sd["optim"], int(sd["step"]), sd["hparams"], sd["trainer_state"]


def _resume(weights, state, step, hparams, trainer):
    """A fresh model, optimizer and scheduler loaded from what was read: the way a training loop resumes."""
    model = _model()
    model.load_state_dict(weights)
    names = [n for n, _ in model.named_parameters()]
    opt, sched = _loop(model)
    groups = [g | {"params": [names.index(n) for n in g["params"]]} for g in hparams["param_groups"]]
    opt.load_state_dict({"state": {names.index(n): parts | {"step": torch.tensor(float(step))}
                                   for n, parts in state.items()}, "param_groups": groups})
    sched.load_state_dict(trainer["lr_scheduler"])
    return model, opt, sched


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "dcp"])
def test_a_training_loops_checkpoint_saves_whole_and_resumes_the_same(source, tmp_path, fmt):
    source_dir, model, opt, sched = source
    step, doc = _save(source_dir, tmp_path, fmt)
    with open(os.path.join(step, "ckptbench.json")) as f:
        assert json.load(f)["step"] == 3  # the note's: the optimizer's step (global_step 3 too)
    assert any("their step (3) is the save's step" in n for n in doc["notes"]), doc["notes"]
    assert not any("NOT saved" in n for n in doc["notes"]), doc["notes"]
    want_groups = _plain(opt.state_dict()["param_groups"])
    names = [n for n, _ in model.named_parameters()]
    for g in want_groups:
        g["params"] = [names[i] for i in g["params"]]

    ours = load_state(step, fmt)  # ckptbench's own load path (run, load, inspect)
    assert ours.step == 3 and ours.trainer["epoch"] == 2 and ours.trainer["global_step"] == 3
    assert _plain(ours.hparams["param_groups"]) == want_groups
    assert _plain(ours.trainer["lr_scheduler"]) == _plain(sched.state_dict())
    for n, t in model.state_dict().items():
        assert torch.equal(ours.model[n], t), n
    for i, n in enumerate(names):
        for part in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(ours.optim[n][part], opt.state_dict()["state"][i][part]), (n, part)

    read = _user_read(step, fmt)
    assert read[2] == 3 and read[4]["epoch"] == 2 and read[4]["global_step"] == 3
    assert _plain(read[3]["param_groups"]) == want_groups
    assert _plain(read[4]["lr_scheduler"]) == _plain(sched.state_dict())
    for n, t in model.state_dict().items():
        assert torch.equal(read[0][n], t), n
    # the resume is the same training state: two more steps from either give bit-equal weights and learning rates
    resumed, ropt, rsched = _resume(*read)
    live = copy.deepcopy(model)
    lopt, lsched = _loop(live)
    lopt.load_state_dict(copy.deepcopy(opt.state_dict()))  # the module's objects stay as saved for the next format
    lsched.load_state_dict(sched.state_dict())
    _train(live, lopt, lsched, 2, seed=7)
    _train(resumed, ropt, rsched, 2, seed=7)
    for (n, a), b in zip(live.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), n
    assert rsched.get_last_lr() == lsched.get_last_lr()


def test_the_save_runs_and_saves_again_with_its_state(source, tmp_path):
    """ckptbench's run path reads the save, and a save of the save carries the same state on."""
    step, _ = _save(source[0], tmp_path, "torch")
    r = run_cli("run", step, "--repeat", "1", "--results", tmp_path / "run.csv")
    assert r.rc == 0, r.err
    again = tmp_path / "again"
    r = run_cli("save", step, again, "--count", "1", "--format", "safetensors")
    assert r.rc == 0, r.err
    first, second = load_state(step, "torch"), load_state(str(again / "step-000001"), "safetensors")
    assert (second.step, _plain(second.hparams), second.trainer) == (first.step, _plain(first.hparams),
                                                                     _plain(first.trainer))


def test_values_beyond_plain_data_are_named_in_one_note_not_unpickled(tmp_path):
    model = _model()
    opt, sched = _loop(model)
    _train(model, opt, sched, 1, seed=1)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 1,
                "np_state": np.arange(3), "phase": 1 + 2j}, buf)
    src = tmp_path / "src"
    src.mkdir()
    (src / "checkpoint.pt").write_bytes(buf.getvalue())
    step, doc = _save(str(src), tmp_path, "torch")
    notes = [n for n in doc["notes"] if "non-tensor value(s) NOT saved" in n]
    assert len(notes) == 1 and notes[0].startswith("2 non-tensor value(s) NOT saved (e.g. np_state: a numpy"), notes
    saved = load_state(step, "torch")
    assert saved.trainer == {"epoch": 1}


def test_tuples_come_back_as_tuples_and_the_optimizer_steps_on_them(source, tmp_path):
    """Adam's betas are a tuple in its param_groups: the flat keys the safe reader gives made them a list."""
    source_dir, model, _, _ = source
    step, _ = _save(source_dir, tmp_path, "torch")
    saved = load_state(step, "torch")
    group = saved.hparams["param_groups"][0]
    assert group["betas"] == (0.9, 0.95) and type(group["betas"]) is tuple
    resumed, ropt, _ = _resume(*_user_read(step, "torch"))
    assert type(ropt.param_groups[0]["betas"]) is tuple
    _train(resumed, ropt, torch.optim.lr_scheduler.StepLR(ropt, step_size=2), 1, seed=3)  # it steps on them


@pytest.mark.parametrize("fmt", ["torch", "dcp"])
def test_rng_states_are_carried_and_reseed_the_same(tmp_path, fmt):
    """torch's, numpy's and Python's RNG states beside the weights (a loop's cpu_rng_state, numpy_rng_state,
    python_rng_state) come back as each RNG's set_state takes them: the next draws are the source's."""
    import random

    model = _model()
    opt, _ = _loop(model)
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    want = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 1,
                "cpu_rng_state": torch.get_rng_state(), "numpy_rng_state": np.random.get_state(),
                "python_rng_state": random.getstate()}, src / "checkpoint.pt")
    step, doc = _save(str(src), tmp_path, fmt)
    assert not any("NOT saved" in n or "not saved" in n for n in doc["notes"]), doc["notes"]
    trainer = load_state(step, fmt).trainer if fmt == "dcp" else \
        torch.load(os.path.join(step, "optim_rank000.pt"), weights_only=True)["trainer_state"]  # as a user reads it
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    torch.set_rng_state(trainer["cpu_rng_state"])
    np.random.set_state(trainer["numpy_rng_state"])
    random.setstate(trainer["python_rng_state"])
    got = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    assert torch.equal(got[0], want[0]) and (got[1] == want[1]).all() and got[2] == want[2]
    again = tmp_path / "again"  # and a save of the save carries them on
    r = run_cli("save", step, again, "--count", "1", "--format", fmt)
    assert r.rc == 0, r.err
    assert torch.equal(load_state(str(again / "step-000001"), fmt).trainer["cpu_rng_state"], trainer["cpu_rng_state"])


def test_safetensors_save_gives_back_pythons_rng_state_as_the_tuple_setstate_takes(tmp_path):
    """JSON writes tuples as lists: the safetensors save's Python RNG state (and Adam's betas) came back as lists,
    and random.setstate refuses a list. Read back by ckptbench, and by a save of that save, they are tuples again."""
    import random

    model = _model()
    opt, sched = _loop(model)
    _train(model, opt, sched, 1, seed=1)
    random.seed(7), np.random.seed(6)
    want = random.getstate(), np.random.get_state()
    draws = [random.random() for _ in range(3)], np.random.rand(3)
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "python_rng_state": want[0],
                "numpy_rng_state": want[1]}, src / "checkpoint.pt")
    step, _ = _save(str(src), tmp_path, "safetensors")
    again = tmp_path / "again"
    r = run_cli("save", step, again, "--count", "1", "--format", "safetensors")
    assert r.rc == 0, r.err
    for saved in (load_state(step, "safetensors"), load_state(str(again / "step-000001"), "safetensors")):
        state = saved.trainer["python_rng_state"]
        assert type(state) is tuple and type(state[1]) is tuple and state == want[0]
        assert type(saved.hparams["param_groups"][0]["betas"]) is tuple
        random.seed(0), np.random.seed(0)
        random.setstate(state)  # as a resume calls it, no tuple() around it
        np.random.set_state(saved.trainer["numpy_rng_state"])
        assert [random.random() for _ in range(3)] == draws[0] and (np.random.rand(3) == draws[1]).all()


@pytest.mark.parametrize("tuples", [["trainer_state", "python_rng_state"], [["trainer_state", "nowhere"]],
                                    [["trainer_state", "python_rng_state", 7]], [["step"]], [[]]])
def test_a_crafted_tuples_list_in_safetensors_metadata_is_one_line(tmp_path, tuples):
    """The paths a reader turns back into tuples come from the file: one that names no list is refused, not a
    KeyError or IndexError."""
    from safetensors.torch import save_file

    from ckptbench.checkpoint.formats import safetensors_format
    from ckptbench.checkpoint.formats.state import FormatError

    path = str(tmp_path / "optimizer-00001-of-00001.safetensors")
    doc = {"step": 1, "hparams": {}, "trainer_state": {"python_rng_state": [3, [1, 2], None]}, "tuples": tuples}
    save_file({"w.exp_avg": torch.zeros(2)}, path, metadata={"ckptbench_optimizer": json.dumps(doc)})
    with pytest.raises(FormatError, match="optimizer metadata is not valid"):
        safetensors_format.load_file(path)
    doc["tuples"] = [["trainer_state", "python_rng_state", 1], ["trainer_state", "python_rng_state"]]
    save_file({"w.exp_avg": torch.zeros(2)}, path, metadata={"ckptbench_optimizer": json.dumps(doc)})
    assert safetensors_format.load_file(path).trainer["python_rng_state"] == (3, (1, 2), None)
