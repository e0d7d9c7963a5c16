"""Windowed reductions (pooling): reduce_window_sum / max / min, the generic
reduce_window with a custom computation, and the two primitives their
derivatives are made of, select_and_gather_add and select_and_scatter_add.

Every window primitive carries window_dimensions, window_strides, padding
(lo, hi per axis), and, except select_and_scatter_add, base_dilation and
window_dilation. Batching gives the batch axis a window of 1 (stride 1, no
padding, no dilation), so no window crosses batch elements.

NOTE [max pooling derivatives]
reduce_window_max picks one element per window, so its tangent is the
tangent at that element: `select_and_gather_add(t, x)` gathers, per window,
the entry of `t` where `x` wins the comparison `select_prim` (ge for max, le
for min). That is linear in `t`; its transpose scatters each cotangent back
to the winning position and adds (`select_and_scatter_add(ct, x)`), whose
transpose is the gather again. Neither depends smoothly on `x`, so both
have zero derivative in `x`. Second derivatives of max pooling are
therefore exact and cheap: the chain only alternates these two.
select_and_scatter_add has no dilation parameters; a base dilation is
handled by padding `x`'s holes with the identity of the comparison (they
never win) and striding the result; a window dilation cannot be transposed
(neither can JAX), which raises.

NOTE [reduce_window_sum transpose]
Each output sums the padded, dilated input at positions o*s + k*wd. The
transpose sends ct[o] back to those positions: spread ct with s-1 zeros
between entries, pad it so that a window of the same size and dilation
sliding over it with stride b (the base dilation) lands on exactly the
input positions, and sum windows again. The padding per axis (input n,
output m, window w dilated to w_d, forward padding lo):
low = w_d - 1 - lo, total length (n-1)*b + w_d (negative padding trims).

NOTE [generic reduce_window]
With a custom computation (lax.reduce_window with anything but add/max/min
and their identity) the primitive holds the computation as a jaxpr. Its jvp
is borrowed from JAX (NOTE [rules borrowed from JAX] in conv.py): a
reduce_window over (operands, tangents) with the jvp of the computation. It
is not linear in a way that can be transposed, and JAX has no transpose
for it either, so reverse mode raises a clear error; forward mode and vmap
work (batched initial values reduce one batch element at a time).

NOTE [pooling recognised from its computation]
JAX turns lax.reduce_window into reduce_window_sum / max / min only when the
computation *is* lax.add / lax.max / lax.min and the initial value a known
identity; `functx.lax.max`, `jnp.maximum`, `lambda a, b: a + b`, or an
identity held in an array, give the generic primitive, which has no reverse
mode. So when lifting meets a one-operand reduce_window whose computation
computes exactly add / max / min of its two arguments, and whose initial
value is, when the program runs, a constant equal to that operation's
identity (0; -inf or the dtype's minimum; inf or its maximum), it binds the
pooling primitive instead. `functx.lax.reduce_window` and `functx.lax.reduce`
also hand JAX the JAX function a functx function wraps, so JAX recognises
`functx.lax.add / max / min / mul / ...` itself.
"""

import functools

import jax
import numpy as np
from jax import lax

from ..core import Aval, Zero, aval_of, is_inexact_dtype
from ..errors import FunctxValueError, MissingRuleError
from ..core import Tracer
from ..lifting import LIFT_RULES, ByIdentity, Macro, call_lifted
from .common import (
    batch_rules,
    bdim_to_front,
    bind,
    defprim,
    instantiate,
    is_linear,
    jvp_rules,
    scalar_like,
    shape_rules,
    transpose_rules,
)

# --------------------------------------------------------------------------
# Shapes and parameter helpers


def _dilate(d, k):
    return 0 if d == 0 else (d - 1) * k + 1


