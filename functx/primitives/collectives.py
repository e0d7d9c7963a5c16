"""Collectives over named vmap axes: psum, pmax, pmin, axis_index,
all_gather, psum_scatter (reduce_scatter), ppermute, all_to_all; pmean and
axis_size are built from them. Each is the functx twin of the JAX primitive of the
same name with the same parameters, so `jax.lax.psum(x, 'batch')` on functx
values (JAX code such as Equinox's BatchNorm) binds it (NOTE [JAX on functx
values] in functx/interop.py).

NOTE [named axes]
`functx.vmap(f, axis_name='batch')` gives its BatchInterpreter the name
`'batch'`. A collective names axes in its parameters, and its result
depends on the vmap of that name even when its operand is not batched
there (`psum(1.0, 'batch')` is the batch size): so `core.bind` asks the
primitive (`axis_interpreter`) which interpreter must process it, which is
the highest of the interpreters its operands belong to and the innermost
live BatchInterpreter of each name it uses (`named_interpreter`). Those
interpreters process it with the rules of `collective_rules` in
interpreters/batching.py, which are given the interpreter:

* on its own axis the rule reduces over the batch dimension (an operand
  not batched there counts as the same value in every batch element) and
  binds the collective again with the remaining names, if any;
* a collective over another name passes through unchanged, keeping the
  batch dimension: it acts elementwise along this axis.

Interpreters above (jvp, reverse, staging, an inner vmap of another name)
see an ordinary primitive: jvp and transpose rules as JAX's (psum's
transpose is psum of the cotangent: psum is treated as psum followed by a
broadcast; all_gather and psum_scatter transpose into each other, ppermute
into the inverse permutation). A rule of a named vmap that batches a
staged graph (jit, control flow, custom rules) passes the name on to the
BatchInterpreter it makes, so the collectives inside the graph see it.

An unbound name (no enclosing functx.vmap of that name) raises
UnboundAxisNameError (a FunctxError and a NameError). With no functx
value among the operands and some JAX tracer, the collective is left to
JAX (functx.lax.psum inside `jax.vmap(axis_name=...)`).

Nothing compiled or cached may hold a result fixed to one vmap's size:
* the axis names in a collective's parameters are `AxisNames`, a tuple
  that is not hashable, so the eager caches (fused steps, compiled
  backward passes, batched steps) take their uncached path for it;
* a collective none of whose operands belongs to the named vmap (or
  above) is recorded by a staging interpreter above that vmap if there is
  one (functx.jit, a control-flow body, a staged jvp): its graph is
  batched later with the name, never computed for the first size met;
* met while JAX stages a program begun inside the vmap with no batched
  operand (a jax.jit function or a loop body called on unbatched values,
  functx.jit's compiled graph), it is left to JAX, which records its own
  collective: the JAX equation holding that program is translated to
  functx's when bound at the vmap's level (NOTE [JAX collectives on
  functx values] in functx/interop.py), and the vmap batches it;
* a primitive applying staged graphs whose collectives name a live vmap's
  axis (GraphCallPrimitive: jit_call, cond, scan, while, checkpoint and
  custom calls) is processed by that vmap even when none of its operands
  is batched there, as JAX batches a jit whose program uses the axis;
* pmean divides by a psum of one, not by a Python int, and functx.jit's
  staged graphs are keyed on the live named axes' sizes (`live_axes`):
  axis_size is a Python int in a graph.

Under `vmap(chunk_size=k, axis_name=...)` each chunk's interpreter knows
its first index and the whole batch's size (AxisInfo.chunk in
interpreters/batching.py): axis_index, axis_size and the reductions of
values not batched along the axis are defined; the other collectives
raise ChunkedCollectiveError.
"""

import threading

import numpy as np
from jax._src.lax import parallel as _par

from jax._src.core import trace_ctx as _jax_trace_ctx

from ..core import Aval, Primitive, Zero, aval_of, bind, interpreter_stack
from ..core import _JaxTracer
from ..errors import ChunkedCollectiveError, FunctxValueError, UnboundAxisNameError
from ..interpreters.batching import BatchInterpreter, collective_rules, named_interpreter
from ..interpreters.eval import defimpl
from ..interpreters.staging import StagingInterpreter, _graphs

try:
    from jax._src.interpreters.partial_eval import DynamicJaxprTrace as _JaxprTrace
except ImportError:  # another JAX layout: every newer JAX trace counts
    _JaxprTrace = object
from .common import (
    defjvp,
    defzero_jvp,
    jvp_rules,
    moveaxis,
    scalar_like,
    shape_rules,
    transpose_rules,
)
from . import elementwise as ew
from . import reductions as red
from . import structural as st


