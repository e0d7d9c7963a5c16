"""sort (multi-operand, as lax), top_k and approx_top_k: the tangent follows
the permutation (or selection) of the operand."""

import numpy as np
from jax import lax

from ..core import Aval, Zero, aval_of, bind
from .common import batch_rules, bdim_to_front, defprim, jax_keeps_weak_type, jvp_rules, shape_rules
from . import structural as st
from .indexing import take_along_last

sort_p = defprim("sort", lax.sort_p, multiple_results=True)
shape_rules[sort_p] = lambda *operands, dimension, is_stable, num_keys: list(operands)


def _sort_jvp(primals, tangents, *, dimension, is_stable, num_keys):
    shape = aval_of(primals[0]).shape
    nd = len(shape)
    if all(type(t) is Zero for t in tangents):
        outs = bind(sort_p, *primals, dimension=dimension, is_stable=is_stable, num_keys=num_keys)
        return outs, [Zero.of(o) for o in outs]
    # Sort an iota along with the operands to learn the permutation.
    index = st.broadcast_in_dim(st.iota(np.int32, shape[dimension]), shape, (dimension,))
    *outs, perm = bind(sort_p, *primals, index, dimension=dimension, is_stable=is_stable,
                       num_keys=num_keys)
    perm_last = st.transpose(perm, _last(nd, dimension))
    back = np.argsort(_last(nd, dimension))
    out_tangents = []
    for t in tangents:
        if type(t) is Zero:
            out_tangents.append(t)
            continue
        moved = take_along_last(st.transpose(t, _last(nd, dimension)), perm_last)
        out_tangents.append(st.transpose(moved, tuple(back)))
    return outs, out_tangents


def _last(nd, dimension):
    return tuple(i for i in range(nd) if i != dimension) + (dimension,)


jvp_rules[sort_p] = _sort_jvp


def _sort_batch(size, vals, dims, *, dimension, is_stable, num_keys):
    operands = [bdim_to_front(v, d, size) for v, d in zip(vals, dims)]
    outs = bind(sort_p, *operands, dimension=dimension + 1, is_stable=is_stable, num_keys=num_keys)
    return outs, [0] * len(outs)


batch_rules[sort_p] = _sort_batch


def _take_along(x, idx, axis):
    """`x` gathered along `axis` at `idx` (idx has x's shape, but for `axis`)."""
    nd = aval_of(x).ndim
    if axis == nd - 1:
        return take_along_last(x, idx)
    order = _last(nd, axis)
    moved = take_along_last(st.transpose(x, order), st.transpose(idx, order))
    return st.transpose(moved, tuple(np.argsort(order)))


# --------------------------------------------------------------------------
# top_k: the k largest entries along `axis`, and their indices

top_k_p = defprim("top_k", lax.top_k_p, multiple_results=True)


def _top_k_shape(x, *, k, axis, **params):
    shape = list(x.shape)
    shape[axis] = k
    # the indices are as weak as the operand up to JAX 0.12.0, whose rule
    # gives every output the operand's weak type; strong from 0.12.1 (NOTE
    # [weak types in rules] in common.py)
    weak_idx = x.weak_type and jax_keeps_weak_type(_top_k_indices_probe)
    return [Aval(tuple(shape), x.dtype, x.weak_type),
            Aval(tuple(shape), np.dtype(np.int32), weak_idx)]


def _top_k_indices_probe(x):
    return lax.top_k(x, 1)[1]


shape_rules[top_k_p] = _top_k_shape


def _top_k_jvp(primals, tangents, *, k, axis, **params):  # params: jax 0.12's is_stable
    values, idx = bind(top_k_p, primals[0], k=k, axis=axis, **params)
    t = tangents[0]
    t_out = Zero.of(values) if type(t) is Zero else _take_along(t, idx, axis)
    return [values, idx], [t_out, Zero.of(idx)]


jvp_rules[top_k_p] = _top_k_jvp


def _top_k_batch(size, vals, dims, *, k, axis, **params):
    d = dims[0]
    outs = bind(top_k_p, vals[0], k=k, axis=axis + 1 if d <= axis else axis, **params)
    return outs, [d, d]


batch_rules[top_k_p] = _top_k_batch

# --------------------------------------------------------------------------
# approx_top_k (approx_max_k / approx_min_k). Its shape rule is JAX's own
# (staging.jax_shape_rule): the output size depends on the recall target
# when aggregate_to_topk is False.

approx_top_k_p = defprim("approx_top_k", lax.approx_top_k_p, multiple_results=True)


def _approx_top_k_jvp(primals, tangents, **params):
    values, idx = bind(approx_top_k_p, primals[0], **params)
    t = tangents[0]
    if type(t) is Zero:
        return [values, idx], [Zero.of(values), Zero.of(idx)]
    axis = params["reduction_dimension"] % aval_of(values).ndim
    return [values, idx], [_take_along(t, idx, axis), Zero.of(idx)]


jvp_rules[approx_top_k_p] = _approx_top_k_jvp


def _approx_top_k_batch(size, vals, dims, *, reduction_dimension, **params):
    d = dims[0]
    axis = reduction_dimension % (aval_of(vals[0]).ndim - 1)
    outs = bind(approx_top_k_p, vals[0], reduction_dimension=axis + 1 if d <= axis else axis,
                **params)
    return outs, [d, d]


batch_rules[approx_top_k_p] = _approx_top_k_batch
