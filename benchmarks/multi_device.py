"""The many-device recipes (examples/multi_device.py) as a benchmark: one
DP-SGD step (per-sample gradients of a batch split over the devices,
clipped, pmean-averaged), the gradients of an ensemble with one member
per device, and a MAML meta-gradient with the tasks split over the
devices; each as `functx.jit` of functx transforms and as `jax.jit` of
JAX's transforms of the same program (JAX's `vmap(spmd_axis_name=)`,
`lax.pmean`), on a mesh over all the devices, after checking that the two
agree. Steady-state median time per call (float32).

On a CPU host, `--cpu-devices 8` simulates 8 devices (XLA's
`--xla_force_host_platform_device_count`, set before JAX starts). On one
GPU the mesh has one device: the programs carry the same sharding
annotations and compile to one-device programs.

Usage: python benchmarks/multi_device.py [--cpu-devices N] [--rounds R] [--markdown]
"""

import argparse
import os
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-devices", type=int, default=0,
                        help="simulate this many CPU devices (CPU hosts; default: the real ones)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.cpu_devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.cpu_devices}")

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import functx
    import functx.numpy as fnp
    from _common import render

    jax.config.update("jax_default_matmul_precision", "highest")
    # Simulated CPU devices share the host's cores: with calls with
    # collectives in flight back to back, XLA's CPU all-reduce can wait for
    # device threads busy with the next call (jax 0.10: a deadlock it ends
    # by aborting after 40 s, with jax.jit as with functx.jit). There each
    # call is waited for.
    blocking = jax.default_backend() == "cpu"
    devices = jax.devices()
    n = len(devices)
    mesh = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,))
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    rng = np.random.default_rng(0)
    tmap, leaves = jax.tree_util.tree_map, jax.tree_util.tree_leaves

    def mlp_params(sizes):
        return [{"w": jnp.asarray(rng.standard_normal((m, k)) / np.sqrt(k), jnp.float32),
                 "b": jnp.zeros(m, jnp.float32)} for k, m in zip(sizes[:-1], sizes[1:])]

    def programs(np_, vmap, grad, pmean, spmd_kw):
        """The three recipes against one array namespace and transform set."""

        def mlp(p, x):
            for layer in p[:-1]:
                x = np_.tanh(layer["w"] @ x + layer["b"])
            return p[-1]["w"] @ x + p[-1]["b"]

        def loss(p, x, y):
            return np_.sum((mlp(p, x) - y) ** 2)

        def dp_sgd(p, xs, ys):
            def per_example(x, y):
                g = grad(loss)(p, x, y)
                norm = np_.sqrt(sum(np_.sum(leaf ** 2) for leaf in leaves(g)))
                g = tmap(lambda leaf: leaf * np_.minimum(1.0, 1.0 / (norm + 1e-6)), g)
                return pmean(g, "batch")

            mean = vmap(per_example, out_axes=None, axis_name="batch", **spmd_kw)(xs, ys)
            return tmap(lambda a, g: a - 0.1 * g, p, mean)

        def ensemble(ws, xs, ys):
            def member_loss(w):
                return np_.mean((vmap(lambda x: mlp(w, x))(xs) - ys) ** 2)
            return vmap(grad(member_loss), **spmd_kw)(ws)

        def maml(p, tasks):
            def task_loss(q, xs, ys):
                return np_.mean(vmap(lambda x, y: loss(q, x, y))(xs, ys))

            def adapted(q, xs_s, ys_s, xs_q, ys_q):
                fast = tmap(lambda a, d: a - 0.01 * d, q, grad(task_loss)(q, xs_s, ys_s))
                return task_loss(fast, xs_q, ys_q)

            def meta_loss(q):
                return np_.mean(vmap(lambda *t: adapted(q, *t), **spmd_kw)(*tasks))

            return grad(meta_loss)(p)

        return dp_sgd, ensemble, maml

    def fx_vmap(f, out_axes=0, **kw):
        return functx.vmap(f, out_dims=out_axes, **kw)

    spmd = {"spmd_axis_name": "data"}
    fx = programs(fnp, fx_vmap, functx.grad, functx.lax.pmean, spmd)
    jx = programs(jnp, jax.vmap, jax.grad, jax.lax.pmean, spmd)

    batch = 64 * n
    dp_args = (mlp_params((64, 256, 256, 10)),
               jnp.asarray(rng.standard_normal((batch, 64)), jnp.float32),
               jnp.asarray(rng.standard_normal((batch, 10)), jnp.float32))
    members = [mlp_params((32, 128, 4)) for _ in range(n * 2)]
    ens_args = (tmap(lambda *a: jnp.stack(a), *members),
                jnp.asarray(rng.standard_normal((32, 32)), jnp.float32),
                jnp.asarray(rng.standard_normal((32, 4)), jnp.float32))
    tasks = tuple(jnp.asarray(rng.uniform(-5, 5, (4 * n, 10, 1)), jnp.float32) for _ in range(4))
    maml_args = (mlp_params((1, 40, 40, 1)), tasks)
    workloads = [
        ("DP-SGD step, batch %d split" % batch, 0, dp_args, (rep, rows, rows), rep),
        ("ensemble of %d MLPs, grads" % (2 * n), 1, ens_args, (rows, rep, rep), rows),
        ("MAML meta-grad, %d tasks split" % (4 * n), 2, maml_args, (rep, rows), rep),
    ]

    def timed(f, a):
        jax.block_until_ready(f(*a))
        calls, t0 = 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - t0 < 0.2:
            out = f(*a)
            if blocking:
                jax.block_until_ready(out)
            calls += 1
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / calls

    table = []
    for name, k, a, ins, out in workloads:
        a = jax.device_put(a, ins)
        f_fx = functx.jit(fx[k], in_shardings=ins, out_shardings=out)
        f_jx = jax.jit(jx[k], in_shardings=ins, out_shardings=out)
        t0 = time.perf_counter()
        r_fx = jax.block_until_ready(f_fx(*a))
        first_fx = time.perf_counter() - t0
        t0 = time.perf_counter()
        r_jx = jax.block_until_ready(f_jx(*a))
        first_jx = time.perf_counter() - t0
        err = max(float(jnp.max(jnp.abs(u - v)) / (1e-6 + jnp.max(jnp.abs(v))))
                  for u, v in zip(leaves(r_fx), leaves(r_jx)))
        assert err < 1e-4, (name, err)
        spec = leaves(r_fx)[0].sharding
        times_fx, times_jx = [], []
        for _ in range(args.rounds):
            times_fx.append(timed(f_fx, a))
            times_jx.append(timed(f_jx, a))
        t_fx, t_jx = statistics.median(times_fx), statistics.median(times_jx)
        table.append([name, f"{t_fx * 1e3:.3f} ms", f"{t_jx * 1e3:.3f} ms", f"{t_fx / t_jx:.2f}x",
                      f"{first_fx:.2f} s / {first_jx:.2f} s",
                      getattr(spec, "spec", type(spec).__name__).__str__()])
    render(f"Many-device recipes on {n} {devices[0].platform} device(s) "
           f"({devices[0].device_kind}), jax {jax.__version__}",
           ["workload", "functx.jit", "jax.jit", "ratio", "first call fx / jax", "out spec"],
           table, args.markdown,
           notes=["steady-state median over rounds; first call = trace + compile + run"
                  + ("; CPU: each call waited for" if blocking else "")])


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
