"""The benchmark suite: functx (eager and under functx.jit) against JAX's own
transforms (eager and under jax.jit) and torch.func (eager), on the
workloads of the benchmark issue.

Every workload's program is written once, against a `Backend` (the array
namespace plus the transforms), and instantiated for functx, JAX and
torch.func from the same NumPy float32 weights. Before timing, the five
implementations' results are checked against jax.jit's. Timing interleaves
the implementations: each round times each of them once (several calls,
JAX outputs blocked on), and the table shows the median over the rounds.
Steady state means after warm-up calls: functx eager compiles a repeated
primitive step on its second sighting and a repeated tape on its third, off
the calling thread; the warm-up repeats calls until no compile is left
(`settle`).

Tables printed:
  1. steady-state median time per call, and the ratios;
  2. paired ratios of functx.jit to jax.jit and to torch.func, and of
     functx eager to torch.func eager: bursts of
     the two timed back to back, many times, so that the machine's drift
     (slower than a pair of bursts) cancels in each ratio;
  3. first call (trace + compile + run) of a freshly built functx.jit vs
     jax.jit function;
  4. peak memory of vmap(chunk_size=k) and jacrev(chunk_size=k): compiled
     memory analysis of the jitted programs, and the measured peak of the
     eager runs (in child processes).

Usage: python benchmarks/run.py [--quick] [--markdown] [--only TEXT[,TEXT...]] [--memory-only]
"""

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import functx as fx
import functx.numpy as fnp
from _common import MAML_INNER_LR, MAML_INNER_STEPS, init_mlp, maml_data, render

try:
    import torch
    import torch.func as tfunc
except ImportError:
    torch = None

# Float32 matmuls at full precision everywhere (JAX on GPU would otherwise use
# TF32, and the results could not be compared with torch's).
jax.config.update("jax_default_matmul_precision", "highest")


# ---------------------------------------------------------------------------
# Backends: one array namespace and one set of transforms each.


def _jax_grad_and_value(func, argnums=0):
    def wrapped(*args):
        value, g = jax.value_and_grad(func, argnums)(*args)
        return g, value

    return wrapped


def _hvp_by(jvp, grad_and_value):
    """hvp(func, primals, tangents) -> (value, products) as forward-over-
    reverse, for the libraries without one (JAX; torch.func has it only in
    torch.autograd.functional)."""

    def hvp(func, primals, tangents):
        argnums = tuple(range(len(primals)))
        (_, value), (products, _) = jvp(grad_and_value(func, argnums), primals, tangents)
        return value, products

    return hvp


def _jax_vmap(func, in_dims=0, out_dims=0):
    return jax.vmap(func, in_axes=in_dims, out_axes=out_dims)


def _block(out):
    return jax.block_until_ready(out)


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    np: object  # functx.numpy, jax.numpy or torch
    relu: Callable
    log_softmax: Callable  # over the last axis
    grad: Callable
    grad_and_value: Callable
    vmap: Callable
    jacrev: Callable
    jacfwd: Callable
    hessian: Callable
    hvp: Callable
    asarray: Callable  # NumPy array -> backend array
    sync: Callable = _block  # waits for an output


FUNCTX = Backend(
    "functx", fnp, fx.nn.relu, lambda z: fx.nn.log_softmax(z, axis=-1),
    fx.grad, fx.grad_and_value, fx.vmap, fx.jacrev, fx.jacfwd, fx.hessian, fx.hvp, jnp.asarray,
)
JAX = Backend(
    "jax", jnp, jax.nn.relu, lambda z: jax.nn.log_softmax(z, axis=-1),
    jax.grad, _jax_grad_and_value, _jax_vmap, jax.jacrev, jax.jacfwd, jax.hessian,
    _hvp_by(jax.jvp, _jax_grad_and_value),
    jnp.asarray,
)


