"""The bottom of the stack: evaluation by lowering onto jax.lax.

A primitive whose arguments hold no functx tracer runs here. Most functx
primitives mirror a `jax.lax` primitive with the same parameters, so their
evaluation is a call of that primitive:

* on JAX tracers (inside `jax.jit`, `jax.vmap`, ...) it binds the JAX
  primitive directly, so the functx stack leaves a pure JAX program behind;
* on concrete arrays it calls a `jax.jit`-compiled wrapper of the primitive,
  cached per parameters, which takes JAX's C++ dispatch path (about three
  times cheaper than binding the JAX primitive eagerly).
"""

import collections
import threading
import weakref

import jax

from .. import caches, xla_cpu

_tracing = xla_cpu.TRACING  # .mode: NOTE [one rounding per primitive]

impl_rules = {}  # Primitive -> callable(*args, **params)

_JaxTracer = jax.core.Tracer


def lower_to_jax(prim, bind=None):
    """Register the evaluation of `prim` as its JAX primitive, bound by
    `bind(*args, **params)` (default: the JAX primitive's own bind; a
    borrowed primitive binds with the parameters of its jaxpr equation)."""
    jax_prim = prim.jax
    own = bind is None
    if own:
        bind = jax_prim.bind
    compiled = {}  # key -> [jitted bind, used]: NOTE [eager programs, bounded process-wide]
    sized = prim.name == "dot_general"  # NOTE [XLA:CPU's matrix-product library]
    fusible = prim.name in xla_cpu.FUSIBLE

    def inline(xs, ps):
        return _bind_traced(jax_prim, xs, ps) if own else bind(*xs, **ps)

    def impl(*args, **params):
        for a in args:
            if isinstance(a, _JaxTracer):
                mode = getattr(_tracing, "mode", None)
                if mode and not (fusible and all(isinstance(b, _JaxTracer) for b in args)):
                    if mode == "calls":  # a call of its own program
                        args = _opaque_constants(args)
                        break
                    return xla_cpu.between_barriers(lambda *xs, **ps: inline(xs, ps), args, params)
                return inline(args, params)
        try:
            # options are for programs compiled alone, not for calls nested
            # in another program (jax.jit refuses them there)
            top = xla_cpu.top_level()
            key = (tuple(params.items()), top, top and sized and xla_cpu.dot_takes_products_off(
                args[0], args[1], params["dimension_numbers"]))
            entry = compiled[key]
            entry[1] = True
        except KeyError:
            options = None
            if top:
                options = xla_cpu.keep_calls(xla_cpu.products_off() if key[2] else None)
            entry = _keep(compiled, key, jax.jit(_named_bind(bind, jax_prim.name, params),
                                                 compiler_options=options))
        except (TypeError, AttributeError):  # unhashable parameters, shapeless args: no cache
            if not top and getattr(_tracing, "mode", None) == "calls":  # still its own call
                return jax.jit(_named_bind(bind, jax_prim.name, params))(*args)
            return bind(*args, **params)
        out = entry[0](*args)
        if _audit_due[0]:
            _bound()
        return out

    impl.programs = compiled  # parameters (and for dot_general: large?) -> [jitted bind, used]
    impl_rules[prim] = impl
    return impl


def _opaque_constants(args):
    """The constant operands of a primitive kept as a call (NOTE [one
    rounding per primitive]) passed through an optimisation barrier: XLA
    propagates a constant operand into the computation it calls and folds
    it there (a `polygamma(1, x)` of a digamma jvp then rounds otherwise
    than its program alone does, which takes the 1 as an argument); it
    sees through no barrier."""
    if all(isinstance(a, _JaxTracer) for a in args):
        return args
    out = []
    for a in args:
        if not isinstance(a, _JaxTracer):
            try:
                a = jax.lax.optimization_barrier(a)
            except (TypeError, ValueError):  # not an array (an extended dtype): as it is
                pass
        out.append(a)
    return tuple(out)


def _bind_traced(jax_prim, args, params):
    try:
        return jax_prim.bind(*args, **params)
    except ValueError:
        return bind_varying(jax_prim, args, params)


