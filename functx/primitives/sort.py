"""sort (multi-operand, as lax): the tangent follows the permutation."""

import numpy as np
from jax import lax

from ..core import Zero, aval_of, bind
from .common import batch_rules, bdim_to_front, defprim, jvp_rules, shape_rules
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
