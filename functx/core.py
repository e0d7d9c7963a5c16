"""The heart of functx: abstract values, primitives, tracers and the
interpreter stack.

NOTE [levels]
Every transform call pushes a fresh interpreter on a thread-local stack; its
level is its depth in that stack. A tracer belongs to exactly one interpreter.
`bind` hands a primitive to the highest-level interpreter among the tracers in
its arguments; every other argument is, for that interpreter, a constant
(its derivative is zero, it is not batched, ...). That single test
(`tracer._interp is self` inside the interpreters) is the whole guard against
perturbation confusion: in `grad(lambda x: grad(lambda y: x * y)(1.0))(2.0)`
the inner grad sees `x` as a constant. When no argument is a tracer the
primitive runs on the JAX values directly (interpreters/eval.py), so values
at the bottom may be concrete arrays or JAX tracers.

NOTE [escaped tracers]
An interpreter is usable only on the thread that runs its transform, and
only until the transform returns: `interp.thread` is that thread's ident
while it runs and None once it returned. Every place that meets a tracer
(`bind`, conversion to a Python value, the no-op shortcuts that return an
operand unchanged, a transform's inputs and outputs) calls `check_usable`,
so a dead tracer, or one of another thread's transform, raises
EscapedTracerError naming the transform (and the threads) instead of being
treated as a constant or passed through. A tracer has no pickled form, and
copying it (copy / deepcopy) gives the tracer itself: a value traced by a
transform exists only inside it, and a copy must die with it.

One exception: a tracer that stands for a plain value (`value_after_exit`
is not NO_VALUE: eager reverse mode's queued results with no derivative,
which JAX would have returned as arrays) is that value once its transform
has returned: used then, it is replaced by the value, never by a constant
of a dead transform.
"""

import contextlib
import threading
from threading import get_ident as _get_ident
from time import perf_counter as _perf_counter

import jax
import numpy as np
from jax import dtypes as _jax_dtypes
from jax._src.core import set_current_trace as _set_jax_trace
from jax._src.core import trace_ctx as _jax_trace_ctx

from . import caches as _caches
from . import xla_cpu as _xla_cpu
from .errors import (
    ConcretizationError,
    EscapedTracerError,
    IndexConcretizationError,
    JaxOnFunctxValueError,
    MissingRuleError,
    describe_user_line,
)

# --------------------------------------------------------------------------
# Abstract values


_DTYPE_SHORT = {"b": "bool", "f": "f", "i": "i", "u": "u", "c": "c", "V": "float0"}


class Aval:
    """The abstract value of an array: shape, dtype and JAX's weak-type flag."""

    __slots__ = ("shape", "dtype", "weak_type")

    def __init__(self, shape, dtype, weak_type=False):
        self.shape = shape
        self.dtype = dtype
        self.weak_type = weak_type

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def update(self, shape=None, dtype=None, weak_type=None):
        return Aval(
            self.shape if shape is None else tuple(shape),
            self.dtype if dtype is None else dtype,
            self.weak_type if weak_type is None else weak_type,
        )

    def to_jax(self):
        return jax.ShapeDtypeStruct(self.shape, self.dtype, weak_type=self.weak_type)

    def str_short(self):
        if not isinstance(self.dtype, np.dtype):  # an extended dtype: key<fry>
            return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"
        kind = self.dtype.kind
        if kind == "b":
            name = "bool"
        elif kind in "fiuc":
            name = f"{kind}{self.dtype.itemsize * 8}"
            if self.dtype.name == "bfloat16":
                name = "bf16"
        else:
            name = self.dtype.name
        return f"{name}[{','.join(map(str, self.shape))}]"

    def __eq__(self, other):
        return (
            isinstance(other, Aval)
            and self.shape == other.shape
            and self.dtype == other.dtype
            and self.weak_type == other.weak_type
        )

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type))

    def __repr__(self):
        return f"Aval({self.str_short()}{', weak' if self.weak_type else ''})"


_ArrayImpl = type(jax.numpy.zeros(()))
_JaxTracer = jax.core.Tracer
_JaxArray = jax.Array


