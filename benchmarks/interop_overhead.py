"""What importing functx costs plain JAX code (NOTE [JAX on functx values]
in functx/interop.py: functx wraps `Primitive.bind`, `custom_jvp/vjp`
calls, `lax.asarray`, jit's Python path and the binary operators of JAX's
arrays).

Two tables:
1. In one process, each hooked JAX entry point against the function it
   wraps (`__wrapped__`), called alternately on plain arrays: the hook's own
   cost per call, free of process-to-process noise (median of 21 pairs).
2. Whole calls of plain JAX code in fresh processes, alternating "JAX
   alone" and "JAX with functx imported" (medians over the pairs; on a
   shared machine the process-to-process spread is large, see min-max).

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


HOOKS = """
import time, statistics
import jax, jax.numpy as jnp
from jax._src import core as jcore, custom_derivatives as cd
from jax._src.lax import lax as lax_module
import functx  # noqa: F401  (installs the hooks)
x = jnp.linspace(0.0, 1.0, 16); y = jnp.ones(16)
hooked_bind = jcore.Primitive.bind
cases = {
    "Primitive.bind (lax.add_p)": (lambda: hooked_bind(jax.lax.add_p, x, y),
                                   lambda: hooked_bind.__wrapped__(jax.lax.add_p, x, y)),
    "custom_jvp call (jax.nn.relu)": (lambda: jax.nn.relu(x),
                                      lambda: cd.custom_jvp.__call__.__wrapped__(jax.nn.relu, x)),
    "lax.asarray": (lambda: lax_module.asarray(x), lambda: lax_module.asarray.__wrapped__(x)),
    "jax.Array operator (x * y)": (lambda: x * y, lambda: type(x).__mul__.__wrapped__(x, y)),
}
def per_call(f, n=300):
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e6
for name, (hooked, plain) in cases.items():
    for _ in range(100): hooked(); plain()
    extra, base = [], []
    for _ in range(21):
        h, p = per_call(hooked), per_call(plain)
        extra.append(h - p); base.append(p)
    print(f"| `{name}` | {statistics.median(base):.2f} | {statistics.median(extra):+.2f} |")
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print("| hooked entry point | JAX's own (µs per call) | added by the hook (µs, median of 21) |")
    print("|---|---|---|")
    out = subprocess.run([sys.executable, "-c", HOOKS], capture_output=True, text=True, check=True)
    print(out.stdout.strip())
    print()
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
