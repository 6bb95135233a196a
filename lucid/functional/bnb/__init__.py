"""bitsandbytes' optimizers as optax transformations, and its 8-bit block-wise quantization.

Each transform mirrors a `bitsandbytes.optim` class (snake_case: `adamw8bit` for
`AdamW8bit`, `paged_adamw8bit` for `PagedAdamW8bit`) with its keywords, defaults and
checks, and gives the numbers of bitsandbytes' CPU backend. Its state is a
[BnbState][lucid.functional.bnb.BnbState] per parameter: 8-bit state as `uint8` codes
with one float32 absmax per block of 256 elements, for parameters of at least
`min_8bit_size` elements; 32-bit state otherwise.
"""

from . import adam as _adam_family
from ._family import BnbState
from ._quant import BLOCK_SIZE, dequantize_blockwise, dynamic_map, quantize_blockwise
from .adam import (
    adam,
    adam8bit,
    adam32bit,
    adamw,
    adamw8bit,
    adamw32bit,
    lamb,
    lamb8bit,
    lamb32bit,
    paged_adam,
    paged_adam8bit,
    paged_adam32bit,
    paged_adamw,
    paged_adamw8bit,
    paged_adamw32bit,
)

SPECS = {**_adam_family.SPECS}
"""`{bitsandbytes class name: (rule, signature)}` of every class (`lucid.optim.bnb`'s)."""

__all__ = [
    "BLOCK_SIZE",
    "BnbState",
    "adam",
    "adam8bit",
    "adam32bit",
    "adamw",
    "adamw8bit",
    "adamw32bit",
    "dequantize_blockwise",
    "dynamic_map",
    "lamb",
    "lamb8bit",
    "lamb32bit",
    "paged_adam",
    "paged_adam8bit",
    "paged_adam32bit",
    "paged_adamw",
    "paged_adamw8bit",
    "paged_adamw32bit",
    "quantize_blockwise",
]
