"""Custom derivative rules: `custom_jvp_call`, `custom_vjp_call` and the
linear `custom_lin` they emit.

NOTE [custom derivative rules]
A function with a custom derivative stays one unit under every transform.
Both primitives take `*consts, *primals`: the first `num_consts` inputs are
values the function reads without differentiating them (closed-over values,
nondiff_argnums arrays), the rest are its differentiable inputs. Their
params hold the primal function as a staged Graph (`call`, inputs `consts +
primals`), evaluated at the bottom of the stack and staged / batched like
any graph, and a *rule object* that the derivative rules call:

* a jvp rule object (`custom_jvp_call`): `rule(consts, primals, tangents)
  -> (outs, out_tangents)`, lists, Zero allowed among the tangents. The
  tangents it receives are whatever the jvp interpreter holds: values for
  forward mode, tape tracers in reverse mode (NOTE [reverse mode = jvp +
  staging + transpose]), so the rule's output tangent must be linear in the
  input tangents and built from primitives that transpose.
* a vjp rule object (`custom_vjp_call`): `fwd(consts, primals) -> (outs,
  residuals, res_tree)` and `bwd(res_tree, residuals, cts) -> one cotangent
  per primal` (Zero allowed). The jvp rule runs `fwd` on the primals and
  applies `custom_lin` to the tangents: reverse mode records `custom_lin` on
  its tape and transposes it by calling `bwd`.

Rule objects also carry `n_closure`: the leading consts that the user's
rules read through their closure rather than as arguments (values of
enclosing transforms the function closes over; JAX's own consts for lifted
rules). A nonzero tangent on one of those cannot be honoured by the rule
and raises instead of giving a silently wrong derivative.

Evaluation is the graph, except under JAX's tracing: a decorator's
function without consts then goes to its jax.custom_jvp / custom_vjp twin,
and any other to a JAX custom function made around its rule object (NOTE
[custom rules under JAX's transforms]), so a custom function inside lifted
JAX code, or under JAX's own transforms, keeps its rule (`_call_impl`).

NOTE [forward mode of custom_vjp]
JAX refuses `jvp` of a custom_vjp function. functx derives it: `custom_lin`
maps tangents to output tangents by the transpose of `bwd` (linear in the
cotangents): bwd is staged as a graph of `(residuals, cts)`, transposed with
`transpose_graph` and evaluated on the tangents. A bwd that is not linear
in the cotangents (gradient clipping) has no transpose: forward mode then
raises, naming the function. (An *affine* bwd, e.g. `g + 1`, is not
detected; a bwd is a vector-Jacobian product and so must be linear.)

NOTE [batched custom rules]
The batch rules move every batched input to axis 0, batch `call` with
every output at axis 0, and wrap the rule object (`_BatchedJVPRule`,
`_BatchedVJPRule`) so that it runs the inner rule on values boxed for a
vmap interpreter and returns every output at axis 0; a batched bwd sums
the cotangent of an unbatched input over the batch. The interpreter is a
fresh one, except when the user's rule closes over a value this vmap
batches: then it is that vmap's own interpreter (as JAX reuses its trace),
so the closed-over value keeps its batch axis. That works while the vmap
runs (grad(vmap(f)) of a custom_jvp f); a rule needed after it returned
(the bwd of such a custom_vjp) raises, asking for the value as an argument.

Lifting (bottom of this file): JAX's `custom_jvp_call` / `custom_vjp_call`
equations become these primitives (`LIFT_RULES`), their rules replayed from
the jaxprs JAX traces lazily, so lifted `jax.nn.relu`, `jax.nn.softplus` or
a user's `jax.custom_vjp` keep their JAX derivatives.
"""

import contextlib
import threading

import jax
import jax.extend.core
import numpy as np

from ..caches import WeaklyKeyed
from ..core import Tracer, Zero, aval_of, bind, is_inexact_dtype, new_interpreter
from ..errors import FunctxRuntimeError, MissingRuleError
from ..interpreters.batching import BatchInterpreter, batch_graph
from ..interpreters.eval import defimpl
from ..interpreters.jvp import jvp_graph
from ..interpreters.reverse import _Tape as Tape
from ..interpreters.reverse import transpose_graph, transpose_rule_of
from ..interpreters.staging import StagingTracer, eval_graph, stage
from .common import (
    batch_rules,
    bdim_to_front,
    defprim,
    instantiate,
    is_linear,
    jvp_rules,
    moveaxis,
    scalar_like,
    shape_rules,
    transpose_rules,
)
from .call import transpose_applied_graph
from .collectives import GraphCallPrimitive
from .elementwise import mul
from .reductions import reduce_sum

JaxTracer = jax.core.Tracer

custom_jvp_call = defprim("custom_jvp_call", multiple_results=True, cls=GraphCallPrimitive)
custom_vjp_call = defprim("custom_vjp_call", multiple_results=True, cls=GraphCallPrimitive)
custom_lin = defprim("custom_lin", multiple_results=True)


class Perturbed(threading.local):
    """Which primals of a custom rule being differentiated carry tangents,
    while its rule runs; None outside. One for custom_vjp
    (`CustomVJPPrimal.perturbed` of rules defined with symbolic_zeros=True),
    one for autograd.Function (`ctx.needs_input_grad`)."""

    flags = None


perturbed = Perturbed()


@contextlib.contextmanager
def perturbed_while(flags, state=perturbed):
    prev, state.flags = state.flags, flags
    try:
        yield
    finally:
        state.flags = prev


# --------------------------------------------------------------------------
# Helpers shared by the rules


def is_float(aval):
    return is_inexact_dtype(aval.dtype)


def float0_zeros(aval):
    """The tangent JAX gives an integer input: zeros of dtype float0."""
    return np.zeros(aval.shape, jax.dtypes.float0)


def tangent_value(t, aval):
    """A tangent handed to a user rule: zeros for a symbolic zero (float0
    zeros for a non-float input, as JAX does)."""
    if type(t) is Zero:
        return full_zeros(aval) if is_float(aval) else float0_zeros(aval)
    return t


def full_zeros(aval):
    """Concrete zeros even under an outer jax.jit (NOTE [constants inside
    rules] in control.py), so graphs staged around a rule capture nothing."""
    with jax.ensure_compile_time_eval():
        return instantiate(Zero(aval))  # (weakly typed where the primal is, as JAX's)


