"""Foreign primitives: JAX primitives functx has no definition of (a
library's own primitives: Equinox's internals, lineax's `linear_solve`, a
user's `jax.extend` primitive), run with the rules JAX registered for them.

NOTE [foreign primitives]
`foreign(jax_prim)` makes, once per JAX primitive, a functx primitive that
evaluates by binding the JAX primitive (inside the eager engine's programs
as a call of its own, as functx's own primitives are, NOTE [one rounding
per primitive]) and whose every rule is the JAX
transform of that one primitive, staged and lifted (the generalisation of
NOTE [rules borrowed from JAX] in conv.py):

  shape      JAX's abstract evaluation;
  jvp        `jax.jvp` of the bind (symbolic zero tangents instantiated,
             float0 for integer operands);
  transpose  JAX's transpose rule of the primitive, applied to
             `UndefinedPrimal`s for the linear operands;
  batching   JAX's batching rule (its outputs may stay unbatched).

Each staged function is replayed as functx primitives (`call_lifted`), so
what JAX's rule emits (often the same primitive again, or other foreign
primitives) composes with every functx transform at any depth. A rule JAX
does not have surfaces as functx's MissingRuleError naming the primitive
and the transform. Lifting (`lifting.Program`) and the bind-time translation
(interop.py) both turn an unknown JAX primitive into its foreign twin.
"""

import functools

import jax
import numpy as np
from jax._src import core as jcore
from jax._src.interpreters import ad as jax_ad
from jax._src.interpreters import batching as jax_batching

from .. import xla_cpu
from ..core import FROM_JAX, Aval, Primitive, Zero, aval_of, is_inexact_dtype
from ..errors import MissingRuleError
from ..interpreters.batching import _rule_context
from ..interpreters.eval import defimpl, lower_to_jax
from ..lifting import call_lifted
from .common import batch_rules, instantiate, is_linear, jvp_rules, shape_rules, transpose_rules

_FOREIGN = {}  # JAX primitive -> functx primitive


def foreign(jax_prim):
    """The functx twin of a JAX primitive functx does not define."""
    fx = FROM_JAX.get(jax_prim)
    if fx is not None:
        return fx
    fx = _FOREIGN.get(jax_prim)
    if fx is None:
        fx = _FOREIGN[jax_prim] = _define(jax_prim)
    return fx


class _Params:
    """A primitive's parameters as a hashable cache key part (compared by
    value where they hash, else by identity), and as a dict."""

    __slots__ = ("items", "_key", "_hash")

    def __init__(self, params):
        self.items = tuple(params.items())
        self._key = tuple((k, _key_part(v)) for k, v in self.items)
        try:
            self._hash = hash(self._key)
        except TypeError:
            self._hash = None

    def __hash__(self):
        return id(self) if self._hash is None else self._hash

    def __eq__(self, other):
        if self._hash is None or type(other) is not _Params or other._hash is None:
            return self is other
        return self._key == other._key

    def dict(self):
        return dict(self.items)


def _key_part(value):
    """A parameter as part of a cache key. A high-level primitive of jax
    0.11+ (the `_prim` of call_hi_primitive) equals another of its class
    and parameters whatever its operand types, which it holds and binds
    with: the key names those types too."""
    avals = getattr(value, "in_avals_flat", None)
    if avals is None:
        return value
    return (value, tuple(avals), tuple(getattr(value, "out_avals_flat", ())))


def _cached(fn):
    """Memoise a staged-function factory on hashable keys (a bounded cache:
    the lifting cache keys on the returned function's identity)."""
    return functools.lru_cache(maxsize=1024)(fn)


