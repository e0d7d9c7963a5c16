"""Helpers that make most primitive definitions one line per rule.

A primitive module declares, next to each primitive: its evaluation (usually
the JAX primitive of the same name, `defprim`), its shape rule, its jvp rule
(`defjvp`, `defjvp_out`, `defzero_jvp`), its transpose rule if it is linear,
and its batching rule (`unary_batch`, `broadcasting_batch`, ...).
"""

import numpy as np

from ..core import Aval, Primitive, Zero, aval_of, bind, host_to_jax, is_key_dtype
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.batching import basis_rules, batch_rules
from ..interpreters.eval import lower_to_jax
from ..interpreters.jvp import jvp_rules
from ..interpreters.reverse import transpose_rules
from ..interpreters.staging import is_linear, shape_rules

__all__ = [
    "Zero", "aval_of", "bind", "is_linear",
    "jvp_rules", "transpose_rules", "batch_rules", "basis_rules", "shape_rules",
    "defprim", "scalar_like", "defjvp", "defjvp_out", "defzero_jvp",
    "add_tangents", "broadcast_to_shape", "unbroadcast", "unary_batch",
    "broadcasting_batch", "moveaxis", "bdim_to_front", "same_aval",
    "nary_shape", "predicate_shape", "instantiate", "scalar_constant",
    "full_like", "zeros_of", "jax_params", "jax_keeps_weak_type",
]


def defprim(name, jax_prim=None, multiple_results=False, cls=Primitive):
    """A primitive evaluated by the JAX primitive `jax_prim` (of class
    `cls`: a Primitive subclass, e.g. collectives.GraphCallPrimitive)."""
    p = cls(name, jax_prim, multiple_results)
    if jax_prim is not None:
        lower_to_jax(p)
    return p


# NOTE [parameters newer JAX adds]
# JAX adds parameters to its primitives between releases (0.12.1 gave
# gather and the scatter family `out_sharding`, random_bits `num_streams`
# and `out_sharding`), and its rules then require them. A functx primitive
# carries the parameters of the JAX primitive it mirrors, whatever the
# installed JAX's are, so:
# * rules take the parameters they do not read as `**params` and hand them
#   on when they bind the same primitive again (jvp, batching), and drop
#   them when they build another primitive's equation;
# * where functx makes an equation's parameters itself (`indexing.gather`,
#   `indexing.scatter`, ...), `jax_params(prim, probe, params)` adds those
#   JAX's own API gives such an equation by default that functx did not
#   name. They are read once, from the jaxpr of `probe(prim, x)`: a small
#   use of the primitive through jax.lax on a float32[2] x. On a JAX
#   without them nothing is added.
# tests/test_jax_versions.py checks that functx's equations carry JAX's
# parameter names for the installed JAX.

_JAX_DEFAULTS = {}  # functx Primitive -> {name: default} functx does not name


def jax_params(prim, probe, params):
    """`params` completed with the parameters the installed JAX's equations
    of `prim` have by default and `params` lacks (NOTE [parameters newer
    JAX adds])."""
    extra = _JAX_DEFAULTS.get(prim)
    if extra is None:
        extra = _JAX_DEFAULTS[prim] = _defaults_from(prim, probe, params)
    if not extra:
        return params
    return {**extra, **params}


def _defaults_from(prim, probe, params):
    import jax

    # an input, so that nothing is folded into a constant
    jaxpr = jax.make_jaxpr(lambda x: probe(prim, x))(jax.ShapeDtypeStruct((2,), np.float32))
    for eqn in jaxpr.jaxpr.eqns:
        if eqn.primitive is prim.jax:
            return {k: v for k, v in eqn.params.items() if k not in params}
    raise RuntimeError(f"functx: the probe of {prim.name} does not use it")  # a functx bug


_JAX_WEAK = {}  # probe -> bool