def _unbatched(aval):
    return aval.update(shape=aval.shape[1:])


def _check_closure(tangents, rule):
    """NOTE [custom derivative rules]: closed-over consts get no tangent."""
    for t in tangents[:rule.n_closure]:
        if type(t) is not Zero:
            raise FunctxRuntimeError(
                f"differentiating {rule.kind} function `{rule.name}`: the function "
                f"closes over a value ({aval_of(t).str_short()}) that is being "
                "differentiated, and its custom rule cannot say how the output "
                "depends on it. Pass that value as an explicit argument of the "
                f"{rule.kind} function instead of closing over it."
            )


def graph_jvp(graph, primals, tangents):
    """The jvp of a staged graph, evaluated at the current level: its
    primal part on the primals, its tangent part on the tangents (a generic
    rule for primitives whose meaning is a graph)."""
    nonzero = tuple(type(t) is not Zero for t in tangents)
    split = jvp_graph(graph, nonzero)
    results = eval_graph(split.primal, list(primals))
    outs = results[:split.n_out]
    touts = iter(())
    if any(split.out_nonzero):
        live = [t for t in tangents if type(t) is not Zero]
        touts = iter(eval_graph(split.tangent, split.residuals(primals, results) + live))
    return outs, [next(touts) if nz else Zero.of(o) for o, nz in zip(outs, split.out_nonzero)]


def graph_transpose(graph, cts, args):
    """Transpose rule of a primitive whose meaning is the (linear) graph."""
    return transpose_applied_graph(graph, cts, args, eval_graph)


def batch_to_front(graph, size, dims):
    """`graph` batched over inputs at `dims` (0 or None), every output
    batched at axis 0. Cached on `graph`."""
    key = ("vmap-front", size, dims)
    cached = graph.cache.get(key)
    if cached is not None:
        return cached
    batched, out_dims = batch_graph(graph, size, dims)
    if all(d == 0 for d in out_dims):
        result = batched
    else:
        def fn(*xs):
            outs = eval_graph(batched, xs)
            return [bdim_to_front(o, d, size) for o, d in zip(outs, out_dims)]

        result, captured = stage(fn, batched.in_avals, "vmap")
        assert not captured
    graph.cache[key] = result
    return result


def _to_front(vals, dims):
    return ([v if d is None else moveaxis(v, d, 0) for v, d in zip(vals, dims)],
            tuple(None if d is None else 0 for d in dims))


class _BatchedRule(WeaklyKeyed):
    """Common part of the batched rule objects (NOTE [batched custom
    rules]). Reusing the vmap's own interpreter is possible only while it
    runs and is above every value handed to the rule."""

    def __init__(self, inner, size, dims, primal_avals, closure_interps, interp):
        self.inner = inner
        self.primal_avals = primal_avals
        self.size = size
        self.dims = dims  # per input (consts then primals): 0 or None
        self.n_closure = inner.n_closure
        self.closure_interps = closure_interps
        self.interp = interp
        self.kind = inner.kind
        self.name = f"vmap({inner.name})"
        self.handles = {}

    def __repr__(self):
        return self.name

    def _enter(self, values):
        interp = self.interp
        if interp is None:
            return new_interpreter(BatchInterpreter(self.size))
        if not interp.alive or any(isinstance(v, Tracer) and v._interp.level >= interp.level
                                   for v in values):
            raise FunctxRuntimeError(
                f"vmap of the derivative of {self.kind} function `{self.inner.name}`: "
                "the function closes over a value batched by vmap, and its custom "
                "rule is needed outside that vmap (e.g. a custom_vjp's bwd, or forward "
                "mode of a custom_vjp). Pass that value as an explicit argument of the "
                f"{self.kind} function instead of closing over it."
            )
        return contextlib.nullcontext(interp)

    def _out(self, bi, x):
        if type(x) is Zero:
            return Zero(x.aval.update(shape=(self.size,) + x.aval.shape))
        v, d = bi.unbox(x)
        return bdim_to_front(v, d, self.size)


def _batched_rule(cls, rule, size, vals, dims):
    """The batched rule object for `rule`, cached unless it must keep the
    closed-over values of this call (see _BatchedRule)."""
    nc = rule.n_closure
    primal_avals = _batched_primal_avals(rule, size, dims)
    if rule.closure_interps is None or nc == 0:
        key = ("vmap", size, dims)
        brule = rule.handles.get(key)
        if brule is None:
            brule = rule.handles[key] = cls(rule, size, dims, primal_avals,
                                            rule.closure_interps, None)
        return brule
    interp = None
    for orig, d in zip(rule.closure_interps, dims[:nc]):
        if d is not None:
            interp = orig
            break
    return cls(rule, size, dims, primal_avals,
               [v._interp if isinstance(v, Tracer) else None for v in vals[:nc]], interp)


def _batched_primal_avals(rule, size, dims):
    nc = len(dims) - len(rule.primal_avals)
    return [a if d is None else a.update(shape=(size,) + a.shape)
            for a, d in zip(rule.primal_avals, dims[nc:])]


# --------------------------------------------------------------------------
# custom_jvp_call


def _call_impl(*args, call, num_consts, **params):
    # Under JAX's tracing (jax.jit, jax.grad, or a lifted JAX function being
    # staged: JAX's transforms outside functx's), the rule must reach JAX:
    # a decorator's function without consts goes to its jax.custom_jvp /
    # custom_vjp twin; any other (a rule lifted from JAX, a batched one,
    # one with consts) to a JAX custom function made around the rule object
    # (NOTE [custom rules under JAX's transforms]).
    rule = params.get("jvp") or params.get("rule")
    if any(isinstance(a, JaxTracer) for a in args):
        if num_consts == 0 and hasattr(rule, "jax_call"):
            return rule.jax_call(args)
        return _jax_twin(call, rule, num_consts, "jvp" in params)(*args)
    return eval_graph(call, args)