def _missing(jax_prim, transform, err):
    """The error for a rule JAX does not have; `transform` None: the
    interpreter running the rule fills in its own name (the one the user
    called: grad, jacrev, ...)."""
    return MissingRuleError(
        f"{'{transform}' if transform is None else transform}: the JAX primitive "
        f"`{jax_prim.name}` has no {transform or 'derivative'} rule, neither in functx "
        f"nor in JAX ({type(err).__name__}: {err}). Rewrite that part with functx.numpy "
        "/ functx.lax operations, or file an issue naming the primitive and the transform.",
        transform=transform,
    )


def _define(jax_prim):
    fx = Primitive(jax_prim.name, jax_prim, jax_prim.multiple_results)
    multiple = jax_prim.multiple_results

    # Evaluated by JAX's own bind on arrays (a primitive may have a Python
    # implementation and no lowering), and inside the eager engine's
    # programs as a call of its own, as functx's own primitives are (NOTE
    # [one rounding per primitive]).
    as_call = lower_to_jax(fx, bind=lambda *args, **params: _bind(jax_prim, args, params))

    def impl(*args, **params):
        if getattr(xla_cpu.TRACING, "mode", None) == "calls" and any(
                isinstance(a, jcore.Tracer) for a in args):
            return as_call(*args, **params)
        return _bind(jax_prim, args, params)

    defimpl(fx, impl)

    def shape(*avals, **params):
        javals = [jcore.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
        try:
            try:
                out = jax_prim.abstract_eval(*javals, **params)
            except NotImplementedError:
                if not _by_trace(jax_prim):
                    raise
                out = _shapes_by_trace(jax_prim, javals, params)
        except Exception as e:  # noqa: BLE001 - JAX's own rule failed: name it
            raise _missing(jax_prim, "shape inference", e) from e
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (set, frozenset)):
            out, effects = out
            if effects:  # a callback, a print: staged graphs keep it (dce)
                fx.effectful = True
        if multiple:
            return [Aval(o.shape, o.dtype, o.weak_type) for o in out]
        return Aval(out.shape, out.dtype, out.weak_type)

    shape_rules[fx] = shape

    def bound(params):
        return functools.partial(jax_prim.bind, **params.dict())

    @_cached
    def jvp_fn(params, nonzero):
        rule = jax_ad.primitive_jvps.get(jax_prim)
        p = params.dict()
        if rule is None:
            if not _by_trace(jax_prim):
                raise _missing(jax_prim, None, KeyError("JAX registers no jvp rule"))
            return _jvp_by_trace(jax_prim, p, nonzero)

        def jvp(primals, live):
            live = iter(live)
            tangents = [next(live) if nz else jax_ad.Zero(jcore.typeof(x).to_tangent_aval())
                        for x, nz in zip(primals, nonzero)]
            out, t_out = rule(primals, tangents, **p)
            if multiple:
                return out, [None if type(t) is jax_ad.Zero else t for t in t_out]
            return out, (None if type(t_out) is jax_ad.Zero else t_out)

        return jvp

    def jvp_rule(primals, tangents, **params):
        nonzero = tuple(type(t) is not Zero and is_inexact_dtype(aval_of(p).dtype)
                        for p, t in zip(primals, tangents))
        if not any(nonzero):
            out = bind_fx(fx, primals, params)
            return out, ([Zero.of(o) for o in out] if multiple else Zero.of(out))
        live = [instantiate(t) for t, nz in zip(tangents, nonzero) if nz]
        try:
            out, t_out = call_lifted(jvp_fn(_Params(params), nonzero), (list(primals), live), {},
                                     replay=True)
        except (NotImplementedError, ValueError) as e:  # JAX's rule refuses
            raise _missing(jax_prim, None, e) from e
        def tangent(o, t):
            return t if t is not None and is_inexact_dtype(aval_of(o).dtype) else Zero.of(o)

        if multiple:
            return out, [tangent(o, t) for o, t in zip(out, t_out)]
        return out, tangent(out, t_out)

    jvp_rules[fx] = jvp_rule

    transpose_rules[fx] = _transpose_rule(jax_prim)

    @_cached
    def batch_fn(params, dims, size, spmd):
        rule = jax_batching.fancy_primitive_batchers.get(jax_prim)
        p = params.dict()
        if rule is None:
            if not _by_trace(jax_prim):
                raise _missing(jax_prim, "vmap", KeyError("JAX registers no batching rule"))
            return _batch_by_trace(jax_prim, p, dims, size, spmd)
        # spmd: the mesh axes of vmap(spmd_axis_name=) (NOTE [spmd axes])
        axis = jax_batching.AxisData(None, size, spmd, None)

        def batched(*vals):
            out, out_dims = rule(axis, vals, dims, **p)
            out_dims = out_dims if multiple else [out_dims]
            # (-1: not batched; static outputs of the lifted function)
            return out, [-1 if d is None else d for d in out_dims]

        return batched

    def batch_rule(size, vals, dims, **params):
        axis = _rule_context.axis
        spmd = None if axis is None else axis.spmd
        out, out_dims = call_lifted(batch_fn(_Params(params), tuple(dims), size, spmd),
                                    tuple(vals), {}, replay=True)
        out_dims = [None if d == -1 else d for d in out_dims]
        return out, (out_dims if multiple else out_dims[0])

    batch_rules[fx] = batch_rule
    return fx



