"""Reverse mode: linearize with the jvp rules, then transpose.

NOTE [reverse mode = jvp + staging + transpose]
A `ReverseTracer` carries a primal (a lower-level value) and a *linear*
tracer: a staged value of the interpreter's tape (a StagingInterpreter at the
same level). To process a primitive the interpreter runs the primitive's jvp
rule with the primals and those linear tracers as tangents. Everything the
rule computes from primals alone runs at once on the lower level (the output
primal, and residuals such as `cos(x)` for `sin`); every operation it applies
to a tangent lands on the tape as an equation of a linear graph. So each
primitive's derivative is written once, as a jvp rule, and:

* `linearize` evaluates the tape forwards on new tangents;
* `vjp` runs it backwards (`backward_pass`), applying the transpose rule of
  each linear primitive (the table `transpose_rules`).

Only linear primitives (mul by a constant, add, broadcast, reduce_sum,
slicing, gather, dot_general, ...) need transpose rules. A tangent that is a
symbolic Zero is never boxed: values that do not depend on the inputs being
differentiated stay plain lower-level values and cost nothing.

NOTE [eager reverse mode in few dispatches]
On concrete arrays each JAX call costs a dispatch (~10 us), more than the
Python around it. Two caches cut the dispatches of eager reverse mode:

* a *fused step*: the second time a primitive is met with the same
  parameters, input avals and differentiated inputs, the jvp of that one
  primitive is staged and split (`jvp_graph`) into a primal part (output and
  residuals, e.g. `sin(x)` and `cos(x)`), queued to run inside one compiled
  program with the steps around it (NOTE [deferred eager steps]), and a
  tangent part whose equations are copied onto the tape. No jvp rule runs
  in Python.
* a *compiled backward pass*: a tape whose structure (equations, avals,
  which values are constants) was already transposed twice is transposed by
  one compiled program taking its constants and cotangents as arguments.
  Not a tape of one equation (`grad(jit(f))`'s single `jit_call`): its
  transpose is one program already, and compiling it again would only cost
  a compilation beside the user's calls.

Both only engage for what repeats, so one-off shapes do not pay for a
compilation, and not under functx.jit or jax.jit, where the program is
staged anyway. Under another eager transform a fused step's primal part is
bound to it as one call (NOTE [fused steps above another transform] in
deferred.py), and the tape's transpose is staged (NOTE [staged backward
passes]).

Transpose rule convention: `rule(ct, *args, **params) -> [ct_or_None per
arg]`, where the linear arguments are `staging.Var`s (`staging.is_linear`)
and the others are the constant values; `ct` is a list for primitives with
multiple results (with `Zero` where an output got no cotangent).
"""

from .. import core as _core
from .. import xla_cpu
from ..core import TRACER_TYPES, Zero, aval_of, bind, check_tree_usable, check_usable, missing_rule
from ..core import _ArrayImpl as ArrayImpl
from ..core import _state as _core_state
from ..errors import FunctxError
from ..caches import STAGING, RepeatCache
from .deferred import (CONSTANT_TYPES, PY_SCALARS, Pending, Queue, StepOutputs, all_eager,
                       bind_eager_call, input_aval, jax_avals, values)
from .eval import compile_ahead
from .jvp import JVPInterpreter, JVPTracer, jvp_graph
from .staging import (
    Const,
    Eqn,
    Graph,
    StagingInterpreter,
    StagingTracer,
    Var,
    dce,
    eval_graph,
    holds_alone_call,
    one_equation_graph,
)

transpose_rules = {}  # Primitive -> rule

# NOTE [tape hooks]
# functx.autograd watches the tape through these two hooks (saved_tensors_hooks
# and save_on_cpu in autograd/graph.py, anomaly mode in
# autograd/anomaly_mode.py). Both are empty / None unless one of those is
# active, so the hot path pays one truth test.
# * `tape_observers`: callables `f(tape, start, prim)` run after the reverse
#   interpreter has recorded the linear equations of one application of the
#   forward primitive `prim` (tape.eqns[start:]). They may rewrite those
#   equations' inputs in place and set `tape.prepare`, a `graph -> graph`
#   function that `LinearMap` applies before every use of the recorded graph.
# * `backward_check`: `f(eqn, ct, in_cts)`, run after each transpose rule of
#   `backward_pass`; when set, the compiled backward pass is not used.
tape_observers = []
backward_check = None

# NOTE [transposed as if inlined]
# A cotangent that reaches a variable from several uses is a sum, and its
# bits depend on the order of the additions. Transposed primitive by
# primitive, the uses add up in the reverse order of the tape. The calls
# eager transforms make of their own (a step of a transform above another
# one, a staged backward pass: `is_eager` in primitives/call.py) hold
# equations that the rule path records on the tape one by one: transposed
# as one unit, such a call would first add up the uses inside it and add
# that partial sum to the others, so a gradient of a gradient would differ
# in the last bit between the first calls and the later ones. So
# `backward_pass` inlines those calls (`inlined_calls`: primitive ->
# `params -> graph to inline, or None`) before it transposes: the additions
# are those of the rule path, in its order. A user's `functx.jit` is one
# unit on either path and stays one.
inlined_calls = {}


_primal_slot = JVPTracer.__dict__["primal"]
_raw_primal = _primal_slot.__get__
_raw_tangent = JVPTracer.__dict__["tangent"].__get__
_set_tangent = JVPTracer.__dict__["tangent"].__set__
_set_aval = JVPTracer.__dict__["_aval"].__set__


