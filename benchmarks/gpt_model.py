"""A small GPT written twice, in JAX and in torch, with the same weights, data and schedule.

Decoder-only transformer, GPT-2 style: learned token and position embeddings,
``n_layer`` pre-LayerNorm blocks (causal self-attention, then a 4x GELU MLP,
each on a residual branch), a final LayerNorm and an output head **tied** to
the token embedding (logits = ``h @ wte.T``, no bias). Attention is written out
(``softmax(q k^T / sqrt(d_head) + causal mask) v``) on both sides: no flash or
fused attention kernels, so both frameworks compute the same math. GELU is the
exact (erf) one, LayerNorm's eps is 1e-5, the loss is the mean next-token
cross-entropy.

Weights are drawn once with NumPy (:func:`init_weights`) in torch's layout
(``nn.Linear.weight`` is ``(out, in)``) under torch's state_dict names, so the
JAX loss reads the same dict the torch module loads. The tied head makes
``wte.weight`` one parameter used twice: its gradient sums both uses on both
sides. The default model (8 layers, d_model 512, vocab 8192, context 256) has
29.5M parameters in 100 tensors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Config:
    n_layer: int = 8
    d_model: int = 512
    n_head: int = 8
    vocab: int = 8192
    context: int = 256
    batch: int = 16

    def as_dict(self) -> dict:
        return asdict(self)


SMALL = Config(n_layer=2, d_model=64, n_head=4, vocab=256, context=32, batch=4)
# the issue's first-iteration model (8 layers, width 512, vocabulary 4096: 27.3M parameters)
# with a short context and a small batch, so a shared 2-core CPU runs an iteration in seconds
# (compilation depends on the shapes' structure, not on how long the kernels run)
GPT27M = Config(n_layer=8, d_model=512, n_head=8, vocab=4096, context=64, batch=4)
# the issue's model as it measured it (batch 16, context 256): for a GPU
ISSUE = Config(vocab=4096)
CONFIGS = {"small": SMALL, "gpt27m": GPT27M, "issue": ISSUE, "default": Config()}


def parameter_count(cfg: Config) -> int:
    """How many parameters the model has (the tied head counted once)."""
    return sum(int(np.prod(w.shape)) for w in init_weights(cfg).values())


def parameter_names(cfg: Config) -> list[str]:
    """torch's ``named_parameters()`` order of :class:`TorchGPT` (the tied head has no name)."""
    names = ["wte.weight", "wpe.weight"]
    for i in range(cfg.n_layer):
        for sub in ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc", "mlp.proj"):
            names += [f"h.{i}.{sub}.weight", f"h.{i}.{sub}.bias"]
    return [*names, "ln_f.weight", "ln_f.bias"]


