"""Lifting: running JAX functions on functx values.

NOTE [lifting]
`lift(fn)` makes any JAX function callable on functx values. With no functx
value among the arguments it simply calls `fn`. Otherwise it stages `fn` to
a jaxpr with `jax.make_jaxpr` on the arguments' abstract values, and replays
the jaxpr's equations as functx primitives (each JAX primitive maps to the
functx primitive of the same name and parameters), so every functx transform
sees through it. The staged program is cached per argument structure,
shapes, dtypes, static (non-array) arguments and JAX's tracing options
(`config.trace_context()`, as jax.jit keys its caches: a
`jax.default_matmul_precision` context is baked into the products a jaxpr
holds), so a second call with the same kinds of arguments costs only the
replay. A `jax.custom_jvp` / `jax.custom_vjp` object among the static
arguments (the `self` of its lifted `__call__`) is keyed by identity, held
weakly, and its entry remembers the rules the object held when it was staged
(`_rules_of`): `defjvp` / `defvjp` on the same object replace its rules, and
the next call stages it again, replacing the entry (JAX's eager transforms
read the rules at every call too).

Replaying inlines `closed_call` / `checkpoint` (remat) equations, and `jit`
equations except where the transforms run eagerly: there each is one
`jit_call` (NOTE [JAX's jit programs stay calls] in interop.py).
Equations whose parameters hold sub-programs (control flow, custom
derivative rules) are translated once, when the program is built, by the
rule their primitive module registers in `LIFT_RULES`: it turns the JAX
parameters (jaxprs) into a functx primitive and functx parameters (graphs).
An equation whose primitive functx does not know still runs when none of its
inputs is a functx value; otherwise it raises an error naming the primitive.
"""

import types
import weakref

import jax
import jax.extend.core
import numpy as np
from jax import tree_util
from jax._src import config as jconfig
from jax._src import core as jcore
from jax._src import custom_derivatives as jcustom

from . import caches
from .core import (
    FROM_JAX, TRACER_TYPES, Aval, ImperativeValue, Tracer, aval_of, bind, check_usable,
)
from .errors import FunctxTypeError, MissingRuleError

def _inlined_program(name, params):
    """The program of an equation that lifting inlines (`_INLINE_PARAM`)."""
    try:
        return params[_INLINE_PARAM[name]]
    except KeyError:  # a release that names it otherwise (jax 0.12's composite)
        return params["call_jaxpr"]


_INLINE_PARAM = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "checkpoint": "jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    # lax.composite: a named call whose meaning is its decomposition
    # (its program is `call_jaxpr` from jax 0.12 on: _inlined_program)
    "composite": "jaxpr",
}


# JAX primitive name -> translate(params) -> (functx primitive, functx params)
# or (Macro, params).
# Consulted before inlining, so a module may take over e.g. custom_jvp_call.
# Each translate function has a `primitive` attribute naming the functx
# primitive it produces (read by functx.coverage). One with a true
# `takes_operands` attribute is called as translate(params, operands): per
# equation input, the jaxpr variables naming it (the input's variable, then
# those it stands for in the jaxprs the equation was inlined from), and last
# the JAX tracer it is where it is a constant of the program (closed over
# from an enclosing jax.jit) or an input standing for one (`in_tracers`);
# so a rule JAX traces later can tell which input a tracer it closes over is.
LIFT_RULES = {}


def graph_of_jaxpr(closed_jaxpr, in_tracers=None):
    """A functx Graph of a JAX ClosedJaxpr (its equations replayed as functx
    primitives, sub-programs translated recursively). The graph has one
    input per jaxpr input; the jaxpr's constants become graph constants.
    `in_tracers`, where given, names per jaxpr input the JAX tracer it
    stands for, or None (see `Program`)."""
    from .interpreters.staging import stage

    program = Program(closed_jaxpr, in_tracers)
    in_avals = [Aval(v.aval.shape, v.aval.dtype, v.aval.weak_type)
                for v in closed_jaxpr.jaxpr.invars]
    graph, captured = stage(lambda *xs: program(xs), in_avals, transform="lift")
    assert not captured, "a jaxpr's constants are concrete"
    return graph


