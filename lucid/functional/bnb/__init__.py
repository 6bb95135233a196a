"""bitsandbytes' optimizers as optax transformations, and its 8-bit block-wise quantization.

Each transform mirrors a `bitsandbytes.optim` class (snake_case: `adamw8bit` for
`AdamW8bit`, `paged_adamw8bit` for `PagedAdamW8bit`) with its keywords, defaults and
checks, and gives the numbers of bitsandbytes' CPU backend. Its state is a
[BnbState][lucid.functional.bnb.BnbState] per parameter: 8-bit state as `uint8` codes
with one float32 absmax per block of 256 elements, for parameters of at least
`min_8bit_size` elements; 32-bit state otherwise.
"""

from .._lowbit.bnb import BLOCK_SIZE, dequantize_blockwise, dynamic_map, quantize_blockwise
from ._family import BnbState
from .adagrad import (
    adagrad,
    adagrad8bit,
    adagrad32bit,
)
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
from .ademamix import (
    ademamix,
    ademamix8bit,
    ademamix32bit,
    paged_ademamix,
    paged_ademamix8bit,
    paged_ademamix32bit,
)
from .lion import (
    lion,
    lion8bit,
    lion32bit,
    paged_lion,
    paged_lion8bit,
    paged_lion32bit,
)
from .rmsprop import (
    rmsprop,
    rmsprop8bit,
    rmsprop32bit,
)
from .sgd import (
    lars,
    lars8bit,
    lars32bit,
    sgd,
    sgd8bit,
    sgd32bit,
)

__all__ = [
    "BLOCK_SIZE",
    "BnbState",
    "adagrad",
    "adagrad8bit",
    "adagrad32bit",
    "adam",
    "adam8bit",
    "adam32bit",
    "adamw",
    "adamw8bit",
    "adamw32bit",
    "ademamix",
    "ademamix8bit",
    "ademamix32bit",
    "dequantize_blockwise",
    "dynamic_map",
    "lamb",
    "lamb8bit",
    "lamb32bit",
    "lars",
    "lars8bit",
    "lars32bit",
    "lion",
    "lion8bit",
    "lion32bit",
    "paged_adam",
    "paged_adam8bit",
    "paged_adam32bit",
    "paged_adamw",
    "paged_adamw8bit",
    "paged_adamw32bit",
    "paged_ademamix",
    "paged_ademamix8bit",
    "paged_ademamix32bit",
    "paged_lion",
    "paged_lion8bit",
    "paged_lion32bit",
    "quantize_blockwise",
    "rmsprop",
    "rmsprop8bit",
    "rmsprop32bit",
    "sgd",
    "sgd8bit",
    "sgd32bit",
]
