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

from ..core import (
    Aval,
    Interpreter,
    Tracer,
    aval_of,
    bind,
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


class Graph:
    """A staged program: `inputs` (Vars), `eqns` and `outputs` (Vars or
    Consts)."""

    __slots__ = ("inputs", "eqns", "outputs")

    def __init__(self, inputs, eqns, outputs):
        self.inputs = inputs
        self.eqns = eqns
        self.outputs = outputs

    def __call__(self, *args):
        return eval_graph(self, args)

    def __str__(self):
        return pretty_print(self)

    __repr__ = __str__


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
    for eqn in reversed(graph.eqns):
        if any(v in live for v in eqn.outputs):
            kept.append(eqn)
            live.update(x for x in eqn.inputs if type(x) is Var)
    kept.reverse()
    return Graph(graph.inputs, kept, graph.outputs)


def _fmt_param(v):
    if isinstance(v, Graph):
        return "{graph}"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def pretty_print(graph):
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

    lines = ["{ lambda " + " ".join(decl(v) for v in graph.inputs) + "."]
    for eqn in graph.eqns:
        outs = " ".join(decl(v) for v in eqn.outputs)
        params = " ".join(f"{k}={_fmt_param(v)}" for k, v in eqn.params.items() if v is not None)
        head = eqn.prim.name + (f"[{params}]" if params else "")
        ins = " ".join(name(x) for x in eqn.inputs)
        lines.append(f"    {outs} = {head} {ins}".rstrip())
    outs = ", ".join(name(x) for x in graph.outputs)
    lines.append(f"  in ({outs}{',' if len(graph.outputs) == 1 else ''}) }}")
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
            return outs
        out = StagingTracer(self, Var(out_avals))
        self.eqns.append(Eqn(prim, inputs, [out.var], params))
        return out

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
                out.append(Const(o))
        return Graph(in_vars, list(self.eqns), out)


def is_linear(x):
    """In a transpose rule: is this argument the linear (undefined) input?"""
    return type(x) is Var
