"""gather and the scatter family: advanced indexing and `.at[...]`.

Parameters are lax's (GatherDimensionNumbers / ScatterDimensionNumbers,
index vector in the last axis of the indices). Batching uses lax's
`operand_batching_dims` / `*_indices_batching_dims`, so a batched operand
with batched indices needs no index arithmetic.
"""

import numpy as np
from jax import lax
from jax.lax import GatherDimensionNumbers, GatherScatterMode, ScatterDimensionNumbers

from ..core import Aval, Zero, aval_of, bind
from .common import (
    batch_rules,
    bdim_to_front,
    defprim,
    instantiate,
    is_linear,
    jax_params,
    jvp_rules,
    moveaxis,
    shape_rules,
    transpose_rules,
    zeros_of,
)
from . import elementwise as ew
from . import structural as st


def _plus1(dims):
    return tuple(d + 1 for d in dims)


# --------------------------------------------------------------------------
# gather

gather_p = defprim("gather", lax.gather_p)


def gather(operand, indices, dimension_numbers, slice_sizes, *, mode=GatherScatterMode.FILL_OR_DROP,
           fill_value=None, unique_indices=False, indices_are_sorted=False):
    return bind(gather_p, operand, indices, **jax_params(gather_p, _gather_probe, dict(
        dimension_numbers=dimension_numbers,
        slice_sizes=tuple(slice_sizes), unique_indices=unique_indices,
        indices_are_sorted=indices_are_sorted, mode=GatherScatterMode.from_any(mode),
        fill_value=fill_value,
    )))


def _gather_probe(prim, x):
    dn = GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    return lax.gather(x, np.zeros((1, 1), np.int32), dn, (1,))


def _gather_shape(operand, indices, *, dimension_numbers, slice_sizes, **params):
    dn = dimension_numbers
    batch_shape = iter(indices.shape[:-1])
    skipped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = iter(s for i, s in enumerate(slice_sizes) if i not in skipped)
    rank = indices.ndim - 1 + len(slice_sizes) - len(skipped)
    offset = set(dn.offset_dims)
    shape = tuple(next(window) if i in offset else next(batch_shape) for i in range(rank))
    return Aval(shape, operand.dtype, operand.weak_type)


shape_rules[gather_p] = _gather_shape


def _gather_jvp(primals, tangents, **params):
    (x, idx), (t, _) = primals, tangents
    out = bind(gather_p, x, idx, **params)
    if type(t) is Zero:
        return out, Zero.of(out)
    tparams = dict(params)
    if params["mode"] == GatherScatterMode.FILL_OR_DROP:
        tparams["fill_value"] = 0
    return out, bind(gather_p, t, idx, **tparams)


jvp_rules[gather_p] = _gather_jvp


def _gather_transpose(ct, x, idx, *, dimension_numbers, slice_sizes, unique_indices,
                      indices_are_sorted, mode, fill_value, **jax_only):
    assert is_linear(x) and not is_linear(idx)
    dn = dimension_numbers
    sdn = ScatterDimensionNumbers(
        update_window_dims=dn.offset_dims,
        inserted_window_dims=dn.collapsed_slice_dims,
        scatter_dims_to_operand_dims=dn.start_index_map,
        operand_batching_dims=dn.operand_batching_dims,
        scatter_indices_batching_dims=dn.start_indices_batching_dims,
    )
    zeros = st.full(x.aval.shape, 0, x.aval.dtype)
    out = scatter_add(zeros, idx, ct, sdn, mode=mode, unique_indices=unique_indices,
                      indices_are_sorted=indices_are_sorted)
    return [out, None]


transpose_rules[gather_p] = _gather_transpose


