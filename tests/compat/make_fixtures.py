"""Writes tests/compat/fixtures/<name>/: small checkpoints saved by the training libraries themselves, and beside each
an expected.json of what that library's own loader or resume returns from it.

Runs in the compat venv (`make compat`: torch CPU, transformers, accelerate, lightning, deepspeed, peft, megatron-core),
never in the project's. CPU only, fixed seeds, tiny models. Each fixture is written under a fixed scratch path first, so
paths a library records inside its files are the same on every machine, then copied to the output.

    .venv-compat/bin/python tests/compat/make_fixtures.py [--out DIR] [NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compat_encoding import encode, flatten  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRATCH = "/tmp/ckptbench-compat-gen"  # fixed: Lightning records absolute paths in its .ckpt
LIBS = ("torch", "transformers", "accelerate", "lightning", "deepspeed", "peft", "megatron-core", "torchtitan",
        "torchdata", "safetensors", "numpy")


def seed_all(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def tiny_llama():
    """A Llama of about 7 K parameters, untied (so the files hold every weight its state_dict names)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    seed_all(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def token_batches(n: int, batch: int = 2, seq: int = 8, vocab: int = 64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(n)]


class Recorder:
    """Every torch.load a library makes while it resumes: (path, its flat keys and encodings), taken at once (a
    library may change what it loaded afterwards)."""

    def __init__(self):
        self.loads: list[tuple[str | None, list[tuple[str, bool, dict]]]] = []

    @contextlib.contextmanager
    def torch_load(self):
        real = torch.load

        def load(f, *args, **kwargs):
            obj = real(f, *args, **kwargs)
            name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None) or getattr(f, "path", None)
            self.loads.append((os.fspath(name) if name is not None else None, obj_items(obj)))
            return obj

        torch.load = load
        try:
            yield self
        finally:
            torch.load = real


def obj_items(obj) -> list[tuple[str, bool, dict]]:
    return [(k, isinstance(v, torch.Tensor), encode(v)) for k, v in flatten(obj)]


def state_file(items, stem: str) -> dict:
    """A Trainer's or Accelerate's torch.save state file: every value under the file's stem."""
    return {f"{stem}.{k}": e for k, _, e in items}


def wrapped(items, wrapper: str) -> tuple[dict, dict]:
    """A torch.save dict whose `wrapper` key holds the weights (Lightning's state_dict, DeepSpeed's module): its
    tensors are weights without the prefix, everything else keeps its flat key."""
    model, extra = {}, {}
    for k, is_tensor, e in items:
        if is_tensor and k.startswith(wrapper + "."):
            model[k[len(wrapper) + 1:]] = e
        else:
            extra[k] = e
    return model, extra


def enc_state_dict(sd) -> dict:
    return {k: encode(v) for k, v in sd.items()}


def rel(path: str, root: str) -> str:
    r = os.path.relpath(path, root).replace(os.sep, "/")
    return "" if r == "." else r


# ---- Hugging Face weights ------------------------------------------------------------------------------------------


def _from_pretrained(where: str) -> dict:
    from transformers import AutoModelForCausalLM

    return enc_state_dict(AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).state_dict())


def hf_safetensors(root: str) -> dict:
    tiny_llama().save_pretrained(root)
    return {"library": "transformers", "loader": "AutoModelForCausalLM.from_pretrained(DIR).state_dict()",
            "picked": "", "model": _from_pretrained(root), "extra": {}}


def hf_sharded(root: str) -> dict:
    tiny_llama().save_pretrained(root, max_shard_size="12KB")
    assert os.path.isfile(os.path.join(root, "model.safetensors.index.json")), os.listdir(root)
    return {"library": "transformers", "loader": "AutoModelForCausalLM.from_pretrained(DIR).state_dict()",
            "picked": "", "model": _from_pretrained(root), "extra": {}}


