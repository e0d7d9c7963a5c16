"""Memory estimates of staged programs: `memory_report`, and the chunk sizes
of `chunk_size="auto"` (vmap, per_sample_grad_norms and friends).

NOTE [memory model]
functx knows the aval of every intermediate of a staged program, so it can
estimate the program's peak memory without running it: walk the equations
in order, allocate each output when it is defined and free each value after
its last use; the inputs (held by the caller) and the captured constants are
live throughout. An equation that runs a graph of its own (a jit call, scan,
cond, while, checkpoint, custom rule) adds that graph's own peak while it
runs. XLA fuses elementwise chains and may reorder, so a compiled program
usually needs less than this estimate, rarely more: it is a bound to plan
with (chunk sizes), not a measurement (for that, use
`functx.jit(f).lower(*args).compile().memory_analysis()`). Measured against
a budget it was 2-4x too conservative, so under jit chunk_size='auto'
measures instead: it compiles the chunked program for a few candidate
chunk sizes and keeps the largest whose XLA memory analysis fits
(`_measured_chunk`); the estimate remains for eager calls and for programs
that cannot be compiled on their own.

The residuals of reverse mode are the values the backward pass reads: for
each equation that depends on a differentiated input, the jvp rule's split
(`jvp_graph` of the one equation) says which of its inputs and outputs, and
which extra values it computes, the linear (tangent) part keeps.
"""

import numpy as np
from jax import tree_util

from .core import aval_of, is_inexact_dtype, new_interpreter
from .errors import FunctxValueError, user_frame
from .interpreters.staging import Const, StagingInterpreter, Var, _graphs, closure_convert


def nbytes(aval):
    """Bytes of an array of `aval` (an extended dtype such as a PRNG key
    counts as its dtype's item size, at least one byte)."""
    try:
        item = np.dtype(aval.dtype).itemsize
    except TypeError:
        item = getattr(aval.dtype, "itemsize", 4) or 4
    return int(np.prod(aval.shape, dtype=np.int64)) * int(item)


# --------------------------------------------------------------------------
# Staging with source lines


class _LineStaging(StagingInterpreter):
    """Staging that remembers the user's source line of every equation."""

    def __init__(self):
        super().__init__("memory_report")
        self.lines = {}

    def process(self, prim, args, params):
        start = len(self.eqns)
        out = super().process(prim, args, params)
        if len(self.eqns) > start:
            where = user_frame()
            text = None if where is None else f"{where[0]}:{where[1]}"
            for eqn in self.eqns[start:]:
                self.lines[eqn] = text
        return out


def stage_with_lines(fn, in_avals):
    """`staging.stage`, also returning {equation: 'file:line'}."""
    import jax

    with new_interpreter(_LineStaging()) as st, jax.ensure_compile_time_eval():
        ins = [st.new_input(a) for a in in_avals]
        outs = fn(*ins)
        graph = st.graph(ins, outs)
    graph, captured = closure_convert(graph)
    return graph, captured, st.lines


# --------------------------------------------------------------------------
# Liveness


# Primitives XLA fuses into their consumers (NOTE [memory model]): layout
# changes and elementwise operations (recognised by their shapes); reductions
# fuse their producers but their own results are written out.
_LAYOUT = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose",
                     "convert_element_type", "iota", "slice", "rev", "pad", "concatenate",
                     "stop_gradient", "copy", "copy_p"})
_REDUCE = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
                     "reduce_or", "argmax", "argmin"})


def _elementwise(eqn):
    if eqn.prim.multiple_results or any(_graphs(v) for v in eqn.params.values()):
        return False
    shape = eqn.outputs[0].aval.shape
    return all(x.aval.shape == () or len(x.aval.shape) == len(shape) and all(
        d == o or d == 1 for d, o in zip(x.aval.shape, shape)) for x in eqn.inputs)