def window_shape(shape, window_dimensions, window_strides, padding,
                 base_dilation=None, window_dilation=None):
    """The output shape of a windowed reduction of an operand of `shape`."""
    n = len(shape)
    base_dilation = base_dilation or (1,) * n
    window_dilation = window_dilation or (1,) * n
    out = []
    for d, w, s, (lo, hi), b, wd in zip(shape, window_dimensions, window_strides,
                                        padding, base_dilation, window_dilation):
        padded = _dilate(d, b) + lo + hi
        wdil = _dilate(w, wd)
        out.append(0 if padded < wdil else (padded - wdil) // s + 1)
    return tuple(out)


def _window_params_with_unit_axis(params, axis):
    """Window parameters for an operand with a new axis at `axis` that no
    window crosses."""
    def ins(seq, v):
        seq = tuple(seq)
        return seq[:axis] + (v,) + seq[axis:]

    new = dict(params)
    new["window_dimensions"] = ins(params["window_dimensions"], 1)
    new["window_strides"] = ins(params["window_strides"], 1)
    new["padding"] = ins(params["padding"], (0, 0))
    for k in ("base_dilation", "window_dilation"):
        if k in params:
            new[k] = ins(params[k], 1)
    return new


def _reduce_window_shape(x, **params):
    return Aval(window_shape(x.shape, params["window_dimensions"], params["window_strides"],
                             params["padding"], params["base_dilation"],
                             params["window_dilation"]), x.dtype, x.weak_type)


def _single_operand_batch(prim):
    def rule(size, vals, dims, **params):
        d = dims[0]
        return bind(prim, vals[0], **_window_params_with_unit_axis(params, d)), d

    batch_rules[prim] = rule


# --------------------------------------------------------------------------
# reduce_window_sum (linear)

reduce_window_sum_p = defprim("reduce_window_sum", lax.reduce_window_sum_p)


def reduce_window_sum(x, window_dimensions, window_strides, padding,
                      base_dilation=None, window_dilation=None):
    n = len(window_dimensions)
    return bind(
        reduce_window_sum_p, x, window_dimensions=tuple(window_dimensions),
        window_strides=tuple(window_strides), padding=tuple(tuple(p) for p in padding),
        base_dilation=tuple(base_dilation or (1,) * n),
        window_dilation=tuple(window_dilation or (1,) * n),
    )


shape_rules[reduce_window_sum_p] = _reduce_window_shape
_single_operand_batch(reduce_window_sum_p)


def _sum_jvp(primals, tangents, **params):
    out = bind(reduce_window_sum_p, primals[0], **params)
    t = tangents[0]
    return out, Zero.of(out) if type(t) is Zero else bind(reduce_window_sum_p, t, **params)


jvp_rules[reduce_window_sum_p] = _sum_jvp


def _sum_transpose(ct, x, *, window_dimensions, window_strides, padding,
                   base_dilation, window_dilation):
    """NOTE [reduce_window_sum transpose]."""
    from .structural import pad

    in_shape = x.aval.shape
    out_shape = aval_of(ct).shape
    config = []
    for n, m, w, s, (lo, _), b, wd in zip(in_shape, out_shape, window_dimensions,
                                         window_strides, padding, base_dilation,
                                         window_dilation):
        w_d = _dilate(w, wd)
        spread = _dilate(m, s)
        low = w_d - 1 - lo
        config.append((low, (n - 1) * b + w_d - low - spread, s - 1))
    spread_ct = pad(ct, scalar_like(ct, 0), config)  # NOTE [weak types in rules]
    nd = len(in_shape)
    return [reduce_window_sum(spread_ct, window_dimensions, base_dilation,
                              ((0, 0),) * nd, (1,) * nd, window_dilation)]


transpose_rules[reduce_window_sum_p] = _sum_transpose

# --------------------------------------------------------------------------
# select_and_gather_add / select_and_scatter_add (NOTE [max pooling derivatives])

select_and_gather_add_p = defprim("select_and_gather_add", lax.select_and_gather_add_p)
select_and_scatter_add_p = defprim("select_and_scatter_add", lax.select_and_scatter_add_p)


def select_and_gather_add(t, x, select_prim, window_dimensions, window_strides, padding,
                          base_dilation, window_dilation):
    return bind(select_and_gather_add_p, t, x, select_prim=select_prim,
                window_dimensions=tuple(window_dimensions),
                window_strides=tuple(window_strides), padding=tuple(padding),
                base_dilation=tuple(base_dilation), window_dilation=tuple(window_dilation))


def select_and_scatter_add(source, x, select_prim, window_dimensions, window_strides, padding):
    return bind(select_and_scatter_add_p, source, x, select_prim=select_prim,
                window_dimensions=tuple(window_dimensions),
                window_strides=tuple(window_strides), padding=tuple(padding))


def _gather_shape(t, x, **params):
    if t.shape != x.shape:
        raise FunctxValueError(
            f"select_and_gather_add: tangents and operand shapes must match, got "
            f"{t.shape} and {x.shape}"
        )
    return Aval(window_shape(x.shape, params["window_dimensions"], params["window_strides"],
                             params["padding"], params["base_dilation"],
                             params["window_dilation"]), t.dtype, t.weak_type and x.weak_type)


shape_rules[select_and_gather_add_p] = _gather_shape
shape_rules[select_and_scatter_add_p] = lambda source, x, **p: Aval(
    x.shape, source.dtype, source.weak_type and x.weak_type)


def _linear_in_first_jvp(prim):
    """jvp of a primitive linear in its first operand and locally constant
    in its second (the selection)."""

    def rule(primals, tangents, **params):
        out = bind(prim, *primals, **params)
        t = tangents[0]
        if type(t) is Zero:
            return out, Zero.of(out)
        return out, bind(prim, t, primals[1], **params)

    jvp_rules[prim] = rule


_linear_in_first_jvp(select_and_gather_add_p)
_linear_in_first_jvp(select_and_scatter_add_p)


def _identity_of(select_prim, dtype):
    """A value that never wins the comparison `select_prim` (ge: max, le: min)."""
    dtype = np.dtype(dtype)
    biggest = np.inf if is_inexact_dtype(dtype) else np.iinfo(dtype).max
    smallest = -np.inf if is_inexact_dtype(dtype) else np.iinfo(dtype).min
    return np.array(smallest if select_prim is lax.ge_p else biggest, dtype)


def _gather_transpose(ct, t, x, *, select_prim, window_dimensions, window_strides, padding,
                      base_dilation, window_dilation):
    from .structural import pad, slice

    assert is_linear(t) and not is_linear(x)
    if any(d != 1 for d in window_dilation):
        raise MissingRuleError(
            "reverse-mode: `select_and_gather_add` (the derivative of max/min pooling, "
            "reduce_window_max/min) cannot be transposed with a window dilation "
            f"(window_dilation={tuple(window_dilation)}); JAX cannot either. Use forward "
            "mode (jvp, jacfwd), or pool without window dilation."
        )
    dilated = any(b != 1 for b in base_dilation)
    if dilated:
        xa = aval_of(x)
        x = pad(x, _identity_of(select_prim, xa.dtype), tuple((0, 0, b - 1) for b in base_dilation))
    out = select_and_scatter_add(ct, x, select_prim, window_dimensions, window_strides, padding)
    if dilated:
        shape = aval_of(out).shape
        out = slice(out, (0,) * len(shape), shape, tuple(base_dilation))
    return [out, None]


def _scatter_transpose(ct, source, x, *, select_prim, window_dimensions, window_strides,
                       padding):
    assert is_linear(source) and not is_linear(x)
    ones = (1,) * len(window_dimensions)
    return [select_and_gather_add(ct, x, select_prim, window_dimensions, window_strides,
                                  padding, ones, ones), None]


transpose_rules[select_and_gather_add_p] = _gather_transpose
transpose_rules[select_and_scatter_add_p] = _scatter_transpose


def _two_operand_batch(prim):
    def rule(size, vals, dims, **params):
        vals = [bdim_to_front(v, d, size) for v, d in zip(vals, dims)]
        return bind(prim, *vals, **_window_params_with_unit_axis(params, 0)), 0

    batch_rules[prim] = rule


_two_operand_batch(select_and_gather_add_p)
_two_operand_batch(select_and_scatter_add_p)

# --------------------------------------------------------------------------
# reduce_window_max / reduce_window_min

reduce_window_max_p = defprim("reduce_window_max", lax.reduce_window_max_p)
reduce_window_min_p = defprim("reduce_window_min", lax.reduce_window_min_p)


def _chooser_jvp(prim, select_prim):
    def rule(primals, tangents, **params):
        x, = primals
        t, = tangents
        out = bind(prim, x, **params)
        if type(t) is Zero:
            return out, Zero.of(out)
        return out, bind(select_and_gather_add_p, t, x, select_prim=select_prim, **params)

    jvp_rules[prim] = rule


for _p, _sel in ((reduce_window_max_p, lax.ge_p), (reduce_window_min_p, lax.le_p)):
    shape_rules[_p] = _reduce_window_shape
    _single_operand_batch(_p)
    _chooser_jvp(_p, _sel)

# --------------------------------------------------------------------------
# reduce_window with a custom computation (NOTE [generic reduce_window])

reduce_window_p = defprim("reduce_window", lax.reduce_window_p, multiple_results=True)


def _generic_shape(*avals, jaxpr, consts, **win):
    n = len(avals) // 2
    shape = window_shape(avals[0].shape, win["window_dimensions"], win["window_strides"],
                         win["padding"], win["base_dilation"], win["window_dilation"])
    return [Aval(shape, a.dtype, False) for a in avals[:n]]


shape_rules[reduce_window_p] = _generic_shape


@functools.lru_cache(maxsize=256)
def _generic_jvp_fn(jaxpr_key, consts_key, items):
    """`(operands, tangents, inits) -> output tangents` as a JAX function."""
    params = dict(items, jaxpr=jaxpr_key.obj, consts=consts_key.obj)

    def tangents_of(ops, tans, inits):
        def f(*xs):
            return lax.reduce_window_p.bind(*xs, *inits, **params)

        return jax.jvp(f, tuple(ops), tuple(tans))[1]

    return tangents_of


def _generic_jvp(primals, tangents, *, jaxpr, consts, **win):
    n = len(primals) // 2
    outs = bind(reduce_window_p, *primals, jaxpr=jaxpr, consts=consts, **win)
    if any(type(t) is not Zero for t in tangents[n:]):
        raise MissingRuleError(
            "differentiation (jvp, vjp, grad, ...): `reduce_window` with a custom "
            "computation has no derivative with respect to its initial value (JAX has "
            "none either). Pass the initial value as a constant."
        )
    if all(type(t) is Zero for t in tangents[:n]):
        return outs, [Zero.of(o) for o in outs]
    fn = _generic_jvp_fn(ByIdentity(jaxpr), ByIdentity(consts), tuple(sorted(win.items())))
    out_tangents = call_lifted(
        fn, (list(primals[:n]), [instantiate(t) for t in tangents[:n]], list(primals[n:])), {},
        replay=True)
    return outs, list(out_tangents)


jvp_rules[reduce_window_p] = _generic_jvp


def _generic_transpose(cts, *args, **params):
    raise MissingRuleError(
        "reverse-mode: `reduce_window` with a custom computation (lax.reduce_window "
        "with a function other than add/max/min and their identity as initial value) "
        "has no transpose rule, so functx cannot apply reverse mode (vjp, grad, jacrev) "
        "to it; neither can JAX. Use forward mode (jvp, jacfwd), or write the pooling "
        "with add / max / min as the computation and a constant initial value 0 / -inf / "
        "inf (NOTE [pooling recognised from its computation] in functx/primitives/windows.py)."
    )


transpose_rules[reduce_window_p] = _generic_transpose


def _generic_batch(size, vals, dims, *, jaxpr, consts, **win):
    n = len(vals) // 2
    if any(d is not None for d in dims[n:]):
        from .. import lax as fxlax  # batched initial values: one element at a time

        def one(args):
            return bind(reduce_window_p, *args, jaxpr=jaxpr, consts=consts, **win)

        outs = fxlax.map(one, [bdim_to_front(v, d, size) for v, d in zip(vals, dims)])
        return list(outs), [0] * n
    ops = [bdim_to_front(v, d, size) for v, d in zip(vals[:n], dims[:n])]
    new = _window_params_with_unit_axis(win, 0)
    outs = bind(reduce_window_p, *ops, *vals[n:], jaxpr=jaxpr, consts=consts, **new)
    return outs, [0] * n


batch_rules[reduce_window_p] = _generic_batch

# --------------------------------------------------------------------------
# Lifting: pooling written with a generic computation (NOTE [pooling
# recognised from its computation])

_POOLING = {"add": reduce_window_sum_p, "max": reduce_window_max_p, "min": reduce_window_min_p}
_CALLS = ("pjit", "jit", "closed_call", "core_call")


def binary_op_of(jaxpr):
    """The name of the primitive that a jaxpr of two inputs and one output
    applies to exactly those two inputs, looking through nested jit calls
    (whose argument order only matters for a non-commutative primitive:
    then None); None if it computes anything else."""
    if len(jaxpr.invars) != 2 or len(jaxpr.outvars) != 1 or len(jaxpr.eqns) != 1:
        return None
    eqn, = jaxpr.eqns
    a, b = jaxpr.invars
    if (a is b or len(eqn.invars) != 2 or len(eqn.outvars) != 1
            or eqn.outvars[0] is not jaxpr.outvars[0]
            or {id(v) for v in eqn.invars} != {id(a), id(b)}):
        return None
    if eqn.primitive.name in _CALLS:
        sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
            if sub.consts:
                return None
            sub = sub.jaxpr
        op = binary_op_of(sub)
        return op if op in _POOLING else None
    return eqn.primitive.name


def _is_identity(init, op):
    """Is `init` a constant scalar equal to the identity of `op`?"""
    if isinstance(init, (Tracer, jax.core.Tracer)):
        return False
    try:
        value = np.asarray(init)
    except Exception:  # noqa: BLE001 - not an array: not a known constant
        return False
    if value.shape != () or value.dtype == np.dtype(bool):
        return False
    if op == "add":
        return bool(value == 0)
    if is_inexact_dtype(value.dtype):
        identity = -np.inf if op == "max" else np.inf
    else:
        info = np.iinfo(value.dtype)
        identity = info.min if op == "max" else info.max
    return bool(value == identity)


def _pool_or_generic(op):
    pooled = _POOLING[op]

    def replay(x, init, *, jaxpr, consts, **win):
        if _is_identity(init, op):
            return [bind(pooled, x, **win)]
        return bind(reduce_window_p, x, init, jaxpr=jaxpr, consts=consts, **win)

    return Macro(replay)


_POOLING_MACROS = {op: _pool_or_generic(op) for op in _POOLING}


def _lift_reduce_window(params):
    op = None if params["consts"] else binary_op_of(params["jaxpr"])
    if op in _POOLING_MACROS:
        return _POOLING_MACROS[op], params
    return reduce_window_p, params


_lift_reduce_window.primitive = reduce_window_p
LIFT_RULES["reduce_window"] = _lift_reduce_window
