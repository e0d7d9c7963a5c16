"""Anomaly detection: a NaN produced by a backward step raises an error that
names the forward primitive and the user line that applied it."""

import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx
import functx.numpy as fnp
from functx.autograd import (
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from functx.autograd.anomaly_mode import AnomalyError
from functx.interpreters import reverse

X0 = jnp.array([0.0, 0.5, 0.7])
HERE = os.path.basename(__file__)


def sqrt_times_zero(x):
    return (fnp.sqrt(x) * 0.0).sum()  # d/dx at 0: 0 * inf = NaN


SQRT_LINE = inspect.getsourcelines(sqrt_times_zero)[1] + 1


@pytest.mark.slow
def test_sqrt_nan_names_primitive_line_and_shape():
    g = functx.grad(sqrt_times_zero)(X0)  # off: NaN passes through, as in JAX
    assert np.isnan(g[0]) and np.isnan(jax.grad(lambda x: (jnp.sqrt(x) * 0.0).sum())(X0)[0])
    with detect_anomaly():
        with pytest.raises(AnomalyError) as info:
            functx.grad(sqrt_times_zero)(X0)
    err = info.value
    assert isinstance(err, RuntimeError) and isinstance(err, functx.FunctxError)
    msg = str(err)
    assert "`sqrt`" in msg and f"{HERE}:{SQRT_LINE}" in msg
    assert "float64[3]" in msg and "grad" in msg
    assert not is_anomaly_enabled()
    assert reverse.tape_observers == [] and reverse.backward_check is None


@pytest.mark.slow
def test_xlogx_where_pattern():
    """The classic trap: `where` selects 0 at x == 0, but the backward of
    `x * log(x)` still computes 0 * log(0) = 0 * -inf: the first NaN comes
    from the backward of `mul` (as torch reports MulBackward0)."""
    def f(x):
        return fnp.where(x > 0, x * fnp.log(x), 0.0).sum()

    line = inspect.getsourcelines(f)[1] + 1
    want = jax.grad(lambda x: jnp.where(x > 0, x * jnp.log(x), 0.0).sum())(X0)
    assert np.isnan(want[0])
    with detect_anomaly():
        with pytest.raises(RuntimeError, match=f"backward of `mul`.*{HERE}:{line}"):
            functx.grad(f)(X0)
        # The safe version: no NaN, no error, same gradient as JAX.
        def safe(x):
            xs = fnp.where(x > 0, x, 1.0)
            return fnp.where(x > 0, xs * fnp.log(xs), 0.0).sum()

        g = functx.grad(safe)(X0)
    want = jax.grad(lambda x: jnp.where(x > 0, jnp.where(x > 0, x, 1.0) * jnp.log(jnp.where(x > 0, x, 1.0)), 0.0).sum())(X0)
    np.testing.assert_allclose(g, want, rtol=1e-12)


def test_no_error_without_nan_and_inf_is_not_nan():
    with detect_anomaly():
        g = functx.grad(lambda x: fnp.sqrt(x).sum())(X0)  # inf at 0, as torch: only NaN checked
        h = functx.grad(lambda x: (fnp.sin(x) * fnp.exp(x)).sum())(X0)
    np.testing.assert_allclose(g, jax.grad(lambda x: jnp.sqrt(x).sum())(X0))
    np.testing.assert_allclose(h, jax.grad(lambda x: (jnp.sin(x) * jnp.exp(x)).sum())(X0), rtol=1e-12)
    with detect_anomaly(check_nan=False):
        assert is_anomaly_enabled() and not is_anomaly_check_nan_enabled()
        assert np.isnan(functx.grad(sqrt_times_zero)(X0)[0])


def test_set_detect_anomaly_function_context_and_decorator():
    set_detect_anomaly(True)
    try:
        assert is_anomaly_enabled()
        with pytest.raises(AnomalyError):
            functx.grad(sqrt_times_zero)(X0)
        with set_detect_anomaly(False):
            assert not is_anomaly_enabled()
            functx.grad(sqrt_times_zero)(X0)
        assert is_anomaly_enabled()
    finally:
        set_detect_anomaly(False)
    assert reverse.backward_check is None and reverse.tape_observers == []

    @detect_anomaly()
    def run():
        return functx.grad(sqrt_times_zero)(X0)

    with pytest.raises(AnomalyError):
        run()
    assert not is_anomaly_enabled()


def test_forward_outside_mode():
    _, vjp_fn = functx.vjp(sqrt_times_zero, X0)
    with detect_anomaly(), pytest.raises(AnomalyError, match="source line is unknown"):
        vjp_fn(jnp.ones(()))


@pytest.mark.slow
def test_vmap_reports_sample_index():
    xs = jnp.array([[0.5, 0.7, 0.9], [0.4, 0.0, 0.2], [1.0, 2.0, 3.0]])
    with detect_anomaly(), pytest.raises(AnomalyError, match=r"batch indices with NaN: \[1\]"):
        functx.vmap(functx.grad(sqrt_times_zero))(xs)
    with detect_anomaly(), pytest.raises(AnomalyError, match=r"batch indices with NaN: \[\(1, 0\)\]"):
        functx.vmap(functx.vmap(functx.grad(sqrt_times_zero)))(xs[:, None])


def test_under_jit_checked_when_run():
    with detect_anomaly():
        f = functx.jit(functx.grad(sqrt_times_zero))
        np.testing.assert_allclose(f(X0 + 1.0), jax.grad(lambda x: (jnp.sqrt(x) * 0.0).sum())(X0 + 1.0))
        with pytest.raises(Exception, match=f"`sqrt`.*{HERE}:{SQRT_LINE}"):
            jax.block_until_ready(f(X0))
