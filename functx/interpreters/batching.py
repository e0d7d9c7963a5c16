"""Batching: the vmap interpreter.

A `BatchTracer` carries a lower-level value with one extra axis, `bdim`, the
batch axis. Values that are not batched are never boxed: `None` means "not
batched" everywhere. Each primitive's batching rule (the table
`batch_rules`, filled in next to each primitive) maps batched operands to a
batched result.

Eagerly (on concrete arrays) a batching rule may cost several JAX
dispatches (moving axes, then the operation). As in reverse mode (NOTE
[eager reverse mode in few dispatches]), the second time a primitive is met
with the same parameters, avals and batch axes, its batched version is
staged once (`batch_graph` of a one-equation graph: `batched_step`) and
queued, to run inside one compiled program with its neighbours (NOTE
[deferred eager steps]).

Rule convention: `rule(axis_size, vals, dims, **params) -> (out, out_dim)`
where `dims[i]` is the batch axis of `vals[i]` or None; for primitives with
multiple results `out` and `out_dim` are lists. `move_bdim` and
`bdim_to_front` are the helpers for moving batch axes.

NOTE [identity bases]
jacfwd pushes the rows of the identity through vmap(jvp), and jacrev pulls
them through vmap(vjp). The first linear map they meet multiplies a matrix
by that identity: for a Hessian of an n-vector function that is an n^3
product as big as the real work (JAX and torch.func both pay it). A
`BatchTracer` made from such a basis carries `basis`: its batch element i
is the unit vector at flat position `i - basis` of the unbatched value (zero
when that is out of range). Primitives with an entry in `basis_rules` use it
(dot_general returns the other operand's slice, reshape and
convert_element_type keep the mark); every other rule sees the ordinary
materialised array, which XLA drops when nothing uses it. A slice whose
batch axis is not its leading axis is taken only when the product it
replaces is large: XLA fuses the transpose that later moves that axis into
the consumers, which can cost more than a small product (`_dot_basis`). Chunks
of a basis (`jacrev(chunk_size=k)`, `map_over_basis` in transforms/vmap.py)
carry the offset of their rows, which can put the unit vectors wholly outside
a chunk; in the loop that chunks become under jit the offset is a JAX integer,
and `_dot_basis` gathers the chunk's rows. A basis that reaches a jitted
function (`jacrev(jit(f))`) is batched into its graph with the marks
(`graph_basis_rule` in primitives/call.py). The shortcut
differs from the dense product only where the other operand holds infinities
or NaNs (the dense product spreads 0 * inf = nan over the whole Jacobian row).
"""

import collections
import threading

from .. import core as _core
from ..core import (
    TRACER_TYPES, Interpreter, Tracer, aval_of, check_usable, missing_rule, new_interpreter,
)
from ..core import _ArrayImpl as ArrayImpl
from ..errors import ConcretizationError, FunctxError, describe_user_line
from ..caches import STAGING, RepeatCache
from .deferred import (CONSTANT_TYPES, PY_SCALARS, Pending, Queue, StepOutputs, input_aval,
                       jax_avals, values)
from .staging import eval_graph, one_equation_graph, stage

batch_rules = {}  # Primitive -> rule
# Primitive -> rule(axis_size, vals, dims, bases, **params) returning
# (out, out_dim, basis) or None for "use the batching rule": NOTE [identity bases]
basis_rules = {}
# NOTE [named axes]: Primitive -> rule(interp, vals, dims, **params) returning
# (out, out_dim), for the collectives (functx/primitives/collectives.py),
# whose batching depends on the interpreter's axis name
collective_rules = {}


class AxisInfo(collections.namedtuple("AxisInfo", "name spmd chunk")):
    """What a vmap says of its axis beyond its size (None when it says
    nothing): `name`, its axis_name (NOTE [named axes]); `spmd`, the
    tuple of mesh axes of its spmd_axis_name (NOTE [spmd axes] in
    transforms/vmap.py); `chunk`, `(first, full size)` when the
    interpreter batches one chunk of a chunked named vmap. Compared by
    value: part of the keys of batched graphs."""

    __slots__ = ()


class _RuleContext(threading.local):
    # The AxisInfo of the vmap whose rule is running (None: none, or one
    # that says nothing): a BatchInterpreter made by that rule (batch_graph,
    # the batching of control flow and custom rules) stands for the same
    # axis, so the collectives in the graphs it batches see the name.
    axis = None


_rule_context = _RuleContext()
_FROM_RULE = object()


def named_interpreter(axis_name):
    """The innermost live BatchInterpreter of this thread named
    `axis_name`, or None (NOTE [named axes])."""
    for interp in reversed(_core.interpreter_stack()):
        if type(interp) is BatchInterpreter and interp.axis_name == axis_name:
            return interp
    return None