def _bind(jax_prim, args, params):
    """Bind a JAX primitive with the parameters of its jaxpr equation (a
    primitive holding a program, e.g. shard_map, is bound with a function
    made of it: JAX's get_bind_params)."""
    if "subfuns" in params:  # bind-time parameters already
        out = jax_prim.bind(*args, **params)
    else:
        bind_params = jax_prim.get_bind_params(params)
        if isinstance(bind_params, tuple):  # older JAX: (subfuns, params)
            subfuns, bind_params = bind_params
            out = jax_prim.bind(*subfuns, *args, **bind_params)
        else:
            out = jax_prim.bind(*args, **bind_params)
    vals = getattr(out, "vals", None)  # shard_map's results come as a FlatTree
    return list(vals) if isinstance(vals, tuple) else out


# JAX primitives whose jvp and batching JAX does in its traces' methods
# (process_shard_map), with no rule in its tables: functx stages JAX's
# jax.jvp / jax.vmap of the one bind instead.
_TRACE_METHOD_PRIMITIVES = ("shard_map",)


def _by_trace(jax_prim):
    return jax_prim.name in _TRACE_METHOD_PRIMITIVES


def _shapes_by_trace(jax_prim, javals, params):
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in javals]
    return jax.eval_shape(lambda *xs: _bind(jax_prim, xs, params), *structs)


def _jvp_by_trace(jax_prim, p, nonzero):
    multiple = jax_prim.multiple_results

    def jvp(primals, live):
        live = iter(live)
        tangents = [next(live) if nz else _zero_tangent(x) for x, nz in zip(primals, nonzero)]
        out, t_out = jax.jvp(lambda *xs: _bind(jax_prim, xs, p), tuple(primals),
                             tuple(tangents))
        if multiple:
            return list(out), list(t_out)
        return out, t_out

    return jvp


def _zero_tangent(x):
    aval = jcore.typeof(x)
    if is_inexact_dtype(aval.dtype):
        return jax.numpy.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, jax.dtypes.float0)


def _batch_by_trace(jax_prim, p, dims, size, spmd):
    multiple = jax_prim.multiple_results

    infer = getattr(jax_batching, "infer", 0)  # JAX reports which outputs it batched

    def batched(*vals):
        result = jax.vmap(lambda *xs: _bind(jax_prim, xs, p), in_axes=tuple(dims),
                          out_axes=infer, axis_size=size, spmd_axis_name=spmd)(*vals)
        if infer == 0:
            out, out_dims = result, None
        else:
            out, out_dims = result
        out = list(out) if multiple else [out]
        out_dims = [0] * len(out) if out_dims is None else (
            list(out_dims) if multiple else [out_dims])
        return (out if multiple else out[0]), [-1 if d is None else d for d in out_dims]

    return batched