def materialized(graph):
    """The Vars of `graph` that XLA writes to memory, by NOTE [memory model]:
    an elementwise or layout result that only elementwise, layout or
    reduction operations read is fused into them (if several read it, only
    layout results are recomputed in each; others are written once)."""
    consumers = {}
    for eqn in graph.eqns:
        for x in eqn.inputs:
            if type(x) is Var:
                consumers.setdefault(x, []).append(eqn)
    outputs = {x for x in graph.outputs if type(x) is Var}
    out = set()
    for eqn in graph.eqns:
        name = eqn.prim.name
        layout = name in _LAYOUT and not eqn.prim.multiple_results
        fusible = layout or _elementwise(eqn)
        for v in eqn.outputs:
            users = consumers.get(v, [])
            if v in outputs or not fusible or (len(users) > 1 and not layout) or any(
                    not (u.prim.name in _LAYOUT or u.prim.name in _REDUCE or _elementwise(u))
                    for u in users):
                out.add(v)
    return out


def graph_peak(graph, count_inputs=True, fused=False):
    """(peak bytes, index of the equation where it is reached, the Vars live
    there) of `graph` under NOTE [memory model]. With `count_inputs` False
    the inputs are left out (the caller counts them); with `fused`, the
    values XLA fuses away (`materialized`) cost nothing."""
    last = {}
    for i, eqn in enumerate(graph.eqns):
        for x in eqn.inputs:
            if type(x) is Var:
                last[x] = i
    end = len(graph.eqns)
    for x in graph.outputs:
        if type(x) is Var:
            last[x] = end
    kept = materialized(graph) if fused else None
    inputs = set(graph.inputs)
    base = sum(nbytes(v.aval) for v in graph.inputs) if count_inputs else 0
    consts = {}
    for eqn in graph.eqns:
        for x in eqn.inputs:
            if type(x) is Const and id(x.value) not in consts:
                consts[id(x.value)] = nbytes(x.aval)
    base += sum(consts.values())
    live = {}
    current = base
    peak, at, at_live = base, -1, []
    for i, eqn in enumerate(graph.eqns):
        inner = 0
        for v in eqn.params.values():
            for g in _graphs(v):
                inner = max(inner, graph_peak(g, count_inputs=False, fused=fused)[0]
                            - sum(nbytes(o.aval) for o in g.outputs if type(o) is Var))
        for o in eqn.outputs:
            if o not in live and (kept is None or o in kept):
                live[o] = nbytes(o.aval)
                current += live[o]
        if current + inner > peak:
            peak, at, at_live = current + inner, i, list(live)
        for x in set(eqn.inputs) | set(eqn.outputs):
            if type(x) is Var and x not in inputs and last.get(x, -1) <= i and x in live:
                current -= live.pop(x)
    return peak, at, at_live


# --------------------------------------------------------------------------
# Residuals of reverse mode


def _active_eqns(graph, active_inputs):
    """The equations (with a mask of their active inputs) that depend on the
    active inputs: the ones reverse mode linearizes."""
    from .primitives.elementwise import stop_gradient_p

    active = set(v for v, a in zip(graph.inputs, active_inputs) if a)
    out = []
    for eqn in graph.eqns:
        mask = tuple(type(x) is Var and x in active for x in eqn.inputs)
        if not any(mask) or eqn.prim is stop_gradient_p:
            continue
        out.append((eqn, mask))
        active.update(o for o in eqn.outputs if is_inexact_dtype(o.aval.dtype))
    return out


def residuals(graph, active_inputs, lines=None):
    """The values reverse mode keeps for the backward pass, one entry per
    value (not counting the inputs, which the caller holds anyway): dicts
    with primitive (the one that computes the value), line, shape, dtype,
    bytes and `kept`: 'value' (an intermediate the backward pass reads) or
    'derivative' (a value a jvp rule computes for it, e.g. cos(x) for
    sin); largest first."""
    from .interpreters.jvp import jvp_graph
    from .interpreters.staging import one_equation_graph

    lines = lines or {}
    inputs = set(graph.inputs)
    producer = {o: e for e in graph.eqns for o in e.outputs}
    seen = {}

    def add(key, aval, eqn, kept):
        if key not in seen:
            seen[key] = {"primitive": eqn.prim.name, "line": lines.get(eqn),
                         "shape": tuple(aval.shape),
                         "dtype": str(getattr(aval.dtype, "name", aval.dtype)),
                         "bytes": nbytes(aval), "kept": kept}

    for eqn, mask in _active_eqns(graph, active_inputs):
        try:
            one = one_equation_graph(eqn.prim, eqn.params, [x.aval for x in eqn.inputs])
            split = jvp_graph(one, mask)
        except Exception:  # noqa: BLE001 - a rule that cannot be staged alone: skip it
            continue
        extra = iter(split.primal.outputs[split.n_out:])
        own = list(split.primal.outputs[:split.n_out])
        for k, src in enumerate(split.res_src):
            if src >= 0:  # one of the equation's operands
                x = eqn.inputs[src]
                if type(x) is Var and x not in inputs:
                    add(x, x.aval, producer[x], "value")
                continue
            r = next(extra)
            if r in own:  # the equation's own output
                v = eqn.outputs[own.index(r)]
                add(v, v.aval, eqn, "value")
            else:
                add((eqn, k), r.aval, eqn, "derivative")
    return sorted(seen.values(), key=lambda r: -r["bytes"])


