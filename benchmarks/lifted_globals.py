"""A lifted loss reading a global model that a training loop replaces at
every step (NOTE [lifted functions keyed by what they read] in
functx/lifting.py): functx's `grad(lift(loss))` against JAX eager's
`jax.grad(loss)`, and against the same loss with the model left alone.

In one process, the three alternate step by step (`--steps` each, after
`--warm` warm-up steps); each step replaces the model's arrays (waited for
outside the timed call). Medians of wall time per call, and their ratios.

    python benchmarks/lifted_globals.py [--steps N] [--warm N]
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import functx as fx

SIZES = (32, 64, 64, 10)
rng = np.random.default_rng(0)
model = [jnp.asarray(rng.standard_normal((a, b)) / np.sqrt(a), jnp.float32)
         for a, b in zip(SIZES[:-1], SIZES[1:])]


def loss(x):
    h = x
    for w in model[:-1]:
        h = jnp.tanh(h @ w)
    return jnp.sum((h @ model[-1]) ** 2)


def main():
    global model
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warm", type=int, default=30)
    args = parser.parse_args()
    x = jnp.asarray(rng.standard_normal((64, SIZES[0])), jnp.float32)
    functx_grad, jax_grad = fx.grad(fx.lift(loss)), jax.grad(loss)
    times = {"functx, model replaced": [], "JAX eager, model replaced": [],
             "functx, same model": []}
    for step in range(args.warm + args.steps):
        for name, g, replace in (("functx, model replaced", functx_grad, True),
                                 ("JAX eager, model replaced", jax_grad, True),
                                 ("functx, same model", functx_grad, False)):
            if replace:
                model = [jax.block_until_ready(w * 0.999) for w in model]
            t0 = time.perf_counter()
            jax.block_until_ready(g(x))
            if step >= args.warm:
                times[name].append(time.perf_counter() - t0)
    assert np.allclose(functx_grad(x), jax_grad(x), rtol=1e-4, atol=1e-5)
    base = statistics.median(times["JAX eager, model replaced"])
    print(f"MLP {'-'.join(map(str, SIZES))}, batch 64, {args.steps} steps after {args.warm}")
    print("| call | median ms | over JAX eager |")
    print("|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {1e3 * m:.2f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