def _transpose_rule(jax_prim):
    """A functx transpose rule that stages JAX's transpose rule of
    `jax_prim` and lifts the result."""
    multiple = jax_prim.multiple_results

    @_cached
    def transpose_fn(params, linear_avals):
        rule = jax_ad.primitive_transposes.get(jax_prim)
        p = params.dict()
        if rule is None:
            return _transpose_by_vjp(jax_prim, p, linear_avals)

        def transpose(cts, nonlinear):
            nonlinear = iter(nonlinear)
            args = [jax_ad.UndefinedPrimal(jcore.ShapedArray(a.shape, a.dtype))
                    if a is not None else next(nonlinear) for a in linear_avals]
            ct = cts if multiple else cts[0]
            out = rule(ct, *args, **p)
            return [None if a is None else _materialise(c, a)
                    for c, a in zip(out, linear_avals)]

        return transpose

    def transpose_rule(ct, *args, **params):
        linear_avals = tuple(a.aval if is_linear(a) else None for a in args)
        cts = list(ct) if multiple else [ct]
        cts = [instantiate(c) if type(c) is not Zero else _zeros_of(c.aval) for c in cts]
        nonlinear = [a for a in args if not is_linear(a)]
        fn = transpose_fn(_Params(params), linear_avals)
        out = call_lifted(fn, (cts, nonlinear), {}, replay=True)
        return [o if a is not None else None for o, a in zip(out, linear_avals)]

    return transpose_rule


def _transpose_by_vjp(jax_prim, p, linear_avals):
    """The transpose of a linear equation whose JAX primitive has no entry
    in JAX's transpose table (jax 0.11+'s `call_hi_primitive`, whose rules
    its high-level primitive carries: JAX's reverse mode asks it through
    `vjp_fwd` / `vjp_bwd`): JAX's vjp of the bind with respect to the
    linear operands, the other operands fixed. The equation is linear in
    those, so the vjp at zero is its transpose."""
    multiple = jax_prim.multiple_results

    def transpose(cts, nonlinear):
        nonlinear = iter(nonlinear)
        fixed = [None if a is not None else next(nonlinear) for a in linear_avals]

        def linear_part(*live):
            live = iter(live)
            return _bind(jax_prim, [next(live) if a is not None else x
                                    for a, x in zip(linear_avals, fixed)], p)

        zeros = [jax.numpy.zeros(a.shape, a.dtype) for a in linear_avals if a is not None]
        try:
            _, pullback = jax.vjp(linear_part, *zeros)
            out = iter(pullback(list(cts) if multiple else cts[0]))
        except Exception as e:  # noqa: BLE001 - JAX cannot transpose it either: name it
            raise _missing(jax_prim, "transpose", e) from e
        return [None if a is None else _materialise(next(out), a) for a in linear_avals]

    return transpose


def borrowed_transpose(fx):
    """For a functx primitive with no transpose rule of its own: JAX's
    rule for its JAX primitive, borrowed as for a foreign primitive (a
    library may register one JAX has not, e.g. lineax's for stop_gradient),
    or None when JAX has none either."""
    if fx.jax is None or fx.jax not in jax_ad.primitive_transposes:
        return None
    rule = _BORROWED.get(fx)
    if rule is None:
        rule = _BORROWED[fx] = _transpose_rule(fx.jax)
    return rule


_BORROWED = {}

def bind_fx(fx, args, params):
    from ..core import bind

    return bind(fx, *args, **params)


def _zeros_of(aval):
    from .structural import full

    return full(aval.shape, 0, aval.dtype)


def _materialise(c, aval):
    """A JAX transpose rule's cotangent (None or a symbolic zero allowed) as
    an array of the operand's shape."""
    if c is None or type(c) is jax_ad.Zero:
        return jax.numpy.zeros(aval.shape, aval.dtype)
    return c
