"""First calls of eager workloads: the time of calls 1, 2, 3 and N, and the
RSS growth over the N calls, for functx eager, JAX eager (jax.grad / jax.vmap
without jit) and torch.func eager (CPU), side by side.

Eager functx compiles as it goes (a repeated primitive step on its second
sighting, a repeated tape on its third), JAX eager compiles one program per
primitive on its first sighting, torch compiles nothing: the first calls and
the memory they leave behind are where the three differ most, and a
steady-state benchmark (benchmarks/run.py) does not see them.

Every (framework, workload) runs in a fresh process (this script with
--child), which builds its inputs from the same NumPy float32 weights (fixed
seeds) as the other frameworks, then times calls 1..N one by one: wall time
(time.perf_counter, JAX results blocked on) and process CPU time
(time.process_time), the current RSS (/proc/self/statm) after setup, after
call 3 and after call N, and a checksum of call N's result. The parent runs
the children, checks the checksums against each other (functx against JAX to
1e-4, torch against JAX to 1e-3, relative) and prints one table per workload
and a summary of the ratios. With --repeat R it runs R rounds, alternating the
order of the frameworks, and reports medians over the rounds.

Workloads:
  mlp    vmap(grad(loss), in_dims=(None, 0, 0)): per-sample gradients of the
         cross-entropy of a 32-64-64-10 tanh MLP (params a dict), batch 64
  cnn    the same for a small CNN on 1x12x12 inputs, batch 16: Conv2d(1, 8, 3),
         relu, Conv2d(8, 8, 3), relu, spatial mean, Linear(8, 10) (an Equinox
         module called directly for functx and JAX; nn.Sequential through
         torch.func.functional_call for torch)
  maml   vmap over 32 sine-regression tasks of grad of (5 inner SGD steps of a
         1-40-40-1 relu MLP on the support set, then the query loss), as in
         torch.func's MAML example
  scan   grad of a 100-step scan, h <- tanh(h @ w + x), 16-wide state, w.r.t. w
         (torch: a Python for-loop)
  rejit  grad(jit(f)) with functx.jit(f) / jax.jit(f) built anew in every call,
         f the mean cross-entropy of the mlp workload's MLP over its batch
         (torch: plain eager torch.func.grad(f), no torch.compile)

A process stops before N calls once its calls 2.. have taken --budget-s
seconds (default 20; never before call 13): a framework that recompiles in
every call (grad of an eager scan, a jit wrapper built per call) would
otherwise spend minutes on one row. Its row says how many calls it made.

Usage: python benchmarks/first_calls.py [--n 100] [--repeat 1] [--budget-s 20] [--quick]
           [--pause-s 0]
           [--torch-threads T]
           [--workloads mlp,cnn,maml,scan,rejit] [--frameworks functx,jax,torch] [--markdown]
With the defaults: 15 processes of up to 100 calls.
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

from _common import MAML_INNER_LR, MAML_INNER_STEPS, MAML_TASKS, init_mlp, maml_data, render

WORKLOADS = ("mlp", "cnn", "maml", "scan", "rejit")
FRAMEWORKS = ("functx", "jax", "torch")
LABELS = {"functx": "functx eager", "jax": "JAX eager", "torch": "torch.func eager (CPU)"}
STEADY_LAST = 10  # steady state: median of the last 10 calls (calls 4..N when N < 13)
MIN_CALLS = 3 + STEADY_LAST  # the per-process time budget never cuts a run shorter
TOLERANCE = {"functx": 1e-4, "torch": 1e-3}  # relative, against JAX's checksum
CHILD_TIMEOUT_S = 600


# ---------------------------------------------------------------------------
# Inputs: NumPy float32 arrays, the same for every framework.


def _np():
    import numpy as np

    return np


def onehot(rng, batch, classes):
    np = _np()
    return np.eye(classes, dtype=np.float32)[rng.integers(0, classes, batch)]


def mlp_data():
    rng = _np().random.default_rng(0)
    params = init_mlp(rng, (32, 64, 64, 10))
    x = rng.standard_normal((64, 32)).astype("float32")
    return params, x, onehot(rng, 64, 10)


def cnn_data():
    np = _np()
    rng = np.random.default_rng(1)

    def uniform(shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    params = {  # torch's names and shapes
        "0.weight": uniform((8, 1, 3, 3), 9), "0.bias": uniform((8,), 9),
        "2.weight": uniform((8, 8, 3, 3), 72), "2.bias": uniform((8,), 72),
        "6.weight": uniform((10, 8), 8), "6.bias": uniform((10,), 8),
    }
    x = rng.standard_normal((16, 1, 12, 12)).astype(np.float32)
    return params, x, onehot(rng, 16, 10)


SCAN_STEPS, SCAN_WIDTH = 100, 16


def scan_data():
    np = _np()
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((SCAN_WIDTH, SCAN_WIDTH)) / np.sqrt(SCAN_WIDTH)).astype(np.float32)
    h0 = rng.standard_normal(SCAN_WIDTH).astype(np.float32)
    xs = (0.5 * rng.standard_normal((SCAN_STEPS, SCAN_WIDTH))).astype(np.float32)
    return w, h0, xs


# ---------------------------------------------------------------------------
# The frameworks: an array namespace and the transforms, imported only in the
# child that uses them (the JAX child never imports functx or torch).


class Ops:
    pass


def framework_ops(name):
    ops = Ops()
    ops.name = name
    if name in ("functx", "jax"):
        import jax
        import jax.numpy as jnp

        # Float32 matmuls at full precision (no TF32 on GPU), as in run.py.
        jax.config.update("jax_default_matmul_precision", "highest")
        ops.asarray = lambda a: jax.block_until_ready(jnp.asarray(a))
        ops.block = jax.block_until_ready
        ops.leaves = lambda tree: [_np().asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
        if name == "functx":
            import functx as fx
            import functx.numpy as fnp

            ops.np, ops.grad, ops.vmap, ops.jit, ops.scan = fnp, fx.grad, fx.vmap, fx.jit, fx.lax.scan
            ops.tanh, ops.relu = fnp.tanh, fx.nn.relu
            ops.log_softmax = lambda z: fx.nn.log_softmax(z, axis=-1)
        else:
            ops.np, ops.grad, ops.jit, ops.scan = jnp, jax.grad, jax.jit, jax.lax.scan
            ops.vmap = lambda f, in_dims=0: jax.vmap(f, in_axes=in_dims)
            ops.tanh, ops.relu = jnp.tanh, jax.nn.relu
            ops.log_softmax = lambda z: jax.nn.log_softmax(z, axis=-1)
    elif name == "torch":
        import torch
        import torch.func as tfunc

        torch.set_num_threads(torch_threads())
        ops.np, ops.grad, ops.vmap, ops.jit, ops.scan = torch, tfunc.grad, tfunc.vmap, None, None
        ops.tanh, ops.relu = torch.tanh, torch.relu
        ops.log_softmax = lambda z: torch.log_softmax(z, -1)
        ops.asarray = lambda a: torch.from_numpy(_np().array(a))
        ops.block = lambda out: out  # CPU: the result is computed when the call returns

        def leaves(tree):
            if isinstance(tree, dict):
                return [leaf for k in sorted(tree) for leaf in leaves(tree[k])]
            if isinstance(tree, (tuple, list)):
                return [leaf for t in tree for leaf in leaves(t)]
            return [tree.detach().numpy()]

        ops.leaves = leaves
    else:
        raise ValueError(f"unknown framework {name!r}")
    return ops


def convert(tree, ops):
    if isinstance(tree, dict):
        return {k: convert(v, ops) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(convert(v, ops) for v in tree)
    return ops.asarray(tree)


# ---------------------------------------------------------------------------
# The workloads: build(ops) -> a call with no arguments, returning the result.


def mlp_forward(ops, params, x, act):
    depth = len(params) // 2
    for i in range(depth):
        x = x @ params[f"w{i}"] + params[f"b{i}"]
        if i < depth - 1:
            x = act(x)
    return x


def build_mlp(ops):
    params, x, y = convert(mlp_data(), ops)

    def loss(p, x, y):  # one example
        return -(y * ops.log_softmax(mlp_forward(ops, p, x, ops.tanh))).sum()

    per_sample = ops.vmap(ops.grad(loss), in_dims=(None, 0, 0))
    return lambda: per_sample(params, x, y)


def build_cnn(ops):
    params_np, x_np, y_np = cnn_data()
    x, y = convert((x_np, y_np), ops)
    if ops.name == "torch":
        from torch import nn
        from torch.func import functional_call

        model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
        params = convert(params_np, ops)
        assert {k: tuple(v.shape) for k, v in model.named_parameters()} == \
            {k: tuple(v.shape) for k, v in params.items()}

        def loss(p, x, y):
            logits = functional_call(model, p, (x.unsqueeze(0),))[0]
            return -(y * ops.log_softmax(logits)).sum()

        per_sample = ops.vmap(ops.grad(loss), in_dims=(None, 0, 0))
        return lambda: per_sample(params, x, y)

    import equinox as eqx
    import jax

    class CNN(eqx.Module):
        conv1: eqx.nn.Conv2d
        conv2: eqx.nn.Conv2d
        linear: eqx.nn.Linear

        def __call__(self, x):  # one example, (1, 12, 12)
            x = ops.relu(self.conv1(x))
            x = ops.relu(self.conv2(x))
            return self.linear(ops.np.mean(x, axis=(1, 2)))

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    model = CNN(eqx.nn.Conv2d(1, 8, 3, key=k1), eqx.nn.Conv2d(8, 8, 3, key=k2),
                eqx.nn.Linear(8, 10, key=k3))
    p = convert(params_np, ops)
    model = eqx.tree_at(
        lambda m: (m.conv1.weight, m.conv1.bias, m.conv2.weight, m.conv2.bias,
                   m.linear.weight, m.linear.bias),
        model,
        (p["0.weight"], p["0.bias"].reshape(8, 1, 1), p["2.weight"], p["2.bias"].reshape(8, 1, 1),
         p["6.weight"], p["6.bias"]),
    )
    model = ops.block(model)

    def loss(m, x, y):
        return -(y * ops.log_softmax(m(x))).sum()

    per_sample = ops.vmap(ops.grad(loss), in_dims=(None, 0, 0))
    return lambda: per_sample(model, x, y)


def build_maml(ops):
    params, xs, ys, xq, yq = convert(maml_data(2), ops)

    def mse(p, x, y):
        return ((mlp_forward(ops, p, x, ops.relu) - y) ** 2).mean()

    def task_loss(p, xs, ys, xq, yq):
        for _ in range(MAML_INNER_STEPS):
            g = ops.grad(mse)(p, xs, ys)
            p = {k: p[k] - MAML_INNER_LR * g[k] for k in p}
        return mse(p, xq, yq)

    per_task = ops.vmap(ops.grad(task_loss), in_dims=(None, 0, 0, 0, 0))
    return lambda: per_task(params, xs, ys, xq, yq)


def build_scan(ops):
    w, h0, xs = convert(scan_data(), ops)
    if ops.name == "torch":
        def final_sum(w):
            h = h0
            for x in xs:
                h = ops.tanh(h @ w + x)
            return h.sum()
    else:
        def final_sum(w):
            def step(h, x):
                return ops.tanh(h @ w + x), None

            return ops.scan(step, h0, xs)[0].sum()

    g = ops.grad(final_sum)
    return lambda: g(w)


def build_rejit(ops):
    params, x, y = convert(mlp_data(), ops)

    def loss(p, x, y):  # the whole batch
        logp = ops.log_softmax(mlp_forward(ops, p, x, ops.tanh))
        return -(y * logp).sum() / x.shape[0]

    if ops.name == "torch":
        g = ops.grad(loss)  # eager reference: no torch.compile
        return lambda: g(params, x, y)
    return lambda: ops.grad(ops.jit(loss))(params, x, y)  # a new jit wrapper every call


BUILDERS = {"mlp": build_mlp, "cnn": build_cnn, "maml": build_maml, "scan": build_scan,
            "rejit": build_rejit}


# ---------------------------------------------------------------------------
# The child: one framework, one workload, N calls, one JSON line.


def rss_bytes():
    """Current resident set size (not the peak that getrusage reports)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale  # peak, as a fallback