# NOTE [custom rules under JAX's transforms]
# A functx transform can run inside a JAX one: `jax.grad` of a function
# that calls `functx.vmap(f)`, or `jax.jit(functx.vmap(f))` inside a functx
# transform. The custom function's primitive then reaches the bottom of
# functx's stack with JAX tracers as its inputs, and evaluating its graph
# there would hand JAX the function's body, so JAX would differentiate the
# body and not the rule (`relu'(0)` became 0.5). Instead the call becomes a
# jax.custom_jvp / jax.custom_vjp function whose rules call the rule object
# on the JAX values (functx's primitives on JAX values run as JAX's). The
# consts (closed-over values, nondiff arrays) are its leading arguments,
# and the rules ask JAX which inputs carry tangents (symbolic zeros): a
# const that does is refused as functx refuses it (`_check_closure`), a
# primal that does not is a functx Zero. Made once per rule object and
# kind (`rule.handles`).
def _jax_twin(call, rule, num_consts, is_jvp):
    key = ("jax twin", call, num_consts)
    handles = rule.handles
    twin = handles.get(key)
    if twin is None:
        twin = handles[key] = (_jax_jvp_twin if is_jvp else _jax_vjp_twin)(call, rule, num_consts)
    return twin


def _zero_of(t, aval):
    """functx's Zero for a JAX symbolic zero, else `t`."""
    from jax.custom_derivatives import SymbolicZero

    return Zero(aval) if isinstance(t, SymbolicZero) else t


def _refuse_perturbed_consts(rule, perturbed_consts, avals):
    """`_check_closure` for JAX's flags of which consts carry tangents."""
    for p, a in zip(perturbed_consts, avals):
        if p:
            raise FunctxRuntimeError(
                f"differentiating {rule.kind} function `{rule.name}` under a JAX "
                f"transform: the function reads a value ({a.str_short()}) that is being "
                "differentiated without taking it as an argument, and its custom rule "
                "cannot say how the output depends on it. Pass that value as an explicit "
                f"argument of the {rule.kind} function instead of closing over it."
            )


def _instantiated(touts, outs):
    return [tangent_value(t, aval_of(o)) if type(t) is Zero else t for t, o in zip(touts, outs)]


def _jax_jvp_twin(call, rule, nc):
    def primal(*args):
        return eval_graph(call, list(args))

    fn = jax.custom_jvp(primal)

    def jvp(primals, tangents):
        primals = list(primals)
        avals = [aval_of(x) for x in primals]
        from jax.custom_derivatives import SymbolicZero

        _refuse_perturbed_consts(rule, [not isinstance(t, SymbolicZero) for t in tangents[:nc]],
                                 avals[:nc])
        ts = [_zero_of(t, a) for t, a in zip(tangents[nc:], avals[nc:])]
        if all(type(t) is Zero for t in ts):
            outs = eval_graph(call, primals)
            return outs, [tangent_value(Zero(aval_of(o)), aval_of(o)) for o in outs]
        outs, touts = rule(primals[:nc], primals[nc:], ts)
        return list(outs), _instantiated(touts, outs)

    fn.defjvp(jvp, symbolic_zeros=True)
    return fn


def _jax_vjp_twin(call, rule, nc):
    def primal(*args):
        return eval_graph(call, list(args))

    fn = jax.custom_vjp(primal)
    trees = {}  # residual structure by the flags of the inputs that carry tangents

    def fwd(*args):
        values = [a.value for a in args]
        flags = tuple(bool(a.perturbed) for a in args)
        avals = [aval_of(x) for x in values]
        _refuse_perturbed_consts(rule, flags[:nc], avals[:nc])
        inner = rule
        for_flags = getattr(rule, "for_flags", None)  # a rule lifted from JAX
        if for_flags is not None and any(flags[nc:]):
            inner = for_flags(flags[nc:])
        with perturbed_while(flags[nc:]):
            outs, res, res_tree = inner.fwd(values[:nc], values[nc:])
        # the residuals' pytree structure (static for JAX) names the flags
        tag = "".join("1" if f else "0" for f in flags)
        trees[tag] = (inner, res_tree, avals)
        return list(outs), {tag: list(res)}

    def bwd(saved, cts):
        (tag, res), = saved.items()
        inner, res_tree, avals = trees[tag]
        cts = [_zero_of(c, a) for c, a in zip(cts, call.out_avals)]
        in_cts = inner.bwd(res_tree, res, cts)
        zeros = [tangent_value(Zero(a), a) for a in avals[:nc]]
        return tuple(zeros + [tangent_value(c, a) for c, a in zip(in_cts, avals[nc:])])

    fn.defvjp(fwd, bwd, symbolic_zeros=True)
    return fn


def _call_shape(*avals, call, **params):
    return call.out_avals


def _call_transpose(cts, *args, call, **params):
    # Reached only when a rule applies a custom function to tangents.
    return graph_transpose(call, cts, args)


defimpl(custom_jvp_call, _call_impl)
shape_rules[custom_jvp_call] = _call_shape
transpose_rules[custom_jvp_call] = _call_transpose


def _custom_jvp_jvp(primals, tangents, *, call, jvp, num_consts, name):
    _check_closure(tangents, jvp)
    if all(type(t) is Zero for t in tangents[num_consts:]):
        outs = bind(custom_jvp_call, *primals, call=call, jvp=jvp, num_consts=num_consts,
                    name=name)
        return outs, [Zero.of(o) for o in outs]
    tape = None
    for t in tangents:
        if type(t) is StagingTracer and isinstance(t._interp, Tape):
            tape, start = t._interp, len(t._interp.eqns)
            break
    outs, touts = jvp(list(primals[:num_consts]), list(primals[num_consts:]),
                      list(tangents[num_consts:]))
    if tape is not None:
        _check_tape_linear(tape, start, tangents, jvp)
    return outs, touts


def _check_tape_linear(tape, start, tangents, rule):
    """Reverse mode transposes what a custom jvp rule does to its tangents
    (the equations it added to the tape): refuse one it cannot transpose
    now, naming the rule, rather than at the backward pass."""
    dependent = {t.var for t in tangents if type(t) is StagingTracer and t._interp is tape}
    for eqn in tape.eqns[start:]:
        if any(x in dependent for x in eqn.inputs):
            if transpose_rule_of(eqn.prim) is None:
                raise MissingRuleError(
                    f"reverse-mode of {rule.kind} function `{rule.name}`: its jvp rule "
                    f"applies `{eqn.prim.name}` to a tangent, and `{eqn.prim.name}` has "
                    "no transpose rule (it is not linear, or functx cannot transpose "
                    "it). Reverse mode transposes the rule's tangent computation, so it "
                    "must be linear in the tangents, built from linear operations "
                    "(+, -, * or / by primal values, dot, sums, indexing, where)."
                )
            dependent.update(eqn.outputs)


