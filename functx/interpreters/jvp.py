"""Forward mode: the jvp interpreter.

A `JVPTracer` carries a primal and a tangent, both values of lower levels.
Each primitive's jvp rule (the table `jvp_rules`, filled in next to each
primitive) maps primals and tangents to the output primal and tangent.

Rule convention: `rule(primals, tangents, **params) -> (out, tangent_out)`
where any tangent may be a symbolic `Zero`; for primitives with multiple
results both outputs are lists. The same rules drive reverse mode
(interpreters/reverse.py), where the tangents are staged linear values.
"""

from ..core import (
    TRACER_TYPES, Interpreter, Tracer, Zero, aval_of, bind, check_usable, missing_rule,
    new_interpreter,
)
from ..core import _state as _core_state
from ..errors import MissingRuleError
from .staging import eval_graph, split_known, stage

jvp_rules = {}  # Primitive -> rule


class JVPTracer(Tracer):
    __slots__ = ("primal", "tangent", "_aval")

    def __init__(self, interp, primal, tangent):
        self._interp = interp
        # NOTE [escaped tracers]: a transform's inputs are checked here
        # (inline: this runs for every value every transform computes)
        if type(primal) in TRACER_TYPES:
            check_usable(primal)
        if type(tangent) in TRACER_TYPES:
            check_usable(tangent)
        self.primal = primal
        self.tangent = tangent
        self._aval = None

    @property
    def aval(self):
        a = self._aval
        if a is None:
            a = self._aval = aval_of(self.primal)
        return a


class JVPInterpreter(Interpreter):
    transform = "jvp"
    tracer_type = JVPTracer

    def __init__(self, transform="jvp"):
        super().__init__()
        self.transform = transform

    def box(self, primal, tangent):
        if type(tangent) is Zero:
            return check_usable(primal)  # NOTE [escaped tracers]: also a transform's inputs
        return self.tracer_type(self, primal, tangent)

    def unbox(self, x):
        """(primal, tangent) of any value, seen from this level."""
        if type(x) is self.tracer_type and x._interp is self:
            return x.primal, x.tangent
        return check_usable(x), Zero.of(x)  # NOTE [escaped tracers]

    def process(self, prim, args, params):
        if self.level <= _core_state.no_grad_level:  # NOTE [grad modes]
            return self.process_no_grad(prim, args, params)
        own = self.tracer_type
        primals = []
        tangents = []
        for a in args:
            if type(a) is own and a._interp is self:
                primals.append(a.primal)
                tangents.append(a.tangent)
            else:
                primals.append(a)
                tangents.append(Zero.of(a))
        return self.apply_rule(prim, primals, tangents, params)

    def process_no_grad(self, prim, args, params):
        """NOTE [grad modes]: inside a no_grad entered while this transform
        was active, apply `prim` to the primals only: its outputs are
        constants for this level (symbolic Zero tangents)."""
        return bind(prim, *[self.unbox(a)[0] for a in args], **params)

    def apply_rule(self, prim, primals, tangents, params):
        rule = jvp_rules.get(prim)
        if rule is None:
            raise missing_rule(prim, self.transform)
        try:
            out, tangent_out = rule(primals, tangents, **params)
        except MissingRuleError as e:
            if e.transform is None:  # a rule that could not name the transform
                e.name_transform(self.transform)
            raise
        if prim.multiple_results:
            return [self.box(o, t) for o, t in zip(out, tangent_out, strict=True)]
        return self.box(out, tangent_out)

    def concrete(self, tracer):
        return tracer.primal


class SplitJVP:
    """The jvp of a graph split in two (`jvp_graph`): `primal` maps the
    inputs to the outputs followed by the residuals it computes; `tangent`
    maps all residuals followed by the nonzero input tangents to the nonzero
    output tangents (`out_nonzero` marks which); `res_src` says, per
    residual, which input it is (>= 0) or that it is the next extra output
    of `primal` (-1)."""

    __slots__ = ("primal", "tangent", "out_nonzero", "res_src", "n_out")

    def residuals(self, primals, primal_outs):
        """All residuals, from the inputs and the outputs of `primal`."""
        out = []
        extra = self.n_out
        for i in self.res_src:
            if i >= 0:
                out.append(primals[i])
            else:
                out.append(primal_outs[extra])
                extra += 1
        return out


def graph_jvp_pairs(graph, nonzero, args):
    """Run `graph` under a fresh jvp interpreter: `args` are its inputs
    followed by one tangent per input with `nonzero[i]`; returns one
    (primal, tangent) pair per output (tangents may be Zero). The shared
    step of every rule that differentiates a whole graph."""
    n = len(graph.inputs)
    tangents = iter(args[n:])
    with new_interpreter(JVPInterpreter()) as jv:
        boxed = [jv.box(p, next(tangents)) if nz else p
                 for p, nz in zip(args[:n], nonzero, strict=True)]
        return [jv.unbox(o) for o in eval_graph(graph, boxed)]


def jvp_graph(graph, nonzero):
    """The jvp of a staged graph as a `SplitJVP`: a primal part and a tangent
    part linear in the tangents, so reverse mode can stage the tangent part
    on its tape and transpose it. `nonzero[i]` says whether input i has a
    (non-Zero) tangent. Cached on `graph`."""
    key = ("jvp", nonzero)
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
    full, captured = stage(fn, avals + [a for a, nz in zip(avals, nonzero) if nz], "jvp")
    assert not captured
    split = SplitJVP()
    split.primal, split.tangent, split.res_src = split_known(full, n, len(graph.outputs))
    split.out_nonzero = tuple(out_nonzero)
    split.n_out = len(graph.outputs)
    graph.cache[key] = split
    return split
