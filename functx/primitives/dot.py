"""dot_general: contraction with batch dimensions (matmul, einsum, dot);
ragged_dot_general (grouped products) and scaled_dot (block-scaled).

Output layout (as lax): batch dimensions, then the lhs free dimensions,
then the rhs free dimensions, each in increasing axis order.
"""

import functools
import importlib

import jax
import numpy as np
from jax import lax
from jax._src.lax import lax as _jax_lax

from ..core import Aval, aval_of, bind
from ..lifting import call_lifted
from .common import (
    basis_rules,
    batch_rules,
    bdim_to_front,
    defjvp,
    defprim,
    is_linear,
    moveaxis,
    shape_rules,
    transpose_rules,
)
from . import structural as st
from .elementwise import convert_element_type

# (the package jax._src.lax exports a function of the module's name)
_jax_scaled_dot = importlib.import_module("jax._src.lax.scaled_dot")

dot_general_p = defprim("dot_general", lax.dot_general_p)


def dot_general(lhs, rhs, dimension_numbers, preferred_element_type=None):
    """`lax.dot_general` at the default precision. As in JAX, "default"
    is read when the product is made: `jax.default_matmul_precision`'s
    context or the `jax_default_matmul_precision` option, baked into the
    equation. XLA reads an equation's unset precision as DEFAULT (TF32 on
    GPUs) wherever it is lowered, and eager programs are compiled on the
    compile thread and run when their queue runs, outside the caller's
    context."""
    (lc, rc), (lb, rb) = dimension_numbers
    dn = ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
    return bind(
        dot_general_p, lhs, rhs, dimension_numbers=dn,
        precision=_jax_lax.canonicalize_precision(None),
        preferred_element_type=preferred_element_type, out_sharding=None,
    )


def _free(ndim, contract, batch):
    return tuple(i for i in range(ndim) if i not in contract and i not in batch)


def _dot_shape(lhs, rhs, *, dimension_numbers, precision, preferred_element_type, **params):
    (lc, rc), (lb, rb) = dimension_numbers
    shape = (
        tuple(lhs.shape[i] for i in lb)
        + tuple(lhs.shape[i] for i in _free(lhs.ndim, lc, lb))
        + tuple(rhs.shape[i] for i in _free(rhs.ndim, rc, rb))
    )
    dtype = np.dtype(preferred_element_type) if preferred_element_type is not None else lhs.dtype
    return Aval(shape, dtype, lhs.weak_type and rhs.weak_type)


shape_rules[dot_general_p] = _dot_shape
defjvp(
    dot_general_p,
    lambda t, x, y, **p: bind(dot_general_p, t, y, **p),
    lambda t, x, y, **p: bind(dot_general_p, x, t, **p),
)


def _transposed(ct, other, ct_other_axes, other_axes, batch_other, nb, n_kept, kept,
                contract, other_contract, ndim, dtype, params):
    """The cotangent of one operand: contract `ct` with `other`, then put the
    axes back in the operand's order.

    `dot(ct, other)` yields the axes: batch, the operand's free axes (`kept`,
    the ones `ct` still has), then the operand's contracted axes in the
    order of their partners' (`other_contract`) positions in `other`;
    `dot(other, ct)` yields batch, contracted, kept. The order that needs no
    transpose is chosen when there is one: for `x @ W` the weight cotangent
    is `outer(x, ct)` as it is laid out, not `outer(ct, x)` transposed (a
    copy of every per-example gradient under vmap).
    """
    order = np.argsort(other_contract)
    n_contract = len(contract)
    batch_self = params["batch_self"]

    def permutation(ct_first):
        position = {}
        for k, i in enumerate(batch_self):
            position[i] = k
        for k, i in enumerate(kept):
            position[i] = nb + (0 if ct_first else n_contract) + k
        for rank, c in enumerate(order):
            position[contract[c]] = nb + (n_kept if ct_first else 0) + rank
        return tuple(position[i] for i in range(ndim))

    ct_first = True
    perm = permutation(True)
    if perm != tuple(range(ndim)) and permutation(False) == tuple(range(ndim)):
        ct_first, perm = False, tuple(range(ndim))
    if ct_first:
        dn = ((ct_other_axes, other_axes), (tuple(range(nb)), batch_other))
        operands = (ct, other)
    else:
        dn = ((other_axes, ct_other_axes), (batch_other, tuple(range(nb))))
        operands = (other, ct)
    pet = params["preferred_element_type"]
    prod = bind(
        dot_general_p, *operands, dimension_numbers=dn, precision=params["precision"],
        preferred_element_type=None if pet is None else dtype, out_sharding=None,
    )
    return st.transpose(prod, perm)