def _names(axis_name):
    """The names of an `axis_name` parameter (a name or a tuple of names),
    positional (int) axes left out."""
    names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
    return tuple(n for n in names if not isinstance(n, (int, np.integer)))


def _describe_stack():
    parts = []
    for interp in interpreter_stack():
        if isinstance(interp, BatchInterpreter) and interp.axis_name is not None:
            parts.append(f"{interp.transform}(axis_name={interp.axis_name!r})")
        else:
            parts.append(interp.transform)
    return " > ".join(parts) if parts else "none"


def unbound_error(api, name):
    return UnboundAxisNameError(
        f"functx.lax.{api}: axis name {name!r} is not bound: no enclosing functx.vmap "
        f"has axis_name={name!r} (enclosing transforms, outermost first: "
        f"{_describe_stack()}). Pass axis_name={name!r} to the functx.vmap whose batch "
        f"axis this collective reduces over, e.g. functx.vmap(f, axis_name={name!r})."
    )


class AxisNames(tuple):
    """The axis names of a collective's parameters: a tuple that is not
    hashable, so functx's eager caches (fused steps, compiled backward
    passes, batched steps: NOTE [eager reverse mode in few dispatches])
    never compile a collective into a program, where its result would be
    fixed to the axis size of the vmap it was first met under (they take
    their uncached path for unhashable parameters)."""

    __slots__ = ()
    __hash__ = None


class CollectivePrimitive(Primitive):
    """A primitive naming vmap axes in its parameter `axis_param`
    (NOTE [named axes])."""

    __slots__ = ("axis_param", "api")
    binds_axis_names = True

    def __init__(self, name, jax_primitive, axis_param, api):
        super().__init__(name, jax_primitive)
        self.axis_param = axis_param
        self.api = api

    def axis_interpreter(self, top, args, params):
        value = params[self.axis_param]
        names = _names(value)
        bound = False
        for name in names:
            if named_interpreter(name) is not None:
                bound = True
            elif not (top is None and any(isinstance(a, _JaxTracer) for a in args)):
                raise unbound_error(self.api, name)
            # else: a JAX trace's axis (jax.vmap): JAX decides
        if bound and type(value) is not AxisNames:  # never cached (AxisNames)
            params[self.axis_param] = AxisNames(
                value if isinstance(value, (tuple, list)) else (value,))
        return interpreter_for_names(names, top)


def interpreter_for_names(names, top):
    """The interpreter that must process a primitive naming the vmap axes
    `names` (a collective, or a call of a graph holding collectives), given
    `top`, the highest interpreter of its operands (NOTE [named axes])."""
    forced = None
    for name in names:
        interp = named_interpreter(name)
        if interp is not None and (top is None or interp.level > top.level):
            top = forced = interp
    if forced is None:
        return top
    # No operand belongs to the named vmap or above. A staging interpreter
    # above it (functx.jit, a control-flow body, a staged jvp) records the
    # primitive: its graph, maybe cached, must not hold a result fixed to
    # this vmap's size.
    for interp in reversed(interpreter_stack()):
        if interp.level <= forced.level:
            break
        if isinstance(interp, StagingInterpreter):
            return interp
    cur = _jax_trace_ctx.trace
    if forced.jax_trace is not cur and isinstance(cur, _JaxprTrace):
        # JAX stages a program begun inside the vmap (a jax.jit function,
        # a jax.lax loop body, functx.jit's compiled graph) and none of the
        # operands is batched by it: JAX records its own collective (the
        # vmap put its name in JAX's axis environment; values of functx
        # transforms outside the vmap become constants of JAX's program),
        # and the JAX equation holding that program is translated to
        # functx when it is bound at the vmap's level (NOTE [JAX
        # collectives on functx values] in functx/interop.py), where the
        # vmap batches it.
        return None
    return top


def _graph_names(graph):
    """The vmap axis names the collectives of `graph` (and of the graphs its
    equations hold) name; cached on the graph."""
    names = graph.cache.get("axis names")
    if names is None:
        found = set()
        for eqn in graph.eqns:
            prim = eqn.prim
            if type(prim) is CollectivePrimitive:
                found.update(_names(eqn.params[prim.axis_param]))
            elif prim.binds_axis_names:
                found.update(names_in_params(eqn.params))
        names = graph.cache["axis names"] = frozenset(found)
    return names


def names_in_params(params):
    """The vmap axis names the collectives of the graphs among `params`
    name (a frozenset, usually empty)."""
    names = None
    for v in params.values():
        for g in _graphs(v):
            found = _graph_names(g)
            if found:
                names = found if names is None else names | found
    return names or frozenset()


