"""Shape-changing primitives: broadcast_in_dim, reshape, squeeze,
transpose, rev, concatenate, stack/unstack, split, tile, pad, slice,
dynamic_slice, dynamic_update_slice, iota.

All but iota are linear in their array operands; each has its transpose rule
here. Batching moves the batch axis to the front and shifts the
primitive's axis parameters by one.
"""

import numpy as np
from jax import lax

from ..core import Aval, Zero, aval_of, bind, check_usable
from .common import (
    basis_rules,
    batch_rules,
    bdim_to_front,
    defprim,
    defzero_jvp,
    full_like,
    instantiate,
    is_linear,
    jax_keeps_weak_type,
    jvp_rules,
    moveaxis,
    scalar_like,
    shape_rules,
    transpose_rules,
)


def _linear_jvp(prim, *, n_linear=None):
    """jvp of a primitive linear in its first `n_linear` operands (all by
    default): apply it to the tangents (zeros instantiated)."""

    def rule(primals, tangents, **params):
        out = bind(prim, *primals, **params)
        k = len(primals) if n_linear is None else n_linear
        ts = tangents[:k]
        if all(type(t) is Zero for t in ts):
            if prim.multiple_results:
                return out, [Zero.of(o) for o in out]
            return out, Zero.of(out)
        ts = [instantiate(t) for t in ts]
        return out, bind(prim, *ts, *primals[k:], **params)

    jvp_rules[prim] = rule
    return rule


def _front_batch(prim, shift):
    """Batching for a unary primitive: batch axis to the front, then
    `shift(params)` adjusts the axis parameters for the extra leading axis."""

    def rule(size, vals, dims, **params):
        x = moveaxis(vals[0], dims[0], 0)
        return bind(prim, x, **shift(size, **params)), 0

    batch_rules[prim] = rule
    return rule


# --------------------------------------------------------------------------
# broadcast_in_dim

broadcast_in_dim_p = defprim("broadcast_in_dim", lax.broadcast_in_dim_p)


def broadcast_in_dim(x, shape, broadcast_dimensions):
    return bind(
        broadcast_in_dim_p, x, shape=tuple(shape),
        broadcast_dimensions=tuple(broadcast_dimensions), sharding=None,
    )


def full(shape, value, dtype, weak_type=False):
    """An array of `value` (a constant at every level), weakly typed if
    `weak_type` (NOTE [weak types in rules])."""
    if weak_type:
        from .common import scalar_constant

        return broadcast_in_dim(scalar_constant(value, dtype, True), tuple(shape), ())
    return broadcast_in_dim(np.array(value, dtype), tuple(shape), ())


def expand_dims(x, dimensions):
    a = aval_of(x)
    ndim = a.ndim + len(dimensions)
    dims = sorted(d % ndim for d in dimensions)
    shape = list(a.shape)
    for d in dims:
        shape.insert(d, 1)
    kept = tuple(i for i in range(ndim) if i not in dims)
    return broadcast_in_dim(x, tuple(shape), kept)


shape_rules[broadcast_in_dim_p] = lambda x, *dyn, shape, broadcast_dimensions, sharding: Aval(
    tuple(shape), x.dtype, x.weak_type
)
_linear_jvp(broadcast_in_dim_p)


def _broadcast_in_dim_transpose(ct, x, *dyn, shape, broadcast_dimensions, sharding):
    from .reductions import reduce_sum

    in_shape = x.aval.shape
    summed = tuple(i for i in range(len(shape)) if i not in broadcast_dimensions)
    expanded = tuple(
        d for i, d in enumerate(broadcast_dimensions) if in_shape[i] == 1 and shape[d] != 1
    )
    axes = tuple(sorted(summed + expanded))
    out = reduce_sum(ct, axes) if axes else ct
    if aval_of(out).shape != in_shape:
        out = reshape(out, in_shape)
    return [out] + [None] * len(dyn)


transpose_rules[broadcast_in_dim_p] = _broadcast_in_dim_transpose


def _broadcast_in_dim_batch(size, vals, dims, *, shape, broadcast_dimensions, sharding):
    x = moveaxis(vals[0], dims[0], 0)
    return broadcast_in_dim(
        x, (size,) + tuple(shape), (0,) + tuple(d + 1 for d in broadcast_dimensions)
    ), 0


batch_rules[broadcast_in_dim_p] = _broadcast_in_dim_batch

# --------------------------------------------------------------------------
# reshape and squeeze

reshape_p = defprim("reshape", lax.reshape_p)


