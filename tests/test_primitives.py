"""The primitive sweep (STYLE.md "Tests"): every record of tests/op_table.py
through every composition, against JAX's own transforms of the same
function and against central finite differences in float64:

  jvp, vjp, jvp∘vjp, vjp∘vjp, jvp∘jvp, vmap∘vjp, and vmap against a Python
  loop for every batch-dimension placement of every argument.

The machinery is tests/sweep.py (shared with tests/test_public_sweep.py):
all compositions of a record run inside one `jax.jit`, and GROUP records
share one compilation (NOTE [sweep cost] there).
"""

import pytest

import jax
import jax.numpy as jnp
from jax import tree_util

import sweep
from op_table import OPS, XFAIL

GROUP = 8

_runner = sweep.GroupedRunner("test_primitive_sweep", GROUP, sweep.prepare)


# The quick subset (`pytest -m "not slow"`, the marker in pyproject.toml) runs
# a spread sample of the records, every QUICK_EVERY-th, and one record of each
# functx/primitives module that no other quick test reaches; the full suite all.
QUICK_EVERY = 100
QUICK = {"conv2d_same", "sort", "complex_holomorphic", "fft_ifft"}


def _params():
    for i, op in enumerate(OPS):
        marks = [pytest.mark.xfail(reason=XFAIL[op.name], strict=True)] if op.name in XFAIL else []
        if i % QUICK_EVERY and op.name not in QUICK:
            marks.append(pytest.mark.slow)
        yield pytest.param(op, id=op.name, marks=marks)


@pytest.mark.parametrize("op", list(_params()))
def test_primitive_sweep(op, request):
    sweep.check_results(op, _runner.results_for(op, request))


def test_table_covers_the_core_primitive_set():
    """Every primitive named by the interpreter-core issue has a record."""
    names = " ".join(op.name for op in OPS)
    for p in (
        "add sub mul div pow integer_pow max min abs sign exp log expm1 log1p sqrt rsqrt cbrt "
        "sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh logistic erf eq ne lt "
        "select_n clamp convert broadcast_in_dim reshape squeeze expand_dims transpose rev "
        "concatenate pad slice dynamic_slice dynamic_update_slice gather scatter_add "
        "matmul reduce_sum reduce_max reduce_min reduce_prod argmax argmin cumsum sort "
        "stop_gradient"
    ).split():
        assert p in names, p
    assert len(XFAIL) < 0.05 * len(OPS)


# --------------------------------------------------------------------------
# The per-record API of earlier versions, for test modules that sweep their
# own records one compilation each (e.g. tests/test_linalg.py):
#   args, tangents, cts, cts2, batched_cts, placements, vmap_inputs = _prepare(op)
#   jax.jit(lambda ...: _checks(op, args, ..., placements, vmap_inputs))
#   _compare(name, got, want, tol)

NB, EPS = sweep.NB, sweep.EPS


def _prepare(op):
    """Host inputs of every composition of `op`; vmap_inputs holds, per
    placement, (batched inputs, the loop's stacked results)."""
    case = sweep.prepare(op)
    d = case.data
    vmap_inputs = []
    for inputs, k in zip(d["batched"], case.loop_index):
        mask = case.loop_masks[k]
        rows = [op.fn(*[x if m else a for a, x, m in zip(d["args"], draw, mask)]) for draw in d["draws"]]
        vmap_inputs.append((inputs, tree_util.tree_map(lambda *xs: jnp.stack(xs), *rows)))
    return d["args"], d["tangents"], d["cts"], d["cts2"], d["batched_cts"], case.placements, vmap_inputs


