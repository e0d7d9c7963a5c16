"""functx.autograd.Function against torch.autograd.Function.

Oracles: the same forward/backward written in torch (outputs and grads on
the same float64 numbers; torch.func.grad / vmap over the torch Function),
JAX's own transforms of the mathematically equal function for compositions
(jvp, jacfwd, jacrev, hessian, vmap-of-grad), and functx.autograd.gradcheck
(finite differences) catching a wrong backward. Groups of compositions run
inside one `jax.jit`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import functx as fx
import functx.numpy as fnp
from functx.autograd import Function
from functx.errors import FunctxRuntimeError, FunctxTypeError, FunctxValueError

X = np.array([0.3, -0.7, 1.1])


def _close(got, want, tol=1e-10):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


# ---- the same Functions, in functx and in torch ---------------------------


class ScaledExp(Function):
    """New style, a non-array argument, ctx attribute, generate_vmap_rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, k):
        return fnp.exp(x) * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y, None


class TScaledExp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, k):
        return torch.exp(x) * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y, None


class MulOld(Function):
    """Old style forward(ctx, ...), two array inputs, an array ctx
    attribute, needs_input_grad recorded."""

    seen = []

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x)
        ctx.y = y
        return x * fnp.sin(y)

    @staticmethod
    def backward(ctx, g):
        MulOld.seen.append(ctx.needs_input_grad)
        (x,) = ctx.saved_tensors
        return g * fnp.sin(ctx.y), g * x * fnp.cos(ctx.y)


class TMulOld(torch.autograd.Function):
    seen = []

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x)
        ctx.y = y
        return x * torch.sin(y)

    @staticmethod
    def backward(ctx, g):
        TMulOld.seen.append(ctx.needs_input_grad)
        (x,) = ctx.saved_tensors
        return g * torch.sin(ctx.y), g * x * torch.cos(ctx.y)


def _two_out(lib):
    class TwoOut(lib.Function if lib is torch.autograd else Function):
        """Two outputs, the second marked non-differentiable; materialize
        off: backward sees None for the unused output."""

        seen = []

        @staticmethod
        def forward(x):
            return x * x, (x > 0) * 1.0

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.mark_non_differentiable(output[1])
            ctx.set_materialize_grads(False)

        @staticmethod
        def backward(ctx, g1, g2):
            TwoOut.seen.append((g1 is None, g2 is None))
            (x,) = ctx.saved_tensors
            return None if g1 is None else 2 * x * g1

    return TwoOut


TwoOut, TTwoOut = _two_out(None), _two_out(torch.autograd)


@pytest.mark.slow
def test_values_and_grads_match_torch():
    xt = torch.tensor(X, requires_grad=True)
    yt = torch.tensor(X[::-1].copy(), requires_grad=True)
    y = X[::-1].copy()
    _close(ScaledExp.apply(jnp.asarray(X), 2.0), TScaledExp.apply(xt, 2.0).detach())
    TScaledExp.apply(xt, 2.0).sum().backward()
    _close(fx.grad(lambda x: ScaledExp.apply(x, 2.0).sum())(jnp.asarray(X)), xt.grad)
    # torch.func over the torch Function
    tg = torch.func.grad(lambda x: TScaledExp.apply(x, 2.0).sum())(torch.tensor(X))
    tv = torch.func.vmap(torch.func.grad(lambda x: TScaledExp.apply(x, 2.0)))(torch.tensor(X))
    fg = fx.grad(lambda x: ScaledExp.apply(x, 2.0).sum())(jnp.asarray(X))
    fv = fx.vmap(fx.grad(lambda x: ScaledExp.apply(x, 2.0)))(jnp.asarray(X))
    _close(fg, tg)
    _close(fv, tv)

    MulOld.seen.clear()
    TMulOld.seen.clear()
    xt.grad = None
    TMulOld.apply(xt, yt).sum().backward()
    gx, gy = fx.grad(lambda x, y: MulOld.apply(x, y).sum(), argnums=(0, 1))(jnp.asarray(X), y)
    _close(gx, xt.grad)
    _close(gy, yt.grad)
    # only x differentiated: needs_input_grad says so, as torch's requires_grad
    yt2 = torch.tensor(y)
    xt2 = torch.tensor(X, requires_grad=True)
    TMulOld.apply(xt2, yt2).sum().backward()
    fx.grad(lambda x: MulOld.apply(x, jnp.asarray(y)).sum())(jnp.asarray(X))
    assert MulOld.seen == TMulOld.seen == [(True, True), (True, False)]


