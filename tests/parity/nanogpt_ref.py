"""tests/parity/nanogpt_ref.py: an independent PyTorch reference for fusegrad's GPT.

Written here from nanoGPT's published architecture (not from fusegrad's code): module names and
tensor layouts match nanoGPT's state_dict, so `GPT.load_state_dict` accepts fusegrad's
model.safetensors as it is. Also: a dependency-free safetensors reader (numpy), the warmup +
cosine learning-rate schedule, and nanoGPT's AdamW parameter groups (weight decay on tensors with
2 or more dims). Works with PyTorch 1.13 (Debian: attention written out) and 2.x (attention by
F.scaled_dot_product_attention, as nanoGPT does).
"""
import json
import math
import struct
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64}


def load_safetensors(path):
    """Returns ({name: torch.Tensor}, metadata dict) from a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    meta = header.pop("__metadata__", {})
    body = memoryview(raw)[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":  # numpy has no bfloat16: widen the 16 bits to float32
            bits = np.frombuffer(body[begin:end], dtype=np.uint16).astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(body[begin:end], dtype=_DTYPES[info["dtype"]])
        tensors[name] = torch.from_numpy(array.copy().reshape(info["shape"]))
    return tensors, meta


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    norm: str = "layernorm"  # or "rmsnorm"
    gelu: str = "exact"  # or "tanh" (GPT-2's approximation: F.gelu's approximate="tanh")
    bias: bool = True
    dropout: float = 0.0
    eps: float = 1e-5


class _Norm(nn.Module):
    """A weight of ones and, unless bias is off (nanoGPT's bias=False), a bias of zeros."""

    def __init__(self, n, bias, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None
        self.eps = eps


class LayerNorm(_Norm):
    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(_Norm):
    """y = x / sqrt(mean(x^2) + eps) * weight (+ bias)."""

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return y + self.bias if self.bias is not None else y


def make_norm(cfg):
    return (RMSNorm if cfg.norm == "rmsnorm" else LayerNorm)(cfg.n_embd, cfg.bias, cfg.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head = cfg.n_head
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)  # not in the state_dict

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: fused (flash) attention
            p = self.attn_dropout.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            y = self.attn_dropout(att) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.approximate = "tanh" if cfg.gelu == "tanh" else "none"  # "none": the exact (erf) GELU

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=make_norm(cfg),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():  # residual projections: std / sqrt(2 n_layer)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids, targets=None):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.transformer.drop(self.transformer.wte(ids) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1).long(),
                               ignore_index=-1)
        return logits, loss


def cosine_lr(it, lr, min_lr, warmup, decay_steps):
    """Linear warmup over `warmup` steps, then cosine decay to min_lr at decay_steps."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_steps:
        return min_lr
    ratio = (it - warmup) / max(1, decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def adamw(model, lr, betas, weight_decay, **kwargs):
    """AdamW with weight decay only on tensors of 2 or more dims (matrices and embeddings)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8, **kwargs)
