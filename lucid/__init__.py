"""lucid: PyTorch's optimizers and LR schedulers, rebuilt for JAX."""

from . import functional, nn, optim
from ._parameter import Parameter
from ._trace import backward
from .optim import compile_optimizer, fused_step

__all__ = ["Parameter", "backward", "compile_optimizer", "functional", "fused_step", "nn", "optim"]
__version__ = "0.1.0"