class ReverseTracer(JVPTracer):
    """A primal with a *linear* tangent: a tracer of the interpreter's tape.
    The primal may be a `Pending` (NOTE [deferred eager steps]): reading
    `primal` gives its value.

    With a symbolic Zero tangent it is a queued value with no derivative (a
    comparison, an integer: see `_process`). Unqueued, such a value would be
    the plain array, as in JAX, so it behaves as one: NumPy conversion and
    the methods of `jax.Array` that tracers lack (`tolist`, `tobytes`,
    `block_until_ready`, ...) and printing act on its value, as no
    derivative is lost."""

    __slots__ = ()

    def __array__(self, *args, **kwargs):
        if type(_raw_tangent(self)) is Zero:
            return self.primal.__array__(*args, **kwargs)
        return super().__array__(*args, **kwargs)

    def __repr__(self):
        if type(_raw_tangent(self)) is Zero:
            return repr(self.primal)
        return super().__repr__()

    def __str__(self):
        if type(_raw_tangent(self)) is Zero:
            return str(self.primal)
        return super().__str__()

    def __format__(self, spec):
        if type(_raw_tangent(self)) is Zero:
            return format(self.primal, spec)
        return super().__format__(spec)

    def value_after_exit(self):  # NOTE [escaped tracers]
        if type(_raw_tangent(self)) is Zero:
            return self.primal
        return super().value_after_exit()

    def __reduce__(self):
        if type(_raw_tangent(self)) is Zero:
            return self.primal.__reduce__()
        return super().__reduce__()

    def __getattr__(self, name):  # only for names the class does not define
        try:
            no_derivative = type(_raw_tangent(self)) is Zero
        except AttributeError:  # not initialised yet
            no_derivative = False
        if no_derivative and not name.startswith("__"):
            return getattr(self.primal, name)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @property
    def primal(self):
        p = _raw_primal(self)
        if type(p) is Pending:
            p = p.force()
            _primal_slot.__set__(self, p)
        return p

    @primal.setter
    def primal(self, value):
        _primal_slot.__set__(self, value)

    @property
    def aval(self):
        a = self._aval
        if a is None:
            p = _raw_primal(self)
            a = self._aval = p.faval if type(p) is Pending else aval_of(p)
        return a


_new_tracer = object.__new__


def _fresh_tracer(interp, primal, tangent):
    """`ReverseTracer(interp, primal, tangent)` for values this thread has
    just computed (a step's output, its tangent on the tape): nothing to
    check (NOTE [escaped tracers]), so the constructor's checks are skipped
    (this runs for every primitive an eager grad records)."""
    r = _new_tracer(ReverseTracer)
    r._interp = interp
    _primal_slot.__set__(r, primal)
    _set_tangent(r, tangent)
    _set_aval(r, None)
    return r


class _Tape(StagingInterpreter):
    """The linear graph of a reverse interpreter: lives at its level and
    dies with it."""

    prepare = None  # NOTE [tape hooks]
    blocks_grad = False  # NOTE [grad modes]: the tape records tangents only

    def __init__(self, owner):
        super().__init__(owner.transform)
        self.owner = owner
        self.pending_consts = []  # Consts holding Pendings: NOTE [deferred eager steps]

    @property
    def level(self):
        return self.owner.level

    @level.setter
    def level(self, value):
        pass

    def process(self, prim, args, params):
        # NOTE [calls in a jvp rule]
        # A rule borrowed from JAX (the linalg jvps: `jax.jvp` of the
        # primitive, a jitted JAX function) stays one `jit_call` eagerly
        # (NOTE [JAX's jit programs stay calls] in interop.py), taking the
        # primals and the tangents together and giving the output and its
        # tangent. Recorded whole, its primal output would be a value of
        # this tape: unknown, and linear to the transpose, which then failed
        # on the first nonlinear use of it (`sin(q)` of a qr). So a call
        # of a graph that mixes this tape's values with others is split
        # (`_split_call`): the equations that read only the others (the
        # primals) are one call bound below, run at once as in any rule,
        # and the rest is recorded here equation by equation, reading what
        # the first computed, as a repeated step records the same rule's
        # tangent part (`fused_step`). (Recorded as one call, its transpose
        # was one program that XLA optimised whole, so the first call
        # rounded otherwise than the later ones: svd's gradient changed its
        # last bit from the second call on.) A call whose every output
        # reads a tangent (a jvp's tangent part, the eager engine's
        # backward passes) stays whole.
        if prim.name == "jit_call" and not _eager_name(params["name"]):
            mine = tuple(type(a) is StagingTracer and a._interp is self for a in args)
            if any(mine) and not all(mine):
                return self._split_call(prim, args, params, mine)
        return super().process(prim, args, params)

    def _split_call(self, prim, args, params, mine):
        graph, name = params["graph"], params["name"]
        split = graph.cache.get(("split by tape", mine))
        if split is None:
            split = _split_by_known(graph, mine)
            if not any(where != 1 for where, _ in split[2][1]):
                split = False  # every output reads a tangent (a jvp's tangent part): whole
            graph.cache[("split by tape", mine)] = split
        if split is False:
            return super().process(prim, args, params)
        known, unknown, places = split
        known_args = [a for a, m in zip(args, mine) if not m]
        outs = bind(prim, *known_args, graph=known, name=name)
        staged = self.inline(unknown, [*outs[places[0]:], *(a for a, m in zip(args, mine) if m)])
        first = outs[:places[0]]
        return [first[i] if where == 0 else staged[i] if where == 1 else i
                for where, i in places[1]]

    @property
    def thread(self):  # NOTE [escaped tracers]: usable where its owner is
        return self.owner.thread

    @thread.setter
    def thread(self, value):
        pass


    def inline(self, graph, args):
        """Append the equations of `graph` applied to `args` (tape tracers
        or constants); return its outputs as tape tracers (or constants)."""
        plan = graph.cache.get("inline")
        if plan is None:
            plan = graph.cache["inline"] = _inline_plan(graph)
        n_in, eqn_plans, out_refs = plan
        if len(args) != n_in:
            raise TypeError(f"functx internal error: {len(args)} inputs for a graph of {n_in}")
        # runs for every primitive an eager grad records: plain loops, no
        # comprehensions (each is a frame of its own)
        slots = []
        add = slots.append
        for a in args:
            t = type(a)
            if t is StagingTracer and a._interp is self:
                add(a.var)
            elif t is Pending:  # NOTE [deferred eager steps]
                c = Const(a, a.faval)
                self.pending_consts.append(c)
                add(c)
            else:
                add(Const(a))
        eqns = self.eqns
        for prim, refs, avals, params, all_vars in eqn_plans:
            if len(avals) == 1:
                v = Var(avals[0])
                outs = [v]
            else:
                outs = [Var(a) for a in avals]
            ins = list(map(slots.__getitem__, refs)) if all_vars else [
                slots[r] if type(r) is int else r for r in refs]
            eqns.append(Eqn(prim, ins, outs, params))
            slots += outs
        result = []
        for r in out_refs:
            x = slots[r] if type(r) is int else r
            result.append(StagingTracer(self, x) if type(x) is Var else x.value)
        return result


