"""`jit_call`: a call of a staged graph, the primitive `functx.jit` emits
when it is applied to values of an enclosing transform.

The graph stays one unit under every transform: each interpreter turns it
into another graph (its jvp split into a primal and a linear tangent part,
its transpose, its batched version), cached on the graph, and binds
`jit_call` again on that. At the bottom of the stack a graph is evaluated as
one `jax.jit`-compiled program, compiled once per graph.
"""

import threading

import jax
import numpy as np

from .. import caches, xla_cpu
from .. import core as _core
from ..interpreters.batching import _rule_context, batch_graph
from ..interpreters.eval import (
    CALL_PROGRAM, WHOLE_CALL_PROGRAM, compiled, defimpl, keep_call_program,
)
from ..interpreters.jvp import jvp_graph
from ..interpreters.reverse import inlined_calls, transpose_graph
from ..interpreters.staging import ALONE, eval_graph, is_alone
from .collectives import GraphCallPrimitive
from .common import (
    Zero,
    basis_rules,
    batch_rules,
    bind,
    defprim,
    is_linear,
    jvp_rules,
    shape_rules,
    transpose_rules,
)

_JaxTracer = jax.core.Tracer

jit_call = defprim("jit_call", multiple_results=True, cls=GraphCallPrimitive)


# The names (and the names derived from them: "vmap(...)", "jvp(...)") of
# the jit_calls eager transforms make of their own: a backward pass (NOTE
# [staged backward passes]) and a step of a transform above another one
# (NOTE [fused steps above another transform] in interpreters/deferred.py).
# They run inside the deferred queue's program, or else primitive by
# primitive; never compiled alone, which would stall the call that first
# meets them (NOTE [deferred eager steps]).
EAGER_BACKWARD = "eager backward"
EAGER_STEP = "eager step"


def is_eager(name):
    """Is `name` that of such a call, or derived from one?"""
    return EAGER_BACKWARD in name or EAGER_STEP in name


# The name (and the names derived from it) of a call of a jitted JAX
# function met eagerly (NOTE [JAX's jit programs stay calls] in
# interop.py): `jax.jit(<its name>)`, which its program shows in compile
# logs. Like a `functx.jit` graph's, its program keeps each primitive apart
# as the eager engine's programs do, alone and inside a combined program
# alike (`_impl` below, NOTE [one rounding per primitive] in xla_cpu.py).
def jax_call_name(name):
    return f"jax.jit({name})"


def is_jax_call(name):
    return "jax.jit(" in name


# NOTE [a jitted function differentiated alone]
# A top-level `grad` (or `grad_and_value`) of a jitted
# function (`functx.jit(f)` or `jax.jit(f)`: `grad(jit(f))`, rewrapped or
# not) records one `jit_call` and nothing else: its forward step is the
# only step of its queue (a queue of one equation runs it: NOTE [deferred
# eager steps]) and its tape has one equation, whose transpose is one
# dispatch (no queued or compiled backward pass). No path of the eager
# engine inlines such a call into a larger program, so its programs need
# not keep each primitive apart (NOTE [one rounding per primitive] in
# xla_cpu.py): they are compiled whole, as JAX compiles `jax.grad(jax.jit(f))`
# (the first call of benchmarks/first_calls.py's rejit compiled its two
# programs with their calls kept in 300-330 ms, whole in about 220). The
# grad marks the call's name (`ALONE`, passed on to the jvp, transposed
# and batched graphs derived from it) when the jitted function binds it
# with only the grad's own interpreters on the stack, so every call of
# that structure runs the same whole programs; a queue, a queued or
# compiled backward pass or a staged step that would hold a marked call
# with anything else runs it step by step instead (`holds_alone_call` in
# interpreters/staging.py, beside the mark `ALONE`), never inlined, so the
# bits still do not depend on the path.
_alone = threading.local()  # .depth: interpreters on the stack of a grad of a jitted function


