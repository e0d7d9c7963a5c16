"""functx.autograd.gradcheck / gradgradcheck.

Properties: correct functions pass (functx.numpy code, lifted JAX code,
functx.custom_vjp with a correct rule, Python control flow), in every mode
(reverse, forward, batched, fast); a wrong custom_vjp backward is caught
with a report naming the output, the input and the worst element.
Oracle: torch.autograd.gradcheck / gradgradcheck on the same numbers and the
same (right or wrong) derivative rules must pass or fail alike.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import functx as fx
import functx.numpy as fnp
from functx.autograd import GradcheckError, gradcheck, gradgradcheck

X = np.array([0.3, -1.2, 2.0])
Y = np.array([[0.5, 1.5], [2.0, -0.7]])


def _both(x):
    return jnp.asarray(x), torch.tensor(x, requires_grad=True)


# --------------------------------------------------------------------------
# Custom rules, right and wrong, in both libraries


def _functx_sin(bwd_kind):
    @fx.custom_vjp
    def sin(a):
        return fnp.sin(a)

    def bwd(a, g):
        if bwd_kind == "right":
            return (g * fnp.cos(a),)
        if bwd_kind == "wrong":  # off by 0.5 where a > 1.5: element 2 of X
            return (g * (fnp.cos(a) + 0.5 * (a > 1.5)),)
        # right first derivative, but the residual is detached: the second
        # derivative through bwd is missing
        return (g * fnp.cos(fx.lax.stop_gradient(a)),)

    sin.defvjp(lambda a: (fnp.sin(a), a), bwd)
    return sin


def _torch_sin(bwd_kind):
    class Sin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a.sin()

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            if bwd_kind == "right":
                return g * a.cos()
            if bwd_kind == "wrong":
                return g * (a.cos() + 0.5 * (a > 1.5))
            return g * a.detach().cos()

    return Sin.apply


@pytest.mark.slow
def test_correct_functions_pass_in_every_mode():
    f = lambda a, b: (fnp.sin(a) * b.sum(), fnp.tanh(b) * a[0])  # noqa: E731
    x, y = jnp.asarray(X), jnp.asarray(Y)
    assert gradcheck(f, (x, y), check_forward_ad=True, check_batched_grad=True,
                     check_batched_forward_grad=True, check_grad_dtypes=True)
    assert gradcheck(f, (x, y), fast_mode=True, check_forward_ad=True)
    # lifted JAX code, an integer argument passed through, a list of inputs
    w = jnp.asarray(np.array([[1.0, -2.0], [0.5, 0.1], [3.0, 1.0]]))
    lifted = fx.lift(lambda a, n: jax.nn.softplus(a) ** n @ w)
    assert gradcheck(lifted, [x, 2], check_forward_ad=True)


@pytest.mark.slow
def test_python_control_flow_runs_eagerly():
    def f(a):
        if float(a.sum()) > 0:  # concrete under functx's transforms, not under jax.jit
            return fnp.sin(a) * 2.0
        return fnp.cos(a)

    assert gradcheck(f, (jnp.asarray(X),), check_forward_ad=True)
    wrong = _functx_sin("wrong")
    g = lambda a: wrong(a) if float(a.sum()) > 0 else a  # noqa: E731
    with pytest.raises(GradcheckError, match=r"d output\[2\] / d input\[2\]"):
        gradcheck(g, (jnp.asarray(X),))


@pytest.mark.slow
def test_wrong_custom_vjp_is_reported():
    x = jnp.asarray(X)
    wrong = _functx_sin("wrong")
    with pytest.raises(GradcheckError) as info:
        gradcheck(wrong, (x,))
    msg = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "mismatch for output 0 with respect to input 0" in msg
    assert "d output[2] / d input[2]" in msg
    # cos(2) = -0.416147, the wrong rule adds 0.5
    assert re.search(r"numerical -0\.41614\d*, analytical 0\.08385", msg), msg
    assert gradcheck(wrong, (x,), raise_exception=False) is False
    # fast mode reports the projection and the slow-mode worst element
    with pytest.raises(GradcheckError, match=r"(?s)fast_mode.*d output\[2\] / d input\[2\]"):
        gradcheck(wrong, (x,), fast_mode=True)
    # forward mode of a custom_vjp transposes bwd, so it is wrong too
    with pytest.raises(GradcheckError, match="computed with forward mode mismatch"):
        gradcheck(wrong, (x,), check_forward_ad=True, check_backward_ad=False)
    assert gradcheck(_functx_sin("right"), (x,), check_forward_ad=True, check_batched_grad=True)


@pytest.mark.slow
def test_pass_fail_agrees_with_torch():
    x, tx = _both(X)
    for kind in ("right", "wrong", "detached"):
        ours, theirs = _functx_sin(kind), _torch_sin(kind)
        got = gradcheck(ours, (x,), raise_exception=False)
        want = torch.autograd.gradcheck(theirs, (tx,), raise_exception=False)
        assert got == want, f"gradcheck, {kind} backward: functx {got}, torch {want}"
        got = gradgradcheck(ours, (x,), raise_exception=False)
        want = torch.autograd.gradgradcheck(theirs, (tx,), raise_exception=False)
        assert got == want, f"gradgradcheck, {kind} backward: functx {got}, torch {want}"
    # the detached residual passes gradcheck but not gradgradcheck
    assert gradcheck(_functx_sin("detached"), (x,))
    with pytest.raises(GradcheckError, match="mismatch for output 0 with respect to input 0"):
        gradgradcheck(_functx_sin("detached"), (x,))


@pytest.mark.slow
def test_gradgradcheck_of_a_two_output_function():
    f = lambda a, b: (fnp.sin(a) * (b ** 2).sum(), fnp.exp(b) * a[1])  # noqa: E731
    x, y = jnp.asarray(X), jnp.asarray(Y)
    assert gradgradcheck(f, (x, y), check_fwd_over_rev=True, check_batched_grad=True)
    assert gradgradcheck(f, (x, y), grad_outputs=(jnp.ones(3), jnp.ones((2, 2))), fast_mode=True)


def test_input_checks():
    with pytest.warns(UserWarning, match="not float64"):
        assert gradcheck(lambda a: a * 2.0, (jnp.asarray(X, jnp.float32),), eps=1e-3, atol=1e-2,
                         rtol=1e-2)
    with pytest.raises(ValueError, match="at least one floating-point"):
        gradcheck(lambda n: n * 2, (jnp.arange(3),))
    with pytest.raises(ValueError, match="check_forward_ad or check_backward_ad"):
        gradcheck(lambda a: a, (jnp.asarray(X),), check_backward_ad=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64: no warning
        assert gradcheck(lambda a: a * 2.0, (jnp.asarray(X),), check_undefined_grad=False)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.slow
def test_low_precision_inputs_agree_with_torch(dtype):
    """16-bit inputs are checked as torch checks them (after its warning):
    x * x at dyadic points with eps = 1/4 is exact, so it passes; sin at the
    default eps (a step below the dtype's resolution) fails. (bfloat16 was a
    raw ValueError: NumPy's finfo does not know it.)"""
    x = [0.5, 1.25, -1.5]
    tx = torch.tensor(x, dtype=getattr(torch, dtype), requires_grad=True)
    jx = jnp.asarray(x, getattr(jnp, dtype))
    for f, tf, kw in ((lambda a: a * a, lambda a: a * a, dict(eps=0.25, atol=1e-2, rtol=1e-2)),
                      (fnp.sin, torch.sin, {})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # both warn that the input is not float64
            want = torch.autograd.gradcheck(tf, (tx,), raise_exception=False, **kw)
            got = gradcheck(f, (jx,), raise_exception=False, **kw)
        assert got == want, (f, got, want)
    with pytest.warns(UserWarning, match="not float64"), pytest.raises(GradcheckError):
        gradcheck(fnp.sin, (jx,))