def reshape(x, new_sizes):
    new_sizes = tuple(int(d) for d in new_sizes)
    if aval_of(x).shape == new_sizes:
        return check_usable(x)  # NOTE [escaped tracers]
    return bind(reshape_p, x, new_sizes=new_sizes, dimensions=None, sharding=None)


shape_rules[reshape_p] = lambda x, *dyn, new_sizes, dimensions, sharding: Aval(
    tuple(new_sizes), x.dtype, x.weak_type
)
_linear_jvp(reshape_p)
# `dimensions` (from lifted JAX code, e.g. JAX's batching of convolutions)
# permutes the operand before reshaping: reshape(transpose(x, dimensions)).


def _reshape_transpose(ct, x, *dyn, new_sizes, dimensions, sharding):
    shape = x.aval.shape
    if dimensions is None:
        return [reshape(ct, shape)] + [None] * len(dyn)
    permuted = reshape(ct, tuple(shape[d] for d in dimensions))
    return [transpose(permuted, tuple(np.argsort(dimensions)))] + [None] * len(dyn)


transpose_rules[reshape_p] = _reshape_transpose


def _reshape_batch(size, vals, dims, *, new_sizes, dimensions, sharding):
    x = moveaxis(vals[0], dims[0], 0)
    if dimensions is not None:
        x = transpose(x, (0,) + tuple(d + 1 for d in dimensions))
    return reshape(x, (size,) + tuple(new_sizes)), 0


batch_rules[reshape_p] = _reshape_batch


def _reshape_basis(size, vals, dims, bases, *, dimensions, **params):
    """A reshape keeps each element's flat position: still the identity's
    rows (NOTE [identity bases])."""
    if dimensions is not None:
        return None
    out, out_dim = _reshape_batch(size, vals, dims, dimensions=None, **params)
    return out, out_dim, bases[0]


basis_rules[reshape_p] = _reshape_basis

squeeze_p = defprim("squeeze", lax.squeeze_p)


def squeeze(x, dimensions):
    return bind(squeeze_p, x, dimensions=tuple(dimensions))


def _squeeze_shape(x, *, dimensions):
    dims = {d % x.ndim for d in dimensions}
    return Aval(tuple(s for i, s in enumerate(x.shape) if i not in dims), x.dtype, x.weak_type)


shape_rules[squeeze_p] = _squeeze_shape
_linear_jvp(squeeze_p)
transpose_rules[squeeze_p] = lambda ct, x, **p: [reshape(ct, x.aval.shape)]
def _squeeze_batch(size, vals, dims, *, dimensions):
    x, d = vals[0], dims[0]
    nd = aval_of(x).ndim - 1
    dims_ = tuple((dd % nd) + 1 for dd in dimensions)
    return squeeze(moveaxis(x, d, 0), dims_), 0


batch_rules[squeeze_p] = _squeeze_batch

# --------------------------------------------------------------------------
# transpose and rev

transpose_p = defprim("transpose", lax.transpose_p)


def transpose(x, permutation):
    permutation = tuple(permutation)
    if permutation == tuple(range(len(permutation))):
        return check_usable(x)  # NOTE [escaped tracers]
    return bind(transpose_p, x, permutation=permutation)


shape_rules[transpose_p] = lambda x, *, permutation: Aval(
    tuple(x.shape[p] for p in permutation), x.dtype, x.weak_type
)
_linear_jvp(transpose_p)
transpose_rules[transpose_p] = lambda ct, x, *, permutation: [
    transpose(ct, tuple(np.argsort(permutation)))
]


def _transpose_batch(size, vals, dims, *, permutation):
    x, d = vals[0], dims[0]
    perm = [p if p < d else p + 1 for p in permutation]
    perm.insert(d, d)  # keep the batch axis where it is
    return transpose(x, tuple(perm)), d


batch_rules[transpose_p] = _transpose_batch

rev_p = defprim("rev", lax.rev_p)


def rev(x, dimensions):
    return bind(rev_p, x, dimensions=tuple(dimensions))


shape_rules[rev_p] = lambda x, *, dimensions: x
_linear_jvp(rev_p)
transpose_rules[rev_p] = lambda ct, x, *, dimensions: [rev(ct, dimensions)]
_front_batch(rev_p, lambda size, *, dimensions: {"dimensions": tuple(d + 1 for d in dimensions)})

# --------------------------------------------------------------------------
# concatenate, stack, unstack, split, tile

concatenate_p = defprim("concatenate", lax.concatenate_p)


