"""Structured control flow: the primitives `cond`, `scan` and `while`.

Each carries staged sub-programs (functx Graphs, interpreters/staging.py) as
parameters: `cond` one graph per branch, `scan` its body, `while` its
condition and its body. The user-facing functions that stage Python
callables into these graphs (`functx.lax.cond / switch / scan / while_loop /
fori_loop / map`) are in functx/lax.py; JAX's own `cond`, `scan` and `while`
equations met while lifting JAX code (NOTE [lifting]) are translated into
them at the bottom of this file.

Operand layouts (the JAX ones):
  cond   index, *operands                      branches: graphs operands -> outs
  scan   *consts, *init, *xs                   body: consts, carry, x -> carry, y
  while  *cond_consts, *body_consts, *init     cond_graph: cond_consts, carry -> pred
                                               body_graph: body_consts, carry -> carry

NOTE [control flow under transforms]
Each interpreter transforms a sub-program as a whole (as `jit_call` does,
primitives/call.py) and binds the primitive again on the new graphs, cached
on the original graph:

* jvp. The jvp of the body (or each branch) is staged with the tangents
  that are nonzero; for loops, which carries get a nonzero tangent is a
  fixed point (a carry's tangent may become nonzero after one iteration).
  Then there are two ways to bind it:
  - *forward*: when the tangents are ordinary values (jvp, jacfwd), one
    primitive computes primals and tangents together (for `scan`, one loop
    whose memory does not grow with its length);
  - *split*: when the tangents are staged values (reverse mode's tape, or
    `jvp_graph` splitting a graph into its known and its linear part), a
    *primal* primitive on primals only, which also returns the residuals the
    derivative needs, and a *tangent* primitive on residuals and tangents,
    linear in the tangents. Only the tangent one reaches the tape, and its
    transpose rule is what reverse mode runs. For `scan` the primal loop
    returns per-iteration residuals stacked (values that depend on the
    loop constants alone are hoisted out of the loop instead); for `cond`
    each branch returns its own residuals and zeros for the others'.
* transpose. A tangent `scan` transposes into a `scan` running the other
  way over the transposed body, carrying the cotangents of the carries and
  accumulating those of the linear constants; a tangent `cond` into a `cond`
  of the transposed branches. `while` has no transpose: its trip count is
  only known when it runs, so nothing can be stacked for the way back; its
  jvp is forward mode (and `linearize`) only, and reverse mode raises.
* batching. `scan` and `while` batch their body with the carries that
  become batched (a fixed point), moved to axis 0. `cond` with an unbatched
  index stays a `cond` of batched branches; with a batched index every
  branch runs and `select_n` picks each lane's result. `while` with a
  batched predicate runs until every lane is done, keeping finished lanes
  unchanged with `select_n`.
"""

import collections
import functools
import threading
import weakref

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np

from .. import caches, xla_cpu
from ..core import Aval, Tracer, Zero, aval_of, bind, is_inexact_dtype, jax_zeros, new_interpreter
from ..errors import MissingRuleError
from ..interpreters.batching import BatchInterpreter, batch_graph
from ..interpreters.eval import defimpl
from ..interpreters.jvp import graph_jvp_pairs
from ..interpreters.reverse import transpose_graph
from ..interpreters.staging import Graph, StagingTracer, Var, eval_graph, split_known, stage
from ..lifting import LIFT_RULES, Macro, graph_of_jaxpr
from ..lifting import ByIdentity as _ById  # a key part compared by identity
from .collectives import GraphCallPrimitive
from .common import (
    add_tangents,
    batch_rules,
    bdim_to_front,
    defprim,
    is_linear,
    jvp_rules,
    moveaxis,
    shape_rules,
    transpose_rules,
)

# GraphCallPrimitive: NOTE [named axes] (collectives in the graphs)
cond_p = defprim("cond", multiple_results=True, cls=GraphCallPrimitive)
scan_p = defprim("scan", multiple_results=True, cls=GraphCallPrimitive)
while_p = defprim("while", multiple_results=True, cls=GraphCallPrimitive)

_JaxTracer = jax.core.Tracer


# --------------------------------------------------------------------------
# Helpers shared by the three primitives


def _traced(x):
    return isinstance(x, (Tracer, _JaxTracer))


def _zeros(aval):
    """Zeros of `aval`, as weak as it (NOTE [weak types in rules]); copied
    from the host at the top level (`jax_zeros`: `jnp.zeros` would compile
    a program for each new shape, in a first eager call of grad of a scan)."""
    z = jax_zeros(aval.shape, aval.dtype)
    if aval.weak_type:
        z = jax.lax.convert_element_type_p.bind(z, new_dtype=z.dtype, weak_type=True,
                                                sharding=None)
    return z


def _staged(tangents):
    """Are these tangents staged values (so the jvp must be split)?"""
    return any(type(t) is StagingTracer for t in tangents)


def _as_jax(x, aval):
    """A graph output as a JAX value of exactly `aval`'s dtype (graph
    outputs may be Python or NumPy constants)."""
    if isinstance(x, (jax.Array, _JaxTracer)) and x.dtype == aval.dtype:
        return x
    return jnp.broadcast_to(jnp.asarray(x, aval.dtype), aval.shape)


def _fixpoint(step, start):
    """The least flags >= `start` with `step(flags) <= flags` (which
    carries get a nonzero tangent, or a batch axis, over iterations)."""
    cur = tuple(start)
    while True:
        new = tuple(a or b for a, b in zip(cur, step(cur), strict=True))
        if new == cur:
            return cur
        cur = new


def _split(xs, *sizes):
    out, i = [], 0
    for n in sizes:
        out.append(list(xs[i:i + n]))
        i += n
    out.append(list(xs[i:]))
    return out


def _jvp_full(graph, nonzero, inst):
    """The jvp of `graph` as one graph: its inputs followed by the nonzero
    input tangents map to its outputs followed by the output tangents that
    are nonzero or requested by `inst` (instantiated as zeros). Returns
    `(graph, out_nonzero)`; cached on `graph`."""
    key = ("cf-jvp", nonzero, inst)
    hit = graph.cache.get(key)
    if hit is not None:
        return hit
    out_nz = []

    def fn(*args):
        pairs = graph_jvp_pairs(graph, nonzero, args)
        outs, tans = [p for p, _ in pairs], []
        for (p, t), want in zip(pairs, inst, strict=True):
            if type(t) is Zero:
                out_nz.append(want)
                if want:
                    tans.append(_zeros(aval_of(p)))
            else:
                out_nz.append(True)
                tans.append(t)
        return outs + tans

    avals = graph.in_avals
    full, captured = stage(fn, avals + [a for a, nz in zip(avals, nonzero) if nz], "jvp")
    assert not captured
    hit = graph.cache[key] = (full, tuple(out_nz))
    return hit