jvp_rules[custom_jvp_call] = _custom_jvp_jvp


class _BatchedJVPRule(_BatchedRule):
    def __call__(self, consts, primals, tangents):
        nc = len(consts)
        with self._enter(consts + primals + tangents) as bi:
            boxed = [bi.box(v, d) for v, d in zip(consts + primals, self.dims)]
            ts = [t if type(t) is not Zero else
                  Zero(_unbatched(t.aval) if d is not None else t.aval)
                  for t, d in zip(tangents, self.dims[nc:])]
            ts = [bi.box(t, d) if type(t) is not Zero else t
                  for t, d in zip(ts, self.dims[nc:])]
            outs, touts = self.inner(boxed[:nc], boxed[nc:], ts)
            return ([self._out(bi, o) for o in outs], [self._out(bi, t) for t in touts])


def _custom_jvp_batch(size, vals, dims, *, call, jvp, num_consts, name):
    vals, dims = _to_front(vals, dims)
    rule = _batched_rule(_BatchedJVPRule, jvp, size, vals, dims)
    outs = bind(custom_jvp_call, *vals, call=batch_to_front(call, size, dims), jvp=rule,
                num_consts=num_consts, name=f"vmap({name})")
    return outs, [0] * len(outs)


batch_rules[custom_jvp_call] = _custom_jvp_batch


# --------------------------------------------------------------------------
# custom_vjp_call and custom_lin


defimpl(custom_vjp_call, _call_impl)
shape_rules[custom_vjp_call] = _call_shape
transpose_rules[custom_vjp_call] = _call_transpose


class Lin(WeaklyKeyed):
    """The params of one `custom_lin`: which rule's bwd it transposes to,
    the residuals' structure and avals, which primals have tangents
    (`nonzero`) and which outputs get one (the floating ones). Interned per
    rule (`rule.handles`), so equal tapes share it."""

    def __init__(self, rule, res_tree, res_avals, nonzero, out_avals):
        self.rule = rule
        self.res_tree = res_tree
        self.res_avals = res_avals
        self.nonzero = nonzero
        self.out_avals = out_avals
        self.out_float = tuple(is_float(a) for a in out_avals)
        self.tangent_avals = [a.update(weak_type=False)
                              for a, f in zip(out_avals, self.out_float) if f]
        self.forward_graph = None

    def __repr__(self):
        return f"bwd of {self.rule.name}"

    def bwd(self, res, cts):
        """Cotangents of the primals that have tangents, from cotangents of
        the floating outputs."""
        it = iter(cts)
        full = [next(it) if f else Zero(a) for a, f in zip(self.out_avals, self.out_float)]
        in_cts = self.rule.bwd(self.res_tree, list(res), full)
        return [c for c, nz in zip(in_cts, self.nonzero) if nz]

    def forward(self):
        """NOTE [forward mode of custom_vjp]: `(graph, captured)`, the graph
        mapping residuals, captured values and tangents to the output
        tangents (all instantiated)."""
        if self.forward_graph is not None:
            return self.forward_graph
        nres = len(self.res_avals)
        n_ct = len(self.tangent_avals)
        live_avals = [a for a, nz in zip(self.rule.primal_avals, self.nonzero) if nz]
        what = (f"jvp of {self.rule.kind} function `{self.rule.name}`: functx derives "
                "forward mode by transposing its bwd rule, which must be linear in "
                "the cotangents")

        def bwd_fn(*xs):
            in_cts = self.bwd(xs[:nres], xs[nres:])
            return [full_zeros(a) if type(c) is Zero else c for c, a in zip(in_cts, live_avals)]

        fix = ("Use reverse mode (grad, vjp, jacrev) for this function, or give it a "
               "custom_jvp rule.")
        graph, captured = stage(bwd_fn, list(self.res_avals) + self.tangent_avals,
                                "custom_vjp bwd")
        linear = (False,) * nres + (True,) * n_ct + (False,) * len(captured)
        _check_linear(graph, linear, what, fix)
        try:
            transposed, in_nonzero = transpose_graph(graph, linear, (True,) * len(live_avals))
        except (MissingRuleError, NotImplementedError, AssertionError) as e:
            raise MissingRuleError(f"{what}; this one is not ({e}). {fix}") from None
        tangent_avals = self.tangent_avals

        def fwd_fn(*xs):
            outs = iter(eval_graph(transposed, xs))
            return [next(outs) if nz else full_zeros(a) for nz, a in zip(in_nonzero, tangent_avals)]

        ordered = list(self.res_avals) + [v.aval for v in graph.inputs[nres + n_ct:]] + live_avals
        fgraph, more = stage(fwd_fn, ordered, "custom_vjp jvp")
        assert not more
        result = (fgraph, captured)
        if not captured:
            self.forward_graph = result
        return result


def _check_linear(graph, linear, what, fix):
    """Refuse a bwd graph that applies a primitive without a transpose
    rule (so not linear) to a value depending on the cotangents."""
    from ..interpreters.staging import Var

    dependent = {v for v, lin in zip(graph.inputs, linear) if lin}
    for eqn in graph.eqns:
        if any(type(x) is Var and x in dependent for x in eqn.inputs):
            if transpose_rule_of(eqn.prim) is None:
                raise MissingRuleError(
                    f"{what}; this one applies `{eqn.prim.name}`, which is not linear, to "
                    f"a value computed from the cotangents. {fix}"
                )
            dependent.update(eqn.outputs)


