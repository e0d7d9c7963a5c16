"""Deferred eager steps: many compiled steps of a transform run as one call.

NOTE [deferred eager steps]
Eagerly, once a primitive repeats, reverse mode stages it as a *fused step*
(its output and residuals: NOTE [eager reverse mode in few dispatches]) and
vmap as a *batched step*. Launching each as a program would still cost a
JAX dispatch (~15 us on CPU, more on a GPU), as much as all the Python
around it: a 20-op chain would spend half its time launching programs of a
few flops.

So the lowest interpreter of a transform (the one whose values are concrete
arrays) does not launch a step at once. It appends it to its `Queue` and
boxes `Pending` outputs: placeholders with the output's aval, no value yet.
Later steps take Pendings as inputs. The queue is run (`flush`) when:

* a value is needed: reading a tracer's primal (reverse mode) or value
  (vmap) anywhere but in the interpreter's own step path forces it -- a
  rule that needs concrete operands, Python control flow on a value, a
  printout, a transform's outputs, an unbatched output of vmap;
* reverse mode's tape is turned into its linear map (its residuals),
  except for a plain `grad`, whose backward pass joins the queue once its
  transpose is staged (NOTE [one program per gradient] in reverse.py);
* the queue holds `MAX_STEPS` steps.

Reverse mode's outputs with no tangent (a comparison such as relu's mask,
an integer) computed for the rules of transforms above it (vmap's, an inner
grad's: MAML's inner steps) stay queued too: the interpreter boxes them in
a tracer with a symbolic Zero tangent, which its steps read as not
differentiated, so the Pending never reaches code that expects an array.
Such a tracer reads as its array (NumPy, printing, pickling, `tolist`) and
is its array after the transform returned (NOTE [escaped tracers] in
core.py). The user's own operations on the top transform's values give the
array at once, as in JAX. Python numbers a step reads (a jitted JAX
function's scalar argument) are program inputs, like arrays.

A flush runs every queued step, in order (a queue of one step of one
equation, e.g. `grad(jit(f))`'s forward `jit_call`, simply runs it: a
program of it would be the same dispatch). The queue's structure (the steps,
how their inputs connect, the avals of the concrete inputs, and which
outputs are still referenced: the queue holds its Pendings weakly) is the
key of a `RepeatCache`: the second time a structure is flushed, the steps
are inlined into one graph whose outputs are the live Pendings, compiled on
the compile thread (NOTE [bounded caches]); until it is ready the steps run
one by one, each primitive by the per-primitive program the first sighting
already compiled. A step is never compiled on its own: the queue's programs
are the only programs eager transforms compile beyond the per-primitive
ones (and the backward passes), so a new shape (a new batch size) costs a
few programs, not one per step. A dead output is an intermediate the
program keeps inside, so a flush also needs less memory than running the
steps one at a time.

Results are the same either way, bit for bit (NaNs aside: which NaN an
operation returns is not fixed): the combined program applies the same
primitives to the same values, each compiled as it is alone, with nothing
fused or rewritten across them that could change a rounding (NOTE [one
rounding per primitive] in functx/xla_cpu.py; on GPUs only rewrites are
ruled out, not a product fused into a sum), and a
backward pass adds up cotangents in the same order on both paths (NOTE
[transposed as if inlined] in reverse.py). `test_deferred.py` compares the
paths bit for bit under XLA's default options, in a child process (the
suite compiles with cheaper ones, tests/xla_options.py).

Nothing is deferred while a hook watches the eager steps (the profiler's
`eager_hook`, reverse mode's tape observers): they see each step run.
"""

import os
import weakref

import numpy as np
from jax._src import core as jcore
from jax._src.config import trace_context as _trace_context

from .. import core as _core
from ..caches import Cache, RepeatCache
from ..caches import staging as _staging
from ..core import Aval, aval_of
from ..errors import FunctxError
from .eval import compile_ahead, compiled
from .staging import Const, Eqn, Graph, StagingInterpreter, Var, holds_alone_call

MAX_STEPS = 1024  # steps a queue holds before it runs them
# A queue structure whose program no flush asked for during this many
# transform calls is not compiled when the compile thread reaches it (a
# warm-up's structure the calls have moved past: NOTE [bounded caches])
STALE_CALLS = 4

try:  # the typed constants JAX's own code passes (jnp.mean's divisor, ...)
    from jax._src import literals as _literals

    CONSTANT_TYPES = frozenset(getattr(_literals, n) for n in (
        "TypedNdArray", "TypedFloat", "TypedInt", "TypedComplex") if hasattr(_literals, n))