def _out_nonzero(graph, nonzero):
    return _jvp_full(graph, nonzero, (False,) * len(graph.outputs))[1]


def _batch_forced(graph, size, dims, force):
    """`graph` vmapped over inputs batched at `dims`, with every batched
    output moved to axis 0, and the outputs marked in `force` batched (at 0)
    even when they do not depend on a batched input. Returns `(graph,
    out_dims)`; cached on `graph`."""
    key = ("cf-vmap", size, dims, force)
    hit = graph.cache.get(key)
    if hit is not None:
        return hit
    out_dims = []

    def fn(*args):
        with new_interpreter(BatchInterpreter(size)) as bi:
            outs = eval_graph(graph, [bi.box(x, d) for x, d in zip(args, dims, strict=True)])
            pairs = [bi.unbox(o) for o in outs]
        res = []
        for (v, d), f in zip(pairs, force, strict=True):
            if d is None and not f:
                res.append(v)
                out_dims.append(None)
            else:
                res.append(bdim_to_front(v, d, size))
                out_dims.append(0)
        return res

    avals = [a if d is None else a.update(shape=a.shape[:d] + (size,) + a.shape[d:])
             for a, d in zip(graph.in_avals, dims, strict=True)]
    batched, captured = stage(fn, avals, "vmap")
    assert not captured
    hit = graph.cache[key] = (batched, tuple(out_dims))
    return hit


def _natural_batched(graph, size, dims):
    """Which outputs of `graph` vmapped over `dims` are batched."""
    return tuple(d is not None for d in batch_graph(graph, size, dims)[1])


def _dims(flags):
    return tuple(0 if f else None for f in flags)


class _LRU:
    """A bounded mapping, least recently used entries dropped first;
    `on_drop(key, value)` runs for each entry dropped to keep the bound.
    Mutated only under `lock` (NOTE [caches shared between threads] in
    caches.py)."""

    def __init__(self, limit, on_drop=None):
        self.limit = limit
        self.on_drop = on_drop
        self.entries = collections.OrderedDict()
        self.lock = threading.Lock()
        self.dead = []  # (key, value) pairs to drop while the key still maps to that value

    def get(self, key):
        with self.lock:
            hit = self.entries.get(key)
            if hit is not None:
                self.entries.move_to_end(key)
            return hit

    def put(self, key, value):
        dropped = []
        with self.lock:
            self._purge()
            self.entries[key] = value
            self.entries.move_to_end(key)
            while len(self.entries) > self.limit:
                dropped.append(self.entries.popitem(last=False))
        if self.on_drop is not None:
            for k, v in dropped:
                self.on_drop(k, v)
        return value

    def drop_dead(self, key, value):
        """Drop `key` if it still maps to `value` (a weak reference's
        callback: it may run inside a garbage collection on a thread that
        holds `lock`; then the entry goes at the next insertion)."""
        try:
            self.dead.append((key, value))
            caches.run_if_free(self.lock, self._purge)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown (module globals cleared)
            pass

    def _purge(self):  # under `lock`
        while self.dead:
            key, value = self.dead.pop()
            if self.entries.get(key) is value:
                del self.entries[key]

    def __len__(self):
        return len(self.entries)

    def clear(self):
        with self.lock:
            self.entries.clear()
            self.dead.clear()


# NOTE [compiled loops]
# Eagerly (on concrete arrays) a `scan` or `while` runs as one jax.jit
# program of its lowering, compiled once per graph and parameters and kept
# on the graph (graph.cache), so it lives and dies with the graph: a body
# staged once (NOTE [staged bodies: one graph per code and closure] in
# functx/snapshot.py) compiles once, and the program of a body the user dropped
# goes with it. `_PROGRAMS` bounds how many are kept: it lists them (weakly),
# least recently used first, and past `PROGRAMS_LIMIT` the oldest program
# is released (compiled again if its graph is used again).

PROGRAMS_LIMIT = 32  # compiled loop programs kept (LRU)


class _Program:
    """A graph's compiled program (in graph.cache), listed in `_PROGRAMS`."""

    __slots__ = ("__weakref__", "fn")


def _release_program(key, ref):
    holder = ref()
    if holder is not None:
        holder.fn = None


_PROGRAMS = _LRU(PROGRAMS_LIMIT, _release_program)  # id(holder) -> weak ref to it


def _cached_jit(graph, key, lower, name):
    """The jax.jit-compiled lowering `lower(args)`, one per graph and key
    (NOTE [compiled loops]): eager calls on concrete arrays run one compiled
    program, compiled once while the graph is reused. `name` names it in
    JAX's compile logs."""
    holder = graph.cache.get(key)
    if holder is not None and holder.fn is not None:
        _PROGRAMS.get(id(holder))  # most recently used
        return holder.fn
    if holder is None:
        holder = graph.cache[key] = _Program()

    def program(*args):
        return lower(args)

    program.__name__ = program.__qualname__ = name
    # an eager program: its primitives keep their own calls, as in the
    # programs of the steps around it (NOTE [one rounding per primitive])
    holder.fn = xla_cpu.jit_by_size(program, xla_cpu.sizes_in_graph(graph), eager=True)
    ident = id(holder)
    _PROGRAMS.put(ident, weakref.ref(holder, lambda r: _PROGRAMS.drop_dead(ident, r)))
    return holder.fn


# --------------------------------------------------------------------------
# cond


def _cond_shape(index, *ops, branches):
    outs = [b.out_avals for b in branches]
    return [Aval(a.shape, a.dtype, all(o[i].weak_type for o in outs))
            for i, a in enumerate(outs[0])]


shape_rules[cond_p] = _cond_shape


def _run_branch(graph, avals, *ops):
    return [_as_jax(o, a) for o, a in zip(eval_graph(graph, ops), avals)]