def _split_by_known(graph, unknown_inputs):
    """`graph` as two graphs (NOTE [calls in a jvp rule]): `known`, of the
    inputs not marked in `unknown_inputs`, computing every equation that
    reads none of the marked ones, returning first the outputs of `graph`
    it computes and then the values the rest reads (residuals); and
    `unknown`, of those residuals and the marked inputs, computing the
    rest. Also `(number of known outputs, per output of graph: (0, index)
    among the known outputs, (1, index) among unknown's, or (2, value) for
    a constant))`."""
    unknown = {v for v, m in zip(graph.inputs, unknown_inputs) if m}
    known_eqns, rest = [], []
    for eqn in graph.eqns:
        if any(type(x) is Var and x in unknown for x in eqn.inputs):
            rest.append(eqn)
            unknown.update(eqn.outputs)
        else:
            known_eqns.append(eqn)
    # what the rest and the outputs read of the known part
    read = []
    seen = set()
    for x in [x for e in rest for x in e.inputs]:
        if type(x) is Var and x not in unknown and x not in seen:
            seen.add(x)
            read.append(x)
    known_outs, places = [], []
    index = {}
    unknown_outs = []
    for x in graph.outputs:
        if type(x) is not Var:
            places.append((2, x.value))
        elif x in unknown:
            places.append((1, len(unknown_outs)))
            unknown_outs.append(x)
        else:
            if x not in index:
                index[x] = len(known_outs)
                known_outs.append(x)
            places.append((0, index[x]))
    known_inputs = [v for v, m in zip(graph.inputs, unknown_inputs) if not m]
    known = Graph(known_inputs, known_eqns, known_outs + read)
    residuals = [Var(v.aval) for v in read]
    rename = dict(zip(read, residuals))
    unknown_inputs_vars = [v for v, m in zip(graph.inputs, unknown_inputs) if m]
    eqns = [Eqn(e.prim, [rename.get(x, x) if type(x) is Var else x for x in e.inputs],
                e.outputs, e.params) for e in rest]
    unknown_graph = Graph(residuals + unknown_inputs_vars, eqns, unknown_outs)
    return known, unknown_graph, (len(known_outs), places)


def _eager_name(name):
    from ..primitives.call import is_eager

    return is_eager(name)


def _inline_plan(graph):
    """`graph` with its variables numbered (inputs first, then each
    equation's outputs in order), so `_Tape.inline` copies it without a
    dictionary: (number of inputs, [(prim, input numbers or Consts, output
    avals, params, whether every input is a number)], output numbers or
    Consts)."""
    index = {v: i for i, v in enumerate(graph.inputs)}
    eqn_plans = []
    for eqn in graph.eqns:
        refs = tuple(index[x] if type(x) is Var else x for x in eqn.inputs)
        eqn_plans.append((eqn.prim, refs, tuple(v.aval for v in eqn.outputs), eqn.params,
                          all(type(r) is int for r in refs)))
        for v in eqn.outputs:
            index[v] = len(index)
    outs = tuple(index[x] if type(x) is Var else x for x in graph.outputs)
    return len(graph.inputs), tuple(eqn_plans), outs