def _custom_vjp_jvp(primals, tangents, *, call, rule, num_consts, name):
    _check_closure(tangents, rule)
    nc = num_consts
    nonzero = tuple(type(t) is not Zero for t in tangents[nc:])
    if not any(nonzero):
        outs = bind(custom_vjp_call, *primals, call=call, rule=rule, num_consts=nc, name=name)
        return outs, [Zero.of(o) for o in outs]
    for_flags = getattr(rule, "for_flags", None)  # a rule lifted from JAX
    if for_flags is not None:
        rule = for_flags(nonzero)
    with perturbed_while(nonzero):
        outs, res, res_tree = rule.fwd(list(primals[:nc]), list(primals[nc:]))
    res_avals = tuple(aval_of(r) for r in res)
    key = (res_tree, res_avals, nonzero)
    lin = rule.handles.get(key)
    if lin is None:
        lin = rule.handles[key] = Lin(rule, res_tree, res_avals, nonzero, call.out_avals)
    if not any(lin.out_float):
        return outs, [Zero.of(o) for o in outs]
    live = [t for t in tangents[nc:] if type(t) is not Zero]
    touts = iter(bind(custom_lin, *res, *live, lin=lin))
    return outs, [next(touts) if f else Zero.of(o) for o, f in zip(outs, lin.out_float)]


jvp_rules[custom_vjp_call] = _custom_vjp_jvp


class _BatchedVJPRule(_BatchedRule):
    def fwd(self, consts, primals):
        nc = len(consts)
        with self._enter(consts + primals) as bi:
            boxed = [bi.box(v, d) for v, d in zip(consts + primals, self.dims)]
            outs, res, res_tree = self.inner.fwd(boxed[:nc], boxed[nc:])
            return ([self._out(bi, o) for o in outs], [self._out(bi, r) for r in res], res_tree)

    def bwd(self, res_tree, res, cts):
        nc = len(self.dims) - len(self.inner.primal_avals)
        with self._enter(list(res) + list(cts)) as bi:
            res_b = [bi.box(r, 0) for r in res]
            cts_b = [Zero(_unbatched(c.aval)) if type(c) is Zero else bi.box(c, 0) for c in cts]
            in_cts = self.inner.bwd(res_tree, res_b, cts_b)
            out = []
            for c, d in zip(in_cts, self.dims[nc:]):
                if type(c) is Zero:
                    out.append(c if d is None else
                               Zero(c.aval.update(shape=(self.size,) + c.aval.shape)))
                    continue
                v, cd = bi.unbox(c)
                if d is not None:
                    out.append(bdim_to_front(v, cd, self.size))
                elif cd is not None:
                    out.append(reduce_sum(v, (cd,)))
                else:  # the same cotangent for every example
                    out.append(mul(v, scalar_like(v, self.size)))
            return out


def _custom_vjp_batch(size, vals, dims, *, call, rule, num_consts, name):
    vals, dims = _to_front(vals, dims)
    brule = _batched_rule(_BatchedVJPRule, rule, size, vals, dims)
    outs = bind(custom_vjp_call, *vals, call=batch_to_front(call, size, dims), rule=brule,
                num_consts=num_consts, name=f"vmap({name})")
    return outs, [0] * len(outs)


batch_rules[custom_vjp_call] = _custom_vjp_batch


def _lin_impl(*args, lin):
    graph, captured = lin.forward()
    nres = len(lin.res_avals)
    return eval_graph(graph, list(args[:nres]) + list(captured) + list(args[nres:]))


defimpl(custom_lin, _lin_impl)
shape_rules[custom_lin] = lambda *avals, lin: lin.tangent_avals


def _lin_transpose(cts, *args, lin):
    nres = len(lin.res_avals)
    assert not any(is_linear(r) for r in args[:nres]), "custom_lin: residuals are not linear"
    if all(type(c) is Zero for c in cts):
        return [None] * len(args)
    return [None] * nres + lin.bwd(args[:nres], cts)


transpose_rules[custom_lin] = _lin_transpose


def _lin_jvp(primals, tangents, *, lin):
    nres = len(lin.res_avals)
    if all(type(t) is Zero for t in tangents[:nres]):
        # Linear in the tangent inputs: its derivative is itself.
        outs = bind(custom_lin, *primals, lin=lin)
        if all(type(t) is Zero for t in tangents[nres:]):
            return outs, [Zero.of(o) for o in outs]
        live = [full_zeros(t.aval) if type(t) is Zero else t for t in tangents[nres:]]
        return outs, bind(custom_lin, *primals[:nres], *live, lin=lin)
    graph, captured = lin.forward()
    args = list(primals[:nres]) + list(captured) + list(primals[nres:])
    ts = list(tangents[:nres]) + [Zero.of(c) for c in captured] + list(tangents[nres:])
    return graph_jvp(graph, args, ts)


jvp_rules[custom_lin] = _lin_jvp


def _lin_batch(size, vals, dims, *, lin):
    graph, captured = lin.forward()
    nres = len(lin.res_avals)
    args = list(vals[:nres]) + list(captured) + list(vals[nres:])
    all_dims = tuple(dims[:nres]) + (None,) * len(captured) + tuple(dims[nres:])
    batched, out_dims = batch_graph(graph, size, all_dims)
    return eval_graph(batched, args), list(out_dims)


batch_rules[custom_lin] = _lin_batch


# --------------------------------------------------------------------------
# Lifting JAX's custom_jvp_call / custom_vjp_call (NOTE [lifting])


def _graph_of(closed_jaxpr, in_tracers=None, rule=None):
    """A jaxpr as a functx Graph, its equations on literals alone computed
    as concrete constants (NOTE [constants inside rules] in control.py).
    `rule`: the rule object whose JAX rule the jaxpr was traced from."""
    from ..lifting import graph_of_jaxpr

    for c in closed_jaxpr.consts:
        if isinstance(c, Tracer):
            # a JAX rule closing over a value of an enclosing functx
            # transform (JAX reuses its own trace there; functx cannot yet)
            what = f"{rule.kind} function `{rule.name}`" if rule is not None else "a custom function"
            raise FunctxRuntimeError(
                f"{what} (lifted from JAX): its custom rule reads a value of an enclosing "
                f"functx transform ({aval_of(c).str_short()}) through its closure, which "
                "functx cannot hand to a rule traced by JAX. Pass that value as an "
                "explicit argument of the function (JAX's nondiff_argnums for a value "
                "that is not differentiated), or define the function with "
                "functx.custom_jvp / functx.custom_vjp, whose rules may close over it."
            )

    with jax.ensure_compile_time_eval():
        return graph_of_jaxpr(closed_jaxpr, in_tracers)