def _cond_impl(index, *ops, branches):
    if not _traced(index):
        # A concrete index: run the chosen branch (clamped, as lax.switch).
        i = min(max(int(index), 0), len(branches) - 1)
        return _run_branch(branches[i], _cond_shape(None, branches=branches), *ops)
    avals = _cond_shape(None, branches=branches)
    fns = [functools.partial(_run_branch, b, avals) for b in branches]
    return list(jax.lax.switch(index, fns, *ops))


defimpl(cond_p, _cond_impl)


def _cond_jvp(primals, tangents, *, branches):
    index, *ops = primals
    nonzero = tuple(type(t) is not Zero for t in tangents[1:])
    inst = tuple(map(any, zip(*[_out_nonzero(b, nonzero) for b in branches])))
    if not any(inst):
        outs = bind(cond_p, *primals, branches=branches)
        return outs, [Zero.of(o) for o in outs]
    live = [t for t in tangents[1:] if type(t) is not Zero]
    n_out = len(branches[0].outputs)
    if not _staged(live):
        fulls = tuple(_jvp_full(b, nonzero, inst)[0] for b in branches)
        res = bind(cond_p, index, *ops, *live, branches=fulls)
        outs, touts = res[:n_out], iter(res[n_out:])
    else:
        s = _cond_split(branches, nonzero, inst)
        res = bind(cond_p, index, *ops, branches=s.primal)
        outs = res[:n_out]
        touts = iter(bind(cond_p, index, *res[n_out:], *[ops[i] for i in s.used_ops], *live,
                          branches=s.tangent))
    return outs, [next(touts) if nz else Zero.of(o) for o, nz in zip(outs, inst)]


class _CondSplit:
    __slots__ = ("primal", "tangent", "used_ops")


def _cond_split(branches, nonzero, inst):
    """The split jvp of a cond (NOTE [control flow under transforms]):
    `primal` branches map the operands to the outputs followed by every
    branch's residuals (zeros but for their own); `tangent` branches map
    those residuals, the operands some branch keeps as residuals
    (`used_ops`) and the nonzero tangents to the output tangents."""
    key = ("cf-cond-split", nonzero, inst, branches)
    hit = branches[0].cache.get(key)
    if hit is not None:
        return hit
    n_ops, n_out = len(branches[0].inputs), len(branches[0].outputs)
    parts = [split_known(_jvp_full(b, nonzero, inst)[0], n_ops, n_out) for b in branches]
    res_avals = [[v.aval for v in known.outputs[n_out:]] for known, _, _ in parts]
    used_ops = sorted({i for _, _, src in parts for i in src if i >= 0})
    op_avals = branches[0].in_avals

    def primal(k, *ops):
        outs = eval_graph(parts[k][0], ops)
        res = []
        for j, avals in enumerate(res_avals):
            res += outs[n_out:] if j == k else [_zeros(a) for a in avals]
        return outs[:n_out] + res

    flat_res = [a for avals in res_avals for a in avals]
    tan_avals = [a for a, nz in zip(op_avals, nonzero) if nz]
    starts = np.cumsum([0] + [len(a) for a in res_avals])

    def tangent(k, *args):
        res, used, tans = _split(args, len(flat_res), len(used_ops))
        mine = iter(res[starts[k]:starts[k + 1]])
        used = dict(zip(used_ops, used))
        _, unknown, src = parts[k]
        return eval_graph(unknown, [used[i] if i >= 0 else next(mine) for i in src] + tans)

    s = _CondSplit()
    s.used_ops = used_ops
    s.primal = tuple(stage(functools.partial(primal, k), op_avals, "jvp")[0]
                     for k in range(len(branches)))
    t_in = flat_res + [op_avals[i] for i in used_ops] + tan_avals
    s.tangent = tuple(stage(functools.partial(tangent, k), t_in, "jvp")[0]
                      for k in range(len(branches)))
    branches[0].cache[key] = s
    return s


jvp_rules[cond_p] = _cond_jvp


def _cond_transpose(cts, index, *ops, branches):
    assert not is_linear(index), "cond: the branch index cannot be linear"
    linear = tuple(is_linear(x) for x in ops)
    ct_nonzero = tuple(type(c) is not Zero for c in cts)
    if not any(linear) or not any(ct_nonzero):
        return [None] * (1 + len(ops))
    transposed, in_nonzero = _cond_transposed(branches, linear, ct_nonzero)
    fixed = [x for x, lin in zip(ops, linear) if not lin]
    live = [c for c in cts if type(c) is not Zero]
    outs = iter(bind(cond_p, index, *fixed, *live, branches=transposed)
                if any(in_nonzero) else ())
    nonzero = iter(in_nonzero)
    result = [None]
    for x, lin in zip(ops, linear):
        if not lin:
            result.append(None)
        else:
            result.append(next(outs) if next(nonzero) else Zero(x.aval))
    return result


def _cond_transposed(branches, linear, ct_nonzero):
    """Transposed branches mapping the non-linear operands and the nonzero
    cotangents to the cotangents of the linear operands that some branch
    gives one (zeros from the other branches)."""
    key = ("cf-cond-T", linear, ct_nonzero, branches)
    hit = branches[0].cache.get(key)
    if hit is not None:
        return hit
    each = [transpose_graph(b, linear, ct_nonzero) for b in branches]
    union = tuple(map(any, zip(*[nz for _, nz in each])))
    lin_avals = [a for a, lin in zip(branches[0].in_avals, linear) if lin]

    def fn(k, *args):
        graph, nz = each[k]
        outs = iter(eval_graph(graph, args))
        return [next(outs) if mine else _zeros(a)
                for a, mine, want in zip(lin_avals, nz, union) if want]

    in_avals = ([a for a, lin in zip(branches[0].in_avals, linear) if not lin]
                + [a for a, nz in zip(branches[0].out_avals, ct_nonzero) if nz])
    graphs = tuple(stage(functools.partial(fn, k), in_avals, "transpose")[0]
                   for k in range(len(branches)))
    hit = branches[0].cache[key] = (graphs, union)
    return hit


transpose_rules[cond_p] = _cond_transpose