class ReverseInterpreter(JVPInterpreter):
    """The jvp interpreter, with tangents that are staged on a tape."""

    transform = "vjp"
    tracer_type = ReverseTracer

    def __init__(self, transform="vjp"):
        super().__init__(transform)
        self.tape = _Tape(self)
        self.queue = Queue()  # NOTE [deferred eager steps]

    def new_input(self, primal):
        return ReverseTracer(self, primal, self.tape.new_input(aval_of(primal)))

    def box(self, primal, tangent):
        # A tangent that is not on the tape does not depend on the inputs.
        if type(tangent) is StagingTracer and tangent._interp is self.tape:
            return ReverseTracer(self, primal, tangent)
        return primal

    def process(self, prim, args, params):
        if self.level <= _core_state.no_grad_level:  # NOTE [grad modes]
            return self.process_no_grad(prim, args, params)
        if not tape_observers:
            return self._process(prim, args, params)
        start = len(self.tape.eqns)  # NOTE [tape hooks]
        out = self._process(prim, args, params)
        for observe in tape_observers:
            observe(self.tape, start, prim)
        return out

    def _process(self, prim, args, params):
        primals, tangents, differentiated = [], [], []
        concrete = True
        pending = False
        other = False  # a primal neither an array nor a functx tracer (a NumPy array)
        for a in args:
            if type(a) is ReverseTracer and a._interp is self:
                p = _raw_primal(a)
                t = a.tangent
                tangents.append(t)
                # a queued output with no tangent is boxed with a Zero (below)
                differentiated.append(type(t) is not Zero)
            else:
                p = a
                tangents.append(Zero.of(a))
                differentiated.append(False)
            primals.append(p)
            if type(p) is not ArrayImpl:
                if type(p) is Pending:
                    pending = True
                elif type(p) not in CONSTANT_TYPES and type(p) not in PY_SCALARS:
                    concrete = False
                    if type(p) not in TRACER_TYPES:
                        other = True
        if concrete and _core.eager_hook is None and not tape_observers and not prim.effectful:
            # NOTE [deferred eager steps]: not while a hook watches each step (it
            # sees the primitives the rule binds), nor for a callback, which runs
            # when the Python program reaches it
            step = fused_step(prim, params, primals, tuple(differentiated))
            if step is not None:
                outs = self.queue.defer(step.deferred, primals)
                return self._record(prim, step.split, primals, tangents, differentiated, outs)
        if pending:
            primals = values(primals)
        if (not concrete and not other and _core.eager_hook is None and not tape_observers
                and not prim.effectful and all_eager()):
            # NOTE [fused steps above another transform]
            step = fused_step(prim, params, primals, tuple(differentiated))
            if step is not None:
                outs = bind_eager_call(step.split.primal, primals, backward=False)
                if outs is not None:
                    return self._record(prim, step.split, primals, tangents, differentiated,
                                        outs)
        return self.apply_rule(prim, primals, tangents, params)

    def _record(self, prim, split, primals, tangents, differentiated, outs):
        """The outputs of a fused step, `outs` (its output and residuals),
        boxed with the tangents its tangent part records on the tape."""
        args = split.residuals(primals, outs)
        for t, d in zip(tangents, differentiated):
            if d:
                args.append(t)
        tape = self.tape
        out_tangents = tape.inline(split.tangent, args)
        if split.n_out == 1 and not prim.multiple_results:  # most primitives: no loop
            o = outs[0]
            if split.out_nonzero[0]:
                t = out_tangents[0]
                if type(t) is StagingTracer and t._interp is tape:
                    return _fresh_tracer(self, o, t)
                return o
            return self._no_derivative(o) if type(o) is Pending else o
        out_tangents = iter(out_tangents)
        boxed = [self.box(o, next(out_tangents)) if nz
                 else (self._no_derivative(o) if type(o) is Pending else o)
                 for o, nz in zip(outs[:split.n_out], split.out_nonzero)]
        return boxed if prim.multiple_results else boxed[0]

    def raw_primal(self, x):
        """The primal of `x` seen from this level, still queued if it is
        (NOTE [one program per gradient])."""
        if type(x) is ReverseTracer and x._interp is self:
            return _raw_primal(x)
        return check_usable(x)  # NOTE [escaped tracers]

    def _no_derivative(self, pending):
        """A queued output with no tangent (a comparison, an integer).

        For a rule of a transform above this one (relu's mask inside
        `grad(vmap(f))`, MAML's inner steps) it stays queued, inside a tracer
        with a Zero tangent: returned bare, a Pending would reach code that
        needs an array. The user's own operations on this transform's
        values (it is the top of the stack) get the array, as in JAX: a
        value they may keep after the transform returns."""
        if self.level < len(_core_state.stack):
            return ReverseTracer(self, pending, Zero(pending.faval))
        return pending.force()

    def release(self):
        # The tape and this interpreter refer to each other; dropping the
        # recorded equations (the linear map keeps those it needs) frees
        # the residuals now rather than at the next garbage collection.
        self.tape.eqns = []

    def linear_map(self, inputs, outputs, queued=False):
        """The tape as a `LinearMap` from the tangents of `inputs` (this
        interpreter's tracers) to those of `outputs` (symbolic zeros where an
        output does not depend on the inputs). With `queued`, residuals still
        queued stay so (NOTE [one program per gradient]): the map runs the
        queue before anything but a backward pass queued behind them."""
        pending = self.tape.pending_consts
        self.tape.pending_consts = []
        if not (queued and _core.eager_hook is None and not tape_observers):
            self.queue.flush()  # NOTE [deferred eager steps]: the residuals on the tape
            _resolve(pending)
            pending = None
        live = []
        zero_avals = []
        for o in outputs:
            if type(o) is ReverseTracer and o._interp is self and type(o.tangent) is not Zero:
                live.append(o.tangent)
                zero_avals.append(None)
            else:
                zero_avals.append(aval_of(check_usable(o)))  # NOTE [escaped tracers]
        graph = dce(self.tape.graph([x.tangent for x in inputs], live))
        return LinearMap(graph, zero_avals, self.tape.prepare, pending or None)