class BatchTracer(Tracer):
    """A batched value; `val` may be a `Pending` inside (NOTE [deferred
    eager steps]), which reading `val` computes."""

    __slots__ = ("_val", "bdim", "_aval", "basis")

    @property
    def val(self):
        v = self._val
        if type(v) is Pending:
            v = self._val = v.force()
        return v

    @val.setter
    def val(self, value):
        self._val = value

    def __init__(self, interp, val, bdim, basis=None):
        self._interp = interp
        if type(val) in TRACER_TYPES:  # NOTE [escaped tracers]: a transform's inputs
            check_usable(val)
        self.val = val
        self.bdim = bdim
        self._aval = None
        self.basis = basis  # NOTE [identity bases]

    @property
    def aval(self):
        a = self._aval
        if a is None:
            v = self._val
            a = v.faval if type(v) is Pending else aval_of(v)
            b = self.bdim
            a = self._aval = a.update(shape=a.shape[:b] + a.shape[b + 1:])
        return a


def _fresh(interp, val, bdim):
    """`interp.box(val, bdim)` for a value this thread has just computed
    (a rule's or a step's output): nothing to check (NOTE [escaped
    tracers]), so BatchTracer's constructor is skipped (this runs for every
    primitive an eager vmap processes)."""
    if bdim is None:
        return val
    t = _new_tracer(BatchTracer)
    t._interp = interp
    t._val = val
    t.bdim = bdim
    t._aval = None
    t.basis = None
    return t


_new_tracer = object.__new__


class BatchInterpreter(Interpreter):
    transform = "vmap"

    def __init__(self, axis_size, randomness="error", transform="vmap", axis_name=_FROM_RULE,
                 axis=None):
        super().__init__()
        self.queue = Queue()  # NOTE [deferred eager steps]
        self.axis_size = axis_size
        self.randomness = randomness
        self.transform = transform
        # NOTE [named axes]: vmap(axis_name=...) (AxisInfo `axis`); made inside
        # a named vmap's rule, the interpreter batches for that vmap and
        # takes its AxisInfo
        if axis_name is _FROM_RULE:
            axis = _rule_context.axis
        elif axis is None and axis_name is not None:
            axis = AxisInfo(axis_name, None, None)
        self.axis = axis
        self.axis_name = None if axis is None else axis.name

    def box(self, val, bdim):
        # NOTE [escaped tracers]: also a transform's inputs
        if bdim is None:
            return check_usable(val)
        return BatchTracer(self, val, bdim)

    def unbox(self, x):
        if type(x) is BatchTracer and x._interp is self:
            return x.val, x.bdim
        return check_usable(x), None  # NOTE [escaped tracers]

    def process(self, prim, args, params):
        if prim.binds_axis_names and prim in collective_rules:  # NOTE [named axes]
            vals, dims = zip(*(self.unbox(a) for a in args)) if args else ((), ())
            return self._run_rule(collective_rules[prim], prim, self, list(vals),
                                  list(dims), params)
        vals = []
        dims = []
        concrete = True
        pending = False
        bases = None
        for a in args:
            if type(a) is BatchTracer and a._interp is self:
                v = a._val
                dims.append(a.bdim)
                if a.basis is not None:
                    bases = bases or [None] * len(args)
                    bases[len(vals)] = a.basis
            else:
                v = a
                dims.append(None)
            vals.append(v)
            if type(v) is not ArrayImpl:
                if type(v) is Pending:
                    pending = True
                elif type(v) not in CONSTANT_TYPES and type(v) not in PY_SCALARS:
                    concrete = False
        if pending and (bases is not None or not concrete):
            vals = values(vals)
        if bases is not None and prim in basis_rules:
            done = basis_rules[prim](self.axis_size, vals, dims, bases, **params)
            if done is not None:
                out, out_dim, basis = done
                if prim.multiple_results:
                    return [self.box(o, d) if b is None else BatchTracer(self, o, d, b)
                            for o, d, b in zip(out, out_dim, basis, strict=True)]
                return BatchTracer(self, out, out_dim, basis)
        if concrete and _core.eager_hook is None and not prim.effectful:
            # NOTE [deferred eager steps]: not while the profiler watches each
            # step (it sees the primitives the rule binds), nor for a callback,
            # which runs when the program reaches it
            step = batched_step(prim, params, vals, tuple(dims), self.axis_size, self.axis)
            if step is not None:
                outs = self.queue.defer(step.deferred, vals)
                boxed = [_fresh(self, o, d) if d is not None
                         else (o.force() if type(o) is Pending else o)
                         for o, d in zip(outs, step.out_dims)]
                return boxed if prim.multiple_results else boxed[0]
        if pending:
            vals = values(vals)
        rule = batch_rules.get(prim)
        if rule is None:
            raise missing_rule(prim, "vmap")
        return self._run_rule(rule, prim, self.axis_size, vals, dims, params)

    def _run_rule(self, rule, prim, first, vals, dims, params):
        axis = self.axis
        ctx = _rule_context
        if axis is None and ctx.axis is None:
            out, out_dim = rule(first, vals, dims, **params)
        else:  # NOTE [named axes]: graphs this rule batches keep the name
            saved, ctx.axis = ctx.axis, axis
            try:
                out, out_dim = rule(first, vals, dims, **params)
            finally:
                ctx.axis = saved
        if prim.multiple_results:
            return [_fresh(self, o, d) for o, d in zip(out, out_dim, strict=True)]
        return _fresh(self, out, out_dim)

    def concrete(self, tracer):
        raise ConcretizationError(
            f"{self.transform}: data-dependent Python control flow at "
            f"{describe_user_line()}. A batched value "
            f"({tracer.aval.str_short()}, batch of {self.axis_size}) was "
            "converted to a Python bool/int/float, but each batch element may "
            "need a different answer. Use functx.numpy.where(cond, a, b) or "
            "functx.lax.cond for branches, or move the check outside vmap."
        )