def jax_keeps_weak_type(probe):
    """Whether `probe`, a function of a weakly typed float32[4] that uses a
    jax.lax operation or differentiates one with JAX (its vjp pulling back
    a weak cotangent, its jvp pushing a weak tangent), returns a weakly
    typed array. Where a JAX release changed a rule's weak type (NOTE [weak
    types in rules]), functx's rule asks the installed JAX once."""
    weak = _JAX_WEAK.get(probe)
    if weak is None:
        import jax

        spec = jax.ShapeDtypeStruct((4,), np.float32, weak_type=True)
        weak = _JAX_WEAK[probe] = bool(jax.eval_shape(probe, spec).weak_type)
    return weak


_scalars = {}


# NOTE [weak types in rules]
# JAX's weak-type flag (a Python scalar's "weak" float32/64, which adopts
# the dtype of the array it meets) comes out of functx's rules as out of
# JAX's: a derivative at a Python float is weakly typed under jax.grad, and
# code relies on it (added to a float16 array it stays float16). lax
# operations give a weak result only where every operand is weak, so one
# strongly typed constant in a rule makes the whole result strong. Hence:
# * the constants a rule makes beside a value x (`scalar_like`,
#   `full_like`, `convert_like`) and the zeros of an aval (`zeros_of`,
#   `instantiate`) carry x's (the aval's) weak type, as JAX's
#   `full_like(x, c)` and its symbolic zeros do;
# * where JAX's rule is strongly typed on purpose, so is functx's: a cast
#   (pow's derivative), `lax.full(shape, 0, dtype)` (gather's transpose), a
#   NumPy constant beside a value that is always an array (the transposes
#   of slice and pad); where JAX writes a rule with jnp operators (the
#   special functions), `_jnp_mul` casts a weak operand as they do;
# * shape rules give JAX's abstract evaluation's flag (weak where every
#   operand is, comparisons and top_k's indices included; never for
#   argmax, the logical reductions, bitcasts).
# * where a JAX release changed a rule's weak type (0.12.1: the transposes
#   of slice and pad, cumprod's and cummax's derivatives, complex abs's
#   jvp, top_k's indices), functx's rule asks the installed JAX once which
#   it is (`jax_keeps_weak_type`, a probe beside the rule).
# tests/test_weak_types.py checks all of it against JAX: the shape rules
# on every equation of the op tables, and grad / jvp / vjp / vmap results
# at weakly typed arguments; its KNOWN_DIFFERENCES lists where functx does
# not copy JAX, and why.


def scalar_constant(value, dtype, weak_type=False):
    """A 0-d constant of `dtype` (weakly typed if `weak_type`) as a concrete
    device array, cached: JAX's dispatch takes device arrays faster than
    NumPy scalars, and lax ops need exactly equal dtypes. Created under
    `ensure_compile_time_eval`, so a constant first made while JAX traces
    is still a concrete array."""
    weak_type = bool(weak_type)
    key = (value, dtype, weak_type)
    try:
        return _scalars[key]
    except KeyError:
        c = _make_scalar(value, dtype, weak_type)
        if len(_scalars) < 4096:
            _scalars[key] = c
        return c
    except TypeError:  # unhashable value
        if weak_type:
            return _make_scalar(value, dtype, weak_type)
        return np.array(value, dtype)


def _make_scalar(value, dtype, weak_type):
    import jax

    with jax.ensure_compile_time_eval():
        c = host_to_jax(np.array(value, dtype))
        if weak_type:
            c = jax.lax.convert_element_type_p.bind(
                c, new_dtype=c.dtype, weak_type=True, sharding=None)
    return c


def _dtype_and_weak(x):
    if isinstance(x, Aval):
        return x.dtype, x.weak_type
    a = aval_of(x)
    return a.dtype, a.weak_type


def scalar_like(x, value):
    """A 0-d constant of `x`'s dtype and weak type (`x` a value or an
    Aval; NOTE [weak types in rules])."""
    dtype, weak = _dtype_and_weak(x)
    return scalar_constant(value, dtype, weak)