def _cond_batch(size, vals, dims, *, branches):
    from .elementwise import clamp, select_n
    from .structural import broadcast_in_dim

    index, *ops = vals
    idim, *odims = dims
    odims = tuple(odims)
    n_out = len(branches[0].outputs)
    if idim is None:
        force = tuple(map(any, zip(*[_natural_batched(b, size, odims) for b in branches])))
        batched = [_batch_forced(b, size, odims, force) for b in branches]
        outs = bind(cond_p, index, *ops, branches=tuple(g for g, _ in batched))
        return outs, list(batched[0][1])
    # A batched index: every branch runs on every lane, select_n picks.
    index = moveaxis(index, idim, 0)
    if len(branches) > 1:
        index = clamp(np.int32(0), index, np.int32(len(branches) - 1))
    if len(branches) > 1 and any(isinstance(x, (Tracer, jax.core.Tracer)) for x in ops):
        # NOTE [branches a lane does not take]
        results = _lanes_taking_each_branch(index, size, ops, odims, branches, n_out)
    else:
        results = [eval_graph(_batch_forced(b, size, odims, (True,) * n_out)[0], ops)
                   for b in branches]
    if len(branches) == 1:
        return results[0], [0] * n_out
    outs = []
    for cases in zip(*results):
        shape = aval_of(cases[0]).shape
        which = index if shape == (size,) else broadcast_in_dim(index, shape, (0,))
        outs.append(select_n(which, *cases))
    return outs, [0] * n_out


batch_rules[cond_p] = _cond_batch


# NOTE [branches a lane does not take]
# Under vmap with a batched index every branch runs on every lane and
# select_n keeps each lane's own branch. The values are right, but a
# derivative taken through them (grad(vmap(f)), jax.grad of it) also flows
# through the branches a lane did not take, where it is multiplied by zero:
# `cond(x < 1e-3, lambda x: 1e-3, jnp.sqrt, x)` at x = 0 gets 0 * inf = NaN
# from sqrt's branch. So each branch sees its floating inputs with the
# derivative stopped on the lanes that take another branch (the same values:
# select_n(index == i, stop_gradient(x), x)), as JAX's rule does; unbatched
# inputs are broadcast to the batch for it. Only where some input is traced
# (by a functx transform or a JAX one, which could differentiate it): plain
# arrays keep the unguarded branches.
def _lanes_taking_each_branch(index, size, ops, odims, branches, n_out):
    from .elementwise import eq_p, select_n, stop_gradient
    from .structural import broadcast_in_dim

    guarded, dims = [], []
    for x, d in zip(ops, odims):
        if is_inexact_dtype(aval_of(x).dtype):
            x, d = bdim_to_front(x, d, size), 0
        guarded.append(x)
        dims.append(d)
    dims = tuple(dims)
    results = []
    for i, b in enumerate(branches):
        takes = bind(eq_p, index, np.int32(i))
        branch_ops = []
        for x, d in zip(guarded, dims):
            if d == 0 and is_inexact_dtype(aval_of(x).dtype):
                shape = aval_of(x).shape
                which = takes if shape == (size,) else broadcast_in_dim(takes, shape, (0,))
                x = select_n(which, stop_gradient(x), x)
            branch_ops.append(x)
        results.append(eval_graph(_batch_forced(b, size, dims, (True,) * n_out)[0], branch_ops))
    return results


# --------------------------------------------------------------------------
# scan


def _scan_shape(*avals, body, length, reverse, unroll, num_consts, num_carry):
    carry = body.in_avals[num_consts:num_consts + num_carry]
    ys = [a.update(shape=(length,) + a.shape) for a in body.out_avals[num_carry:]]
    return carry + ys


shape_rules[scan_p] = _scan_shape


def _scan_lower(args, body, length, reverse, unroll, num_consts, num_carry):
    consts, init, xs = _split(args, num_consts, num_carry)
    carry_avals = body.in_avals[num_consts:num_consts + num_carry]
    y_avals = body.out_avals[num_carry:]

    def step(carry, x):
        outs = eval_graph(body, [*consts, *carry, *x])
        return ([_as_jax(o, a) for o, a in zip(outs[:num_carry], carry_avals)],
                [_as_jax(o, a) for o, a in zip(outs[num_carry:], y_avals)])

    carry, ys = jax.lax.scan(step, [_as_jax(c, a) for c, a in zip(init, carry_avals)], xs,
                             length=length, reverse=reverse, unroll=unroll)
    return list(carry) + list(ys)


def _scan_impl(*args, body, **params):
    lower = functools.partial(_scan_lower, body=body, **params)
    if any(isinstance(a, _JaxTracer) for a in args):
        return lower(args)
    return _cached_jit(body, ("cf-scan-impl", tuple(sorted(params.items()))), lower,
                       "functx_scan")(*args)


defimpl(scan_p, _scan_impl)


def _scan_jvp(primals, tangents, *, body, length, reverse, unroll, num_consts, num_carry):
    nc, ncar = num_consts, num_carry
    params = dict(length=length, reverse=reverse, unroll=unroll)
    nz = tuple(type(t) is not Zero for t in tangents)
    if not any(nz):
        outs = bind(scan_p, *primals, body=body, num_consts=nc, num_carry=ncar, **params)
        return outs, [Zero.of(o) for o in outs]
    nz_c, nz_init, nz_x = (tuple(v) for v in _split(nz, nc, ncar))
    nz_carry = _fixpoint(lambda cur: _out_nonzero(body, nz_c + cur + nz_x)[:ncar], nz_init)
    ny = len(body.outputs) - ncar
    full, out_nz = _jvp_full(body, nz_c + nz_carry + nz_x, nz_carry + (False,) * ny)
    consts, init, xs = _split(primals, nc, ncar)
    t_c, t_init, t_x = _split(tangents, nc, ncar)
    ct = [t for t in t_c if type(t) is not Zero]
    xt = [t for t in t_x if type(t) is not Zero]
    initt = [_zeros(aval_of(p)) if type(t) is Zero else t
             for p, t, z in zip(init, t_init, nz_carry) if z]
    k_car = len(initt)
    if not _staged(ct + initt + xt):
        fwd = _scan_forward_body(full, nc, ncar, len(xs), len(ct), k_car, ny)
        res = bind(scan_p, *consts, *ct, *init, *initt, *xs, *xt, body=fwd,
                   num_consts=nc + len(ct), num_carry=ncar + k_car, **params)
        carry, cart, ys, yt = _split(res, ncar, k_car, ny)
    else:
        s = _scan_split(full, nc, ncar, len(xs), ny, len(ct), k_car)
        hoisted = iter(eval_graph(s.hoist, consts))
        consts = [consts[i] if i >= 0 else next(hoisted) for i in s.hoist_src]
        res = bind(scan_p, *consts, *init, *xs, body=s.primal, num_consts=len(consts),
                   num_carry=ncar, **params)
        carry, ys, stacked = _split(res, ncar, ny)
        t_consts = [consts[i] for i in s.const_res] + ct
        t_xs = stacked + [xs[j] for j in s.x_res] + xt
        tres = bind(scan_p, *t_consts, *initt, *t_xs, body=s.tangent,
                    num_consts=len(t_consts), num_carry=k_car, **params)
        cart, yt = _split(tres, k_car)
    cart, yt = iter(cart), iter(yt)
    out_t = [next(cart) if z else Zero.of(o) for o, z in zip(carry, nz_carry)]
    out_t += [next(yt) if z else Zero.of(o) for o, z in zip(ys, out_nz[ncar:])]
    return carry + ys, out_t