def _gather_batch(size, vals, dims, *, dimension_numbers, slice_sizes, **params):
    x, idx = vals
    xd, idd = dims
    dn = dimension_numbers
    if idd is None:
        # The batch axis becomes a full-size window axis placed first.
        x = moveaxis(x, xd, 0)
        new = GatherDimensionNumbers(
            offset_dims=(0,) + _plus1(dn.offset_dims),
            collapsed_slice_dims=_plus1(dn.collapsed_slice_dims),
            start_index_map=_plus1(dn.start_index_map),
            operand_batching_dims=_plus1(dn.operand_batching_dims),
            start_indices_batching_dims=dn.start_indices_batching_dims,
        )
        out = bind(gather_p, x, idx, dimension_numbers=new,
                   slice_sizes=(size,) + tuple(slice_sizes), **params)
        return out, 0
    idx = moveaxis(idx, idd, 0)
    if xd is None:
        # The batch axis is one more batch axis of the indices: the first
        # non-window axis of the output.
        new = GatherDimensionNumbers(
            offset_dims=_plus1(dn.offset_dims),
            collapsed_slice_dims=dn.collapsed_slice_dims,
            start_index_map=dn.start_index_map,
            operand_batching_dims=dn.operand_batching_dims,
            start_indices_batching_dims=_plus1(dn.start_indices_batching_dims),
        )
        out = bind(gather_p, x, idx, dimension_numbers=new, slice_sizes=slice_sizes, **params)
        return out, 0
    x = moveaxis(x, xd, 0)
    new = GatherDimensionNumbers(
        offset_dims=_plus1(dn.offset_dims),
        collapsed_slice_dims=_plus1(dn.collapsed_slice_dims),
        start_index_map=_plus1(dn.start_index_map),
        operand_batching_dims=(0,) + _plus1(dn.operand_batching_dims),
        start_indices_batching_dims=(0,) + _plus1(dn.start_indices_batching_dims),
    )
    out = bind(gather_p, x, idx, dimension_numbers=new, slice_sizes=(1,) + tuple(slice_sizes), **params)
    return out, 0


batch_rules[gather_p] = _gather_batch


def take_along_last(x, perm):
    """`x[..., perm]` elementwise along the last axis (perm has x's shape)."""
    nd = aval_of(x).ndim
    batch = tuple(range(nd - 1))
    dn = GatherDimensionNumbers(
        offset_dims=(), collapsed_slice_dims=(nd - 1,), start_index_map=(nd - 1,),
        operand_batching_dims=batch, start_indices_batching_dims=batch,
    )
    idx = st.expand_dims(perm, (nd,))
    return gather(x, idx, dn, (1,) * nd, mode=GatherScatterMode.PROMISE_IN_BOUNDS)


# --------------------------------------------------------------------------
# The scatter family

scatter_add_p = defprim("scatter-add", lax.scatter_add_p)
scatter_p = defprim("scatter", lax.scatter_p)
scatter_mul_p = defprim("scatter-mul", lax.scatter_mul_p)
scatter_min_p = defprim("scatter-min", lax.scatter_min_p)
scatter_max_p = defprim("scatter-max", lax.scatter_max_p)
scatter_sub_p = defprim("scatter-sub", lax.scatter_sub_p)

_ALL_SCATTERS = (scatter_add_p, scatter_p, scatter_mul_p, scatter_min_p, scatter_max_p, scatter_sub_p)


_COMBINERS = {}
# each scatter primitive's jax.lax function, and the dimension numbers of
# the one-element scatters `_combiner` and `_scatter_probe` trace
_LAX_SCATTERS = {scatter_add_p: lax.scatter_add, scatter_mul_p: lax.scatter_mul,
                 scatter_min_p: lax.scatter_min, scatter_max_p: lax.scatter_max,
                 scatter_sub_p: lax.scatter_sub, scatter_p: lax.scatter}
_ONE_ELEMENT = ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                       scatter_dims_to_operand_dims=(0,))


