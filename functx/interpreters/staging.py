"""Staging: recording primitives into a graph instead of running them.

A `Graph` is functx's program representation: input variables, a list of
equations (primitive, inputs, outputs, parameters) and outputs. An input of
an equation is either a `Var` or a `Const` holding a value from a lower level
(a concrete array, a JAX tracer or a tracer of an enclosing transform).

The reverse-mode interpreter records the linear part of every derivative
into a graph (its "tape"), which `linearize` evaluates forwards and `vjp`
transposes. `shape_rules` (one per primitive, filled in next to each
primitive) give the output avals of staged equations.
"""

import itertools

from ..core import _state as _core_state
from ..core import (
    Aval,
    Interpreter,
    Tracer,
    aval_of,
    bind,
    check_usable,
    is_inexact_dtype,
    missing_rule,
)
from ..errors import ConcretizationError, describe_user_line

shape_rules = {}  # Primitive -> callable(*avals, **params) -> Aval | [Aval]


def jax_shape_rule(prim):
    """A shape rule that asks JAX's abstract evaluation of `prim`'s JAX
    counterpart (slower than a hand-written rule, always right)."""
    jax_prim = prim.jax

    def rule(*avals, **params):
        from jax._src import core as jcore

        javals = [jcore.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
        out = jax_prim.abstract_eval(*javals, **params)
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (set, frozenset)):
            out = out[0]
        if prim.multiple_results:
            return [Aval(o.shape, o.dtype, o.weak_type) for o in out]
        return Aval(out.shape, out.dtype, out.weak_type)

    return rule


def output_avals(prim, in_avals, params):
    rule = shape_rules.get(prim)
    if rule is None:
        if prim.jax is None:
            raise missing_rule(prim, "shape inference")
        rule = shape_rules[prim] = jax_shape_rule(prim)
    return rule(*in_avals, **params)


# --------------------------------------------------------------------------
# The graph representation


_var_ids = itertools.count()


class Var:
    """A value defined inside a graph."""

    __slots__ = ("aval", "id")

    def __init__(self, aval):
        self.aval = aval
        self.id = next(_var_ids)

    def __repr__(self):
        return f"Var({self.aval.str_short()})"


class Const:
    """A value captured by a graph from outside it."""

    __slots__ = ("value", "aval")

    def __init__(self, value, aval=None):
        self.value = value
        self.aval = aval_of(value) if aval is None else aval


class Eqn:
    __slots__ = ("prim", "inputs", "outputs", "params")

    def __init__(self, prim, inputs, outputs, params):
        self.prim = prim
        self.inputs = inputs
        self.outputs = outputs
        self.params = params


# The mark a top-level grad puts on the name of the one jitted call it
# differentiates (NOTE [a jitted function differentiated alone] in
# primitives/call.py). Asked of graphs here, where the eager queue and the
# reverse interpreter can ask without importing the primitives.
ALONE = "[alone] "


def is_alone(name):
    return isinstance(name, str) and ALONE in name


def holds_alone_call(graph):
    """Whether `graph` has a marked call among its equations: it must not
    be inlined into a larger program."""
    found = graph.cache.get("holds alone call")
    if found is None:
        found = graph.cache["holds alone call"] = any(is_alone(e.params.get("name")) for e in graph.eqns)
    return found


class Graph:
    """A staged program: `inputs` (Vars), `eqns` and `outputs` (Vars or
    Consts). Graphs are immutable once built; `cache` holds what is derived
    from one (its jvp, batched and transposed graphs, its compiled form), so
    a graph that is reused is transformed and compiled once."""

    __slots__ = ("inputs", "eqns", "outputs", "cache", "__weakref__")

    def __init__(self, inputs, eqns, outputs):
        self.inputs = inputs
        self.eqns = eqns
        self.outputs = outputs
        self.cache = {}

    @property
    def in_avals(self):
        return [v.aval for v in self.inputs]

    @property
    def out_avals(self):
        return [x.aval for x in self.outputs]

    def __call__(self, *args):
        return eval_graph(self, args)

    def __str__(self):
        return pretty_print(self)

    __repr__ = __str__


def one_equation_graph(prim, params, in_avals):
    """The graph applying `prim` once to inputs of `in_avals` (what the
    eager caches stage and transform, one primitive application at a
    time)."""
    ins = [Var(a) for a in in_avals]
    out_avals = output_avals(prim, in_avals, params)
    outs = [Var(a) for a in (out_avals if prim.multiple_results else [out_avals])]
    return Graph(ins, [Eqn(prim, ins, outs, params)], outs)


def eval_graph(graph, args):
    """Run `graph` on `args` by binding each equation (so it works at any
    level of the interpreter stack)."""
    env = {}
    for v, x in zip(graph.inputs, args, strict=True):
        env[v] = x
    for eqn in graph.eqns:
        invals = [env[x] if type(x) is Var else x.value for x in eqn.inputs]
        out = bind(eqn.prim, *invals, **eqn.params)
        if eqn.prim.multiple_results:
            for v, o in zip(eqn.outputs, out, strict=True):
                env[v] = o
        else:
            env[eqn.outputs[0]] = out
    return [env[x] if type(x) is Var else x.value for x in graph.outputs]