class Program:
    """A jaxpr flattened for fast replay: every value lives in one slot of an
    environment list; `instrs` are (functx primitive or None, JAX primitive,
    input slots, output slots, params). `in_tracers`: per jaxpr input, None
    or the JAX tracer it replaces (a constant, a tracer of a finished trace,
    that a lifted rule made an input), given to `takes_operands` rules among
    the names of that input."""

    __slots__ = ("env0", "inputs", "outputs", "instrs")

    def __init__(self, closed_jaxpr, in_tracers=None):
        self.env0 = []
        self.instrs = []

        def new_slot(value=None):
            self.env0.append(value)
            return len(self.env0) - 1

        def slot_of(v, scope):
            if isinstance(v, jcore.Literal):
                if v.aval.weak_type:  # a Python scalar in the JAX code: keep it weak
                    from .primitives.common import scalar_constant

                    return new_slot(scalar_constant(v.val, v.aval.dtype, True))
                return new_slot(v.val)
            return scope[v]

        # An inlined jaxpr's input -> the outer operand bound to it; a
        # constant's variable -> the constant, where it is a JAX tracer.
        outer = {}

        def aliases_of(v):
            names = []
            while isinstance(v, jcore.Var) and v not in names:
                names.append(v)
                v = outer.get(v)
            if isinstance(v, jcore.Tracer) or type(v) in TRACER_TYPES:
                names.append(v)
            return tuple(names)

        def flatten(jaxpr, consts, in_slots, in_atoms=None):
            scope = {}
            for v, c in zip(jaxpr.constvars, consts, strict=True):
                scope[v] = new_slot(c)
                if isinstance(c, jcore.Tracer) or type(c) in TRACER_TYPES:
                    outer[v] = c
            for v, s in zip(jaxpr.invars, in_slots, strict=True):
                scope[v] = s
            if in_atoms is not None:
                for v, a in zip(jaxpr.invars, in_atoms):
                    if isinstance(a, jcore.Var):
                        outer[v] = a
            for eqn in jaxpr.eqns:
                ins = [slot_of(v, scope) for v in eqn.invars]
                name = eqn.primitive.name
                translate = LIFT_RULES.get(name)
                if translate is not None:
                    if getattr(translate, "takes_operands", False):
                        fx, params = translate(dict(eqn.params),
                                               [aliases_of(v) for v in eqn.invars])
                    else:
                        fx, params = translate(dict(eqn.params))
                    outs = [new_slot() for _ in eqn.outvars]
                    for v, s in zip(eqn.outvars, outs):
                        if not isinstance(v, jcore.DropVar):
                            scope[v] = s
                    if isinstance(fx, Macro):  # replayed by calling it
                        self.instrs.append((None, fx, ins, outs, params))
                    else:
                        self.instrs.append((fx, eqn.primitive, ins, outs, params))
                    continue
                if name in _INLINE_PARAM:
                    sub = _inlined_program(name, eqn.params)
                    call = None
                    if name in _AS_CALL and isinstance(sub, jax.extend.core.ClosedJaxpr):
                        # NOTE [JAX's jit programs stay calls], decided at
                        # replay: this instruction, or the inlined ones after it
                        call = len(self.instrs)
                        self.instrs.append(None)
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        sub_jaxpr, sub_consts = sub.jaxpr, sub.consts
                    else:
                        sub_jaxpr, sub_consts = sub, []
                    outs = flatten(sub_jaxpr, sub_consts, ins, eqn.invars)
                    for v, s in zip(eqn.outvars, outs, strict=True):
                        scope[v] = s
                    if call is not None:
                        inlined = len(self.instrs) - call - 1
                        self.instrs[call] = (None, _JitCall(sub, eqn.params, inlined), ins, outs,
                                             {})
                    continue
                outs = [new_slot() for _ in eqn.outvars]
                for v, s in zip(eqn.outvars, outs):
                    if not isinstance(v, jcore.DropVar):
                        scope[v] = s
                fx = FROM_JAX.get(eqn.primitive)
                if fx is None:  # NOTE [foreign primitives]
                    from .primitives.foreign import foreign

                    fx = foreign(eqn.primitive)
                self.instrs.append((fx, eqn.primitive, ins, outs, dict(eqn.params)))
            return [slot_of(v, scope) for v in jaxpr.outvars]

        jaxpr = closed_jaxpr.jaxpr
        for v, c in zip(jaxpr.invars, in_tracers or ()):
            if c is not None:
                outer[v] = c
        self.inputs = [new_slot() for _ in jaxpr.invars]
        self.outputs = flatten(jaxpr, closed_jaxpr.consts, self.inputs)

    def __call__(self, args):
        env = list(self.env0)
        for s, a in zip(self.inputs, args):
            env[s] = a
        instrs = iter(self.instrs)
        for fx, jp, ins, outs, params in instrs:
            vals = [env[i] for i in ins]
            if fx is None:
                if type(jp) is _JitCall:
                    out = jp.call(vals)
                    if out is None:  # the inlined instructions follow
                        continue
                    for s, o in zip(outs, out, strict=True):
                        env[s] = o
                    for _ in range(jp.inlined):
                        next(instrs)
                    continue
                out = _foreign(jp, vals, params)
                multiple = jp.multiple_results
            else:
                out = bind(fx, *vals, **params)
                multiple = fx.multiple_results
            if multiple:
                for s, o in zip(outs, out):
                    env[s] = o
            else:
                env[outs[0]] = out
        return [env[s] for s in self.outputs]