except ImportError:  # pragma: no cover - a JAX without them
    CONSTANT_TYPES = frozenset()


# Python numbers a step may take (a jitted JAX function's scalar argument,
# as `jnp.where(mask, 2.0, 1.0)` passes): concrete, weakly typed, and
# program inputs like arrays (a new value is not a new program).
PY_SCALARS = frozenset((float, int, bool, complex))


def jax_avals(xs):
    """JAX's avals of a step's inputs (arrays, Pendings, JAX's typed
    constants, Python numbers): part of the keys of steps and programs."""
    try:
        return tuple([x.aval for x in xs])
    except AttributeError:  # a Python number among them
        return tuple(aval_of(x) if type(x) in PY_SCALARS else x.aval for x in xs)


def input_aval(x):
    """functx's Aval of a step's input: a concrete array, a Pending, or one
    of JAX's typed constants (whose weak type JAX's `.aval` tells)."""
    if type(x) is Pending:
        return x.faval
    if type(x) in CONSTANT_TYPES:
        a = x.aval
        return Aval(a.shape, a.dtype, a.weak_type)
    return aval_of(x)


class Pending:
    """The output of a queued step, until its queue runs (`force`)."""

    __slots__ = ("aval", "faval", "value", "queue", "index", "__weakref__")

    def __init__(self, queue, index, aval, faval):
        self.queue = queue
        self.index = index  # position among the queue's outputs
        self.aval = aval  # JAX's ShapedArray, equal to the computed array's .aval
        self.faval = faval  # functx's Aval
        self.value = None

    # what compile_ahead's specs read
    @property
    def shape(self):
        return self.faval.shape

    @property
    def dtype(self):
        return self.faval.dtype

    @property
    def weak_type(self):
        return self.faval.weak_type

    def force(self):
        v = self.value
        if v is None:
            self.queue.flush()
            v = self.value
            if v is None:  # its queue was abandoned by an exception mid-run
                raise FunctxError(
                    f"functx internal error: a deferred eager value "
                    f"({self.faval.str_short()}) was lost when an earlier step failed; "
                    "call the transform again.")
        return v


def value(x):
    """`x`, or the value of a Pending (running its queue if needed)."""
    return x.force() if type(x) is Pending else x


def values(xs):
    return [x.force() if type(x) is Pending else x for x in xs]


class StepOutputs:
    """What a queue needs of a compiled step: `fn` runs it, `graph` is what
    it computes (inlined into a flush's program), `avals`/`favals` its
    outputs' avals."""

    __slots__ = ("fn", "graph", "avals", "favals", "__weakref__")

    def __init__(self, fn, graph):
        self.fn = fn
        self.graph = graph
        self.favals = [aval for aval in _output_avals(graph)]
        self.avals = [jcore.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
                      for a in self.favals]


def _output_avals(graph):
    return [x.aval for x in graph.outputs]


class Literal:
    """A scalar constant of JAX's own code (a `CONSTANT_TYPES` value, e.g.
    the 0 of relu or jnp.mean's divisor) as a step input: part of the
    queue's key by value, so the program holds it as a constant."""

    __slots__ = ("value", "key")

    def __init__(self, value):
        self.value = value
        a = value.aval
        self.key = (a.dtype, a.weak_type, np.asarray(value).tobytes())

    def __eq__(self, other):
        return type(other) is Literal and self.key == other.key

    def __hash__(self):
        return hash(self.key)


