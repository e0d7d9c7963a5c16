"""The machinery of the table-driven op sweeps (STYLE.md "Tests"), shared by
tests/test_primitives.py (tests/op_table.py: one record per primitive) and
tests/test_public_sweep.py (tests/op_table_public.py: one record per public
function of jax.numpy & co.).

A record (`op_table.Op`) is a JAX function of positional arrays. functx runs
it through `functx.lift`; JAX's own transforms of the same function and
central finite differences in float64 are the oracles. The compositions:

  jvp, vjp (each against JAX and finite differences), vmap∘vjp, jvp∘vjp,
  vjp∘vjp, jvp∘jvp, and vmap against a Python loop + stack for batch-dim
  placements of the arguments.

NOTE [sweep cost]
XLA compilation dominates a sweep's time, so:
* every composition of a record, its oracles and its loop references run
  inside one `jax.jit` (functx runs at trace time on JAX tracers): nothing
  is dispatched eagerly;
* the loop reference of a vmap check does not depend on where the batch
  dimension sits, only on which arguments are batched: one loop serves
  every placement with the same batched arguments;
* several records share one compilation (`run_cases`, `GroupedRunner`): a
  record whose tracing raises is reported on its own, the others still
  run. With the options below this saves little (~10%); large programs
  compile faster alone;
* the compilation uses XLA's cheapest CPU settings (COMPILER_OPTIONS): the
  programs are tiny and run once, so optimising them costs more than it
  saves. No LLVM optimisation, no fusion emitters, one codegen module:
  about a third of the default compile time (measured on these sweeps).
  Numerics are unaffected (no fast math; float64 throughout).
"""

import dataclasses
import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

import functx as fx
import xla_options

NB = 3  # batch size for the vmap checks
EPS = 1e-5  # finite-difference step (float64)

# FUNCTX_FULL_SWEEP=1: every composition and batch placement for every record.
FULL = os.environ.get("FUNCTX_FULL_SWEEP", "") not in ("", "0")

COMPILER_OPTIONS = xla_options.compile_options({
    **xla_options.CHEAP,
    "xla_cpu_parallel_codegen_split_count": 1,
})


def is_float(x):
    # jnp.issubdtype, not np.issubdtype: bfloat16 and the float8 types
    # (NumPy kind 'V') are floating too (tests/test_low_precision.py)
    return jnp.issubdtype(np.asarray(x).dtype, jnp.floating)


def diff_indices(op, args):
    if op.diff is not None:
        return tuple(op.diff)
    return tuple(i for i, a in enumerate(args) if is_float(a))


def instances(op, seed):
    """NB + 1 independent draws of the record's arguments: the first is the
    point of the derivative checks, the others the vmap batch."""
    rng = np.random.default_rng(seed)
    return [[g(rng) for g in op.gens] for _ in range(NB + 1)]


def random_like(rng, tree):
    return tree_util.tree_map(
        lambda s: rng.standard_normal(s.shape).astype(s.dtype)
        if jnp.issubdtype(s.dtype, jnp.floating) else np.zeros(s.shape, s.dtype),
        tree,
    )


def placements(args, every=True):
    """vmap in_dims tuples. `every`: each argument alone at each of its
    positions, then all arguments at 0 and at -1; else only all at 0 and
    all at -1."""
    n = len(args)
    out = []
    if every:
        for i, a in enumerate(args):
            for d in range(np.ndim(a) + 1):
                dims = [None] * n
                dims[i] = d
                out.append(tuple(dims))
        if n > 1:
            out.append((0,) * n)
            out.append((-1,) * n)
    else:
        out = [(0,) * n, (-1,) * n]
    return out


def stack_at(xs, d):
    return np.stack(xs, axis=d if d >= 0 else np.ndim(xs[0]) + 1 + d)


@dataclasses.dataclass
class Case:
    """One record, ready to sweep: host arrays only (no JAX computation has
    run yet), and which compositions to check."""

    op: object
    diff: tuple
    nondiff: bool
    order: int
    vmap_vjp: bool
    jvp: bool  # check the jvp (else only the vjp, and the jvp of a nondiff record)
    second: tuple  # second-order compositions checked when order >= 2
    placements: list
    vmap_oracle: str  # "loop" (a Python loop + stack) or "jax" (jax.vmap)
    loop_masks: list  # which arguments each distinct loop batches
    loop_index: list  # per placement: its loop (the loop ignores where the batch dim is)
    data: dict  # the arrays, passed to the jitted checks as one argument:
    # args, tangents, cts, cts2, batched_cts, the NB batch draws ("draws"),
    # per placement the batched inputs ("batched"), and optionally the loops'
    # results ("loops", precomputed by the caller)


SECOND_ORDER = ("jvp(vjp)", "vjp(vjp)", "jvp(jvp)")