def _torch_device():
    """torch runs on CUDA only when JAX does too and torch was built for it."""
    if jax.default_backend() == "gpu" and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def _make_torch_backend():
    if torch is None:
        return None
    device = _torch_device()

    def sync(out):
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    def asarray(a):
        return torch.from_numpy(np.array(a)).to(device)

    return Backend(
        "torch", torch, torch.relu, lambda z: torch.log_softmax(z, -1),
        tfunc.grad, tfunc.grad_and_value, tfunc.vmap, tfunc.jacrev, tfunc.jacfwd, tfunc.hessian,
        _hvp_by(tfunc.jvp, tfunc.grad_and_value), asarray, sync,
    )


TORCH = _make_torch_backend()


def convert(tree, backend):
    return jax.tree_util.tree_map(backend.asarray, tree)


def leaves(tree):
    """Output leaves as NumPy arrays, dicts in sorted-key order (as JAX does)."""
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in leaves(tree[k])]
    if isinstance(tree, (tuple, list)):
        return [leaf for t in tree for leaf in leaves(t)]
    if torch is not None and isinstance(tree, torch.Tensor):
        return [tree.detach().cpu().numpy()]
    return [np.asarray(tree)]


# ---------------------------------------------------------------------------
# The programs, written once for every backend.


def mlp(params, x, act):
    depth = len(params) // 2
    for i in range(depth):
        x = x @ params[f"w{i}"] + params[f"b{i}"]
        if i < depth - 1:
            x = act(x)
    return x


def cross_entropy(B, params, x, onehot):
    """Mean cross-entropy of a relu MLP over the leading rows (or of one
    example, when x is a vector)."""
    logp = B.log_softmax(mlp(params, x, B.relu))
    rows = x.shape[0] if x.ndim == 2 else 1
    return -(onehot * logp).sum() / rows


def classification_data(sizes, batch, models=None):
    rng = np.random.default_rng(0)
    if models is None:
        params = init_mlp(rng, sizes)
    else:
        each = [init_mlp(rng, sizes) for _ in range(models)]
        params = {k: np.stack([p[k] for p in each]) for k in each[0]}
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    onehot = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], batch)]
    return params, x, onehot


def per_sample_grads(B):
    return B.vmap(B.grad(lambda p, x, y: cross_entropy(B, p, x, y)), in_dims=(None, 0, 0))


def ensemble_grads(B):
    return B.vmap(B.grad_and_value(lambda p, x, y: cross_entropy(B, p, x, y)), in_dims=(0, None, None))


def jacobian_data():
    rng = np.random.default_rng(1)
    return init_mlp(rng, (64, 128, 128, 64)), rng.standard_normal((128, 64)).astype(np.float32)


def batched_jacobians(B, jac):
    return B.vmap(jac(lambda p, x: mlp(p, x, B.np.tanh), argnums=1), in_dims=(None, 0))


def hessian_data(n, with_vector=False):
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    if with_vector:
        return w, x, rng.standard_normal(n).astype(np.float32)
    return w, x


def tanh_energy(B, w, x):
    """sum(tanh(W x)): a scalar whose Hessian W^T diag(.) W is dense."""
    return B.np.tanh(w @ x).sum()


def hessian_of(B):
    return B.hessian(lambda w, x: tanh_energy(B, w, x), argnums=1)


def hvp_of(B):
    def fn(w, x, v):
        return B.hvp(lambda x: tanh_energy(B, w, x), (x,), (v,))

    return fn


def maml_meta_grad(B):
    """Gradient of the mean post-adaptation query loss over 32 tasks, through
    5 inner SGD steps on each task's support set."""

    def mse(p, x, y):
        return ((mlp(p, x, B.relu) - y) ** 2).mean()

    def adapt_and_eval(p, xs, ys, xq, yq):
        for _ in range(MAML_INNER_STEPS):
            g = B.grad(mse)(p, xs, ys)
            p = {k: p[k] - MAML_INNER_LR * g[k] for k in p}
        return mse(p, xq, yq)

    def meta_loss(p, xs, ys, xq, yq):
        return B.vmap(adapt_and_eval, in_dims=(None, 0, 0, 0, 0))(p, xs, ys, xq, yq).mean()

    return B.grad(meta_loss)


CHAIN_OPS = 20