class Queue:
    """The steps an interpreter has deferred and not run yet."""

    __slots__ = ("steps", "inputs", "outs", "index", "call", "spec")

    def __init__(self):
        # (StepOutputs, refs): a ref is an earlier output (int >= 0), an
        # input (int < 0) or a Literal
        self.steps = []
        self.inputs = []  # the concrete values the steps read, each once
        self.index = {}  # id(input) -> its ref
        self.outs = []  # weakrefs to every Pending, in order
        # NOTE [speculative first program]: (transform, the call's argument
        # leaves) until the first flush of a top-level call's queue, and the
        # program dispatched ahead for it (program, inputs, outputs)
        self.call = None
        self.spec = None

    def top_call(self, transform, leaves):
        """Mark this queue as that of a top-level eager call of `transform`
        on argument leaves `leaves` (NOTE [speculative first program])."""
        if not _core._state.stack and SPECULATE:
            self.call = (transform, leaves)

    def defer(self, step, args):
        """Queue `step` applied to `args` (concrete arrays, JAX's constants
        or Pendings); returns its outputs as Pendings."""
        if self.call is not None and not self.steps:
            self.spec = _speculate(self.call, step)
        refs = []
        for a in args:
            t = type(a)
            if t is Pending:
                if a.value is None and a.queue is self:
                    refs.append(a.index)
                    continue
                a = a.force()
            elif t in CONSTANT_TYPES and getattr(a, "ndim", 0) == 0:
                refs.append(Literal(a))
                continue
            r = self.index.get(id(a))
            if r is None:  # the same array twice is one input (XLA sees it is shared)
                self.inputs.append(a)
                r = self.index[id(a)] = -len(self.inputs)
            refs.append(r)
        self.steps.append((step, tuple(refs)))
        outs = self.outs
        n = len(outs)
        avals = step.avals
        if len(avals) == 1:
            p = Pending(self, n, avals[0], step.favals[0])
            outs.append(weakref.ref(p))
            pending = [p]
        else:  # a plain loop: this runs for every queued step
            favals = step.favals
            pending = []
            for k in range(len(avals)):
                p = Pending(self, n + k, avals[k], favals[k])
                pending.append(p)
                outs.append(weakref.ref(p))
        if len(self.steps) >= MAX_STEPS:
            self.flush()
        return pending

    def flush(self):
        """Run every queued step, giving each live Pending its value."""
        steps = self.steps
        if not steps:
            return
        inputs, outs = self.inputs, self.outs
        self.steps, self.inputs, self.outs, self.index = [], [], [], {}
        call, spec = self.call, self.spec
        self.call = self.spec = None
        live = [r() for r in outs]
        program = None
        if (len(steps) > 1 or len(steps[0][0].graph.eqns) > 1) and not _holds_alone_call(steps):
            # (else one dispatch already, or a call that must run alone:
            # NOTE [a jitted function differentiated alone] in primitives/call.py)
            mask = tuple(p is not None for p in live)
            in_avals = jax_avals(inputs)
            key = (tuple(steps), in_avals, mask)
            try:
                program = _programs.get(key, lambda: _build(steps, inputs, mask),
                                        hold=_staging())
            except TypeError:  # unhashable step parameters
                pass
        if program is not None:
            if (spec is not None and spec[0] is program and _same(spec[1], inputs)
                    and spec[4] == _trace_context()):
                _speculation[0] += 1
                result = spec[2]
            else:
                if spec is not None:
                    _missed(spec)
                result = program(*inputs)
            _assign([p for p in live if p is not None], result)
            if call is not None:
                _note_plan(call, steps[0][0], program, inputs, in_avals)
            return
        if spec is not None:
            _missed(spec)
        elif call is not None:  # another structure in between: no longer in a row
            plan = _plans.entries.get((call[0], id(steps[0][0]), len(call[1])))
            if plan is not None:
                plan.seen = 0
        # one step at a time (each primitive by its own program), dropping
        # each dead output after its last reader
        _assign(live, _run_steps(steps, inputs, live))


def _holds_alone_call(steps):
    return any(holds_alone_call(step.graph) for step, _ in steps)


def _run_steps(steps, inputs, live):
    """The queued steps run one at a time: every output, None for those
    dropped after their last reader."""
    last_read = {}
    for j, (_, refs) in enumerate(steps):
        for r in refs:
            if type(r) is int and r >= 0:
                last_read[r] = j
    done_at = {}
    computed = []

    def arg(r):
        if type(r) is int:
            return inputs[-1 - r] if r < 0 else computed[r]
        return r.value

    for j, (step, refs) in enumerate(steps):
        first = len(computed)
        computed.extend(step.fn(*[arg(r) for r in refs]))
        for r in range(first, len(computed)):
            if live[r] is None:
                done_at.setdefault(last_read.get(r, j), []).append(r)
        for r in done_at.pop(j, ()):
            computed[r] = None
    return computed


def _assign(pendings, vals):
    for p, v in zip(pendings, vals, strict=True):
        if p is not None:
            p.value = v


# queue structure -> compiled program; NOTE [bounded caches]
_programs = RepeatCache("deferred steps", after=1, limit=1024, byte_limit=384 << 20, stale_after=64,
                        stale_calls=STALE_CALLS,
                        doc="eager transforms: one compiled program per run of queued steps "
                            "(NOTE [deferred eager steps])")