def _resolve(consts):
    """Give the tape constants that hold queued values their arrays."""
    for c in consts:
        if type(c.value) is Pending:
            c.value = c.value.force()


def _with_values(graph):
    """`graph` with its constants that hold queued values replaced by
    constants of their arrays (running the queue); `graph` is unchanged."""
    def resolved(x):
        if type(x) is Const and type(x.value) is Pending:
            return Const(x.value.force(), x.aval)
        return x

    eqns = [Eqn(e.prim, [resolved(x) for x in e.inputs], e.outputs, e.params)
            for e in graph.eqns]
    return Graph(graph.inputs, eqns, [resolved(x) for x in graph.outputs])


class FusedStep:
    """A primitive's jvp split for its input avals: `split.primal` (output
    and residuals) is what the queue runs (`deferred`), `split.tangent` what
    the tape records."""

    __slots__ = ("split", "deferred")


# (prim, params, avals, differentiated) -> FusedStep; NOTE [bounded caches]
_fused = RepeatCache("fused steps", after=1, limit=4096, priority=STAGING,
                     doc="eager reverse mode: one staged primal+residuals graph per primitive "
                         "(compiled as part of the deferred queue's program)")


def fused_step(prim, params, primals, differentiated):
    """The FusedStep for this application of `prim`, or None (first
    sighting, unhashable parameters, or a rule that cannot be staged)."""
    try:
        key = (prim, tuple(params.items()), jax_avals(primals), differentiated)
        return _fused.get(key, lambda: _build_fused(prim, params, primals, differentiated))
    except TypeError:  # unhashable parameters
        return None


def _build_fused(prim, params, primals, differentiated):
    """Stages the step; compiles nothing: a step only runs inside a queue's
    program (NOTE [deferred eager steps]), or primitive by primitive until
    that program is compiled."""
    from .batching import names_live_axes

    if names_live_axes(prim, params):
        return None, None
    try:
        split = jvp_graph(one_equation_graph(prim, params, [input_aval(p) for p in primals]),
                          differentiated)
    except FunctxError:  # a rule that needs concrete values: stay unfused
        return None, None
    step = FusedStep()
    step.split = split
    step.deferred = StepOutputs(_evaluator(split.primal), split.primal)
    return step, None


def _evaluator(graph):
    """`graph` run equation by equation, by the per-primitive programs
    (NOTE [deferred eager steps])."""

    def run(*args):
        return eval_graph(graph, args)

    return run


# tape structure -> compiled transpose; NOTE [bounded caches]
_backward = RepeatCache("backward passes", after=2, limit=1024, byte_limit=384 << 20,
                        doc="eager reverse mode: one compiled transpose per tape structure")


def compiled_backward(graph, cts):
    """`backward_pass(graph, cts)` in one step when a tape of this structure
    has been transposed before: one compiled program on concrete arrays,
    one staged `jit_call` on the values of enclosing eager transforms (NOTE
    [staged backward passes]). None when it should run primitive by
    primitive."""
    if len(graph.eqns) < 2:  # one transposed equation is one dispatch already
        return None
    if holds_alone_call(graph):  # NOTE [a jitted function differentiated alone]
        return None
    concrete = True
    for c in cts:
        t = type(c)
        if t is not ArrayImpl:
            if t not in TRACER_TYPES:
                return None
            concrete = False
    found = _tape_signature(graph)
    if found is None:
        return None
    consts, sig, index = found
    for c in consts:
        t = type(c)
        if t is Pending:  # NOTE [one program per gradient]: read through _with_values
            return None
        if t in TRACER_TYPES:
            concrete = False
    if not concrete:
        if any(eqn.prim.effectful for eqn in graph.eqns):
            return None
        return _staged_backward(graph, consts, cts, sig, index)
    try:
        outs = tuple(index[x] for x in graph.outputs)
        key = (tuple(sig), outs, tuple(v.aval for v in graph.inputs),
               tuple(c.aval for c in consts), tuple(c.aval for c in cts))
        transpose = _backward.get(key, lambda: _compile_backward(graph, consts, cts))
    except (KeyError, TypeError):  # a constant output, unhashable parameters
        return None
    if transpose is None:
        return None
    out = transpose(consts, list(cts))
    return [Zero(v.aval) if c is None else c for v, c in zip(graph.inputs, out)]


def _tape_signature(graph):
    """A tape's structure, for the keys of the backward caches: `(consts,
    sig, index)`: its constants in order of use (arrays, JAX's scalar
    constants, tracers of enclosing transforms, queued values), per
    equation its primitive, parameters and inputs (input numbers, constant
    positions, Python numbers by value), and the numbering of its
    variables. None for a constant of any other kind."""
    index = {v: i for i, v in enumerate(graph.inputs)}
    consts, sig = [], []
    for eqn in graph.eqns:
        ins = []
        for x in eqn.inputs:
            if type(x) is Var:
                ins.append(index[x])
                continue
            v = x.value
            t = type(v)
            if t is ArrayImpl or t in CONSTANT_TYPES or t in TRACER_TYPES or t is Pending:
                ins.append(-1 - len(consts))
                consts.append(v)
            elif t in (int, float, bool):
                ins.append((v, t))
            else:
                return None
        for o in eqn.outputs:
            index[o] = len(index)
        sig.append((eqn.prim, tuple(eqn.params.items()), tuple(ins)))
    return consts, sig, index