class GraphCallPrimitive(Primitive):
    """A primitive applying staged graphs (jit_call, checkpoint_call, cond,
    scan, while, custom rules). When a graph holds a collective over the
    axis of a live named vmap, that vmap processes the primitive even when
    none of its operands is batched there (NOTE [named axes]), as JAX
    batches a jit whose program uses the vmap's axis; otherwise it is an
    ordinary primitive (one cached lookup per bind under a transform)."""

    __slots__ = ()
    binds_axis_names = True

    def axis_interpreter(self, top, args, params):
        if not LIVE_NAMED[0]:  # no named vmap runs: nothing to look up
            return top
        names = names_in_params(params)
        if not names:
            return top
        return interpreter_for_names(names, top)


# How many named functx.vmaps run now (all threads; guarded by _LIVE_LOCK):
# while none does, JAX's binds skip the check of NOTE [JAX collectives on
# functx values] (functx/interop.py). transforms/vmap.py counts them.
LIVE_NAMED = [0]
_LIVE_LOCK = threading.Lock()


def named_vmap_running(delta):
    with _LIVE_LOCK:
        LIVE_NAMED[0] += delta


def live_axes():
    """(name, size) of the live named vmaps of this thread, innermost last:
    part of the key of what is staged once and replayed under them
    (functx.jit's graphs), since axis_size is a Python int there."""
    return tuple((i.axis_name, i.axis_size) for i in interpreter_stack()
                 if type(i) is BatchInterpreter and i.axis_name is not None)


def full_size(interp):
    """The size of the named axis `interp` batches: its own, or that of the
    whole batch when it batches a chunk (vmap(chunk_size=, axis_name=))."""
    chunk = interp.axis.chunk
    return interp.axis_size if chunk is None else chunk[1]


def _chunked_error(api, interp):
    size = interp.axis.chunk[1]
    return ChunkedCollectiveError(
        f"functx.lax.{api} over the axis {interp.axis_name!r} of a functx.vmap with "
        f"chunk_size smaller than its batch of {size}: a chunk holds only some of the "
        "batch, and this collective combines values that differ across the batch. Drop "
        "chunk_size (or make it at least the batch size) for this "
        "function; under chunking only axis_index, axis_size, and psum / pmean / pmax / "
        "pmin of values the same in every element are defined."
    )


def _collective(name, jax_prim, axis_param, api):
    p = CollectivePrimitive(name, jax_prim, axis_param, api)

    def impl(*args, **params):  # JAX's collective, for an axis of a JAX trace
        value = params[axis_param]
        if type(value) is AxisNames:
            params[axis_param] = tuple(value)
        return jax_prim.bind(*args, **params)

    defimpl(p, impl)
    return p


def _check_groups(api, axis_index_groups):
    if axis_index_groups is not None:
        raise FunctxValueError(
            f"functx.lax.{api}: axis_index_groups is not supported under functx.vmap "
            "(nor under jax.vmap). Drop it, or reduce over a reshaped axis with two "
            "named vmaps."
        )


def _rest(names, mine):
    return tuple(n for n in names if n != mine)


# --------------------------------------------------------------------------
# psum, pmax, pmin: params `axes` (names) and `axis_index_groups`, as JAX's

psum_p = _collective("psum", _par.psum_p, "axes", "psum")
pmax_p = _collective("pmax", _par.pmax_p, "axes", "pmax")
pmin_p = _collective("pmin", _par.pmin_p, "axes", "pmin")


def _allreduce_shape(x, *, axes, axis_index_groups):
    pos = tuple(a for a in axes if isinstance(a, (int, np.integer)))
    if pos:
        return Aval(tuple(d for i, d in enumerate(x.shape) if i not in pos), x.dtype,
                    x.weak_type)
    return x


for _p in (psum_p, pmax_p, pmin_p):
    shape_rules[_p] = _allreduce_shape


def _positional(prim, x, d, axes, axis_index_groups):
    """Reduce the positional (int) axes of `axes` first; returns the value,
    its batch dim and the named axes left."""
    pos = tuple(a for a in axes if isinstance(a, (int, np.integer)))
    if not pos:
        return x, d, axes
    nd = aval_of(x).ndim - (d is not None)
    pos = tuple(a % nd for a in pos)
    phys = pos if d is None else tuple(a if a < d else a + 1 for a in pos)
    reducer = {psum_p: red.reduce_sum, pmax_p: red.reduce_max, pmin_p: red.reduce_min}[prim]
    x = reducer(x, phys)
    if d is not None:
        d -= sum(1 for a in pos if a < d)
    return x, d, tuple(a for a in axes if not isinstance(a, (int, np.integer)))




