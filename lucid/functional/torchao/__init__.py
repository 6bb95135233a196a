"""torchao's low-bit Adam optimizers (`torchao.optim`) as optax transformations.

`adam8bit`, `adamw8bit`, `adam4bit`, `adamw4bit`, `adam_fp8` and `adamw_fp8` keep
Adam's two moments quantized block-wise (8-bit or 4-bit codes with float32
scales, or float8 with float32 scales), with torchao's code maps, rounding,
order of operations and small-tensor exception, so that on the same inputs the
stored codes are torchao's and the parameters match to float32 rounding. The
quantization itself is public: `quantize`, `dequantize`, `qmap` and
`bf16_stochastic_round`. The stateful classes are in [lucid.optim.torchao][].
"""

from .._lowbit.codes import qmap
from .._lowbit.floats import bf16_stochastic_round
from .._lowbit.torchao import dequantize, quantize
from .adam import (
    LowBitAdamState,
    adam4bit,
    adam8bit,
    adam_fp8,
    adamw4bit,
    adamw8bit,
    adamw_fp8,
    is_quantized,
)

__all__ = [
    "LowBitAdamState",
    "adam4bit",
    "adam8bit",
    "adam_fp8",
    "adamw4bit",
    "adamw8bit",
    "adamw_fp8",
    "bf16_stochastic_round",
    "dequantize",
    "is_quantized",
    "qmap",
    "quantize",
]