# NOTE [key dtypes]
# JAX's new-style PRNG keys (`jax.random.key(0)`) are arrays of an extended
# dtype, `key<impl>`, that is not a NumPy dtype (no `.kind`; np.issubdtype
# rejects it). functx treats them as ordinary array values: they have an
# Aval, flow through the random primitives (primitives/random_prims.py) and
# the structural ones (reshape, transpose, broadcast, slice, concatenate,
# select, ...), and vmap moves their axes like any other. They are never
# differentiated: every primitive gives a key output a symbolic Zero
# tangent, transforms refuse keys as differentiated inputs (as they refuse
# integers), and a key tangent that must be returned to the user is
# materialised as float0 zeros, JAX's tangent type for keys
# (transforms/_args.zeros_for), never as an array of keys. Old-style raw
# keys (`jax.random.PRNGKey(0)`, uint32[2]) are plain integer arrays.


def is_key_dtype(dtype):
    """Is `dtype` a JAX PRNG key dtype (NOTE [key dtypes])?"""
    return not isinstance(dtype, np.dtype) and _jax_dtypes.issubdtype(dtype, _jax_dtypes.prng_key)


# NOTE [differentiable dtypes]
# Every inexact dtype JAX differentiates is differentiable in functx:
# float64/32/16, bfloat16 and the float8 types (ml_dtypes' types, whose NumPy
# kind is 'V', so `np.issubdtype(d, np.inexact)` is False for them) and the
# complex types. These helpers are the only place that question is answered;
# every rule, transform and check asks them.


_DTYPE_CLASS = {}  # dtype -> (inexact, real floating, complex)


def _dtype_class(dtype):
    try:
        return _DTYPE_CLASS[dtype]
    except KeyError:
        pass
    except TypeError:  # an unhashable stand-in for a dtype
        dtype = np.dtype(dtype)
    if is_key_dtype(dtype):
        c = (False, False, False)
    else:
        c = tuple(bool(_jax_dtypes.issubdtype(dtype, k))
                  for k in (np.inexact, np.floating, np.complexfloating))
    if len(_DTYPE_CLASS) < 256:  # dtypes are few; the bound is for safety
        _DTYPE_CLASS[dtype] = c
    return c


def is_inexact_dtype(dtype):
    """Is `dtype` differentiable: a real or complex floating dtype, bfloat16
    and float8 included (NOTE [differentiable dtypes])?"""
    return _dtype_class(dtype)[0]


def is_real_float_dtype(dtype):
    """Is `dtype` a real floating dtype, bfloat16 and float8 included?"""
    return _dtype_class(dtype)[1]


def is_complex_dtype(dtype):
    """Is `dtype` a complex floating dtype?"""
    return _dtype_class(dtype)[2]


def canonical_dtype(dtype):
    return _jax_dtypes.canonicalize_dtype(dtype)


def host_to_jax(x, dtype=None):
    """A NumPy array or Python number as `jnp.asarray(x, dtype)` gives it
    (the same dtype and weak type), copied to the device without a program:
    `jnp.asarray` compiles one for each new shape (12 ms on a CPU in JAX
    0.10), which eager calls would pay on every new input shape. While JAX
    traces, `jnp.asarray` as is."""
    if dtype is not None:
        x = np.asarray(x, dtype)
    if _jax_top_level():
        return jax.device_put(x)
    return jax.numpy.asarray(x)


def jax_zeros(shape, dtype):
    """`jnp.zeros(shape, dtype)`, copied from the host at the top level (as
    `host_to_jax`, no program per shape); while JAX traces, the broadcast
    (not a constant of the whole array); keys as `jnp.zeros` makes them."""
    if _jax_top_level() and not is_key_dtype(dtype):
        return jax.device_put(np.zeros(shape, dtype))
    return jax.numpy.zeros(shape, dtype)


_jax_top_level = getattr(_jax_trace_ctx, "is_top_level", lambda: False)