def hf_bin(root: str) -> dict:
    """transformers 5 saves safetensors only; Accelerate's save_model still writes Hugging Face's sharded .bin."""
    from accelerate import Accelerator

    model = tiny_llama()
    Accelerator(cpu=True).save_model(model, root, max_shard_size="12KB", safe_serialization=False)
    model.config.save_pretrained(root)
    assert os.path.isfile(os.path.join(root, "pytorch_model.bin.index.json")), os.listdir(root)
    return {"library": "transformers", "loader": "AutoModelForCausalLM.from_pretrained(DIR).state_dict() of "
            "Accelerator.save_model(safe_serialization=False, max_shard_size=12KB)",
            "picked": "", "model": _from_pretrained(root), "extra": {}}


# ---- transformers.Trainer ------------------------------------------------------------------------------------------


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.rows = [t for b in token_batches(n) for t in b]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _trainer(root: str, model, **extra):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=root, max_steps=10, save_steps=3, per_device_train_batch_size=2,
                             learning_rate=1e-2, logging_steps=5, report_to="none", use_cpu=True, seed=0,
                             data_seed=0, dataloader_num_workers=0, disable_tqdm=True, **extra)
    return Trainer(model=model, args=args, train_dataset=_Tokens(10))


def trainer_state_loaded(checkpoint: str) -> dict:
    """What a Trainer's resume reads from the checkpoint's trainer_state.json (TrainerState.load_from_json, in
    _inner_training_loop), every field under trainer_state."""
    import dataclasses

    from transformers import TrainerState

    state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
    return {f"trainer_state.{k}": encode(v) for k, v in flatten(dataclasses.asdict(state))}


def _trainer_resume_truth(root: str) -> dict:
    """What Trainer.train(resume_from_checkpoint=True) loads: get_last_checkpoint picks the checkpoint; the weights
    as _load_from_checkpoint puts them in the model, the state files as _load_optimizer_and_scheduler and
    _load_rng_state torch.load them, and trainer_state.json as TrainerState.load_from_json reads it."""
    from transformers.trainer_utils import get_last_checkpoint

    picked = get_last_checkpoint(root)
    trainer = _trainer(tempfile.mkdtemp(prefix="resume-"), tiny_llama())
    rec = Recorder()
    with rec.torch_load():
        trainer._load_from_checkpoint(picked)
        trainer.create_optimizer_and_scheduler(num_training_steps=10)
        trainer._load_optimizer_and_scheduler(picked)
        trainer._load_rng_state(picked)
    extra, read = {}, []
    for path, items in rec.loads:
        name = os.path.basename(path)
        read.append(rel(path, root))
        extra.update(state_file(items, name.rsplit(".", 1)[0]))
    extra.update(trainer_state_loaded(picked))
    return {"library": "transformers", "picked": rel(picked, root),
            "loader": "get_last_checkpoint(DIR); Trainer._load_from_checkpoint, _load_optimizer_and_scheduler, "
                      "_load_rng_state (their torch.load results recorded), TrainerState.load_from_json",
            "torch_loaded": sorted(set(read)), "model": enc_state_dict(trainer.model.state_dict()), "extra": extra}


def trainer_outdir(root: str) -> dict:
    seed_all(0)
    _trainer(root, tiny_llama()).train()
    return _trainer_resume_truth(root)


def trainer_outdir_final(root: str) -> dict:
    """run_clm.py's pattern: train, then save_model() puts the final weights at the top of output_dir."""
    seed_all(0)
    trainer = _trainer(root, tiny_llama())
    trainer.train()
    trainer.save_model()
    return _trainer_resume_truth(root)


# ---- Accelerate ----------------------------------------------------------------------------------------------------


def _accelerated(seed: int = 0):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    model, opt, sched = acc.prepare(model, opt, sched)
    return acc, model, opt, sched


