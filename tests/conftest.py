"""Test configuration: float64 so numerical oracles are tight, and (the
Equinox habit) rank promotion that raises, so silent broadcasting bugs
surface. Dtype promotion stays 'standard': under 'strict', JAX's own
derivative rules (the oracle) fail, e.g. the jvp of lax.pow with an integer
exponent."""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