_AS_CALL = ("jit", "pjit")


class _JitCall:
    """A `jit` equation in a replayed jaxpr (NOTE [JAX's jit programs stay
    calls] in interop.py): one functx `jit_call` of its graph when the
    transforms run eagerly, else its equations, inlined after this
    instruction (`inlined` of them)."""

    __slots__ = ("closed", "name", "inlined", "callable")

    def __init__(self, closed, params, inlined):
        self.closed = closed
        self.name = str(params.get("name", "jit"))
        self.inlined = inlined
        # a program closing over traced values (JAX's or functx's) is inlined
        self.callable = not any(isinstance(c, (jcore.Tracer, Tracer)) for c in closed.consts)

    def call(self, vals):
        """The call's outputs, or None: run the inlined equations."""
        from . import interop

        if self.callable and interop._eager():
            graph = interop._call_graph(self.closed)
            if graph is not None:
                from .primitives.call import call_name, jax_call_name

                return bind(interop._jit_call(), *vals, graph=graph,
                            name=call_name(jax_call_name(self.name)))
        return None


class Macro:
    """What a `LIFT_RULES` translation may return instead of a primitive:
    `fn(*inputs, **params) -> list of outputs`, written with functx
    primitives (for an equation that is several functx primitives)."""

    __slots__ = ("fn",)
    multiple_results = True

    def __init__(self, fn):
        self.fn = fn


def _foreign(jax_prim, vals, params):
    """An equation of a JAX primitive functx has no definition for (or a
    translation's Macro)."""
    if type(jax_prim) is Macro:
        return jax_prim.fn(*vals, **params)
    for v in vals:
        if isinstance(v, Tracer):
            raise MissingRuleError(
                f"lift: the JAX primitive `{jax_prim.name}` reached a functx "
                f"transform ({v._interp.transform}), but functx has no rules for it. "
                "Rewrite that part with functx.numpy / functx.lax operations, or "
                "file an issue naming the primitive."
            )
    return jax_prim.bind(*vals, **params)


# --------------------------------------------------------------------------
# The cache of staged programs

