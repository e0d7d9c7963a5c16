"""Many devices through JAX's own engine (SPEC §7, NOTE [spmd axes],
NOTE [shardings of functx.jit], NOTE [shard_map on functx values]):
functx.jit shardings on this process's one device; on 8 simulated CPU
devices (tests/many_devices_checks.py, in one subprocess: the device count
is fixed when JAX starts) sharded arrays through transforms, jit shardings,
spmd_axis_name and jax.shard_map in both directions, each against JAX; and
one data-parallel step across 2 processes joined by jax.distributed. The
8-device recipes (DP-SGD, ensemble, MAML) are examples/multi_device.py,
run by tests/test_examples.py."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import functx
import functx.numpy as fnp

HERE = pathlib.Path(__file__).parent
X = jnp.array([[0.5, -1.25, 2.0], [0.75, 0.1, -0.3]])
W = jnp.array([0.3, -0.7, 1.1])


def close(a, b):
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(
        np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-12), a, b)


def loss(w, x):
    return fnp.sum(fnp.tanh(x * w) ** 2)


# -- one device, in this process ---------------------------------------------

ONE = SingleDeviceSharding(jax.devices()[0])
MESH1 = jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))


@pytest.mark.slow
def test_jit_shardings_on_one_device():
    rows = NamedSharding(MESH1, P("d"))
    f = functx.jit(functx.vmap(functx.grad(loss), in_dims=(None, 0)),
                   in_shardings=(ONE, rows), out_shardings=rows)
    out = f(W, X)
    close(out, jax.vmap(jax.grad(loss), in_axes=(None, 0))(W, X))
    assert out.sharding == rows
    # under transforms (constraints in the staged graph), and a pytree prefix
    g = functx.jit(lambda p, x: fnp.sum(loss(p["w"], x)), in_shardings=({"w": ONE}, None),
                   out_shardings=ONE)
    close(functx.grad(g)({"w": W}, X[0]),
          jax.grad(lambda p, x: jnp.sum(loss(p["w"], x)))({"w": W}, X[0]))
    close(functx.vmap(g, in_dims=(None, 0))({"w": W}, X),
          jax.vmap(lambda p, x: jnp.sum(loss(p["w"], x)), in_axes=(None, 0))({"w": W}, X))
    with pytest.raises(functx.FunctxValueError, match="in_shardings"):
        functx.grad(functx.jit(lambda a, b: fnp.sum(a * b), in_shardings=(ONE, ONE, ONE)))(W, W)


def test_donated_argument_is_donated():
    x = jnp.arange(4.0)
    out = functx.jit(lambda a: a * 2.0, donate_argnums=0)(x)
    close(out, jnp.arange(4.0) * 2.0)
    assert x.is_deleted()  # as with jax.jit(donate_argnums=0)


@pytest.mark.slow
def test_shard_map_on_a_one_device_mesh():
    def body(w, xb):
        return jax.lax.psum(jnp.sum(jax.vmap(loss, in_axes=(None, 0))(w, xb)), "d")

    sm = jax.shard_map(body, mesh=MESH1, in_specs=(P(), P("d")), out_specs=P())
    close(functx.grad(sm)(W, X), jax.grad(sm)(W, X))
    inside = jax.shard_map(lambda w, xb: jax.lax.pmean(
        functx.vmap(functx.grad(loss), in_dims=(None, 0))(w, xb).mean(0), "d"),
        mesh=MESH1, in_specs=(P(), P("d")), out_specs=P())
    close(jax.jit(inside)(W, X), jax.vmap(jax.grad(loss), in_axes=(None, 0))(W, X).mean(0))


# -- 8 simulated devices, one subprocess ---------------------------------------

CHECKS = ["sharded_arrays_through_transforms", "jit_shardings", "spmd_axis_name",
          "functx_inside_shard_map", "shard_map_inside_functx"]


@pytest.fixture(scope="module")
def eight_device_results():
    result = subprocess.run([sys.executable, str(HERE / "many_devices_checks.py"), *CHECKS],
                            capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULTS ")]
    assert result.returncode == 0 and lines, result.stdout + result.stderr
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.slow  # one subprocess with 8 simulated devices runs every check
@pytest.mark.parametrize("check", CHECKS)
def test_eight_devices(eight_device_results, check):
    assert eight_device_results[check] == "ok", eight_device_results[check]


# -- 2 processes, jax.distributed ---------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two processes, each compiling the step
def test_data_parallel_step_across_two_processes():
    import two_process_step as tps

    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, str(HERE / "two_process_step.py"), str(i), "2",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env) for i in range(2)]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=300)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    params, xs, ys = tps.data()
    expected = tps.dp_sgd_step(jax.tree_util.tree_map(jnp.asarray, params), jnp.asarray(xs),
                               jnp.asarray(ys))
    for out in outputs:
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
        leaves = json.loads(line[len("RESULT "):])
        close([np.asarray(leaf) for leaf in leaves], jax.tree_util.tree_leaves(expected))
