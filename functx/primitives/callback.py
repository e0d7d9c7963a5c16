"""pure_callback: a Python function called from the program
(`jax.pure_callback`), on values of the program.

NOTE [callbacks run when the program runs]
A callback is an effect: it must run when (and each time) the program it is
part of runs, never while functx stages that program (SPEC 2). functx hands
a primitive to an interpreter by its arguments, so a callback whose
arguments are all constants would otherwise be evaluated at once even inside
`functx.jit` or a staged branch (`staging.stage` evaluates what it can from
constants). Its evaluation therefore looks for the innermost staging
interpreter on the stack first and records the callback there; only with
none active (eager code, or under a JAX trace, which stages the JAX
primitive itself) does it call JAX's primitive, which runs the callback on
concrete arrays and stages it on JAX tracers.

Derivatives: a Python function has none. Differentiating through a callback
raises MissingRuleError (JAX refuses too), except where every output is an
integer or boolean array, whose tangent is zero anyway. Use
`functx.custom_jvp` / `custom_vjp` (or JAX's) to give a callback a
derivative.

Batching follows the callback's `vmap_method`, as JAX's does:
'sequential' calls it once per batch element in a `scan`
('sequential_unrolled': the same loop, unrolled), 'expand_dims' calls it
once with the unbatched arguments given a leading axis of size 1,
'broadcast_all' once with every argument broadcast to the batch size,
'legacy_vectorized' once with the unbatched arguments as they are; the
results have the batch axis first. Without a vmap_method JAX refuses to
batch the callback, and so does functx.
"""

from jax._src import callback as _jax_callback
from jax._src import core as _jcore

from ..core import Aval, Zero, aval_of, interpreter_stack, is_inexact_dtype
from ..errors import MissingRuleError
from ..interpreters.eval import defimpl
from ..interpreters.staging import StagingInterpreter
from .common import batch_rules, bdim_to_front, bind, defprim, jvp_rules, moveaxis, shape_rules

_jax_pure_callback_p = _jax_callback.pure_callback_p

pure_callback_p = defprim("pure_callback", _jax_pure_callback_p, multiple_results=True)


def _innermost_staging():
    for interp in reversed(interpreter_stack()):
        if type(interp) is StagingInterpreter:
            return interp
    return None


def _impl(*args, **params):
    """NOTE [callbacks run when the program runs]."""
    staging = _innermost_staging()
    if staging is not None:
        return staging.process(pure_callback_p, args, params)
    return _jax_pure_callback_p.bind(*args, **params)


defimpl(pure_callback_p, _impl)
shape_rules[pure_callback_p] = lambda *avals, result_avals, **params: [
    Aval(a.shape, a.dtype, False) for a in result_avals]


def _jvp(primals, tangents, **params):
    outs = bind(pure_callback_p, *primals, **params)
    if all(type(t) is Zero for t in tangents) or not any(
            is_inexact_dtype(a.dtype) for a in params["result_avals"]):
        return outs, [Zero.of(o) for o in outs]
    raise MissingRuleError(
        "differentiation (jvp, vjp, grad, jacfwd, jacrev, ...): primitive "
        "`pure_callback` has no jvp rule: functx cannot differentiate a Python "
        "callback (JAX cannot either). Give the callback a derivative with "
        "functx.custom_jvp / functx.custom_vjp (or jax.custom_jvp / custom_vjp), or "
        "apply functx.lax.stop_gradient to its inputs if it needs none."
    )


jvp_rules[pure_callback_p] = _jvp

_VMAP_METHODS = ("sequential", "sequential_unrolled", "expand_dims", "broadcast_all",
                 "legacy_vectorized")


def _batched_avals(size, result_avals):
    return tuple(_jcore.ShapedArray((size,) + tuple(a.shape), a.dtype) for a in result_avals)


def _batch(size, vals, dims, *, vmap_method, result_avals, **params):
    if vmap_method not in _VMAP_METHODS:
        raise MissingRuleError(
            f"vmap: primitive `pure_callback` with vmap_method={vmap_method!r} has no vmap "
            "rule (JAX refuses to batch it too). Pass vmap_method= to jax.pure_callback: "
            "'sequential' (one call per batch element), 'expand_dims', 'broadcast_all' "
            "or 'legacy_vectorized' (one call on the whole batch)."
        )
    n_out = len(result_avals)
    if vmap_method in ("sequential", "sequential_unrolled"):
        return _sequential(size, vals, dims, vmap_method, result_avals, params), [0] * n_out
    batched = _batched_avals(size, result_avals)
    if vmap_method == "legacy_vectorized":
        args = [v if d is None else moveaxis(v, d, 0) for v, d in zip(vals, dims)]
    else:
        from .structural import broadcast_in_dim

        lead = size if vmap_method == "broadcast_all" else 1
        args = []
        for v, d in zip(vals, dims):
            if d is None:
                s = aval_of(v).shape
                v = broadcast_in_dim(v, (lead,) + s, tuple(range(1, len(s) + 1)))
            else:
                v = moveaxis(v, d, 0)
            args.append(v)
    outs = bind(pure_callback_p, *args, vmap_method=vmap_method, result_avals=batched, **params)
    return outs, [0] * n_out


def _sequential(size, vals, dims, vmap_method, result_avals, params):
    """One call per batch element: a functx scan over the batched arguments,
    the unbatched ones closed over."""
    from .. import lax as fxlax

    mapped = [bdim_to_front(v, d, size) for v, d in zip(vals, dims) if d is not None]

    def body(carry, xs):
        xs = iter(xs)
        args = [next(xs) if d is not None else v for v, d in zip(vals, dims)]
        return carry, bind(pure_callback_p, *args, vmap_method=vmap_method,
                           result_avals=result_avals, **params)

    _, ys = fxlax.scan(body, (), mapped, length=size,
                       unroll=vmap_method == "sequential_unrolled")
    return list(ys)


batch_rules[pure_callback_p] = _batch