def _combiner(prim, dtype):
    """The (update_jaxpr, update_consts) parameters JAX's scatter of kind
    `prim` uses for `dtype`: how an update combines with the operand."""
    if prim is scatter_p:
        return None, ()
    key = (prim, np.dtype(dtype))
    if key not in _COMBINERS:
        import jax

        fn = _LAX_SCATTERS[prim]
        jaxpr = jax.make_jaxpr(lambda o, i, u: fn(o, i, u, _ONE_ELEMENT))(
            np.zeros((1,), dtype), np.zeros((1, 1), np.int32), np.zeros((1,), dtype)
        )
        eqn = [e for e in jaxpr.jaxpr.eqns if e.primitive is prim.jax][0]
        _COMBINERS[key] = (eqn.params["update_jaxpr"], eqn.params["update_consts"])
    return _COMBINERS[key]


def _scatter(prim, operand, indices, updates, dimension_numbers, *, mode, unique_indices=False,
             indices_are_sorted=False):
    update_jaxpr, update_consts = _combiner(prim, aval_of(operand).dtype)
    return bind(prim, operand, indices, updates, **jax_params(prim, _scatter_probe, dict(
        update_jaxpr=update_jaxpr, update_consts=update_consts,
        dimension_numbers=dimension_numbers, indices_are_sorted=indices_are_sorted,
        unique_indices=unique_indices, mode=GatherScatterMode.from_any(mode),
    )))


def _scatter_probe(prim, x):
    return _LAX_SCATTERS[prim](x, np.zeros((1, 1), np.int32), x[:1], _ONE_ELEMENT)


def scatter_add(operand, indices, updates, dimension_numbers, *, mode=GatherScatterMode.FILL_OR_DROP,
                unique_indices=False, indices_are_sorted=False):
    return _scatter(scatter_add_p, operand, indices, updates, dimension_numbers, mode=mode,
                    unique_indices=unique_indices, indices_are_sorted=indices_are_sorted)


def scatter(operand, indices, updates, dimension_numbers, *, mode=GatherScatterMode.FILL_OR_DROP,
            unique_indices=False, indices_are_sorted=False):
    return _scatter(scatter_p, operand, indices, updates, dimension_numbers, mode=mode,
                    unique_indices=unique_indices, indices_are_sorted=indices_are_sorted)


for _p in _ALL_SCATTERS:
    shape_rules[_p] = lambda operand, indices, updates, **params: operand


def _gather_dims_for(dn):
    return GatherDimensionNumbers(
        offset_dims=dn.update_window_dims,
        collapsed_slice_dims=dn.inserted_window_dims,
        start_index_map=dn.scatter_dims_to_operand_dims,
        operand_batching_dims=dn.operand_batching_dims,
        start_indices_batching_dims=dn.scatter_indices_batching_dims,
    )


def _slice_sizes_for(operand_shape, updates_shape, dn):
    skipped = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
    window = iter(updates_shape[d] for d in dn.update_window_dims)
    return tuple(1 if i in skipped else next(window) for i in range(len(operand_shape)))


def _gather_updates(ct, idx, updates_aval, dn, mode, unique_indices, indices_are_sorted):
    """The part of `ct` each update landed on (the transpose of scattering)."""
    slice_sizes = _slice_sizes_for(aval_of(ct).shape, updates_aval.shape, dn)
    fill = 0 if mode == GatherScatterMode.FILL_OR_DROP else None
    return gather(ct, idx, _gather_dims_for(dn), slice_sizes, mode=mode, fill_value=fill,
                  unique_indices=unique_indices, indices_are_sorted=indices_are_sorted)


def _zeros(aval):
    return zeros_of(aval)  # (weakly typed where aval is: NOTE [weak types in rules])


def _linear_scatter_jvp(prim):
    """scatter-add and scatter-sub are linear in the operand and the
    updates: the tangent is the same scatter of the tangents."""

    def jvp(primals, tangents, **params):
        (x, idx, u), (tx, _, tu) = primals, tangents
        out = bind(prim, x, idx, u, **params)
        if type(tx) is Zero and type(tu) is Zero:
            return out, Zero.of(out)
        return out, bind(prim, instantiate(tx), idx, instantiate(tu), **params)

    jvp_rules[prim] = jvp