def test_non_differentiable_output_and_materialize_grads():
    TwoOut.seen.clear()
    TTwoOut.seen.clear()
    xt = torch.tensor(X, requires_grad=True)
    a, b = TTwoOut.apply(xt)
    assert not b.requires_grad
    a.sum().backward()
    f = lambda x: TwoOut.apply(x)[0].sum()  # noqa: E731
    _close(fx.grad(f)(jnp.asarray(X)), xt.grad)
    assert TwoOut.seen == TTwoOut.seen == [(False, True)]
    # the non-differentiable output has a zero derivative, even if used
    g = fx.grad(lambda x: (TwoOut.apply(x)[1] * x).sum())(jnp.asarray(X))
    _close(g, (X > 0) * 1.0)


@pytest.mark.slow
def test_compositions_against_jax():
    x = jnp.asarray(X)
    t = jnp.array([1.0, -2.0, 0.5])

    def f(x):
        return ScaledExp.apply(x, 2.0)

    def ref(x):
        return jnp.exp(x) * 2.0

    @jax.jit
    def run(x, t):
        s = lambda g: lambda x: g(x).sum()  # noqa: E731
        return {
            "jvp": (fx.jvp(f, (x,), (t,)), jax.jvp(ref, (x,), (t,))),
            "jacrev": (fx.jacrev(f)(x), jax.jacrev(ref)(x)),
            "jacfwd": (fx.jacfwd(f)(x), jax.jacfwd(ref)(x)),
            "hessian": (fx.hessian(s(f))(x), jax.hessian(s(ref))(x)),
            "grad_vmap": (fx.grad(lambda x: fx.vmap(f)(x).sum())(x), jax.grad(s(ref))(x)),
            "vmap_jacrev": (fx.vmap(fx.jacrev(f))(jnp.stack([x, t])),
                            jax.vmap(jax.jacrev(ref))(jnp.stack([x, t]))),
            "jit_grad": (fx.jit(fx.grad(s(f)))(x), jax.grad(s(ref))(x)),
            "grad_jit": (fx.grad(fx.jit(s(f)))(x), jax.grad(s(ref))(x)),
            "old_style_jacfwd": (fx.jacfwd(lambda x: MulOld.apply(x, t))(x),
                                 jax.jacfwd(lambda x: x * jnp.sin(t))(x)),
        }

    for name, (got, want) in run(x, t).items():
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10, err_msg=name)


class Cube(Function):
    """User jvp and vmap staticmethods; records which rule ran."""

    calls = []

    @staticmethod
    def forward(x):
        return x ** 3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        Cube.calls.append("backward")
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * g

    @staticmethod
    def jvp(ctx, t):
        Cube.calls.append("jvp")
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * t

    @staticmethod
    def vmap(info, in_dims, x):
        Cube.calls.append(("vmap", info.batch_size, in_dims))
        return Cube.apply(x), in_dims[0]


def test_user_jvp_and_vmap_rules():
    x = jnp.asarray(X)
    t = jnp.array([1.0, 2.0, 3.0])
    Cube.calls.clear()
    out, tan = fx.jvp(Cube.apply, (x,), (t,))
    _close(out, X ** 3)
    _close(tan, 3 * X ** 2 * np.asarray(t))
    assert Cube.calls == ["jvp"]
    Cube.calls.clear()
    _close(fx.grad(lambda x: Cube.apply(x).sum())(x), 3 * X ** 2)
    assert Cube.calls == ["backward"]
    Cube.calls.clear()
    _close(fx.vmap(Cube.apply, in_dims=1)(jnp.stack([x, t])), np.stack([X, t]).T ** 3)
    assert Cube.calls == [("vmap", 3, (1,))]
    Cube.calls.clear()
    _close(fx.grad(lambda x: fx.vmap(Cube.apply)(x).sum())(x), 3 * X ** 2)
    assert Cube.calls == [("vmap", 3, (0,)), "backward"]


class NoVmap(Function):
    @staticmethod
    def forward(x):
        return x * 2.0

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class WrongCount(NoVmap):
    @staticmethod
    def backward(ctx, g):
        return g, g


class WrongShape(NoVmap):
    @staticmethod
    def backward(ctx, g):
        return g.sum()