# NOTE [bounded caches] (functx/caches.py): an LRU; a plain Python function
# among the static leaves (the lifted function itself) is held weakly.
#
# NOTE [lifted functions keyed by what they read]
# JAX runs a function's Python at every eager call (a jax.custom_vjp
# function and its rules, a function under jax.grad), so a global or a
# closed-over value changed between calls is seen by the next one. functx
# stages a lifted function once per key, so the key must hold what the
# staged program baked in: a user function among the leaves (the function
# `functx.lift` wraps, a jax.custom_jvp / custom_vjp object's function and
# rules) is keyed by the snapshot functx.lax takes of a loop body (NOTE
# [staged bodies: one graph per code and closure] in functx/snapshot.py): its
# code, and what its closure, defaults and globals hold, walked into the
# functions and objects among them; arrays among those by identity (held
# weakly), since the staged program holds them as constants; a list or
# dict by identity and the arrays in it by identity (a log the function
# appends to does not restage it; numbers changed inside one are assumed
# unchanged, as jax.jit assumes). A function reading a reassigned global
# array, a rule redefined with `defvjp`, a rule reading a changed number
# are staged anew; a function whose reads
# cannot be walked (too many values, a `nonlocal` assignment) is keyed by
# identity, as jax.jit keys a function. Library functions (JAX's, functx's)
# are keyed by identity and not walked. A user function is keyed by its
# identity too (held weakly), so its entry goes when it does, as before.
#
# A program of a custom function holds the custom object's rules (JAX's
# equation keeps them, and they usually call the object), so a key naming
# the object weakly would never let it die while the entry lives: one
# defined anew at every call (inside the function being differentiated)
# would keep every call's closure until the cache's bound. So the program
# of a custom object with rules of user code is cached only when its key is
# met a second time (`_SEEN`, holding keys alone): one defined per call is
# staged per call, as JAX traces it per call, and holds nothing afterwards.
#
# A user function that reads concrete arrays (a global model a training
# loop replaces at every step) would be staged anew whenever one of them is
# replaced: 5 ms a call for a small MLP's loss under `grad`, against JAX
# eager's 3.5 ms. So where lax's snapshot can rebuild the function (NOTE
# [staged bodies: one graph per code and closure]), it is staged with a
# copy of itself holding JAX's tracers in place of those arrays, which
# become inputs of the program: the key holds their shapes and dtypes, and
# each call passes the arrays it finds. Where that staging fails (Python
# control flow on such an array) the function is staged as written, keyed
# as above, and the key is remembered (`_AS_WRITTEN`). Staged as written,
# Python control flow on a concrete array still fails (functx stages
# operations on constants, NOTE [callbacks run when the program runs]);
# JAX's eager call computes it, so such a function is staged with
# operations on constants evaluated, for that call only.
_CACHE = caches.Cache("lifted programs", limit=2048,
                      doc="functx.lift / JAX code on functx values: one staged program per "
                          "function, static arguments and input avals")
_AS_WRITTEN = caches.Cache("lifted functions staged as written", limit=512,
                           doc="lifted functions whose arrays could not be staged as inputs")
_JaxArray = jax.Array
_FunctionType = types.FunctionType


def _is_dynamic(leaf):
    return isinstance(leaf, (Tracer, _JaxArray, np.ndarray))


def _trampoline(fn, args, kwargs):
    return fn(*args, **kwargs)