# NOTE [one program per gradient]
# A plain `grad` on arrays ran two programs per call: the queue of forward
# steps (run when the tape became its linear map, for the residuals) and
# the compiled backward pass. `grad` asks for the linear map with its
# residuals still queued (`linear_map(queued=True)`), and once the tape's
# structure has a staged transpose (the `_staged` cache of NOTE [staged
# backward passes], built on the compile thread) the backward pass is one
# more step of the same queue, on the queued residuals and the concrete
# cotangents: the forward and backward passes run as one compiled program
# (the gradients and the value are its outputs; residuals no one holds stay
# inside it). Anything else that reads the map (`forward`, tape hooks,
# anomaly checks, the profiler) runs the queue first, as before; while the
# transpose is being staged the backward pass runs equation by equation
# (compiling no backward program that the queued step would replace). The
# staging maps the tape's constants to inputs by identity, on the compile
# thread, possibly after the call: so reading the map never swaps a queued
# constant for its array in place, it copies the graph (`_with_values`).
# A tape of one equation stays out (its transpose is one dispatch: NOTE
# [eager reverse mode in few dispatches]). `vjp`, `jacrev` and `linearize`
# keep the flushed map: their maps outlive the call, and a queued value a
# user holds would keep the whole queue's inputs alive.


NOT_YET = object()  # queued_backward: the transpose is being staged


def queued_backward(graph, cts):
    """The backward pass as a step queued behind the forward steps whose
    outputs `graph` holds as constants; `NOT_YET` while its transpose is
    being staged (the caller transposes equation by equation meanwhile,
    compiling no backward program that this step would replace); None
    where it does not apply (nothing queued, a constant that is neither an
    array nor queued, a cotangent that is not an array, a transpose that
    could not be staged, a tape of one equation: NOTE [eager reverse mode
    in few dispatches])."""
    if _core.eager_hook is not None or len(graph.eqns) < 2 or holds_alone_call(graph):
        return None
    for c in cts:
        if type(c) is not ArrayImpl:
            return None
    found = _tape_signature(graph)
    if found is None:
        return None
    consts, sig, index = found
    queue = None
    for c in consts:  # queued values stay the objects the graph holds: `_template` maps them
        t = type(c)
        if t is Pending:
            if c.value is not None:  # run already (a flush mid-way): an input like an array
                continue
            if queue is None:
                queue = c.queue
            elif c.queue is not queue:
                return None
        elif t in TRACER_TYPES:
            return None
    if queue is None or any(eqn.prim.effectful for eqn in graph.eqns):
        return None
    staged = _staged_transpose(graph, consts, cts, sig, index)
    if staged is None or staged is NOT_YET:
        return staged
    transposed, in_nonzero = staged
    step = transposed.cache.get("queued step")
    if step is None:
        step = transposed.cache["queued step"] = StepOutputs(_evaluator(transposed), transposed)
    outs = iter(queue.defer(step, consts + list(cts)) if any(in_nonzero) else ())
    return [next(outs) if nz else Zero(v.aval) for v, nz in zip(graph.inputs, in_nonzero)]


def _template(graph, consts, avals=None):
    """`graph` with the constants `consts` (by identity; `avals` their
    avals) turned into input variables: (equations, those variables in the
    order of `consts`). The result holds none of their values."""
    if avals is None:
        avals = [input_aval(c) for c in consts]
    const_vars = {}
    for c, a in zip(consts, avals):
        const_vars[id(c)] = Var(a)

    def convert(x):
        if type(x) is Const and id(x.value) in const_vars:
            return const_vars[id(x.value)]
        return x

    eqns = [Eqn(e.prim, [convert(x) for x in e.inputs], e.outputs, e.params) for e in graph.eqns]
    return eqns, [const_vars[id(c)] for c in consts]


def _compile_backward(graph, consts, cts):
    """A jitted `(consts, cts) -> input cotangents (None for zeros)` for
    every tape with the structure of `graph`; holds no value of `graph`."""
    eqns, order = _template(graph, consts)
    template = Graph(list(graph.inputs), eqns, list(graph.outputs))

    def transpose(const_vals, cts):
        in_cts = backward_pass(template, cts, known=dict(zip(order, const_vals)))
        return [None if type(c) is Zero else c for c in in_cts]

    transpose.__name__ = transpose.__qualname__ = "functx_backward"
    fn = xla_cpu.jit_by_size(transpose, xla_cpu.sizes_in_graph(template), eager=True)
    return fn, compile_ahead(fn, list(consts), list(cts))


# NOTE [staged backward passes]
# A tape recorded inside other eager transforms (the inner `grad` of MAML, of
# `vmap(grad)`, of `hessian`) holds residuals that are those transforms'
# tracers, and gets tracer cotangents. Transposed primitive by primitive,
# each of its equations would go through every enclosing interpreter: a
# batching rule, a fused step, a queued step each. Instead, once a tape
# structure repeats, its transpose is staged once as a graph
# (`transpose_graph` of the tape with its constants as inputs) and applied
# as one `jit_call`: the enclosing interpreters see one primitive, whose
# batched, jvp and fused forms they cache per graph like any `functx.jit`
# call's. Only when every interpreter is eager (nothing is staging: under
# `functx.jit` or `make_graph` the transposed equations stay visible in the
# staged program, e.g. to NOTE [ghost norms]); never with tape hooks, an
# anomaly check or an effectful primitive on the tape (they see each
# equation). The graphs the enclosing interpreters derive from it (batched,
# differentiated) are staged on the compile thread the first time, while
# that call transposes equation by equation (`_derived` in
# primitives/call.py): staging them folds constants through per-primitive
# programs, which would compile on the calling thread in a later call.