def prepare(op, *, full=True, order=None, vmap_vjp=True, second=SECOND_ORDER, fd=True,
            placements_at=None, vmap_oracle="loop", jvp=True):
    """A Case for `op`. `full`: every batch placement (else all at 0 and all
    at -1); `order`: derivative order checked (default op.order);
    `vmap_vjp`: check vmap of the vjp function; `second`: which
    second-order compositions to check; `fd`: compare with finite
    differences (where op.fd allows); `placements_at`: only these batch
    dims, every argument at the same one; `vmap_oracle`: "loop" or "jax";
    `jvp`: check the jvp (the vjp is always checked)."""
    inst = instances(op, seed=zlib.crc32(op.name.encode()))
    args = inst[0]
    rng = np.random.default_rng(1)
    diff = diff_indices(op, args)
    out_shape = jax.eval_shape(op.fn, *args)
    # A record all of whose outputs are integers or booleans is
    # non-differentiable whatever its table entry says.
    nondiff = op.nondiff or not any(
        jnp.issubdtype(s.dtype, jnp.inexact) for s in tree_util.tree_leaves(out_shape))
    dshape = [jax.ShapeDtypeStruct(np.shape(args[i]), args[i].dtype) for i in diff]
    pl = placements(args, every=full) if op.batch else []
    if placements_at is not None and op.batch:
        pl = [(d,) * len(args) for d in placements_at]
    data = dict(
        args=args,
        tangents=tuple(random_like(rng, s) for s in dshape),
        cts=random_like(rng, out_shape),
        cts2=tuple(random_like(rng, s) for s in dshape),
        batched_cts=tree_util.tree_map(
            lambda *xs: np.stack(xs), *[random_like(rng, out_shape) for _ in range(NB)]),
        batched=[], draws=inst[1:] if vmap_oracle == "loop" and pl else [],
    )
    loop_masks, loop_index = [], []
    for dims in pl:
        data["batched"].append([
            a if dd is None else stack_at([inst[b + 1][i] for b in range(NB)], dd)
            for i, (a, dd) in enumerate(zip(args, dims))
        ])
        mask = tuple(dd is not None for dd in dims)
        if mask not in loop_masks:
            loop_masks.append(mask)
        loop_index.append(loop_masks.index(mask))
    if not fd:
        op = dataclasses.replace(op, fd=False)
    return Case(op, diff, nondiff, op.order if order is None else order, vmap_vjp, jvp,
                tuple(second), pl, vmap_oracle, loop_masks, loop_index, data)


def _dot(a, b):
    return sum(jnp.vdot(u, w) for u, w in zip(tree_util.tree_leaves(a), tree_util.tree_leaves(b)))


def checks(case, data):
    """Every composition of one case, traced (inside the caller's jit);
    returns {composition: (functx, oracle)}."""
    op, diff = case.op, case.diff
    args, tangents, cts, cts2 = data["args"], data["tangents"], data["cts"], data["cts2"]
    d = tuple(args[i] for i in diff)

    def F(*dargs):
        full = list(args)
        for i, v in zip(diff, dargs):
            full[i] = v
        return op.fn(*full)

    fxF = fx.lift(F)
    res = {}
    if diff:
        if case.nondiff or case.jvp:
            _, t = fx.jvp(fxF, d, tangents)
        if case.nondiff:
            res["jvp is zero"] = (t, tree_util.tree_map(jnp.zeros_like, t))
        else:
            fd = None
            if case.jvp:
                res["jvp vs jax.jvp"] = (t, jax.jvp(F, d, tangents)[1])
            if case.jvp and op.fd and all(np.dtype(x.dtype) == np.float64 for x in d):
                plus = F(*[x + EPS * v for x, v in zip(d, tangents)])
                minus = F(*[x - EPS * v for x, v in zip(d, tangents)])
                fd = tree_util.tree_map(lambda a, b: (a - b) / (2 * EPS), plus, minus)
                res["jvp vs finite differences"] = (t, fd)
            _, vjp_fn = fx.vjp(fxF, *d)
            _, jvjp_fn = jax.vjp(F, *d)
            pulled = vjp_fn(cts)
            res["vjp vs jax.vjp"] = (pulled, jvjp_fn(cts))
            if fd is not None:
                # <vjp(c), v> == <c, (f(x + eps v) - f(x - eps v)) / 2 eps>
                res["vjp vs finite differences"] = (_dot(pulled, tangents), _dot(cts, fd))
            if case.vmap_vjp:
                bc = data["batched_cts"]
                res["vmap(vjp) vs jax.vmap(jax.vjp)"] = (fx.vmap(vjp_fn)(bc), jax.vmap(jvjp_fn)(bc))
            if case.order >= 2:
                G = lambda *x: fx.vjp(fxF, *x)[1](cts)  # noqa: E731
                Gj = lambda *x: jax.vjp(F, *x)[1](cts)  # noqa: E731
                H = lambda *x: fx.jvp(fxF, x, tangents)[1]  # noqa: E731
                Hj = lambda *x: jax.jvp(F, x, tangents)[1]  # noqa: E731
                if "jvp(vjp)" in case.second:
                    res["jvp(vjp)"] = (fx.jvp(G, d, tangents)[1], jax.jvp(Gj, d, tangents)[1])
                if "vjp(vjp)" in case.second:
                    res["vjp(vjp)"] = (fx.vjp(G, *d)[1](cts2), jax.vjp(Gj, *d)[1](cts2))
                if "jvp(jvp)" in case.second:
                    res["jvp(jvp)"] = (fx.jvp(H, d, tangents)[1], jax.jvp(Hj, d, tangents)[1])
    if case.placements:
        fx_fn = fx.lift(op.fn)
        loops = data.get("loops")
        if loops is None and case.vmap_oracle == "loop":
            loops = []
            for mask in case.loop_masks:
                rows = [op.fn(*[x if m else a for a, x, m in zip(args, draw, mask)])
                        for draw in data["draws"]]
                loops.append(tree_util.tree_map(lambda *xs: jnp.stack(xs), *rows))
            loops = [loops[i] for i in case.loop_index]
        for k, (dims, inputs) in enumerate(zip(case.placements, data["batched"])):
            if loops is not None:
                loop = loops[k]
            else:
                loop = jax.vmap(op.fn, in_axes=dims)(*inputs)
            res[f"vmap in_dims={dims}"] = (fx.vmap(fx_fn, in_dims=dims)(*inputs), loop)
    return res