def call_lifted(fn, args, kwargs, replay=False, rebuild=True):
    """Call the JAX function `fn(*args, **kwargs)`, where the arguments may
    hold functx values or autograd tensors (NOTE [lifting]).

    On concrete arrays alone `fn` runs as JAX runs it, unless `replay`: then
    it is staged and replayed as functx primitives there too. Rules borrowed
    from JAX (NOTE [rules borrowed from JAX]) replay, so that an eager
    transform's first sighting of a primitive runs the very per-primitive
    programs its staged step graphs run later (NOTE [deferred eager
    steps]), instead of JAX's own eager programs of the same operations,
    which the next call would compile again in functx's form. Without
    `rebuild`, the arrays user functions read are constants of the program
    (NOTE [lifted functions keyed by what they read])."""
    leaves, treedef = tree_util.tree_flatten((fn, args, kwargs))
    has_tracer = False
    for leaf in leaves:
        if isinstance(leaf, ImperativeValue):
            return type(leaf).apply(fn, args, kwargs)
        if type(leaf) in TRACER_TYPES:
            check_usable(leaf)  # NOTE [escaped tracers]: also where nothing is computed
            has_tracer = True
    if not has_tracer and not replay:
        return fn(*args, **kwargs)
    key_parts = []
    dynamic = []
    customs = []
    rebuilt = []  # (leaf index, snapshot): user functions whose arrays are inputs
    user = False  # a custom object with rules of user code among the leaves
    for leaf in leaves:
        if type(leaf) in TRACER_TYPES:
            dynamic.append(leaf)
            key_parts.append(leaf.aval)
        elif isinstance(leaf, (_JaxArray, np.ndarray)):
            dynamic.append(leaf)
            key_parts.append(aval_of(leaf))
        elif type(leaf) is _FunctionType:
            part = _reads_key(leaf)
            if rebuild and type(part) is _ReadsKey and part.arrays:
                inputs = _arrays_as_inputs(leaf)
                if inputs is not None:
                    part = inputs[0]
                    rebuilt.append((len(key_parts), inputs[1]))
            key_parts.append(part)
        elif isinstance(leaf, _CUSTOM_TYPES):  # NOTE [lifting]: checked on a hit
            part = _reads_key(leaf)
            user = user or type(part) is _ReadsKey
            key_parts.append(part)
            customs.append(leaf)
        else:
            key_parts.append(_StaticKey(leaf))
    # JAX's tracing options in force (`jax.default_matmul_precision`,
    # x64, dtype and rank promotion, ...): the jaxpr bakes them in, and
    # jax.jit keys its own caches on them (NOTE [JAX options off the
    # calling thread] in caches.py)
    key = (treedef, tuple(key_parts), caches.options_id())
    try:
        entry = _CACHE.get(key)
        if rebuilt and entry is None and _AS_WRITTEN.get(key) is not None:
            return _as_written(fn, args, kwargs, replay)
    except TypeError:  # an unhashable static argument: stage without caching
        key, entry = None, None
    if entry is not None and entry.rules is not None and not _same_rules(entry.rules, customs):
        entry = None  # rules redefined since it was staged: staged again, replacing it
    for _, snap in rebuilt:
        dynamic.extend(snap.arrays)
    if entry is None:
        try:
            entry, cacheable = _stage(treedef, leaves, key_parts, rebuilt)
        except Exception as e:  # noqa: BLE001 - retried below (outside, for a clean traceback)
            if not rebuilt and not isinstance(e, _CONCRETIZATION):
                raise
        if entry is None and rebuilt:  # retried as written, which raises the user's errors
            if key is not None:
                _AS_WRITTEN.put(key, True)
            return _as_written(fn, args, kwargs, replay)
        if entry is None:
            # Python control flow on a concrete array the function reads,
            # which JAX's eager call computes: staged with operations on
            # constants evaluated, for this call only (it may hold a
            # callback, which must run at every call)
            entry, _ = _stage(treedef, leaves, key_parts, fold=True)
            return entry(dynamic)
        if key is not None and cacheable and (not user or _seen_before(key)):
            if customs:
                entry.rules = _held_rules(customs)
            _CACHE.put(key, entry)
    return entry(dynamic)


def _arrays_as_inputs(fn):
    """`(key part, snapshot)` staging the concrete arrays a user function
    reads as inputs (NOTE [lifted functions keyed by what they read]), or
    None where the snapshot cannot rebuild it."""
    from .snapshot import _snapshot

    snap = _snapshot(fn)
    if snap is None or not snap.arrays or not all(
            isinstance(a, (_JaxArray, np.ndarray)) and not isinstance(a, jcore.Tracer)
            for a in snap.arrays):
        return None
    try:
        return _ReadsKey(("inputs", snap.key), (), weakref.ref(fn)), snap
    except TypeError:  # an unhashable part
        return None


def _as_written(fn, args, kwargs, replay):
    """`call_lifted` with the arrays functions read as constants."""
    return call_lifted(fn, args, kwargs, replay, rebuild=False)


def _seen_before(key):
    """Was `key` staged before? (NOTE [lifted functions keyed by what they
    read]: a program of user code is cached at its second sighting.)"""
    if key in _SEEN.entries:
        _SEEN.pop(key)
        return True
    _SEEN.put(key, True)
    return False


_SEEN = caches.Cache("lifted user code seen once", limit=4096,
                     doc="functx.lift / JAX custom functions: keys of user code staged once "
                         "(held weakly), cached when met again")


_CUSTOM_TYPES = (jcustom.custom_jvp, jcustom.custom_vjp)