def init_weights(cfg: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2's initialisation, in float32: N(0, 0.02) weights, N(0, 0.02 / sqrt(2 n_layer))
    for the projections into the residual stream, zero biases, unit LayerNorm scales."""
    rng = np.random.default_rng(seed)
    d = cfg.d_model
    shapes = {
        "wte.weight": (cfg.vocab, d),
        "wpe.weight": (cfg.context, d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        shapes |= {
            p + "ln1.weight": (d,),
            p + "ln1.bias": (d,),
            p + "attn.qkv.weight": (3 * d, d),
            p + "attn.qkv.bias": (3 * d,),
            p + "attn.proj.weight": (d, d),
            p + "attn.proj.bias": (d,),
            p + "ln2.weight": (d,),
            p + "ln2.bias": (d,),
            p + "mlp.fc.weight": (4 * d, d),
            p + "mlp.fc.bias": (4 * d,),
            p + "mlp.proj.weight": (d, 4 * d),
            p + "mlp.proj.bias": (d,),
        }
    weights = {}
    for name in parameter_names(cfg):
        shape = shapes[name]
        if name.startswith("ln") or ".ln" in name:
            value = np.ones(shape) if name.endswith("weight") else np.zeros(shape)
        elif name.endswith("bias"):
            value = np.zeros(shape)
        else:
            std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("proj.weight") else 0.02
            value = rng.normal(0.0, std, shape)
        weights[name] = value.astype(np.float32)
    return weights


def make_batches(cfg: Config, n: int = 8, seed: int = 1) -> list[np.ndarray]:
    """``n`` fixed ``(batch, context + 1)`` int32 token batches with structure to learn:
    each row counts up from a random start with a random stride (mod vocab), and one token
    in 16 is replaced by a random one. Inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    rng = np.random.default_rng(seed)
    positions = np.arange(cfg.context + 1)
    batches = []
    for _ in range(n):
        start = rng.integers(0, cfg.vocab, (cfg.batch, 1))
        stride = rng.integers(1, 17, (cfg.batch, 1))
        tokens = (start + stride * positions) % cfg.vocab
        noise = rng.random(tokens.shape) < 1 / 16
        tokens = np.where(noise, rng.integers(0, cfg.vocab, tokens.shape), tokens)
        batches.append(tokens.astype(np.int32))
    return batches


def lr_factor(step: int, warmup: int, total: int) -> float:
    """The ``LambdaLR`` factor: linear warm-up to 1 over ``warmup`` steps, then cosine to 0.1
    at step ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


def lr_factor_jax(count, warmup: int, total: int):
    """:func:`lr_factor` on a jax step count (for optax's schedule)."""
    import jax.numpy as jnp

    step = count.astype(jnp.float32)
    progress = jnp.minimum((step - warmup) / max(total - warmup, 1), 1.0)
    cosine = 0.1 + 0.45 * (1.0 + jnp.cos(jnp.pi * progress))
    return jnp.where(step < warmup, (step + 1) / warmup, cosine)


# ------------------------------------------------------------------------------- JAX


def make_jax_loss(cfg: Config):
    """``loss_fn(params, tokens)``: the mean next-token cross-entropy; ``params`` maps
    :func:`parameter_names` to arrays (lucid.backward hands it arrays for Parameters)."""
    import jax
    import jax.numpy as jnp

    n_head, d = cfg.n_head, cfg.d_model
    d_head = d // n_head
    scale = 1.0 / math.sqrt(d_head)

    def linear(x, params, name):
        return x @ params[name + ".weight"].T + params[name + ".bias"]

    def layer_norm(x, params, name):
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        x = (x - mean) * jax.lax.rsqrt(var + 1e-5)
        return x * params[name + ".weight"] + params[name + ".bias"]

    def attention(x, params, name):
        b, t, _ = x.shape
        qkv = linear(x, params, name + ".qkv")
        q, k, v = (
            a.reshape(b, t, n_head, d_head).transpose(0, 2, 1, 3)
            for a in jnp.split(qkv, 3, axis=-1)
        )
        att = (q @ k.transpose(0, 1, 3, 2)) * scale
        causal = jnp.tril(jnp.ones((t, t), bool))
        att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return linear(y, params, name + ".proj")

    def loss_fn(params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        t = inputs.shape[1]
        x = params["wte.weight"][inputs] + params["wpe.weight"][:t]
        for i in range(cfg.n_layer):
            p = f"h.{i}."
            x = x + attention(layer_norm(x, params, p + "ln1"), params, p + "attn")
            h = linear(layer_norm(x, params, p + "ln2"), params, p + "mlp.fc")
            x = x + linear(jax.nn.gelu(h, approximate=False), params, p + "mlp.proj")
        x = layer_norm(x, params, "ln_f")
        logits = x @ params["wte.weight"].T  # tied head
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    return loss_fn


# ----------------------------------------------------------------------------- torch


def make_torch_model(cfg: Config, weights: dict[str, np.ndarray], device: str):
    """:class:`TorchGPT` with ``weights`` loaded, on ``device``."""
    import torch

    model = _torch_classes()(cfg)
    model.load_state_dict({name: torch.from_numpy(w) for name, w in weights.items()})
    return model.to(device)


def _torch_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, cfg: Config) -> None:
            super().__init__()
            self.n_head = cfg.n_head
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)
            causal = torch.tril(torch.ones(cfg.context, cfg.context, dtype=torch.bool))
            self.register_buffer("mask", causal, persistent=False)

        def forward(self, x):
            b, t, d = x.shape
            d_head = d // self.n_head
            q, k, v = (
                a.view(b, t, self.n_head, d_head).transpose(1, 2)
                for a in self.qkv(x).split(d, dim=-1)
            )
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d_head))
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class MLP(nn.Module):
        def __init__(self, cfg: Config) -> None:
            super().__init__()
            self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
            self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x)))

    class Block(nn.Module):
        def __init__(self, cfg: Config) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.d_model)
            self.attn = Attention(cfg)
            self.ln2 = nn.LayerNorm(cfg.d_model)
            self.mlp = MLP(cfg)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TorchGPT(nn.Module):
        def __init__(self, cfg: Config) -> None:
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
            self.wpe = nn.Embedding(cfg.context, cfg.d_model)
            self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.d_model)

        def forward(self, tokens):
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            t = inputs.shape[1]
            x = self.wte(inputs) + self.wpe.weight[:t]
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T  # tied head
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return TorchGPT