def call_name(name):
    """The name a jit_call of a user's jitted function binds with: marked
    `ALONE` when the function is the one a top-level grad differentiates,
    bound by that grad's interpreters (NOTE [a jitted function
    differentiated alone])."""
    depth = getattr(_alone, "depth", None)
    if depth is not None and len(_core._state.stack) == depth:
        return ALONE + name
    return name


def differentiating_alone(depth):
    """Mark (`depth`: the grad's interpreters on the stack) or unmark
    (None) this thread as a top-level grad of a jitted function; returns
    the previous mark."""
    was = getattr(_alone, "depth", None)
    _alone.depth = depth
    return was


# a backward pass transposes them equation by equation, as the path without
# them does (NOTE [transposed as if inlined] in interpreters/reverse.py)
inlined_calls[jit_call] = lambda params: params["graph"] if is_eager(params["name"]) else None


# The graphs the enclosing transforms derive from such a call (its batched
# and differentiated forms) are staged on the compile thread the first
# time, while the call that met them takes the path it would take without
# it (a backward pass equation by equation, a step by its rule): staging
# folds the graph's constants (a broadcast zero of a select's transpose,
# batched to a new batch size) through per-primitive programs, which would
# otherwise compile on the calling thread, in a call after the first ones
# -- a call slower than the one before it.


class DerivedGraphNotReady(Exception):
    """Raised through the enclosing interpreters to the eager transform that
    bound the call (interpreters/reverse.py), which then runs the backward
    pass equation by equation, or the step by its rule."""


_binding = threading.local()  # .on: inside an eager call's bind on this thread


def binding_eager(on):
    """Mark this thread as binding an eager transform's own call (or not);
    returns the previous mark."""
    was = getattr(_binding, "on", False)
    _binding.on = on
    return was


def _derived(graph, name, tag, build):
    """`build()` (a graph transform that caches its result on `graph`);
    for an eager transform's own call bound on the calling thread, the
    first time, `build` is handed to the compile thread and
    DerivedGraphNotReady raised. A build that failed there is never tried
    on the calling thread: that call keeps taking the other path."""
    if not is_eager(name) or not caches.BACKGROUND or not getattr(_binding, "on", False):
        return build()
    future = graph.cache.get(tag)
    if type(future) is _Built:  # every later call: no lock of the Future's
        return future.value
    if future is None:
        future = graph.cache[tag] = caches.submit(build)
    if not future.done() or future.exception() is not None:
        raise DerivedGraphNotReady
    value = future.result()
    graph.cache[tag] = _Built(value)
    return value


