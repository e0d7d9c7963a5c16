"""`checkpoint`: recompute a function's intermediates in the backward pass
instead of saving them (torch.utils.checkpoint / jax.checkpoint).

NOTE [checkpoint = a call whose jvp saves what its policy allows]
`checkpoint(fn)(*args)` stages `fn` into a Graph and applies it with the
primitive `checkpoint_call`, which carries the graph (as `jit_call` does,
primitives/call.py) and a saving policy. What differs is the jvp rule.
`jit_call`'s rule splits the jvp graph into a primal part and a tangent
part fed by residuals, so reverse mode keeps every residual (`cos(x)` for
`sin`, ...) on its tape. `checkpoint_call`'s rule splits the jvp graph `J`
(`_split`) differently: an equation of `J`'s primal part goes to the
forward graph, and its outputs become residuals only if the policy says
they may be saved (JAX's policies are asked with the JAX primitive, the
input avals and the parameters, as `jax.checkpoint` asks them over its own
jvp); every other primal equation the tangents need is *also* copied into
the tangent graph, to be recomputed there. It emits two equations:

* `checkpoint_call(primals; graph=forward)`: the primal outputs and the
  saved residuals, run at once;
* `checkpoint_call(primals, residuals, tangents; graph=tangent)`: the
  output tangents. The graph is linear in the tangents, so under reverse
  mode this one equation lands on the tape with the primal inputs and the
  saved residuals as its only constants. With no policy (JAX's
  `nothing_saveable`) that is the inputs alone.

Effectful equations (callbacks) are never recomputed: they run once, in the
forward graph, as if saved (jax.grad runs a callback inside jax.checkpoint a
second time when it recomputes; functx runs a program's effects once per
forward pass, under every transform). A policy's "offload to host" answer saves on the
device (functx has no host-memory residuals), with a warning.

Its transpose is `transpose_graph(tangent)`, which evaluates the non-linear
(primal) equations forwards from the saved values before
transposing the rest: the recomputation happens in the backward pass.
Batching transforms the graph as a whole (`batch_graph`). Under `jax.jit`
the recomputing program's inputs go through `lax.optimization_barrier`, so
XLA does not merge the recomputation with the forward pass (which would
keep the intermediates alive after all).

Non-array leaves of the arguments are static (closed over); values of
enclosing transforms that `fn` closes over become extra inputs of the call,
so their derivatives flow as usual.
"""

import warnings

import jax
import numpy as np
from jax import tree_util

from ..core import Tracer, Zero, bind
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.batching import batch_graph, batch_rules
from ..interpreters.eval import defimpl
from ..interpreters.jvp import graph_jvp_pairs, jvp_rules
from ..interpreters.reverse import transpose_rules
from ..interpreters.staging import Graph, Var, dce, eval_graph, shape_rules, stage
from ..primitives.call import transpose_applied_graph
from ..primitives.collectives import GraphCallPrimitive
from ..primitives.common import defprim

__all__ = ["checkpoint", "checkpoint_call"]

checkpoint_call = defprim("checkpoint_call", multiple_results=True, cls=GraphCallPrimitive)


def _impl(*args, graph, name, policy):
    # Each call of a checkpointed function stages a new graph (the function
    # may close over values that change between calls), so eagerly the
    # graph runs primitive by primitive rather than being compiled per call.
    if any(isinstance(a, jax.core.Tracer) for a in args):
        # Traced by JAX: keep XLA from reusing the forward pass's values.
        args = jax.lax.optimization_barrier(list(args))
    return eval_graph(graph, args)


defimpl(checkpoint_call, _impl)
shape_rules[checkpoint_call] = lambda *avals, graph, name, policy: graph.out_avals


