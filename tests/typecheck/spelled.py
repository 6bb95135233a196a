"""Calls a static type checker must accept (``tests/test_typing.py``): the twin of
``misspelled.py``, line for line, with every keyword spelled as lucid spells it."""

import jax.numpy as jnp

import lucid
import lucid.functional as LF
import lucid.optim.bnb
import lucid.optim.schedulefree
import lucid.optim.torchao

w = lucid.Parameter(jnp.zeros(3))

lucid.optim.AdamW([w], lr=1e-3, weight_decay=0.1, amsgrad=True, maximize=False)
lucid.optim.bnb.AdamW8bit([w], lr=1e-3, min_8bit_size=16)
lucid.optim.torchao.AdamW4bit([w], lr=1e-3, block_size=128)
lucid.optim.schedulefree.AdamWScheduleFree([w], lr=1e-3, warmup_steps=10)
LF.adam(lr=1e-3, betas=(0.9, 0.99), amsgrad=True)
LF.bnb.lion8bit(lr=1e-4, betas=(0.9, 0.99))
LF.schedules.cosine_annealing_lr(0.1, T_max=100, eta_min=0.0)
lucid.optim.lr_scheduler.StepLR(lucid.optim.SGD([w]), step_size=10, gamma=0.5)
lucid.optim.functional.sgd(
    [w.data],
    [w.data],
    [None],
    lr=0.1,
    weight_decay=0.0,
    momentum=0.0,
    dampening=0.0,
    nesterov=False,
    maximize=False,
)
