"""Test configuration: float64 so numerical oracles are tight, and (the
Equinox habit) rank promotion that raises, so silent broadcasting bugs
surface, and cheap XLA compilation (below). Dtype promotion stays 'standard': under 'strict', JAX's own
derivative rules (the oracle) fail, e.g. the jvp of lax.pow with an integer
exponent."""

import os

# XLA's cheapest CPU compilation for the test programs, which are tiny and
# mostly run once: no LLVM optimisation, the legacy fusion emitters. It cuts
# the suite's compile time by about a third; numerics are unchanged (no fast
# math). Set before JAX creates its backend; a user's XLA_FLAGS wins.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true",
)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