def aval_of(x):
    """The Aval of any value functx accepts: its tracers, JAX arrays and
    tracers, NumPy arrays and Python scalars."""
    if type(x) in TRACER_TYPES:
        return x.aval
    if type(x) is _ArrayImpl or isinstance(x, _JaxTracer):
        a = x.aval
        return Aval(a.shape, a.dtype, a.weak_type)
    if isinstance(x, _JaxArray):  # key arrays (NOTE [key dtypes])
        a = x.aval
        return Aval(a.shape, a.dtype, a.weak_type)
    if isinstance(x, (np.ndarray, np.generic)):
        return Aval(x.shape, canonical_dtype(x.dtype), False)
    if isinstance(x, (bool, np.bool_)):
        return Aval((), np.dtype(bool), False)
    if isinstance(x, int):
        return Aval((), canonical_dtype(np.int64), True)
    if isinstance(x, float):
        return Aval((), canonical_dtype(np.float64), True)
    if isinstance(x, complex):
        return Aval((), canonical_dtype(np.complex128), True)
    if isinstance(x, jax.ShapeDtypeStruct):
        return Aval(x.shape, x.dtype, bool(getattr(x, "weak_type", False)))
    from .errors import FunctxTypeError

    raise FunctxTypeError(
        f"functx: a value of type {type(x).__name__} is not an array. "
        "Pass JAX arrays, NumPy arrays or Python scalars."
    )


# --------------------------------------------------------------------------
# Symbolic zeros


class Zero:
    """A symbolic zero tangent or cotangent of the given Aval.

    Rules skip work on it; it is turned into an array (`instantiate`) only
    when a transform returns it to the user. `Zero.of(x)` defers computing
    the Aval of `x` until a rule asks for it (most never do).
    """

    __slots__ = ("_aval", "_of")

    def __init__(self, aval):
        self._aval = aval
        self._of = None

    @staticmethod
    def of(x):
        z = Zero.__new__(Zero)
        z._aval = None
        z._of = x
        return z

    @property
    def aval(self):
        if self._aval is None:
            self._aval = aval_of(self._of)
            self._of = None
        return self._aval

    def __repr__(self):
        return f"Zero({self.aval.str_short()})"


# --------------------------------------------------------------------------
# Primitives


PRIMITIVES = {}  # name -> Primitive
FROM_JAX = {}  # jax primitive -> functx Primitive (used when lifting jaxprs)


class Primitive:
    """A named operation. Its rules live in one table per interpreter
    (interpreters/*.py); each primitive module fills them in next to the
    primitive's definition."""

    __slots__ = ("name", "jax", "multiple_results", "effectful", "__weakref__")

    def __init__(self, name, jax_primitive=None, multiple_results=False, effectful=False):
        self.name = name
        self.jax = jax_primitive
        self.multiple_results = multiple_results
        # An effect (a callback, a print): its equations are kept by dead-code
        # elimination even when nothing uses their outputs.
        self.effectful = effectful
        PRIMITIVES[name] = self
        if jax_primitive is not None:
            FROM_JAX[jax_primitive] = self

    # NOTE [named axes] (functx/primitives/collectives.py): a collective
    # (psum, axis_index, ...) must be processed by the vmap that names its
    # axis even when none of its operands is batched there; such a
    # primitive sets this and implements `axis_interpreter`.
    binds_axis_names = False

    def bind(self, *args, **params):
        return bind(self, *args, **params)

    def __repr__(self):
        return self.name


def missing_rule(prim, transform, hint=""):
    return MissingRuleError(
        f"{transform}: primitive `{prim.name}` has no {transform} rule, so "
        f"functx cannot apply {transform} to a function that uses it. "
        + (hint or "Rewrite that part with operations functx supports, or file "
           "an issue naming the primitive and the transform.")
    )


# --------------------------------------------------------------------------
# Interpreters and the stack


class _ThreadState(threading.local):
    def __init__(self):
        self.stack = []
        # NOTE [grad modes] (functx/autograd/grad_mode.py): differentiation
        # interpreters at a level <= no_grad_level do not differentiate;
        # -1 when no no_grad / set_grad_enabled(False) is active.
        self.no_grad_level = -1


_state = _ThreadState()


def interpreter_stack():
    """The interpreters active on this thread, innermost last."""
    return _state.stack