def _rules_of(obj):
    """What `defjvp` / `defvjp` set on a jax.custom_jvp / custom_vjp object
    (jax._src.custom_derivatives keeps them as plain attributes), and its
    function."""
    d = obj.__dict__
    if isinstance(obj, jcustom.custom_vjp):
        return (d.get("fun"), d.get("fwd"), d.get("bwd"), d.get("symbolic_zeros"),
                d.get("optimize_remat"))
    return (d.get("fun"), d.get("jvp"), d.get("symbolic_zeros"))


def _held_rules(customs):
    """`_rules_of` each object, its functions held weakly where they can be
    (the staged program holds what it traced from them anyway)."""
    held = []
    for obj in customs:
        for r in _rules_of(obj):
            try:
                held.append(_WeakRule(r))
            except TypeError:  # not weakly referable: a bool, None, some callables
                held.append(r)
    return tuple(held)


class _WeakRule(weakref.ref):
    __slots__ = ()


def _same_rules(held, customs):
    """Do the objects hold, by identity, the rules they held when staged?"""
    i = 0
    for obj in customs:
        for r in _rules_of(obj):
            h = held[i]
            if type(h) is _WeakRule:
                h = h()
                if h is None:
                    return False
            if h is not r:
                return False
            i += 1
    return i == len(held)


class ByIdentity:
    """A cache key part compared by identity: a jaxpr (or its constants)
    held in a primitive's parameters, for caches of what is derived from it."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return type(other) is ByIdentity and self.obj is other.obj


class _StaticKey:
    """A static leaf in a cache key: compared by value where it hashes,
    by identity otherwise (numbers compare with their type, so 1 != 1.0)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value):
        self.value = value
        try:
            self._hash = hash((type(value), value))
        except TypeError:
            self._hash = id(value)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if type(self.value) is not type(other.value):
            return False
        try:
            return bool(self.value == other.value)
        except Exception:  # noqa: BLE001 - incomparable values are unequal
            return self.value is other.value


class _ReadsKey:
    """A cache key part for a user function or custom object: what it
    reads (NOTE [lifted functions keyed by what they read])."""

    __slots__ = ("key", "arrays", "fn", "_hash")

    def __init__(self, key, arrays, fn=None):
        self.key = key
        self.arrays = arrays  # weak references to the arrays read, in order
        self.fn = fn  # a weak reference to the function itself, or None
        self._hash = hash(key) if fn is None else hash((key, id(fn())))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if type(other) is not _ReadsKey or self.key != other.key:
            return False
        if self.fn is not None:
            f = self.fn()
            if f is None or other.fn is None or f is not other.fn():
                return False
        for a, b in zip(self.arrays, other.arrays):
            x = a()
            if x is None or x is not b():
                return False
        return True

    def weak_parts(self):
        """What the key names weakly, for `caches.Cache` to drop the entry
        once one of them dies (an entry never found again would hold the
        program, and the arrays it baked in, until evicted)."""
        from .snapshot import _Ident

        parts = [_Weak(r) for r in self.arrays]
        if self.fn is not None:
            parts.append(_Weak(self.fn))
        todo = [self.key]
        while todo:
            k = todo.pop()
            if type(k) is tuple:
                todo.extend(k)
            elif type(k) is _Ident and k.ref is not None:
                parts.append(_Weak(k.ref))
        return parts


class _Weak:
    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref


def _reads_key(obj):
    """The key part of a function or custom object among a lifted call's
    leaves (NOTE [lifted functions keyed by what they read])."""
    from .snapshot import _LIBRARY_TYPES, _is_library_function, _snapshot

    if type(obj) is _FunctionType:
        if _is_library_function(obj):
            return caches.WeakRef(obj)
    elif all(r is None or type(r) is bool or type(r) in _LIBRARY_TYPES
             or (type(r) is _FunctionType and _is_library_function(r)) for r in _rules_of(obj)):
        return caches.WeakRef(obj)  # jax.nn.relu: rules redefined are seen by `_same_rules`
    snap = _snapshot(obj, key_only=True)
    if snap is None:
        return caches.WeakRef(obj)
    try:
        arrays = tuple(weakref.ref(a) for a in snap.arrays)
        # a function also by identity: its program is cached at once and
        # dropped with it (a custom object's is cached at a second sighting)
        fn = weakref.ref(obj) if type(obj) is _FunctionType else None
        return _ReadsKey(snap.key, arrays, fn)
    except TypeError:  # an array that cannot be held weakly, or an unhashable part
        return caches.WeakRef(obj)