def full_like(x, value, shape=None):
    """An array of `value` with `x`'s dtype and weak type and `x`'s shape
    (or `shape`); `x` a value or an Aval (NOTE [weak types in rules])."""
    from .structural import full

    a = x if isinstance(x, Aval) else aval_of(x)
    return full(a.shape if shape is None else shape, value, a.dtype, a.weak_type)


def zeros_of(aval):
    """Zeros of `aval`, weakly typed where it is (as JAX's zeros)."""
    from .structural import full

    return full(aval.shape, 0, aval.dtype, aval.weak_type)


def instantiate(t):
    """A tangent or cotangent as an array: a symbolic zero becomes zeros
    (of its aval's weak type)."""
    if type(t) is Zero:
        if is_key_dtype(t.aval.dtype):  # keys have no tangents (NOTE [key dtypes])
            raise FunctxTypeError(
                f"functx internal error: a rule asked for the tangent of a key "
                f"({t.aval.str_short()}) as an array; a key's tangent is always a "
                "symbolic zero. Please report this with the function that raised it."
            )
        return zeros_of(t.aval)
    return t


# --------------------------------------------------------------------------
# Shape rules


def same_aval(aval, **params):
    return aval


def predicate_shape(aval, **params):
    # weak where the operand is, as JAX's (NOTE [weak types in rules])
    return Aval(aval.shape, np.dtype(bool), aval.weak_type)


def broadcast_shapes(op, avals):
    """lax broadcasting: equal ranks (or rank 0), dimensions equal or 1."""
    shapes = [a.shape for a in avals if a.shape != ()]
    if not shapes:
        return ()
    rank = len(shapes[0])
    out = list(shapes[0])
    for s in shapes[1:]:
        if len(s) != rank:
            raise FunctxValueError(
                f"{op}: operands must have equal ranks, got shapes {[a.shape for a in avals]}"
            )
        for i, d in enumerate(s):
            if out[i] == 1:
                out[i] = d
            elif d != 1 and d != out[i]:
                raise FunctxValueError(
                    f"{op}: incompatible shapes {[a.shape for a in avals]}"
                )
    return tuple(out)


def nary_shape(name):
    def rule(*avals, **params):
        first = avals[0]
        if all(a.shape == first.shape for a in avals):
            shape = first.shape
        else:
            shape = broadcast_shapes(name, avals)
        return Aval(shape, first.dtype, all(a.weak_type for a in avals))

    return rule


def nary_predicate_shape(name):
    def rule(*avals, **params):
        return Aval(broadcast_shapes(name, avals), np.dtype(bool),
                    all(a.weak_type for a in avals))

    return rule


# --------------------------------------------------------------------------
# jvp helpers


def add_tangents(a, b):
    if type(a) is Zero:
        return b
    if type(b) is Zero:
        return a
    from .elementwise import add_any

    return add_any(a, b)


def broadcast_to_shape(x, shape):
    """Broadcast `x` (lax broadcasting: rank 0 or size-1 dims) to `shape`."""
    xs = aval_of(x).shape
    if xs == shape:
        return x
    from .structural import broadcast_in_dim

    if xs == ():
        return broadcast_in_dim(x, shape, ())
    return broadcast_in_dim(x, shape, tuple(range(len(shape))))


def unbroadcast(x, aval):
    """Sum `x` down to `aval`'s shape, undoing lax broadcasting (the
    transpose of `broadcast_to_shape`)."""
    xs = aval_of(x).shape
    if xs == aval.shape:
        return x
    from .reductions import reduce_sum
    from .structural import reshape

    if aval.shape == ():
        return reduce_sum(x, tuple(range(len(xs))))
    axes = tuple(i for i, (a, b) in enumerate(zip(aval.shape, xs)) if a == 1 and b != 1)
    return reshape(reduce_sum(x, axes), aval.shape)


