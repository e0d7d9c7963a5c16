"""What importing functx costs plain JAX code (NOTE [JAX on functx values]
in functx/interop.py: functx wraps `Primitive.bind`, `custom_jvp/vjp`
calls, `lax.asarray` and jit's Python path). Each case is timed in fresh
processes, alternating "JAX alone" and "JAX with functx imported", and the
table reports medians over the pairs of the per-call time and of the ratio.

    python benchmarks/interop_overhead.py [--pairs N]
"""

import argparse
import json
import statistics
import subprocess
import sys

CASES = {
    # Python-level binds (no jit): every op goes through Primitive.bind
    "lax.add (bind)": "f = lambda: jax.lax.add(x, y)",
    "lax.sin (bind)": "f = lambda: jax.lax.sin(x)",
    # jnp functions: C++ jit fast path
    "jnp.sin": "f = lambda: jnp.sin(x)",
    "x + y": "f = lambda: x + y",
    # custom_jvp function (wrapped __call__)
    "jax.nn.relu": "f = lambda: jax.nn.relu(x)",
    # a small program under jax.grad (tracing: many binds)
    "jax.grad(tanh chain)": (
        "g = jax.grad(lambda v: jnp.tanh(jnp.tanh(v) * 2.0).sum())\nf = lambda: g(x)"),
    # jnp.asarray of a list (wrapped conversion)
    "jnp.asarray(list)": "f = lambda: jnp.asarray([1.0, 2.0, 3.0])",
}

TIMER = """
import time, statistics, sys
import jax, jax.numpy as jnp
if {with_functx}:
    import functx  # noqa: F401
x = jnp.linspace(0.0, 1.0, 16); y = jnp.ones(16)
{setup}
for _ in range(200): jax.block_until_ready(f())
best = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(300): f()
    jax.block_until_ready(f())
    best.append((time.perf_counter() - t) / 301)
print(min(best) * 1e6)
"""


def time_case(setup, with_functx):
    code = TIMER.format(with_functx=with_functx, setup=setup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = {}
    for name, setup in CASES.items():
        alone, both, ratios = [], [], []
        for _ in range(args.pairs):
            a = time_case(setup, False)
            b = time_case(setup, True)
            alone.append(a)
            both.append(b)
            ratios.append(b / a)
        rows[name] = (statistics.median(alone), statistics.median(both), statistics.median(ratios),
                      min(ratios), max(ratios))
    if args.json:
        print(json.dumps(rows))
        return
    print(f"| plain JAX call | JAX alone (µs) | functx imported (µs) | ratio, median [min-max] over {args.pairs} pairs |")
    print("|---|---|---|---|")
    for name, (a, b, r, lo, hi) in rows.items():
        print(f"| `{name}` | {a:.2f} | {b:.2f} | {r:.3f} [{lo:.2f}-{hi:.2f}] |")


if __name__ == "__main__":
    main()
