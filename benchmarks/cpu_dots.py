"""The ensemble row against torch.func on the CPU: XLA:CPU's batched
matrix products against torch.bmm, and the effect of XLA's YNNPACK options.

Times, back to back in bursts (median and quartiles of the ratios over 15
pairs of bursts):

  1. the ensemble's batched products alone under jax.jit, on device-resident
     arrays (forward h @ W, input gradient g @ W^T, weight gradients h^T @ g,
     10 models), compiled three ways (XLA's default, which sends the dots whose
     operands are row-major to YNNPACK; YNNPACK dots off; all YNNPACK fusions
     off), each against torch.bmm with all threads and with one thread;
     functx.jit's own choice between the first two is NOTE [XLA:CPU's
     matrix-product library] in functx/xla_cpu.py;
  2. the ensemble workload of benchmarks/run.py under functx.jit, with no
     options and compiled the same three ways, against torch.func;
  3. with --all: every workload of benchmarks/run.py under functx.jit,
     compiled the three ways, against jax.jit (default), to see what each
     option costs elsewhere;
  4. with --programs (instead of 1-3): programs outside the suite (plain
     products, MLP gradients, a convolution, attention, softmax reductions)
     under jax.jit, YNNPACK dots off and YNNPACK off against the default;
  5. with --libraries: 1-3 compiled with XLA:CPU's other product libraries
     instead (oneDNN, XNNPACK, single-threaded Eigen; each with YNNPACK's
     products off), next to YNNPACK dots off; then the first layer's forward
     product written other ways (split along the model axis, one product
     per model, JAX's folding of the model axis into the weight's columns,
     transposed), under functx.jit's own choice.

Usage: python benchmarks/cpu_dots.py [--all] [--libraries] | --programs   (CPU only; needs torch)
"""

import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402  (the workloads, written once for every backend)

import functx as fx  # noqa: E402

YNN_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}
# XLA's default list is INDIVIDUAL_DOT,REDUCE (named here, so that functx.jit's
# own choice, NOTE [XLA:CPU's matrix-product library], does not apply); the
# second keeps the reductions only.
YNN_DEFAULT = {"xla_cpu_experimental_ynn_fusion_type":
               "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"}
YNN_DOTS_OFF = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
COMPILES = (("XLA's default", YNN_DEFAULT), ("YNNPACK dots off", YNN_DOTS_OFF),
            ("YNNPACK off", YNN_OFF))
LIBRARIES = (
    ("YNNPACK dots off", YNN_DOTS_OFF),
    ("oneDNN", dict(YNN_DOTS_OFF, xla_cpu_use_onednn=True)),
    ("oneDNN dot fusions", dict(YNN_DOTS_OFF, xla_cpu_experimental_onednn_fusion_type=
                                "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT")),
    ("XNNPACK dot fusions", dict(YNN_DOTS_OFF, xla_cpu_experimental_xnn_fusion_type=
                                 "LIBRARY_FUSION_TYPE_DOT")),
    ("single-threaded Eigen", dict(YNN_DOTS_OFF, xla_cpu_multi_thread_eigen=False)),
)
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


def threads(n, call):
    def timed():
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            return call()
        finally:
            torch.set_num_threads(before)

    return timed


def other_programs():
    """Programs outside the suite, each compiled the three ways."""
    rng = np.random.default_rng(0)

    def arr(*shape):
        return jax.device_put((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32))

    def loss(ws, x):
        for w in ws[:-1]:
            x = jax.nn.relu(x @ w)
        return jnp.sum((x @ ws[-1]) ** 2)

    def attention(q, k, v):
        return jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k), axis=-1) @ v

    def conv(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), "SAME")

    programs = [
        ("product 1024x1024x1024", lambda a: a @ a, (arr(1024, 1024),)),
        ("product 256x256x256", lambda a: a @ a, (arr(256, 256),)),
        ("product 64x64x64", lambda a: a @ a, (arr(64, 64),)),
        ("MLP gradient 784-512-512-10, B=128", jax.grad(loss),
         ([arr(784, 512), arr(512, 512), arr(512, 10)], arr(128, 784))),
        ("MLP gradient 32-64-64-1, B=32", jax.grad(loss),
         ([arr(32, 64), arr(64, 64), arr(64, 1)], arr(32, 32))),
        ("vmap over 32 tasks of an MLP gradient 1-40-40-1, B=10",
         jax.vmap(jax.grad(loss), (None, 0)), ([arr(1, 40), arr(40, 40), arr(40, 1)], arr(32, 10, 1))),
        ("convolution 3x3, 32 channels, 32x32, B=16", conv, (arr(16, 32, 32, 32), arr(32, 32, 3, 3))),
        ("attention, 8 heads, 128x64", attention, (arr(8, 128, 64), arr(8, 128, 64), arr(8, 128, 64))),
        ("softmax reductions 512x512", lambda x: jnp.sum(jax.nn.log_softmax(x, -1) * x), (arr(512, 512),)),
    ]
    print("other programs under jax.jit, time / XLA's default (YNNPACK dots off, YNNPACK off):")
    for name, fn, args in programs:
        lowered = jax.jit(fn).lower(*args)
        compiled = [lowered.compile(options) for _, options in COMPILES]
        base = blocking(compiled[0], *args)
        cells = [paired(blocking(c, *args), base) for c in compiled[1:]]
        print(f"  {name}: {', '.join(cells)}", flush=True)