def _accelerate_loads(acc, root: str) -> tuple[dict, list[str], dict]:
    """(extra, files read, not compared) of `acc.load_state(root)`, its torch.load results recorded: every state file
    under its stem (custom_checkpoint_N.pkl too, a torch.save), the weights left to the models after the load, the
    RNG states' plain pickle not compared."""
    rec = Recorder()
    with rec.torch_load():
        acc.load_state(root)
    extra, read, ignored = {}, [], {}
    for path, items in rec.loads:
        name = os.path.basename(path)
        read.append(rel(path, root))
        if name.startswith("random_states_"):  # which Accelerate loads with weights_only=False
            ignored[name] = "a plain pickle (Python objects, unpickled with code execution); ckptbench never loads it"
        elif not name.startswith("pytorch_model"):  # weights: compared as the models hold them after the load
            extra.update(state_file(items, name.rsplit(".", 1)[0]))
    return extra, read, ignored


def accelerate_state(root: str) -> dict:
    seed_all(0)
    acc, model, opt, sched = _accelerated()
    for x in token_batches(2):
        acc.backward(model(input_ids=x, labels=x).loss)
        opt.step()
        sched.step()
        opt.zero_grad()
    acc.save_state(root)
    acc2, model2, opt2, sched2 = _accelerated()
    extra, read, ignored = _accelerate_loads(acc2, root)
    return {"library": "accelerate", "picked": "", "loader": "Accelerator.load_state(DIR) into a fresh model, "
            "optimizer and scheduler (its torch.load results recorded; weights from the model after it)",
            "torch_loaded": sorted(set(read)), "model": enc_state_dict(acc2.unwrap_model(model2).state_dict()),
            "extra": extra, "not_compared": ignored}