def _dot_transpose(ct, x, y, *, dimension_numbers, **params):
    (lc, rc), (lb, rb) = dimension_numbers
    xa = x.aval if is_linear(x) else aval_of(x)
    ya = y.aval if is_linear(y) else aval_of(y)
    nb = len(lb)
    x_kept = _free(xa.ndim, lc, lb)
    y_kept = _free(ya.ndim, rc, rb)
    ct_x_axes = tuple(range(nb, nb + len(x_kept)))
    ct_y_axes = tuple(range(nb + len(x_kept), nb + len(x_kept) + len(y_kept)))
    out = [None, None]
    if is_linear(x):
        out[0] = _transposed(
            ct, y, ct_y_axes, y_kept, tuple(rb), nb, len(x_kept), x_kept, lc, rc,
            xa.ndim, xa.dtype, dict(params, batch_self=lb),
        )
    if is_linear(y):
        out[1] = _transposed(
            ct, x, ct_x_axes, x_kept, tuple(lb), nb, len(y_kept), y_kept, rc, lc,
            ya.ndim, ya.dtype, dict(params, batch_self=rb),
        )
    pet = params["preferred_element_type"]
    if pet is not None:
        # JAX casts a cotangent computed in another dtype to its operand's
        # dtype and weak type (NOTE [weak types in rules])
        for k, a in ((0, xa), (1, ya)):
            if out[k] is not None and np.dtype(pet) != a.dtype:
                out[k] = convert_element_type(out[k], a.dtype, a.weak_type)
    return out


transpose_rules[dot_general_p] = _dot_transpose


def _shift(axes):
    return tuple(a + 1 for a in axes)


def _dot_batch(size, vals, dims, *, dimension_numbers, **params):
    x, y = vals
    xd, yd = dims
    (lc, rc), (lb, rb) = dimension_numbers
    if (xd is None) != (yd is None) and _broadcast_pays(size, x, y, xd, yd, lc, rc, lb, rb):
        # Make the unbatched operand batched too (see _broadcast_pays).
        if xd is None:
            x, xd = st.broadcast_in_dim(x, (size,) + aval_of(x).shape,
                                        tuple(range(1, aval_of(x).ndim + 1))), 0
        else:
            y, yd = st.broadcast_in_dim(y, (size,) + aval_of(y).shape,
                                        tuple(range(1, aval_of(y).ndim + 1))), 0
    if xd is not None and yd is not None:
        x, y = moveaxis(x, xd, 0), moveaxis(y, yd, 0)
        dn = ((_shift(lc), _shift(rc)), ((0,) + _shift(lb), (0,) + _shift(rb)))
        return bind(dot_general_p, x, y, dimension_numbers=dn, **params), 0
    if xd is not None:
        # The batch axis becomes lhs's first free axis.
        x = moveaxis(x, xd, 0)
        dn = ((_shift(lc), rc), (_shift(lb), rb))
        return bind(dot_general_p, x, y, dimension_numbers=dn, **params), len(lb)
    y = moveaxis(y, yd, 0)
    dn = ((lc, _shift(rc)), (lb, _shift(rb)))
    n_x_free = aval_of(x).ndim - len(lc) - len(lb)
    return bind(dot_general_p, x, y, dimension_numbers=dn, **params), len(lb) + n_x_free


