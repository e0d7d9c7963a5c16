"""The ensemble row against torch.func on the CPU: XLA:CPU's batched
matrix products against torch.bmm, and the effect of one XLA option.

Times, back to back in bursts (median and quartiles of the ratios over 15
pairs of bursts):

  1. the ensemble's three kinds of batched product under jax.jit (forward
     h @ W, input gradient g @ W^T, weight gradient h^T @ g, 10 models of
     784x256), as XLA compiles them by default and with YNNPACK fusions off
     (compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}), each
     against the same torch.bmm;
  2. the ensemble workload of benchmarks/run.py under functx.jit, default
     and with YNNPACK fusions off, against torch.func;
  3. with --all: every workload of benchmarks/run.py under functx.jit,
     default and with YNNPACK fusions off, against jax.jit (default), to
     see what the option costs elsewhere.

Usage: python benchmarks/cpu_dots.py [--all]   (CPU only; needs torch)
"""

import os
import statistics
import sys
import time

import jax
import numpy as np
import torch
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402  (the workloads, written once for every backend)

import functx as fx  # noqa: E402

YNN_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}
PAIRS = 15


def burst(call, n):
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n


def paired(call, base, seconds=0.05):
    """Quartiles of call/base time ratios over PAIRS back-to-back bursts."""
    call(), base()
    n = max(1, int(seconds / max(burst(base, 1), 1e-6)))
    ratios = []
    for r in range(PAIRS):
        if r % 2:
            b, a = burst(base, n), burst(call, n)
        else:
            a, b = burst(call, n), burst(base, n)
        ratios.append(a / b)
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return f"{med:.2f}x [{q1:.2f}-{q3:.2f}]"


def blocking(fn, *args):
    return lambda: jax.block_until_ready(fn(*args))


def main():
    torch.set_num_threads(R.cpu_count())
    print(f"{R.cpu_model()}, {R.cpu_count()} CPUs, jax {jax.__version__}, torch {torch.__version__}")
    rng = np.random.default_rng(0)
    h = rng.standard_normal((10, 64, 784)).astype(np.float32)
    g = rng.standard_normal((10, 64, 256)).astype(np.float32)
    w = rng.standard_normal((10, 784, 256)).astype(np.float32)
    th, tg, tw = map(torch.from_numpy, (h, g, w))
    products = [  # (name, lhs, rhs, contracted axes, the same with torch.bmm)
        ("forward h @ W", h, w, (2, 1), lambda: torch.bmm(th, tw)),
        ("input gradient g @ W^T", g, w, (2, 2), lambda: torch.bmm(tg, tw.transpose(1, 2))),
        ("weight gradient h^T @ g", h, g, (1, 1), lambda: torch.bmm(th.transpose(1, 2), tg)),
    ]
    print("batched products of 10 models, time / torch.bmm (default, YNNPACK fusions off):")
    for name, a, b, (ca, cb), bmm in products:
        def product(a, b, ca=ca, cb=cb):
            return lax.dot_general(a, b, (((ca,), (cb,)), ((0,), (0,))), precision="highest")

        lowered = jax.jit(product).lower(a, b)
        default, off = lowered.compile(), lowered.compile(YNN_OFF)
        library = "YNNPACK" if "__ynn_fusion" in default.as_text() else "XLA's own dot"
        print(f"  {name} ({library} by default): {paired(blocking(default, a, b), bmm)}, "
              f"{paired(blocking(off, a, b), bmm)}")

    workload = next(wl for wl in R.WORKLOADS if wl.name.startswith("ensemble"))
    data = workload.data()
    args, targs = R.convert(data, R.JAX), R.convert(data, R.TORCH)
    tf = workload.build(R.TORCH)
    torch_call = lambda: tf(*targs)  # noqa: E731
    print(f"{workload.name}, time / torch.func eager:")
    for label, options in (("functx.jit", None), ("functx.jit, YNNPACK fusions off", YNN_OFF)):
        fn = fx.jit(workload.build(R.FUNCTX), compiler_options=options)
        print(f"  {label}: {paired(blocking(fn, *args), torch_call)}")
    if "--all" not in sys.argv:
        return
    print("every workload, functx.jit time / jax.jit time (default, YNNPACK fusions off):")
    for workload in R.WORKLOADS:
        args = R.convert(workload.data(), R.JAX)
        reference = blocking(jax.jit(workload.build(R.JAX)), *args)
        cells = [paired(blocking(fx.jit(workload.build(R.FUNCTX), compiler_options=options),
                                 *args), reference)
                 for options in (None, YNN_OFF)]
        print(f"  {workload.name}: {cells[0]}, {cells[1]}", flush=True)


if __name__ == "__main__":
    main()