class NoSetup(Function):
    @staticmethod
    def forward(x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class WrongBackward(NoVmap):
    @staticmethod
    def backward(ctx, g):
        return g * 3.0


@pytest.mark.slow
def test_errors():
    x = jnp.asarray(X)
    s = lambda F: lambda x: F.apply(x).sum()  # noqa: E731
    with pytest.raises(FunctxRuntimeError, match="generate_vmap_rule") as e:
        fx.vmap(NoVmap.apply)(x)
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(FunctxValueError, match="incorrect number of gradients") as e:
        fx.grad(s(WrongCount))(x)
    assert isinstance(e.value, ValueError)
    with pytest.raises(FunctxValueError, match="shape"):
        fx.grad(s(WrongShape))(x)
    with pytest.raises(FunctxRuntimeError, match="setup_context"):
        fx.grad(s(NoSetup))(x)
    with pytest.raises(FunctxRuntimeError, match="apply"):
        fx.grad(lambda x: NoVmap.forward(x).sum())(x)
    with pytest.raises(FunctxValueError, match="different than None"):
        fx.grad(lambda x: _BadNone.apply(x, 3).sum())(x)
    # the right backward passes gradcheck, a wrong one is caught
    assert fx.autograd.gradcheck(NoVmap.apply, (x,))
    assert not fx.autograd.gradcheck(WrongBackward.apply, (x,), raise_exception=False)


class _BadNone(Function):
    @staticmethod
    def forward(ctx, x, n):
        return x * n

    @staticmethod
    def backward(ctx, g):
        return g * 3, 1.0


# ---- keyword and default arguments of apply, as torch 2.13 binds them -----


def _keyword_functions(lib):
    base, exp = (torch.autograd.Function, torch.exp) if lib is torch else (Function, fnp.exp)

    class New(base):
        generate_vmap_rule = True

        @staticmethod
        def forward(x, scale=2.0, shift=None):
            y = exp(x) * scale
            return y if shift is None else y + shift

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.n, ctx.scale = len(inputs), inputs[1]
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return (g * exp(x) * ctx.scale,) + (None,) * (ctx.n - 1)

    class Old(base):  # backward returns one gradient per argument passed
        @staticmethod
        def forward(ctx, x, scale=2.0):
            ctx.scale = scale
            ctx.save_for_backward(x)
            return exp(x) * scale

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * exp(x) * ctx.scale

    return New, Old


_KW_CALLS = [  # (class, apply's arguments after x)
    (0, (), {}), (0, (), {"scale": 3.0}), (0, (3.0,), {"shift": 1.0}), (0, (), {"shift": 0.5}),
    (1, (), {}),
]


@pytest.mark.slow
def test_keyword_and_default_arguments_match_torch():
    """apply binds keywords and defaults to forward's signature as torch
    does: setup_context sees every bound input, backward returns one gradient
    per bound input (old style: per argument passed), surplus trailing Nones
    are dropped; the same binding under grad, jit and (new style) vmap."""
    ours, theirs = _keyword_functions(fx), _keyword_functions(torch)
    x = jnp.asarray(X)
    for k, args, kwargs in _KW_CALLS:
        xt = torch.tensor(X, requires_grad=True)
        yt = theirs[k].apply(xt, *args, **kwargs)
        (gt,) = torch.autograd.grad(yt.sum(), xt)
        f = lambda x: ours[k].apply(x, *args, **kwargs)  # noqa: B023, E731
        _close(f(x), yt.detach().numpy())
        _close(fx.grad(lambda x: f(x).sum())(x), gt.numpy())
        if k == 0:  # old style has no generated vmap rule, in torch either
            _close(fx.jit(fx.vmap(fx.grad(lambda x: f(x))))(x), gt.numpy())
        else:
            _close(fx.jit(fx.grad(lambda x: f(x).sum()))(x), gt.numpy())
    # Old style with scale passed: torch counts it as an input, so one gradient is short
    for args, kwargs in (((3.0,), {}), ((), {"scale": 3.0})):
        xt = torch.tensor(X, requires_grad=True)
        with pytest.raises(RuntimeError, match="incorrect number of gradients"):
            torch.autograd.grad(theirs[1].apply(xt, *args, **kwargs).sum(), xt)
        with pytest.raises(FunctxValueError, match="incorrect number of gradients"):
            fx.grad(lambda x: ours[1].apply(x, *args, **kwargs).sum())(x)  # noqa: B023
    # arguments forward does not take: TypeError in both, naming the signature
    for args, kwargs in (((), {"bogus": 1}), ((1.0, 2.0, 3.0), {})):
        with pytest.raises(TypeError):
            theirs[0].apply(torch.tensor(X), *args, **kwargs)
        with pytest.raises(FunctxTypeError, match=r"New`.apply.*forward\(x, scale=2.0") as e:
            fx.grad(lambda x: ours[0].apply(x, *args, **kwargs).sum())(x)  # noqa: B023
        assert isinstance(e.value, TypeError)
