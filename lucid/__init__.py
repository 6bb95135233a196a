"""lucid: PyTorch's optimizers and LR schedulers, rebuilt for JAX.

Two layers over one set of update rules:

* [lucid.optim][] is torch.optim's stateful API (optimizers, `lr_scheduler`,
  `swa_utils`) over [Parameter][lucid.Parameter]s, whose gradients
  [backward][lucid.backward] accumulates; [compile_optimizer][lucid.compile_optimizer]
  and [fused_step][lucid.fused_step] run its steps as one XLA executable;
* [lucid.functional][] holds the same rules as pure optax transformations, and
  torch's schedulers as functions of the step count.

[lucid.nn][] holds the parts of `torch.nn.utils` a training loop calls
(gradient clipping).

Examples:
  >>> import jax.numpy as jnp, lucid
  >>> w = lucid.Parameter(jnp.array([1.0, -1.0]))
  >>> opt = lucid.optim.SGD([w], lr=0.1)
  >>> loss = lucid.backward(lambda w: (w ** 2).sum(), w)
  >>> opt.step()
  >>> [round(x, 4) for x in w.data.tolist()]
  [0.8, -0.8]
"""

from . import functional, nn, optim
from ._backward import backward
from ._compilation_cache import enable_compilation_cache
from ._parameter import Parameter
from ._trees import named_parameters, parameters, values
from .optim import compile_optimizer, fused_step

__all__ = [
    "Parameter",
    "backward",
    "compile_optimizer",
    "enable_compilation_cache",
    "functional",
    "fused_step",
    "named_parameters",
    "nn",
    "optim",
    "parameters",
    "values",
]
# the one place the version is written: pyproject.toml reads it (setuptools dynamic version)
__version__ = "0.1.0"
