"""Which XLA options functx compiles with on the CPU backend: YNNPACK's
products for small programs only (NOTE [XLA:CPU's matrix-product
library]), and the eager engine's programs with their primitives kept as
calls (NOTE [one rounding per primitive]).

NOTE [XLA:CPU's matrix-product library]
XLA:CPU (jax 0.10) computes a matrix product with row-major operands in
YNNPACK and any other in its own dot (XLA's default YNNPACK list is
INDIVIDUAL_DOT,REDUCE). Measured on the 2-core CI VM (benchmarks/cpu_dots.py,
benchmarks/RESULTS.md), YNNPACK is the faster of the two on small products
(MAML's 10x40x40, a 32-64-64-1 MLP, a 256x128x128 product: 1.08x-1.34x
slower without it) and XLA's own dot on large ones (the ensemble, batched
Jacobians, a 784-512-512-10 MLP gradient, a 1024^3 product: 0.59x-0.89x);
from 4M to 32M multiply-adds it makes no difference either way. So on the
CPU backend every program functx compiles (a `functx.jit` program, and the
steps eager transforms compile: NOTE [eager reverse mode in few
dispatches]) whose largest product reaches `LARGE_PRODUCT` multiply-adds is
compiled with YNNPACK's products off and its reductions kept, unless the
user's `compiler_options` name the option, or one of its products has an
operand matrix over `LARGEST_MATRIX` bytes: XLA's own dot may then hold a
transient copy of that operand (measured: +32 MB for a 512x16384 one, none
for the ensemble's 784x256 ones), which would undo what `chunk_size` saves. If this jaxlib does not know
the option, nothing changes. JAX takes compiler options for top-level
programs only: a program compiled while JAX traces (a call nested in an
enclosing jax.jit) keeps XLA's defaults, those of the enclosing program.
"""

import functools
import math
import threading
import time
import weakref

import jax
import jax.extend.core

YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"
PRODUCTS_OFF = {YNN_OPTION: "LIBRARY_FUSION_TYPE_REDUCE"}
LARGE_PRODUCT = 1 << 25  # multiply-adds (32M)
LARGEST_MATRIX = 1 << 22  # bytes (4 MB): XLA's own dot may hold a copy of one
NO_PRODUCTS = (0, 0)


def dot_sizes(lhs, rhs, dimension_numbers):
    """(multiply-adds, bytes of its largest operand matrix) of a dot_general
    of avals (or arrays) `lhs`, `rhs`; a matrix excludes the batch axes."""
    (_, rc), (lb, rb) = dimension_numbers
    free = [d for i, d in enumerate(rhs.shape) if i not in rc and i not in rb]
    matrix = max(math.prod(d for i, d in enumerate(x.shape) if i not in b) * x.dtype.itemsize
                 for x, b in ((lhs, lb), (rhs, rb)))
    return math.prod(lhs.shape) * math.prod(free), matrix


def dot_takes_products_off(lhs, rhs, dimension_numbers):
    """`takes_products_off` for one dot_general, cheap when it is small (the
    eager path asks for every product it evaluates)."""
    (_, rc), (_, rb) = dimension_numbers
    macs = math.prod(lhs.shape)
    for i, d in enumerate(rhs.shape):
        if i not in rc and i not in rb:
            macs *= d
    return macs >= LARGE_PRODUCT and takes_products_off(dot_sizes(lhs, rhs, dimension_numbers))


def _most(a, b):
    return max(a[0], b[0]), max(a[1], b[1])


def sizes_in_jaxpr(jaxpr):
    """The most multiply-adds of one dot_general in a JAX `jaxpr` (and the
    jaxprs in its equations' parameters; loop bodies count once), and the
    largest operand matrix of any of them."""
    sizes = NO_PRODUCTS
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            sizes = _most(sizes, dot_sizes(eqn.invars[0].aval, eqn.invars[1].aval,
                                           eqn.params["dimension_numbers"]))
        for sub in _nested(eqn.params.values(), (jax.extend.core.Jaxpr,)):
            sizes = _most(sizes, sizes_in_jaxpr(sub))
    return sizes