class Interpreter:
    """Base class of the transform interpreters (jvp, reverse, batching,
    staging). Subclasses implement `process`."""

    transform = "transform"

    def __init__(self):
        self.level = 0
        self.thread = _get_ident()  # NOTE [escaped tracers]
        # The JAX trace its values live in: a JAX primitive bound on them
        # under a newer JAX trace sees them as constants (NOTE [JAX on
        # functx values] in functx/interop.py).
        self.jax_trace = _jax_trace_ctx.trace

    @property
    def alive(self):
        """Has the transform not returned yet? (It may still be another
        thread's: NOTE [escaped tracers].)"""
        return self.thread is not None

    @alive.setter
    def alive(self, value):
        self.thread = _get_ident() if value else None

    def process(self, prim, args, params):
        raise NotImplementedError

    def release(self):
        """Called when the interpreter's transform returns: drop what it
        holds that its results do not need."""

    def concrete(self, tracer):
        """The value a tracer stands for, for Python control flow; raise if
        the interpreter cannot give one."""
        raise ConcretizationError(
            f"{self.transform}: a traced value was converted to a Python "
            f"value at {describe_user_line()}, but under {self.transform} it "
            "has no concrete value. Use functx.numpy.where or functx.lax.cond "
            "instead of Python control flow on traced values."
        )

    def __repr__(self):
        return f"{type(self).__name__}(level={self.level}{'' if self.alive else ', dead'})"


@contextlib.contextmanager
def new_interpreter(interp):
    """Push `interp` on this thread's stack for the duration of a transform;
    mark it dead afterwards (NOTE [escaped tracers])."""
    stack = _state.stack
    ident = _get_ident()
    if not stack and ident != _caches.compile_thread:
        _caches.calls_begun += 1  # a call begins: the clock of stale builds (caches.py)
        if _caches.calls_begun == 1:
            _xla_cpu.ask_ahead()
    interp.level = len(stack) + 1
    interp.thread = ident
    interp.jax_trace = _jax_trace_ctx.trace  # NOTE [JAX on functx values]
    stack.append(interp)
    busy[ident] = len(stack)
    try:
        yield interp
    finally:
        interp.alive = False
        stack.remove(interp)
        if stack:
            busy[ident] = len(stack)
        else:
            busy.pop(ident, None)
            if ident != _caches.compile_thread:
                _caches.last_call_end = _perf_counter()
        interp.release()


# thread id -> depth of its interpreter stack, for threads running a
# transform now: the compile thread waits for them (NOTE [bounded caches]).
busy = {}


def _escaped(tracer, prim):
    interp = tracer._interp
    what = f"used by `{prim.name}`" if prim is not None else "used"
    if interp.thread is not None:
        return EscapedTracerError(
            f"{interp.transform}: a value traced by {interp.transform} on thread "
            f"{_thread_name(interp.thread)} was {what} on thread "
            f"{_thread_name(_get_ident())} (at {describe_user_line()}). A transform "
            "traces only the thread that calls it: compute with the value inside "
            "the function running on that thread, or give the other thread "
            "concrete arrays (the transform's results) and run the transform there."
        )
    return EscapedTracerError(
        f"{interp.transform}: a value traced by {interp.transform} escaped "
        f"from the transformed function and was {what} after "
        f"{interp.transform} returned (at {describe_user_line()}). Values "
        "computed inside a transform are only valid until it returns: return "
        "them from the function (use has_aux=True for extra outputs) instead "
        "of storing them in globals, lists or closures."
    )


NO_VALUE = object()  # Tracer.value_after_exit: not a plain value


def _thread_name(ident):
    for t in threading.enumerate():
        if t.ident == ident:
            return f"'{t.name}'"
    return str(ident)


def check_usable(x, prim=None):
    """Raise EscapedTracerError if `x` is a tracer of a transform that has
    returned or that runs on another thread (NOTE [escaped tracers]);
    return `x` (or the plain value a returned tracer stands for)."""
    if type(x) in TRACER_TYPES and x._interp.thread != _get_ident():
        return _after_exit(x, prim)
    return x


def _after_exit(x, prim):
    """The value of `x`, a tracer not usable here, if it stands for a plain
    value and its transform has returned; else the escaped-tracer error."""
    if x._interp.thread is None:
        v = x.value_after_exit()
        if v is not NO_VALUE:
            return v
    raise _escaped(x, prim)