class _Built:
    """A derived graph the compile thread has built (in place of its Future)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _impl(*args, graph, name):
    if is_eager(name):
        return eval_graph(graph, args)
    if getattr(xla_cpu.TRACING, "mode", None) and any(isinstance(a, _JaxTracer) for a in args):
        # inside one of the eager engine's programs: each primitive its own
        # call there, as in the program it runs alone (below)
        return eval_graph(graph, args)
    if not xla_cpu.top_level():  # a call inside a user's program being traced
        return compiled(graph)(*args)
    if is_alone(name):  # NOTE [a jitted function differentiated alone]
        entry = graph.cache.get(WHOLE_CALL_PROGRAM)
        if entry is None:
            label = f"functx_{name[len(ALONE):]}" if name.startswith(ALONE) else "functx_graph"
            entry = keep_call_program(graph, compiled(graph, label), whole=True)
        else:
            entry[1] = True
        return entry[0](*args)
    # run on arrays by an eager transform: its primitives kept apart as in
    # the eager engine's programs, which may inline it later (NOTE [one
    # rounding per primitive] in xla_cpu.py); the program is listed under
    # the bound of NOTE [eager programs, bounded process-wide] in
    # interpreters/eval.py
    entry = graph.cache.get(CALL_PROGRAM)
    if entry is None:
        label = f"functx_{name}" if is_jax_call(name) else "functx_graph"
        entry = keep_call_program(graph, compiled(graph, label, eager=True))
    else:
        entry[1] = True
    return entry[0](*args)


defimpl(jit_call, _impl)
shape_rules[jit_call] = lambda *avals, graph, name: graph.out_avals


def _jvp(primals, tangents, *, graph, name):
    nonzero = tuple(type(t) is not Zero for t in tangents)
    if not any(nonzero):
        outs = bind(jit_call, *primals, graph=graph, name=name)
        return outs, [Zero.of(o) for o in outs]
    split = _derived(graph, name, ("staging jvp", nonzero), lambda: jvp_graph(graph, nonzero))
    results = bind(jit_call, *primals, graph=split.primal, name=name)
    outs = results[:split.n_out]
    out_tangents = iter(())
    if any(split.out_nonzero):
        live = [t for t in tangents if type(t) is not Zero]
        out_tangents = iter(bind(jit_call, *split.residuals(primals, results), *live,
                                 graph=split.tangent, name=f"jvp({name})"))
    return outs, [next(out_tangents) if nz else Zero.of(o)
                  for o, nz in zip(outs, split.out_nonzero)]


def transpose_applied_graph(graph, cts, args, apply):
    """Cotangents of `args` of a linear `graph` applied to them, given the
    output cotangents `cts`: the transposed graph (on the non-linear args
    and the nonzero cotangents) run by `apply(transposed, inputs)`."""
    linear = tuple(is_linear(a) for a in args)
    ct_nonzero = tuple(type(c) is not Zero for c in cts)
    if not any(ct_nonzero):
        return [None] * len(args)
    transposed, in_nonzero = transpose_graph(graph, linear, ct_nonzero)
    fixed = [a for a, lin in zip(args, linear) if not lin]
    live = [c for c in cts if type(c) is not Zero]
    outs = iter(apply(transposed, fixed + live) if any(in_nonzero) else ())
    nonzero = iter(in_nonzero)
    return [None if not lin else (next(outs) if next(nonzero) else Zero(a.aval))
            for a, lin in zip(args, linear)]


def graph_transpose_rule(prim):
    """The transpose rule of a primitive `prim(*args, graph, name)` that
    applies a staged graph: bind `prim` again on the transposed graph
    (shared by jit_call and checkpoint_call)."""

    def rule(cts, *args, graph, name):
        return transpose_applied_graph(
            graph, cts, args,
            lambda transposed, ins: bind(prim, *ins, graph=transposed,
                                         name=f"transpose({name})"))

    return rule


def graph_batch_rule(prim):
    """The batching rule of a graph-applying primitive: bind `prim` again
    on the batched graph."""

    def rule(axis_size, vals, dims, *, graph, name):
        batched, out_dims = _batched(graph, name, axis_size, tuple(dims), None)
        return bind(prim, *vals, graph=batched, name=f"vmap({name})"), list(out_dims)

    return rule


def _batched(graph, name, axis_size, dims, bases):
    axis = _rule_context.axis  # NOTE [named axes]; read on the calling thread
    return _derived(graph, name, ("staging vmap", axis_size, dims, bases, axis),
                    lambda: batch_graph(graph, axis_size, dims, bases, axis=axis))


def graph_basis_rule(prim):
    """The rule of a graph-applying primitive for identity-basis inputs
    (NOTE [identity bases]): the graph is batched with the marks, so that
    the products inside skip them too. Offsets known only when a loop runs
    are left to the ordinary rule (the graph would hold one of them)."""

    def rule(axis_size, vals, dims, bases, *, graph, name):
        if not all(b is None or isinstance(b, (int, np.integer)) for b in bases):
            return None
        bases = tuple(None if b is None else int(b) for b in bases)
        batched, out_dims = _batched(graph, name, axis_size, tuple(dims), bases)
        outs = bind(prim, *vals, graph=batched, name=f"vmap({name})")
        return outs, list(out_dims), [None] * len(outs)

    return rule


jvp_rules[jit_call] = _jvp
transpose_rules[jit_call] = graph_transpose_rule(jit_call)
batch_rules[jit_call] = graph_batch_rule(jit_call)
basis_rules[jit_call] = graph_basis_rule(jit_call)