def run_cases(cases):
    """Run the checks of several cases in one compiled program.

    Returns {record name: {composition: (functx, oracle)} as host arrays, or
    the exception its tracing raised}. If the shared program fails to compile
    or run, each case is retried alone, so one bad record cannot hide the
    others' results."""
    errors = {}

    def body(datas):
        out = {}
        for case, data in zip(cases, datas):
            try:
                out[case.op.name] = checks(case, data)
            except Exception as e:  # noqa: BLE001 - reported for that record
                errors[case.op.name] = e
        return out

    datas = [c.data for c in cases]
    try:
        results = jax.device_get(jax.jit(body, compiler_options=COMPILER_OPTIONS)(datas))
    except Exception as e:  # noqa: BLE001
        if len(cases) == 1:
            return {cases[0].op.name: e}
        results = {}
        for c in cases:
            results.update(run_cases([c]))
        return results
    results.update(errors)
    return results


def compare(name, got, want, tol):
    got_l, got_t = tree_util.tree_flatten(got)
    want_l, want_t = tree_util.tree_flatten(want)
    assert got_t == want_t, f"{name}: structure {got_t} != {want_t}"
    for g, w in zip(got_l, want_l):
        g, w = np.asarray(g), np.asarray(w)
        if w.dtype == jax.dtypes.float0:
            w = np.zeros(w.shape, g.dtype)
        assert g.shape == w.shape, f"{name}: shape {g.shape} != {w.shape}"
        if jnp.issubdtype(w.dtype, jnp.inexact):
            if not np.issubdtype(w.dtype, np.inexact):  # bfloat16, float8: compare as float32
                g, w = g.astype(np.float32), w.astype(np.float32)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def check_results(op, results):
    """Assert one record's results (from run_cases)."""
    if isinstance(results, BaseException):
        raise results
    assert results, f"{op.name}: no composition was checked"
    for name, (got, want) in results.items():
        compare(f"{op.name}: {name}", got, want, op.tol)


class GroupedRunner:
    """Runs the records of a parametrized test `size` at a time in one
    compilation (NOTE [sweep cost]): the first test of a group runs the
    group — consecutive records that pytest selected — and each test then
    checks its own record's results. A record with `heavy=True` (a large
    program) runs alone: XLA's compile time grows faster than linearly in
    the size of such programs."""

    def __init__(self, test_name, size, prepare_fn):
        self.test_name = test_name
        self.size = size
        self.prepare_fn = prepare_fn
        self.results = {}
        self.groups = None  # record name -> its group (list of records)

    def _group_selected(self, request):
        selected = [
            item.callspec.params["op"] for item in request.session.items
            if getattr(item, "originalname", None) == self.test_name
            and "op" in getattr(getattr(item, "callspec", None), "params", {})
        ]
        self.groups = {}
        group = []
        for o in selected:
            if getattr(o, "heavy", False):
                self.groups[o.name] = [o]
                continue
            if len(group) == self.size:
                group = []
            group.append(o)
            self.groups[o.name] = group

    def results_for(self, op, request):
        if op.name not in self.results:
            if self.groups is None:
                self._group_selected(request)
            group = [o for o in self.groups.get(op.name, [op]) if o.name not in self.results]
            if op.name not in [o.name for o in group]:
                group = [op]
            cases, failed = [], {}
            for o in group:
                try:
                    cases.append(self.prepare_fn(o))
                except Exception as e:  # noqa: BLE001 - reported for that record
                    failed[o.name] = e
            self.results.update(failed)
            if cases:
                self.results.update(run_cases(cases))
        return self.results.pop(op.name)
