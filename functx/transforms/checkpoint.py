"""`checkpoint`: recompute a function's intermediates in the backward pass
instead of saving them (torch.utils.checkpoint / jax.checkpoint).

NOTE [checkpoint = a call whose jvp saves only its inputs]
`checkpoint(fn)(*args)` stages `fn` into a Graph and applies it with the
primitive `checkpoint_call`, which carries the graph (as `jit_call` does,
primitives/call.py). What differs is the jvp rule. `jit_call`'s rule splits
the jvp graph into a primal part and a tangent part fed by residuals, so
reverse mode keeps every residual (`cos(x)` for `sin`, ...) on its tape.
`checkpoint_call`'s rule instead emits two equations:

* the primal outputs: `checkpoint_call(primals; graph)`, run at once;
* the output tangents: `checkpoint_call(primals, tangents; graph=J)` where
  `J` is the *whole* jvp of the graph (primal recomputation included),
  returning only the tangents. `J` is linear in the tangents, so under
  reverse mode this one equation lands on the tape with the primal inputs
  as its only constants: the inputs are all that is saved.

Its transpose is `transpose_graph(J)`, which evaluates the non-linear
(primal) equations of `J` forwards from the saved inputs before
transposing the rest: the recomputation happens in the backward pass.
Batching transforms the graph as a whole (`batch_graph`). Under `jax.jit`
the recomputing program's inputs go through `lax.optimization_barrier`, so
XLA does not merge the recomputation with the forward pass (which would
keep the intermediates alive after all).

Non-array leaves of the arguments are static (closed over); values of
enclosing transforms that `fn` closes over become extra inputs of the call,
so their derivatives flow as usual.
"""

import jax
from jax import tree_util

from ..core import Tracer, Zero, bind
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.batching import batch_rules
from ..interpreters.eval import defimpl
from ..interpreters.jvp import graph_jvp_pairs, jvp_rules
from ..interpreters.reverse import transpose_rules
from ..interpreters.staging import eval_graph, shape_rules, stage
from ..primitives.call import graph_batch_rule, graph_transpose_rule
from ..primitives.common import defprim

__all__ = ["checkpoint", "checkpoint_call"]

checkpoint_call = defprim("checkpoint_call", multiple_results=True)


def _impl(*args, graph, name):
    # Each call of a checkpointed function stages a new graph (the function
    # may close over values that change between calls), so eagerly the
    # graph runs primitive by primitive rather than being compiled per call.
    if any(isinstance(a, jax.core.Tracer) for a in args):
        # Traced by JAX: keep XLA from reusing the forward pass's values.
        args = jax.lax.optimization_barrier(list(args))
    return eval_graph(graph, args)


defimpl(checkpoint_call, _impl)
shape_rules[checkpoint_call] = lambda *avals, graph, name: graph.out_avals


def _tangent_graph(graph, nonzero):
    """The jvp of `graph` as one graph `(primals, nonzero tangents) ->
    nonzero output tangents`, recomputing the primal; with the mask of the
    outputs whose tangent is nonzero. Cached on `graph`."""
    key = ("checkpoint_jvp", nonzero)
    cached = graph.cache.get(key)
    if cached is not None:
        return cached
    out_nonzero = []

    def fn(*args):
        outs = [t for _, t in graph_jvp_pairs(graph, nonzero, args)]
        out_nonzero[:] = [type(t) is not Zero for t in outs]
        return [t for t in outs if type(t) is not Zero]

    avals = graph.in_avals
    tangent, captured = stage(fn, avals + [a for a, nz in zip(avals, nonzero) if nz], "checkpoint")
    assert not captured
    cached = graph.cache[key] = (tangent, tuple(out_nonzero))
    return cached


def _jvp(primals, tangents, *, graph, name):
    outs = bind(checkpoint_call, *primals, graph=graph, name=name)
    nonzero = tuple(type(t) is not Zero for t in tangents)
    if not any(nonzero):
        return outs, [Zero.of(o) for o in outs]
    tangent_graph, out_nonzero = _tangent_graph(graph, nonzero)
    out_tangents = iter(())
    if any(out_nonzero):
        live = [t for t in tangents if type(t) is not Zero]
        out_tangents = iter(bind(checkpoint_call, *primals, *live, graph=tangent_graph,
                                 name=f"jvp({name})"))
    return outs, [next(out_tangents) if nz else Zero.of(o) for o, nz in zip(outs, out_nonzero)]


jvp_rules[checkpoint_call] = _jvp
transpose_rules[checkpoint_call] = graph_transpose_rule(checkpoint_call)
batch_rules[checkpoint_call] = graph_batch_rule(checkpoint_call)


