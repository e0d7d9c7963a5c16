"""Batching: the vmap interpreter.

A `BatchTracer` carries a lower-level value with one extra axis, `bdim`, the
batch axis. Values that are not batched are never boxed: `None` means "not
batched" everywhere. Each primitive's batching rule (the table
`batch_rules`, filled in next to each primitive) maps batched operands to a
batched result.

Rule convention: `rule(axis_size, vals, dims, **params) -> (out, out_dim)`
where `dims[i]` is the batch axis of `vals[i]` or None; for primitives with
multiple results `out` and `out_dim` are lists. `move_bdim` and
`bdim_to_front` are the helpers for moving batch axes.
"""

from ..core import Interpreter, Tracer, aval_of, missing_rule
from ..errors import ConcretizationError, describe_user_line

batch_rules = {}  # Primitive -> rule


class BatchTracer(Tracer):
    __slots__ = ("val", "bdim")

    def __init__(self, interp, val, bdim):
        self._interp = interp
        self.val = val
        self.bdim = bdim

    @property
    def aval(self):
        a = aval_of(self.val)
        b = self.bdim
        return a.update(shape=a.shape[:b] + a.shape[b + 1:])


class BatchInterpreter(Interpreter):
    transform = "vmap"

    def __init__(self, axis_size, randomness="error", transform="vmap"):
        super().__init__()
        self.axis_size = axis_size
        self.randomness = randomness
        self.transform = transform

    def box(self, val, bdim):
        if bdim is None:
            return val
        return BatchTracer(self, val, bdim)

    def unbox(self, x):
        if type(x) is BatchTracer and x._interp is self:
            return x.val, x.bdim
        return x, None

    def process(self, prim, args, params):
        vals = []
        dims = []
        for a in args:
            if type(a) is BatchTracer and a._interp is self:
                vals.append(a.val)
                dims.append(a.bdim)
            else:
                vals.append(a)
                dims.append(None)
        rule = batch_rules.get(prim)
        if rule is None:
            raise missing_rule(prim, "vmap")
        out, out_dim = rule(self.axis_size, vals, dims, **params)
        if prim.multiple_results:
            return [self.box(o, d) for o, d in zip(out, out_dim, strict=True)]
        return self.box(out, out_dim)

    def concrete(self, tracer):
        raise ConcretizationError(
            f"{self.transform}: data-dependent Python control flow at "
            f"{describe_user_line()}. A batched value "
            f"({tracer.aval.str_short()}, batch of {self.axis_size}) was "
            "converted to a Python bool/int/float, but each batch element may "
            "need a different answer. Use functx.numpy.where(cond, a, b) or "
            "functx.lax.cond for branches, or move the check outside vmap."
        )


def batch_graph(graph, axis_size, dims):
    """The graph of `graph` vmapped over inputs batched at `dims` (None: not
    batched). Returns `(batched, out_dims)`. Cached on `graph`."""
    from ..core import new_interpreter
    from .staging import eval_graph, stage

    key = ("vmap", axis_size, dims)
    cached = graph.cache.get(key)
    if cached is not None:
        return cached
    out_dims = []

    def fn(*args):
        with new_interpreter(BatchInterpreter(axis_size)) as bi:
            outs = eval_graph(graph, [bi.box(x, d) for x, d in zip(args, dims, strict=True)])
            pairs = [bi.unbox(o) for o in outs]
        out_dims[:] = [d for _, d in pairs]
        return [v for v, _ in pairs]

    avals = []
    for a, d in zip(graph.in_avals, dims, strict=True):
        avals.append(a if d is None else a.update(shape=a.shape[:d] + (axis_size,) + a.shape[d:]))
    batched, captured = stage(fn, avals, "vmap")
    assert not captured
    cached = graph.cache[key] = (batched, tuple(out_dims))
    return cached
