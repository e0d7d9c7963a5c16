"""Per-primitive cost of the interpreter stack: a chain of 20 elementwise
ops under grad, under vmap and with no transform, against JAX's eager
transforms and (if installed) torch.func. Prints microseconds per op
(best of several repeats, so background load matters less).

Then the cost of functx.numpy itself with no transform (NOTE [plain calls]
in functx/numpy/__init__.py): single calls of functx.numpy functions against
the same jax.numpy calls, timed in alternating bursts (median over 21 pairs
of the extra time and of the ratio)."""

import statistics
import time

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp

N_OPS = 20


def best_us(fn, number=50, repeat=7):
    fn()
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return min(times) * 1e6


def chain(np_, x):
    for _ in range(N_OPS):
        x = np_.sin(x)
    return x.sum()


def main():
    x = jnp.ones(3)
    xs = jnp.ones((8, 3))
    rows = []
    fx_grad = fx.grad(lambda x: chain(fnp, x))
    jax_grad = jax.grad(lambda x: chain(jnp, x))
    fx_vmap = fx.vmap(lambda x: chain(fnp, x))
    jax_vmap = jax.vmap(lambda x: chain(jnp, x))
    rows.append(("grad", best_us(lambda: fx_grad(x)), best_us(lambda: jax_grad(x), number=10)))
    rows.append(("vmap", best_us(lambda: fx_vmap(xs)), best_us(lambda: jax_vmap(xs), number=10)))
    rows.append(("none", best_us(lambda: chain(fnp, x)), best_us(lambda: chain(jnp, x))))
    torch_times = {}
    try:
        import torch
        from torch.func import grad as tgrad, vmap as tvmap

        tx, txs = torch.ones(3), torch.ones(8, 3)
        tg, tv = tgrad(lambda x: chain(torch, x)), tvmap(lambda x: chain(torch, x))
        torch_times = {
            "grad": best_us(lambda: tg(tx)),
            "vmap": best_us(lambda: tv(txs)),
            "none": best_us(lambda: chain(torch, tx)),
        }
    except ImportError:
        pass
    print(f"per-op cost of a {N_OPS}-op chain (microseconds per op; lower is better)")
    print(f"{'transform':<10}{'functx':>10}{'jax':>10}{'torch.func':>12}{'functx/jax':>12}{'functx/torch':>14}")
    for name, f, j in rows:
        t = torch_times.get(name)
        tcol = f"{t / N_OPS:12.1f}" if t else f"{'n/a':>12}"
        rt = f"{f / t:14.2f}" if t else f"{'n/a':>14}"
        print(f"{name:<10}{f / N_OPS:10.1f}{j / N_OPS:10.1f}{tcol}{f / j:12.2f}{rt}")


def plain_calls():
    x, y = jnp.ones((3, 3)), jnp.full((3, 3), 2.0)
    calls = [
        ("sin(x)", lambda np_: np_.sin(x)),
        ("add(x, y)", lambda np_: np_.add(x, y)),
        ("matmul(x, y)", lambda np_: np_.matmul(x, y)),
        ("sum(x, axis=(0, 1))", lambda np_: np_.sum(x, axis=(0, 1))),
        ("reshape(x, (9,))", lambda np_: np_.reshape(x, (9,))),
        ("transpose(x, (1, 0))", lambda np_: np_.transpose(x, (1, 0))),
        ("stack([x, y])", lambda np_: np_.stack([x, y])),
        ("where(x > 1, x, 0.0)", lambda np_: np_.where(x > 1, x, 0.0)),
    ]
    print("\nno transform: a functx.numpy call against the jax.numpy call "
          "(median of 21 alternating pairs of bursts)")
    print(f"{'call':<24}{'jax.numpy us':>14}{'extra us':>10}{'functx/jax':>12}")
    for name, call in calls:
        ours, theirs = (lambda: call(fnp)), (lambda: call(jnp))
        ours(), theirs()
        extra, ratio, base = [], [], []
        for i in range(21):
            if i % 2:
                a, b = best_us(ours, 200, 1), best_us(theirs, 200, 1)
            else:
                b, a = best_us(theirs, 200, 1), best_us(ours, 200, 1)
            extra.append(a - b)
            ratio.append(a / b)
            base.append(b)
        print(f"{name:<24}{statistics.median(base):14.1f}{statistics.median(extra):10.2f}"
              f"{statistics.median(ratio):12.3f}")


if __name__ == "__main__":
    main()
    plain_calls()