def _scan_forward_body(full, nc, ncar, nx, k_c, k_car, ny):
    """The jvp body with the scan layout: consts, const tangents, carries,
    carry tangents, xs, x tangents -> carries, carry tangents, ys, y tangents."""
    key = ("cf-scan-fwd", nc, ncar, nx, k_c, k_car, ny)
    hit = full.cache.get(key)
    if hit is None:
        c, car, x, ct, cart, xt = _split(full.inputs, nc, ncar, nx, k_c, k_car)
        o_car, o_y, o_cart, o_yt = _split(full.outputs, ncar, ny, k_car)
        hit = full.cache[key] = Graph(c + ct + car + cart + x + xt, full.eqns,
                                      o_car + o_cart + o_y + o_yt)
    return hit


class _ScanSplit:
    __slots__ = ("hoist", "hoist_src", "primal", "tangent", "const_res", "x_res")


def _scan_split(full, nc, ncar, nx, ny, k_c, k_car):
    """The split jvp of a scan (NOTE [control flow under transforms]) from
    its full jvp body `full` (consts, carries, xs, then the nonzero tangents
    of each: `k_c` const tangents, `k_car` carry tangents, then x tangents
    -> carries, ys, carry tangents, y tangents):

    * `hoist` computes, from the consts, what depends on them alone;
      `hoist_src` lists the new loop constants: a const (index >= 0) or the
      next output of `hoist` (-1);
    * `primal` (new consts, carries, xs -> carries, ys, residuals) returns
      the per-iteration residuals as extra ys: those it computes, then the
      carries the tangent body needs;
    * `tangent` takes as consts the new consts listed in `const_res` and the
      const tangents; as carries the carry tangents; as xs the stacked
      residuals, the xs listed in `x_res` and the x tangents.
    """
    key = ("cf-scan-split", nc, ncar, nx, ny, k_c, k_car)
    hit = full.cache.get(key)
    if hit is not None:
        return hit
    s = _ScanSplit()
    s.hoist, rest, s.hoist_src = split_known(full, nc, 0)
    n_r = len(s.hoist_src)
    known, unknown, src = split_known(rest, n_r + ncar + nx, ncar + ny)
    const_vars, computed_vars, carry_vars, x_vars = [], [], [], []
    s.const_res, carry_res, s.x_res = [], [], []
    for v, i in zip(unknown.inputs, src):
        if i < 0:
            computed_vars.append(v)
        elif i < n_r:
            const_vars.append(v)
            s.const_res.append(i)
        elif i < n_r + ncar:
            carry_vars.append(v)
            carry_res.append(i)
        else:
            x_vars.append(v)
            s.x_res.append(i - n_r - ncar)
    s.primal = Graph(known.inputs, known.eqns,
                     known.outputs + [known.inputs[i] for i in carry_res])
    ct_vars, cart_vars, xt_vars = _split(unknown.inputs[len(src):], k_c, k_car)
    s.tangent = Graph(const_vars + ct_vars + cart_vars + computed_vars + carry_vars
                      + x_vars + xt_vars, unknown.eqns, unknown.outputs)
    full.cache[key] = s
    return s


jvp_rules[scan_p] = _scan_jvp


def _scan_transpose(cts, *args, body, length, reverse, unroll, num_consts, num_carry):
    """Transpose a scan linear in its carries and in the consts and xs that
    are linear arguments (the tangent scans of `_scan_jvp`). Carries are
    taken as linear even when an argument is a constant (a zero tangent that
    was instantiated); their cotangents are then dropped."""
    nc, ncar = num_consts, num_carry
    consts, init, xs = _split(args, nc, ncar)
    ct_carry, ct_ys = _split(cts, ncar)
    lin_c = tuple(is_linear(x) for x in consts)
    lin_x = tuple(is_linear(x) for x in xs)
    ys_nz = tuple(type(c) is not Zero for c in ct_ys)
    if all(type(c) is Zero for c in cts):
        return [None] * len(args)
    s = _scan_transposed(body, nc, ncar, lin_c, lin_x, ys_nz)
    fixed_c = [x for x, lin in zip(consts, lin_c) if not lin]
    fixed_x = [x for x, lin in zip(xs, lin_x) if not lin]
    lin_consts = [x for x, lin in zip(consts, lin_c) if lin]
    acc0 = [_zeros(x.aval) for x, nz in zip(lin_consts, s.const_nz) if nz]
    ct0 = [_zeros(c.aval) if type(c) is Zero else c for c in ct_carry]
    live = [c for c in ct_ys if type(c) is not Zero]
    outs = bind(scan_p, *fixed_c, *acc0, *ct0, *fixed_x, *live, body=s.body, length=length,
                reverse=not reverse, unroll=unroll, num_consts=len(fixed_c),
                num_carry=len(acc0) + ncar)
    acc, ct_init, ct_xs = _split(outs, len(acc0), ncar)
    acc, ct_xs = iter(acc), iter(ct_xs)
    const_nz, x_nz = iter(s.const_nz), iter(s.x_nz)
    result = []
    for x, lin in zip(consts, lin_c):
        result.append((next(acc) if next(const_nz) else Zero(x.aval)) if lin else None)
    result += [c if is_linear(x) else None for x, c in zip(init, ct_init)]
    for x, lin in zip(xs, lin_x):
        result.append((next(ct_xs) if next(x_nz) else Zero(x.aval)) if lin else None)
    return result


class _ScanTransposed:
    __slots__ = ("body", "const_nz", "x_nz")