def _allreduce_rule(prim):
    def rule(interp, vals, dims, *, axes, axis_index_groups):
        (x,), (d,) = vals, dims
        name = interp.axis_name
        x, d, axes = _positional(prim, x, d, axes, axis_index_groups)
        if name not in axes:  # another vmap's axis: elementwise along this one
            out = bind(prim, x, axes=axes, axis_index_groups=axis_index_groups) if axes else x
            return out, d
        _check_groups(prim.name, axis_index_groups)
        if d is None:  # the same value in every batch element
            out = ew.mul(x, scalar_like(x, full_size(interp))) if prim is psum_p else x
        elif interp.axis.chunk is not None:
            raise _chunked_error(prim.name, interp)
        elif prim is psum_p:
            out = red.reduce_sum(x, (d,))
        elif prim is pmax_p:
            out = red.reduce_max(x, (d,))
        else:
            out = red.reduce_min(x, (d,))
        rest = _rest(axes, name)
        if rest:
            out = bind(prim, out, axes=rest, axis_index_groups=None)
        return out, None

    collective_rules[prim] = rule


for _p in (psum_p, pmax_p, pmin_p):
    _allreduce_rule(_p)

defjvp(psum_p, lambda t, x, **p: bind(psum_p, t, **p))


def _psum_transpose(ct, x, *, axes, axis_index_groups):
    if type(ct) is Zero:
        return [Zero(x.aval)]
    pos = tuple(a for a in axes if isinstance(a, (int, np.integer)))
    named = tuple(a for a in axes if not isinstance(a, (int, np.integer)))
    if pos:
        shape = x.aval.shape
        pos = tuple(a % len(shape) for a in pos)
        ct = st.broadcast_in_dim(ct, shape, tuple(i for i in range(len(shape)) if i not in pos))
    # psum is psum followed by a broadcast: its transpose sums again (JAX's)
    return [bind(psum_p, ct, axes=named, axis_index_groups=axis_index_groups) if named else ct]


transpose_rules[psum_p] = _psum_transpose


def _pextremum_jvp(prim):
    """The tangent of pmax / pmin: the mean of the tangents of the batch
    elements that attain the extremum (as reduce_max's; JAX has no rule)."""

    def rule(primals, tangents, *, axes, axis_index_groups):
        (x,), (t,) = primals, tangents
        out = bind(prim, x, axes=axes, axis_index_groups=axis_index_groups)
        if type(t) is Zero:
            return out, Zero.of(out)
        if any(isinstance(a, (int, np.integer)) for a in axes):
            raise FunctxValueError(
                f"functx.lax.{prim.name}: the derivative over positional axes is not "
                "supported; reduce them with functx.numpy.max / min first.")
        dtype = aval_of(x).dtype
        mask = ew.convert_element_type(ew.eq(x, out), dtype)
        kw = dict(axes=axes, axis_index_groups=axis_index_groups)
        return out, ew.div(bind(psum_p, ew.mul(t, mask), **kw), bind(psum_p, mask, **kw))

    jvp_rules[prim] = rule


_pextremum_jvp(pmax_p)
_pextremum_jvp(pmin_p)

# --------------------------------------------------------------------------
# axis_index: no operand; param `axis_name` (one name here)

axis_index_p = _collective("axis_index", _par.axis_index_p, "axis_name", "axis_index")
shape_rules[axis_index_p] = lambda *, axis_name: Aval((), np.dtype(np.int32), False)
defzero_jvp(axis_index_p)


def _axis_index_rule(interp, vals, dims, *, axis_name):
    names = _names(axis_name)
    if interp.axis_name not in names:
        return bind(axis_index_p, axis_name=axis_name), None
    if len(names) > 1:  # row-major index over several axes
        return _multi_axis_index(names), None
    index = st.iota(np.dtype(np.int32), interp.axis_size)
    if interp.axis.chunk is not None and interp.axis.chunk[0]:
        index = ew.add(index, scalar_like(index, interp.axis.chunk[0]))
    return index, 0


def _multi_axis_index(names):
    index = None
    for n in names:
        i = bind(axis_index_p, axis_name=n)
        if index is None:
            index = i
        else:
            size = axis_size(n)
            index = ew.add(ew.mul(index, scalar_like(index, size)), i)
    return index


collective_rules[axis_index_p] = _axis_index_rule

# --------------------------------------------------------------------------
# all_gather and psum_scatter (reduce_scatter): params as JAX's


all_gather_p = _collective("all_gather", _par.all_gather_p, "axis_name", "all_gather")
reduce_scatter_p = _collective("reduce_scatter", _par.reduce_scatter_p, "axis_name",
                               "psum_scatter")


def _all_gather_shape(x, *, all_gather_dimension, axis_name, axis_index_groups, axis_size,
                      tiled):
    shape = list(x.shape)
    if tiled:
        shape[all_gather_dimension] *= axis_size
    else:
        shape.insert(all_gather_dimension, axis_size)
    return Aval(tuple(shape), x.dtype, x.weak_type)