def _saveable(policy, eqn):
    """Whether `policy` (a JAX saving policy) lets the forward pass keep the
    outputs of `eqn`. JAX's policies look at the JAX primitive (`prim.jax`),
    the input avals and the parameters, which functx keeps as JAX has them;
    an "offload" answer counts as saving on the device, with a warning
    (functx does not move saved values to host memory)."""
    if eqn.prim.effectful:
        return True  # a callback runs once, in the forward pass
    if policy is None:
        return False
    prim = eqn.prim.jax if eqn.prim.jax is not None else eqn.prim
    answer = policy(prim, *[x.aval for x in eqn.inputs], **eqn.params)
    if isinstance(answer, (bool, np.bool_)):
        return bool(answer)
    kind = type(answer).__name__
    if kind == "Offloadable":
        warnings.warn(
            "checkpoint: the saving policy asks to offload a value to "
            f"{getattr(answer, 'dst', 'host memory')}; functx keeps saved values on the "
            "device, so this policy saves it there (the derivatives are the same).",
            RuntimeWarning, stacklevel=2)
        return True
    if kind in ("SaveableType", "RecomputeType"):
        return kind == "SaveableType"
    raise FunctxTypeError(
        f"checkpoint(policy=...): the policy returned {answer!r} for primitive "
        f"`{eqn.prim.name}`; a policy returns True (save) or False (recompute).")


def _split(graph, nonzero, policy):
    """The jvp of `graph` split for checkpointing (cached on `graph`):

    * `forward`: primals -> primal outputs, then the residuals (the values
      `policy` lets the forward pass keep, that the tangent part needs);
    * `tangent`: (primals, residuals, nonzero tangents) -> nonzero output
      tangents, recomputing every other primal value it needs;

    with the mask of the outputs whose tangent is nonzero."""
    key = ("checkpoint_jvp", nonzero, policy)
    cached = graph.cache.get(key)
    if cached is not None:
        return cached
    n = len(graph.inputs)
    out_nonzero = []

    def fn(*args):
        pairs = graph_jvp_pairs(graph, nonzero, args)
        out_nonzero[:] = [type(t) is not Zero for _, t in pairs]
        return [p for p, _ in pairs] + [t for _, t in pairs if type(t) is not Zero]

    avals = graph.in_avals
    jvp, captured = stage(fn, avals + [a for a, nz in zip(avals, nonzero) if nz], "checkpoint")
    assert not captured, "the jvp of a closed graph captured values"
    primals, tangents = jvp.inputs[:n], jvp.inputs[n:]
    n_out = len(graph.outputs)
    known, saved = set(primals), {}
    forward_eqns, tangent_eqns = [], []
    for eqn in jvp.eqns:
        if all(type(x) is not Var or x in known for x in eqn.inputs):
            forward_eqns.append(eqn)
            known.update(eqn.outputs)
            if _saveable(policy, eqn):
                saved.update(dict.fromkeys(eqn.outputs))
                continue
        tangent_eqns.append(eqn)
    # A tangent output that is a primal value (a constant tangent) is saved.
    for x in jvp.outputs[n_out:]:
        if type(x) is Var and x in known and x not in primals:
            saved[x] = None
    saved = list(saved)
    tangent = dce(Graph(primals + saved + tangents, tangent_eqns, jvp.outputs[n_out:]))
    used = {x for eqn in tangent.eqns for x in eqn.inputs if type(x) is Var}
    used.update(x for x in tangent.outputs if type(x) is Var)
    residuals = [v for v in saved if v in used]
    tangent = Graph(primals + residuals + tangents, tangent.eqns, tangent.outputs)
    forward = dce(Graph(primals, forward_eqns, jvp.outputs[:n_out] + residuals))
    cached = graph.cache[key] = (forward, tangent, tuple(out_nonzero))
    return cached


def _jvp(primals, tangents, *, graph, name, policy):
    nonzero = tuple(type(t) is not Zero for t in tangents)
    if not any(nonzero):
        outs = bind(checkpoint_call, *primals, graph=graph, name=name, policy=policy)
        return outs, [Zero.of(o) for o in outs]
    forward, tangent, out_nonzero = _split(graph, nonzero, policy)
    outs = bind(checkpoint_call, *primals, graph=forward, name=name, policy=policy)
    outs, residuals = outs[:len(graph.outputs)], outs[len(graph.outputs):]
    out_tangents = iter(())
    if any(out_nonzero):
        live = [t for t in tangents if type(t) is not Zero]
        out_tangents = iter(bind(checkpoint_call, *primals, *residuals, *live, graph=tangent,
                                 name=f"jvp({name})", policy=policy))
    return outs, [next(out_tangents) if nz else Zero.of(o) for o, nz in zip(outs, out_nonzero)]


