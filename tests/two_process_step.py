"""One data-parallel DP-SGD step of functx across processes: started twice
by tests/test_many_devices.py (`python two_process_step.py PROCESS_ID
NUM_PROCESSES PORT`), each process with one CPU device and its half of the
batch, joined by `jax.distributed.initialize` (CPU collectives over gloo,
coordinator on 127.0.0.1). Prints the leaves of the new parameters as JSON. The test
imports `dp_sgd_step` and `data` to compute the one-process result."""

import json
import sys

import numpy as np

BATCH, SIZES, CLIP, LR = 8, (3, 5, 1), 0.5, 0.1


def data():
    rng = np.random.default_rng(0)
    params = [{"w": rng.standard_normal((m, n)) / np.sqrt(n), "b": rng.standard_normal(m)}
              for n, m in zip(SIZES[:-1], SIZES[1:])]
    return params, rng.standard_normal((BATCH, SIZES[0])), rng.standard_normal((BATCH, 1))


def dp_sgd_step(params, xs, ys):
    """Per-sample gradients (a named vmap over the batch), clipped, averaged
    with pmean; the batch axis on the mesh axis 'data'."""
    import jax

    import functx
    import functx.numpy as fnp

    def loss(p, x, y):
        h = fnp.tanh(p[0]["w"] @ x + p[0]["b"])
        return fnp.sum((p[1]["w"] @ h + p[1]["b"] - y) ** 2)

    def per_example(x, y):
        g = functx.grad(loss)(params, x, y)
        norm = fnp.sqrt(sum(fnp.sum(leaf ** 2) for leaf in jax.tree_util.tree_leaves(g)))
        g = jax.tree_util.tree_map(lambda leaf: leaf * fnp.minimum(1.0, CLIP / norm), g)
        return functx.lax.pmean(g, "batch")

    mean = functx.vmap(per_example, out_dims=None, axis_name="batch",
                       spmd_axis_name="data")(xs, ys)
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, mean)


def _gloo_on_loopback():
    """gloo's TCP transport binds the address its host name resolves to; a
    machine (or chroot) whose /etc/hosts lacks its own name cannot resolve
    it. Both processes run on this machine, so gloo binds 127.0.0.1: JAX has
    no public switch for that, so the factory its CPU backend calls (which
    takes a host name) is wrapped before the backend is created."""
    import functools

    from jax._src import xla_bridge

    make = xla_bridge._jax.make_gloo_tcp_collectives
    xla_bridge._jax.make_gloo_tcp_collectives = functools.partial(make, hostname="127.0.0.1")


def main(process_id, num_processes, port):
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _gloo_on_loopback()
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=60)
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import functx

    assert jax.process_count() == num_processes and jax.device_count() == num_processes
    mesh = jax.make_mesh((num_processes,), ("data",), axis_types=(AxisType.Auto,))
    replicated, by_rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params, xs, ys = data()
    rows = slice(process_id * BATCH // num_processes, (process_id + 1) * BATCH // num_processes)
    global_params = jax.tree_util.tree_map(
        lambda a: jax.make_array_from_callback(a.shape, replicated, lambda index: a[index]),
        params)
    global_xs = jax.make_array_from_process_local_data(by_rows, xs[rows], xs.shape)
    global_ys = jax.make_array_from_process_local_data(by_rows, ys[rows], ys.shape)
    step = functx.jit(dp_sgd_step, in_shardings=(replicated, by_rows, by_rows),
                      out_shardings=replicated)
    new = step(global_params, global_xs, global_ys)
    local = [np.asarray(a.addressable_data(0)).tolist() for a in jax.tree_util.tree_leaves(new)]
    print("RESULT " + json.dumps(local), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