def sizes_in_graph(graph):
    """The same for a functx Graph and the graphs in its parameters."""
    from .interpreters.staging import Graph

    sizes = NO_PRODUCTS
    for eqn in graph.eqns:
        if eqn.prim.name == "dot_general":
            sizes = _most(sizes, dot_sizes(eqn.inputs[0].aval, eqn.inputs[1].aval,
                                           eqn.params["dimension_numbers"]))
        for sub in _nested(eqn.params.values(), (Graph,)):
            sizes = _most(sizes, sizes_in_graph(sub))
    return sizes


def takes_products_off(sizes):
    """Whether a program of these `sizes` compiles with YNNPACK's products
    off: a large product, and no operand matrix large enough for XLA's own
    dot's copy of it to matter."""
    return sizes[0] >= LARGE_PRODUCT and sizes[1] <= LARGEST_MATRIX


def _nested(values, types):
    for v in values:
        if isinstance(v, jax.extend.core.ClosedJaxpr):
            v = v.jaxpr
        if isinstance(v, types):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _nested(v, types)


def options_for(sizes, options=None):
    """The compiler options for a program of these `sizes` (see
    `sizes_in_jaxpr`), given the user's `options` (None: none)."""
    return products_off(options) if takes_products_off(sizes) else options


def products_off(options=None):
    """`options` with YNNPACK's products off, where that applies: on the CPU
    backend, with a jaxlib that knows the option, unless `options` set it."""
    if YNN_OPTION in (options or {}) or jax.default_backend() != "cpu" or not _known():
        return options
    return {**(options or {}), **PRODUCTS_OFF}


def _top_level_check():
    try:
        from jax._src import core as jcore

        jcore.trace_ctx.is_top_level()
        return jcore.trace_ctx.is_top_level
    except (ImportError, AttributeError):  # other JAX layouts: never pass options
        return lambda: False


_is_top_level = _top_level_check()


def top_level():
    """Whether JAX is tracing nothing now (a jitted call would be compiled
    as its own program, not nested in an enclosing one)."""
    return _is_top_level()