_linear_scatter_jvp(scatter_add_p)


def _scatter_add_transpose(ct, x, idx, u, *, update_jaxpr, update_consts, dimension_numbers,
                           indices_are_sorted, unique_indices, mode, **jax_only):
    assert not is_linear(idx)
    t_x = ct if is_linear(x) else None
    t_u = None
    if is_linear(u):
        t_u = _gather_updates(ct, idx, u.aval, dimension_numbers, mode, unique_indices,
                              indices_are_sorted)
    return [t_x, None, t_u]


transpose_rules[scatter_add_p] = _scatter_add_transpose


def _scatter_sub_transpose(ct, x, idx, u, **params):
    t_x, _, t_u = _scatter_add_transpose(ct, x, idx, u, **params)
    return [t_x, None, None if t_u is None else ew.neg(t_u)]


_linear_scatter_jvp(scatter_sub_p)
transpose_rules[scatter_sub_p] = _scatter_sub_transpose


def _scatter_jvp(primals, tangents, *, update_jaxpr, update_consts, dimension_numbers,
                 indices_are_sorted, unique_indices, mode, **jax_only):
    """Scatter (overwrite). With unique indices the tangent is a scatter of
    tangents. Otherwise several updates may target one place and only one
    wins: find the winners by scattering update ids, then express the result
    as a scatter-add of the winning updates onto the untouched operand, so
    primal and tangent agree on the winners and the tangent is linear."""
    (x, idx, u), (tx, _, tu) = primals, tangents
    params = dict(update_jaxpr=update_jaxpr, update_consts=update_consts,
                  dimension_numbers=dimension_numbers, indices_are_sorted=indices_are_sorted,
                  unique_indices=unique_indices, mode=mode, **jax_only)
    if type(tx) is Zero and type(tu) is Zero:
        out = bind(scatter_p, x, idx, u, **params)
        return out, Zero.of(out)
    if update_jaxpr is not None:
        return _scatter_apply_jvp(x, idx, u, tx, tu, params)
    xa, ua = aval_of(x), aval_of(u)
    tx, tu = instantiate(tx), instantiate(tu)
    if unique_indices:
        return bind(scatter_p, x, idx, u, **params), bind(scatter_p, tx, idx, tu, **params)
    dn = dimension_numbers
    n_updates = 1
    for d in range(ua.ndim):
        if d not in dn.update_window_dims:
            n_updates *= ua.shape[d]
    scatter_axes = tuple(d for d in range(ua.ndim) if d not in dn.update_window_dims)
    scatter_shape = tuple(ua.shape[d] for d in scatter_axes)
    ids = st.reshape(ew.add(st.iota(np.int32, n_updates), np.array(1, np.int32)), scatter_shape)
    ids = st.broadcast_in_dim(ids, ua.shape, scatter_axes)
    placed = scatter(st.full(xa.shape, 0, np.int32), idx, ids, dn, mode=mode,
                     indices_are_sorted=indices_are_sorted)
    landed = _gather_updates(placed, idx, Aval(ua.shape, np.dtype(np.int32)), dn, mode, False,
                             indices_are_sorted)
    won = ew.eq(landed, ids)
    untouched = ew.eq(placed, np.array(0, np.int32))

    def combine(operand, updates):
        return scatter_add(ew.select_n(untouched, _zeros(xa), operand), idx,
                           ew.select_n(won, _zeros(ua), updates), dn, mode=mode,
                           indices_are_sorted=indices_are_sorted)

    return combine(x, u), combine(tx, tu)


jvp_rules[scatter_p] = _scatter_jvp


