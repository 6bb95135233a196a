"""Low-bit optimizer state, shared by the bitsandbytes and torchao families: each piece
of the codecs written once.

- `codes`: the code books (the dynamic tree map both references build, torchao's 4-bit
  maps).
- `nearest`: the nearest code of a scaled value, by each reference's rule.
- `floats`: rounding to narrower floats (fp8 to nearest, bfloat16 stochastically).
- `blockwise`: the block view, the per-block absmax, decoding, 4-bit packing.
- `chunks`: a block-wise step run over chunks of blocks (the CPU's program).
- `bnb`, `torchao`: each reference's format, composed from the above.
"""