class _LiftedJVPRule(WeaklyKeyed):
    """The jvp rule of a JAX custom_jvp_call: JAX's `jvp_jaxpr_fun`, traced
    on first use (with every tangent instantiated), as a Graph.

    JAX traces that rule from a Python function that may close over tracers
    of the trace that staged the equation (a traced `nondiff_argnums` value,
    as in `jax.scipy.special.expn`); that trace has finished by the time the
    rule is needed, so those tracers come back among the jaxpr's constants
    and must not be used. Each one names a jaxpr variable, which is also one
    of the equation's inputs (`operands`: the variables naming each input,
    NOTE [lifting]; or, closed over from an enclosing jax.jit, it is itself
    one of them): the graph takes those constants as leading inputs, fed
    the equation's own inputs at every call (`self.picks`)."""

    kind = "custom_jvp"

    def __init__(self, jvp_jaxpr_fun, num_consts, primal_avals, name, operands=()):
        self.fun = jvp_jaxpr_fun
        self.n_closure = num_consts
        self.closure_interps = None  # its jaxprs read no closed-over functx value
        self.primal_avals = primal_avals
        self.name = name
        self.operands = operands
        self.graph = None
        self.picks = ()
        self.handles = {}

    def __repr__(self):
        return f"jvp of {self.name}"

    def _trace(self):
        jaxpr, jconsts, out_zeros = self.fun.call_wrapped(*[False] * len(self.primal_avals))
        closed, self.picks, tracers = _closure_as_inputs(jaxpr, jconsts, self.operands,
                                                         self, "jvp rule")
        self.graph = _graph_of(closed, tracers, self)
        self.out_zeros = list(out_zeros)
        self.operands = ()  # not needed any more

    def __call__(self, consts, primals, tangents):
        if self.graph is None:
            self._trace()
        ts = [tangent_value(t, a) for t, a in zip(tangents, self.primal_avals)]
        results = eval_graph(self.graph, _picked(self.picks, consts, primals) + list(primals) + ts)
        n = len(self.out_zeros)
        outs, touts = results[:n], iter(results[n:])
        tangents_out = []
        for o, z in zip(outs, self.out_zeros):
            t = Zero.of(o) if z else next(touts)
            if type(t) is not Zero and aval_of(t).dtype == _float0():
                t = Zero.of(o)
            tangents_out.append(t)
        return outs, tangents_out


def _picked(picks, consts, primals):
    """The equation inputs (consts then primals) at the indices `picks`."""
    if not picks:
        return []
    args = list(consts) + list(primals)
    return [args[i] for i in picks]


def _closure_as_inputs(jaxpr, consts, operands, rule, what):
    """`jaxpr` closed over `consts`, with the constants that are JAX tracers
    (of a finished trace) turned into its leading inputs; and for each of
    those, the index of the equation input it is (see _LiftedJVPRule); and
    per input of the new jaxpr, the tracer it replaces or None, for
    `_graph_of` (so that a rule lifted inside it and closing over the same
    tracer finds it among its equation's inputs, as in higher orders).
    `what` names the user's rule the jaxpr was traced from, for errors."""
    from jax._src import core as jcore

    def traced(c):  # a value of a trace: JAX's, or a functx transform's
        return isinstance(c, (jcore.Tracer, Tracer))

    if not any(traced(c) for c in consts):
        return jax.extend.core.ClosedJaxpr(jaxpr, consts), (), None
    index = {}  # by id: the names are held alive by `operands`
    for i, names in enumerate(operands):
        for name in names:
            index.setdefault(id(name), i)
    constvars, invars = list(jaxpr.constvars), list(jaxpr.invars)
    if len(constvars) != len(consts):
        # jax 0.11+ (Jaxpr and ClosedJaxpr are one class): a jaxpr traced
        # with its constants returned beside it takes them as leading inputs
        constvars, invars = invars[:len(consts)], invars[len(consts):]
    kept_vars, kept, moved, tracers, picks = [], [], [], [], []
    for v, c in zip(constvars, consts, strict=True):
        if not traced(c):
            kept_vars.append(v)
            kept.append(c)
            continue
        i = index.get(id(c))  # the tracer itself, a constant of the program
        if i is None and isinstance(getattr(c, "val", None), jcore.Var):
            i = index.get(id(c.val))  # or the variable it stood for
        if i is None:
            raise MissingRuleError(
                f"differentiating {rule.kind} function `{rule.name}` (lifted from JAX): "
                f"its JAX {what} reads a traced value ({aval_of(c).str_short()}) that the "
                "function neither takes nor reads itself, so functx cannot supply it to "
                "the rule (a value of a finished JAX trace, or of an enclosing functx "
                "transform). Pass that value to the function as an argument, or "
                f"write the function with functx.{rule.kind}."
            )
        moved.append(v)
        tracers.append(c)
        picks.append(i)
    info = jaxpr.debug_info
    if info is not None and info.arg_names is not None:
        names = tuple(info.arg_names)[len(info.arg_names) - len(invars):]  # of `invars`
        info = info._replace(arg_names=("",) * len(moved) + names)
    jaxpr = jaxpr.replace(constvars=kept_vars, invars=moved + invars, debug_info=info)
    in_tracers = tracers + [None] * (len(jaxpr.invars) - len(moved))
    return jax.extend.core.ClosedJaxpr(jaxpr, kept), tuple(picks), in_tracers


# NOTE [fwd rules closing over lifted arguments]
# A lifted function is staged by jax.make_jaxpr; a custom_vjp call in it
# becomes an equation whose fwd rule JAX traces only when asked (the
# `fwd_jaxpr_thunk` parameter), which functx does when it differentiates
# the equation. A fwd rule may close over values of the staged trace (the
# lifted function's arguments); functx passes those as inputs of the
# equation (`_closure_as_inputs`). Since JAX 0.12.1 the thunk refuses such a
# closure (JAX's own grad(jit(f)) then has no way to supply the values);
# functx does have one, so it traces JAX's fwd function itself, read from
# the thunk, and gets the closed-over tracers back as constants as before.
# This reads JAX internals (the thunk's closure), so it is only a fallback
# after the thunk refused; anything unexpected re-raises JAX's error.