_CONCRETIZATION = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                   jax.errors.TracerIntegerConversionError)


def _stage(treedef, leaves, key_parts, rebuilt=(), fold=False):
    static = (_StaticKey, caches.WeakRef, _ReadsKey)
    positions = [i for i, k in enumerate(key_parts) if not isinstance(k, static)]
    template = [None if not isinstance(k, static) else leaf for leaf, k in zip(leaves, key_parts)]
    outputs = {}
    n = len(positions)

    def flat_fn(*dyn):
        filled = list(template)
        for i, v in zip(positions, dyn):
            filled[i] = v
        start = n
        for i, snap in rebuilt:  # the function with tracers in place of its arrays
            filled[i] = snap.rebuild(list(dyn[start:start + len(snap.arrays)]))
            start += len(snap.arrays)
        fn, args, kwargs = tree_util.tree_unflatten(treedef, filled)
        out_leaves, outputs["tree"] = tree_util.tree_flatten(fn(*args, **kwargs))
        # Non-array results (shapes, dtypes, Python numbers) are static:
        # kept as they are, outside the staged program.
        outputs["static"] = [None if isinstance(x, _JaxArray) else x for x in out_leaves]
        return [x for x in out_leaves if isinstance(x, _JaxArray)]

    avals = [key_parts[i].to_jax() for i in positions]
    avals += [aval_of(a).to_jax() for _, snap in rebuilt for a in snap.arrays]
    # Staged as written, also where functx's staging evaluates constants
    # eagerly (staging.stage): a callback of constants must stay an equation
    # (NOTE [callbacks run when the program runs] in primitives/callback.py).
    with jconfig.eager_constant_folding(fold):
        closed = jax.make_jaxpr(flat_fn)(*avals)
    # (a program holding a value of a transform, JAX's or functx's, is for this call only)
    cacheable = not any(isinstance(c, jcore.Tracer) or type(c) in TRACER_TYPES
                        for c in closed.consts)
    return _Staged(Program(closed), outputs["tree"], outputs["static"]), cacheable


class _Staged:
    """A cached staged function: its program and how to rebuild the output
    pytree from the program's array outputs and the static leaves."""

    __slots__ = ("program", "out_tree", "static", "rules")

    def __init__(self, program, out_tree, static):
        self.program = program
        self.out_tree = out_tree
        self.static = static
        self.rules = None  # NOTE [lifting]: `_held_rules` of the custom objects staged

    def __call__(self, dynamic):
        arrays = iter(self.program(dynamic))
        leaves = [next(arrays) if s is None else s for s in self.static]
        return tree_util.tree_unflatten(self.out_tree, leaves)


def lift(fn):
    """Make a JAX function callable on functx values.

    Args:
      fn (Callable): any function written with JAX (jax.numpy, jax.nn, jax.lax,
        an Equinox module, an optax loss, ...). Arrays inside `fn` itself (an
        Equinox module's weights) are treated as inputs too.

    Returns:
      Callable: A function with `fn`'s signature that accepts functx values as
      well as arrays. Without functx values among its arguments it just calls
      `fn`.

    Example:
      >>> import jax, functx
      >>> per_sample = functx.vmap(functx.lift(jax.grad(lambda w, x: (w * x).sum())),
      ...                          in_dims=(None, 0))
    """
    if not callable(fn):
        raise FunctxTypeError(
            f"lift(fn): expected a callable, got {type(fn).__name__}. Pass the JAX "
            "function itself, e.g. functx.lift(jax.nn.softplus)."
        )

    def lifted(*args, **kwargs):
        return call_lifted(fn, args, kwargs)

    lifted.__name__ = getattr(fn, "__name__", "lifted")
    lifted.__qualname__ = getattr(fn, "__qualname__", lifted.__name__)
    lifted.__doc__ = getattr(fn, "__doc__", None)
    lifted.__wrapped__ = fn
    return lifted
