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


def _params():
    for op in OPS:
        marks = [pytest.mark.xfail(reason=XFAIL[op.name], strict=True)] if op.name in XFAIL else []
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