def _two_models(seed: int = 0):
    """Two models prepared at once (a student and a head, a GAN's pair): their state_dicts share key names."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    torch.manual_seed(seed)
    body, head = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
    opt, opt_head = torch.optim.AdamW(body.parameters(), lr=1e-2), torch.optim.SGD(head.parameters(), lr=0.1,
                                                                                    momentum=0.9)
    acc.register_for_checkpointing(torch.optim.swa_utils.SWALR(opt_head, swa_lr=0.05))  # custom_checkpoint_0.pkl
    return (acc, *acc.prepare(body, head, opt, opt_head))


def accelerate_two_models(root: str, safe: bool = True) -> dict:
    """save_state of two models (model.safetensors and model_1.safetensors, or pytorch_model.bin and
    pytorch_model_1.bin): both hold `weight` and `bias`."""
    seed_all(0)
    acc, body, head, opt, opt_head = _two_models()
    for x in torch.randn(2, 4, 16).unbind(0):
        acc.backward(head(body(x)).pow(2).mean())
        opt.step()
        opt_head.step()
        opt.zero_grad()
        opt_head.zero_grad()
    acc.save_state(root, safe_serialization=safe)
    acc2, body2, head2, opt2, opt_head2 = _two_models(1)
    extra, read, ignored = _accelerate_loads(acc2, root)
    model = enc_state_dict(acc2.unwrap_model(body2).state_dict())
    model.update({f"model_1.{k}": e for k, e in enc_state_dict(acc2.unwrap_model(head2).state_dict()).items()})
    return {"library": "accelerate", "picked": "", "loader": "Accelerator.load_state(DIR) into two fresh models and "
            "their optimizers (its torch.load results recorded; weights from the models after it, the second's "
            "under model_1.)", "torch_loaded": sorted(set(read)), "model": model, "extra": extra,
            "not_compared": ignored}


def accelerate_two_models_bin(root: str) -> dict:
    return accelerate_two_models(root, safe=False)


# ---- Lightning -----------------------------------------------------------------------------------------------------


def _lightning_module(monitor: bool):
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            if monitor:
                self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1)}

        def train_dataloader(self):
            g = torch.Generator().manual_seed(2)
            data = torch.utils.data.TensorDataset(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g))
            return torch.utils.data.DataLoader(data, batch_size=4)

    return Tiny()


def _lightning(root: str, monitor: bool) -> dict:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    seed_all(0)
    callbacks = [ModelCheckpoint(dirpath=os.path.join(root, "checkpoints"), monitor="train_loss", mode="max")] \
        if monitor else None
    trainer = L.Trainer(default_root_dir=root, max_steps=2, accelerator="cpu", devices=1, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks, deterministic=True)
    trainer.fit(_lightning_module(monitor))
    picked_file = trainer.checkpoint_callback.best_model_path
    # the resume: fit(ckpt_path=...) in a fresh Trainer (already at max_steps, so it loads and stops)
    resume_root = tempfile.mkdtemp(prefix="resume-")
    rec = Recorder()
    with rec.torch_load():
        L.Trainer(default_root_dir=resume_root, max_steps=2, accelerator="cpu", devices=1, enable_progress_bar=False,
                  enable_model_summary=False, logger=False, enable_checkpointing=False).fit(
            _lightning_module(monitor), ckpt_path=picked_file)
    loads = [items for _, items in rec.loads if any(k.startswith("state_dict.") for k, _, _ in items)]
    assert len(loads) == 1, [p for p, _ in rec.loads]
    model, extra = wrapped(loads[0], "state_dict")
    return {"library": "lightning", "picked": rel(os.path.dirname(picked_file), root),
            "picked_file": rel(picked_file, root),
            "loader": "Trainer.fit(ckpt_path=<the ModelCheckpoint's best_model_path>) (its torch.load recorded)",
            "model": model, "extra": extra}


def lightning_ckpt(root: str) -> dict:
    return _lightning(root, monitor=False)


def lightning_ckpt_max(root: str) -> dict:
    return _lightning(root, monitor=True)


# ---- PEFT ----------------------------------------------------------------------------------------------------------


def peft_lora(root: str) -> dict:
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.utils import load_peft_weights

    seed_all(0)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(tiny_llama(), cfg).save_pretrained(root)
    PeftModel.from_pretrained(tiny_llama(), root)  # the adapter loads into its model
    return {"library": "peft", "picked": "", "loader": "peft.utils.load_peft_weights(DIR)",
            "model": enc_state_dict(load_peft_weights(root, device="cpu")), "extra": {}}


# ---- DeepSpeed (one process, gloo) ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ZERO_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(?:optim|model)_states\.pt$")


def _deepspeed_engine(stage: int):
    import deepspeed

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 1000}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def _deepspeed(root: str, stage: int) -> dict:
    import deepspeed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo")
    seed_all(0)
    engine = _deepspeed_engine(stage)
    for x in token_batches(2):
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
        engine.save_checkpoint(root)
    seed_all(0)
    fresh = _deepspeed_engine(stage)
    rec = Recorder()
    with rec.torch_load():
        load_path, _ = fresh.load_checkpoint(root)
    model, extra, read = {}, {}, []
    for path, items in rec.loads:
        name = os.path.basename(path)
        read.append(rel(path, root))
        zero = ZERO_FILE.match(name)
        if zero:  # a ZeRO partition (ZeRO-3's model states too): ckptbench keeps it apart under its rank
            tag = f"zero_pp_rank_{int(zero.group(1))}" + (f"_mp_rank_{zero.group(2)}" if int(zero.group(2)) else "")
            extra.update({f"{tag}.{k}": e for k, _, e in items})
        else:
            m, x = wrapped(items, "module")
            model.update(m)
            extra.update(x)
    with open(os.path.join(root, "latest")) as f:
        latest = f.read().strip()
    assert os.path.basename(os.path.dirname(load_path)) == latest, (load_path, latest)
    return {"library": "deepspeed", "picked": latest, "pointer": "latest", "loader": "DeepSpeedEngine.load_checkpoint(DIR) (its "
            "checkpoint engine's torch.load results recorded)", "torch_loaded": sorted(set(read)),
            "model": model, "extra": extra}


def deepspeed_zero2(root: str) -> dict:
    return _deepspeed(root, 2)


def deepspeed_zero3(root: str) -> dict:
    return _deepspeed(root, 3)


# ---- torchtitan: its CheckpointManager, FSDP2 on 2 ranks, DCP --------------------------------------------------------


class _Titan(torch.nn.Module):
    """torchtitan's Llama names, at toy size."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(64, 16)
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                                                       torch.nn.Linear(32, 16)) for i in range(2)})
        self.norm = torch.nn.LayerNorm(16)
        self.output = torch.nn.Linear(16, 64, bias=False)

    def forward(self, x):
        h = self.tok_embeddings(x)
        for layer in self.layers.values():
            h = h + layer(h)
        return self.output(self.norm(h))