def concatenate(xs, dimension):
    if len(xs) == 1:
        return xs[0]
    return bind(concatenate_p, *xs, dimension=dimension)


def _concatenate_shape(*xs, dimension):
    shape = list(xs[0].shape)
    shape[dimension] = sum(x.shape[dimension] for x in xs)
    return Aval(tuple(shape), xs[0].dtype, all(x.weak_type for x in xs))


shape_rules[concatenate_p] = _concatenate_shape
_linear_jvp(concatenate_p)


def _concatenate_transpose(ct, *xs, dimension):
    out = []
    start = 0
    ct_shape = aval_of(ct).shape
    for x in xs:
        n = (x.aval if is_linear(x) else aval_of(x)).shape[dimension]
        if is_linear(x):
            lo = [0] * len(ct_shape)
            hi = list(ct_shape)
            lo[dimension] = start
            hi[dimension] = start + n
            out.append(slice(ct, lo, hi))
        else:
            out.append(None)
        start += n
    return out


transpose_rules[concatenate_p] = _concatenate_transpose


def _concatenate_batch(size, vals, dims, *, dimension):
    xs = [bdim_to_front(v, d, size) for v, d in zip(vals, dims)]
    return concatenate(xs, dimension + 1), 0


batch_rules[concatenate_p] = _concatenate_batch

stack_p = defprim("stack", lax.stack_p)


def stack(xs, axis):
    return bind(stack_p, *xs, axis=axis)


def _stack_shape(*xs, axis):
    shape = list(xs[0].shape)
    shape.insert(axis, len(xs))
    return Aval(tuple(shape), xs[0].dtype, all(x.weak_type for x in xs))


shape_rules[stack_p] = _stack_shape
_linear_jvp(stack_p)


def _stack_transpose(ct, *xs, axis):
    parts = bind(unstack_p, ct, axis=axis)
    return [p if is_linear(x) else None for p, x in zip(parts, xs)]


transpose_rules[stack_p] = _stack_transpose
batch_rules[stack_p] = lambda size, vals, dims, *, axis: (
    stack([bdim_to_front(v, d, size) for v, d in zip(vals, dims)], axis + 1), 0,
)

unstack_p = defprim("unstack", lax.unstack_p, multiple_results=True)


def _unstack_shape(x, *, axis):
    shape = x.shape[:axis] + x.shape[axis + 1:]
    return [Aval(shape, x.dtype, x.weak_type) for _ in range(x.shape[axis])]


shape_rules[unstack_p] = _unstack_shape
_linear_jvp(unstack_p)


def _unstack_transpose(cts, x, *, axis):
    cts = [instantiate(c) for c in cts]
    return [stack(cts, axis)]


transpose_rules[unstack_p] = _unstack_transpose


def _unstack_batch(size, vals, dims, *, axis):
    x = moveaxis(vals[0], dims[0], 0)
    outs = bind(unstack_p, x, axis=axis + 1)
    return outs, [0] * len(outs)


batch_rules[unstack_p] = _unstack_batch

split_p = defprim("split", lax.split_p, multiple_results=True)


def _split_shape(x, *, sizes, axis):
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = int(s)
        out.append(Aval(tuple(shape), x.dtype, x.weak_type))
    return out


shape_rules[split_p] = _split_shape
_linear_jvp(split_p)


def _split_transpose(cts, x, *, sizes, axis):
    cts = [instantiate(c) for c in cts]
    return [concatenate(cts, axis)]


transpose_rules[split_p] = _split_transpose


def _split_batch(size, vals, dims, *, sizes, axis):
    x = moveaxis(vals[0], dims[0], 0)
    outs = bind(split_p, x, sizes=sizes, axis=axis + 1)
    return outs, [0] * len(outs)


batch_rules[split_p] = _split_batch

tile_p = defprim("tile", lax.tile_p)
shape_rules[tile_p] = lambda x, *, reps: Aval(
    tuple(int(d * r) for d, r in zip(x.shape, reps)), x.dtype, x.weak_type
)
_linear_jvp(tile_p)


def _tile_transpose(ct, x, *, reps):
    from .reductions import reduce_sum

    shape = x.aval.shape
    split_shape = []
    for d, r in zip(shape, reps):
        split_shape += [r, d]
    summed = reduce_sum(reshape(ct, split_shape), tuple(range(0, 2 * len(shape), 2)))
    return [summed]


transpose_rules[tile_p] = _tile_transpose
_front_batch(tile_p, lambda size, *, reps: {"reps": (1,) + tuple(reps)})