def _broadcast_pays(size, x, y, xd, yd, lc, rc, lb, rb):
    """With one operand batched, the batch axis can be folded into that
    operand's free axes (no copy of the other operand), but then it lands
    in the middle of the result whenever the result has leading batch or
    lhs axes before it, and XLA lays the batched operand out again and
    copies the result to move the batch axis back: that is an ensemble's
    `x @ W[model]`. Broadcasting the unbatched operand instead makes a
    batched product with the batch axis in front and no copies but the
    broadcast. Broadcast when the batch axis would not lead and the
    broadcast is smaller than what it replaces (the batched operand plus
    the result)."""
    xs, ys = aval_of(x).shape, aval_of(y).shape
    # the operands' shapes as the dimension numbers see them
    if xd is not None:
        xs = xs[:xd] + xs[xd + 1:]
    else:
        ys = ys[:yd] + ys[yd + 1:]
    n_x_free = len(xs) - len(lc) - len(lb)
    if xd is not None and not lb or xd is None and not lb and not n_x_free:
        return False  # the batch axis leads the result already
    out_size = size
    for i in range(len(xs)):
        if i not in lc:
            out_size *= xs[i]
    for i in range(len(ys)):
        if i not in rc and i not in rb:
            out_size *= ys[i]
    unbatched, batched = (np.prod(ys), np.prod(xs)) if xd is not None else (np.prod(xs), np.prod(ys))
    return size * unbatched <= size * batched + out_size


batch_rules[dot_general_p] = _dot_batch


_SMALL_PRODUCT = 1 << 22  # multiply-adds: well under a millisecond


def _dot_basis(size, vals, dims, bases, *, dimension_numbers, precision, preferred_element_type,
               **params):
    """A product with the rows of the identity (NOTE [identity bases]) that
    contracts all of the basis's axes: batch element i is the other
    operand's slice at flat position i - start of those axes, so the result
    is that operand with its contracted axes flattened into the batch axis
    (in place when they are adjacent; zero rows outside the basis's range),
    and no product is computed. `start` is an int, or a JAX integer scalar
    inside a loop under jit."""
    (lc, rc), (lb, rb) = dimension_numbers
    for k in (0, 1):
        mine, other = (lc, rc) if k == 0 else (rc, lc)
        val = aval_of(vals[k])
        ndim = val.ndim - 1
        if (bases[k] is None or dims[1 - k] is not None or lb
                or sorted(mine) != list(range(ndim))):
            continue
        y = vals[1 - k]
        ya = aval_of(y)
        partner = [other[mine.index(j)] for j in range(ndim)]
        free = [i for i in range(ya.ndim) if i not in other]
        n = int(np.prod([ya.shape[i] for i in partner], dtype=np.int64))
        in_place = partner and partner == list(range(partner[0], partner[0] + ndim))
        if (not in_place or partner[0] != 0) and size * ya.size < _SMALL_PRODUCT:
            # The batch axis would land inside y (or need a transpose): the
            # consumers then move it to the front, and XLA fuses that
            # transpose into them, re-reading y strided once per element of
            # a broadcast consumer (vmap(jacrev) of an MLP: 1.2x slower than
            # the product). A small product is cheaper than that risk.
            return None
        if in_place:
            # the contracted axes are adjacent and in order: they become the
            # batch axis where they are, with no copy of y
            at = partner[0]
            out = st.reshape(y, ya.shape[:at] + (n,) + ya.shape[at + ndim:])
        else:
            at = 0
            out = st.reshape(st.transpose(y, tuple(partner + free)),
                             (n,) + tuple(ya.shape[i] for i in free))
        start = bases[k]
        if not isinstance(start, (int, np.integer)):
            # an offset known when the program runs (a chunk of a loop
            # under jit): gather the chunk's rows, zeros out of range (no
            # padded copy of y, which would undo what chunking saves)
            from .. import numpy as fnp

            rows = fnp.arange(size, dtype=np.int32) - start.astype(np.int32)
            out = fnp.take(out, rows, axis=at, mode="fill", fill_value=0)
        elif start != 0 or n != size:
            config = [(0, 0, 0)] * aval_of(out).ndim
            config[at] = (start, size - start - n, 0)
            out = st.pad(out, np.zeros((), ya.dtype), config)
        dtype = (np.dtype(preferred_element_type) if preferred_element_type is not None
                 else aval_of(vals[0]).dtype)
        if aval_of(out).dtype != dtype:
            out = convert_element_type(out, dtype)
        return out, at, None
    return None