def sin_chain_grad(B):
    def chain(x):
        for _ in range(CHAIN_OPS):
            x = B.np.sin(x)
        return x.sum()

    return B.grad(chain)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    data: Callable[[], tuple]  # the positional arguments, as NumPy arrays
    build: Callable[[Backend], Callable]  # returns a new function object every call
    rtol: float = 1e-4


WORKLOADS = [
    Workload("per-sample grads 784-256-256-10, B=64",
             lambda: classification_data((784, 256, 256, 10), 64), per_sample_grads),
    Workload("per-sample grads 784-256-256-10, B=256",
             lambda: classification_data((784, 256, 256, 10), 256), per_sample_grads),
    Workload("per-sample grads 784-512-512-10, B=64",
             lambda: classification_data((784, 512, 512, 10), 64), per_sample_grads),
    Workload("ensemble of 10 MLPs 784-256-256-10, B=64 (grad+loss)",
             lambda: classification_data((784, 256, 256, 10), 64, models=10), ensemble_grads),
    Workload("vmap(jacrev) tanh MLP R^64->R^64, B=128",
             jacobian_data, lambda B: batched_jacobians(B, B.jacrev)),
    Workload("vmap(jacfwd) tanh MLP R^64->R^64, B=128",
             jacobian_data, lambda B: batched_jacobians(B, B.jacfwd)),
    Workload("hessian sum(tanh(Wx)), n=256", lambda: hessian_data(256), hessian_of),
    Workload("hessian sum(tanh(Wx)), n=1024", lambda: hessian_data(1024), hessian_of),
    Workload("hvp sum(tanh(Wx)), n=1024", lambda: hessian_data(1024, with_vector=True), hvp_of),
    Workload("MAML 1-40-40-1, 5 inner steps, 32 tasks", lambda: maml_data(3), maml_meta_grad,
             rtol=1e-3),
    Workload(f"grad of {CHAIN_OPS} sin ops on a 3-vector",
             lambda: (np.linspace(0.1, 0.9, 3, dtype=np.float32),), sin_chain_grad),
]


# ---------------------------------------------------------------------------
# The five implementations of a workload.


@dataclasses.dataclass(frozen=True)
class Impl:
    name: str
    backend: Backend
    jit: Callable = None  # functx.jit or jax.jit; None for eager

    def make(self, workload):
        fn = workload.build(self.backend)
        return fn if self.jit is None else self.jit(fn)


IMPLS = [
    Impl("functx eager", FUNCTX),
    Impl("functx jit", FUNCTX, fx.jit),
    Impl("jax eager", JAX),
    Impl("jax jit", JAX, jax.jit),
    Impl("torch.func eager", TORCH),
]
REFERENCE = "jax jit"


def prepare(workload, problems):
    """Each available implementation's call (a thunk that waits for its
    output), after one run checked against the reference."""
    data = workload.data()
    calls, outputs = {}, {}
    for impl in IMPLS:
        if impl.backend is None:
            continue
        made = attempt(problems, f"{workload.name}: {impl.name}", make_call, impl, workload, data)
        if made is not None:
            calls[impl.name], outputs[impl.name] = made
    failed = check_outputs(workload, outputs, problems)
    return calls, failed


def make_call(impl, workload, data):
    """(call, output leaves of a first call)."""
    fn, args, sync = impl.make(workload), convert(data, impl.backend), impl.backend.sync

    def call():
        return sync(fn(*args))

    return call, leaves(call())


