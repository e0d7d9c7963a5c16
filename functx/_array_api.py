"""Operators, methods, properties and indexing of functx values.

A functx value behaves like a jax.Array: arithmetic operators go through
functx.numpy (direct primitive binding where possible); every other method
and property runs jax.Array's own implementation through lifting, so the
semantics are JAX's. Indexing splits the index into static parts (ints,
slices, None, Ellipsis) and arrays, so staged indexing programs are cached.
"""

import jax
import numpy as np

from . import numpy as fnp
from .core import Tracer
from .lifting import call_lifted

# --------------------------------------------------------------------------
# Operators


def _binop(fn, name):
    def forward(self, other):
        return fn(self, other)

    def reflected(self, other):
        return fn(other, self)

    forward.__name__ = f"__{name}__"
    reflected.__name__ = f"__r{name}__"
    return forward, reflected


_BINOPS = {
    "add": fnp.add, "sub": fnp.subtract, "mul": fnp.multiply, "truediv": fnp.true_divide,
    "floordiv": fnp.floor_divide, "mod": fnp.remainder, "matmul": fnp.matmul,
    "and": fnp.bitwise_and, "or": fnp.bitwise_or, "xor": fnp.bitwise_xor,
    "lshift": fnp.left_shift, "rshift": fnp.right_shift, "divmod": fnp.divmod,
    "pow": fnp.power,
}
_COMPARISONS = {
    "eq": fnp.equal, "ne": fnp.not_equal, "lt": fnp.less, "le": fnp.less_equal,
    "gt": fnp.greater, "ge": fnp.greater_equal,
}


def attach_operators(cls):
    """Give `cls` (functx values, autograd tensors) jax.Array's operators,
    each the functx.numpy function."""
    for name, fn in _BINOPS.items():
        forward, reflected = _binop(fn, name)
        setattr(cls, f"__{name}__", forward)
        setattr(cls, f"__r{name}__", reflected)
    for name, fn in _COMPARISONS.items():
        setattr(cls, f"__{name}__", _binop(fn, name)[0])
    cls.__neg__ = lambda self: fnp.negative(self)
    cls.__pos__ = lambda self: self
    cls.__abs__ = lambda self: fnp.abs(self)
    cls.__invert__ = lambda self: fnp.invert(self)
    cls.__round__ = lambda self, ndigits=None: fnp.round(self, ndigits or 0)


def _pow(self, other):
    if type(other) is int and self.aval.dtype.kind == "f" and not self.aval.weak_type:
        from .primitives.elementwise import integer_pow

        return integer_pow(self, other)
    return fnp.power(self, other)


attach_operators(Tracer)
Tracer.__pow__ = _pow  # x ** 3 as lax.integer_pow, as JAX does

# --------------------------------------------------------------------------
# Methods and properties: jax.Array's own, lifted

_callers = {}


def _method_caller(name):
    """A stable (cacheable) function calling jax.Array method `name`."""
    fn = _callers.get(name)
    if fn is None:
        def fn(x, *args, **kwargs):
            return getattr(x, name)(*args, **kwargs)

        fn.__name__ = name
        _callers[name] = fn
    return fn


def _method(name):
    caller = _method_caller(name)

    def method(self, *args, **kwargs):
        return call_lifted(caller, (self,) + args, kwargs)

    method.__name__ = name
    method.__doc__ = f"Like jax.Array.{name}."
    return method


_METHODS = (
    "all any argmax argmin argpartition argsort astype choose clip compress conj "
    "conjugate cumprod cumsum diagonal dot flatten max mean min nonzero prod ptp "
    "ravel repeat reshape round searchsorted sort squeeze std sum swapaxes take "
    "trace transpose var view"
).split()
for _name in _METHODS:
    setattr(Tracer, _name, _method(_name))


def _sum(self, *args, **kwargs):  # functx.numpy's sum: one reduce_sum where it can
    return fnp.sum(self, *args, **kwargs)


_sum.__doc__ = "Like jax.Array.sum."
Tracer.sum = _sum

_prop_callers = {}