class _TitanTokens(torch.utils.data.IterableDataset):
    """A rank's token batches, resumable as torchtitan's datasets are (a sample index). (Named apart from the
    Trainer's _Tokens: one name for both handed the Trainer this iterable, whose batches it found empty.)"""

    def __init__(self, rank: int):
        self.rank, self.sample_idx = rank, 0

    def __iter__(self):
        g = torch.Generator().manual_seed(3 + self.rank)
        while True:
            self.sample_idx += 1
            yield torch.randint(0, 64, (8,), generator=g)

    def state_dict(self):
        return {"sample_idx": self.sample_idx}

    def load_state_dict(self, sd):
        self.sample_idx = sd["sample_idx"]


class _TrainState:
    """What torchtitan's Trainer registers as "train_state" (trainer.py: state_dict / load_state_dict)."""

    def __init__(self):
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, sd):
        self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]


def _titan_trainer(rank: int, root: str):
    """torchtitan's pieces as its Trainer builds them: the model FSDP2-sharded over 2 CPU ranks, its
    OptimizersContainer (default_adamw), LRSchedulersContainer, ParallelAwareDataloader and CheckpointManager
    (folder checkpoint/ under the dump folder, every 5 steps, the last step a full checkpoint)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw

    mesh = init_device_mesh("cpu", (2,))
    seed_all(0)
    model = _Titan()
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = default_adamw(lr=1e-2).build(model_parts=[model])
    sched = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=opt, training_steps=10)
    loader = ParallelAwareDataloader(_TitanTokens(rank), dp_rank=rank, dp_world_size=2, batch_size=2)
    state = _TrainState()
    ckpt = CheckpointManager.Config(enable=True, folder="checkpoint", interval=5, last_save_model_only=False).build(
        dataloader=loader, model_parts=[model], optimizers=opt, lr_schedulers=sched,
        states={"train_state": state}, sd_adapter=None, base_folder=root)
    return model, opt, sched, loader, state, ckpt


def titan_rank(rank: int, root: str, port: int, out_json: str) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict
    from torch.distributed.tensor import DTensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model, opt, sched, loader, state, ckpt = _titan_trainer(rank, root)
    batches = iter(loader)
    for step in range(1, 11):
        state.step = step
        x = next(batches)
        state.ntokens_seen += x.numel()
        torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), x.reshape(-1)).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        ckpt.save(curr_step=step, last_step=step == 10)
    ckpt.close()
    dist.barrier()
    # the resume: a fresh Trainer's CheckpointManager loads the highest step (load_step -1)
    model, opt, sched, loader, state, ckpt = _titan_trainer(rank, root)
    assert ckpt.load(step=-1) and state.step == 10, state.step
    picked = os.path.join(root, "checkpoint", f"step-{state.step}")
    # what was loaded, keyed as DCP flattened the states CheckpointManager saved (its own flattening, then the
    # Stateful objects' state_dict() and DCP's flattening, as dcp.save does them)
    flat, _ = flatten_state_dict(_stateful_to_state_dict(ckpt._flattened_model_states_sd()))
    mine = {}
    for k in sorted(flat):
        v = flat[k]
        mine[k] = encode(v.full_tensor() if isinstance(v, DTensor) else v)
    ckpt.close()
    gathered = [None, None]
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        merged = {**gathered[1], **gathered[0]}
        states = ("optimizer", "lr_scheduler", "dataloader", "train_state")
        model_sd = {k: e for k, e in merged.items() if k.split(".")[0] not in states}
        extra = {k: e for k, e in merged.items() if k.split(".")[0] in states}
        with open(out_json, "w") as f:
            json.dump({"library": "torchtitan", "picked": rel(picked, root),
                       "loader": "CheckpointManager.load(step=-1) in a fresh trainer's pieces on 2 gloo ranks "
                                 "(FSDP2); the states it restored, flattened as it saves them (the model's keys at "
                                 "the top), DTensors gathered whole", "model": model_sd, "extra": extra}, f)
    dist.destroy_process_group()


def _two_ranks(flag: str, root: str) -> dict:
    """This script run as 2 gloo ranks (`flag`: which rank function), each a fresh interpreter; rank 0 writes the
    expected.json it returns."""
    out_json = os.path.join(tempfile.mkdtemp(prefix="ranks-"), "expected.json")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, __file__, flag, str(r), root, str(port), out_json]) for r in range(2)]
    rcs = [p.wait(timeout=300) for p in procs]
    assert rcs == [0, 0], rcs
    with open(out_json) as f:
        return json.load(f)


def torchtitan_dump(root: str) -> dict:
    return _two_ranks("--titan-rank", root)


# ---- FSDP's sharded state dict, as a Hugging Face Trainer checkpoint holds it ---------------------------------------


def _fsdp_parts(rank: int):
    """tiny_llama FSDP2-sharded over 2 CPU ranks as Accelerate's prepare shards it (each decoder layer, then the
    root), its AdamW and LR scheduler, and the FSDP plugin with SHARDED_STATE_DICT (Accelerate's default)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    model = tiny_llama()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    return model, opt, sched, plugin


def fsdp_rank(rank: int, root: str, port: int, out_json: str) -> None:
    """One rank: 2 steps, then checkpoint-2 as Trainer._save_checkpoint writes it under FSDP (Accelerate's
    save_fsdp_model and save_fsdp_optimizer, Trainer._save_rng_state, the scheduler's torch.save, the trainer
    state); then the resume Trainer runs under FSDP (load_fsdp_model, load_fsdp_optimizer, the torch.load of the
    scheduler and this rank's RNG state) into fresh parts."""
    import types

    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.tensor import DTensor
    from transformers import Trainer, TrainerState
    from transformers.training_args import ParallelMode

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    acc = Accelerator(cpu=True)  # its process index and count are what the save and load functions ask of it
    seed_all(0)
    model, opt, sched, plugin = _fsdp_parts(rank)
    for x in token_batches(2):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    out = os.path.join(root, "checkpoint-2")
    save_fsdp_model(plugin, acc, model, out)
    save_fsdp_optimizer(plugin, acc, opt, model, out)
    if rank == 0:
        torch.save(sched.state_dict(), os.path.join(out, "scheduler.pt"))
        TrainerState(global_step=2, max_steps=2).save_to_json(os.path.join(out, "trainer_state.json"))
    args = types.SimpleNamespace(parallel_mode=ParallelMode.DISTRIBUTED, world_size=2, process_index=rank)
    Trainer._save_rng_state(types.SimpleNamespace(args=args), out)
    dist.barrier()
    # the resume, each rank
    seed_all(1)
    model, opt, sched, plugin = _fsdp_parts(rank)
    load_fsdp_model(plugin, acc, model, out)
    load_fsdp_optimizer(plugin, acc, opt, model, out)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    flat, _ = flatten_state_dict({"optimizer": get_optimizer_state_dict(model, opt)})
    mine = {"model": {k: encode(v.full_tensor() if isinstance(v, DTensor) else v)
                      for k, v in model.state_dict().items()},
            "extra": {k: encode(v.full_tensor() if isinstance(v, DTensor) else v) for k, v in flat.items()}}
    rec = Recorder()
    with rec.torch_load():
        sched.load_state_dict(torch.load(os.path.join(out, "scheduler.pt"), weights_only=True))
        torch.load(os.path.join(out, f"rng_state_{rank}.pth"), weights_only=False)
    for path, items in rec.loads:
        mine["extra"].update(state_file(items, os.path.basename(path).rsplit(".", 1)[0]))
    mine["extra"].update(trainer_state_loaded(out))
    gathered = [None, None]
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(out_json, "w") as f:
            json.dump({"library": "accelerate (a Hugging Face Trainer's FSDP checkpoint)", "picked": "checkpoint-2",
                       "loader": "Accelerate's load_fsdp_model and load_fsdp_optimizer (what Trainer calls under "
                                 "FSDP) into fresh FSDP2 parts on 2 gloo ranks, DTensors gathered whole; the "
                                 "scheduler's and each rank's RNG state's torch.load; TrainerState.load_from_json",
                       "torch_loaded": ["checkpoint-2/rng_state_0.pth", "checkpoint-2/rng_state_1.pth",
                                        "checkpoint-2/scheduler.pt"],
                       "model": gathered[0]["model"],
                       "extra": {**gathered[1]["extra"], **gathered[0]["extra"]}}, f)
    dist.destroy_process_group()


def trainer_fsdp_sharded(root: str) -> dict:
    return _two_ranks("--fsdp-rank", root)


# ---- Megatron-LM's torch_dist: megatron-core's dist_checkpointing -----------------------------------------------


def _on_cpu() -> None:
    """megatron-core 0.16 stages a save through the GPU's calls even when every tensor is on the CPU: it syncs the
    stream after copying tensors to the host and all-reduces a failure flag placed on the current device. Without a
    GPU these are a no-op and the CPU; everything the checkpoint holds is still written by megatron-core's code."""
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def _megatron_parts(seed: int):
    """A two-layer GPT of megatron-core's local spec (no Transformer Engine), CPU-initialised; its LR scheduler over a
    torch Adam (megatron-core's own optimizers place their state on 'cuda' when built: no optimizer is saved here)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.transformer_config import TransformerConfig

    seed_all(seed)
    cfg = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=64,
                     max_sequence_length=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-3, min_lr=1e-5, lr_warmup_steps=2,
                                    lr_decay_steps=10, lr_decay_style="cosine", start_wd=0.0, end_wd=0.0,
                                    wd_incr_steps=10, wd_incr_style="constant")
    return model, opt, sched


def _megatron_state(model, sched, iteration: int) -> dict:
    """What Megatron-LM's save_checkpoint hands dist_checkpointing.save for a torch_dist checkpoint
    (training/checkpointing.py generate_state_dict and get_rng_state, without the GPU's RNG states): the model's
    sharded state dict, the RNG states as one ShardedObject per (pipeline, tensor) rank, the rest common."""
    import argparse as ap

    from megatron.core import parallel_state as mpu
    from megatron.core.dist_checkpointing import ShardedObject

    rng = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state()}]
    rng = ShardedObject("rng_state", rng, (mpu.get_pipeline_model_parallel_world_size(),
                                           mpu.get_tensor_model_parallel_world_size()),
                        (mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank()),
                        replica_id=mpu.get_data_parallel_rank(with_context_parallel=True))
    args = ap.Namespace(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, ckpt_format="torch_dist",
                        params_dtype=torch.float32, tensor_model_parallel_size=1, iteration=iteration,
                        consumed_train_samples=iteration * 4)
    return {"args": args, "checkpoint_version": 3.0, "iteration": iteration, "model": model.sharded_state_dict(),
            "opt_param_scheduler": sched.state_dict(), "rng_state": rng,
            "num_floating_point_operations_so_far": 1234567 * iteration}


def megatron_torch_dist(root: str) -> dict:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    from megatron.core.dist_checkpointing.dict_utils import nested_values

    _on_cpu()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model, opt, sched = _megatron_parts(0)
    for it in (5, 10):
        for _ in range(5):
            sched.step(1)
        where = os.path.join(root, f"iter_{it:07d}")
        os.makedirs(where)
        dist_checkpointing.save(_megatron_state(model, sched, it), where)
        # Megatron-LM's training loop writes the tracker after the iteration is whole (megatron-core has no such file)
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(it))
    # the resume: Megatron-LM reads the tracker, then dist_checkpointing.load into a fresh model's sharded dict
    with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as f:
        picked = f"iter_{int(f.read().strip()):07d}"
    fresh, _, fresh_sched = _megatron_parts(1)
    template = _megatron_state(fresh, fresh_sched, 0)
    loaded = dist_checkpointing.load(template, os.path.join(root, picked))
    fresh.load_state_dict(loaded["model"])
    # ckptbench names a tensor by its key in the checkpoint (the layers stacked, as Megatron stores them); each
    # piece Megatron's load returned is placed at its global offset
    whole = {}
    shards = [(local, sh) for local, sh in template["model"].items() if isinstance(sh, ShardedTensor)]
    for local, sh in shards:
        t = whole.setdefault(sh.key, torch.zeros(sh.global_shape, dtype=sh.dtype))
        piece, pre = loaded["model"][local], sh.prepend_axis_num  # the layer axis is an index, the rest slices
        t[tuple(sh.global_offset[:pre]) + tuple(slice(o, o + n) for o, n in zip(sh.global_offset[pre:],
                                                                                  piece.shape))] = piece
    model_out = {k: encode(t) for k, t in whole.items()}
    extra = {}
    for local, sh in template["model"].items():
        if isinstance(sh, ShardedObject):
            extra.update({f"{sh.unique_key}.{k}" if k else sh.unique_key: encode(v)
                          for k, v in flatten(loaded["model"][local])})
    rng_key = template["rng_state"].unique_key
    extra.update({f"{rng_key}.{k}": encode(v) for k, v in flatten(loaded["rng_state"])})
    common = {k: v for k, v in loaded.items() if k not in ("model", "rng_state")}
    extra.update({k: e for k, _, e in obj_items(common)})
    assert not any(isinstance(v, (ShardedTensor, ShardedObject)) for v in nested_values(common))
    dist.destroy_process_group()
    return {"library": "megatron-core", "picked": picked, "pointer": "latest_checkpointed_iteration.txt",
            "loader": "Megatron-LM's resume: the tracker's iteration; dist_checkpointing.load into a fresh "
                      "model's sharded_state_dict (tensors placed at their global offsets, under their "
                      "checkpoint keys), the RNG ShardedObject and the common state",
            "model": model_out, "extra": extra}


# ---- driver --------------------------------------------------------------------------------------------------------

# DeepSpeed keeps a process group and its own globals: each fixture runs in a fresh interpreter
FIXTURES = {f.__name__: f for f in (hf_safetensors, hf_sharded, hf_bin, trainer_outdir, trainer_outdir_final,
                                    accelerate_state, accelerate_two_models, accelerate_two_models_bin,
                                    lightning_ckpt, lightning_ckpt_max, torchtitan_dump, deepspeed_zero2, deepspeed_zero3, peft_lora, megatron_torch_dist,
                                    trainer_fsdp_sharded)}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for lib in LIBS:
        try:
            out[lib] = version(lib)
        except PackageNotFoundError:
            out[lib] = None
    return out


def make_one(name: str, out: str) -> None:
    scratch = os.path.join(SCRATCH, name)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = FIXTURES[name](scratch)
    expected = {"fixture": name, **expected}
    dest = os.path.join(out, name)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(scratch, dest)
    with open(os.path.join(dest, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "fixtures"))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--titan-rank", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--fsdp-rank", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("names", nargs="*", help=f"fixtures to write (default: all): {', '.join(FIXTURES)}")
    a = p.parse_args(argv)
    if a.fsdp_rank:
        r, root, port, out_json = a.fsdp_rank
        fsdp_rank(int(r), root, int(port), out_json)
        return 0
    if a.titan_rank:
        r, root, port, out_json = a.titan_rank
        titan_rank(int(r), root, int(port), out_json)
        return 0
    if a.one:
        make_one(a.one, a.out)
        return 0
    names = a.names or list(FIXTURES)
    unknown = sorted(set(names) - set(FIXTURES))
    if unknown:
        p.error(f"unknown fixture {unknown[0]!r}; one of {', '.join(FIXTURES)}")
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for name in names:
        print(f"-- {name}", flush=True)
        if subprocess.run([sys.executable, __file__, "--out", a.out, "--one", name]).returncode != 0:
            failed.append(name)
    with open(os.path.join(a.out, "versions.json"), "w") as f:
        json.dump(versions(), f, indent=1, sort_keys=True)
        f.write("\n")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