def _accumulate(total, c, out):
    """Add contribution `c`, broadcast to the output's shape, to `total`."""
    if type(c) is Zero:
        return total
    shape = out.shape if hasattr(out, "shape") else aval_of(out).shape
    c = broadcast_to_shape(c, shape)
    return c if total is None else add_tangents(total, c)


def _contributions_rule(prim, fns, pass_output):
    def rule(primals, tangents, **params):
        out = bind(prim, *primals, **params)
        total = None
        for fn, t in zip(fns, tangents):
            if fn is None or type(t) is Zero:
                continue
            c = fn(t, out, *primals, **params) if pass_output else fn(t, *primals, **params)
            total = _accumulate(total, c, out)
        return out, Zero.of(out) if total is None else total

    jvp_rules[prim] = rule
    return rule


def defjvp(prim, *fns):
    """jvp rule from one function per operand: `fn(t, *primals, **params)`
    gives that operand's contribution to the output tangent (None: the
    operand has zero derivative). Contributions are summed, Zero skipped."""
    return _contributions_rule(prim, fns, pass_output=False)


def defjvp_out(prim, *fns):
    """Like `defjvp`, but each function also gets the primal output:
    `fn(t, out, *primals, **params)` (e.g. exp: `t * out`)."""
    return _contributions_rule(prim, fns, pass_output=True)


def defzero_jvp(prim):
    """The primitive's output does not change with its inputs (comparisons,
    argmax, iota, ...): its tangents are symbolic zeros."""

    def rule(primals, tangents, **params):
        out = bind(prim, *primals, **params)
        if prim.multiple_results:
            return out, [Zero.of(o) for o in out]
        return out, Zero.of(out)

    jvp_rules[prim] = rule
    return rule


# --------------------------------------------------------------------------
# Batching helpers


def moveaxis(x, src, dst):
    """Move axis `src` of `x` to position `dst`."""
    if src == dst:
        return x
    from .structural import transpose

    nd = aval_of(x).ndim
    perm = [i for i in range(nd) if i != src]
    perm.insert(dst, src)
    return transpose(x, tuple(perm))


def bdim_to_front(x, d, size):
    """`x` with its batch axis first; an unbatched value (d is None) is
    broadcast along a new leading axis of `size`."""
    if d is None:
        from .structural import broadcast_in_dim

        shape = aval_of(x).shape
        return broadcast_in_dim(x, (size,) + shape, tuple(range(1, len(shape) + 1)))
    return moveaxis(x, d, 0)


def unary_batch(prim):
    """Batching for elementwise unary primitives: batch axis unchanged."""

    def rule(size, vals, dims, **params):
        return bind(prim, vals[0], **params), dims[0]

    batch_rules[prim] = rule
    return rule


def broadcasting_batch(prim):
    """Batching for elementwise n-ary primitives with lax broadcasting."""

    def rule(size, vals, dims, **params):
        bd = None
        nd = None
        simple = True
        for v, d in zip(vals, dims):
            if d is None:
                if aval_of(v).shape != ():
                    simple = False
            else:
                n = aval_of(v).ndim
                if bd is None:
                    bd, nd = d, n
                elif d != bd or n != nd:
                    simple = False
        if simple:
            return bind(prim, *vals, **params), bd
        from .structural import reshape

        logical = max(aval_of(v).ndim - (d is not None) for v, d in zip(vals, dims))
        new = []
        for v, d in zip(vals, dims):
            a = aval_of(v)
            if d is None:
                if a.shape != ():
                    v = reshape(v, (1,) + a.shape)
            else:
                v = moveaxis(v, d, 0)
                if a.ndim - 1 < logical:  # a batched logical scalar
                    v = reshape(v, (size,) + (1,) * logical)
            new.append(v)
        return bind(prim, *new, **params), 0

    batch_rules[prim] = rule
    return rule