# --------------------------------------------------------------------------
# The public report


class MemoryReport:
    """What `memory_report(f)(*args)` found: `peak_bytes` (estimated peak of
    f's staged program, inputs included), `input_bytes`, `output_bytes`,
    `at_peak` (the intermediates live at the peak, largest first),
    `residuals` (what reverse mode through f would keep for its backward
    pass, largest first) and `residual_bytes`. Each entry of `at_peak` and
    `residuals` is a dict with primitive, line ('file:line' of the user
    code, or None), shape, dtype and bytes (residuals also say what is
    `kept`: 'value' or 'derivative'). `str(report)` is a table."""

    def __init__(self, peak, inputs, outputs, at_peak, res, n_eqns):
        self.peak_bytes = peak
        self.input_bytes = inputs
        self.output_bytes = outputs
        self.at_peak = at_peak
        self.residuals = res
        self.residual_bytes = sum(r["bytes"] for r in res)
        self.n_equations = n_eqns

    def __repr__(self):
        return (f"MemoryReport(peak_bytes={self.peak_bytes}, residual_bytes="
                f"{self.residual_bytes}, {len(self.residuals)} residuals)")

    def __str__(self, top=10):
        rows = [f"peak (estimate): {_human(self.peak_bytes)}  (inputs {_human(self.input_bytes)},"
                f" outputs {_human(self.output_bytes)}, {self.n_equations} equations)"]
        for title, entries in (("live at the peak", self.at_peak),
                               (f"reverse-mode residuals: {_human(self.residual_bytes)}",
                                self.residuals)):
            rows.append(title + ("" if entries else ": none"))
            for r in entries[:top]:
                shape = "x".join(map(str, r["shape"])) or "scalar"
                what = r["primitive"] + (" (derivative)" if r.get("kept") == "derivative" else "")
                rows.append(f"  {_human(r['bytes']):>10}  {r['dtype']}[{shape}]  {what}"
                            + (f"  {r['line']}" if r["line"] else ""))
            if len(entries) > top:
                rows.append(f"  ... {len(entries) - top} more")
        return "\n".join(rows)


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0