def batch_graph(graph, axis_size, dims, bases=None, axis=_FROM_RULE):
    """The graph of `graph` vmapped over inputs batched at `dims` (None: not
    batched), those with an int in `bases` being identity bases (NOTE
    [identity bases]), the batch axis described by the AxisInfo `axis` (by
    default: that of the vmap whose rule is running, NOTE [named axes]).
    Returns `(batched, out_dims)`. Cached on `graph`."""
    if axis is _FROM_RULE:
        axis = _rule_context.axis
    key = ("vmap", axis_size, dims) if bases is None else ("vmap", axis_size, dims, bases)
    if axis is not None:
        key += (axis,)
    cached = graph.cache.get(key)
    if cached is not None:
        return cached
    out_dims = []

    def fn(*args):
        with new_interpreter(BatchInterpreter(axis_size, axis_name=None, axis=axis)) as bi:
            boxed = [bi.box(x, d) for x, d in zip(args, dims, strict=True)]
            for i, b in enumerate(bases or ()):
                if b is not None:
                    boxed[i] = BatchTracer(bi, args[i], dims[i], b)
            outs = eval_graph(graph, boxed)
            pairs = [bi.unbox(o) for o in outs]
        out_dims[:] = [d for _, d in pairs]
        return [v for v, _ in pairs]

    avals = []
    for a, d in zip(graph.in_avals, dims, strict=True):
        avals.append(a if d is None else a.update(shape=a.shape[:d] + (axis_size,) + a.shape[d:]))
    batched, captured = stage(fn, avals, "vmap")
    assert not captured
    cached = graph.cache[key] = (batched, tuple(out_dims))
    return cached


def names_live_axes(prim, params):
    """Does `prim` (a graph call) hold collectives over named vmap axes? Its
    step would be evaluated where those names route it back to the vmap
    (NOTE [named axes]): it keeps the rule path, never queued (NOTE
    [deferred eager steps])."""
    if not prim.binds_axis_names:
        return False
    from ..primitives.collectives import names_in_params

    return bool(names_in_params(params))


class BatchedStep:
    """A primitive's batched graph for its input avals and batch axes:
    `deferred` is what the queue runs; compiled only as part of the queue's
    program (NOTE [deferred eager steps])."""

    __slots__ = ("out_dims", "deferred")


# (prim, params, avals, dims, size) -> BatchedStep; NOTE [bounded caches]
_steps = RepeatCache("batched steps", after=1, limit=4096, priority=STAGING,
                     doc="eager vmap: one staged batched graph per primitive (compiled as "
                         "part of the deferred queue's program)")


def batched_step(prim, params, vals, dims, axis_size, axis=None):
    """The staged batched application of `prim`, or None (first sighting,
    unhashable parameters, or a rule that cannot be staged). `axis`: the
    vmap's AxisInfo (NOTE [named axes]; a graph's collectives depend on it)."""
    try:
        key = (prim, tuple(params.items()), jax_avals(vals), dims, axis_size, axis)
        return _steps.get(key, lambda: _build_step(prim, params, vals, dims, axis_size, axis))
    except TypeError:  # unhashable parameters
        return None


def _build_step(prim, params, vals, dims, axis_size, axis=None):
    if names_live_axes(prim, params):
        return None, None
    in_avals = []
    for v, d in zip(vals, dims):
        a = input_aval(v)
        in_avals.append(a if d is None else a.update(shape=a.shape[:d] + a.shape[d + 1:]))
    try:
        graph = one_equation_graph(prim, params, in_avals)
        batched, out_dims = batch_graph(graph, axis_size, dims, axis=axis)
    except FunctxError:  # no rule, or a rule that needs concrete values
        return None, None
    step = BatchedStep()
    step.out_dims = out_dims
    step.deferred = StepOutputs(lambda *args: eval_graph(batched, args), batched)
    return step, None