# --------------------------------------------------------------------------
# pad

pad_p = defprim("pad", lax.pad_p)


def pad(x, padding_value, padding_config):
    return bind(pad_p, x, padding_value, padding_config=tuple(tuple(c) for c in padding_config))


def _pad_shape(x, pv, *, padding_config):
    shape = []
    for d, (lo, hi, interior) in zip(x.shape, padding_config):
        shape.append(lo + hi + d + max(d - 1, 0) * interior)
    return Aval(tuple(shape), x.dtype, x.weak_type and pv.weak_type)


shape_rules[pad_p] = _pad_shape
_linear_jvp(pad_p)


def _unpad(ct, padding_config):
    """The transpose of padding with zeros: drop the padding. (A strongly
    typed zero, as JAX's rule up to 0.12.0: the cotangent comes back strong;
    from 0.12.1 one of ct's weak type.)"""
    neg = tuple((-lo, -hi, 0) for lo, hi, _ in padding_config)
    trimmed = pad(ct, _transpose_zero(ct, _pad_probe), neg)
    shape = aval_of(trimmed).shape
    if all(i == 0 for _, _, i in padding_config):
        return trimmed
    return slice(trimmed, (0,) * len(shape), shape, tuple(i + 1 for _, _, i in padding_config))


def _transpose_zero(ct, probe):
    """The padding value of a transpose that pads `ct`: a zero of ct's weak
    type where the installed JAX's rule keeps it (`probe`, 0.12.1+), else a
    strongly typed one."""
    if jax_keeps_weak_type(probe):
        return scalar_like(ct, 0)
    return np.array(0, aval_of(ct).dtype)


def _pad_probe(x):  # for jax_keeps_weak_type: pad's transpose
    import jax

    return jax.vjp(lambda x: lax.pad(x, lax.full_like(x, 0, shape=()), ((1, -1, 0),)), x)[1](x)[0]


def _pad_transpose(ct, x, pv, *, padding_config):
    from .elementwise import sub
    from .reductions import reduce_sum

    t_x = _unpad(ct, padding_config) if is_linear(x) or is_linear(pv) else None
    t_pv = None
    if is_linear(pv):
        all_axes = tuple(range(aval_of(ct).ndim))
        t_pv = sub(reduce_sum(ct, all_axes), reduce_sum(t_x, all_axes))
    return [t_x if is_linear(x) else None, t_pv]


transpose_rules[pad_p] = _pad_transpose


def _pad_batch(size, vals, dims, *, padding_config):
    x, pv = vals
    xd, pd = dims
    config = ((0, 0, 0),) + tuple(padding_config)
    if pd is None:
        return pad(moveaxis(x, xd, 0), pv, config), 0
    # A batched padding value: pad with zeros, then select it in where a
    # mask of the operand's positions is False.
    from .elementwise import select_n

    x = bdim_to_front(x, xd, size)
    xa = aval_of(x)
    padded = pad(x, scalar_like(x, 0), config)
    mask = pad(full(xa.shape, True, bool), np.array(False), config)
    out_shape = aval_of(padded).shape
    pv = broadcast_in_dim(moveaxis(pv, pd, 0), out_shape, (0,))
    return select_n(mask, pv, padded), 0


batch_rules[pad_p] = _pad_batch

# --------------------------------------------------------------------------
# slice

slice_p = defprim("slice", lax.slice_p)


def slice(x, start_indices, limit_indices, strides=None):
    if strides is not None and all(s == 1 for s in strides):
        strides = None
    return bind(
        slice_p, x, start_indices=tuple(start_indices),
        limit_indices=tuple(limit_indices),
        strides=None if strides is None else tuple(strides),
    )