def dce(graph):
    """Drop the equations no output depends on."""
    live = {x for x in graph.outputs if type(x) is Var}
    kept = []
    for eqn in reversed(graph.eqns):  # every eager grad's tape: plain loops
        outs = eqn.outputs
        if (outs[0] in live if len(outs) == 1 else not live.isdisjoint(outs)) \
                or eqn.prim.effectful:
            kept.append(eqn)
            for x in eqn.inputs:
                if type(x) is Var:
                    live.add(x)
    kept.reverse()
    return Graph(graph.inputs, kept, graph.outputs)


def split_known(graph, n_known_in, n_known_out):
    """Partial evaluation: split `graph` into the part computable from its
    first `n_known_in` inputs and the rest.

    Returns `(known, unknown, res_src)`. `unknown` maps residuals followed
    by the other inputs to the remaining outputs; `known` maps the known
    inputs to the first `n_known_out` outputs (which must be known) followed
    by the residuals that are not known inputs. `res_src[k]` says where
    residual k comes from: `i >= 0` is known input i (passed on as is, never
    copied through a compiled program's outputs), -1 the next extra output of
    `known`. Used to split a jvp graph into its primal part and its (linear)
    tangent part."""
    known = set(graph.inputs[:n_known_in])
    known_eqns, unknown_eqns = [], []
    for eqn in graph.eqns:
        if all(type(x) is not Var or x in known for x in eqn.inputs):
            known_eqns.append(eqn)
            known.update(eqn.outputs)
        else:
            unknown_eqns.append(eqn)
    # Residuals only for the unknown equations an unknown output needs: a
    # tangent computed and then dropped (reduce_max's jvp under
    # stop_gradient, in log_softmax) must not make the known part compute
    # and return its inputs.
    unknown_eqns = dce(Graph(graph.inputs, unknown_eqns, graph.outputs[n_known_out:])).eqns
    residuals = {}
    for eqn in unknown_eqns:
        for x in eqn.inputs:
            if type(x) is Var and x in known:
                residuals[x] = None
    for x in graph.outputs[n_known_out:]:
        if type(x) is Var and x in known:
            residuals[x] = None
    residuals = list(residuals)
    known_outs = graph.outputs[:n_known_out]
    assert all(type(x) is not Var or x in known for x in known_outs)
    position = {v: i for i, v in enumerate(graph.inputs[:n_known_in])}
    res_src = tuple(position.get(v, -1) for v in residuals)
    computed = [v for v, i in zip(residuals, res_src) if i < 0]
    known_graph = dce(Graph(graph.inputs[:n_known_in], known_eqns, known_outs + computed))
    unknown_graph = Graph(residuals + graph.inputs[n_known_in:], unknown_eqns,
                          graph.outputs[n_known_out:])
    return known_graph, unknown_graph, res_src


def _graphs(v):
    """The graphs a parameter holds (one, or a tuple of them: cond's branches)."""
    if isinstance(v, Graph):
        return [v]
    if isinstance(v, tuple) and v and all(isinstance(g, Graph) for g in v):
        return list(v)
    return []


