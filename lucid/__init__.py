"""lucid: PyTorch's optimizers and LR schedulers, rebuilt for JAX."""

from . import functional

__all__ = ["functional"]
__version__ = "0.1.0"
