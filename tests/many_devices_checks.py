"""Checks on 8 simulated CPU devices, run by tests/test_many_devices.py in a
subprocess (the device count is fixed when JAX starts). Each check compares
functx with JAX on the same sharded program; the script prints one JSON
object: check name -> "ok" or the failure."""

import json
import os
import sys
import time
import traceback

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import functx  # noqa: E402

MESH = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
BY_ROWS = NamedSharding(MESH, P("d"))
REPLICATED = NamedSharding(MESH, P())
RNG = np.random.default_rng(0)
W = jnp.asarray(RNG.standard_normal(3))
X = jnp.asarray(RNG.standard_normal((16, 3)))
XS = jax.device_put(X, BY_ROWS)


def loss(w, x):
    return jnp.sum(jnp.tanh(x * w) ** 2)


def close(a, b):
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(
        np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-12), a, b)


def same_sharding(a, b):
    assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)


def check_sharded_arrays_through_transforms():
    # eagerly and compiled, functx's results keep the layout JAX's get
    for fx, jx in [
        (functx.vmap(functx.grad(loss), in_dims=(None, 0)),
         jax.vmap(jax.grad(loss), in_axes=(None, 0))),
        (functx.jit(functx.vmap(functx.grad(loss), in_dims=(None, 0))),
         jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0)))),
        (functx.jacrev(lambda w, x: functx.vmap(loss, in_dims=(None, 0))(w, x), argnums=1),
         jax.jacrev(lambda w, x: jax.vmap(loss, in_axes=(None, 0))(w, x), argnums=1)),
    ]:
        a, b = fx(W, XS), jx(W, XS)
        close(a, b)
        assert "d" in a.sharding.spec, a.sharding
        same_sharding(a, b)
    g = functx.grad(lambda w: jnp.sum(functx.vmap(loss, in_dims=(None, 0))(w, XS)))(W)
    close(g, jax.grad(lambda w: jnp.sum(jax.vmap(loss, in_axes=(None, 0))(w, XS)))(W))
    # the compiled program is partitioned: each device holds its 2 rows
    shards = functx.jit(functx.vmap(functx.grad(loss), in_dims=(None, 0)))(W, XS)
    assert {s.data.shape for s in shards.addressable_shards} == {(2, 3)}


def check_jit_shardings():
    f = functx.jit(functx.vmap(functx.grad(loss), in_dims=(None, 0)),
                   in_shardings=(REPLICATED, BY_ROWS), out_shardings=BY_ROWS)
    g = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0)),
                in_shardings=(REPLICATED, BY_ROWS), out_shardings=BY_ROWS)
    a, b = f(W, X), g(W, X)  # X is on one device: the call splits it
    close(a, b)
    same_sharding(a, b)
    assert f.lower(W, X).compile().input_shardings == g.lower(W, X).compile().input_shardings

    def total(w, x):
        return jnp.sum(jax.vmap(loss, in_axes=(None, 0))(w, x))

    h = functx.jit(total, in_shardings=(REPLICATED, BY_ROWS), out_shardings=REPLICATED)
    hj = jax.jit(total, in_shardings=(REPLICATED, BY_ROWS), out_shardings=REPLICATED)
    # under transforms the shardings are constraints inside the staged graph
    close(functx.grad(h)(W, XS), jax.grad(hj)(W, XS))
    close(functx.jit(functx.grad(h))(W, XS), jax.jit(jax.grad(hj))(W, XS))
    ws = jnp.stack([W, 2 * W])
    close(functx.vmap(h, in_dims=(0, None))(ws, XS), jax.vmap(hj, in_axes=(0, None))(ws, XS))
    text = functx.jit(functx.grad(h)).lower(W, XS).as_text()
    assert "sharding_constraint" in text and '[{"d"}' in text, text
    # one sharding for every argument; a program drawing from the
    # stateful generator (its state replicated)
    k = functx.jit(lambda a, b: a * b + functx.random.rand(16, 3), in_shardings=BY_ROWS,
                   out_shardings=BY_ROWS)
    functx.random.manual_seed(0)
    r1 = k(X, X)
    functx.random.manual_seed(0)
    r2 = functx.jit(lambda a, b: a * b + functx.random.rand(16, 3))(X, X)
    close(r1, r2)
    assert r1.sharding.spec[0] == "d"


def _constrained(x):
    return jax.lax.with_sharding_constraint(jnp.sin(x), P(None))