def _fmt_param(v):
    if isinstance(v, Graph):
        return "{graph}"
    if _graphs(v):
        return f"{{{len(v)} graphs}}"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def pretty_print(graph, indent=0):
    """One line per equation, with the shapes and dtypes of what it defines;
    graphs held by an equation (a jit call) are printed below it, indented."""
    names = {}

    def name(x):
        if type(x) is Const:
            if x.aval.shape == ():
                try:
                    return f"{x.value.item() if hasattr(x.value, 'item') else x.value}:{x.aval.str_short()}"
                except Exception:  # a traced scalar has no item()
                    pass
            return f"const:{x.aval.str_short()}"
        if x not in names:
            n = len(names)
            letters = ""
            while True:
                letters = chr(ord("a") + n % 26) + letters
                n = n // 26 - 1
                if n < 0:
                    break
            names[x] = letters
        return names[x]

    def decl(v):
        return f"{name(v)}:{v.aval.str_short()}"

    pad = " " * indent
    lines = [pad + "{ lambda " + " ".join(decl(v) for v in graph.inputs) + "."]
    for eqn in graph.eqns:
        outs = " ".join(decl(v) for v in eqn.outputs)
        params = " ".join(f"{k}={_fmt_param(v)}" for k, v in eqn.params.items() if v is not None)
        head = eqn.prim.name + (f"[{params}]" if params else "")
        ins = " ".join(name(x) for x in eqn.inputs)
        lines.append(f"{pad}    {outs} = {head} {ins}".rstrip())
        for v in eqn.params.values():
            for g in _graphs(v):
                lines.append(pretty_print(g, indent + 8))
    outs = ", ".join(name(x) for x in graph.outputs)
    lines.append(f"{pad}  in ({outs}{',' if len(graph.outputs) == 1 else ''}) }}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# The staging interpreter


class StagingTracer(Tracer):
    __slots__ = ("var",)

    def __init__(self, interp, var):
        self._interp = interp
        self.var = var

    @property
    def aval(self):
        return self.var.aval


class StagingInterpreter(Interpreter):
    """Records every primitive applied to its tracers as an equation."""

    transform = "staging"
    blocks_grad = True  # NOTE [grad modes]; False for reverse mode's tape

    def __init__(self, transform="staging"):
        super().__init__()
        self.transform = transform
        self.eqns = []

    def new_input(self, aval):
        return StagingTracer(self, Var(aval))

    def process(self, prim, args, params):
        inputs = []
        in_avals = []
        for a in args:
            if type(a) is StagingTracer and a._interp is self:
                inputs.append(a.var)
                in_avals.append(a.var.aval)
            else:
                if isinstance(a, Tracer) and a._interp.level == self.level:
                    raise AssertionError(
                        f"functx internal error: `{prim.name}` mixes values of "
                        f"two interpreters at level {self.level}"
                    )
                c = Const(a)
                inputs.append(c)
                in_avals.append(c.aval)
        out_avals = output_avals(prim, in_avals, params)
        if prim.multiple_results:
            outs = [StagingTracer(self, Var(a)) for a in out_avals]
            self.eqns.append(Eqn(prim, inputs, [t.var for t in outs], params))
            if self.level <= _core_state.no_grad_level and self.blocks_grad:
                return [self._stop_gradient(o) for o in outs]
            return outs
        out = StagingTracer(self, Var(out_avals))
        self.eqns.append(Eqn(prim, inputs, [out.var], params))
        if self.level <= _core_state.no_grad_level and self.blocks_grad:
            return self._stop_gradient(out)
        return out

    def _stop_gradient(self, out):
        """NOTE [grad modes]: an operation staged inside a no_grad entered
        while this staging was active (user code under functx.jit) must stay
        non-differentiable when the graph is differentiated later: its
        floating outputs go through stop_gradient in the graph."""

        from ..primitives.elementwise import stop_gradient_p

        aval = out.var.aval
        if not is_inexact_dtype(aval.dtype):
            return out
        res = StagingTracer(self, Var(aval))
        self.eqns.append(Eqn(stop_gradient_p, [out.var], [res.var], {}))
        return res

    def concrete(self, tracer):
        raise ConcretizationError(
            f"{self.transform}: Python control flow on a staged value at "
            f"{describe_user_line()}: a staged value has a shape and dtype "
            f"({tracer.aval.str_short()}) but no concrete value. Use "
            "functx.numpy.where or functx.lax.cond, or mark the argument "
            "static."
        )

    def graph(self, inputs, outputs):
        """The graph from `inputs` (this interpreter's tracers) to `outputs`
        (its tracers or constants)."""
        in_vars = [t.var for t in inputs]
        out = []
        for o in outputs:
            if type(o) is StagingTracer and o._interp is self:
                out.append(o.var)
            else:
                out.append(Const(check_usable(o)))  # NOTE [escaped tracers]
        return Graph(in_vars, list(self.eqns), out)


def stage(fn, in_avals, transform="staging"):
    """Trace `fn` (flat inputs -> flat outputs) into a Graph with one input
    per aval. Values of enclosing transforms (and JAX tracers) that `fn`
    reaches through its closure are turned into extra inputs: returns
    `(graph, captured)` where `graph` takes the `in_avals` inputs followed by
    one input per captured value.

    `fn` runs under `jax.ensure_compile_time_eval()`: what it computes from
    concrete values alone (a constant a rule builds, a broadcast zero) stays
    a concrete constant of the graph even under an outer `jax.jit`, instead
    of becoming a JAX tracer that would be captured as an input (which the
    graph transforms, e.g. `batch_graph`, do not allow). Operations on JAX
    tracers that `fn` closes over are traced as usual."""
    import jax

    from ..core import new_interpreter

    with new_interpreter(StagingInterpreter(transform)) as st, jax.ensure_compile_time_eval():
        ins = [st.new_input(a) for a in in_avals]
        outs = fn(*ins)
        graph = st.graph(ins, outs)
    return closure_convert(graph)


def closure_convert(graph):
    """Replace the constants of `graph` that are tracers (of functx or of
    JAX) by new inputs appended to its inputs; return `(graph, values)`."""
    import jax

    captured = {}

    def convert(x):
        if type(x) is Const and isinstance(x.value, (Tracer, jax.core.Tracer)):
            key = id(x.value)
            if key not in captured:
                captured[key] = (Var(x.aval), x.value)
            return captured[key][0]
        return x

    eqns = []
    for eqn in graph.eqns:
        inputs = [convert(x) for x in eqn.inputs]
        eqns.append(eqn if all(a is b for a, b in zip(inputs, eqn.inputs))
                    else Eqn(eqn.prim, inputs, eqn.outputs, eqn.params))
    outputs = [convert(x) for x in graph.outputs]
    if not captured:
        return graph, []
    new_vars = [v for v, _ in captured.values()]
    return Graph(graph.inputs + new_vars, eqns, outputs), [x for _, x in captured.values()]


def is_linear(x):
    """In a transpose rule: is this argument the linear (undefined) input?"""
    return type(x) is Var
