"""Memory per new batch size, eager: functx against JAX, fresh processes.

An eager program called at a batch size it has not met compiles again (JAX:
one program per primitive and shape; functx: its per-primitive programs, and
once they repeat, its fused, batched, backward and queue programs). A
notebook that tries many batch sizes keeps all of them. This measures the
per-sample gradients of first_calls.py's `mlp` workload (32-64-64-10 tanh
MLP, `vmap(grad(loss), in_dims=(None, 0, 0))`) at S batch sizes, each called
C times (functx: then waiting for its compile thread, so that what it
compiles for that size is counted), twice round the cycle:

  * RSS after setup and after each size of the first pass: the growth per
    new size (median of the increments after the first size, which also
    pays for everything shape-independent);
  * RSS after the second pass (every size met again): what the cycle
    plateaus at; functx also reports its caches' entries and bytes
    (`functx.cache_info()`).

Usage: python benchmarks/batch_sizes.py [--sizes S] [--calls C] [--markdown]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from first_calls import convert, framework_ops, mlp_data, mlp_forward, rss_bytes  # noqa: E402


def child(framework, sizes, calls):
    ops = framework_ops(framework)
    np = __import__("numpy")
    params, x, y = mlp_data()
    rng = np.random.default_rng(5)
    params = convert(params, ops)

    def loss(p, x, y):
        return -(y * ops.log_softmax(mlp_forward(ops, p, x, ops.tanh))).sum()

    per_sample = ops.vmap(ops.grad(loss), in_dims=(None, 0, 0))
    wait = lambda: None  # noqa: E731
    if framework == "functx":
        from functx.caches import wait_for_compiles as wait
    batches = []
    for b in sizes:
        xb = rng.standard_normal((b, x.shape[1])).astype("float32")
        yb = np.eye(10, dtype="float32")[rng.integers(0, 10, b)]
        batches.append(convert((xb, yb), ops))
    rss = {"setup": rss_bytes(), "first": [], "second": None}
    t0 = time.perf_counter()
    for xb, yb in batches:
        for _ in range(calls):
            ops.block(per_sample(params, xb, yb))
            wait()
        ops.block(per_sample(params, xb, yb))  # picks up what was compiled
        rss["first"].append(rss_bytes())
    for xb, yb in batches:
        for _ in range(calls):
            ops.block(per_sample(params, xb, yb))
    wait()
    rss["second"] = rss_bytes()
    out = {"framework": framework, "rss": rss, "seconds": time.perf_counter() - t0}
    if framework == "functx":
        import functx

        info = functx.cache_info()
        out["entries"] = sum(v.get("entries", 0) for v in info.values())
        out["bytes"] = sum(v.get("bytes", 0) or 0 for v in info.values())
    print(json.dumps(out), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, default=20, help="batch sizes (default 20: 33..52)")
    parser.add_argument("--calls", type=int, default=3, help="calls per size and pass (default 3)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        framework, s, c = args.child
        child(framework, list(range(33, 33 + int(s))), int(c))
        return
    rows = {}
    for framework in ("functx", "jax"):
        print(f"[{framework}] {args.sizes} sizes x {args.calls} calls ...", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, "--child", framework, str(args.sizes),
                               str(args.calls)], capture_output=True, text=True, timeout=1800)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not line:
            print(f"{framework} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        rows[framework] = json.loads(line[-1])
    mb = 1 / (1 << 20)
    sep = " | " if args.markdown else "  "
    print(f"{platform.node()} ({os.cpu_count()} CPUs), python {platform.python_version()}, "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    head = ["framework", "first size (MB)", "per new size (MB, median)", "after pass 1 (MB)",
            "after pass 2 (MB)", "seconds"]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    else:
        print(sep.join(head))
    for name, r in rows.items():
        rss = r["rss"]
        first = rss["first"]
        incs = [b - a for a, b in zip(first, first[1:])]
        cells = [name, f"{(first[0] - rss['setup']) * mb:.1f}", f"{statistics.median(incs) * mb:.2f}",
                 f"{(first[-1] - rss['setup']) * mb:.1f}", f"{(rss['second'] - rss['setup']) * mb:.1f}",
                 f"{r['seconds']:.1f}"]
        print(("| " + " | ".join(cells) + " |") if args.markdown else sep.join(cells))
    f = rows["functx"]
    print(f"functx caches at the end: {f['entries']} entries, {f['bytes'] * mb:.0f} MB counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