def _scan_transposed(body, nc, ncar, lin_c, lin_x, ys_nz):
    """The body of the transposed scan: consts are the non-linear consts;
    carries the accumulated cotangents of the linear consts that get one
    (`const_nz`), then the carry cotangents; xs the non-linear xs, then the
    nonzero y cotangents; ys the cotangents of the linear xs that get one
    (`x_nz`)."""
    key = ("cf-scan-T", nc, ncar, lin_c, lin_x, ys_nz)
    hit = body.cache.get(key)
    if hit is not None:
        return hit
    linear = lin_c + (True,) * ncar + lin_x
    tgraph, in_nz = transpose_graph(body, linear, (True,) * ncar + ys_nz)
    s = _ScanTransposed()
    c_nz, car_nz, s.x_nz = (tuple(v) for v in _split(in_nz, sum(lin_c), ncar))
    s.const_nz = c_nz
    c_avals, car_avals, x_avals = _split(body.in_avals, nc, ncar)
    fixed_c = [a for a, lin in zip(c_avals, lin_c) if not lin]
    fixed_x = [a for a, lin in zip(x_avals, lin_x) if not lin]
    acc_avals = [a for a, nz in zip([a for a, lin in zip(c_avals, lin_c) if lin], c_nz) if nz]
    y_avals = [a for a, nz in zip(body.out_avals[ncar:], ys_nz) if nz]

    def fn(*args):
        fc, acc, ctc, fx, cty = _split(args, len(fixed_c), len(acc_avals), ncar, len(fixed_x))
        outs = iter(eval_graph(tgraph, fc + fx + ctc + cty))
        c_cts = [next(outs) for nz in c_nz if nz]
        car_cts = [next(outs) if nz else _zeros(a) for nz, a in zip(car_nz, car_avals)]
        x_cts = list(outs)
        return [add_tangents(a, c) for a, c in zip(acc, c_cts)] + car_cts + x_cts

    s.body = stage(fn, fixed_c + acc_avals + car_avals + fixed_x + y_avals, "transpose")[0]
    body.cache[key] = s
    return s


transpose_rules[scan_p] = _scan_transpose


def _scan_batch(size, vals, dims, *, body, length, reverse, unroll, num_consts, num_carry):
    nc, ncar = num_consts, num_carry
    consts, init, xs = _split(vals, nc, ncar)
    c_dims, i_dims, x_dims = (tuple(d) for d in _split(dims, nc, ncar))
    # The scanned axis is axis 0 of each x: its batch axis must be another.
    new_xs, body_x_dims = [], []
    for x, d in zip(xs, x_dims):
        if d == 0:
            x, d = moveaxis(x, 0, 1), 1
        new_xs.append(x)
        body_x_dims.append(None if d is None else d - 1)
    body_x_dims = tuple(body_x_dims)

    def step(cur):
        return _natural_batched(body, size, c_dims + _dims(cur) + body_x_dims)[:ncar]

    carry_b = _fixpoint(step, tuple(d is not None for d in i_dims))
    ny = len(body.outputs) - ncar
    batched, out_dims = _batch_forced(body, size, c_dims + _dims(carry_b) + body_x_dims,
                                      carry_b + (False,) * ny)
    new_init = [bdim_to_front(x, d, size) if b else x for x, d, b in zip(init, i_dims, carry_b)]
    outs = bind(scan_p, *consts, *new_init, *new_xs, body=batched, length=length,
                reverse=reverse, unroll=unroll, num_consts=nc, num_carry=ncar)
    return outs, list(_dims(carry_b)) + [None if d is None else 1 for d in out_dims[ncar:]]


batch_rules[scan_p] = _scan_batch


# --------------------------------------------------------------------------
# while


def _while_shape(*avals, cond_graph, body_graph, cond_nconsts, body_nconsts):
    return body_graph.in_avals[body_nconsts:]


shape_rules[while_p] = _while_shape


def _while_lower(args, cond_graph, body_graph, cond_nconsts, body_nconsts):
    cc, bc, init = _split(args, cond_nconsts, body_nconsts)
    avals = body_graph.in_avals[body_nconsts:]
    pred_aval = Aval((), np.dtype(bool))

    def cond_fn(carry):
        return _as_jax(eval_graph(cond_graph, [*cc, *carry])[0], pred_aval)

    def body_fn(carry):
        return [_as_jax(o, a) for o, a in zip(eval_graph(body_graph, [*bc, *carry]), avals)]

    return list(jax.lax.while_loop(cond_fn, body_fn, [_as_jax(c, a) for c, a in zip(init, avals)]))


def _while_impl(*args, body_graph, **params):
    lower = functools.partial(_while_lower, body_graph=body_graph, **params)
    if any(isinstance(a, _JaxTracer) for a in args):
        return lower(args)
    key = ("cf-while-impl", tuple(sorted(params.items())))
    return _cached_jit(body_graph, key, lower, "functx_while")(*args)


defimpl(while_p, _while_impl)


def _while_jvp(primals, tangents, *, cond_graph, body_graph, cond_nconsts, body_nconsts):
    ncc, nbc = cond_nconsts, body_nconsts
    params = dict(cond_graph=cond_graph, body_graph=body_graph, cond_nconsts=ncc,
                  body_nconsts=nbc)
    _, bc, init = _split(primals, ncc, nbc)
    _, t_bc, t_init = _split(tangents, ncc, nbc)
    nz_b = tuple(type(t) is not Zero for t in t_bc)
    nz_init = tuple(type(t) is not Zero for t in t_init)
    if not any(nz_b + nz_init):
        outs = bind(while_p, *primals, **params)
        return outs, [Zero.of(o) for o in outs]
    nz_carry = _fixpoint(lambda cur: _out_nonzero(body_graph, nz_b + cur), nz_init)
    bct = [t for t in t_bc if type(t) is not Zero]
    initt = [_zeros(aval_of(p)) if type(t) is Zero else t
             for p, t, z in zip(init, t_init, nz_carry) if z]
    cond2, body2 = _while_jvp_graphs(cond_graph, body_graph, nbc, nz_b, nz_carry)
    res = bind(while_p, *primals[:ncc + nbc], *bct, *init, *initt, cond_graph=cond2,
               body_graph=body2, cond_nconsts=ncc, body_nconsts=nbc + len(bct))
    outs, touts = _split(res, len(init))
    if _staged(bct + initt):
        # Split for a staged caller (NOTE [control flow under transforms]):
        # the primal outputs from a loop on primals alone; the tangents from
        # the joint loop above, which has no transpose rule.
        outs = bind(while_p, *primals, **params)
    touts = iter(touts)
    return outs, [next(touts) if z else Zero.of(o) for o, z in zip(outs, nz_carry)]