def _reduce_scatter_shape(x, *, scatter_dimension, axis_name, axis_index_groups, axis_size,
                          tiled):
    shape = list(x.shape)
    if tiled:
        if shape[scatter_dimension] % axis_size:
            raise FunctxValueError(
                f"functx.lax.psum_scatter: dimension {scatter_dimension} of size "
                f"{shape[scatter_dimension]} does not split into {axis_size} equal tiles. "
                "Pad it to a multiple of the axis size.")
        shape[scatter_dimension] //= axis_size
    else:
        if shape[scatter_dimension] != axis_size:
            raise FunctxValueError(
                f"functx.lax.psum_scatter: dimension {scatter_dimension} has size "
                f"{shape[scatter_dimension]}, not the axis size {axis_size}. Use tiled=True "
                "to split a multiple of the axis size.")
        del shape[scatter_dimension]
    return Aval(tuple(shape), x.dtype, x.weak_type)


shape_rules[all_gather_p] = _all_gather_shape
shape_rules[reduce_scatter_p] = _reduce_scatter_shape


def _single_name(api, names, mine):
    if len(names) > 1:
        raise FunctxValueError(
            f"functx.lax.{api} over several axes {names!r} is not supported under "
            "functx.vmap (nor under jax.vmap). Name one axis.")


def _whole_axis(api, interp, names, axis_index_groups=None):
    """What a collective that moves data across this vmap's axis requires:
    no index groups, one axis name, and the whole batch (not one chunk)."""
    _check_groups(api, axis_index_groups)
    _single_name(api, names, interp.axis_name)
    if interp.axis.chunk is not None:
        raise _chunked_error(api, interp)


def _past_other_axis(prim, dim_param, dim, x, d, params):
    """The batching of an all_gather / psum_scatter over another vmap's
    axis: bind it again with the operand's batch axis `d` kept, its own
    axis parameter `dim_param` shifted past that batch axis."""
    if d is None:
        return bind(prim, x, **{dim_param: dim}, **params), None
    if d <= dim:
        dim += 1
    elif not params["tiled"]:
        d += 1
    return bind(prim, x, **{dim_param: dim}, **params), d


def _all_gather_rule(interp, vals, dims, *, all_gather_dimension, axis_name,
                     axis_index_groups, axis_size, tiled):
    (x,), (d,) = vals, dims
    names = _names(axis_name)
    params = dict(axis_name=axis_name, axis_index_groups=axis_index_groups,
                  axis_size=axis_size, tiled=tiled)
    if interp.axis_name not in names:  # another axis: keep this batch dim
        return _past_other_axis(all_gather_p, "all_gather_dimension", all_gather_dimension,
                                x, d, params)
    _whole_axis("all_gather", interp, names, axis_index_groups)
    n = interp.axis_size
    if d is None:
        shape = list(aval_of(x).shape)
        shape.insert(all_gather_dimension, n)
        kept = tuple(i for i in range(len(shape)) if i != all_gather_dimension)
        y = st.broadcast_in_dim(x, tuple(shape), kept)
    else:
        y = moveaxis(x, d, all_gather_dimension)
    if tiled:  # merge the gathered axis into the next one
        shape = list(aval_of(y).shape)
        k = all_gather_dimension
        shape[k:k + 2] = [shape[k] * shape[k + 1]]
        y = st.reshape(y, tuple(shape))
    return y, None


