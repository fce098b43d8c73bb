"""The GPT-style model a checkpoint restores into, and its mixed-precision optimizer state."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ckptbench.checkpoint.formats.state import FormatError
from ckptbench.checkpoint.profiles import DIM_LIMITS, ModelDims
from ckptbench.checkpoint.quote import quote

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class Attention(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.heads = dims.heads
        self.qkv = nn.Linear(dims.hidden, 3 * dims.hidden)
        self.proj = nn.Linear(dims.hidden, dims.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, h))


class MLP(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.fc = nn.Linear(dims.hidden, 4 * dims.hidden)
        self.proj = nn.Linear(4 * dims.hidden, dims.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.ln1 = nn.LayerNorm(dims.hidden)
        self.attn = Attention(dims)
        self.ln2 = nn.LayerNorm(dims.hidden)
        self.mlp = MLP(dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        self.wte = nn.Embedding(dims.vocab, dims.hidden)
        self.wpe = nn.Embedding(dims.seq_len, dims.hidden)
        self.blocks = nn.ModuleList(Block(dims) for _ in range(dims.layers))
        self.ln_f = nn.LayerNorm(dims.hidden)
        self.head = nn.Linear(dims.hidden, dims.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# the fields of a GPT config.json the shape comes from, named in the line that refuses one
CONFIG_NAMES = {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "vocab": "vocab_size",
                "seq_len": "n_positions"}


def check_dims(dims: ModelDims) -> None:
    """The shape held to the bounds a manifest's is (DIM_LIMITS; a manifest's is checked when read, so what fails
    here came from a config.json): its n_layer of 10**8 cost minutes of building on meta before any name was
    compared, a list or 0 heads a traceback."""
    for field, high in DIM_LIMITS.items():
        v = getattr(dims, field)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= high:
            raise FormatError(f"config.json: {CONFIG_NAMES[field]} ({field}) is {quote(v, 40)}, not a whole number "
                              f"1..{high}; the file is corrupt or crafted: fix or remove it")
    if dims.hidden % dims.heads:
        raise FormatError(f"config.json: n_embd {dims.hidden} is not a multiple of n_head {dims.heads}; the file is "
                          "corrupt or crafted: fix or remove it")


def build_on_meta(dims: ModelDims, dtype: str) -> GPT:
    """A model with no storage: loading assigns the checkpoint's tensors instead of copying into fresh ones."""
    check_dims(dims)
    with torch.device("meta"):
        return GPT(dims).to(DTYPES[dtype])


def sample_batch(dims: ModelDims, *, seed: int = 0, batch: int = 2, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, dims.vocab, (batch, min(dims.seq_len, 32)), generator=g).to(device)


def master_optimizer(model: GPT, master: dict[str, torch.Tensor] | None = None, lr: float = 1e-4):
    """AdamW over fp32 master copies of the weights (mixed precision): the state a checkpoint carries."""
    names = [n for n, _ in model.named_parameters()]
    if master is None:
        master = {n: p.detach().float().clone().requires_grad_(True) for n, p in model.named_parameters()}
    params = [master[n] for n in names]
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01), master, names