def memory_report(f, argnums=None):
    """Estimate the memory of `f`'s staged program (NOTE [memory model] in
    functx/memory.py): its peak, what is live there, and the residuals that
    reverse mode through `f` keeps for the backward pass, each with its
    primitive and the user source line that created it.

    Args:
      f (Callable): any function of arrays (it may apply transforms, e.g.
        `memory_report(grad(loss))` estimates a whole gradient step).
      argnums (int | tuple[int, ...] | None): the arguments reverse mode would
        differentiate for `residuals` (an int or tuple); default: every
        floating-point input.

    Returns:
      Callable: A function taking f's arguments and returning a `MemoryReport`
      (`peak_bytes`, `residuals`, `residual_bytes`, `at_peak`; `print` it for
      a table).

    Raises:
      FunctxTypeError: f is not callable, or an argument or output is not
        an array (or a pytree of arrays).
      FunctxValueError: argnums out of range for the arguments given.

    Example:
      >>> print(functx.memory_report(loss)(params, x, y))
      >>> functx.memory_report(functx.vmap(functx.grad(loss), (None, 0, 0)))(params, xs, ys).peak_bytes
    """
    from .transforms._args import as_array, check_callable, fn_name, normalize_argnums

    check_callable(f, "memory_report")

    def report(*args, **kwargs):
        call = f"memory_report({fn_name(f)})(*args)"
        leaves, tree = tree_util.tree_flatten((args, kwargs))
        leaves = [as_array(x, call, "an argument") for x in leaves]
        owner = []
        for i, a in enumerate(args):
            owner += [i] * len(tree_util.tree_leaves(a))
        owner += [None] * (len(leaves) - len(owner))
        if argnums is None:
            diff = [True] * len(leaves)
        else:
            nums, _ = normalize_argnums(argnums, len(args), call)
            diff = [o in nums for o in owner]

        def flat(*xs):
            a, kw = tree_util.tree_unflatten(tree, list(xs))
            out = tree_util.tree_leaves(f(*a, **kw))
            return [as_array(x, call, "an output") for x in out]

        graph, captured, lines = stage_with_lines(flat, [aval_of(x) for x in leaves])
        active = [d and is_inexact_dtype(aval_of(x).dtype) for d, x in zip(diff, leaves)]
        active += [False] * len(captured)
        peak, at, live = graph_peak(graph)
        producers = {o: e for e in graph.eqns for o in e.outputs}
        at_peak = sorted(({"primitive": producers[v].prim.name, "line": lines.get(producers[v]),
                           "shape": tuple(v.aval.shape),
                           "dtype": str(getattr(v.aval.dtype, "name", v.aval.dtype)),
                           "bytes": nbytes(v.aval)} for v in live),
                         key=lambda r: -r["bytes"])
        res = residuals(graph, active, lines)
        ins = sum(nbytes(v.aval) for v in graph.inputs)
        outs = sum(nbytes(x.aval) for x in graph.outputs)
        return MemoryReport(peak, ins, outs, at_peak, res, len(graph.eqns))

    return report


# --------------------------------------------------------------------------
# chunk_size="auto"


def check_max_memory(max_memory, call):
    if isinstance(max_memory, bool) or not isinstance(max_memory, (int, float, np.integer,
                                                                   np.floating)) or not (
            max_memory > 0):
        raise FunctxValueError(
            f"{call}: max_memory must be a positive number of bytes, got {max_memory!r}. Pass "
            "e.g. max_memory=2**30 for 1 GiB.")


def estimate(graph, fused=False):
    """Estimated peak bytes of a staged program (NOTE [memory model]);
    `fused`: as compiled by XLA, else as run one primitive at a time."""
    return graph_peak(graph, fused=fused)[0]


def compiled_peak(fn, args):
    """XLA's memory analysis (arguments + outputs + temporaries) of
    `jax.jit(fn)` compiled for the avals of `args`, or None where it cannot
    be had (a function closing over values of an enclosing trace, a backend
    without the analysis)."""
    import jax

    try:
        specs = [jax.ShapeDtypeStruct(aval_of(x).shape, aval_of(x).dtype) for x in args]
        m = jax.jit(fn).lower(*specs).compile().memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - no measurement: the caller estimates instead
        return None


def _measured_chunk(measure, size, max_memory, call):
    """The largest chunk whose compiled program measures within the budget
    (NOTE [memory model]: under jit the measurement replaces the estimate),
    by bisection on the chunk size with a guess from the straight line
    through the last two measurements; None when the whole batch fits;
    False when a program could not be measured."""
    seen = {}

    def m(n):
        if n not in seen:
            seen[n] = measure(n)
        return seen[n]

    full = m(size)
    if full is None:
        return False
    if full <= max_memory:
        return None
    one = m(1)
    if one is None:
        return False
    if one > max_memory:
        raise FunctxValueError(
            f"{call}: max_memory={int(max_memory)} bytes is below the compiled program's peak "
            f"with a chunk of one example ({one} bytes, XLA's memory analysis, counting the "
            "whole batch's inputs and outputs). Raise max_memory, or pass chunk_size=1.")
    lo, hi = 1, size  # m(lo) <= max_memory < m(hi)
    for step in range(10):  # each step compiles a program: stop within 8% of the budget
        if hi - lo <= 1 or seen[lo] >= 0.92 * max_memory:
            break
        if step % 2 == 0 and seen[hi] > seen[lo]:  # the straight-line guess
            guess = lo + int((max_memory - seen[lo]) * (hi - lo) / (seen[hi] - seen[lo]))
        else:
            guess = (lo + hi) // 2
        guess = min(max(guess, lo + 1), hi - 1)
        got = m(guess)
        if got is None:
            return False
        if got <= max_memory:
            lo = guess
        else:
            hi = guess
    # the peak is not monotone in n (a partial last chunk runs beside the
    # loop's buffers): the next few divisors of the batch may fit where a
    # smaller non-divisor did not
    for d in [d for d in range(lo + 1, size) if size % d == 0][:3]:
        m(d)
    # of the chunks that fit: the largest within 10% of the budget, else the
    # one that measured closest to it
    fits = {n: v for n, v in seen.items() if v is not None and v <= max_memory}
    near = [n for n, v in fits.items() if v >= 0.9 * max_memory]
    return max(near) if near else max(fits, key=lambda n: (fits[n], n))