def _reduce_scatter_rule(interp, vals, dims, *, scatter_dimension, axis_name,
                         axis_index_groups, axis_size, tiled):
    (x,), (d,) = vals, dims
    names = _names(axis_name)
    params = dict(axis_name=axis_name, axis_index_groups=axis_index_groups,
                  axis_size=axis_size, tiled=tiled)
    if interp.axis_name not in names:
        return _past_other_axis(reduce_scatter_p, "scatter_dimension", scatter_dimension,
                                x, d, params)
    _whole_axis("psum_scatter", interp, names, axis_index_groups)
    n = interp.axis_size
    if d is None:
        y = ew.mul(x, scalar_like(x, n))
    else:
        y = red.reduce_sum(x, (d,))
    k = scatter_dimension
    if tiled:  # split the scattered axis into (batch, tile)
        shape = list(aval_of(y).shape)
        shape[k:k + 1] = [n, shape[k] // n]
        y = st.reshape(y, tuple(shape))
    return y, k


collective_rules[all_gather_p] = _all_gather_rule
collective_rules[reduce_scatter_p] = _reduce_scatter_rule
defjvp(all_gather_p, lambda t, x, **p: bind(all_gather_p, t, **p))
defjvp(reduce_scatter_p, lambda t, x, **p: bind(reduce_scatter_p, t, **p))


def _transpose_into(other, other_dim, own_dim):
    """all_gather and psum_scatter transpose into each other, the one's axis
    parameter (`own_dim`) becoming the other's (`other_dim`)."""

    def transpose(ct, x, **params):
        if type(ct) is Zero:
            return [Zero(x.aval)]
        dim = params.pop(own_dim)
        return [bind(other, ct, **{other_dim: dim}, **params)]

    return transpose


_all_gather_transpose = _transpose_into(reduce_scatter_p, "scatter_dimension",
                                        "all_gather_dimension")
_reduce_scatter_transpose = _transpose_into(all_gather_p, "all_gather_dimension",
                                            "scatter_dimension")


transpose_rules[all_gather_p] = _all_gather_transpose
transpose_rules[reduce_scatter_p] = _reduce_scatter_transpose

# --------------------------------------------------------------------------
# ppermute: params `axis_name`, `perm` (pairs (source, destination))

ppermute_p = _collective("ppermute", _par.ppermute_p, "axis_name", "ppermute")
shape_rules[ppermute_p] = lambda x, *, axis_name, perm: x


def _ppermute_rule(interp, vals, dims, *, axis_name, perm):
    (x,), (d,) = vals, dims
    names = _names(axis_name)
    if interp.axis_name not in names:
        return bind(ppermute_p, x, axis_name=axis_name, perm=perm), d
    _whole_axis("ppermute", interp, names)
    n = interp.axis_size
    source = {dst: src for src, dst in perm}
    if d is None:
        shape = aval_of(x).shape
        x = st.broadcast_in_dim(x, (n,) + tuple(shape), tuple(range(1, len(shape) + 1)))
        d = 0
    shape = list(aval_of(x).shape)
    pieces = []
    for dst in range(n):
        if dst in source:
            lo = [0] * len(shape)
            hi = list(shape)
            lo[d], hi[d] = source[dst], source[dst] + 1
            pieces.append(st.slice(x, lo, hi))
        else:  # no source sends here: zeros, as JAX
            zshape = list(shape)
            zshape[d] = 1
            pieces.append(st.full(tuple(zshape), 0, aval_of(x).dtype, aval_of(x).weak_type))
    return st.concatenate(pieces, d), d


collective_rules[ppermute_p] = _ppermute_rule
defjvp(ppermute_p, lambda t, x, **p: bind(ppermute_p, t, **p))


def _ppermute_transpose(ct, x, *, axis_name, perm):
    if type(ct) is Zero:
        return [Zero(x.aval)]
    inverse = tuple((dst, src) for src, dst in perm)
    return [bind(ppermute_p, ct, axis_name=axis_name, perm=inverse)]


transpose_rules[ppermute_p] = _ppermute_transpose

# --------------------------------------------------------------------------
# all_to_all: params as JAX's primitive (`axis_name`, `split_axis`,
# `concat_axis`, `axis_index_groups`, `tiled`); at the primitive the split
# axis is divided by the axis size and the concat axis multiplied by it
# (the function adds and removes the unit axes of the untiled form)

all_to_all_p = _collective("all_to_all", _par.all_to_all_p, "axis_name", "all_to_all")


def _all_to_all_shape(x, *, axis_name, split_axis, concat_axis, axis_index_groups, tiled):
    n = axis_size(axis_name)
    shape = list(x.shape)
    if shape[split_axis] % n:
        raise FunctxValueError(
            f"functx.lax.all_to_all: split_axis {split_axis} has size {shape[split_axis]}, "
            f"not a multiple of the axis size {n}.")
    shape[split_axis] //= n
    shape[concat_axis] *= n
    return Aval(tuple(shape), x.dtype, False)


shape_rules[all_to_all_p] = _all_to_all_shape


def _split_axis(x, axis, factor):
    shape = list(aval_of(x).shape)
    shape[axis:axis + 1] = [factor, shape[axis] // factor]
    return st.reshape(x, tuple(shape))


def _fold_axis(x, axis):
    shape = list(aval_of(x).shape)
    shape[axis:axis + 2] = [shape[axis] * shape[axis + 1]]
    return st.reshape(x, tuple(shape))


def _all_to_all_rule(interp, vals, dims, *, axis_name, split_axis, concat_axis,
                     axis_index_groups, tiled):
    (x,), (d,) = vals, dims
    names = _names(axis_name)
    params = dict(axis_name=axis_name, axis_index_groups=axis_index_groups, tiled=tiled)
    if interp.axis_name not in names:
        if d is None:
            return bind(all_to_all_p, x, split_axis=split_axis, concat_axis=concat_axis,
                        **params), None
        return bind(all_to_all_p, x, split_axis=split_axis + (d <= split_axis),
                    concat_axis=concat_axis + (d <= concat_axis), **params), d
    _whole_axis("all_to_all", interp, names, axis_index_groups)
    n = interp.axis_size
    if d is None:
        shape = aval_of(x).shape
        x = st.broadcast_in_dim(x, (n,) + tuple(shape), tuple(range(1, len(shape) + 1)))
        d = 0
    if split_axis == concat_axis:
        axis = split_axis + (d <= split_axis)
        y = _split_axis(x, axis, n)  # (chunk index, chunk) at axis, axis + 1
        d2 = d + (axis <= d)
        perm = list(range(aval_of(y).ndim))
        perm[d2], perm[axis] = perm[axis], perm[d2]
        y = st.transpose(y, tuple(perm))
        return _fold_axis(y, axis), d
    y = _fold_axis(moveaxis(x, d, concat_axis), concat_axis)
    return _split_axis(y, split_axis, n), split_axis


collective_rules[all_to_all_p] = _all_to_all_rule
defjvp(all_to_all_p, lambda t, x, **p: bind(all_to_all_p, t, **p))


def _all_to_all_transpose(ct, x, *, axis_name, split_axis, concat_axis, axis_index_groups,
                          tiled):
    if type(ct) is Zero:
        return [Zero(x.aval)]
    # a permutation of the batch's blocks: its transpose is its inverse
    return [bind(all_to_all_p, ct, axis_name=axis_name, split_axis=concat_axis,
                 concat_axis=split_axis, axis_index_groups=axis_index_groups, tiled=tiled)]


transpose_rules[all_to_all_p] = _all_to_all_transpose

# --------------------------------------------------------------------------
# The functions of functx.lax


def _axis_tuple(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _tree_map(fn, x):
    import jax

    return jax.tree_util.tree_map(fn, x)


def psum(x, axis_name, *, axis_index_groups=None):
    """Sum `x` (a pytree of arrays) over the batch axis of the
    `functx.vmap(..., axis_name=axis_name)` it runs under, as
    `jax.lax.psum`: every batch element gets the sum. `axis_name` may be a
    tuple of names (nested named vmaps) and may hold ints (positional axes
    of `x`, summed too). A value that is not batched counts once per batch
    element (`psum(1, 'i')` is the batch size). Booleans are summed as
    int32. Differentiable (its transpose is psum, as JAX's)."""
    axes = _axis_tuple(axis_name)
    if not axes:
        return x

    def one(leaf):
        if aval_of(leaf).dtype == np.dtype(bool):
            leaf = ew.convert_element_type(leaf, np.dtype(np.int32))
        return bind(psum_p, leaf, axes=axes, axis_index_groups=axis_index_groups)

    return _tree_map(one, x)


def pmax(x, axis_name, *, axis_index_groups=None):
    """The maximum of `x` over the named vmap axis (`jax.lax.pmax`), for
    every batch element. Its derivative averages the tangents of the batch
    elements that attain the maximum (JAX has none)."""
    axes = _axis_tuple(axis_name)
    return _tree_map(lambda leaf: bind(pmax_p, leaf, axes=axes,
                                       axis_index_groups=axis_index_groups), x)


def pmin(x, axis_name, *, axis_index_groups=None):
    """The minimum of `x` over the named vmap axis (`jax.lax.pmin`); see
    pmax."""
    axes = _axis_tuple(axis_name)
    return _tree_map(lambda leaf: bind(pmin_p, leaf, axes=axes,
                                       axis_index_groups=axis_index_groups), x)


def axis_size(axis_name):
    """The size (a Python int) of the named vmap axis, or the product of the
    sizes of a tuple of names (`jax.lax.axis_size`)."""
    size = 1
    for name in _axis_tuple(axis_name):
        interp = named_interpreter(name)
        if interp is None:
            raise unbound_error("axis_size", name)
        size *= full_size(interp)
    return size


def pmean(x, axis_name, *, axis_index_groups=None):
    """The mean of `x` over the named vmap axis (`jax.lax.pmean`): psum
    divided by the axis size."""
    _check_groups("pmean", axis_index_groups)
    names = _axis_tuple(axis_name)
    named = tuple(a for a in names if not isinstance(a, (int, np.integer)))
    axis_size(named)  # unbound names raise here

    def one(leaf):
        s = psum(leaf, axis_name)
        a = aval_of(s)
        count = 1
        for p in names:
            if isinstance(p, (int, np.integer)):
                count *= aval_of(leaf).shape[p]
        if not (np.issubdtype(a.dtype, np.inexact) or a.dtype.name == "bfloat16"):
            s = ew.convert_element_type(s, np.dtype(np.float64) if _x64() else np.dtype(np.float32))
        # the axis size as a collective (psum of one), not a Python int: a
        # graph staged inside the vmap and replayed under another size
        # (a control-flow body cached by its code) stays right
        if named:
            n = bind(psum_p, scalar_like(s, count), axes=named, axis_index_groups=None)
        else:
            n = scalar_like(s, count)
        return ew.div(s, n)

    return _tree_map(one, x)


def _x64():
    import jax

    return jax.config.jax_enable_x64


def axis_index(axis_name):
    """The index (int32) of each batch element along the named vmap axis
    (`jax.lax.axis_index`); for a tuple of names, the row-major index over
    those axes."""
    names = _axis_tuple(axis_name)
    if len(names) == 1:
        return bind(axis_index_p, axis_name=names[0])
    return _multi_axis_index(names)


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False):
    """Gather `x` from every batch element of the named vmap axis
    (`jax.lax.all_gather`): a new axis of the batch size at `axis` (or,
    `tiled=True`, concatenated along `axis`), the same in every element.
    Its transpose is psum_scatter."""
    names = _axis_tuple(axis_name)
    n = axis_size(names)

    def one(leaf):
        nd = aval_of(leaf).ndim
        dim = axis % (nd if tiled else nd + 1)
        return bind(all_gather_p, leaf, all_gather_dimension=dim, axis_name=names,
                    axis_index_groups=axis_index_groups, axis_size=n, tiled=tiled)

    return _tree_map(one, x)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """psum over the named vmap axis, of which batch element i keeps slice i
    along `scatter_dimension` (that dimension has the batch size; with
    `tiled=True` a multiple of it, split in equal tiles), as
    `jax.lax.psum_scatter`. Its transpose is all_gather."""
    names = _axis_tuple(axis_name)
    n = axis_size(names)

    def one(leaf):
        dim = scatter_dimension % aval_of(leaf).ndim
        return bind(reduce_scatter_p, leaf, scatter_dimension=dim, axis_name=names,
                    axis_index_groups=axis_index_groups, axis_size=n, tiled=tiled)

    return _tree_map(one, x)


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Exchange blocks across the named vmap axis (`jax.lax.all_to_all`):
    batch element i receives block i of `split_axis` from every element j,
    placed at position j along `concat_axis`. Untiled, `split_axis` must
    have the batch size and is replaced by a new axis at `concat_axis`;
    tiled, it is divided by the batch size and `concat_axis` multiplied.
    Its transpose is the all_to_all with the two axes swapped."""
    names = _axis_tuple(axis_name)
    n = axis_size(names)

    def one(leaf, split_axis=split_axis, concat_axis=concat_axis):
        shape = aval_of(leaf).shape
        split_axis %= len(shape)
        if tiled:
            concat_axis %= len(shape)
            if shape[split_axis] % n:
                raise FunctxValueError(
                    f"functx.lax.all_to_all: split_axis {split_axis} has size "
                    f"{shape[split_axis]}, not a multiple of the axis size {n}.")
            return bind(all_to_all_p, leaf, axis_name=names, split_axis=split_axis,
                        concat_axis=concat_axis, axis_index_groups=axis_index_groups,
                        tiled=True)
        concat_axis %= len(shape)
        if shape[split_axis] != n:
            raise FunctxValueError(
                f"functx.lax.all_to_all: split_axis {split_axis} has size {shape[split_axis]}"
                f", but the axis {axis_name!r} has size {n}: untiled, they must be equal.")
        if split_axis < concat_axis:
            concat_axis += 1
            leaf = st.reshape(leaf, shape[:concat_axis] + (1,) + shape[concat_axis:])
        elif split_axis > concat_axis:
            leaf = st.reshape(leaf, shape[:concat_axis] + (1,) + shape[concat_axis:])
            split_axis += 1
        out = bind(all_to_all_p, leaf, axis_name=names, split_axis=split_axis,
                   concat_axis=concat_axis, axis_index_groups=axis_index_groups, tiled=False)
        if split_axis != concat_axis:
            oshape = aval_of(out).shape
            out = st.reshape(out, oshape[:split_axis] + oshape[split_axis + 1:])
        return out

    return _tree_map(one, x)


def ppermute(x, axis_name, perm):
    """Send `x` from batch element `src` to `dst` for each pair of `perm`
    along the named vmap axis (`jax.lax.ppermute`); elements no pair sends
    to get zeros. Its transpose is the inverse permutation."""
    names = _axis_tuple(axis_name)
    perm = tuple((int(s), int(d)) for s, d in perm)
    return _tree_map(lambda leaf: bind(ppermute_p, leaf, axis_name=names, perm=perm), x)


__all__ = ["psum", "pmean", "pmax", "pmin", "axis_index", "axis_size", "all_gather",
           "psum_scatter", "ppermute", "all_to_all", "UnboundAxisNameError"]