def _while_jvp_graphs(cond_graph, body_graph, nbc, nz_b, nz_carry):
    """The joint primal-and-tangent loop: its body takes the body consts,
    their nonzero tangents, the carries and their tangents; its condition
    ignores the tangents."""
    key = ("cf-while-jvp", nz_b, nz_carry, cond_graph)
    hit = body_graph.cache.get(key)
    if hit is not None:
        return hit
    ncar = len(nz_carry)
    full, _ = _jvp_full(body_graph, nz_b + nz_carry, nz_carry)
    bc, car, bct, cart = _split(full.inputs, nbc, ncar, sum(nz_b))
    body2 = Graph(bc + bct + car + cart, full.eqns, full.outputs)
    extra = [Var(a) for a, z in zip(body_graph.in_avals[nbc:], nz_carry) if z]
    cond2 = Graph(cond_graph.inputs + extra, cond_graph.eqns, cond_graph.outputs)
    hit = body_graph.cache[key] = (cond2, body2)
    return hit


jvp_rules[while_p] = _while_jvp


def _while_transpose(cts, *args, **params):
    raise MissingRuleError(
        "reverse-mode differentiation (grad, vjp, jacrev) of `functx.lax.while_loop` "
        "(primitive `while`) is not supported: its number of iterations is only known "
        "when it runs, so the values of each iteration cannot be saved for the way back. "
        "Use functx.lax.scan, or functx.lax.fori_loop with static (Python int) bounds, "
        "which support reverse mode; forward mode (jvp, jacfwd) works through while_loop."
    )


transpose_rules[while_p] = _while_transpose


def _while_batch(size, vals, dims, *, cond_graph, body_graph, cond_nconsts, body_nconsts):
    ncc, nbc = cond_nconsts, body_nconsts
    cc, bc, init = _split(vals, ncc, nbc)
    cc_dims, bc_dims, i_dims = (tuple(d) for d in _split(dims, ncc, nbc))

    def step(cur):
        return _natural_batched(body_graph, size, bc_dims + _dims(cur))

    carry_b = _fixpoint(step, tuple(d is not None for d in i_dims))
    pred_batched = _natural_batched(cond_graph, size, cc_dims + _dims(carry_b))[0]
    if pred_batched:
        carry_b = (True,) * len(init)  # lanes finish at different iterations
    body_b, _ = _batch_forced(body_graph, size, bc_dims + _dims(carry_b), carry_b)
    cond_b, _ = _batch_forced(cond_graph, size, cc_dims + _dims(carry_b), (pred_batched,))
    init = [bdim_to_front(x, d, size) if b else x for x, d, b in zip(init, i_dims, carry_b)]
    if not pred_batched:
        outs = bind(while_p, *cc, *bc, *init, cond_graph=cond_b, body_graph=body_b,
                    cond_nconsts=ncc, body_nconsts=nbc)
    else:
        cond2, body2 = _while_any_lane(cond_b, body_b, ncc, nbc)
        outs = bind(while_p, *cc, *cc, *bc, *init, cond_graph=cond2, body_graph=body2,
                    cond_nconsts=ncc, body_nconsts=ncc + nbc)
    return outs, list(_dims(carry_b))


def _while_any_lane(cond_b, body_b, ncc, nbc):
    """A loop over batched carries with a batched predicate: it runs while
    any lane's predicate holds; a lane whose predicate is false keeps its
    carries (the body also takes the condition's consts to know which)."""
    from .elementwise import select_n
    from .reductions import reduce_or_p
    from .structural import broadcast_in_dim

    key = ("cf-while-lanes", ncc, nbc, cond_b)
    hit = body_b.cache.get(key)
    if hit is not None:
        return hit

    lanes = tuple(range(cond_b.out_avals[0].ndim))  # the predicate's axes lead every carry

    def cond_fn(*args):
        return [bind(reduce_or_p, eval_graph(cond_b, args)[0], axes=lanes)]

    def body_fn(*args):
        cc, bc, carry = _split(args, ncc, nbc)
        pred = eval_graph(cond_b, cc + carry)[0]
        new = eval_graph(body_b, bc + carry)
        outs = []
        for old, v in zip(carry, new):
            shape = aval_of(old).shape
            which = pred if len(shape) == len(lanes) else broadcast_in_dim(pred, shape, lanes)
            outs.append(select_n(which, old, v))
        return outs

    cond2 = stage(cond_fn, cond_b.in_avals, "vmap")[0]
    body2 = stage(body_fn, cond_b.in_avals[:ncc] + body_b.in_avals, "vmap")[0]
    hit = body_b.cache[key] = (cond2, body2)
    return hit


batch_rules[while_p] = _while_batch


# --------------------------------------------------------------------------
# Lifting: JAX's cond, scan and while equations (NOTE [lifting])


# NOTE [lifted bodies by structure]
# JAX code calling `jax.lax.scan / cond / while_loop / fori_loop` on functx
# values reaches these rules with a jaxpr that JAX traced for that call: a
# new jaxpr object whenever the body is a new function object (an inline
# lambda), even when it is the same program. Each jaxpr is translated into
# a functx Graph once per *structure*: equations, their primitives and
# parameters, avals (weak types included) and literals, sub-jaxprs the same
# way; a parameter of another kind counts by identity (a function, ...),
# and so do the jaxpr's constants (JAX hoists the arrays a body closes over
# to operands, so these are rare). Equal structures share one graph, and
# with it everything derived from it and compiled from it. At most
# `LIFTED_LIMIT` graphs are kept (LRU).

LIFTED_LIMIT = 128
_LIFTED = _LRU(LIFTED_LIMIT)  # jaxpr structure -> (Graph, constants kept for identity)


def _aval_key(a):
    return (type(a).__name__, getattr(a, "shape", None), getattr(a, "dtype", None),
            getattr(a, "weak_type", None))