def auto_chunk_size(staged_at, size, max_memory, call, fused=None, measure=None):
    """The largest chunk size n <= size whose program stays within
    `max_memory`, or None when the whole batch does. Compiled whole (under
    jit) with `measure(n)` given (the compiled peak of the chunked program,
    or None), by XLA's measurement of the candidates (`_measured_chunk`);
    otherwise by the estimate of NOTE [memory model]: `staged_at(n)` returns
    (graph of one chunk of n, which of its inputs are mapped, which of its
    outputs are). While one chunk runs, the whole batch's inputs and the
    results gathered so far are live too, so those count in full. The
    estimate is close to linear in n: it is fitted from two small chunks,
    and the choice checked (and lowered) on the chunk size it gives.
    `fused` (default: whether JAX is tracing, i.e. the program will be
    compiled whole) picks the estimate."""
    check_max_memory(max_memory, call)
    if fused is None:
        fused = compiled_whole()
    if fused and measure is not None:
        n = _measured_chunk(measure, size, max_memory, call)
        if n is not False:
            return n

    def parts(n):
        g, in_mapped, out_mapped = staged_at(n)
        mapped = sum(nbytes(v.aval) for v, m in zip(g.inputs, in_mapped) if m)
        mapped += sum(nbytes(x.aval) for x, m in zip(g.outputs, out_mapped) if m)
        return estimate(g, fused), mapped

    def total(n):
        # the whole batch's inputs and results stay live beside one chunk's work;
        # compiled, a last partial chunk runs after the loop of full ones and
        # XLA may keep both chunks' buffers
        est, mapped = parts(n)
        t = est + mapped * (size - n) / n
        if fused and size % n:
            est_tail, mapped_tail = parts(size % n)
            t += est_tail - mapped_tail
        return t

    if parts(size)[0] <= max_memory:
        return None
    n1, n2 = 1, min(size, 8)
    t1 = total(n1)
    if t1 > max_memory:
        raise FunctxValueError(
            f"{call}: max_memory={int(max_memory)} bytes is below the estimated peak with a "
            f"chunk of one example ({int(t1)} bytes, counting the whole batch's inputs and "
            "outputs). Raise max_memory, or pass chunk_size=1.")
    e1, e2 = parts(n1)[0], parts(n2)[0]
    slope = max((e2 - e1) / max(n2 - n1, 1), 1.0)
    n = int(min(size, max(1, n1 + (max_memory - t1) // slope)))
    # compiled, prefer chunk sizes that divide the batch (no partial chunk)
    divisors = [k for k in range(1, size + 1) if size % k == 0] if fused else []

    def snap(k):
        d = max((j for j in divisors if j <= k), default=k)
        return d if 2 * d >= k else k

    n = snap(n)
    for _ in range(8):  # shrink until the estimate fits
        t = total(n)
        if t <= max_memory or n == 1:
            break
        n = snap(max(1, int(n * max_memory / t * 0.98)))
    for d in [j for j in divisors if j > n][:3]:  # the linear fit may be pessimistic
        if total(d) > max_memory:
            break
        n = d
    return n


def compiled_whole():
    """Whether what runs now is being traced by JAX (under jax.jit or
    functx.jit), so XLA compiles it as one program."""
    try:
        from jax._src import core as jcore

        return not jcore.trace_ctx.is_top_level()
    except (ImportError, AttributeError):  # another JAX layout: assume eager
        return False


def check_auto_chunk(chunk_size, max_memory, call):
    """chunk_size='auto' goes with max_memory, and max_memory with 'auto'."""
    if chunk_size != "auto":
        raise FunctxValueError(
            f"{call}: max_memory is used with chunk_size='auto' only, got chunk_size="
            f"{chunk_size!r}. Pass chunk_size='auto' to choose the chunk size from the budget, "
            "or drop max_memory.")
    if max_memory is None:
        raise FunctxValueError(
            f"{call}: chunk_size='auto' needs max_memory=BYTES, the memory budget the chunk size "
            "is chosen for. Pass e.g. max_memory=2**30, or an int chunk_size.")
    check_max_memory(max_memory, call)


def vmap_chunk_size(func, leaves, dims, in_tree, kwargs, size, randomness, out_dims, call,
                    max_memory, axis=None):
    """vmap's chunk_size='auto': `auto_chunk_size` on the staged vmap of
    `func` over the first n elements (None: no chunking needed)."""
    from .interpreters.staging import stage
    from .primitives import structural as st
    from .transforms.vmap import _vmap_once

    def staged_at(n):
        part = []
        for x, d in zip(leaves, dims):
            if d is not None:
                shape = aval_of(x).shape
                hi = list(shape)
                hi[d] = n
                x = st.slice(x, [0] * len(shape), hi)
            part.append(x)
        mapped = [d is not None for d in dims]

        def f(*flat):
            it = iter(flat)
            full = [next(it) if m else x for x, m in zip(part, mapped)]
            chunk_axis = None if axis is None else axis._replace(chunk=(0, size))
            return _vmap_once(func, full, dims, in_tree, kwargs, n, randomness, out_dims, call,
                              axis=chunk_axis)[0]

        graph, _ = stage(f, [aval_of(x) for x, m in zip(part, mapped) if m], "vmap")
        n_in = sum(mapped)
        return (graph, [True] * n_in + [False] * (len(graph.inputs) - n_in),
                [True] * len(graph.outputs))

    from .transforms.vmap import _vmap_chunked

    def measure(n):
        # the chunked program itself, every array leaf an argument
        def prog(*xs):
            out = _vmap_chunked(func, list(xs), dims, in_tree, kwargs, size, randomness,
                                out_dims, call, n, axis=axis)
            return tree_util.tree_leaves(out)

        return compiled_peak(prog, leaves)

    return auto_chunk_size(staged_at, size, max_memory, call, measure=measure)


def call_measure(build, args, kwargs):
    """`measure(n)` for auto_chunk_size: the compiled peak of
    `build(n)(*args, **kwargs)` (the whole transform with chunk size n),
    every array leaf of args an argument of the compiled program."""
    leaves, tree = tree_util.tree_flatten(args)
    arrays = [i for i, x in enumerate(leaves) if hasattr(x, "shape") and hasattr(x, "dtype")]

    def measure(n):
        def prog(*xs):
            filled = list(leaves)
            for i, x in zip(arrays, xs):
                filled[i] = x
            return tree_util.tree_leaves(build(n)(*tree_util.tree_unflatten(tree, filled),
                                                  **kwargs))

        return compiled_peak(prog, [leaves[i] for i in arrays])

    return measure


def basis_chunk_size(fn, basis, starts, call, max_memory, out_dims=0, randomness="error",
                     measure=None):
    """jacrev / jacfwd's chunk_size='auto': `auto_chunk_size` on the staged
    map of `fn` over the first n rows of the identity `basis` (the outputs
    are the Jacobian's rows); under jit `measure(n)` (`call_measure`)
    compiles the whole Jacobian with chunk size n instead."""
    from .interpreters.staging import stage
    from .primitives import structural as st
    from .transforms.vmap import map_over_basis

    rows = aval_of(basis[0]).shape[0]

    def staged_at(n):
        # the rows are inputs of the staged program (as constants, staging
        # would compute the whole map); their identity marks still apply
        part = [st.slice(b, (0,) * aval_of(b).ndim, (n,) + aval_of(b).shape[1:]) for b in basis]

        def f(*rows):
            out = map_over_basis(fn, rows, starts, call, out_dims=out_dims, randomness=randomness)
            return tree_util.tree_leaves(out)

        graph, _ = stage(f, [aval_of(b) for b in part], "jacobian")
        n_in = len(part)
        return (graph, [True] * n_in + [False] * (len(graph.inputs) - n_in),
                [True] * len(graph.outputs))

    return auto_chunk_size(staged_at, rows, max_memory, call, measure=measure)
