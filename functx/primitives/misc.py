"""Identity-like primitives that carry meaning for the compiler or the
runtime, not for the numbers: optimization_barrier, device_put and dce_sink.

* `optimization_barrier` returns its operands unchanged but stops XLA from
  moving or fusing computations across it (rematerialisation uses it). Its
  derivative is the barrier again, applied to the nonzero tangents (and, in
  reverse mode, cotangents) together; symbolic zeros stay symbolic.
* `device_put` places each operand on a device or sharding (`devices`),
  from where it was (`srcs`). It is linear: the jvp puts the tangents where
  the primals go, the transpose puts the cotangents back where the primals
  came from (swapping `devices` and `srcs`; a cotangent is always a copy,
  and a donated input cannot be transposed, as in JAX).
* `dce_sink` has no outputs: it marks a value as used so that JAX's
  dead-code elimination keeps what computes it (`jax.lax.dce_sink`; JAX
  0.10.2 emits it for `checkify` of while loops). Differentiating or
  batching it sinks the primal, or the batched value; a tangent is never
  sunk (it has no effect to keep). Having no outputs, it gets no cotangent,
  so its transpose gives none.

All three batch elementwise: the batch axes stay where they are.
"""

from jax._src import dispatch as _jax_dispatch
from jax._src.lax import lax as _jax_lax

from ..core import Aval, Zero
from ..errors import MissingRuleError
from ..interpreters.eval import defimpl
from .common import batch_rules, bind, defprim, is_linear, jvp_rules, shape_rules, transpose_rules


def _same_avals(*avals, **params):
    return [Aval(a.shape, a.dtype, a.weak_type) for a in avals]


def _keep_bdims(prim):
    def rule(size, vals, dims, **params):
        return bind(prim, *vals, **params), list(dims)

    batch_rules[prim] = rule


# --------------------------------------------------------------------------
# optimization_barrier

optimization_barrier_p = defprim("optimization_barrier", _jax_lax.optimization_barrier_p,
                                 multiple_results=True)
shape_rules[optimization_barrier_p] = _same_avals
_keep_bdims(optimization_barrier_p)


def _barrier_of_nonzero(values):
    """The barrier applied to the values that are not symbolic zeros, in
    one group; the zeros pass through."""
    live = [v for v in values if type(v) is not Zero]
    if not live:
        return list(values)
    out = iter(bind(optimization_barrier_p, *live))
    return [v if type(v) is Zero else next(out) for v in values]


def _barrier_jvp(primals, tangents):
    return bind(optimization_barrier_p, *primals), _barrier_of_nonzero(tangents)


def _barrier_transpose(cts, *args):
    keep = [is_linear(a) and type(c) is not Zero for c, a in zip(cts, args)]
    if not any(keep):
        return [None] * len(args)
    back = iter(bind(optimization_barrier_p, *[c for c, k in zip(cts, keep) if k]))
    return [next(back) if k else None for k in keep]


jvp_rules[optimization_barrier_p] = _barrier_jvp
transpose_rules[optimization_barrier_p] = _barrier_transpose

# --------------------------------------------------------------------------
# device_put

device_put_p = defprim("device_put", _jax_dispatch.device_put_p, multiple_results=True)
# Eagerly a transfer (JAX's own implementation), not a compiled program:
# inside a compiled program device_put only annotates.
defimpl(device_put_p, lambda *xs, **params: _jax_dispatch.device_put_p.bind(*xs, **params))
shape_rules[device_put_p] = _same_avals
_keep_bdims(device_put_p)


def _subset(params, keep):
    """device_put's per-operand parameters for the operands marked in `keep`."""
    return {k: tuple(v for v, k_ in zip(params[k], keep) if k_)
            for k in ("devices", "srcs", "copy_semantics")}


def _device_put_jvp(primals, tangents, **params):
    outs = bind(device_put_p, *primals, **params)
    keep = [type(t) is not Zero for t in tangents]
    if not any(keep):
        return outs, [Zero.of(o) for o in outs]
    moved = iter(bind(device_put_p, *[t for t in tangents if type(t) is not Zero],
                      **_subset(params, keep)))
    return outs, [next(moved) if k else Zero.of(o) for o, k in zip(outs, keep)]


def _device_put_transpose(cts, *args, devices, srcs, copy_semantics):
    keep = [is_linear(a) and type(c) is not Zero for a, c in zip(args, cts)]
    if not any(keep):
        return [None] * len(args)
    back_semantics = []
    for cp, k in zip(copy_semantics, keep):
        if not k:
            continue
        if cp == type(cp).DONATE_INPUT:
            raise MissingRuleError(
                "reverse-mode: primitive `device_put` with donate=True has no transpose "
                "rule (JAX has none either): the cotangent cannot be sent back into a "
                "donated buffer. Call jax.device_put without donate=True in code you "
                "differentiate in reverse mode.")
        back_semantics.append(type(cp).ALWAYS_COPY)
    flipped = _subset(dict(devices=srcs, srcs=devices, copy_semantics=copy_semantics), keep)
    flipped["copy_semantics"] = tuple(back_semantics)
    back = iter(bind(device_put_p, *[c for c, k in zip(cts, keep) if k], **flipped))
    return [next(back) if k else None for k in keep]


jvp_rules[device_put_p] = _device_put_jvp
transpose_rules[device_put_p] = _device_put_transpose

# --------------------------------------------------------------------------
# dce_sink

dce_sink_p = defprim("dce_sink", _jax_lax.dce_sink_p, multiple_results=True)
defimpl(dce_sink_p, lambda x, **params: _jax_lax.dce_sink_p.bind(x, **params))
shape_rules[dce_sink_p] = lambda x, **params: []


def _sink_jvp(primals, tangents, **params):
    return bind(dce_sink_p, *primals, **params), []


def _sink_batch(size, vals, dims, **params):
    return bind(dce_sink_p, *vals, **params), []


jvp_rules[dce_sink_p] = _sink_jvp
batch_rules[dce_sink_p] = _sink_batch
transpose_rules[dce_sink_p] = lambda cts, x, **params: [None]