def _constraints(lowered):
    return [line.split("<", 1)[1] for line in lowered.as_text().splitlines()
            if "sharding_constraint" in line]


def check_spmd_axis_name():
    f = functx.jit(functx.vmap(functx.grad(loss), in_dims=(None, 0), spmd_axis_name="d"))
    g = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0), spmd_axis_name="d"))
    a, b = f(W, XS), g(W, XS)
    close(a, b)
    same_sharding(a, b)
    a = functx.vmap(functx.grad(loss), in_dims=(None, 0), spmd_axis_name="d")(W, XS)
    assert a.sharding.spec[0] == "d"
    with jax.set_mesh(MESH):
        fx = functx.jit(functx.vmap(_constrained, spmd_axis_name="d"))
        jx = jax.jit(jax.vmap(_constrained, spmd_axis_name="d"))
        close(fx(X), jx(X))
        # the constraint inside is batched as JAX batches it: its batch
        # dimension on "d" (an unnamed vmap leaves it unconstrained)
        assert set(_constraints(jx.lower(X))) <= set(_constraints(fx.lower(X))), (
            _constraints(fx.lower(X)), _constraints(jx.lower(X)))
        assert set(_constraints(jax.jit(jax.vmap(_constrained)).lower(X))) == set(
            _constraints(functx.jit(functx.vmap(_constrained)).lower(X)))
        # the batched input and output are split along "d" too
        assert any('[{"d"}, {?}]' in c for c in _constraints(fx.lower(X)))
        # and a jit's in_shardings under the spmd vmap
        inner = functx.jit(lambda r: r * 2.0, in_shardings=NamedSharding(MESH, P(None)))
        text = functx.jit(functx.vmap(inner, spmd_axis_name="d")).lower(X).as_text()
        assert '[{"d"}, {}]' in text, text
        try:
            functx.vmap(jnp.sin, spmd_axis_name="nope")(XS)
        except functx.FunctxError as e:
            assert "nope" in str(e)
        else:
            raise AssertionError("a mesh axis the mesh lacks was accepted")


def check_functx_inside_shard_map():
    def body(w, xb):
        g = functx.vmap(functx.grad(loss), in_dims=(None, 0))(w, xb)
        return jax.lax.pmean(jnp.mean(g, 0), "d")

    sm = jax.shard_map(body, mesh=MESH, in_specs=(P(), P("d")), out_specs=P())
    expected = jnp.mean(jax.vmap(jax.grad(loss), in_axes=(None, 0))(W, X), 0)
    close(jax.jit(sm)(W, XS), expected)
    close(sm(W, XS), expected)
    close(functx.jit(sm)(W, XS), expected)

    # functx's named axes next to the mesh's inside the body
    def named(w, xb):
        per = functx.vmap(lambda x: functx.lax.pmean(functx.grad(loss)(w, x), "b"),
                          axis_name="b", out_dims=None)(xb)
        return jax.lax.pmean(per, "d")

    close(jax.jit(jax.shard_map(named, mesh=MESH, in_specs=(P(), P("d")), out_specs=P()))(W, XS),
          expected)


def check_shard_map_inside_functx():
    def body(w, xb):
        return jax.lax.psum(jnp.sum(jax.vmap(loss, in_axes=(None, 0))(w, xb)), "d")

    sm = jax.shard_map(body, mesh=MESH, in_specs=(P(), P("d")), out_specs=P())
    close(sm(W, XS), jax.jit(sm)(W, XS))
    expected = jax.jit(jax.grad(sm))(W, XS)
    close(functx.grad(sm)(W, XS), expected)
    close(functx.jit(functx.grad(sm))(W, XS), expected)
    ws = jnp.stack([W, 2 * W])
    close(functx.vmap(sm, in_dims=(0, None))(ws, XS),
          jax.jit(jax.vmap(sm, in_axes=(0, None)))(ws, XS))
    close(functx.vmap(functx.grad(sm), in_dims=(0, None))(ws, XS),
          jax.jit(jax.vmap(jax.grad(sm), in_axes=(0, None)))(ws, XS))
    close(functx.jit(functx.jacfwd(sm))(W, XS), jax.jit(jax.jacfwd(sm))(W, XS))


CHECKS = {name[len("check_"):]: fn for name, fn in list(globals().items())
          if name.startswith("check_")}


def main(names):
    results = {}
    for name in names or CHECKS:
        start = time.perf_counter()
        try:
            CHECKS[name]()
            results[name] = "ok"
            print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = traceback.format_exc(limit=-6)
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
