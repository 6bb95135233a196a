"""lucid: PyTorch's optimizers and LR schedulers, rebuilt for JAX."""

from . import functional, optim
from ._parameter import Parameter, backward

__all__ = ["Parameter", "backward", "functional", "optim"]
__version__ = "0.1.0"