# tape structure -> (transposed graph, which inputs get a cotangent)
_staged = RepeatCache("staged backward passes", after=1, limit=1024, priority=STAGING,
                      doc="eager reverse mode inside other eager transforms: one staged "
                          "transpose per tape structure (NOTE [staged backward passes])")


def _staged_transpose(graph, consts, cts, sig, index):
    """The tape's transpose as a staged graph, `(graph, which inputs get a
    cotangent)`, once its structure repeats; `NOT_YET` while the compile
    thread stages it; None where it cannot be staged."""
    const_avals = [input_aval(c) for c in consts]
    try:
        outs = tuple(index[x] for x in graph.outputs)
        key = (tuple(sig), outs, tuple(v.aval for v in graph.inputs), tuple(const_avals),
               tuple(aval_of(c) for c in cts))
        staged = _staged.get(key, lambda: _stage_backward(graph, consts, const_avals, len(cts)))
    except (KeyError, TypeError):  # a constant output, unhashable parameters
        return None
    if staged is None:  # declined for good, or not staged yet
        return None if _staged.declined(key) else NOT_YET
    return staged


def _staged_backward(graph, consts, cts, sig, index):
    if _core.eager_hook is not None or not all_eager():
        return None
    staged = _staged_transpose(graph, consts, cts, sig, index)
    if staged is None or staged is NOT_YET:
        return None
    transposed, in_nonzero = staged
    if not any(in_nonzero):
        outs = iter(())
    else:
        outs = bind_eager_call(transposed, [*consts, *cts], backward=True)
        if outs is None:
            return None
        outs = iter(outs)
    return [next(outs) if nz else Zero(v.aval) for v, nz in zip(graph.inputs, in_nonzero)]


def _stage_backward(graph, consts, const_avals, n_cts):
    eqns, order = _template(graph, consts, const_avals)
    full = Graph(list(graph.inputs) + order, eqns, list(graph.outputs))
    linear = (True,) * len(graph.inputs) + (False,) * len(order)
    return transpose_graph(full, linear, (True,) * n_cts), None


class LinearMap:
    """A linear function recorded by reverse mode: a graph plus the outputs
    that are symbolic zeros (`zero_avals[i]` is their Aval, else None)."""

    __slots__ = ("graph", "zero_avals", "prepare", "pending")

    def __init__(self, graph, zero_avals, prepare=None, pending=None):
        self.graph = graph
        self.zero_avals = zero_avals
        self.prepare = prepare  # NOTE [tape hooks]
        # constants of `graph` still holding queued values (NOTE [one
        # program per gradient]); None once resolved
        self.pending = pending

    def _graph(self):
        if self.pending is not None:
            # a copy: a transpose may be staging from this graph on the
            # compile thread, mapping its constants by identity
            self.graph = _with_values(self.graph)
            self.pending = None
        return self.graph if self.prepare is None else self.prepare(self.graph)

    def forward(self, tangents):
        """Evaluate the map on input tangents."""
        check_tree_usable(tangents)  # NOTE [escaped tracers]
        vals = iter(eval_graph(self._graph(), tangents))
        return [next(vals) if z is None else Zero(z) for z in self.zero_avals]

    def backward(self, cts):
        """Transpose: output cotangents (Zero allowed) to input cotangents
        (Zero where none arrived)."""
        if _core.eager_hook is not None:  # NOTE [profiler hook]: a "backward" range
            return _core.eager_hook("backward", self._backward, (cts,))
        return self._backward(cts)

    def _backward(self, cts):
        live = [c for c, z in zip(cts, self.zero_avals, strict=True) if z is None]
        check_tree_usable(live)  # NOTE [escaped tracers]
        out = None
        if self.pending is not None and self.prepare is None and backward_check is None:
            out = queued_backward(self.graph, live)
            if out is not None and out is not NOT_YET:
                return out
        graph = self._graph()
        if out is None and backward_check is None:
            out = compiled_backward(graph, live)
        else:
            out = None
        return backward_pass(graph, live) if out is None else out


_add_any = None


def add_cotangents(a, b):
    global _add_any
    if _add_any is None:
        from ..primitives.elementwise import add_any

        _add_any = add_any
    return _add_any(a, b)