def _fwd_jaxpr(thunk, flags):
    """(jaxpr, consts) of a custom_vjp equation's fwd rule for the
    perturbed pattern `flags` (NOTE [fwd rules closing over lifted
    arguments])."""
    try:
        return thunk.call_wrapped(*flags)
    except jax.errors.UnexpectedTracerError:
        traced = _trace_fwd_closing_over_staged_values(thunk, flags)
        if traced is None:
            raise
        return traced


def _trace_fwd_closing_over_staged_values(thunk, flags):
    from jax._src import core as jcore
    from jax._src import linear_util as lu
    from jax._src.interpreters import partial_eval as pe

    def free_vars(fn):
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or cells is None:
            return {}
        return dict(zip(code.co_freevars, (c.cell_contents for c in cells)))

    tracer_of = free_vars(free_vars(getattr(thunk, "f", None)).get("fn"))
    fwd, in_avals = tracer_of.get("fwd"), tracer_of.get("in_avals")
    if not isinstance(fwd, lu.WrappedFun) or in_avals is None:
        return None
    for store in fwd.stores:  # filled by the refused attempt
        if store:
            store.reset()

    def with_flags(*args):  # fwd takes (value, perturbed) pairs
        return fwd.call_wrapped(*[x for pair in zip(args, flags) for x in pair])

    with jcore.set_current_trace(None):
        jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(
            lu.wrap_init(with_flags, debug_info=fwd.debug_info), list(in_avals))
    return jaxpr, consts


def _float0():
    return np.dtype(jax.dtypes.float0)


class _LiftedVJPRule(WeaklyKeyed):
    """fwd and bwd of a JAX custom_vjp_call: the fwd jaxpr (traced on first
    use, every input marked perturbed) and JAX's bwd function (traced per
    residual avals), as Graphs.

    As for `_LiftedJVPRule`, fwd and bwd may close over JAX tracers of a
    finished trace (a traced value the function closes over, or one that a
    function passed as a nondiff argument closes over); each is one of the
    equation's inputs (`operands`). fwd's graph takes those as leading
    inputs fed from the equation's inputs (`fwd_picks`). bwd receives no
    equation input, only residuals and cotangents: so fwd passes the inputs
    bwd reads (`carried`, indices of equation inputs) after JAX's residuals,
    and bwd's graph takes them as leading inputs. Which ones bwd reads is
    known only by tracing it, so the first fwd traces bwd on the residual
    and cotangent avals it will most likely see; a bwd traced later for
    other avals must read no other input."""

    kind = "custom_vjp"

    def __init__(self, params, primal_avals, name, operands=(), flags=None):
        self.params = params
        self.flags = flags  # per primal: is it perturbed (None: all are)
        self.variants = {}
        self.thunk = params["fwd_jaxpr_thunk"]
        self.jax_bwd_fun = params["bwd"]
        self.out_trees = params["out_trees"]
        self.n_closure = params["num_consts"]
        self.closure_interps = None
        self.primal_avals = primal_avals
        self.name = name
        self.operands = operands  # kept: bwd is traced again for new avals
        self.fwd_graph = None
        self.fwd_picks = ()
        self.carried = None
        self.bwd_graphs = {}
        self.handles = {}

    def __repr__(self):
        return f"fwd/bwd of {self.name}"

    def for_flags(self, flags):
        """The rule for one pattern of perturbed primals: JAX traces fwd per
        pattern (`CustomVJPPrimal.perturbed`, which e.g. Equinox checks), so
        its graphs and residuals are per pattern too."""
        sub = self.variants.get(flags)
        if sub is None:
            sub = self.variants[flags] = _LiftedVJPRule(
                self.params, self.primal_avals, self.name, self.operands, flags)
        return sub

    def _trace_fwd(self, n_primals):
        flags = self.flags if self.flags is not None else (True,) * n_primals
        jaxpr, jconsts = _fwd_jaxpr(self.thunk, flags)
        _, _, self.forwards = self.out_trees()
        # the equation's outputs: fewer than out_trees' where JAX dropped
        # unused ones (pe.dce_jaxpr), and its fwd jaxpr then returns those
        call = self.params["call_jaxpr"]
        self.n_out = len(getattr(call, "jaxpr", call).outvars)  # (a ClosedJaxpr, or a Jaxpr)
        # Residuals fwd returns as Python values (a `.perturbed` flag, a
        # count) are literals of its jaxpr; JAX hands them to bwd as they
        # are, so that bwd can branch on them: so does `_bwd_graph`.
        computed = iter(jaxpr.outvars[:len(jaxpr.outvars) - self.n_out])
        self.res_literals = tuple(
            _literal_value(next(computed)) if f is None else _NOT_LITERAL for f in self.forwards)
        closed, self.fwd_picks, tracers = _closure_as_inputs(jaxpr, jconsts, self.operands,
                                                             self, "fwd rule")
        self.fwd_graph = _graph_of(closed, tracers, self)

    def fwd(self, consts, primals):
        if self.fwd_graph is None:
            self._trace_fwd(len(primals))
        args = list(consts) + list(primals)
        results = eval_graph(self.fwd_graph, [args[i] for i in self.fwd_picks] + list(primals))
        n_res = len(results) - self.n_out
        pruned, outs = iter(results[:n_res]), results[n_res:]
        res = [next(pruned) if f is None else args[f] for f in self.forwards]
        if self.carried is None:  # learn which inputs bwd reads
            try:
                self._bwd_graph(tuple(aval_of(r) for r in res)
                                + tuple(_ct_aval(aval_of(o)) for o in outs))
            except Exception:  # noqa: BLE001 - refused for these guessed cotangents
                # (jax 0.12 under jax.vmap: nonzero ones for outputs shared
                # across the batch, NOTE [zero cotangents to JAX's bwd]); the
                # real call traces bwd again: carry every input for it
                if not _BWD_TAKES_SYMBOLIC_ZEROS:
                    raise
                self.carried = tuple(range(len(args)))
        return outs, res + [args[i] for i in self.carried], None

    def _bwd_graph(self, avals, zero_cts=()):
        """JAX's bwd on inputs of `avals` (residuals, cotangents) as a
        Graph taking first the carried inputs it reads, which of those
        (`slots`, positions in `carried`), and which of its results are
        symbolic zeros (not outputs of the graph)."""
        from jax._src import ad_util

        hit = self.bwd_graphs.get((avals, zero_cts))
        if hit is None:
            zeros = []

            literals = self.res_literals

            def flat(*xs):
                xs = [x if k >= len(literals) or literals[k] is _NOT_LITERAL else literals[k]
                      for k, x in enumerate(xs)]
                first_ct = len(xs) - len(zero_cts)
                for j, z in enumerate(zero_cts):
                    if z:
                        xs[first_ct + j] = _jax_symbolic_zero(avals[first_ct + j])
                out = self.jax_bwd_fun.call_wrapped(*xs)
                if isinstance(out, tuple):  # jax 0.12: (cotangents, bwd's log entries)
                    out = out[0]
                zeros[:] = [isinstance(c, ad_util.Zero) for c in out]
                return [c for c in out if not isinstance(c, ad_util.Zero)]

            closed = jax.make_jaxpr(flat)(*[a.to_jax() for a in avals])
            closed, picks, tracers = _closure_as_inputs(closed.jaxpr, closed.consts,
                                                        self.operands, self, "bwd rule")
            if self.carried is None:
                self.carried = tuple(dict.fromkeys(picks))
            if any(i not in self.carried for i in picks):
                raise MissingRuleError(
                    f"differentiating custom_vjp function `{self.name}` (lifted from "
                    "JAX): its JAX bwd rule, traced for new residual or cotangent "
                    "types, reads a traced input of the function that it did not read "
                    "before, which functx did not keep for it. Pass that value to the "
                    "function as an argument, or write it with functx.custom_vjp."
                )
            slots = tuple(self.carried.index(i) for i in picks)
            hit = self.bwd_graphs[avals, zero_cts] = (_graph_of(closed, tracers, self), slots,
                                                      list(zeros))
        return hit

    def bwd(self, res_tree, res, cts):
        # NOTE [zero cotangents to JAX's bwd]: where JAX's bwd takes symbolic
        # zeros (it instantiates them itself for a rule that wants arrays),
        # a zero cotangent goes in as one, as JAX's reverse mode does: under
        # jax.vmap, bwd tells shared primal outputs from a batch by them.
        zero_cts = tuple(type(c) is Zero for c in cts) if _BWD_TAKES_SYMBOLIC_ZEROS else ()
        cts = [tangent_value(c, c.aval) if type(c) is Zero else c for c in cts]
        n_res = len(res) - len(self.carried)
        res, carried = list(res[:n_res]), list(res[n_res:])
        args = res + cts
        graph, slots, zeros = self._bwd_graph(tuple(aval_of(x) for x in args), zero_cts)
        out = iter(eval_graph(graph, [carried[j] for j in slots] + args))
        return [Zero(a) if z else _real_ct(next(out), a) for z, a in zip(zeros, self.primal_avals)]