def check_tree_usable(tree, what=None):
    """check_usable on every leaf of a pytree (a transform's inputs or
    outputs)."""
    ident = _get_ident()
    for leaf in jax.tree_util.tree_leaves(tree):
        if type(leaf) in TRACER_TYPES and leaf._interp.thread != ident:
            _after_exit(leaf, what)
    return tree


# NOTE [profiler hook]: None, or set by functx.autograd.profiler while a
# profile is active: `eager_hook(what, fn, args, params=None)` runs and
# times `fn(*args, **params)`. Each place that dispatches eager work (bind
# below, the compiled steps and the backward pass in interpreters/reverse.py
# and batching.py) tests it once, so unprofiled code pays one lookup.
eager_hook = None


def bind(prim, /, *args, **params):
    """Apply `prim` to `args`: hand it to the top interpreter among the
    arguments, or run it on JAX values when there is none (NOTE [levels])."""
    top = None
    ident = None
    for a in args:
        if type(a) in TRACER_TYPES:
            interp = a._interp
            if interp.thread != (ident or (ident := _get_ident())):  # NOTE [escaped tracers]
                return bind(prim, *[check_usable(x, prim) for x in args], **params)
            if top is None or interp.level > top.level:
                top = interp
    if prim.binds_axis_names:  # NOTE [named axes]
        top = prim.axis_interpreter(top, args, params)
    if top is None:
        try:
            impl = impl_rules[prim]
        except KeyError:
            raise missing_rule(prim, "eval") from None
        if eager_hook is not None:
            return eager_hook(prim, impl, args, params)
        return impl(*args, **params)
    if top.jax_trace is not _jax_trace_ctx.trace:
        return _bind_under_newer_jax_trace(top, prim, args, params)
    return top.process(prim, args, params)


def _bind_under_newer_jax_trace(top, prim, args, params):
    """NOTE [JAX on functx values]: a functx primitive met while JAX traces
    something begun inside the transform (a jax.lax loop body, a branch).
    A value of that trace among the operands makes the functx values
    constants of the JAX trace (JAX binds). Otherwise the functx values
    are computed on at their own level, in the JAX context their transform
    runs in, so nothing of the newer trace leaks into them."""
    cur = _jax_trace_ctx.trace
    for a in args:
        if isinstance(a, _JaxTracer) and a._trace is cur:
            if prim.jax is None:
                raise missing_rule(prim, "JAX tracing", hint=(
                    "This functx primitive has no JAX counterpart, so it cannot be staged "
                    "into the JAX program being traced. Use functx.lax control flow, or "
                    "functx.lift the JAX function."))
            return prim.jax.bind(*args, **params)
    with _set_jax_trace(top.jax_trace):
        return top.process(prim, args, params)


# --------------------------------------------------------------------------
# Tracers


class ImperativeValue:
    """Base of functx.autograd.Tensor (NOTE [imperative mode] in
    functx/autograd/imperative.py): not a transform value, but a call of a
    JAX function through functx (functx.numpy, `lift`) with one among its
    arguments is handed to the class's `apply(fn, args, kwargs)`."""

    __slots__ = ()

    @staticmethod
    def apply(fn, args, kwargs):
        raise NotImplementedError


class _NoPlacement:
    """A jax.Array attribute about placement (sharding, device, ...) that a
    functx value, like a JAX tracer, does not have: AttributeError, so JAX's
    `hasattr(x, "sharding")` tests take their tracer branch."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        raise AttributeError(
            f"a functx value ({obj.aval.str_short()}) has no `{self.name}`: it is "
            "traced by a transform. Ask the transform's result."
        )


TRACER_TYPES = set()  # every subclass of Tracer (filled by __init_subclass__)


class _TracerMeta(type(jax.Array)):
    """jax.Array's metaclass answers `isinstance` in C++ for JAX's own types
    (slowly for others); functx's tracer classes answer as plain classes."""

    __instancecheck__ = type.__instancecheck__
    __subclasscheck__ = type.__subclasscheck__


