"""Test configuration: float64 so numerical oracles are tight, and (the
Equinox habit) rank promotion that raises, so silent broadcasting bugs
surface, and cheap XLA compilation (below). Dtype promotion stays 'standard': under 'strict', JAX's own
derivative rules (the oracle) fail, e.g. the jvp of lax.pow with an integer
exponent."""

import os

# XLA's cheapest CPU compilation for the test programs (tests/xla_options.py:
# the options this jaxlib knows). It cuts the suite's compile time by about a
# third on jax 0.10. Set before JAX creates its backend; a user's XLA_FLAGS wins.
if "XLA_FLAGS" not in os.environ:
    import xla_options

    os.environ["XLA_FLAGS"] = xla_options.env_flags()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