def bind_varying(jax_prim, args, params):
    """A bind JAX refused, tried again with the operands' varying manual
    axes matched: inside a `jax.shard_map` body (check_vma), jax.lax's
    functions cast a value that is the same on every device (pvary) before
    combining it with one that varies, which a bare bind does not do. Any
    other refusal is raised as it was."""
    from jax._src import config as jconfig
    from jax._src import core as jcore

    if not jconfig._check_vma.value:
        raise
    try:
        fixed = jcore.auto_insert_reshard(*args)
    except Exception:  # noqa: BLE001 - the original refusal is the error to show
        fixed = args
    if all(f is a for f, a in zip(fixed, args)):
        raise
    return jax_prim.bind(*fixed, **params)


# NOTE [eager programs, bounded process-wide]
# An eager primitive on concrete arrays runs a jax.jit of its bind, one per
# primitive and parameter set, which compiles one executable per argument
# signature (as JAX's own eager mode does); a `jit_call` run on arrays (a
# jitted JAX function met eagerly, the graphs derived from it, a
# `functx.jit` under an eager transform) runs the program of its graph,
# one per graph. Each executable holds about `caches.PROGRAM_BYTES` of host
# memory (1.4 MB and three memory mappings for a small one with jax 0.10
# on XLA:CPU), so a process meeting many primitives, parameters, functions
# and shapes (a sweep over an op table, many batch sizes) grew without
# bound: a bound per primitive still allowed about 100,000 programs, and
# one such process reached 5.6 GB and 58,000 mappings (the kernel refuses
# past 65,530, and LLVM then fails to compile). So all these programs
# share one bound: at most `PROGRAM_LIMIT` jitted binds and call programs
# holding at most `PROGRAM_BYTE_LIMIT` bytes of executables, each counted
# for `caches.PROGRAM_BYTES` (XLA:CPU reports no code size). Eviction is
# second-chance LRU (a clock): every program is listed in the order it was
# made (a call's graph held weakly), a call of a listed program marks it
# used (one store, the only cost a cached call pays), and past a bound the
# oldest unmarked program is dropped, a marked one unmarked and moved to
# the end, down to seven eighths of the bound. The executables of all listed programs are counted
# (`_cache_size()`, a C++ call) when a new program takes the running count
# past a bound and, for new argument signatures of programs already made,
# at the next eager primitive after every `_AUDIT_EVERY` compilations JAX
# reports (`caches.on_compile`). A dropped program is compiled again if it
# is needed again; its executables go with it (JAX holds them weakly
# through the program's function). The combined programs of the eager
# engine and its backward passes are bounded by their own caches (NOTE
# [bounded caches] in caches.py).

PROGRAM_LIMIT = 2048  # jitted binds (primitive, parameters), all primitives together
PROGRAM_BYTE_LIMIT = 1 << 30  # their executables, `caches.PROGRAM_BYTES` each at least
_AUDIT_EVERY = 16  # JAX compilations between counts of the executables

_PROGRAMS = collections.deque()  # (programs dict or weakref to a graph, key), oldest first
_lock = threading.Lock()
_audit_due = [False]  # set after `_AUDIT_EVERY` compilations
_compiles = [0]
_counted = [0]  # executables at the last count


