"""functx.autograd.forward_ad against torch.autograd.forward_ad (same
float64 numbers) and jax.jvp; nested dual levels against jax.jvp of
jax.jvp. Compositions run inside one jax.jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as tfw

import functx as fx
import functx.numpy as fnp
from functx.autograd import forward_ad as fw

X = np.array([0.3, -1.2, 2.0])
Y = np.array([[0.5, 1.5], [2.0, -0.7]])
TX = np.array([1.0, 0.5, -2.0])
TY = np.array([[0.2, -1.0], [0.3, 0.4]])
T2 = np.array([0.2, 1.0, 0.3])


def f(x, y, M):
    return M.sin(x) * M.exp(y).sum() + x ** 3 * y[0, 1], (M.tanh(y) @ y).sum()


@pytest.mark.slow
def test_duals_match_torch_and_jax():
    with fw.dual_level() as level:
        assert level == 0
        xd = fw.make_dual(jnp.asarray(X), jnp.asarray(TX))
        yd = fw.make_dual(jnp.asarray(Y), jnp.asarray(TY))
        out = f(xd, yd, fnp)
        got = [fw.unpack_dual(o) for o in out]
        plain = fw.unpack_dual(jnp.asarray(X))
        constant = fw.unpack_dual(jnp.asarray(Y) * 2.0)
    assert isinstance(got[0], fw.UnpackedDualTensor)
    assert plain.tangent is None and constant.tangent is None
    with tfw.dual_level():
        tout = f(tfw.make_dual(torch.tensor(X), torch.tensor(TX)),
                 tfw.make_dual(torch.tensor(Y), torch.tensor(TY)), torch)
        want = [tfw.unpack_dual(o) for o in tout]
    jax_out, jax_tan = jax.jvp(lambda x, y: f(x, y, jnp), (X, Y), (TX, TY))
    for g, w, jo, jt in zip(got, want, jax_out, jax_tan):
        np.testing.assert_allclose(np.asarray(g.primal), w.primal.numpy(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(g.tangent), w.tangent.numpy(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(g.tangent), np.asarray(jt), rtol=1e-12)
    # after the level exits: (primal, None), as in torch
    after, t_after = fw.unpack_dual(out[0]), tfw.unpack_dual(tout[0])
    assert after.tangent is None and t_after.tangent is None
    np.testing.assert_allclose(np.asarray(after.primal), t_after.primal.numpy(), rtol=1e-12)
    # the escaped dual itself cannot be computed with any more
    with pytest.raises(fx.EscapedTracerError):
        out[0] * 2.0


def test_enter_exit_and_errors():
    x, t = jnp.asarray(X), jnp.asarray(TX)
    with pytest.raises(RuntimeError, match="no dual level"):
        fw.make_dual(x, t)
    with pytest.raises(RuntimeError):
        tfw.make_dual(torch.tensor(X), torch.tensor(TX))
    assert fw.unpack_dual(x).tangent is None
    level = fw.enter_dual_level()
    try:
        assert level == 0
        with pytest.raises(RuntimeError, match="shape"):
            fw.make_dual(x, jnp.ones(2))
        with pytest.raises(ValueError, match="floating point"):
            fw.make_dual(jnp.arange(3), t)
        d = fw.make_dual(x, t)
        with pytest.raises(RuntimeError, match="already is a dual"):
            fw.make_dual(d, t)
        with tfw.dual_level():  # torch refuses the same
            td = tfw.make_dual(torch.tensor(X), torch.tensor(TX))
            with pytest.raises(RuntimeError):
                tfw.make_dual(td, torch.tensor(TX))
        inner = fw.enter_dual_level()
        assert inner == 1
        with pytest.raises(RuntimeError, match="last level"):
            fw.exit_dual_level(level=0)
        fw.exit_dual_level(level=1)
        # a float32 tangent is cast to the primal's dtype
        assert fw.unpack_dual(fw.make_dual(x, t.astype(jnp.float32))).tangent.dtype == x.dtype
    finally:
        fw.exit_dual_level()
    with pytest.raises(RuntimeError, match="no dual level"):
        fw.exit_dual_level()
    assert fx.core.interpreter_stack() == []


@pytest.mark.slow
def test_nested_levels_give_second_derivatives():
    g = lambda x: fnp.sin(x) * fnp.exp(x) * x[0]  # noqa: E731
    jg = lambda x: jnp.sin(x) * jnp.exp(x) * x[0]  # noqa: E731
    x, t1, t2 = jnp.asarray(X), jnp.asarray(TX), jnp.asarray(T2)
    with fw.dual_level() as outer, fw.dual_level() as inner:
        xd = fw.make_dual(fw.make_dual(x, t2, level=outer), t1, level=inner)
        primal, tangent = fw.unpack_dual(g(xd), level=inner)
        first = fw.unpack_dual(primal, level=outer).tangent
        second = fw.unpack_dual(tangent, level=outer).tangent
        # the default level is the innermost one
        assert fw.unpack_dual(xd).tangent is t1
        with pytest.raises(RuntimeError, match="started after"):
            fw.make_dual(x, xd, level=outer)
    want_first = jax.jvp(jg, (x,), (t2,))[1]
    want_second = jax.jvp(lambda a: jax.jvp(jg, (a,), (t1,))[1], (x,), (t2,))[1]
    np.testing.assert_allclose(np.asarray(first), np.asarray(want_first), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(second), np.asarray(want_second), rtol=1e-12)


@pytest.mark.slow
def test_dual_levels_compose_with_transforms():
    g = lambda x: fnp.sin(x) * fnp.exp(x)  # noqa: E731
    jg = lambda x: jnp.sin(x) * jnp.exp(x)  # noqa: E731

    def jvp_by_duals(x, t):
        with fw.dual_level():
            return fw.unpack_dual(g(fw.make_dual(x, t))).tangent

    @jax.jit
    def run(x, t, ts):
        return {
            "jit": jvp_by_duals(x, t),
            "vmap": fx.vmap(lambda tt: jvp_by_duals(x, tt))(ts),
            "grad": fx.grad(lambda a: jvp_by_duals(a, t).sum())(x),
            "jacfwd": fx.jacfwd(lambda a: jvp_by_duals(a, t))(x),
            "fx.jit": fx.jit(jvp_by_duals)(x, t),
        }

    @jax.jit
    def oracle(x, t, ts):
        jvp = lambda a, tt: jax.jvp(jg, (a,), (tt,))[1]  # noqa: E731
        return {
            "jit": jvp(x, t),
            "vmap": jax.vmap(lambda tt: jvp(x, tt))(ts),
            "grad": jax.grad(lambda a: jvp(a, t).sum())(x),
            "jacfwd": jax.jacfwd(lambda a: jvp(a, t))(x),
            "fx.jit": jvp(x, t),
        }

    x, t = jnp.asarray(X), jnp.asarray(TX)
    ts = jnp.eye(3)
    got, want = run(x, t, ts), oracle(x, t, ts)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-12,
                                   atol=1e-14, err_msg=k)
    # a dual of a level entered outside vmap cannot be read inside it
    with fw.dual_level():
        d = fw.make_dual(x, t)
        with pytest.raises(RuntimeError, match="Enter the dual level inside vmap"):
            fx.vmap(lambda a: fw.unpack_dual(a * d).tangent)(jnp.ones((2, 3)))

    # and the decorator form works like the context manager
    @fw.dual_level()
    def decorated(a, tt):
        return fw.unpack_dual(g(fw.make_dual(a, tt))).tangent

    np.testing.assert_allclose(np.asarray(decorated(x, t)), np.asarray(want["jit"]), rtol=1e-12)