def attempt(problems, context, fn, *args):
    """fn(*args), or None after recording its exception in `problems`: an
    implementation that fails is reported and left out, never allowed to
    stop the other measurements."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 (any failure is reported, see above)
        lines = str(e).strip().splitlines()
        problems.append(f"{context} raised {type(e).__name__}: {lines[0] if lines else ''}")
        return None


def check_outputs(workload, outputs, problems):
    """Names of the implementations whose results differ from the reference."""
    ref = outputs.get(REFERENCE)
    if ref is None:
        problems.append(f"{workload.name}: no {REFERENCE} result, so no result was checked")
        return set()
    failed = set()
    for name, out in outputs.items():
        try:
            if len(out) != len(ref):
                raise AssertionError(f"{len(out)} output leaves, expected {len(ref)}")
            for got, want in zip(out, ref):
                scale = float(np.max(np.abs(want))) if want.size else 0.0
                np.testing.assert_allclose(got, want, rtol=workload.rtol, atol=workload.rtol * scale)
        except AssertionError as e:
            failed.add(name)
            detail = " ".join(str(e).split())[:300]
            problems.append(f"{workload.name}: {name} differs from {REFERENCE}: {detail}")
    return failed


# ---------------------------------------------------------------------------
# Timing.


_START = time.perf_counter()


def progress(message):
    print(f"  [{time.perf_counter() - _START:6.1f} s] {message}", file=sys.stderr, flush=True)


def seconds_per_call(call, number):
    t0 = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - t0) / number


WARMUP_CALLS = 3  # functx eager compiles a repeated step on its 2nd sighting, a tape on its 3rd


def settle(call, wait_for_compiles, max_rounds=8):
    """Warm-up: call until functx eager compiles nothing new. Its compiles
    run off the calling thread and one can make the next (once a fused step
    is compiled, the queue of deferred steps has a new structure, which is
    compiled in turn): so call, wait for the compile thread, and repeat
    until a round submits nothing."""
    from functx.caches import cache_info

    def submitted():
        return sum(v.get("entries", 0) + v.get("pending", 0) for v in cache_info().values())

    before = None
    for _ in range(max_rounds):
        seconds_per_call(call, WARMUP_CALLS)
        wait_for_compiles()
        seconds_per_call(call, 1)  # ... picks up what was compiled
        now = submitted()
        if now == before:
            return
        before = now


def interleaved_medians(calls, rounds, target_s, numbers):
    """Median seconds per call of each implementation, after warm-up calls.
    Each round times every implementation once (enough calls to take about
    target_s, stored in `numbers`), in a rotated order."""
    from functx.caches import wait_for_compiles

    for name, call in calls.items():
        settle(call, wait_for_compiles)
        once = seconds_per_call(call, 1)
        numbers[name] = max(1, min(200, int(target_s / max(once, 1e-7))))
    samples = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(seconds_per_call(calls[name], numbers[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


PAIRS = (("functx jit", "jax jit"), ("functx jit", "torch.func eager"),
         ("functx eager", "torch.func eager"))


def paired_ratios(call_a, call_b, number_a, number_b, rounds):
    """Quartiles (q1, median, q3) of time-per-call ratios a/b, each from a
    burst of a and a burst of b timed back to back, in alternating order
    (ab, ba, ...). On a machine whose speed drifts by tens of percent
    over seconds, the ratio of two adjacent bursts is far steadier than
    the ratio of two medians taken over the whole run."""
    ratios = []
    for r in range(rounds):
        if r % 2:
            tb = seconds_per_call(call_b, number_b)
            ta = seconds_per_call(call_a, number_a)
        else:
            ta = seconds_per_call(call_a, number_a)
            tb = seconds_per_call(call_b, number_b)
        ratios.append(ta / tb)
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, med, q3


def fmt_quartiles(q):
    return "-" if q is None else f"{q[1]:.3f}x [{q[0]:.2f}-{q[2]:.2f}]"


def first_call_seconds(impl, workload, args):
    """Time of the first call (trace + compile + run) of a freshly built
    jitted function (a new Python function object, so no cache hit)."""
    fn = impl.make(workload)
    t0 = time.perf_counter()
    impl.backend.sync(fn(*args))
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------
# Peak memory of chunked vmap and jacrev.


@dataclasses.dataclass(frozen=True)
class MemoryCase:
    name: str
    size: int  # the mapped size (batch, or Jacobian rows)
    chunks: tuple  # chunk sizes; None = unchunked
    data: Callable[[], tuple]
    build: Callable  # (backend, chunk) -> function, for functx and torch.func
    build_jax: Callable  # (chunk, mapper) -> the JAX equivalent, chunked by `mapper`


def map_by_lax(f, xs, chunk):
    """f over the rows of xs, chunk rows at a time inside one XLA loop."""
    return jax.vmap(f)(xs) if chunk is None else jax.lax.map(f, xs, batch_size=chunk)


def map_unrolled(f, xs, chunk):
    """f over the rows of xs, as a Python loop over chunks (unrolled under jit)."""
    chunk = chunk or xs.shape[0]
    return jnp.concatenate([jax.vmap(f)(xs[s:s + chunk]) for s in range(0, xs.shape[0], chunk)])


ACT_B, ACT_L, ACT_D, ACT_H = 256, 64, 32, 2048


def activation_data():
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((ACT_D, ACT_H)) / np.sqrt(ACT_D)).astype(np.float32)
    v = (rng.standard_normal(ACT_H) / np.sqrt(ACT_H)).astype(np.float32)
    return w, v, rng.standard_normal((ACT_B, ACT_L, ACT_D)).astype(np.float32)


def activation_score(B, w, v, x):
    """A per-example (L, H) activation, reduced to a scalar."""
    return (B.np.tanh(x @ w) @ v).sum()


def input_grads(B, chunk):
    g = B.grad(lambda w, v, x: activation_score(B, w, v, x), argnums=2)
    return B.vmap(g, in_dims=(None, None, 0), chunk_size=chunk)


def input_grads_jax(chunk, mapper):
    g = jax.grad(lambda w, v, x: activation_score(JAX, w, v, x), argnums=2)
    return lambda w, v, xs: mapper(lambda x: g(w, v, x), xs, chunk)


WIDE_N, WIDE_H, WIDE_M = 64, 16384, 512


def wide_data():
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((WIDE_H, WIDE_N)) / np.sqrt(WIDE_N)).astype(np.float32)
    w2 = (rng.standard_normal((WIDE_M, WIDE_H)) / np.sqrt(WIDE_H)).astype(np.float32)
    return w1, w2, rng.standard_normal(WIDE_N).astype(np.float32)


def wide_map(B, w1, w2, x):
    """R^64 -> R^512 through a 16384-wide hidden layer: each vjp row holds
    16384-long temporaries, while the Jacobian is only 512 x 64."""
    return w2 @ B.np.tanh(w1 @ x)


def wide_jacobian(B, chunk):
    return B.jacrev(lambda w1, w2, x: wide_map(B, w1, w2, x), argnums=2, chunk_size=chunk)


def wide_jacobian_jax(chunk, mapper):
    def jac(w1, w2, x):
        y, pull = jax.vjp(lambda x: wide_map(JAX, w1, w2, x), x)
        return mapper(lambda c: pull(c)[0], jnp.eye(y.size, dtype=y.dtype), chunk)

    return jac


MEMORY_CASES = [
    MemoryCase(f"vmap(grad) input grads, B={ACT_B}, per-example {ACT_L}x{ACT_H} activation",
               ACT_B, (None, 64, 16), activation_data, input_grads, input_grads_jax),
    MemoryCase(f"jacrev R^{WIDE_N}->R^{WIDE_M}, hidden {WIDE_H}",
               WIDE_M, (None, 128, 32), wide_data, wide_jacobian, wide_jacobian_jax),
]


def compiled_bytes(jitted, args):
    """(temp, output) bytes of the compiled program."""
    stats = jitted.lower(*args).compile().memory_analysis()
    return stats.temp_size_in_bytes, stats.output_size_in_bytes


def compiled_memory(case, chunk, problems):
    """{column: (temp, output) bytes} of the jitted programs."""
    programs = {
        "functx.jit": lambda: fx.jit(case.build(FUNCTX, chunk)),
        "jax.jit, lax.map": lambda: jax.jit(case.build_jax(chunk, map_by_lax)),
        "jax.jit, unrolled loop": lambda: jax.jit(case.build_jax(chunk, map_unrolled)),
    }
    args = convert(case.data(), JAX)
    out = {}
    for name, jitted in programs.items():
        stats = attempt(problems, f"memory {case.name}, chunk {chunk}: {name}",
                        lambda jitted=jitted: compiled_bytes(jitted(), args))
        if stats is not None:
            out[name] = stats
    return out


def _status_bytes(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE).group(1)) * 1024


def peak_bytes(call, backend):
    """Peak memory of one call above what was in use before it, after a
    warm-up call (compilation and caches). Device allocator statistics on
    GPU; on CPU the process's peak resident set, reset through
    /proc/self/clear_refs (big buffers are mmap'ed, see `eager_memory`)."""
    call()
    gc.collect()
    if backend is TORCH and _torch_device() == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        return torch.cuda.max_memory_allocated() - base
    if backend is FUNCTX and jax.default_backend() != "cpu":
        device = jax.devices()[0]
        base = device.memory_stats()["bytes_in_use"]
        call()  # the allocator's peak cannot be reset: it also covers the warm-up
        return device.memory_stats()["peak_bytes_in_use"] - base
    base = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    call()
    return _status_bytes("VmHWM") - base


def probe_memory(spec):
    """Child-process entry: spec is 'impl|case index|chunk;...'; prints a
    JSON list of peak bytes (or null where it failed)."""
    results, errors = [], []
    for item in spec.split(";"):
        impl_name, index, chunk = item.split("|")
        case = MEMORY_CASES[int(index)]
        chunk = None if chunk == "None" else int(chunk)
        backend = FUNCTX if impl_name == "functx" else TORCH
        results.append(attempt(errors, f"{impl_name} eager, {case.name}, chunk {chunk}",
                               eager_peak, backend, case, chunk))
    print("\n".join(errors), file=sys.stderr)
    print(json.dumps(results))


def eager_peak(backend, case, chunk):
    fn, args = case.build(backend, chunk), convert(case.data(), backend)
    return peak_bytes(lambda: backend.sync(fn(*args)), backend)


def eager_memory(problems):
    """{(impl, case index, chunk): peak bytes} from child processes: one per
    implementation on CPU (the peak RSS can be reset between measurements),
    one per measurement where the peak cannot be reset (JAX on GPU)."""
    impls = ["functx"] + (["torch"] if TORCH is not None else [])
    keys = [(i, c, k) for i in impls for c, case in enumerate(MEMORY_CASES) for k in case.chunks]
    groups = []
    for i in impls:
        mine = [key for key in keys if key[0] == i]
        resettable = i == "torch" or jax.default_backend() == "cpu"
        groups += [mine] if resettable else [[key] for key in mine]
    # Big buffers mmap'ed, so that freeing them returns them to the system
    # and the next measurement's resident set starts from the floor.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    if jax.default_backend() == "gpu":
        # XLA's GPU autotuner allocates scratch while compiling (in the
        # warm-up call), and the allocator's peak cannot be reset: without
        # this the compile-time scratch, not the call, sets the peak.
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()
    result = {}
    for group in groups:
        spec = ";".join(f"{i}|{c}|{k}" for i, c, k in group)
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe-memory", spec],
                              check=False, capture_output=True, text=True, env=env)
        try:
            values = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            values = [None] * len(group)
        if None in values:
            problems += [f"eager memory probe: {line}" for line in proc.stderr.strip().splitlines()[-3:]]
        result.update(zip(group, values))
        progress(f"eager memory probe {spec}")
    return result