def _is_array(x):
    return isinstance(x, (jax.Array, Tracer)) or hasattr(x, "__jax_array__") or (
        hasattr(x, "shape") and hasattr(x, "dtype"))


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True,
               determinism_check="default", debug=False, context_fn=None, **kwargs):
    """Recompute `function`'s intermediate values in the backward pass
    instead of saving them (activation checkpointing).

    Two call forms:

    * torch's: `checkpoint(function, *args, use_reentrant=False, **kwargs)`
      runs `function(*args, **kwargs)` checkpointed and returns its output;
    * JAX's: `checkpoint(function)` (no arguments) returns the checkpointed
      function, usable as a decorator. (So a function of no arguments must
      be called as `checkpoint(function)()`.)

    Gradients are those of `function`; only memory and time change: under
    reverse mode (grad, vjp, jacrev, hessian, ...) only the array inputs of
    `function` are kept for the backward pass, and its intermediates are
    recomputed from them there. Works under every transform and `jit`.

    Args:
      function: a function of arrays / pytrees returning arrays / pytrees.
      use_reentrant: accepted for torch compatibility; functx has a single,
        non-reentrant implementation (both values behave alike).
      preserve_rng_state, determinism_check, debug: accepted for torch
        compatibility. functx values are pure: the recomputation is the
        same program on the same inputs, so it reproduces the forward pass
        (JAX's explicit keys are inputs like any other).
      context_fn: not supported (raises if given).

    Example:
      >>> block = functx.checkpoint(lambda x: functx.numpy.sin(functx.numpy.sin(x)))
      >>> functx.grad(lambda x: block(x).sum())(x)   # saves x, not sin(x)
    """
    if not callable(function):
        raise FunctxTypeError(
            f"checkpoint(function): expected a callable, got {type(function).__name__}. "
            "Pass the function to recompute.")
    if context_fn is not None:
        raise FunctxValueError(
            "checkpoint(function, context_fn=...): context_fn (selective "
            "checkpointing policies) is not supported by functx; leave it unset.")
    del use_reentrant, preserve_rng_state, determinism_check, debug

    def wrapped(*a, **kw):
        return _run(function, a, kw)

    if args or kwargs:
        return wrapped(*args, **kwargs)
    try:
        wrapped.__name__ = f"checkpoint({getattr(function, '__name__', 'fn')})"
        wrapped.__wrapped__ = function
    except (AttributeError, TypeError):
        pass
    return wrapped


def _run(function, args, kwargs):
    leaves, tree = tree_util.tree_flatten((args, kwargs))
    is_arr = [_is_array(x) for x in leaves]
    arrays = [jax.numpy.asarray(x) if not isinstance(x, Tracer) and not isinstance(x, jax.Array)
              else x for x, a in zip(leaves, is_arr) if a]
    from ..core import aval_of

    out_tree = []

    def flat_fn(*xs):
        it = iter(xs)
        full = [next(it) if a else x for x, a in zip(leaves, is_arr)]
        a, kw = tree_util.tree_unflatten(tree, full)
        out = function(*a, **kw)
        flat, t = tree_util.tree_flatten(out)
        out_tree[:] = [t]
        for o in flat:
            if not _is_array(o):
                raise FunctxTypeError(
                    f"checkpoint({getattr(function, '__name__', 'fn')}): the function "
                    f"returned a non-array leaf {o!r}; return arrays (pytrees of arrays) only.")
        return flat

    graph, captured = stage(flat_fn, [aval_of(x) for x in arrays], "checkpoint")
    name = getattr(function, "__name__", "fn")
    outs = bind(checkpoint_call, *arrays, *captured, graph=graph, name=name)
    return tree_util.tree_unflatten(out_tree[0], list(outs))


# `jax.checkpoint` / `remat` in JAX code functx translates (lifting.py,
# interop.py) becomes `checkpoint_call`, so JAX code keeps its memory saving
# under functx's reverse mode. A JAX saving policy (`policy=`) is not
# followed: functx saves the inputs only (JAX's `nothing_saveable`), which
# is the least memory; the derivatives are the same either way.


def _lift_remat(params):
    from jax.extend.core import ClosedJaxpr

    from ..lifting import graph_of_jaxpr

    jaxpr = params["jaxpr"]
    if not isinstance(jaxpr, ClosedJaxpr):
        jaxpr = ClosedJaxpr(jaxpr, ())
    return checkpoint_call, dict(graph=graph_of_jaxpr(jaxpr), name="jax.checkpoint")


_lift_remat.primitive = checkpoint_call


def _register_lift_rules():
    from ..lifting import LIFT_RULES

    for name in ("checkpoint", "remat", "remat2"):
        LIFT_RULES[name] = _lift_remat


_register_lift_rules()