def _bwd_takes_symbolic_zeros():
    """Whether JAX's flattened custom_vjp bwd instantiates symbolic-zero
    cotangents itself for a rule defined without symbolic_zeros (jax 0.12:
    its `_flatten_bwd` takes that flag); 0.10's passes them to the rule."""
    try:
        import inspect

        from jax._src import custom_derivatives

        fn = custom_derivatives._flatten_bwd  # (in a partial: a linear_util transformation)
        return any("symbolic_zeros" in inspect.signature(f).parameters
                   for f in (fn, *getattr(fn, "args", ())) if callable(f))
    except (ImportError, AttributeError, TypeError, ValueError):
        return False


_BWD_TAKES_SYMBOLIC_ZEROS = _bwd_takes_symbolic_zeros()


def _jax_symbolic_zero(aval):
    from jax._src import core as jcore
    from jax._src.custom_derivatives import SymbolicZero

    return SymbolicZero(jcore.ShapedArray(aval.shape, aval.dtype))


_NOT_LITERAL = object()


def _literal_value(var):
    return var.val if isinstance(var, jax.extend.core.Literal) else _NOT_LITERAL


def _ct_aval(aval):
    """The aval of the cotangent bwd most likely gets for an output of
    `aval` (see `bwd`: float0 for a non-float output)."""
    if is_float(aval):
        return aval.update(weak_type=False)
    return aval.update(dtype=_float0(), weak_type=False)


def _real_ct(c, aval):
    return c if is_float(aval) else Zero(aval)


def _jaxpr_name(closed_jaxpr, default):
    info = getattr(closed_jaxpr.jaxpr, "debug_info", None)
    return getattr(info, "func_name", None) or default


def _in_avals(closed_jaxpr, num_consts):
    from ..core import Aval

    return [Aval(v.aval.shape, v.aval.dtype, v.aval.weak_type)
            for v in closed_jaxpr.jaxpr.invars[num_consts:]]


def _lift_custom_jvp(params, operands):
    call_jaxpr = params["call_jaxpr"]
    nc = params["num_consts"]
    name = _jaxpr_name(call_jaxpr, "custom_jvp")
    rule = _LiftedJVPRule(params["jvp_jaxpr_fun"], nc, _in_avals(call_jaxpr, nc), name,
                          operands)
    return custom_jvp_call, dict(call=_graph_of(call_jaxpr), jvp=rule, num_consts=nc,
                                 name=name)


def _lift_custom_vjp(params, operands):
    call_jaxpr = params["call_jaxpr"]
    nc = params["num_consts"]
    name = _jaxpr_name(call_jaxpr, "custom_vjp")
    rule = _LiftedVJPRule(params, _in_avals(call_jaxpr, nc), name, operands)
    return custom_vjp_call, dict(call=_graph_of(call_jaxpr), rule=rule, num_consts=nc,
                                 name=name)


_lift_custom_jvp.primitive = custom_jvp_call
_lift_custom_jvp.takes_operands = True
_lift_custom_vjp.primitive = custom_vjp_call
_lift_custom_vjp.takes_operands = True


def _register_lift_rules():
    from ..lifting import LIFT_RULES

    LIFT_RULES["custom_jvp_call"] = _lift_custom_jvp
    LIFT_RULES["custom_vjp_call"] = _lift_custom_vjp


_register_lift_rules()
