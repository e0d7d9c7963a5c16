"""What JAX's persistent compilation cache buys eager functx: the first calls
of a fresh process, with and without `functx.config.update(
"persistent_cache_dir", path)` (NOTE [persistent cache] in functx/config.py).

Workload: eager per-sample gradients, `functx.vmap(functx.grad(loss),
in_dims=(None, 0, 0))`, of the cross-entropy of a 32-64-64-10 tanh MLP
(params a dict), batch 64, float32, called 3 times.

Each round runs four fresh processes (this script with --child), one after
the other:
  no cache, run 1 and run 2   (the cache switch off: both compile everything)
  cache, run 1 and run 2      (an empty cache directory made for the round:
                               run 1 compiles and writes, run 2 reads back)
Each child times `import functx`, then calls 1..3 one by one (wall clock,
results blocked on), and counts through `jax.monitoring` the XLA
compilations (backend_compile_duration events: a compilation, or a read
from the cache), their seconds, the tracing + lowering seconds, and the
persistent-cache hits. The parent checks that the four children computed
the same gradients and prints one table (medians over --repeat rounds).

    python benchmarks/persistent_cache.py [--repeat 3] [--calls 3]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = (32, 64, 64, 10)
BATCH = 64


def child(cache_dir, calls):
    t0 = time.perf_counter()
    import jax
    import numpy as np

    import functx
    import functx.numpy as fnp

    t_import = time.perf_counter() - t0
    if cache_dir:
        functx.config.update("persistent_cache_dir", cache_dir)

    counts = {"compiles": 0, "compile_s": 0.0, "trace_lower_s": 0.0, "hits": 0}

    def on_duration(event, secs, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            counts["compiles"] += 1
            counts["compile_s"] += secs
        elif event in ("/jax/core/compile/jaxpr_trace_duration",
                       "/jax/core/compile/jaxpr_to_mlir_module_duration"):
            counts["trace_lower_s"] += secs

    def on_event(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)

    rng = np.random.default_rng(0)
    params = {}
    for i, (m, n) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        params[f"w{i}"] = (rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32)
        params[f"b{i}"] = np.zeros((n,), np.float32)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], BATCH)]
    params = {k: jax.numpy.asarray(v) for k, v in params.items()}
    x, y = jax.numpy.asarray(x), jax.numpy.asarray(y)
    jax.block_until_ready((params, x, y))

    def loss(p, xi, yi):
        h = xi
        depth = len(SIZES) - 1
        for i in range(depth):
            h = h @ p[f"w{i}"] + p[f"b{i}"]
            if i < depth - 1:
                h = fnp.tanh(h)
        logp = h - fnp.log(fnp.sum(fnp.exp(h - fnp.max(h)))) - fnp.max(h)
        return -fnp.sum(yi * logp)

    per_sample = functx.vmap(functx.grad(loss), in_dims=(None, 0, 0))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        out = per_sample(params, x, y)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    checksum = float(sum(float(np.abs(np.asarray(v)).sum()) for v in out.values()))
    print(json.dumps({"import_s": t_import, "times": times, "checksum": checksum, **counts}))


def run_child(cache_dir, calls):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--calls", str(calls)]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    env = dict(os.environ)
    env.pop("FUNCTX_CACHE_DIR", None)  # the switch is set (or not) by the child itself
    env.pop("FUNCTX_LOG_COMPILES", None)
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.cache_dir, args.calls)
        return

    rows = {k: [] for k in ("no cache, run 1", "no cache, run 2", "cache, run 1",
                            "cache, run 2")}
    cache_bytes = []
    for _ in range(args.repeat):
        rows["no cache, run 1"].append(run_child(None, args.calls))
        rows["no cache, run 2"].append(run_child(None, args.calls))
        d = tempfile.mkdtemp(prefix="functx-cache-")
        try:
            rows["cache, run 1"].append(run_child(d, args.calls))
            cache_bytes.append(sum(os.path.getsize(os.path.join(r, f))
                                   for r, _, fs in os.walk(d) for f in fs))
            rows["cache, run 2"].append(run_child(d, args.calls))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    sums = [r["checksum"] for rs in rows.values() for r in rs]
    assert max(sums) - min(sums) <= 1e-5 * max(abs(s) for s in sums), sums

    import jax

    print(f"eager functx.vmap(functx.grad(loss), in_dims=(None, 0, 0)), "
          f"{'-'.join(map(str, SIZES))} tanh MLP, batch {BATCH}, float32; "
          f"jax {jax.__version__}, backend {jax.default_backend()}, "
          f"FUNCTX_BACKGROUND_COMPILE={os.environ.get('FUNCTX_BACKGROUND_COMPILE', '1')}, "
          f"median of {args.repeat} round(s)")
    calls = [f"call {i + 1}" for i in range(args.calls)]
    head = (["process", "import"] + calls
            + ["XLA compiles", "of which cache reads", "compile s", "trace+lower s"])
    print()
    print("| | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    med = statistics.median
    for name, rs in rows.items():
        cells = [f"{med(r['process_s'] for r in rs):.2f} s", f"{med(r['import_s'] for r in rs):.2f} s"]
        cells += [f"{med(r['times'][i] for r in rs) * 1e3:.1f} ms" for i in range(args.calls)]
        cells += [f"{med(r['compiles'] for r in rs):.0f}", f"{med(r['hits'] for r in rs):.0f}",
                  f"{med(r['compile_s'] for r in rs):.3f}",
                  f"{med(r['trace_lower_s'] for r in rs):.3f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print(f"cache directory after run 1: {med(cache_bytes) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
