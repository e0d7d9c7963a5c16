"""functx.numpy: a drop-in for jax.numpy that accepts functx values.

Every public function of `jax.numpy` is here with the same name, arguments
and results. Called without functx values it *is* the jax.numpy call; on
functx values it runs the jax.numpy function through `functx.lift` (NOTE
[lifting] in functx/lifting.py). The most common one-primitive functions
(elementwise math, arithmetic, comparisons) bind their primitive directly,
which skips the lifting cache lookup. Dtypes, constants and classes are
jax.numpy's own objects.
"""

import inspect as _inspect
import types as _types

import jax as _jax
import numpy as _np
import jax.numpy as _jnp
from jax._src.config import numpy_rank_promotion as _rank_promotion

from ..core import ImperativeValue as _ImperativeValue
from ..core import TRACER_TYPES as _TRACER_TYPES
from ..core import Tracer as _Tracer
from ..core import aval_of as _aval_of
from ..core import bind as _bind
from ..lifting import call_lifted as _call_lifted
from ..primitives import dot as _dot
from ..primitives import reductions as _reductions
from ..primitives import elementwise as _ew
from ..primitives import structural as _st
from ..primitives.common import scalar_constant as _scalar_constant


# NOTE [plain calls]: with no functx value among its arguments a functx.numpy
# function is the jax.numpy call plus one scan of the arguments, so eager
# code without transforms pays (nearly) nothing for functx (issue 3's eager
# target; `benchmarks/dispatch.py` measures it). The scan classifies each
# argument by its type, once per type: a functx value (or an autograd
# tensor), a list/tuple (also named tuples) or dict to look inside, or
# anything else, passed as it is.
_PLAIN, _TRACER, _SEQUENCE, _MAPPING = 0, 1, 2, 3
_TYPE_KINDS = {}


def _type_kind(t):
    kind = _TYPE_KINDS.get(t)
    if kind is None:
        if issubclass(t, (_Tracer, _ImperativeValue)):
            kind = _TRACER
        elif issubclass(t, (list, tuple)):
            kind = _SEQUENCE
        elif issubclass(t, dict):
            kind = _MAPPING
        else:
            kind = _PLAIN
        _TYPE_KINDS[t] = kind
    return kind


def _plain(values):
    """True when no functx value is among `values`, or inside the lists,
    tuples and dicts among them (NOTE [plain calls])."""
    for a in values:
        kind = _TYPE_KINDS.get(type(a))
        if kind is None:
            kind = _type_kind(type(a))
        if kind:
            if kind == _TRACER or not _plain(a.values() if kind == _MAPPING else a):
                return False
    return True


def _wrap(name, fn, namespace="jax.numpy"):
    def wrapper(*args, **kwargs):
        if _plain(args) and (not kwargs or _plain(kwargs.values())):
            return fn(*args, **kwargs)
        return _call_lifted(fn, args, kwargs)

    wrapper.__name__ = name
    wrapper.__qualname__ = name
    wrapper.__module__ = __name__
    wrapper.__doc__ = (
        f"functx version of `{namespace}.{name}`: the same arguments and results, "
        f"and it accepts functx values. See `{namespace}.{name}` for the details."
    )
    wrapper.__wrapped__ = fn
    return wrapper


def populate(target, source, namespace):
    """Fill `target` (a module's globals) with functx versions of `source`'s
    public functions; dtypes, classes and constants are re-exported."""
    names = []
    for name in dir(source):
        if name.startswith("_"):
            continue
        obj = getattr(source, name)
        if isinstance(obj, _types.ModuleType):
            continue
        if isinstance(obj, type) or not callable(obj):
            target[name] = obj
        else:
            target[name] = _wrap(name, obj, namespace)
            if isinstance(obj, _jnp.ufunc):
                _ufunc_methods(target[name], obj, namespace)
        names.append(name)
    return names


def _ufunc_methods(wrapper, ufunc, namespace):
    """A jax.numpy ufunc (`add`, `multiply`, ...) is an object with methods
    (`outer`, `reduce`, `accumulate`, `reduceat`, `at`) and properties
    (`nin`, `nout`, ...); its functx version has them too."""
    for attr in dir(ufunc):
        if attr.startswith("_"):
            continue
        value = getattr(ufunc, attr)
        if callable(value):
            value = _wrap(f"{wrapper.__name__}.{attr}", value, namespace)
        setattr(wrapper, attr, value)


__all__ = populate(globals(), _jnp, "jax.numpy")

# --------------------------------------------------------------------------
# Direct binding for one-primitive functions (same result as the jax.numpy
# function; checked in tests/test_numpy.py).