class Tracer(jax.Array, metaclass=_TracerMeta):
    """A functx value inside a transform. It behaves like a jax.Array
    (operators, methods and indexing are attached by functx._array_api) and
    is one for `isinstance` (NOTE [JAX on functx values] in interop.py).

    `isinstance(x, Tracer)` goes through jax.Array's metaclass (slower than
    a plain class's); hot paths test `type(x) in TRACER_TYPES` instead."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        TRACER_TYPES.add(cls)

    __slots__ = ("_interp",)
    __array_priority__ = 1000
    sharding = committed = device = devices = _NoPlacement()
    addressable_data = addressable_shards = global_shards = _NoPlacement()
    is_fully_addressable = is_fully_replicated = _NoPlacement()
    copy_to_host_async = to_device = _NoPlacement()
    __array_ufunc__ = None  # make NumPy defer to our reflected operators
    __hash__ = None

    @property
    def aval(self):
        raise NotImplementedError

    @property
    def shape(self):
        return self.aval.shape

    @property
    def dtype(self):
        return self.aval.dtype

    @property
    def ndim(self):
        return len(self.aval.shape)

    @property
    def size(self):
        return self.aval.size

    @property
    def weak_type(self):
        return self.aval.weak_type

    @property
    def itemsize(self):
        return np.dtype(self.aval.dtype).itemsize

    @property
    def nbytes(self):
        return self.aval.size * self.itemsize

    def __len__(self):
        if not self.shape:
            from .errors import FunctxTypeError

            raise FunctxTypeError("len() of a 0-d functx value")
        return self.shape[0]

    def _concrete(self):
        if self._interp.thread != _get_ident():
            return _after_exit(self, None)
        return self._interp.concrete(self)

    def value_after_exit(self):
        """The plain value this tracer stands for once its transform has
        returned, or NO_VALUE (NOTE [escaped tracers])."""
        return NO_VALUE

    # NOTE [escaped tracers]: a copy is the tracer itself; no pickled form.
    def __copy__(self):
        return check_usable(self)

    def __deepcopy__(self, memo):
        return check_usable(self)

    def __reduce__(self):
        check_usable(self)
        raise ConcretizationError(
            f"{self._interp.transform}: a traced value ({self.aval.str_short()}) cannot "
            f"be pickled (at {describe_user_line()}): it exists only while "
            f"{self._interp.transform} runs. Pickle the transform's results instead."
        )

    def __bool__(self):
        return bool(self._concrete())

    def __int__(self):
        return int(self._concrete())

    def __float__(self):
        return float(self._concrete())

    def __complex__(self):
        return complex(self._concrete())

    def __index__(self):
        try:
            value = self._concrete()
        except IndexConcretizationError:
            raise
        except ConcretizationError as e:
            raise IndexConcretizationError(str(e)) from None
        return _index(value)

    def item(self):
        v = self._concrete()
        return v.item() if hasattr(v, "item") else v

    def __array__(self, *args, **kwargs):
        raise jax_misuse_error(self)

    def __repr__(self):
        interp = self._interp
        return (
            f"{type(self).__name__}<{self.aval.str_short()}>"
            f"({interp.transform}, level={interp.level}"
            f"{'' if interp.alive else ', escaped'})"
        )

    __str__ = __repr__


def _index(v):
    import operator

    return operator.index(v)


def jax_misuse_error(value=None):
    if isinstance(value, Tracer) and value._interp.thread != _get_ident():
        return _escaped(value, None)  # NOTE [escaped tracers]
    where = describe_user_line()
    if isinstance(value, ImperativeValue):
        return JaxOnFunctxValueError(
            f"An autograd.Tensor was passed to a JAX or NumPy function at {where}. "
            "JAX functions do not record operations on tensors. Use functx.numpy / "
            "functx.nn / functx.lax, or wrap the JAX function with functx.lift(fn); "
            "pass `t.array` to use the array outside the graph."
        )
    what = f" ({value.aval.str_short()})" if isinstance(value, Tracer) else ""
    return JaxOnFunctxValueError(
        f"A functx value{what} was converted to a NumPy array at {where} "
        "(a NumPy function, np.asarray, or code that calls them). NumPy cannot "
        "carry the transform through, so the derivative or batch would be lost. "
        "Use jax.numpy or functx.numpy for this computation (JAX code works on "
        "functx values as it is), or do it outside the transform."
    )



from .interpreters.eval import impl_rules  # noqa: E402  (bottom of the stack)