jvp_rules[checkpoint_call] = _jvp


def _transpose(cts, *args, graph, name, policy):
    return transpose_applied_graph(
        graph, cts, args,
        lambda transposed, ins: bind(checkpoint_call, *ins, graph=transposed,
                                     name=f"transpose({name})", policy=policy))


def _batch(axis_size, vals, dims, *, graph, name, policy):
    batched, out_dims = batch_graph(graph, axis_size, tuple(dims))
    return (bind(checkpoint_call, *vals, graph=batched, name=f"vmap({name})", policy=policy),
            list(out_dims))


transpose_rules[checkpoint_call] = _transpose
batch_rules[checkpoint_call] = _batch


def _is_array(x):
    return isinstance(x, (jax.Array, Tracer)) or hasattr(x, "__jax_array__") or (
        hasattr(x, "shape") and hasattr(x, "dtype"))


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True,
               determinism_check="default", debug=False, context_fn=None, policy=None,
               **kwargs):
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
      function (Callable): a function of arrays / pytrees returning arrays /
        pytrees.
      use_reentrant (bool | None): accepted for torch compatibility; functx has
        a single, non-reentrant implementation (both values behave alike).
      preserve_rng_state (bool): accepted for torch compatibility. functx
        values are pure: the recomputation is the same program on the same
        inputs, so it reproduces the forward pass (JAX's explicit keys are
        inputs like any other).
      determinism_check (str): accepted for torch compatibility, as
        `preserve_rng_state`.
      debug (bool): accepted for torch compatibility, as
        `preserve_rng_state`.
      context_fn (Callable | None): not supported (raises if given); use
        `policy`.
      policy (Callable | None): which intermediates the forward pass may keep
        after all, as in `jax.checkpoint(policy=...)`: a
        `jax.checkpoint_policies` policy (`dots_saveable`,
        `save_only_these_names(...)` with `jax.ad_checkpoint.checkpoint_name`,
        ...) or any function `(primitive, *avals, **params) -> bool`. Default:
        keep only the inputs (`nothing_saveable`).

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

    if policy is not None and not callable(policy):
        raise FunctxTypeError(
            f"checkpoint(function, policy=...): expected a saving policy such as "
            f"jax.checkpoint_policies.dots_saveable, got {type(policy).__name__}.")

    def wrapped(*a, **kw):
        return _run(function, a, kw, policy)

    if args or kwargs:
        return wrapped(*args, **kwargs)
    try:
        wrapped.__name__ = f"checkpoint({getattr(function, '__name__', 'fn')})"
        wrapped.__wrapped__ = function
    except (AttributeError, TypeError):
        pass
    return wrapped


def _run(function, args, kwargs, policy):
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
    outs = bind(checkpoint_call, *arrays, *captured, graph=graph, name=name, policy=policy)
    return tree_util.tree_unflatten(out_tree[0], list(outs))


# `jax.checkpoint` / `remat` in JAX code functx translates (lifting.py,
# interop.py) becomes `checkpoint_call` with the same saving policy, so JAX
# code keeps its memory saving under functx's reverse mode.


def _lift_remat(params):
    from jax.extend.core import ClosedJaxpr

    from ..lifting import graph_of_jaxpr

    jaxpr = params["jaxpr"]
    if not isinstance(jaxpr, ClosedJaxpr):
        jaxpr = ClosedJaxpr(jaxpr, ())
    return checkpoint_call, dict(graph=graph_of_jaxpr(jaxpr), name="jax.checkpoint",
                                 policy=params.get("policy"))


_lift_remat.primitive = checkpoint_call


def _register_lift_rules():
    from ..lifting import LIFT_RULES

    for name in ("checkpoint", "remat", "remat2"):
        LIFT_RULES[name] = _lift_remat


_register_lift_rules()