_UNARY = {
    "sin": _ew.sin, "cos": _ew.cos, "tan": lambda x: _ew.bind(_ew.tan_p, x, accuracy=None),
    "arcsin": _ew._plain(_ew.asin_p), "arccos": _ew._plain(_ew.acos_p),
    "arctan": _ew._plain(_ew.atan_p), "sinh": _ew.sinh, "cosh": _ew.cosh, "tanh": _ew.tanh,
    "arcsinh": _ew._plain(_ew.asinh_p), "arccosh": _ew._plain(_ew.acosh_p),
    "arctanh": _ew._plain(_ew.atanh_p), "exp": _ew.exp, "exp2": _ew._acc(_ew.exp2_p),
    "log": _ew.log, "log1p": _ew._acc(_ew.log1p_p), "expm1": _ew._acc(_ew.expm1_p),
    "sqrt": _ew.sqrt, "cbrt": _ew._acc(_ew.cbrt_p), "square": _ew.square,
    "negative": _ew.neg, "sign": _ew.sign, "floor": _ew.floor,
    "ceil": _ew._plain(_ew.ceil_p), "abs": _ew.abs, "absolute": _ew.abs,
}
_UNARY["acos"], _UNARY["asin"], _UNARY["atan"] = _UNARY["arccos"], _UNARY["arcsin"], _UNARY["arctan"]
_UNARY["acosh"], _UNARY["asinh"], _UNARY["atanh"] = _UNARY["arccosh"], _UNARY["arcsinh"], _UNARY["arctanh"]

_BINARY = {
    "add": _ew.add, "subtract": _ew.sub, "multiply": _ew.mul, "divide": _ew.div,
    "true_divide": _ew.div, "maximum": _ew.max, "minimum": _ew.min, "arctan2": _ew.atan2,
    "equal": _ew.eq, "not_equal": _ew.ne, "less": _ew.lt, "less_equal": _ew.le,
    "greater": _ew.gt, "greater_equal": _ew.ge,
}
_FLOAT_ONLY = {"divide", "true_divide", "arctan2"}


