"""One module per interpreter: eval (lowering to JAX), jvp, reverse,
batching, staging."""