# NOTE [speculative first program]
# An eager call's Python (the interpreters' rules, queueing each step)
# takes about as long as a small program runs: the ensemble row of
# benchmarks/run.py spends 1.4 ms of Python before its one 6.6 ms program
# is dispatched, and the two add up. Research loops call the same
# transformed function on new arguments of the same shapes, and every
# workload of benchmarks/run.py runs one program per call. So a top-level
# eager call's queue (`Queue.top_call`: the transform knows the call's
# argument leaves) remembers, at its first flush, a *plan*: the program it
# ran and where each of its inputs came from (an argument leaf by
# position, or an object held weakly: a closure's array, a Python number
# by value). Once two calls in a row flushed the same plan, the next call
# dispatches that program at its first queued step, on the inputs the plan
# names, before its Python has run; the program runs on XLA's threads while
# the Python queues the steps. At the flush, the speculative outputs are
# used only if the queue compiled to the very same program object (the
# same steps, avals and live outputs: the key of `_programs`) and its
# inputs are the very same objects, in order, under the same JAX tracing
# options (a `jax.default_matmul_precision` context entered mid-call would
# make jax.jit trace the program anew): then the program would be
# called on exactly those arguments, and programs of queued steps are pure
# (effectful primitives are never queued), so the outputs are the ones
# the flush would compute, bit for bit. Otherwise they are dropped and the
# flush dispatches as before (counted in `cache_info()["eager plans"]`);
# the plan must then be seen twice in a row again, so a function whose
# structure changes from call to call wastes at most one program run per
# change. Plans are keyed by the transform, the first step (weakly held)
# and the number of argument leaves; `FUNCTX_SPECULATE=0` turns this off.
SPECULATE = os.environ.get("FUNCTX_SPECULATE", "1") != "0"
SPECULATE_AFTER = 2  # calls in a row that flushed the same plan
_speculation = [0, 0]  # hits, misses


class Plan:
    """What a top-level call's first flush ran: `program` (weakly held),
    `origins` of its inputs (an int: an argument leaf's position; a
    1-tuple: a Python number; a weak reference: any other object), their
    avals, and how many calls in a row flushed it."""

    __slots__ = ("step", "program", "origins", "avals", "seen")

    def __init__(self, step, program, origins, avals):
        self.step = weakref.ref(step)
        self.program = weakref.ref(program)
        self.origins = origins
        self.avals = avals
        self.seen = 1


def _plans_info():
    return dict(Cache.info(_plans), speculative_hits=_speculation[0],
                speculative_misses=_speculation[1])


_plans = Cache("eager plans", limit=256,
               doc="eager transforms: the program a top-level call ran first and where its "
                   "inputs came from, to dispatch it ahead (NOTE [speculative first program])")
_plans.info = _plans_info


def _same(xs, ys):
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x is not y:
            return False
    return True


def _origin(x, positions):
    i = positions.get(id(x))
    if i is not None:
        return i
    if type(x) in PY_SCALARS:
        return (x,)
    try:
        return weakref.ref(x)
    except TypeError:
        return None


def _same_origin(a, b):
    if type(a) is not type(b):
        return False
    if type(a) is weakref.ref:
        x = a()
        return x is not None and x is b()
    if type(a) is tuple:
        return a[0] is b[0]
    return a == b


def _note_plan(call, step, program, inputs, avals):
    """Remember (or confirm) the plan of a top-level call's first flush."""
    transform, leaves = call
    positions = {id(x): i for i, x in enumerate(leaves)}
    origins = []
    for x in inputs:
        o = _origin(x, positions)
        if o is None:
            return
        origins.append(o)
    key = (transform, id(step), len(leaves))
    plan = _plans.get(key)
    if (plan is not None and plan.step() is step and plan.program() is program
            and plan.avals == avals and len(plan.origins) == len(origins)
            and all(map(_same_origin, plan.origins, origins))):
        plan.seen += 1
        return
    try:
        _plans.put(key, Plan(step, program, origins, avals))
    except TypeError:  # a program that cannot be held weakly
        pass


def _missed(spec):
    """A program dispatched ahead for nothing: its plan must be confirmed
    by two calls in a row again."""
    _speculation[1] += 1
    spec[3].seen = 0