def _positional_only(fn, n):
    """True when `fn` takes exactly `n` positional-only arguments: then the
    fast function takes them alone, without *args/**kwargs, whose packing
    costs more than the rest of its check (NOTE [plain calls])."""
    try:
        params = list(_inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    # (a loop: this module's `all` is jax.numpy's)
    return len(params) == n and not [p for p in params if p.kind is not p.POSITIONAL_ONLY]


def _unary_fast(name, binder, slow):
    jax_fn = slow.__wrapped__

    def direct(x):
        if type(x) in _TRACER_TYPES:
            a = x.aval
            if _kind(a.dtype) == "f" and not a.weak_type:
                return binder(x)
        elif _TYPE_KINDS.get(type(x)) == _PLAIN:
            return jax_fn(x)
        return slow(x)

    def fn(x, *args, **kwargs):
        if not args and not kwargs:
            return direct(x)
        return slow(x, *args, **kwargs)

    return _fast(direct if _positional_only(jax_fn, 1) else fn, name, slow)


_PY_SCALARS = (int, float)


def _kind(dtype):
    """NumPy's dtype kind; "V" for extended dtypes such as JAX keys (no
    `.kind`; NOTE [key dtypes] in core.py), which take the lifted path."""
    return getattr(dtype, "kind", "V")


def binary_operands(x, y, float_only=False):
    """If `x op y` can go straight to the lax primitive (same dtype, no weak
    types; shapes that broadcast, or a Python scalar), the operands to
    pass; else None."""
    xt, yt = type(x) in _TRACER_TYPES, type(y) in _TRACER_TYPES
    if not (xt or yt):
        return None
    if xt and yt:
        xa, ya = x.aval, y.aval
        if _kind(xa.dtype) in "fiu" and xa.dtype == ya.dtype and not xa.weak_type and not ya.weak_type:
            if not float_only or xa.dtype.kind == "f":
                if xa.shape == ya.shape:
                    return x, y
                return _broadcast_operands(x, xa.shape, y, ya.shape)
        return None
    t, other = (x, y) if xt else (y, x)
    a = t.aval
    if a.weak_type:
        return None
    kind = _kind(a.dtype)
    if kind not in "fiu":
        return None
    if type(other) in _PY_SCALARS and (kind == "f" or (kind == "i" and type(other) is int and not float_only)):
        c = _scalar_constant(other, a.dtype)
        return (t, c) if xt else (c, t)
    if hasattr(other, "shape") and not isinstance(other, (_Tracer, _ImperativeValue)):
        oa = _aval_of(other)
        if oa.dtype == a.dtype and not oa.weak_type:
            if not float_only or kind == "f":
                if oa.shape == a.shape:
                    return x, y
                xs, ys = (a.shape, oa.shape) if xt else (oa.shape, a.shape)
                return _broadcast_operands(x, xs, y, ys)
    return None


def _broadcast_operands(x, xs, y, ys):
    """`x` and `y` (of shapes `xs`, `ys`) as jax.numpy hands them to a lax
    n-ary primitive: the one of lower rank given leading axes of size 1
    (`broadcast_in_dim`); axes of size 1 against others the primitive
    broadcasts itself. None where the shapes do not broadcast, or where the
    ranks differ and `jax_numpy_rank_promotion` is not "allow": the lifted
    call raises (or warns) as jax.numpy does."""
    nx, ny = len(xs), len(ys)
    n = nx if nx > ny else ny
    if nx != ny and _rank_promotion.value != "allow":  # jax.numpy warns or raises
        return None
    px, py = (1,) * (n - nx) + tuple(xs), (1,) * (n - ny) + tuple(ys)
    for a, b in zip(px, py):
        if a != b and a != 1 and b != 1:
            return None
    if nx < n:
        x = _st.broadcast_in_dim(x, px, tuple(range(n - nx, n)))
    elif ny < n:
        y = _st.broadcast_in_dim(y, py, tuple(range(n - ny, n)))
    return x, y


def _binary_fast(name, binder, slow):
    float_only = name in _FLOAT_ONLY
    jax_fn = slow.__wrapped__

    def direct(x, y):
        if _TYPE_KINDS.get(type(x)) == _PLAIN and _TYPE_KINDS.get(type(y)) == _PLAIN:
            return jax_fn(x, y)
        ops = binary_operands(x, y, float_only)
        if ops is not None:
            return binder(*ops)
        return slow(x, y)

    def fn(x, y, *args, **kwargs):
        if not args and not kwargs:
            return direct(x, y)
        return slow(x, y, *args, **kwargs)

    return _fast(direct if _positional_only(jax_fn, 2) else fn, name, slow)


def _fast(fn, name, slow):
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = slow.__module__
    fn.__doc__ = slow.__doc__
    fn.__wrapped__ = slow.__wrapped__
    fn.__dict__.update({k: v for k, v in slow.__dict__.items() if k != "__wrapped__"})
    return fn


def _matmul_fast(slow):
    """`x @ y` with `y` a vector or a matrix: one dot_general contracting
    x's last axis with y's first, as jax.numpy writes it."""
    jax_fn = slow.__wrapped__

    def matmul(x, y, *args, **kwargs):
        if not args and not kwargs and (type(x) in _TRACER_TYPES or type(y) in _TRACER_TYPES) \
                and _is_array(x) and _is_array(y):
            xa, ya = _aval_of(x), _aval_of(y)
            if (xa.dtype == ya.dtype and _kind(xa.dtype) == "f" and not xa.weak_type
                    and not ya.weak_type and xa.ndim >= 1 and 1 <= ya.ndim <= 2
                    and xa.shape[-1] == ya.shape[0]):
                return _dot.dot_general(x, y, (((xa.ndim - 1,), (0,)), ((), ())), xa.dtype)
        elif _TYPE_KINDS.get(type(x)) == _PLAIN and _TYPE_KINDS.get(type(y)) == _PLAIN and not (
                args or kwargs):
            return jax_fn(x, y)
        return slow(x, y, *args, **kwargs)

    return _fast(matmul, "matmul", slow)


_SUMMED = frozenset(map(_np.dtype, ("float32", "float64")))  # no upcast by jax.numpy


def _sum_fast(slow):
    """`sum(x)` / `sum(x, axis)` of a functx value of float32/float64: one
    reduce_sum, as jax.numpy writes it (other dtypes, keywords and invalid
    axes take jax.numpy's own path)."""

    def sum(a, axis=None, *args, **kwargs):  # noqa: A001 - jax.numpy's name
        if not args and not kwargs and type(a) in _TRACER_TYPES:
            av = a.aval
            if av.dtype in _SUMMED and not av.weak_type:
                axes = _summed_axes(axis, len(av.shape))
                if axes:  # in the order given, as jax.numpy (XLA sums in that order)
                    return _bind(_reductions.reduce_sum_p, a, axes=axes, out_sharding=None)
        return slow(a, axis, *args, **kwargs)

    return _fast(sum, "sum", slow)


def _summed_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is int:
        axis = (axis,)
    elif type(axis) is not tuple or [a for a in axis if type(a) is not int]:
        return None  # (list tests: this module's `all` is jax.numpy's)
    axes = tuple(a + ndim if a < 0 else a for a in axis)
    if len(set(axes)) != len(axes) or [a for a in axes if not 0 <= a < ndim]:
        return None
    return axes


def _is_array(x):  # a functx value or a JAX array (or JAX tracer)
    return type(x) in _TRACER_TYPES or isinstance(x, _jax.Array)


matmul = _matmul_fast(matmul)  # noqa: F821 - populate() defined it
sum = _sum_fast(sum)  # noqa: A001,F821

for _name, _binder in _UNARY.items():
    globals()[_name] = _unary_fast(_name, _binder, globals()[_name])
for _name, _binder in _BINARY.items():
    globals()[_name] = _binary_fast(_name, _binder, globals()[_name])
del _name, _binder


def frompyfunc(func, /, nin, nout, *, identity=None):
    """functx version of `jax.numpy.frompyfunc`: the ufunc it returns (call,
    `outer`, `reduce`, `accumulate`, `reduceat`, `at`) accepts functx
    values. Write `func` with jax.numpy or functx.numpy."""
    ufunc = _jnp.frompyfunc(func, nin, nout, identity=identity)
    wrapper = _wrap(ufunc.__name__, ufunc)
    _ufunc_methods(wrapper, ufunc, "jax.numpy")
    return wrapper


from . import fft, linalg  # noqa: E402,F401  (namespaces of their own)