def _keep(holder, key, fn):
    """List a new program (unmarked) under `key` of `holder` (a primitive's
    programs, or a weak reference to a graph: its cache), and keep the
    bounds."""
    programs = _container(holder)
    with _lock:
        entry = programs.get(key)
        if entry is not None:  # another thread made it meanwhile
            return entry
        entry = programs[key] = [fn, False]
        _PROGRAMS.append((holder, key))
        _counted[0] += 1
        over = (len(_PROGRAMS) > PROGRAM_LIMIT
                or _counted[0] > PROGRAM_BYTE_LIMIT // caches.PROGRAM_BYTES)
    if over:
        _bound()
    return entry


def keep_call_program(graph, fn, whole=False):
    """List `fn`, the program a `jit_call` of `graph` runs on concrete
    arrays (`compiled(graph, eager=True)`, or `compiled(graph)` when
    `whole`), under the same bound, holding the graph weakly: dropped, the
    graph's program is made again at its next call."""
    return _keep(weakref.ref(graph), WHOLE_CALL_PROGRAM if whole else CALL_PROGRAM, fn)


CALL_PROGRAM = "call program"  # graph.cache key of a listed call's program: [fn, used]
# ... and of one compiled whole (NOTE [a jitted function differentiated
# alone] in primitives/call.py)
WHOLE_CALL_PROGRAM = "whole call program"


def _container(holder):
    """The dict an entry of the clock lives in: a primitive's programs, or
    the cache of a graph still alive (None once it died)."""
    if type(holder) is dict:
        return holder
    graph = holder()
    return graph.cache if graph is not None else None


def _drop(programs, key):
    del programs[key]
    if key == CALL_PROGRAM:  # the graph's own reference to the same program
        programs.pop("compiled eager", None)
    elif key == WHOLE_CALL_PROGRAM:
        programs.pop("compiled", None)


def _executables(entry):
    fn = entry[0]
    try:
        size = fn._cache_size() if hasattr(fn, "_cache_size") else fn.cache_size()
        return max(1, size)
    except Exception:  # noqa: BLE001 - a program without JAX's C++ cache: one program
        return 1


def _bound():
    """Count the executables and drop binds, second-chance LRU, until both
    bounds hold (NOTE [eager programs, bounded process-wide])."""
    with _lock:
        _audit_due[0] = False
        _compiles[0] = 0
        sizes = {}
        total = 0
        live = []
        for holder, key in _PROGRAMS:
            programs = _container(holder)
            entry = programs.get(key) if programs is not None else None
            if entry is not None:  # (else dropped with its graph, or cleared)
                live.append((holder, key))
                sizes[id(entry)] = n = _executables(entry)
                total += n
        _PROGRAMS.clear()
        _PROGRAMS.extend(live)
        limit = max(1, PROGRAM_BYTE_LIMIT // caches.PROGRAM_BYTES)
        if len(_PROGRAMS) <= PROGRAM_LIMIT and total <= limit:
            _counted[0] = total
            return
        # over a bound: down to 7/8 of each, so that the next count (a walk
        # over every program) comes an eighth of the bound later, not at
        # every new program
        entries, limit = PROGRAM_LIMIT - PROGRAM_LIMIT // 8, limit - limit // 8
        turns = 2 * len(_PROGRAMS)
        while _PROGRAMS and (len(_PROGRAMS) > entries or total > limit) and turns:
            turns -= 1
            holder, key = _PROGRAMS.popleft()
            programs = _container(holder)
            entry = programs.get(key) if programs is not None else None
            if entry is None:
                continue
            if entry[1]:  # used since its last turn: a second chance
                entry[1] = False
                _PROGRAMS.append((holder, key))
                continue
            _drop(programs, key)
            total -= sizes.get(id(entry), 1)
        _counted[0] = total


def _on_compile():
    _compiles[0] += 1
    if _compiles[0] >= _AUDIT_EVERY:
        _audit_due[0] = True


caches.on_compile(_on_compile)


def _clear():
    with _lock:
        for holder, key in _PROGRAMS:
            programs = _container(holder)
            if programs is not None and key in programs:
                _drop(programs, key)
        _PROGRAMS.clear()
        _counted[0] = 0


def _named_bind(bind, name, params):
    def program(*args):
        return bind(*args, **params)

    program.__name__ = program.__qualname__ = f"functx_eval_{name}"
    return program


def _info():
    _bound()
    return {"entries": len(_PROGRAMS), "limit": PROGRAM_LIMIT,
            "bytes": _counted[0] * caches.PROGRAM_BYTES, "byte_limit": PROGRAM_BYTE_LIMIT,
            "doc": "one jitted bind per primitive and parameter set and one program per "
                   "call graph run on arrays, one executable per argument signature, all "
                   "together (second-chance LRU)"}


caches.register("eager programs", _clear, _info)


def defimpl(prim, fn):
    """Register a hand-written evaluation of `prim` (for primitives that are
    not a single JAX primitive). Inside a program of the eager engine with
    "barriers" isolation it sits between barriers, as `lower_to_jax`'s
    primitives do (NOTE [one rounding per primitive])."""

    def impl(*args, **params):
        if getattr(_tracing, "mode", None) == "barriers" and any(
                isinstance(a, _JaxTracer) for a in args):
            return xla_cpu.between_barriers(fn, args, params)
        return fn(*args, **params)

    impl_rules[prim] = impl
    return fn


def compiled(graph, name="functx_graph", eager=False):
    """A staged graph as one jax.jit-compiled function of its inputs
    (returning the list of its outputs), made once per graph (with the
    options of NOTE [XLA:CPU's matrix-product library]); `name` is the
    program's name in JAX's compile logs. `eager`: a program of the eager
    engine, whose primitives keep their own calls (NOTE [one rounding per
    primitive])."""
    key = "compiled eager" if eager else "compiled"
    fn = graph.cache.get(key)
    if fn is None:
        from .staging import eval_graph

        def run(*args):
            return eval_graph(graph, args)

        run.__name__ = run.__qualname__ = name
        fn = graph.cache[key] = xla_cpu.jit_by_size(run, xla_cpu.sizes_in_graph(graph), eager)
    return fn


def compile_ahead(fn, *args):
    """A function compiling `fn` (a `compiled(...)` program) for arguments
    shaped like `args` (arrays or avals, nested in lists) and running it
    once (NOTE [a program's first run]), returning the program's size in
    bytes: what a `RepeatCache` runs off the calling thread (NOTE [bounded
    caches])."""
    specs = jax.tree_util.tree_map(_spec, list(args))

    def compile_now():
        traced = fn.trace(*specs)
        program = traced.lower().compile()
        _first_run(program, traced.jaxpr, specs)
        return caches.program_size(program)

    return compile_now


# NOTE [a program's first run]
# XLA:CPU finishes a program's machine code on its first run, not when it
# compiles it: the first run of a freshly compiled program costs about as
# much again as compiling a part of it did (measured with jax 0.10 on the
# 2-core VM: 6 ms for a 5-operation gradient, 31 ms for 20 operations,
# 84 ms for 80, where later runs take 0.1-3.6 ms). The programs the compile
# thread builds for the eager engine (deferred queues, staged backward
# passes) would pay it in the first user call that runs them, which was
# then up to 5x slower than the call before it. So the compile thread runs
# each such program once, on zeros of its argument shapes, before the calls
# can take it (the executable is the one jax.jit's cache hands the call).
# Only while no call is in progress and the last program a call
# dispatched has finished (after waiting `caches.MAX_WAIT` for each): the
# run uses every core XLA's threads have, and a call running beside it was
# slowed more than by the first run it spares (MAML's call 7 took 160 ms
# instead of 40-90 ms); in a tight loop of calls the first call to run the
# program pays for it, as before. Not for a program with effects or
# callbacks (a zero run would be seen), one whose arguments exceed
# `FIRST_RUN_BYTES` (the run would cost a call's compute and memory beside
# the user's), or under jax_debug_nans/infs (zeros may make NaNs). A first
# run that fails is ignored: the call runs the program as before.
FIRST_RUN_BYTES = 64 << 20


def _calls_back(closed):
    from ..interop import _calls_back

    return _calls_back(getattr(closed, "jaxpr", closed))


def _first_run(program, jaxpr, specs):
    leaves = jax.tree_util.tree_leaves(specs)
    if (jax.config.jax_debug_nans or jax.config.jax_debug_infs
            or sum(s.size * s.dtype.itemsize for s in leaves) > FIRST_RUN_BYTES
            or _calls_back(jaxpr) or not caches.wait_for_idle()
            or not xla_cpu.last_program_finished(caches.MAX_WAIT)):
        return
    from ..core import jax_zeros

    try:
        # copied from the host: jnp.zeros would compile a program per shape
        zeros = jax.tree_util.tree_map(lambda s: jax_zeros(s.shape, s.dtype), specs)
        jax.block_until_ready(program(*zeros))
    except Exception:  # noqa: BLE001 - only a warm-up: the call will run it as before
        pass


def _spec(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=bool(getattr(x, "weak_type", False)))