# NOTE [one rounding per primitive]
# An eager transform runs a step first as one small program per primitive,
# then, once a repeated structure has compiled, as one program for the
# whole step (NOTE [deferred eager steps], NOTE [staged backward passes]).
# Both must give the same bits. Inside one program XLA may change the
# arithmetic across primitives: LLVM contracts a product and the sum it
# feeds into a fused multiply-add when both land in one fused kernel (one
# rounding instead of two; XLA:CPU allows it unconditionally and has no
# option against it), and XLA's simplifier rewrites a sum of a broadcast
# into a product and reassociates sums with constants. So the programs of
# the eager engine keep each primitive that could take part as a call of
# its own program, the same one that runs it alone, and are compiled with
# XLA's call inliner off: inside its call a primitive fuses exactly as it
# does alone, and across calls nothing is fused or rewritten.
# Not every primitive needs its own call: the ones in `FUSIBLE` round their
# result exactly once from operands read as they are (additions, data
# movement, comparisons, selections, conversions), so fusing them changes
# no bit, unless an operand is a constant, which XLA's simplifier may fold
# (each such application gets its own call too). A call's constant operand
# reaches it through an optimisation barrier: XLA propagates constants into
# the computations it calls and folds them there, where the program alone
# takes them as arguments (a digamma gradient's `polygamma(1, x)` rounded
# otherwise once its queue ran as one program). A product (`mul`, and any
# primitive whose result may come from a final multiplication, which is
# most arithmetic) gets its own call, so its result is rounded and stored
# before a sum reads it; so does a reduction, which then never sees the
# broadcast it sums. JAX primitives functx borrows (NOTE [foreign
# primitives]) are evaluated the same way, and so is a primitive whose
# parameters do not hash (its call then is not cached). Loops compiled
# for eager calls keep their bodies' calls too, as they are when a loop
# sits in a combined program, and XLA:CPU may not hoist a small loop into
# one kernel (its small-while-loop-hoisting pass: the body's calls are
# then emitted together and LLVM contracts a product with the sum it
# feeds; whether a loop counts as small depends on the program around it,
# so a scan's gradient rounded otherwise inside a combined program). A
# jitted JAX function met eagerly (its `jit_call`, named `jax.jit(...)`:
# NOTE [JAX's jit programs stay calls] in interop.py) keeps each primitive
# apart too, alone and inlined into a combined program alike: compiled
# whole, XLA optimised it by what the program around it showed (inside a
# combined program two of its operands that XLA had found equal shared one
# buffer, LLVM merged two selects on that mask and contracted the product
# under them with the sum after: jnp.nanvar's gradient changed its last
# bit); only a jitted function that a top-level grad differentiates alone,
# whose call nothing is ever inlined with, runs whole programs (NOTE [a
# jitted function differentiated alone] in primitives/call.py). Any
# program run here keeps its calls (`jit_by_size`): a graph's
# own calls (JAX's unrolled loop iterations) stay calls inside a combined
# program, and inlined alone they would round otherwise. (Which NaN
# an operation returns is not fixed either way: NaNs are equal, not their
# bits.) Measured on the 2-core VM: the same warm speed,
# 7-25% more compile time (benchmarks/RESULTS.md, "One rounding per
# primitive"). A `functx.jit` program called on its own (or traced into
# another one) is the user's and keeps all of XLA's optimisations, as
# `jax.jit` does; its results may differ from eager ones in the last bit,
# as JAX's do. Under an eager transform its graph is one of the calls
# above.
# Other backends ("barriers" isolation): XLA:GPU cannot compile a program
# whose calls are kept (it aborts the process: its loop-fusion emitter
# meets a call it has no indexing for; seen on an H200, jax 0.11.2). There
# the same primitives sit between optimisation barriers instead, on their
# operands and results (also for the hand-written evaluations of
# `defimpl`: graph calls, loops). The simplifier
# sees through no barrier, so it rewrites nothing across primitives; the
# barriers are removed before fusion, so the program fuses as before, and
# a product may still be contracted into the sum it feeds. On the H200,
# random programs whose first calls differed from later ones went from 4
# of 24 to 1 of 40, and that one only on some runs (benchmarks/RESULTS.md,
# "One rounding per primitive on a GPU"); tests force this mode on the CPU
# for the rewrites it stops.
FUSIBLE = frozenset("""
    add add_any sub neg max min abs sign clamp select_n
    eq ne lt le gt ge eq_to lt_to le_to and or not xor is_finite floor ceil round real imag
    convert_element_type bitcast_convert_type reshape broadcast_in_dim transpose squeeze
    slice dynamic_slice dynamic_update_slice concatenate pad rev iota copy gather stack unstack
    split tile stop_gradient reduce_max reduce_min argmax argmin reduce_and reduce_or
""".split())
# XLA's call inliner, and XLA:CPU's hoisting of a small while loop into one
# kernel (NOTE [one rounding per primitive])
KEEP_CALLS = {"xla_disable_hlo_passes": "call-inliner,small-while-loop-hoisting"}
# .mode: this thread is tracing one of the eager engine's programs, whose
# primitives are kept apart as `isolation()` says (read by interpreters/eval.py)
TRACING = threading.local()


def isolation():
    """How the eager engine's programs keep each primitive's rounding its
    own (NOTE [one rounding per primitive]): "calls" on the CPU backend,
    where this jaxlib takes the option, else "barriers"."""
    if jax.default_backend() == "cpu" and _takes(*KEEP_CALLS.items()):
        return "calls"
    return "barriers"


def keeps_calls():
    """Whether the eager engine's programs keep their primitives as calls."""
    return isolation() == "calls"


def keep_calls(options=None):
    """`options` with XLA's call inliner off, where `keeps_calls()`."""
    return {**(options or {}), **KEEP_CALLS} if keeps_calls() else options


def between_barriers(fn, args, params):
    """`fn(*args, **params)` with optimisation barriers on its operands and
    results ("barriers" isolation): XLA's simplifier sees through neither,
    so it rewrites nothing across them."""
    return jax.lax.optimization_barrier(
        fn(*jax.lax.optimization_barrier(tuple(args)), **params))