def _property_caller(name):
    """A stable (cacheable) function reading jax.Array property `name`."""
    fn = _prop_callers.get(name)
    if fn is None:
        def fn(x):
            return getattr(x, name)

        fn.__name__ = name
        _prop_callers[name] = fn
    return fn


def _property(name):
    getter_fn = _property_caller(name)

    def getter(self):
        return call_lifted(getter_fn, (self,), {})

    return property(getter, doc=f"Like jax.Array.{name}.")


for _name in ("T", "mT", "real", "imag"):
    setattr(Tracer, _name, _property(_name))


def _iter(self):
    if not self.shape:
        from .errors import FunctxTypeError

        raise FunctxTypeError("iteration over a 0-d functx value")
    for i in range(self.shape[0]):
        yield self[i]


Tracer.__iter__ = _iter

# --------------------------------------------------------------------------
# Indexing and .at[]

_DYNAMIC = (Tracer, jax.Array, np.ndarray)


def split_index(idx):
    """Split an index into a hashable static spec and a list of array parts."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    spec = []
    arrays = []
    for e in idx:
        if isinstance(e, slice):
            spec.append(("slice", _static_int(e.start), _static_int(e.stop), _static_int(e.step)))
        elif isinstance(e, _DYNAMIC):
            spec.append(("array", len(arrays)))
            arrays.append(e)
        elif isinstance(e, (list, tuple)):
            spec.append(("array", len(arrays)))
            arrays.append(np.asarray(e))
        elif e is None:
            spec.append(("none",))
        elif e is Ellipsis:
            spec.append(("ellipsis",))
        else:
            spec.append(("static", e))
    return tuple(spec), arrays


def _static_int(v):
    if v is None or isinstance(v, (int, np.integer)):
        return v
    return int(v)  # a concrete functx scalar under grad/jvp


def build_index(spec, arrays):
    out = []
    for entry in spec:
        kind = entry[0]
        if kind == "slice":
            out.append(slice(entry[1], entry[2], entry[3]))
        elif kind == "array":
            out.append(arrays[entry[1]])
        elif kind == "none":
            out.append(None)
        elif kind == "ellipsis":
            out.append(Ellipsis)
        else:
            out.append(entry[1])
    return tuple(out)


def _getitem_impl(x, arrays, spec):
    return x[build_index(spec, arrays)]


def _getitem(self, idx):
    spec, arrays = split_index(idx)
    return call_lifted(_getitem_impl, (self, arrays, spec), {})


Tracer.__getitem__ = _getitem


def _at_impl(x, arrays, spec, method, args, kwargs):
    return getattr(x.at[build_index(spec, arrays)], method)(*args, **kwargs)


class _AtRef:
    __slots__ = ("value", "idx")

    def __init__(self, value, idx):
        self.value = value
        self.idx = idx

    def _apply(self, method, *args, **kwargs):
        spec, arrays = split_index(self.idx)
        return call_lifted(_at_impl, (self.value, arrays, spec, method, args, kwargs), {})

    def get(self, **kwargs):
        return self._apply("get", **kwargs)

    def set(self, values, **kwargs):
        return self._apply("set", values, **kwargs)

    def add(self, values, **kwargs):
        return self._apply("add", values, **kwargs)

    def subtract(self, values, **kwargs):
        return self._apply("subtract", values, **kwargs)

    def multiply(self, values, **kwargs):
        return self._apply("multiply", values, **kwargs)

    mul = multiply

    def divide(self, values, **kwargs):
        return self._apply("divide", values, **kwargs)

    def power(self, values, **kwargs):
        return self._apply("power", values, **kwargs)

    def min(self, values, **kwargs):
        return self._apply("min", values, **kwargs)

    def max(self, values, **kwargs):
        return self._apply("max", values, **kwargs)

    def apply(self, func, **kwargs):
        """x.at[idx].apply(func): func applied to the indexed elements
        (NOTE [scatter with an update computation] in primitives/indexing.py)."""
        return self._apply("apply", func, **kwargs)


class _AtIndexer:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __getitem__(self, idx):
        return _AtRef(self.value, idx)


Tracer.at = property(lambda self: _AtIndexer(self), doc="Functional updates, like jax.Array.at.")
