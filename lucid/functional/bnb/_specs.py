"""Every bitsandbytes class's rule and signature, by the class's name: what
`lucid.optim.bnb` declares its classes from."""

from __future__ import annotations

# `from .adam import ...`, not `from . import adam`: the package's `adam` is the function
from .adagrad import SPECS as ADAGRAD_SPECS
from .adam import SPECS as ADAM_SPECS
from .ademamix import SPECS as ADEMAMIX_SPECS
from .lion import SPECS as LION_SPECS
from .rmsprop import SPECS as RMSPROP_SPECS
from .sgd import SPECS as SGD_SPECS

SPECS = {
    **ADAGRAD_SPECS,
    **ADAM_SPECS,
    **ADEMAMIX_SPECS,
    **LION_SPECS,
    **RMSPROP_SPECS,
    **SGD_SPECS,
}
"""`{bitsandbytes class name: (rule, signature)}` of every class (`lucid.optim.bnb`'s)."""