def _traced_isolated(fn, eager):
    """`fn`, tracing the primitives it evaluates kept apart as
    `isolation()` says when `eager` (NOTE [one rounding per primitive]), or
    bound inline when not (a user's `functx.jit` program, even one nested
    in an eager program)."""
    mode = isolation() if eager else None

    @functools.wraps(fn)
    def traced(*args):
        was = getattr(TRACING, "mode", None)
        TRACING.mode = mode
        try:
            return fn(*args)
        finally:
            TRACING.mode = was

    return traced


def jit_by_size(fn, sizes, eager=False):
    """`jax.jit(fn)`, compiled with `options_for(sizes)` and XLA's call
    inliner off when called at the top level; for one of the eager engine's
    programs (`eager`), with its primitives kept as calls (NOTE [one
    rounding per primitive])."""
    fn = _traced_isolated(fn, eager)
    plain = jax.jit(fn)
    # every program run here keeps its calls, as the eager engine's combined
    # programs (which may call it) do: XLA's inliner would fuse, say, the
    # iterations of an unrolled scan that stay calls inside a combined
    # program, and the program alone would round otherwise than the call
    options = keep_calls(options_for(sizes))
    if options is None:
        return plain
    tuned = jax.jit(fn, compiler_options=options)

    def call(*args):
        if not top_level():
            return plain(*args)
        out = tuned(*args)
        if eager:
            note_run(out)
        return out

    call.lower = lambda *args: (tuned if top_level() else plain).lower(*args)
    call.trace = lambda *args: (tuned if top_level() else plain).trace(*args)
    call.cache_size = lambda: plain._cache_size() + tuned._cache_size()  # executables held
    return call


_last_run = [None]  # a weak reference to an output of the last eager program dispatched


def note_run(out):
    """Remember (weakly) an output of a program the eager engine has just
    dispatched at the top level (NOTE [a program's first run] in
    interpreters/eval.py)."""
    leaf = out[0] if type(out) in (list, tuple) and out else out
    try:
        _last_run[0] = weakref.ref(leaf)
    except TypeError:
        pass


def last_program_finished(wait):
    """Whether the eager engine's last program dispatched at the top level
    has finished (or was dropped), after waiting for it at most `wait`
    seconds."""
    deadline = time.perf_counter() + wait
    while True:
        ref = _last_run[0]
        out = ref() if ref is not None else None
        try:
            if out is None or out.is_ready():
                return True
        except Exception:  # noqa: BLE001 - deleted or not an array: nothing to wait for
            return True
        if time.perf_counter() >= deadline:
            return False
        time.sleep(0.0005)


def _known():
    """Whether this jaxlib's XLA:CPU takes YNNPACK's option."""
    return _takes(*PRODUCTS_OFF.items())


_taken = {}  # options -> whether this jaxlib takes them
_taken_lock = threading.Lock()


def _takes(*options):
    """Whether this jaxlib's XLA takes these (name, value) compile options
    (one tiny compile, once; a thread asking while another compiles it
    waits for that answer)."""
    with _taken_lock:
        found = _taken.get(options)
        if found is None:
            try:
                jax.jit(lambda x: x + 1).lower(1.0).compile(dict(options))
                found = True
            except Exception:  # noqa: BLE001 - an unknown option: keep XLA's defaults
                found = False
            _taken[options] = found
        return found


def ask_ahead():
    """Start asking the jaxlib about the eager engine's compile options
    (`isolation()`) on a short-lived thread, once: called as the first
    transform call of the process begins, so that the tiny compile (20-30
    ms on the 2-core VM) overlaps the call's staging instead of delaying
    its first program. Not a daemon: the interpreter waits for it at exit.
    A daemon thread still inside XLA's compiler when the interpreter ends
    (a script whose first call raised at once) is stopped by unwinding its
    C++ frames, and the process aborted ("FATAL: exception not
    rethrown")."""
    if KEEP_CALLS_KEY not in _taken and not _asking:
        _asking.append(True)
        threading.Thread(target=isolation, name="functx-options").start()


KEEP_CALLS_KEY = tuple(KEEP_CALLS.items())
_asking = []