def _param_key(v):
    from jax._src import core as jcore

    t = type(v)
    if t in (int, bool, str, type(None)):
        return (t, v)
    if t is float:
        return (t, v.hex())
    if t is complex:
        return (t, v.real.hex(), v.imag.hex())
    if isinstance(v, (jax.extend.core.ClosedJaxpr, jcore.Jaxpr)):  # (one class from jax 0.11)
        return _jaxpr_key(v)
    if isinstance(v, (tuple, list)):
        return (t,) + tuple(_param_key(x) for x in v)
    if isinstance(v, dict):
        return (t,) + tuple((k, _param_key(x)) for k, x in sorted(v.items(), key=lambda kv: repr(kv[0])))
    if isinstance(v, (np.generic, np.ndarray)) and v.size <= 64:
        return (t, v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, np.dtype):
        return ("dtype", v)
    root = (getattr(t, "__module__", None) or "").split(".")[0]
    if root in ("jax", "jaxlib", "numpy"):
        try:  # JAX's parameter types (enums, dimension numbers, shardings) compare by value
            hash(v)
            return (t, v)
        except TypeError:
            pass
    return _ById(v)


def _jaxpr_key(closed):
    """A hashable key equal for jaxprs of the same structure (NOTE [lifted
    bodies by structure])."""
    from jax._src import core as jcore

    if isinstance(closed, jax.extend.core.ClosedJaxpr):
        jaxpr, consts = closed.jaxpr, closed.consts
    else:
        jaxpr, consts = closed, ()
    names = {}

    def define(v):
        names[v] = len(names)
        return _aval_key(v.aval)

    def use(v):
        if isinstance(v, jcore.Literal):
            val = np.asarray(v.val)
            return ("lit", val.dtype.str, val.tobytes(), _aval_key(v.aval))
        return names[v]

    parts = [tuple(define(v) for v in jaxpr.constvars), tuple(define(v) for v in jaxpr.invars),
             tuple(_ById(c) if isinstance(c, (jax.Array, np.ndarray)) else _param_key(c)
                   for c in consts)]
    for eqn in jaxpr.eqns:
        ins = tuple(use(v) for v in eqn.invars)
        params = tuple((k, _param_key(x)) for k, x in sorted(eqn.params.items()))
        outs = tuple(define(v) for v in eqn.outvars)
        parts.append((eqn.primitive, ins, params, outs, frozenset(eqn.effects)))
    parts.append(tuple(use(v) for v in jaxpr.outvars))
    return ("jaxpr", tuple(parts))


def _lifted_graph(closed):
    """`graph_of_jaxpr(closed)`, one graph per jaxpr structure."""
    try:
        key = _jaxpr_key(closed)
        hash(key)
    except Exception:  # noqa: BLE001 - an unhashable parameter: translate it every time
        return graph_of_jaxpr(closed)
    hit = _LIFTED.get(key)
    if hit is None:
        hit = _LIFTED.put(key, graph_of_jaxpr(closed))
    return hit


def _lift_cond(params):
    branches = params["branches"]
    platforms = params.get("branches_platforms")
    if platforms is not None:
        # `lax.platform_dependent`: keep the branch of the platform functx
        # runs on (the index JAX computes when lowering picks the same one).
        branches = (branches[int(_platform_index(platforms))],)
    return cond_p, {"branches": tuple(_lifted_graph(b) for b in branches)}


def scan_counts(params):
    """(constants, carries) among the operands of a JAX scan equation with
    these `params`. jax 0.10 states both counts (`num_consts`, `num_carry`);
    from 0.11 on, `ft_in` is a flat tree of the operands in three groups,
    constants, carries, scanned inputs, each as long as its operands."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def _lift_scan(params):
    unroll = params.get("unroll", 1)
    if isinstance(unroll, bool):
        unroll = max(params["length"], 1) if unroll else 1
    num_consts, num_carry = scan_counts(params)
    return scan_p, dict(body=_lifted_graph(params["jaxpr"]), length=params["length"],
                        reverse=params["reverse"], unroll=unroll,
                        num_consts=num_consts, num_carry=num_carry)


def _lift_while(params):
    cond_graph = _lifted_graph(params["cond_jaxpr"])
    body_graph = _lifted_graph(params["body_jaxpr"])
    ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
    if cond_graph.out_avals[0].shape == ():
        return while_p, dict(cond_graph=cond_graph, body_graph=body_graph,
                             cond_nconsts=ncc, body_nconsts=nbc)
    # JAX's own batching leaves whiles whose predicate has lanes (leading
    # axes of every carry): they run while any lane's predicate holds, and a
    # finished lane keeps its carries (e.g. jax.scipy.special.exp1 on a vector).
    cond2, body2 = _while_any_lane(cond_graph, body_graph, ncc, nbc)

    def lanes_loop(*args):
        cc = list(args[:ncc])
        return bind(while_p, *cc, *args, cond_graph=cond2, body_graph=body2,
                    cond_nconsts=ncc, body_nconsts=ncc + nbc)

    return Macro(lanes_loop), {}


for _name, _rule, _prim in (("cond", _lift_cond, cond_p), ("scan", _lift_scan, scan_p),
                            ("while", _lift_while, while_p)):
    _rule.primitive = _prim
    LIFT_RULES[_name] = _rule


# --------------------------------------------------------------------------
# platform_index: which branch of a `lax.platform_dependent` cond applies.
# It has no operands, so no transform ever meets it; functx evaluates it
# once per parameters for the platform it runs on, as a concrete constant.

from jax._src.lax.control_flow.conditionals import platform_index_p as _jax_platform_index_p  # noqa: E402

platform_index_p = defprim("platform_index", _jax_platform_index_p)
shape_rules[platform_index_p] = lambda *, platforms: Aval((), np.dtype(np.int32))


@functools.lru_cache(maxsize=None)
def _platform_index(platforms):
    with jax.ensure_compile_time_eval():
        return _jax_platform_index_p.bind(platforms=platforms)


defimpl(platform_index_p, lambda *, platforms: _platform_index(platforms))
jvp_rules[platform_index_p] = lambda primals, tangents, **params: (
    bind(platform_index_p, **params), Zero(Aval((), np.dtype(np.int32))))
batch_rules[platform_index_p] = lambda size, vals, dims, **params: (
    bind(platform_index_p, **params), None)


def _register_caches():  # NOTE [bounded caches]
    caches.register("compiled loops", _PROGRAMS.clear,
                    lambda: {"entries": len(_PROGRAMS), "limit": PROGRAMS_LIMIT})
    caches.register("lifted control-flow jaxprs", _LIFTED.clear,
                    lambda: {"entries": len(_LIFTED), "limit": LIFTED_LIMIT})


_register_caches()