basis_rules[dot_general_p] = _dot_basis

# --------------------------------------------------------------------------
# ragged_dot_general (lax.ragged_dot: grouped matmuls of mixture-of-experts
# layers) and scaled_dot (a block-scaled low-precision product). Their
# layouts are intricate, so their transpose and batching are JAX's, lifted
# (NOTE [rules borrowed from JAX] in conv.py).

ragged_dot_general_p = defprim("ragged_dot_general", _jax_lax.ragged_dot_general_p)
scaled_dot_p = defprim("scaled_dot", _jax_scaled_dot.scaled_dot_p)

# bilinear in lhs and rhs; the group sizes are integers
defjvp(
    ragged_dot_general_p,
    lambda t, lhs, rhs, groups, **p: bind(ragged_dot_general_p, t, rhs, groups, **p),
    lambda t, lhs, rhs, groups, **p: bind(ragged_dot_general_p, lhs, t, groups, **p),
    None,
)


@functools.lru_cache(maxsize=256)
def _ragged_transposer(which, aval, items):
    """`(ct, other, groups) -> cotangent of operand `which`` as a JAX function."""
    params = dict(items)
    struct = jax.ShapeDtypeStruct(aval.shape, aval.dtype)

    def transpose(ct, other, groups):
        def apply(x):
            lhs, rhs = (x, other) if which == 0 else (other, x)
            return _jax_lax.ragged_dot_general_p.bind(lhs, rhs, groups, **params)

        return jax.linear_transpose(apply, struct)(ct)[0]

    return transpose


def _ragged_transpose(ct, lhs, rhs, groups, **params):
    items = tuple(sorted(params.items()))
    out = [None, None, None]
    if is_linear(lhs):
        out[0] = call_lifted(_ragged_transposer(0, lhs.aval, items), (ct, rhs, groups), {}, replay=True)
    if is_linear(rhs):
        out[1] = call_lifted(_ragged_transposer(1, rhs.aval, items), (ct, lhs, groups), {}, replay=True)
    return out


transpose_rules[ragged_dot_general_p] = _ragged_transpose


@functools.lru_cache(maxsize=256)
def _borrowed_batched(jax_prim, dims, items):
    return jax.vmap(functools.partial(jax_prim.bind, **dict(items)), in_axes=dims)


def _borrowed_batch(jax_prim, batch_all):
    """JAX's batching of `jax_prim`, lifted, with the batch axes in front;
    `batch_all`: every operand batched (JAX batches ragged_dot_general only
    so: with one operand unbatched it raises NotImplementedError)."""

    def rule(size, vals, dims, **params):
        if batch_all:
            vals = tuple(bdim_to_front(v, d, size) for v, d in zip(vals, dims))
            dims = (0,) * len(vals)
        else:
            vals = tuple(v if d is None else moveaxis(v, d, 0) for v, d in zip(vals, dims))
            dims = tuple(None if d is None else 0 for d in dims)
        fn = _borrowed_batched(jax_prim, dims, tuple(sorted(params.items())))
        return call_lifted(fn, vals, {}, replay=True), 0

    return rule


batch_rules[ragged_dot_general_p] = _borrowed_batch(_jax_lax.ragged_dot_general_p, True)
batch_rules[scaled_dot_p] = _borrowed_batch(_jax_scaled_dot.scaled_dot_p, False)