def _speculate(call, step):
    """At a top-level call's first queued step: dispatch the program of its
    plan, if two calls in a row ran it, on the inputs the plan names;
    (program, inputs, outputs, plan, JAX's tracing options), or None."""
    transform, leaves = call
    plan = _plans.get((transform, id(step), len(leaves)))
    if plan is None or plan.seen < SPECULATE_AFTER or plan.step() is not step:
        return None
    program = plan.program()
    if program is None or not all_eager():
        return None
    inputs = []
    for o in plan.origins:
        if type(o) is int:
            x = leaves[o]
        elif type(o) is tuple:
            x = o[0]
        else:
            x = o()
            if x is None:
                return None
        inputs.append(x)
    try:
        if jax_avals(inputs) != plan.avals:
            return None
    except AttributeError:  # a leaf that is not an array (a NumPy array)
        return None
    try:
        return program, inputs, program(*inputs), plan, _trace_context()
    except Exception:  # noqa: BLE001 - only ahead of time: the flush runs it again and reports
        return None


def _build(steps, inputs, mask):
    """The queued steps inlined into one compiled graph of the concrete
    inputs, returning the outputs `mask` marks live; and its compile
    function."""
    avals = [input_aval(x) for x in inputs]
    in_vars = [Var(a) for a in avals]
    computed = []
    eqns = []
    for step, refs in steps:
        graph = step.graph
        env = {}
        for v, r in zip(graph.inputs, refs, strict=True):
            if type(r) is not int:
                env[v] = Const(r.value, input_aval(r.value))
            else:
                env[v] = in_vars[-1 - r] if r < 0 else computed[r]
        for eqn in graph.eqns:
            ins = [env[x] if type(x) is Var else x for x in eqn.inputs]
            new = [Var(o.aval) for o in eqn.outputs]
            env.update(zip(eqn.outputs, new))
            eqns.append(Eqn(eqn.prim, ins, new, eqn.params))
        computed.extend(env[x] if type(x) is Var else x for x in graph.outputs)
    outputs = [c for c, m in zip(computed, mask) if m]
    program = compiled(Graph(in_vars, eqns, outputs), "functx_deferred", eager=True)
    return program, compile_ahead(program, *avals)


# NOTE [fused steps above another transform]
# A fused step (NOTE [eager reverse mode in few dispatches]) is queued only
# by the lowest interpreter, whose values are arrays. A reverse interpreter
# above another eager one (the inner `grad` of `vmap(grad(f))`, MAML's
# inner steps) has the lower interpreter's tracers as primals: there it
# used to run the primitive's jvp rule in Python, which binds each
# primitive the rule computes the output and residuals with to the
# interpreters below, one at a time. Once the fused step is staged, it
# binds the step's primal part instead, as one `jit_call` named as an eager
# step (`bind_eager_call`), and copies the tangent part onto its tape as
# the lowest interpreter does: each interpreter below handles one call (a
# cached batched graph, a fused step of its own) and the lowest one queues
# it. Only while every interpreter is eager (nothing staging, no JAX trace
# around), as for staged backward passes. The graphs the lower
# interpreters derive from the call (its batch, its jvp) are staged on the
# compile thread the first time, and that call takes the rule instead
# (`_derived` in primitives/call.py), so no call stages them on the calling
# thread. The results are the same as the rule's: the same primitives
# applied to the same values (tests compare them bit for bit).
#
# vmap above another transform keeps its rules: binding its batched step
# as a call measured no fewer Python calls than the rules (MAML's middle
# vmap, whose rules are single primitives: the lower interpreter's cost of
# a call is that of the primitive).


def all_eager():
    """Is every interpreter on the stack eager (none staging, no JAX trace
    around the stack)?"""
    stack = _core._state.stack
    if not stack or type(stack[0].jax_trace) is not jcore.EvalTrace:
        return False
    for interp in stack:
        if isinstance(interp, StagingInterpreter):
            return False
    return True


_call_module = None


def bind_eager_call(graph, args, backward):
    """`graph` applied to `args` (values of the enclosing eager transforms)
    as one `jit_call` of an eager backward pass or step (primitives/call.py):
    its outputs, or None while a graph that those transforms derive from it
    is being staged on the compile thread (the caller then takes its other
    path)."""
    global _call_module
    if _call_module is None:
        from ..primitives import call

        _call_module = call
    call = _call_module
    mark = call._binding  # call.binding_eager, inline: this runs for every step
    was = getattr(mark, "on", False)
    mark.on = True
    try:
        return _core.bind(call.jit_call, *args, graph=graph,
                          name=call.EAGER_BACKWARD if backward else call.EAGER_STEP)
    except call.DerivedGraphNotReady:
        return None
    finally:
        mark.on = was