def _slice_shape(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * len(start_indices)
    shape = tuple(
        max(0, -(-(hi - lo) // s)) for lo, hi, s in zip(start_indices, limit_indices, strides)
    )
    return Aval(shape, x.dtype, x.weak_type)


shape_rules[slice_p] = _slice_shape
_linear_jvp(slice_p)


def _slice_transpose(ct, x, *, start_indices, limit_indices, strides):
    shape = x.aval.shape
    out_shape = aval_of(ct).shape
    strides = strides or (1,) * len(shape)
    config = []
    for d, lo, n, s in zip(shape, start_indices, out_shape, strides):
        used = lo + (n - 1) * s + 1 if n > 0 else lo
        config.append((lo, d - used, s - 1 if n > 0 else 0))
    # a strongly typed zero, as JAX's rule up to 0.12.0 (slices are arrays,
    # where JAX's `_const` is strong); from 0.12.1 one of ct's weak type
    # (NOTE [weak types in rules])
    if any(n == 0 for n in out_shape):
        return [full(shape, 0, x.aval.dtype)]
    return [pad(ct, _transpose_zero(ct, _slice_probe), config)]


def _slice_probe(x):  # for jax_keeps_weak_type: slice's transpose
    import jax

    return jax.vjp(lambda x: lax.slice(x, (1,), (3,)), x)[1](lax.slice(x, (0,), (2,)))[0]


transpose_rules[slice_p] = _slice_transpose
_front_batch(
    slice_p,
    lambda size, *, start_indices, limit_indices, strides: {
        "start_indices": (0,) + tuple(start_indices),
        "limit_indices": (size,) + tuple(limit_indices),
        "strides": None if strides is None else (1,) + tuple(strides),
    },
)

# --------------------------------------------------------------------------
# dynamic_slice and dynamic_update_slice

dynamic_slice_p = defprim("dynamic_slice", lax.dynamic_slice_p)


def dynamic_slice(x, start_indices, slice_sizes):
    return bind(dynamic_slice_p, x, *start_indices, slice_sizes=tuple(slice_sizes))


shape_rules[dynamic_slice_p] = lambda x, *idx, slice_sizes: Aval(
    tuple(slice_sizes), x.dtype, x.weak_type
)
_linear_jvp(dynamic_slice_p, n_linear=1)


def _dynamic_slice_transpose(ct, x, *idx, slice_sizes):
    zeros = full(x.aval.shape, 0, x.aval.dtype)
    return [dynamic_update_slice(zeros, ct, idx)] + [None] * len(idx)


transpose_rules[dynamic_slice_p] = _dynamic_slice_transpose


def _dynamic_slice_batch(size, vals, dims, *, slice_sizes):
    x, *idx = vals
    xd, *idims = dims
    if all(d is None for d in idims):
        zero = np.array(0, aval_of(idx[0]).dtype if idx else np.int32)
        return dynamic_slice(moveaxis(x, xd, 0), (zero,) + tuple(idx), (size,) + tuple(slice_sizes)), 0
    from .indexing import batched_dynamic_slice

    return batched_dynamic_slice(size, x, xd, idx, idims, slice_sizes), 0


batch_rules[dynamic_slice_p] = _dynamic_slice_batch

dynamic_update_slice_p = defprim("dynamic_update_slice", lax.dynamic_update_slice_p)


def dynamic_update_slice(x, update, start_indices):
    return bind(dynamic_update_slice_p, x, update, *start_indices)


# weak only where every operand is, the indices too (as JAX's)
shape_rules[dynamic_update_slice_p] = lambda x, u, *idx: x.update(
    weak_type=all(a.weak_type for a in (x, u) + idx))
_linear_jvp(dynamic_update_slice_p, n_linear=2)


def _dynamic_update_slice_transpose(ct, x, update, *idx):
    ua = update.aval if is_linear(update) else aval_of(update)
    t_x = t_u = None
    if is_linear(x):
        t_x = dynamic_update_slice(ct, full_like(ct, 0, ua.shape), idx)
    if is_linear(update):
        t_u = dynamic_slice(ct, idx, ua.shape)
    return [t_x, t_u] + [None] * len(idx)


transpose_rules[dynamic_update_slice_p] = _dynamic_update_slice_transpose


def _dynamic_update_slice_batch(size, vals, dims):
    x, u, *idx = vals
    xd, ud, *idims = dims
    if all(d is None for d in idims):
        zero = np.array(0, aval_of(idx[0]).dtype if idx else np.int32)
        x = bdim_to_front(x, xd, size)
        u = bdim_to_front(u, ud, size)
        return dynamic_update_slice(x, u, (zero,) + tuple(idx)), 0
    from .indexing import batched_dynamic_update_slice

    return batched_dynamic_update_slice(size, x, xd, u, ud, idx, idims), 0


batch_rules[dynamic_update_slice_p] = _dynamic_update_slice_batch

# --------------------------------------------------------------------------
# iota (no operands: never traced, zero derivative)

iota_p = defprim("iota", lax.iota_p)
shape_rules[iota_p] = lambda *, dtype, shape, dimension, sharding: Aval(tuple(shape), np.dtype(dtype), False)
defzero_jvp(iota_p)


def iota(dtype, size):
    return bind(iota_p, dtype=np.dtype(dtype), shape=(size,), dimension=0, sharding=None)
