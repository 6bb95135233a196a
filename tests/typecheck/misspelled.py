"""Calls a static type checker must refuse (``tests/test_typing.py``): each line marked
``# flagged`` misspells one keyword of ``spelled.py``'s line, and the checker must report
an unexpected keyword argument on exactly those lines."""

import jax.numpy as jnp

import lucid
import lucid.functional as LF
import lucid.optim.bnb
import lucid.optim.schedulefree
import lucid.optim.torchao

w = lucid.Parameter(jnp.zeros(3))

lucid.optim.AdamW([w], lr=1e-3, weight_decai=0.1, amsgrad=True, maximize=False)  # flagged
lucid.optim.bnb.AdamW8bit([w], lr=1e-3, min_8bit_sise=16)  # flagged
lucid.optim.torchao.AdamW4bit([w], lr=1e-3, block_sise=128)  # flagged
lucid.optim.schedulefree.AdamWScheduleFree([w], lr=1e-3, warmup_step=10)  # flagged
LF.adam(lr=1e-3, betaz=(0.9, 0.99), amsgrad=True)  # flagged
LF.bnb.lion8bit(lr=1e-4, beta=(0.9, 0.99))  # flagged
LF.schedules.cosine_annealing_lr(0.1, T_maks=100, eta_min=0.0)  # flagged
lucid.optim.lr_scheduler.StepLR(lucid.optim.SGD([w]), step_sise=10, gamma=0.5)  # flagged
lucid.optim.functional.sgd(
    [w.data],
    [w.data],
    [None],
    lr=0.1,
    weight_decai=0.0,
    momentum=0.0,  # flagged
    dampening=0.0,
    nesterov=False,
    maximize=False,
)