# NOTE [scatter with an update computation]
# JAX's `scatter` with a non-None `update_jaxpr` (what `x.at[i].apply(f)` and
# `lax.scatter_apply` emit) replaces each indexed element e of the operand by
# f(e, update), f being the scalar program `update_jaxpr`. With unique
# indices that is gather, f elementwise, overwrite-scatter, and so is its
# derivative: the tangent scatters f's jvp of the gathered elements over the
# operand's tangent. With repeated indices f is applied once per repetition,
# in an order XLA does not promise; functx refuses the derivative then
# (JAX refuses it always) and names the way out.

_UPDATE_GRAPHS = {}  # (update_jaxpr, consts ids, avals) -> Graph of f elementwise
_UPDATE_GRAPHS_LIMIT = 64


def _elementwise_update_graph(update_jaxpr, update_consts, elems_aval, updates_aval):
    """A functx Graph applying the scalar program `update_jaxpr` elementwise
    to arrays of the gathered elements and the updates (equal shapes)."""
    key = (update_jaxpr, tuple(map(id, update_consts)), elems_aval, updates_aval)
    graph = _UPDATE_GRAPHS.get(key)
    if graph is None:
        import jax

        from ..lifting import graph_of_jaxpr

        def f(e, u):
            return jax.core.eval_jaxpr(update_jaxpr, list(update_consts), e, u)[0]

        def elementwise(elems, updates):
            flat = jax.vmap(f)(elems.reshape(-1), updates.reshape(-1))
            return flat.reshape(elems.shape)

        jaxpr = jax.make_jaxpr(elementwise)(elems_aval.to_jax(), updates_aval.to_jax())
        graph = graph_of_jaxpr(jaxpr)
        if len(_UPDATE_GRAPHS) >= _UPDATE_GRAPHS_LIMIT:
            _UPDATE_GRAPHS.clear()
        _UPDATE_GRAPHS[key] = graph
    return graph


def _scatter_apply_jvp(x, idx, u, tx, tu, params):
    """NOTE [scatter with an update computation]."""
    from ..errors import MissingRuleError
    from ..interpreters.jvp import graph_jvp_pairs

    if not params["unique_indices"]:
        raise MissingRuleError(
            "differentiation (jvp, grad, vjp, jacrev, ...): primitive `scatter` with an update computation (x.at[idx].apply(f), "
            "lax.scatter_apply) and indices that may repeat has no derivative rule: "
            "f is applied once per repetition of an index. If the indices are unique, "
            "say so with x.at[idx].apply(f, unique_indices=True); otherwise compute "
            "the update with functx.numpy.where or .at[idx].set(f(x[idx]))."
        )
    dn, mode = params["dimension_numbers"], params["mode"]
    ua = aval_of(u)
    elems = _gather_updates(x, idx, ua.update(dtype=aval_of(x).dtype), dn, mode, True,
                            params["indices_are_sorted"])
    ea = aval_of(elems)
    updates = u
    if ua.shape != ea.shape:  # a scalar update broadcast by JAX's scatter
        updates = st.broadcast_in_dim(u, ea.shape, ())
    graph = _elementwise_update_graph(params["update_jaxpr"], params["update_consts"],
                                      Aval(ea.shape, ea.dtype), Aval(ea.shape, ua.dtype))
    t_elems = Zero.of(elems) if type(tx) is Zero else _gather_updates(
        tx, idx, ua.update(dtype=aval_of(x).dtype), dn, mode, True, params["indices_are_sorted"])
    if type(tu) is not Zero and ua.shape != ea.shape:
        tu = st.broadcast_in_dim(tu, ea.shape, ())
    nonzero = (type(t_elems) is not Zero, type(tu) is not Zero)
    live = [t for t in (t_elems, tu) if type(t) is not Zero]
    ((_, t_new),) = graph_jvp_pairs(graph, nonzero, [elems, updates, *live])
    out = bind(scatter_p, x, idx, u, **params)
    if type(t_new) is Zero:
        t_new = _zeros(ea)
    t_out = scatter(instantiate(tx) if type(tx) is not Zero else _zeros(aval_of(x)), idx,
                    t_new, dn, mode=mode, unique_indices=True,
                    indices_are_sorted=params["indices_are_sorted"])
    return out, t_out