def forward_programs(x, w):
    """The ensemble's first product `x @ W[m]` (x shared by the models),
    written five ways, against torch.matmul."""
    models = w.shape[0]

    def batched(x, w):  # what functx's vmap rule emits (the minibatch broadcast)
        xb = jnp.broadcast_to(x, w.shape[:1] + x.shape)
        return lax.dot_general(xb, w, (((2,), (1,)), ((0,), (0,))), precision="highest")

    def split(parts):
        def f(x, w):
            step = models // parts
            return jnp.concatenate([batched(x, w[i * step:(i + 1) * step])
                                    for i in range(parts)])
        return f

    def per_model(x, w):
        return jnp.stack([jnp.matmul(x, w[i], precision="highest") for i in range(models)])

    def folded(x, w):  # JAX's vmap rule: the model axis among the weight's columns
        out = lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision="highest")
        return jnp.transpose(out, (1, 0, 2))

    def transposed(x, w):  # (W[m]^T @ x^T)^T
        xb = jnp.broadcast_to(x, (models,) + x.shape)
        out = lax.dot_general(w, xb, (((1,), (2,)), ((0,), (0,))), precision="highest")
        return jnp.transpose(out, (0, 2, 1))

    jx, jw = jax.device_put(x), jax.device_put(w)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    torch_call = lambda: torch.matmul(tx, tw)  # noqa: E731
    expected = torch_call().numpy()
    print(f"the forward product x @ W0[m] written other ways, functx.jit, time / torch.matmul "
          f"with {R.cpu_count()} threads:")
    for name, fn in (("batched, minibatch broadcast (functx)", batched),
                     ("split in 2 along the models", split(2)),
                     ("split in 5 along the models", split(5)),
                     ("one product per model", per_model),
                     ("model axis folded into the columns (JAX)", folded),
                     ("transposed, W^T @ x^T", transposed)):
        jitted = fx.jit(fn)
        np.testing.assert_allclose(np.asarray(jitted(jx, jw)), expected, rtol=1e-4, atol=1e-3)
        print(f"  {name}: {paired(blocking(jitted, jx, jw), torch_call)}", flush=True)


def main():
    torch.set_num_threads(R.cpu_count())
    print(f"{R.cpu_model()}, {R.cpu_count()} CPUs, jax {jax.__version__}, torch {torch.__version__}")
    if "--programs" in sys.argv:
        return other_programs()
    compiles = LIBRARIES if "--libraries" in sys.argv else COMPILES
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 64, 784)).astype(np.float32)
    h = rng.standard_normal((10, 64, 256)).astype(np.float32)
    g = rng.standard_normal((10, 64, 256)).astype(np.float32)
    w0 = rng.standard_normal((10, 784, 256)).astype(np.float32)
    w1 = rng.standard_normal((10, 256, 256)).astype(np.float32)
    products = [  # (name, lhs, rhs, contracted axes, the same with torch.bmm)
        ("forward x @ W0", x, w0, (2, 1), lambda a, b: torch.bmm(a, b)),
        ("forward h @ W1", h, w1, (2, 1), lambda a, b: torch.bmm(a, b)),
        ("input gradient g @ W1^T", g, w1, (2, 2), lambda a, b: torch.bmm(a, b.transpose(1, 2))),
        ("weight gradient h^T @ g", h, g, (1, 1), lambda a, b: torch.bmm(a.transpose(1, 2), b)),
        ("weight gradient x^T @ g", x, g, (1, 1), lambda a, b: torch.bmm(a.transpose(1, 2), b)),
    ]
    labels = ", ".join(label for label, _ in compiles)
    print(f"batched products of 10 models, time / torch.bmm with {R.cpu_count()} threads "
          f"and with 1 thread ({labels}):")
    for name, a, b, (ca, cb), bmm in products:
        def product(a, b, ca=ca, cb=cb):
            return lax.dot_general(a, b, (((ca,), (cb,)), ((0,), (0,))), precision="highest")

        ja, jb = jax.device_put(a), jax.device_put(b)  # numpy inputs would be copied per call
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        torch_call = lambda: bmm(ta, tb)  # noqa: E731
        lowered = jax.jit(product).lower(ja, jb)
        compiled = [lowered.compile(options) for _, options in compiles]
        library = ("YNNPACK" if "__ynn_fusion" in lowered.compile(YNN_DEFAULT).as_text()
                   else "XLA's own dot")
        cells = [f"{paired(blocking(c, ja, jb), torch_call)} / "
                 f"{paired(blocking(c, ja, jb), threads(1, torch_call))}" for c in compiled]
        print(f"  {name} ({library} by default): {', '.join(cells)}", flush=True)

    workload = next(wl for wl in R.WORKLOADS if wl.name.startswith("ensemble"))
    data = workload.data()
    args, targs = R.convert(data, R.JAX), R.convert(data, R.TORCH)
    tf = workload.build(R.TORCH)
    torch_call = lambda: tf(*targs)  # noqa: E731
    print(f"{workload.name}, time / torch.func eager:")
    for label, options in (("no options (its own choice)", None),) + compiles:
        fn = fx.jit(workload.build(R.FUNCTX), compiler_options=options)
        print(f"  functx.jit, {label}: {paired(blocking(fn, *args), torch_call)}", flush=True)
    if "--libraries" in sys.argv:
        forward_programs(x[0], w0)
    if "--all" not in sys.argv:
        return
    print(f"every workload, functx.jit time / jax.jit time ({labels}):")
    for workload in R.WORKLOADS:
        args = R.convert(workload.data(), R.JAX)
        reference = blocking(jax.jit(workload.build(R.JAX)), *args)
        cells = [paired(blocking(fx.jit(workload.build(R.FUNCTX), compiler_options=options),
                                 *args), reference)
                 for _, options in compiles]
        print(f"  {workload.name}: {', '.join(cells)}", flush=True)


if __name__ == "__main__":
    main()
