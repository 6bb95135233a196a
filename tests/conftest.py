import jax

# float64 parity needs x64; float32 runs pass explicit dtypes, so they are unaffected.
jax.config.update("jax_enable_x64", True)