def _scatter_transpose(ct, x, idx, u, *, update_jaxpr, update_consts, dimension_numbers,
                       indices_are_sorted, unique_indices, mode, **jax_only):
    assert unique_indices, "scatter with non-unique indices is transposed via scatter-add"
    t_x = t_u = None
    ua = u.aval if is_linear(u) else aval_of(u)
    if is_linear(x):
        t_x = scatter(ct, idx, _zeros(ua), dimension_numbers, mode=mode, unique_indices=True,
                      indices_are_sorted=indices_are_sorted)
    if is_linear(u):
        t_u = _gather_updates(ct, idx, ua, dimension_numbers, mode, True, indices_are_sorted)
    return [t_x, None, t_u]


transpose_rules[scatter_p] = _scatter_transpose


def _scatter_mul_jvp(primals, tangents, *, update_jaxpr, update_consts, dimension_numbers,
                     indices_are_sorted, unique_indices, mode, **jax_only):
    """out = x * M with M the product of the updates landing on each place:
    linear in x; in the updates only with unique indices (else a zero update
    makes the product rule ill-defined), like JAX."""
    (x, idx, u), (tx, _, tu) = primals, tangents
    params = dict(update_jaxpr=update_jaxpr, update_consts=update_consts,
                  dimension_numbers=dimension_numbers, indices_are_sorted=indices_are_sorted,
                  unique_indices=unique_indices, mode=mode, **jax_only)
    out = bind(scatter_mul_p, x, idx, u, **params)
    tangent = Zero.of(out)
    if type(tx) is not Zero:
        tangent = bind(scatter_mul_p, tx, idx, u, **params)
    if type(tu) is not Zero:
        if not unique_indices:
            from ..errors import FunctxValueError

            raise FunctxValueError(
                "scatter-mul (x.at[idx].multiply(u)): the derivative with respect to the "
                "updates u is defined here only for unique indices. Pass "
                "unique_indices=True if the indices do not repeat, or use "
                "x.at[idx].set(x[idx] * u)."
            )
        part = ew.mul(x, scatter_add(_zeros(aval_of(x)), idx, tu, dimension_numbers, mode=mode,
                                     unique_indices=True, indices_are_sorted=indices_are_sorted))
        tangent = part if type(tangent) is Zero else ew.add_any(tangent, part)
    return out, tangent


jvp_rules[scatter_mul_p] = _scatter_mul_jvp


def _scatter_mul_transpose(ct, x, idx, u, **params):
    assert is_linear(x) and not is_linear(u), "scatter-mul is linear in its operand only"
    return [bind(scatter_mul_p, ct, idx, u, **params), None, None]


transpose_rules[scatter_mul_p] = _scatter_mul_transpose


def _scatter_extremum_jvp(prim):
    """scatter-min / scatter-max: the tangent of each place is the average
    of the tangents of the values that attain the extremum there (the
    operand and any number of updates), as JAX does."""

    def rule(primals, tangents, **params):
        (x, idx, u), (tx, _, tu) = primals, tangents
        out = bind(prim, x, idx, u, **params)
        if type(tx) is Zero and type(tu) is Zero:
            return out, Zero.of(out)
        xa, ua = aval_of(x), aval_of(u)
        tx, tu = instantiate(tx), instantiate(tu)
        dn, mode = params["dimension_numbers"], params["mode"]
        landed = _gather_updates(out, idx, ua, dn, mode, False, params["indices_are_sorted"])
        u_wins = ew.convert_like(ew.eq(u, landed), xa)
        x_wins = ew.convert_like(ew.eq(x, out), xa)
        count = ew.add(x_wins, scatter_add(_zeros(xa), idx, u_wins, dn, mode=mode))
        total = ew.add_any(ew.mul(tx, x_wins),
                           scatter_add(_zeros(xa), idx, ew.mul(tu, u_wins), dn, mode=mode))
        return out, ew.div(total, count)

    jvp_rules[prim] = rule