def backward_pass(graph, cts, known=None):
    """Transpose the linear `graph`: propagate output cotangents `cts` to its
    inputs. Returns one cotangent per input, Zero where none arrived.

    `known` maps the inputs that are not linear (e.g. the residuals of a
    staged tangent graph) to their values: the equations that depend on
    those alone are evaluated forwards first."""
    env = {}
    if inlined_calls:
        graph = _inlined(graph)
    eqns = graph.eqns
    if known:
        known = dict(known)
        eqns = []
        for eqn in graph.eqns:
            if all(type(x) is not Var or x in known for x in eqn.inputs):
                out = bind(eqn.prim, *[known[x] if type(x) is Var else x.value
                                       for x in eqn.inputs], **eqn.params)
                known.update(zip(eqn.outputs, out if eqn.prim.multiple_results else [out]))
            else:
                eqns.append(eqn)

    def accumulate(v, ct):
        prev = env.get(v)
        env[v] = ct if prev is None else add_cotangents(prev, ct)

    for v, ct in zip(graph.outputs, cts, strict=True):
        if type(v) is Var and type(ct) is not Zero:
            accumulate(v, ct)
    for eqn in reversed(eqns):
        prim = eqn.prim
        if prim.multiple_results:
            cts_out = [env.pop(v, None) for v in eqn.outputs]
            if all(c is None for c in cts_out):
                continue
            ct = [Zero(v.aval) if c is None else c for v, c in zip(eqn.outputs, cts_out)]
        else:
            ct = env.pop(eqn.outputs[0], None)
            if ct is None:
                continue
        rule = transpose_rules.get(prim) or transpose_rule_of(prim)
        if rule is None:
            raise missing_rule(
                prim,
                "reverse-mode",
                "It has a forward-mode (jvp) rule but no transpose rule, so "
                "use forward mode (jvp, jacfwd) for this function, or express "
                "it with primitives that support reverse mode.",
            )
        if known:
            args = [x.value if type(x) is not Var else known.get(x, x) for x in eqn.inputs]
        else:
            args = [x if type(x) is Var else x.value for x in eqn.inputs]
        in_cts = rule(ct, *args, **eqn.params)
        if backward_check is not None:  # NOTE [tape hooks]
            backward_check(eqn, ct, in_cts)
        for x, c in zip(eqn.inputs, in_cts, strict=True):
            if type(x) is Var and c is not None and type(c) is not Zero:
                accumulate(x, c)
    return [Zero(v.aval) if (c := env.get(v)) is None else c for v in graph.inputs]


def _inlined(graph):
    """`graph` with the calls of `inlined_calls` replaced by their
    equations, recursively (NOTE [transposed as if inlined]); `graph`
    itself when it has none."""
    if not any(e.prim in inlined_calls and inlined_calls[e.prim](e.params) is not None
               for e in graph.eqns):
        return graph
    subst = {}  # a call's output Var -> what its graph returns there, if not an equation's output

    def put(x):
        return subst.get(x, x) if type(x) is Var else x

    eqns = []
    for eqn in graph.eqns:
        inner = inlined_calls[eqn.prim](eqn.params) if eqn.prim in inlined_calls else None
        if inner is None:
            eqns.append(Eqn(eqn.prim, [put(x) for x in eqn.inputs], eqn.outputs, eqn.params))
            continue
        inner = _inlined(inner)
        rename = dict(zip(inner.inputs, [put(x) for x in eqn.inputs], strict=True))
        produced = {}  # an inner equation's output -> the call's output that it is
        for v, o in zip(eqn.outputs, inner.outputs, strict=True):
            if type(o) is not Var:
                subst[v] = o  # a constant
            elif o in rename:
                subst[v] = rename[o]  # one of the call's inputs
            elif o in produced:
                subst[v] = produced[o]  # an output returned twice
            else:
                produced[o] = v
        for e in inner.eqns:
            outs = [produced.get(o) or Var(o.aval) for o in e.outputs]
            rename.update(zip(e.outputs, outs))
            eqns.append(Eqn(e.prim, [rename[x] if type(x) is Var else x for x in e.inputs],
                            outs, e.params))
    return Graph(graph.inputs, eqns, [put(x) for x in graph.outputs])


def transpose_rule_of(prim):
    """`prim`'s transpose rule: functx's own, else the rule JAX has for its
    JAX primitive (a library may register one: NOTE [foreign primitives]),
    else None."""
    rule = transpose_rules.get(prim)
    if rule is None and prim.jax is not None:
        from ..primitives.foreign import borrowed_transpose

        rule = borrowed_transpose(prim)
    return rule


def transpose_graph(graph, linear, ct_nonzero):
    """The transpose of a staged graph that is linear in the inputs marked
    by `linear`. The result maps the other (non-linear) inputs followed by
    the nonzero output cotangents (`ct_nonzero`) to the cotangents of the
    linear inputs that receive one; returns `(transposed, in_nonzero)`.
    Cached on `graph`."""
    from .staging import stage

    key = ("transpose", linear, ct_nonzero)
    cached = graph.cache.get(key)
    if cached is not None:
        return cached
    fixed = [v for v, lin in zip(graph.inputs, linear, strict=True) if not lin]
    live_outs = [x for x, nz in zip(graph.outputs, ct_nonzero, strict=True) if nz]
    in_nonzero = []

    def fn(*args):
        known = dict(zip(fixed, args[:len(fixed)]))
        cts = iter(args[len(fixed):])
        all_cts = [next(cts) if nz else Zero(x.aval) for x, nz in zip(graph.outputs, ct_nonzero)]
        in_cts = backward_pass(graph, all_cts, known)
        lin_cts = [c for c, lin in zip(in_cts, linear) if lin]
        in_nonzero[:] = [type(c) is not Zero for c in lin_cts]
        return [c for c in lin_cts if type(c) is not Zero]

    transposed, captured = stage(fn, [v.aval for v in fixed] + [x.aval for x in live_outs],
                                 "transpose")
    assert not captured
    cached = graph.cache[key] = (transposed, tuple(in_nonzero))
    return cached