def child(framework, workload, n, budget_s, pause_s=0.0):
    """Calls 1..n, or fewer when the calls after the first have taken more
    than budget_s seconds (but never fewer than min(n, MIN_CALLS)); with
    `pause_s`, that long idle after each call (not timed), as between the
    cells of a notebook."""
    t_start = time.perf_counter()
    ops = framework_ops(framework)
    call = BUILDERS[workload](ops)
    setup_s = time.perf_counter() - t_start
    rss = {"setup": rss_bytes()}
    wall, cpu = [], []
    out = None
    for i in range(1, n + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        out = ops.block(call())
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if i == 3:
            rss["call3"] = rss_bytes()
        if pause_s:
            time.sleep(pause_s)
        if budget_s and i >= MIN_CALLS and sum(wall[1:]) > budget_s:
            break
    rss["callN"] = rss_bytes()
    np = _np()
    leaves = [np.asarray(leaf, dtype=np.float64) for leaf in ops.leaves(out)]
    result = {
        "framework": framework, "workload": workload, "n": len(wall), "setup_s": setup_s,
        "wall": wall, "cpu": cpu, "rss": rss,
        "checksum": [float(sum(leaf.sum() for leaf in leaves)),
                     float(sum(np.abs(leaf).sum() for leaf in leaves))],
        "leaf_count": len(leaves),
    }
    print(json.dumps(result), flush=True)


def info():
    """Versions and devices, from a child (the parent imports no framework, so
    that on a GPU machine it holds none of the GPU's memory)."""
    import numpy as np

    lines = {"numpy": np.__version__}
    try:
        import jax
        import jaxlib

        lines["jax"] = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"
        lines["devices"] = str(jax.devices())
        lines["backend"] = jax.default_backend()
    except ImportError:
        lines["jax"] = "jax: not installed"
    for mod in ("functx", "equinox"):
        try:
            lines[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            lines[mod] = "not installed"
    try:
        import torch

        lines["torch"] = (f"torch {torch.__version__} on CPU, {torch_threads()} threads "
                          f"(torch.set_num_threads; XLA's CPU pool: {cpu_count()})")
    except ImportError:
        lines["torch"] = "torch: not installed"
    print(json.dumps(lines), flush=True)


# ---------------------------------------------------------------------------
# The parent.


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return re.search(r"model name\s*:\s*(.*)", f.read()).group(1).strip()
    except (OSError, AttributeError):
        return platform.processor() or "unknown CPU"


def torch_threads():
    """--torch-threads, else as many threads as XLA's CPU pool (as run.py)."""
    return int(os.environ.get("FIRST_CALLS_TORCH_THREADS") or cpu_count())


def cpu_count():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def load_average():
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def run_child(args, timeout=CHILD_TIMEOUT_S):
    """Runs this script with `args` in a fresh interpreter; the last stdout
    line as JSON, or (None, why)."""
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return None, f"exit status {proc.returncode}: {tail}"
    try:
        return json.loads(lines[-1]), None
    except json.JSONDecodeError:
        return None, f"no JSON line in the output: {lines[-1][:200]}"


def header(info_lines, opts, markdown):
    lines = [
        f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"machine: {platform.platform()}, {cpu_model()}, {cpu_count()} CPUs",
        (f"functx and JAX run on: {info_lines.get('devices', '?')} (default backend "
         f"{info_lines.get('backend', '?')}); torch runs on CPU"),
        (f"versions: python {platform.python_version()}, {info_lines.get('jax')}, numpy "
         f"{info_lines.get('numpy')}, equinox {info_lines.get('equinox')}, functx "
         f"{info_lines.get('functx')}; {info_lines.get('torch')}"),
        "float32 throughout; jax_default_matmul_precision=highest (no TF32)",
        (f"N = {opts.n} calls per process (fewer once calls 2.. have taken {opts.budget_s:g} s, "
         f"at least {MIN_CALLS}), {opts.repeat} fresh process(es) per (framework, workload), "
         "framework order alternating between rounds; medians over the rounds"
         + (f"; {opts.pause_s:g} s idle after each call (untimed)" if opts.pause_s else "")),
        f"load average (1/5/15 min) at the start: {load_average()}",
    ]
    prefix = "- " if markdown else ""
    print("\n".join(prefix + line for line in lines) + "\n", flush=True)


def fmt_ms(s):
    if s is None:
        return "-"
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def fmt_mb(b):
    return "-" if b is None else f"{b / 2 ** 20:+.1f}"


def fmt_ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def summarize(run):
    """The numbers of one child's run."""
    wall, cpu, n = run["wall"], run["cpu"], run["n"]
    tail = slice(max(3, n - STEADY_LAST), n) if n > 3 else slice(0, n)
    return {
        "call1": wall[0], "call2": wall[1] if n > 1 else None, "call3": wall[2] if n > 2 else None,
        "callN": wall[-1], "steady": statistics.median(wall[tail]),
        "slowest": max(wall[3:]) if n > 3 else None,
        "cpu1": cpu[0], "cpu_steady": statistics.median(cpu[tail]),
        "rss_first": run["rss"].get("call3", run["rss"]["callN"]) - run["rss"]["setup"],
        "rss_growth": (run["rss"]["callN"] - run["rss"]["call3"]) if "call3" in run["rss"] else None,
        "setup": run["setup_s"], "calls": n,
    }


def median_of(runs):
    """Medians over the rounds, key by key."""
    if not runs:
        return None
    keys = runs[0].keys()
    return {k: (None if any(r[k] is None for r in runs) else statistics.median(r[k] for r in runs))
            for k in keys}


def check_checksums(workload, checksums, problems):
    """functx against JAX to 1e-4, torch against JAX to 1e-3 (relative to the
    sum of absolute values, so that cancellation in the plain sum does not
    make the check meaningless); without JAX, against functx."""
    ref_name = "jax" if "jax" in checksums else "functx" if "functx" in checksums else None
    if ref_name is None:
        return []
    ref_sum, ref_abs = checksums[ref_name][0]
    notes = []
    for name, sums in checksums.items():
        if name == ref_name:
            continue
        tol = TOLERANCE["torch" if "torch" in (name, ref_name) else "functx"]
        worst = 0.0
        for s, a in sums:
            scale = max(abs(ref_abs), abs(a), 1e-30)
            worst = max(worst, abs(s - ref_sum) / scale, abs(a - ref_abs) / scale)
        ok = worst <= tol
        notes.append(f"{name} vs {ref_name}: {worst:.1e} ({'ok' if ok else 'FAILED'}, tol {tol:g})")
        if not ok:
            problems.append(f"{workload}: checksum of {name} {sums} differs from {ref_name}'s "
                            f"{checksums[ref_name][0]} by {worst:.1e} > {tol:g} (relative)")
    return notes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="calls per process (default 100)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, from {','.join(WORKLOADS)}")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma-separated, from {','.join(FRAMEWORKS)}")
    parser.add_argument("--repeat", type=int, default=1,
                        help=("fresh processes per (framework, workload), in rounds that alternate "
                              "the frameworks' order; medians reported (default 1)"))
    parser.add_argument("--pause-s", type=float, default=0.0,
                        help="seconds of idle time after each call, untimed (a notebook's "
                             "pauses between cells; the compile thread works in them)")
    parser.add_argument("--budget-s", type=float, default=20.0,
                        help=("stop a process's calls once calls 2.. have taken this many seconds "
                              f"(after at least {MIN_CALLS} calls; 0: no limit; default 20)"))
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads (default 0: the CPUs this process may use, "
                             "the size of XLA's CPU pool)")
    parser.add_argument("--quick", action="store_true", help="N=10, repeat 1 (smoke test)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument("--child", nargs=2, metavar=("FRAMEWORK", "WORKLOAD"), help=argparse.SUPPRESS)
    parser.add_argument("--info", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        if opts.torch_threads:
            os.environ["FIRST_CALLS_TORCH_THREADS"] = str(opts.torch_threads)
        return child(*opts.child, opts.n, opts.budget_s, opts.pause_s)
    if opts.info:
        if opts.torch_threads:
            os.environ["FIRST_CALLS_TORCH_THREADS"] = str(opts.torch_threads)
        return info()
    if opts.quick:
        opts.n, opts.repeat = 10, 1
    workloads = [w for w in opts.workloads.split(",") if w]
    frameworks = [f for f in opts.frameworks.split(",") if f]
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}")
    for f in frameworks:
        if f not in FRAMEWORKS:
            parser.error(f"unknown framework {f!r}")
    if opts.n < 1 or opts.repeat < 1:
        parser.error("--n and --repeat must be at least 1")

    md = opts.markdown
    info_lines, why = run_child(["--info", "--torch-threads", str(opts.torch_threads)], timeout=300)
    header(info_lines or {"devices": f"? ({why})"}, opts, md)
    started = time.perf_counter()
    explain = [
        ("Columns: wall time of calls 1, 2, 3 and the last (N unless 'budget': the process "
         "stopped early, its calls 2.. having taken --budget-s), in ms, JAX results blocked on; "
         f"steady: median of the last {STEADY_LAST} calls (from call 4 when fewer); slowest 4..: "
         "the slowest of calls 4 to the last (a stall: a compilation or a garbage collection "
         "inside a call); CPU: process "
         "CPU time (all threads) of the same calls; RSS: the change in the current resident set "
         "(/proc/self/statm) from after setup to after call 3, and from call 3 to the last call; "
         "functx/row: functx's time over this row's (the JAX row: functx / JAX eager; the torch "
         "row: functx / torch.func eager). The rejit workload's torch row is plain eager "
         "torch.func.grad(f), the eager reference (torch.compile is not measured)."),
    ]
    print("\n".join(explain) + "\n", flush=True)

    problems = []
    runs = {(w, f): [] for w in workloads for f in frameworks}
    checksums = {w: {} for w in workloads}
    for r in range(opts.repeat):
        for w in workloads:
            order = frameworks if r % 2 == 0 else frameworks[::-1]
            for f in order:
                print(f"[round {r + 1}/{opts.repeat}] {w} / {f} ...", file=sys.stderr, flush=True)
                result, why = run_child(["--child", f, w, "--n", str(opts.n),
                                         "--budget-s", str(opts.budget_s),
                                         "--pause-s", str(opts.pause_s),
                                         "--torch-threads", str(opts.torch_threads)])
                if result is None:
                    problems.append(f"{w} / {f}, round {r + 1}: {why}")
                    continue
                runs[w, f].append(summarize(result))
                checksums[w].setdefault(f, []).append(result["checksum"])

    summary_rows = []
    for w in workloads:
        med = {f: median_of(runs[w, f]) for f in frameworks}
        fx = med.get("functx")
        rows = []
        for f in frameworks:
            m = med[f]
            label = LABELS[f]
            if w == "rejit" and f == "torch":
                label += ", grad(f): no jit"
            if m is None:
                rows.append([label] + ["failed"] + ["-"] * 13)
                continue
            is_fx = f == "functx"
            calls = f"{m['calls']:.0f}" + ("" if m["calls"] == opts.n else " (budget)")
            rows.append([
                label, calls, fmt_ms(m["call1"]), fmt_ms(m["call2"]), fmt_ms(m["call3"]),
                fmt_ms(m["callN"]), fmt_ms(m["steady"]), fmt_ms(m["slowest"]),
                fmt_ms(m["cpu1"]), fmt_ms(m["cpu_steady"]),
                fmt_mb(m["rss_first"]), fmt_mb(m["rss_growth"]),
                "-" if is_fx or fx is None else fmt_ratio(fx["call2"], m["call2"]),
                "-" if is_fx or fx is None else fmt_ratio(fx["steady"], m["steady"]),
            ])
        check_notes = check_checksums(w, checksums[w], problems)
        render(
            f"{w}: {DESCRIPTIONS[w]}",
            ["framework", "calls", "call 1 (ms)", "call 2", "call 3", "last call", "steady",
             "slowest 4..", "CPU call 1", "CPU steady", "RSS setup->3 (MB)", "RSS 3->last (MB)",
             "functx/row call 2", "functx/row steady"],
            rows, md,
            notes=["checksum of the last call's result (sum and sum of |x| of all gradient "
                   "leaves): " + ("; ".join(check_notes) if check_notes else "nothing to compare")],
        )
        row = [w]
        for other in ("jax", "torch"):
            o = med.get(other)
            for key in ("call1", "call2", "call3", "steady"):
                row.append(fmt_ratio(fx[key], o[key]) if fx and o else "-")
        summary_rows.append(row)

    if "functx" in frameworks and len(frameworks) > 1:
        render(
            "Summary: functx eager's time over JAX eager's and over torch.func eager's",
            ["workload", "/jax call 1", "/jax call 2", "/jax call 3", "/jax steady",
             "/torch call 1", "/torch call 2", "/torch call 3", "/torch steady"],
            summary_rows, md,
        )
    print(f"{'- ' if md else ''}total time: {time.perf_counter() - started:.0f} s; load average "
          f"(1/5/15 min) at the end: {load_average()}\n")
    if problems:
        print("### Problems\n" if md else "Problems:")
        for p in problems:
            print(f"- {p}")
        sys.exit(1)
    print("No problems: every child ran and every checksum agreed.")


DESCRIPTIONS = {
    "mlp": "vmap(grad(loss), in_dims=(None, 0, 0)), 32-64-64-10 tanh MLP, batch 64, cross-entropy",
    "cnn": ("vmap(grad(loss)), Conv2d(1,8,3)-relu-Conv2d(8,8,3)-relu-mean-Linear(8,10), 1x12x12, "
            "batch 16 (Equinox for functx/JAX)"),
    "maml": (f"vmap over {MAML_TASKS} tasks of grad of ({MAML_INNER_STEPS} inner SGD steps of a "
             f"1-40-40-1 relu MLP, then the query loss)"),
    "scan": (f"grad of a {SCAN_STEPS}-step scan h <- tanh(h @ w + x), {SCAN_WIDTH}-wide state "
             "(torch: a Python loop)"),
    "rejit": ("grad(jit(f)), functx.jit(f) / jax.jit(f) built anew in every call (torch: eager "
              "grad(f), no compile)"),
}


if __name__ == "__main__":
    main()