def _checks(op, args, tangents, cts, cts2, batched_cts, placements, vmap_inputs):
    """Every composition for one record; returns {name: (functx, oracle)}."""
    diff = sweep.diff_indices(op, args)
    out_shape = jax.eval_shape(op.fn, *args)
    nondiff = op.nondiff or not any(
        jnp.issubdtype(s.dtype, jnp.inexact) for s in tree_util.tree_leaves(out_shape))
    data = dict(args=args, tangents=tangents, cts=cts, cts2=cts2, batched_cts=batched_cts,
                batched=[i for i, _ in vmap_inputs], loops=[lp for _, lp in vmap_inputs])
    case = sweep.Case(op, diff, nondiff, op.order, True, True, sweep.SECOND_ORDER,
                      list(placements) if op.batch else [], "loop", [], [], data)
    return sweep.checks(case, data)


_compare = sweep.compare


# --------------------------------------------------------------------------
# scatter with an update computation (NOTE [scatter with an update
# computation] in functx/primitives/indexing.py). JAX refuses its derivative,
# so the oracle is JAX's derivative of the same update written as gather,
# f and overwrite.


def _apply_cases():
    idx = jnp.array([0, 2])
    return [
        (lambda x: x.at[1].apply(jnp.sin), lambda x: x.at[1].set(jnp.sin(x[1]))),
        (lambda x: x.at[idx].apply(jnp.exp, unique_indices=True),
         lambda x: x.at[idx].set(jnp.exp(x[idx]))),
        (lambda x: x.reshape(2, 2).at[:, 1].apply(jnp.tanh, unique_indices=True),
         lambda x: x.reshape(2, 2).at[:, 1].set(jnp.tanh(x.reshape(2, 2)[:, 1]))),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(3))
def test_scatter_apply_derivatives_against_jax(case):
    import functx as fx

    f, oracle = _apply_cases()[case]
    x = jnp.array([0.3, 0.7, 1.1, 1.9])
    t = jnp.array([1.0, 2.0, 3.0, 4.0])
    lifted = fx.lift(f)
    out, tan = fx.jvp(lifted, (x,), (t,))
    want_out, want_tan = jax.jvp(oracle, (x,), (t,))
    assert jnp.allclose(out, want_out) and jnp.allclose(tan, want_tan)
    assert jnp.allclose(fx.jacrev(lifted)(x), jax.jacrev(oracle)(x))
    assert jnp.allclose(fx.jacfwd(lifted)(x), jax.jacfwd(oracle)(x))
    hess = fx.hessian(lambda x: lifted(x).sum())(x)
    assert jnp.allclose(hess, jax.hessian(lambda x: oracle(x).sum())(x))
    xs = jnp.stack([x, x + 1.0])
    per_example = fx.vmap(fx.grad(lambda x: lifted(x).sum()))(xs)
    assert jnp.allclose(per_example, jax.vmap(jax.grad(lambda x: oracle(x).sum()))(xs))


@pytest.mark.slow
def test_scatter_apply_on_functx_values():
    """`.at[i].apply` on a functx value, with a jax.numpy or functx.numpy f."""
    import functx as fx
    import functx.numpy as fnp

    x = jnp.array([0.3, 0.7, 1.1])
    for f in (jnp.sin, fnp.sin):
        g = fx.grad(lambda x: x.at[1].apply(f).sum())(x)
        assert jnp.allclose(g, jnp.array([1.0, jnp.cos(0.7), 1.0]))


@pytest.mark.slow
def test_scatter_apply_with_repeated_indices_refuses_its_derivative():
    """f is applied once per repetition (JAX: exp(exp(x))); functx refuses
    the derivative instead of returning a wrong one, and evaluation works."""
    import functx as fx

    idx = jnp.array([1, 1])
    f = fx.lift(lambda x: x.at[idx].apply(jnp.exp))
    x = jnp.array([0.3, 0.7, 1.1])
    assert jnp.allclose(fx.vmap(f)(x[None])[0], jnp.exp(jnp.exp(0.7)) * jnp.array([0, 1, 0])
                        + x * jnp.array([1, 0, 1]))
    for transform in (lambda: fx.grad(lambda x: f(x).sum())(x),
                      lambda: fx.jvp(f, (x,), (x,))):
        with pytest.raises(fx.errors.MissingRuleError, match="scatter.*unique_indices=True"):
            transform()
