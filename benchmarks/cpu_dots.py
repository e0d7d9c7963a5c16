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
     products off, and each skipped with a line saying so when the compiled
     product does not use it), next to YNNPACK dots off; then the first layer's forward
     product written other ways (split along the model axis, one product
     per model, JAX's folding of the model axis into the weight's columns,
     transposed), under functx.jit's own choice; and the multiply-add rates
     of the batched product against one product of the same work with ten
     times the rows, and whether XLA overlaps two independent products.

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
# XLA:CPU's other product libraries, each with YNNPACK's products off, and the
# name that a product sent to it carries in the compiled program (None: a
# runtime option, which leaves the program as it is). A library whose name is
# missing from the compiled forward product is not in this jaxlib, or not for
# these products: with jax 0.10.2 oneDNN's and XNNPACK's options compile the
# same program as YNNPACK dots off, so timing them would time XLA's own dot.
LIBRARIES = (
    ("YNNPACK dots off", YNN_DOTS_OFF, None),
    ("oneDNN", dict(YNN_DOTS_OFF, xla_cpu_use_onednn=True), "onednn"),
    ("oneDNN custom calls", dict(YNN_DOTS_OFF, xla_cpu_use_onednn=True,
                                 xla_cpu_experimental_onednn_custom_call=True), "onednn"),
    ("oneDNN dot fusions", dict(YNN_DOTS_OFF, xla_cpu_experimental_onednn_fusion_type=
                                "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"), "onednn"),
    ("XNNPACK dot fusions", dict(YNN_DOTS_OFF, xla_cpu_experimental_xnn_fusion_type=
                                 "LIBRARY_FUSION_TYPE_DOT"), "xnn_fusion"),
    ("single-threaded Eigen", dict(YNN_DOTS_OFF, xla_cpu_multi_thread_eigen=False), None),
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


def present_libraries(x, w):
    """The LIBRARIES that a batched product compiled with their options is
    sent to, as (label, options) pairs; says which are missing."""
    product = jax.jit(lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))))
    lowered = product.lower(jax.device_put(x), jax.device_put(w))
    present = []
    for label, options, marker in LIBRARIES:
        if marker is None or marker in lowered.compile(options).as_text().lower():
            present.append((label, options))
        else:
            print(f"{label}: not used by this jaxlib (no '{marker}' in the compiled product "
                  f"with {options}); skipped")
    return tuple(present)


def best_time(call, seconds=0.3):
    """Least mean time per call over 7 bursts."""
    call()
    n = max(1, int(seconds / 7 / max(burst(call, 1), 1e-6)))
    return min(burst(call, n) for _ in range(7))


def throughput(x, w):
    """Where the time goes: multiply-add rates of one batched product of ten
    64-row matrices (the ensemble's first layer) against one product of the
    same work with 640 rows, in XLA (YNNPACK dots off) and torch; and whether
    XLA runs two independent products of one program side by side."""
    models, rows, k = x.shape
    n = w.shape[-1]
    flops = 2 * models * rows * k * n
    batched = jax.jit(lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))))
    tall = jax.jit(lambda a, b: a @ b)
    jx, jw = jax.device_put(x), jax.device_put(w)
    jx2, jw2 = jax.device_put(x.reshape(models * rows, k)), jax.device_put(w[0])
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    tx2, tw2 = torch.from_numpy(x.reshape(models * rows, k)), torch.from_numpy(w[0])
    cases = [(f"batched {models}x{rows}x{k}x{n}", batched, (jx, jw), lambda: torch.bmm(tx, tw)),
             (f"one product {models * rows}x{k}x{n}", tall, (jx2, jw2), lambda: tx2 @ tw2)]
    print("GFLOP/s (XLA with YNNPACK dots off, torch with 1 thread, torch with "
          f"{R.cpu_count()} threads):")
    for name, fn, args, torch_call in cases:
        compiled = fn.lower(*args).compile(YNN_DOTS_OFF)
        rates = [flops / best_time(blocking(compiled, *args)),
                 flops / best_time(threads(1, torch_call)),
                 flops / best_time(torch_call)]
        print(f"  {name}: " + ", ".join(f"{r / 1e9:.0f}" for r in rates), flush=True)
    half = models // 2
    a, b = jax.device_put(x[:half]), jax.device_put(w[:half])
    c, d = jax.device_put(x[half:]), jax.device_put(w[half:])
    one = jax.jit(lambda a, b, c, d: batched(a, b)).lower(a, b, c, d).compile(YNN_DOTS_OFF)
    two = jax.jit(lambda a, b, c, d: (batched(a, b), batched(c, d))).lower(a, b, c, d).compile(
        YNN_DOTS_OFF)
    print(f"two independent products of {half} models in one program, time / one of them: "
          f"{paired(blocking(two, a, b, c, d), blocking(one, a, b, c, d))} "
          "(2.00x: one after the other)", flush=True)


def main():
    torch.set_num_threads(R.cpu_count())
    print(f"{R.cpu_model()}, {R.cpu_count()} CPUs, jax {jax.__version__}, torch {torch.__version__}")
    if "--programs" in sys.argv:
        return other_programs()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 64, 784)).astype(np.float32)
    h = rng.standard_normal((10, 64, 256)).astype(np.float32)
    g = rng.standard_normal((10, 64, 256)).astype(np.float32)
    w0 = rng.standard_normal((10, 784, 256)).astype(np.float32)
    w1 = rng.standard_normal((10, 256, 256)).astype(np.float32)
    compiles = present_libraries(x, w0) if "--libraries" in sys.argv else COMPILES
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
        throughput(x, w0)
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