_scatter_extremum_jvp(scatter_min_p)
_scatter_extremum_jvp(scatter_max_p)


def _scatter_batch(prim):
    def rule(size, vals, dims, *, dimension_numbers, **params):
        x, idx, u = vals
        xd, idd, ud = dims
        dn = dimension_numbers
        x = bdim_to_front(x, xd, size)
        u = bdim_to_front(u, ud, size)
        if idd is None:
            new = ScatterDimensionNumbers(
                update_window_dims=(0,) + _plus1(dn.update_window_dims),
                inserted_window_dims=_plus1(dn.inserted_window_dims),
                scatter_dims_to_operand_dims=_plus1(dn.scatter_dims_to_operand_dims),
                operand_batching_dims=_plus1(dn.operand_batching_dims),
                scatter_indices_batching_dims=dn.scatter_indices_batching_dims,
            )
        else:
            idx = moveaxis(idx, idd, 0)
            new = ScatterDimensionNumbers(
                update_window_dims=_plus1(dn.update_window_dims),
                inserted_window_dims=_plus1(dn.inserted_window_dims),
                scatter_dims_to_operand_dims=_plus1(dn.scatter_dims_to_operand_dims),
                operand_batching_dims=(0,) + _plus1(dn.operand_batching_dims),
                scatter_indices_batching_dims=(0,) + _plus1(dn.scatter_indices_batching_dims),
            )
        return bind(prim, x, idx, u, dimension_numbers=new, **params), 0

    batch_rules[prim] = rule


for _p in _ALL_SCATTERS:
    _scatter_batch(_p)

# --------------------------------------------------------------------------
# dynamic_slice / dynamic_update_slice with batched start indices


def _index_matrix(size, idx, idims):
    """Stack scalar start indices (some batched) into a (size, n) matrix."""
    cols = []
    dtype = np.result_type(*[aval_of(i).dtype for i in idx])
    for i, d in zip(idx, idims):
        i = ew.convert_element_type(i, dtype)
        cols.append(st.broadcast_in_dim(i, (size, 1), (0,) if d is not None else ()))
    return st.concatenate(cols, 1)


def batched_dynamic_slice(size, x, xd, idx, idims, slice_sizes):
    """dynamic_slice with batched start indices, as a clamping gather."""
    starts = _index_matrix(size, idx, idims)
    nd = len(slice_sizes)
    if xd is None:
        dn = GatherDimensionNumbers(
            offset_dims=tuple(range(1, nd + 1)), collapsed_slice_dims=(),
            start_index_map=tuple(range(nd)),
        )
        return gather(x, starts, dn, slice_sizes, mode=GatherScatterMode.CLIP)
    x = moveaxis(x, xd, 0)
    dn = GatherDimensionNumbers(
        offset_dims=tuple(range(1, nd + 1)), collapsed_slice_dims=(),
        start_index_map=tuple(range(1, nd + 1)), operand_batching_dims=(0,),
        start_indices_batching_dims=(0,),
    )
    return gather(x, starts, dn, (1,) + tuple(slice_sizes), mode=GatherScatterMode.CLIP)


def batched_dynamic_update_slice(size, x, xd, u, ud, idx, idims):
    """dynamic_update_slice with batched start indices, as a clamping
    scatter."""
    starts = _index_matrix(size, idx, idims)
    x = bdim_to_front(x, xd, size)
    u = bdim_to_front(u, ud, size)
    nd = aval_of(x).ndim - 1
    dn = ScatterDimensionNumbers(
        update_window_dims=tuple(range(1, nd + 1)), inserted_window_dims=(),
        scatter_dims_to_operand_dims=tuple(range(1, nd + 1)), operand_batching_dims=(0,),
        scatter_indices_batching_dims=(0,),
    )
    return scatter(x, starts, u, dn, mode=GatherScatterMode.CLIP, unique_indices=True,
                   indices_are_sorted=True)

