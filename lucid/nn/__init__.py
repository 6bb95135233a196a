"""The parts of `torch.nn` a training loop calls on parameters: [lucid.nn.utils][]."""

from . import utils

__all__ = ["utils"]