# ---------------------------------------------------------------------------
# Formatting.


def fmt_time(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def fmt_mb(b, unchunked=None):
    if b is None:
        return "-"
    text = f"{b / 2 ** 20:.1f} MB"
    if unchunked:
        text += f" ({b / unchunked:.2f}x)"
    return text


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return re.search(r"model name\s*:\s*(.*)", f.read()).group(1).strip()
    except (OSError, AttributeError):
        return platform.processor() or "unknown CPU"


def cpu_count():
    """CPUs this process may use (the size of XLA's CPU thread pool)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def load_average():
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def header(markdown):
    import equinox
    import jaxlib

    cpus = cpu_count()
    if torch is None:
        torch_line = "torch: not installed"
    else:
        torch_line = (f"torch {torch.__version__} on {_torch_device()}, "
                      f"{torch.get_num_threads()} threads (XLA's CPU pool: {cpus})")
        if jax.default_backend() != "cpu" and _torch_device() == "cpu":
            torch_line += "; torch has no CUDA here, so the torch.func column runs on CPU"
    lines = [
        f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"machine: {platform.platform()}, {cpu_model()}, {cpus} CPUs; jax.devices(): {jax.devices()}",
        (f"versions: python {platform.python_version()}, jax {jax.__version__}, jaxlib "
         f"{jaxlib.__version__}, numpy {np.__version__}, equinox {equinox.__version__}, "
         f"functx {fx.__version__}"),
        torch_line,
        "float32 throughout; jax_default_matmul_precision=highest (no TF32)",
        (f"load average (1/5/15 min) at the start: {load_average()} (other work on the "
         "machine inflates and scatters the times, multi-threaded torch most)"),
    ]
    prefix = "- " if markdown else ""
    print("\n".join(prefix + line for line in lines) + "\n", flush=True)


# ---------------------------------------------------------------------------


def time_workloads(rounds, target_s, paired_rounds, problems):
    rows, paired = [], []
    for workload in WORKLOADS:
        calls, failed = prepare(workload, problems)
        numbers = {}
        med = interleaved_medians(calls, rounds, target_s, numbers)
        quartiles = [
            paired_ratios(calls[a], calls[b], max(1, numbers[a] // 2), max(1, numbers[b] // 2),
                          paired_rounds)
            if a in calls and b in calls else None
            for a, b in PAIRS
        ]
        # The noise floor: a second jax.jit of the same program (a new
        # function object with its own argument buffers), against the first.
        again = attempt(problems, f"{workload.name}: jax jit, compiled again", make_call,
                        next(i for i in IMPLS if i.name == REFERENCE), workload, workload.data())
        if again is not None and REFERENCE in calls:
            n = max(1, numbers[REFERENCE] // 2)
            quartiles.append(paired_ratios(again[0], calls[REFERENCE], n, n, paired_rounds))
        else:
            quartiles.append(None)
        paired.append([workload.name] + [fmt_quartiles(q) for q in quartiles])
        t = {impl.name: med.get(impl.name) for impl in IMPLS}
        cells = []
        for impl in IMPLS:
            if impl.backend is None:
                cells.append("not installed")
            elif t[impl.name] is None:
                cells.append("error")
            else:
                cells.append(fmt_time(t[impl.name]) + (" !" if impl.name in failed else ""))
        torch_t = t["torch.func eager"]
        rows.append([workload.name] + cells + [
            fmt_ratio(t["functx jit"], t["jax jit"]),
            fmt_ratio(t["functx eager"], t["jax eager"]),
            fmt_ratio(t["functx jit"], torch_t),
            fmt_ratio(t["functx eager"], torch_t),
        ])
        progress(f"timed {workload.name}")
    return rows, paired


def first_call_rows(reps, problems):
    jits = [impl for impl in IMPLS if impl.jit is not None]
    rows = []
    for workload in WORKLOADS:
        args = convert(workload.data(), JAX)
        samples = {impl.name: [] for impl in jits}
        for _ in range(reps):  # interleaved, like the steady-state rounds
            for impl in jits:
                samples[impl.name].append(attempt(
                    problems, f"first call, {workload.name}: {impl.name}",
                    first_call_seconds, impl, workload, args))
        t = {name: None if None in s else statistics.median(s) for name, s in samples.items()}
        progress(f"first calls {workload.name}")
        rows.append([workload.name, fmt_time(t["functx jit"]), fmt_time(t["jax jit"]),
                     fmt_ratio(t["functx jit"], t["jax jit"])])
    return rows


MEMORY_COLUMNS = ["functx.jit", "jax.jit, lax.map", "jax.jit, unrolled loop",
                  "functx eager", "torch.func eager"]


def memory_rows(problems):
    eager = eager_memory(problems)
    rows = []
    for c, case in enumerate(MEMORY_CASES):
        unchunked = {}
        for chunk in case.chunks:
            compiled = compiled_memory(case, chunk, problems)
            values = {name: temp for name, (temp, _) in compiled.items()}
            values["functx eager"] = eager.get(("functx", c, chunk))
            values["torch.func eager"] = eager.get(("torch", c, chunk))
            if chunk is None:
                unchunked = values
            outputs = [o for _, o in compiled.values()]
            rows.append([
                case.name if chunk is None else "",
                "none" if chunk is None else str(chunk),
                f"{(chunk or case.size) / case.size:.3f}",
                fmt_mb(outputs[0] if outputs else None),
                *(fmt_mb(values.get(k), None if chunk is None else unchunked.get(k))
                  for k in MEMORY_COLUMNS),
            ])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (smoke test)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument("--only", metavar="TEXT[,TEXT...]",
                        help="only the workloads whose name contains one of the comma-separated "
                             "TEXTs (no memory table)")
    parser.add_argument("--memory-only", action="store_true",
                        help="only the peak-memory table (no timing tables)")
    parser.add_argument("--probe-memory", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.probe_memory:
        return probe_memory(opts.probe_memory)
    if opts.only:
        wanted = [t for t in opts.only.split(",") if t]
        WORKLOADS[:] = [w for w in WORKLOADS if any(t in w.name for t in wanted)]

    if TORCH is not None and _torch_device() == "cpu":
        torch.set_num_threads(cpu_count())  # as many threads as XLA's CPU pool
    rounds, target_s, reps, paired_rounds = (2, 0.02, 1, 3) if opts.quick else (5, 0.15, 3, 21)
    md = opts.markdown
    header(md)
    problems = []

    if not opts.memory_only:
        time_rows, paired_rows = time_workloads(rounds, target_s, paired_rounds, problems)
        render(
            f"Steady state: median time per call over {rounds} interleaved rounds",
            ["workload"] + [impl.name for impl in IMPLS]
            + ["fx-jit / jax-jit", "fx-eager / jax-eager", "fx-jit / torch", "fx-eager / torch"],
            time_rows, md,
            notes=[("Results of every column checked against jax jit before timing; '!' marks a "
                    "failed check (listed below). Ensemble: forward + grad of the loss per model.")],
        )
        render(
            f"Paired ratios: median [quartiles] over {paired_rounds} back-to-back pairs of bursts",
            ["workload"] + [f"{a} / {b}" for a, b in PAIRS] + ["jax jit again / jax jit"],
            paired_rows, md,
            notes=["Each burst is about half a steady-state round's calls. The last column times "
                   "a second jax.jit of the same program (a new function object, its own argument "
                   "buffers) against the first: how far apart identical programs measure on this "
                   "machine, the noise floor of the other columns."],
        )
        render(
            f"First call (trace + compile + run) of a newly built jitted function, median of {reps}",
            ["workload", "functx.jit", "jax.jit", "functx / jax"],
            first_call_rows(reps, problems), md,
        )
    render(
        "Peak memory of chunked vmap / jacrev (ratio to the unchunked row in parentheses)",
        ["case", "chunk", "k/size", "output"] + MEMORY_COLUMNS,
        [] if opts.only else memory_rows(problems), md,
        notes=[("jit columns: temp_size_in_bytes of the compiled program (arguments and "
                "output excluded; the output is the same for every chunk size). The JAX "
                "programs chunk with jax.lax.map(batch_size=k) (a loop) or with a Python loop "
                "of jax.vmap calls (unrolled under jit)."),
               ("eager columns: measured peak above the memory in use before the call, after "
                "a warm-up call and gc.collect(), in child processes (CPU: peak RSS, reset "
                "through /proc/self/clear_refs; JAX on GPU: the allocator's peak since the "
                "process started, the warm-up call included; torch on CUDA: its allocator's "
                "peak).")],
    )
    if problems:
        print("Problems:" if not md else "### Problems\n")
        for p in problems:
            print(f"- {p}")
    else:
        print("No problems: every implementation ran and every result check passed.")
    print(f"\nload average (1/5/15 min) at the end: {load_average()}")


if __name__ == "__main__":
    main()
