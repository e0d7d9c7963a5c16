"""`jit` and `make_graph`: compiling and printing whole programs.

NOTE [two ways down to XLA]
`functx.jit(f)` called on plain JAX values (no functx transform active) is a
`jax.jit` of `f`: the functx interpreters run once, while JAX traces, and
leave a pure JAX program, which XLA compiles and caches per shapes, dtypes
and static arguments. Calls that hit the cache take jax.jit's C++ path.

Called on values of an enclosing functx transform (`grad(jit(f))`,
`vmap(jit(f))`), `f` is staged once per signature (and per function, however
many `jit(f)` wrap it: NOTE [one jit per function]) into a functx `Graph` and
applied with the `jit_call` primitive (primitives/call.py), whose rules
transform the graph as a whole; the enclosing transform sees one operation
and the bottom of the stack runs it as one compiled program. A function that
closes over values of the enclosing transforms, or draws from functx's
stateful generator there, is not staged: it runs inline under them (its
graph would be valid for one call only).

The generator state of `functx.random` is threaded through compiled code
(NOTE [generator state under jit] in random.py).

NOTE [no Python in front of a cached call]
What `functx.jit` returns is JAX's own C++ jitted-function object, built
with a cache-miss handler of functx's (`_cpp_jit`). A call whose arguments
hit its cache runs in C++ exactly as a `jax.jit` call does; anything else
(a new signature, a functx transform active, the stateful generator) lands
in `Jitted._miss`, which either lets JAX trace and cache the pure program or
takes the staged / stateful path and tells JAX to cache nothing. A call
under a transform can never hit the cache by mistake: functx values are not
JAX arrays, so the C++ path always misses on them, and a function closing
over a transform's values is a new object, whose cache is empty. The
handler is installed through JAX internals (`jax._src.pjit`); if they are
not as expected, `jit` returns a Python `_Wrapper` instead, which costs
~1.5 µs more per call. Each `jit(f)` returns a C++ function of its own (it
holds `f`), built on the traced function shared by every `jit(f)` of the
same `f` (NOTE [one jit per function]) from the arguments JAX parsed for
the first (`_jit_info`), so a fresh wrapper costs less than a `jax.jit(f)`
and its first call hits the programs JAX cached for that function.

`jit` compiles with the options of NOTE [XLA:CPU's matrix-product library]
(functx/xla_cpu.py): `_miss` traces the program first (JAX caches the trace,
and compiles it when the options are the user's) and compiles one whose
options differ through the cache miss of a second C++ jitted function built
with them, whose result the first function caches, so later calls stay in
C++. A program that threads the generator state (which runs Python on every
call) makes the same choice once per signature (`_stateful_for`).
"""

import collections
import enum
import functools
import inspect
import threading
import types
import weakref

import jax
import numpy as np
from jax import tree_util

from .. import caches
from .. import random as _random
from .. import xla_cpu
from ..caches import options_id
from ..core import _state as _stack_state
from ..core import aval_of, bind
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.staging import stage
from ..primitives.call import call_name, jit_call
from ..primitives.collectives import live_axes
from ._args import as_array, check_callable, fn_name

# jax.jit's "no sharding given" (None has a meaning of its own there)
try:
    from jax._src.sharding_impls import UNSPECIFIED
except ImportError:  # another JAX layout
    UNSPECIFIED = object()


def _as_tuple(x, what, kind, name):
    """`static_argnums` / `donate_argnums` (kind int) or `static_argnames`
    (kind str) as a tuple, each entry checked."""
    if x is None:
        return ()
    items = (x,) if isinstance(x, (int, str, np.integer)) else x
    try:
        items = tuple(items)
    except TypeError:
        items = None
    if items is not None and all(
            isinstance(v, str) if kind is str
            else isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        return tuple(v if kind is str else int(v) for v in items)
    if kind is str:
        hint = "name parameters as strings, e.g. static_argnames=('n',)"
    else:
        hint = (f"give positions as ints, e.g. {what}=(1,)"
                + ("; to name parameters use static_argnames" if what == "static_argnums" else ""))
    raise FunctxTypeError(
        f"jit({name}, {what}={x!r}): `{what}` must be "
        + ("a str or a tuple of strs" if kind is str else "an int or a tuple of ints")
        + f", got {x!r}. To fix it, {hint}."
    )


def _resolve_static(fun, static_argnums, static_argnames):
    """Complete static_argnums and static_argnames from each other through
    the signature of `fun` (a parameter can be passed either way)."""
    name = fn_name(fun)
    nums = set(_as_tuple(static_argnums, "static_argnums", int, name))
    names = set(_as_tuple(static_argnames, "static_argnames", str, name))
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = None  # no signature to check against (a builtin): trust the names
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params):
        known = {p.name for p in params if p.kind is not p.POSITIONAL_ONLY}
        unknown = sorted(names - known)
        if unknown:
            raise FunctxValueError(
                f"jit({name}, static_argnames={static_argnames!r}): {name} has no parameter "
                f"{', '.join(map(repr, unknown))} that can be passed by name (its parameters: "
                f"{', '.join(p.name for p in params) or 'none'}). Fix the name, or use "
                "static_argnums for a positional-only parameter."
            )
    params = params or []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(positional):
        if p.name in names:
            nums.add(i)
        if i in nums and p.kind is p.POSITIONAL_OR_KEYWORD:
            names.add(p.name)
    if positional and not any(p.kind is p.VAR_POSITIONAL for p in params):
        n = len(positional)
        for i in nums:
            if not -n <= i < n:
                raise FunctxValueError(
                    f"jit({name}): static_argnums={sorted(nums)} is out of range: the "
                    f"function takes {n} positional argument{'s' if n != 1 else ''}. Use "
                    f"positions in [{-n}, {n}), or drop {i} from static_argnums."
                )
    return tuple(sorted(nums)), tuple(sorted(names))


def _unhashable_error(name, what, value):
    return FunctxValueError(
        f"jit({name})(*args): static arguments must be hashable, but {what} is a "
        f"{type(value).__name__}, which is not. Pass a hashable value instead (a tuple "
        "for a list, a frozen dataclass, ...), or pass it as an array argument (not in "
        "static_argnums / static_argnames)."
    )


_cpp_lock = threading.Lock()
_fastpath_tail = []  # what a cache-miss handler returns after the outputs to cache nothing


class _PjitModuleProxy:
    """Stands in for `jax._src.pjit._jax` while one jitted function is
    built, wrapping its cache-miss handler."""

    def __init__(self, real, fun, miss):
        self._real, self._fun, self._miss = real, fun, miss
        self.used = False

    def __getattr__(self, name):
        return getattr(self._real, name)

    def pjit(self, name, fun, cache_miss, *rest):
        if fun is not self._fun:  # another thread's jax.jit: leave it alone
            return self._real.pjit(name, fun, cache_miss, *rest)
        self.used = True
        self.cache_miss = cache_miss
        handler = self._miss

        def miss(*args, **kwargs):
            return handler(cache_miss, args, kwargs)

        return self._real.pjit(name, fun, miss, *rest)


def _cpp_jit(fun, miss, options, with_jax_miss=False, jit_info=None):
    """`jax.jit(fun, **options)` whose cache misses go to
    `miss(jax_miss, args, kwargs)`; None where JAX's internals differ. With
    `with_jax_miss`: (that function, JAX's own cache miss of it), or None.
    `jit_info`: what JAX parsed from `fun` and `options` for an earlier one
    (its `_jit_info`), which skips parsing them again (two thirds of
    jax.jit's cost; NOTE [one jit per function])."""
    try:
        from jax._src import pjit as _pjit

        real = _pjit._jax
        if not callable(getattr(real, "pjit", None)):
            return None
    except Exception:  # noqa: BLE001 - any mismatch: use the Python wrapper
        return None
    with _cpp_lock:
        proxy = _PjitModuleProxy(real, fun, miss)
        _pjit._jax = proxy
        try:
            jitted = None
            if jit_info is not None:
                try:
                    jitted = _pjit._cpp_pjit(fun, jit_info)
                except Exception:  # noqa: BLE001 - JAX's internals differ: parse again
                    proxy.used = False
            if jitted is None:
                jitted = jax.jit(fun, **options)
        finally:
            _pjit._jax = real
    if not proxy.used:
        return None
    return (jitted, proxy.cache_miss) if with_jax_miss else jitted


def _learn_fastpath_arity(result):
    if not _fastpath_tail and isinstance(result, tuple) and len(result) >= 2:
        _fastpath_tail.append((None,) + (False,) * (len(result) - 2))


def _no_fastpath():
    """The tail of a cache-miss result that makes JAX cache nothing, learnt
    from a JAX cache miss (one tiny compile if none has happened yet)."""
    if not _fastpath_tail:
        probe = _cpp_jit(lambda: 0, lambda jax_miss, a, k: _learn(jax_miss(*a, **k)), {})
        probe()
    return _fastpath_tail[0]


def _learn(result):
    _learn_fastpath_arity(result)
    return result


class _Inline:
    """Cache entry: this signature runs inline (see NOTE [two ways down to XLA])."""


# -- the cache of jit's state, keyed on the function --------------------------
#
# NOTE [one jit per function]
# `functx.jit(f, **options)` looks up the state behind it (a `Jitted`: the
# graphs staged for transforms, the traced function whose programs JAX
# compiles and caches) in `_cache`, keyed on `f` and the options, so that
# every `functx.jit(f)` of the same `f` (a new wrapper per loop iteration,
# per call of a transformed function) traces, stages and compiles once, as
# every `jax.jit(f)` of the same `f` does. Under a transform the staged
# graph is the same object each time, so what the transforms derive from it
# and cache on `graph.cache` (its jvp, transpose, batched graphs, compiled
# programs) and the eager caches keyed on it are reused too.
#
# * The key names `f` by identity, as JAX's caches do: a new function object
#   (a lambda or closure made again) is a new key, even with the same code
#   and the same closure cells, so two closures over different values never
#   share a graph; and a function whose globals or cells change after its
#   first call keeps what its first trace baked in (as with jax.jit). Two
#   more cases are shared where JAX would trace again, soundly: a
#   `functools.partial` by (its function's key, its arguments, its keyword
#   arguments), the arguments by (type, value) for numbers, strings, None,
#   enum members, dtypes and tuples of those (1 and 1.0 are different keys),
#   by identity for objects that hash by identity; and a bound method by
#   (its function's key, the identity of its object). Anything else (an
#   array or other unhashable argument, an object that takes no weak
#   reference) is not shared: that wrapper gets state of its own.
# * The options in the key are the user's `static_argnums`,
#   `static_argnames`, `donate_argnums` and `compiler_options`. Within an
#   entry, staged graphs are keyed as before on the input pytree structure,
#   the static argument values and the input avals (not on the enclosing
#   transforms: their rules transform the graph), and compiled programs on
#   what JAX keys them on (its caches are keyed on the entry's `trace_pure`).
#   Staged graphs are keyed on JAX's options too, as jax.jit's traces are.
# * Weak: the cache holds `f` (and every object its key names by identity)
#   through weak references whose callbacks drop the entry when one dies
#   (at once, or at the next use of the cache if it was busy then);
#   the entry holds the functions it stands for weakly too (`_Funs`). What
#   `jit` returns holds `f` strongly (its `__wrapped__`, miss handler and
#   `lower`) and the entry strongly, so an entry that leaves the cache never
#   breaks a live wrapper.
# * Bounded: `_cache` is an LRU of `CACHE_SIZE` entries, and each entry's
#   staged graphs and stateful programs an LRU of `SIGNATURE_CACHE_SIZE`
#   signatures (module attributes, read on each insertion); the programs
#   JAX compiles are in JAX's own bounded caches. `clear_cache()` empties
#   ours (a later `functx.clear_caches()` calls it), `cache_info()` reports
#   them.

CACHE_SIZE = 256  # entries (function, options) in `_cache`
SIGNATURE_CACHE_SIZE = 64  # signatures per entry: staged graphs, stateful programs


class _LRU:
    """A map in least-recently-used order, bounded by the module attribute
    named `bound` (read on each insertion). Mutated only under `lock`
    (NOTE [caches shared between threads] in caches.py)."""

    __slots__ = ("bound", "entries", "lock")

    def __init__(self, bound):
        self.entries = collections.OrderedDict()
        self.bound = bound
        self.lock = threading.Lock()

    def __len__(self):
        return len(self.entries)

    def get(self, key):
        entries = self.entries
        value = entries.get(key)
        if value is not None:
            with self.lock:
                try:
                    entries.move_to_end(key)
                except KeyError:  # another thread dropped it meanwhile
                    pass
        return value

    def put(self, key, value):
        entries = self.entries
        bound = max(1, int(globals()[self.bound]))
        with self.lock:
            entries[key] = value
            while len(entries) > bound:
                entries.popitem(last=False)
        return value

    def clear(self):
        with self.lock:
            self.entries.clear()


class _Funs:
    """The live functions one Jitted stands for: one, or several equal ones
    (partials, bound methods; NOTE [one jit per function]), held weakly when
    the Jitted is shared. Any of them computes the same."""

    __slots__ = ("refs", "strong")

    def __init__(self):
        self.refs = []
        self.strong = None

    def add(self, fun, weak=True):
        if not weak:
            self.strong = fun
            return
        live = [r for r in self.refs if r() is not None]
        if not any(r() is fun for r in live):
            live.append(weakref.ref(fun))
        self.refs = live

    def get(self):
        if self.strong is not None:
            return self.strong
        for r in self.refs:
            fun = r()
            if fun is not None:
                return fun
        raise FunctxValueError(
            "functx.jit: the function of this compiled program was freed. Keep a reference "
            "to what functx.jit returned (it keeps its function alive) while calling it."
        )


_cache = collections.OrderedDict()  # key -> _Entry (NOTE [one jit per function])
_cache_lock = threading.Lock()
_dead_keys = []  # keys whose referents died while the lock was held


class _Entry:
    __slots__ = ("jitted", "refs")

    def __init__(self, jitted, refs):
        self.jitted, self.refs = jitted, refs

    def holds(self, objs):
        refs = self.refs
        return len(refs) == len(objs) and all(r() is o for r, o in zip(refs, objs))

    def alive(self):
        return all(r() is not None for r in self.refs)


def _drop_dead():
    """Drop the entries whose referents died (under `_cache_lock`)."""
    while _dead_keys:
        key = _dead_keys.pop()
        entry = _cache.get(key)
        if entry is not None and not entry.alive():
            del _cache[key]


def _on_death(key):
    def callback(_ref):
        try:
            _dead_keys.append(key)
            caches.run_if_free(_cache_lock, _drop_dead)  # held (maybe by this thread): later
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown (module globals cleared)
            pass

    return callback


_VALUE_TYPES = frozenset((int, float, complex, str, bytes, bool, type(None)))


def _weak_part(obj, objs):
    """`obj` named by identity, `objs` given it to hold weakly; None when it
    takes no weak reference."""
    try:
        weakref.ref(obj)
    except TypeError:
        return None
    objs.append(obj)
    return ("id", id(obj))


def _value_part(value, objs):
    """A key part for an argument bound into a partial: (type, value) for
    plain values (numbers, strings, None, enum members, dtypes; tuples of
    key parts), identity (held weakly) for objects that hash by identity;
    None for anything else (unhashable, or hashed by a value that might hold
    a function or an array strongly)."""
    t = type(value)
    if t in _VALUE_TYPES:
        return (t, value)
    if t is tuple:
        parts = tuple(_value_part(v, objs) for v in value)
        return None if any(p is None for p in parts) else ("tuple", parts)
    if isinstance(value, (enum.Enum, np.dtype)):
        return (t, value)
    if getattr(t, "__hash__", None) is object.__hash__:
        return _weak_part(value, objs)
    return None


def _function_part(fun, objs):
    """A key part naming `fun` (NOTE [one jit per function]), or None."""
    t = type(fun)
    if t is functools.partial:
        inner = _function_part(fun.func, objs)
        args = _value_part(fun.args, objs)
        kwargs = _value_part(tuple(sorted(fun.keywords.items())), objs)
        if inner is None or args is None or kwargs is None:
            return None
        return ("partial", inner, args, kwargs)
    if t is types.MethodType:
        inner = _function_part(fun.__func__, objs)
        owner = _weak_part(fun.__self__, objs)  # the same object, whatever its hash
        if inner is None or owner is None:
            return None
        return ("method", inner, owner)
    return _weak_part(fun, objs)


def _options_key(fun, static_argnums, static_argnames, donate_argnums, compiler_options,
                 shardings=(UNSPECIFIED, UNSPECIFIED)):
    if not (static_argnums or static_argnames or donate_argnums or compiler_options) and (
            shardings[0] is UNSPECIFIED and shardings[1] is UNSPECIFIED):
        return ()
    name = fn_name(fun)
    options = _check_compiler_options(compiler_options, fun)
    return (_as_tuple(static_argnums, "static_argnums", int, name),
            _as_tuple(static_argnames, "static_argnames", str, name),
            _as_tuple(donate_argnums, "donate_argnums", int, name),
            None if options is None else tuple(sorted(options.items())),
            shardings)  # (unhashable pytrees of shardings: no sharing)


def _jitted_for(fun, static_argnums, static_argnames, donate_argnums, compiler_options,
                shardings=(UNSPECIFIED, UNSPECIFIED)):
    """The Jitted of `fun` and these options: the cached one, or a new one
    (cached where `fun` can be named weakly)."""
    objs = []
    part = _function_part(fun, objs)
    key = None
    if part is not None:
        key = (part, _options_key(fun, static_argnums, static_argnames, donate_argnums,
                                  compiler_options, shardings))
        try:
            hash(key)
        except TypeError:  # an unhashable compiler option value: no sharing
            key = None
    if key is not None:
        with _cache_lock:
            _drop_dead()
            entry = _cache.get(key)
            if entry is not None and entry.holds(objs):
                _cache.move_to_end(key)
                return entry.jitted
    jitted = Jitted(fun, static_argnums, static_argnames, donate_argnums, compiler_options,
                    shared=key is not None, shardings=shardings)
    if key is None:
        return jitted
    with _cache_lock:
        _drop_dead()
        entry = _cache.get(key)
        if entry is not None and entry.holds(objs):  # another thread made it meanwhile
            return entry.jitted
        callback = _on_death(key)
        _cache[key] = _Entry(jitted, [weakref.ref(o, callback) for o in objs])
        bound = max(1, int(CACHE_SIZE))
        while len(_cache) > bound:
            _cache.popitem(last=False)
    return jitted


def clear_cache():
    """Empty `functx.jit`'s cache (NOTE [one jit per function] in
    functx/transforms/jit.py): the shared state of every `functx.jit(f)`,
    with the graphs it staged and the stateful programs it built. A wrapper
    that is still alive keeps working (it stages again when called under a
    transform); a later `functx.jit(f)` starts afresh. JAX's own caches of
    the compiled programs are cleared by `jax.clear_caches()`."""
    with _cache_lock:
        entries = list(_cache.values())
        _cache.clear()
        _dead_keys.clear()
    for entry in entries:
        entry.jitted._graphs.clear()
        entry.jitted._stateful_programs.clear()


def cache_info():
    """What `functx.jit`'s cache holds: a dict with `entries` (the
    (function, options) pairs cached now), `bound` (the most it holds,
    `CACHE_SIZE`; least recently used entries go first), `signatures`
    (the staged graphs and stateful programs of those entries) and
    `signature_bound` (the most each entry holds, `SIGNATURE_CACHE_SIZE`)."""
    with _cache_lock:
        _drop_dead()
        jitteds = [entry.jitted for entry in _cache.values()]
    return {
        "entries": len(jitteds),
        "bound": CACHE_SIZE,
        "signatures": sum(len(j._graphs) + len(j._stateful_programs) for j in jitteds),
        "signature_bound": SIGNATURE_CACHE_SIZE,
    }


class Jitted:
    """The state behind `functx.jit(f)`, shared by every `functx.jit(f)` of
    the same `f` and options (NOTE [one jit per function]): the functions
    it stands for (weakly), the shared traced function whose programs JAX
    caches, the cache-miss handler, the staged graphs and the stateful
    programs. What `jit` returns is a C++ jitted function of its own per
    call of `jit` (NOTE [no Python in front of a cached call]), or where
    that cannot be built a Python `_Wrapper`; either holds the function
    and this state, has `.functx_jitted` (this) and `.lower(*args)` (JAX's
    lowered program, for `.compile()`, `.as_text()`, `.cost_analysis()`,
    ...)."""

    # Internal state lives in slots, so that wrappers of a Jitted (which
    # copy its __dict__, as functools.wraps does) never copy it, and a
    # Jitted wrapping another wrapper never receives theirs.
    __slots__ = ("__dict__", "__weakref__", "_compiler_options", "_donate", "_funs", "_graphs",
                 "_in_shardings", "_out_shardings",
                 "_jit_info", "_name", "_options", "_other_jits", "_pure", "_shared", "_stateful",
                 "_stateful_by_options", "_stateful_programs", "_static_argnames",
                 "_static_argnums", "_trace_pure", "fast")

    def __init__(self, fun, static_argnums=(), static_argnames=(), donate_argnums=(),
                 compiler_options=None, shared=False, shardings=(UNSPECIFIED, UNSPECIFIED)):
        check_callable(fun, "jit")
        self._in_shardings, self._out_shardings = shardings
        self._compiler_options = _check_compiler_options(compiler_options, fun)
        self._shared = shared
        self._funs = funs = _Funs()
        funs.add(fun, weak=shared)
        self._name = fn_name(fun)
        self._static_argnums, self._static_argnames = _resolve_static(
            fun, static_argnums, static_argnames)
        self._donate = _as_tuple(donate_argnums, "donate_argnums", int, self._name)
        self._stateful = None  # built when a trace draws from the generator
        self._stateful_by_options = {}  # None or sorted options -> stateful jax.jit (<= 2)
        self._stateful_programs = _LRU("SIGNATURE_CACHE_SIZE")  # signature -> one of those
        self._graphs = _LRU("SIGNATURE_CACHE_SIZE")  # signature -> (graph, out tree) | _Inline
        functools.update_wrapper(self, fun, updated=())
        del self.__wrapped__  # the state holds no function strongly

        def trace_pure(*args, **kwargs):
            with _random.assume_no_draws():
                return funs.get()(*args, **kwargs)

        trace_pure.__name__ = trace_pure.__qualname__ = self._name
        self._trace_pure = trace_pure
        self._other_jits = {}  # sorted options -> (C++ function, its JAX cache miss) (<= 2)
        self._options = self._jit_options(self._compiler_options)
        # the C++ function of the state itself (tracing, lowering), holding no user function
        self._pure = _cpp_jit(trace_pure, self._miss, self._options)
        self.fast = self._pure is not None
        if self._pure is None:
            self._pure = jax.jit(trace_pure, **self._options)
        self._jit_info = getattr(self._pure, "_jit_info", None) if self.fast else None

    def _fun(self, *args, **kwargs):
        return self._funs.get()(*args, **kwargs)

    def wrapper(self, fun):
        """What `jit(fun)` returns: a new C++ jitted function (or `_Wrapper`)
        holding `fun` and this state, sharing the programs JAX caches for
        `_trace_pure`."""
        if self._shared:
            self._funs.add(fun)
        fn = None
        if self.fast:
            fn = _cpp_jit(self._trace_pure, functools.partial(_miss_keeping, self, fun),
                          self._options, jit_info=self._jit_info)
            if fn is not None:
                functools.update_wrapper(fn, fun, updated=())
                fn.lower = functools.partial(_lower_keeping, self, fun)
                fn.functx_jitted = self
        if fn is None:
            fn = _Wrapper(self, fun)
        if self._static_argnums or self._static_argnames:
            return _checking_static_arguments(fn, self)
        return fn

    def _jit_options(self, compiler_options):
        options = dict(static_argnums=self._static_argnums,
                       static_argnames=self._static_argnames,
                       donate_argnums=self._donate, compiler_options=compiler_options)
        if self._in_shardings is not UNSPECIFIED:  # NOTE [shardings of functx.jit]
            options["in_shardings"] = self._in_shardings
        if self._out_shardings is not UNSPECIFIED:
            options["out_shardings"] = self._out_shardings
        return options

    # -- the jax.jit path ---------------------------------------------------

    def _options_for_call(self, args, kwargs):
        """The compiler options of this call's program (NOTE [XLA:CPU's
        matrix-product library]): the user's, or a new dict."""
        if not self.fast or jax.default_backend() != "cpu" or not xla_cpu.top_level():
            return self._compiler_options
        try:
            jaxpr = type(self._pure).trace(self._pure, *args, **kwargs).jaxpr.jaxpr
        except Exception:  # noqa: BLE001 - the compile path raises it again, or handles it
            return self._compiler_options
        return xla_cpu.options_for(xla_cpu.sizes_in_jaxpr(jaxpr), self._compiler_options)

    def _other_jit(self, options):
        """(C++ jitted function, its JAX cache miss) compiling with `options`
        (a dict that differs from the user's), built once."""
        key = tuple(sorted(options.items()))
        found = self._other_jits.get(key)
        if found is None:
            found = self._other_jits[key] = _cpp_jit(
                self._trace_pure, lambda miss, a, k: miss(*a, **k), self._jit_options(options),
                with_jax_miss=True)
        return found

    def _jax_miss(self, jax_miss, args, kwargs):
        """JAX's cache miss for this call, compiling with the options of
        `_options_for_call`."""
        options = self._options_for_call(args, kwargs)
        if options is self._compiler_options:
            return jax_miss(*args, **kwargs)
        return self._other_jit(options)[1](*args, **kwargs)

    def _trace_stateful(self, key, *args, **kwargs):
        with _random.threaded_state(key) as final:
            out = self._fun(*args, **kwargs)
        return out, final.key

    def _stateful_jit(self, options=None, args=()):
        """The jax.jit of `f` threading the generator state, compiling with
        `options` (a dict that differs from the user's), or with the user's.
        `args`: the call's positional arguments (their number matters when
        one sharding stands for each of them)."""
        key = None if options is None else tuple(sorted(options.items()))
        shardings = {}
        if self._in_shardings is not UNSPECIFIED:  # NOTE [shardings of functx.jit]
            per_arg = self._in_shardings
            if not isinstance(per_arg, (tuple, list)):
                n = len(args) - len({i % len(args) for i in self._static_argnums
                                     if -len(args) <= i < len(args)}) if args else 0
                per_arg = (per_arg,) * n
                key = (key, n)
            shardings["in_shardings"] = (None, *per_arg)  # the state: JAX chooses
        found = self._stateful_by_options.get(key)
        if found is None:
            if self._out_shardings is not UNSPECIFIED:
                shardings["out_shardings"] = (self._out_shardings, None)
            found = self._stateful_by_options[key] = jax.jit(
                self._trace_stateful,
                static_argnums=tuple(i + 1 for i in self._static_argnums),
                static_argnames=self._static_argnames,
                donate_argnums=tuple(i + 1 for i in self._donate),
                compiler_options=self._compiler_options if options is None else options,
                **shardings,
            )
        if options is None:
            self._stateful = found
        return found

    def _stateful_for(self, args, kwargs):
        """The stateful program for this call, compiling with the options of
        NOTE [XLA:CPU's matrix-product library]; the choice is made once per
        signature (the state threading runs Python on every call anyway)."""
        default = self._stateful_jit(args=args)
        if jax.default_backend() != "cpu" or not xla_cpu.top_level():
            return default
        if self._static_argnums or self._static_argnames:
            dyn, static, _ = self._split(args, kwargs)
        else:
            dyn, static = (args, kwargs), ()
        leaves, tree = tree_util.tree_flatten(dyn)
        signature = ("signature", tree, static, tuple(
            (type(x), getattr(x, "shape", None), getattr(x, "dtype", None),
             getattr(x, "weak_type", None)) for x in leaves))
        found = self._stateful_programs.get(signature)
        if found is None:
            try:
                traced = default.trace(_random.get_rng_state(), *args, **kwargs)
            except Exception:  # noqa: BLE001 - the call raises it again
                return default
            options = xla_cpu.options_for(xla_cpu.sizes_in_jaxpr(traced.jaxpr.jaxpr),
                                          self._compiler_options)
            found = self._stateful_programs.put(signature, (
                default if options is self._compiler_options
                else self._stateful_jit(options, args)))
        return found

    def __call__(self, *args, **kwargs):
        # (through `_Wrapper`, used only where `_cpp_jit` is unavailable)
        if _stack_state.stack:
            return self._call_staged(args, kwargs)
        if self._stateful is None:
            try:
                if kwargs:
                    return self._pure(*args, **kwargs)
                return self._pure(*args)
            except _random.UsesGeneratorState:
                if _random.in_pure_trace():
                    raise  # an enclosing jit must thread the state first
        return self._call_stateful(args, kwargs)

    def _call_stateful(self, args, kwargs):
        out, key = self._stateful_for(args, kwargs)(_random.get_rng_state(), *args, **kwargs)
        _random.set_rng_state(key)
        return out

    def _miss(self, jax_miss, args, kwargs):
        """The C++ jitted function's cache-miss handler: `(outputs, what
        JAX caches, ...)` (NOTE [no Python in front of a cached call])."""
        if _stack_state.stack:
            return (self._call_staged(args, kwargs),) + _no_fastpath()
        if self._stateful is None:
            try:
                result = self._jax_miss(jax_miss, args, kwargs)
            except _random.UsesGeneratorState:
                if _random.in_pure_trace():
                    raise
            else:
                _learn_fastpath_arity(result)
                return result
        return (self._call_stateful(args, kwargs),) + _no_fastpath()

    def lower(self, *args, **kwargs):
        if self._stateful is None:
            try:
                # JAX's own `lower` (the C++ function's attribute is this method)
                options = self._options_for_call(args, kwargs)
                jitted = (self._pure if options is self._compiler_options
                          else self._other_jit(options)[0])
                return type(jitted).lower(jitted, *args, **kwargs)
            except _random.UsesGeneratorState:
                pass
        return self._stateful_for(args, kwargs).lower(_random.get_rng_state(), *args, **kwargs)

    # -- the staged path (under functx transforms) --------------------------

    def _split(self, args, kwargs):
        """(dynamic arguments, static key, rebuild) where rebuild(dynamic)
        gives back (args, kwargs)."""
        nums, names = self._static_argnums, self._static_argnames
        nums = {i % len(args) for i in nums if -len(args) <= i < len(args)}
        static = tuple((i, args[i]) for i in sorted(nums)) + tuple(
            sorted((k, v) for k, v in kwargs.items() if k in names))
        dyn = ([a for i, a in enumerate(args) if i not in nums],
               {k: v for k, v in kwargs.items() if k not in names})
        try:
            hash(static)
        except TypeError:
            raise self.unhashable_static(args, kwargs) from None

        def rebuild(d):
            d_args, d_kwargs = d
            it = iter(d_args)
            fixed = dict(static)
            out = [fixed[i] if i in nums else next(it) for i in range(len(args))]
            d_kwargs.update((k, v) for k, v in static if isinstance(k, str))
            return out, d_kwargs

        return dyn, static, rebuild

    def unhashable_static(self, args, kwargs):
        """The error for this call's first unhashable static argument, or
        None when every static argument hashes."""
        n = len(args)
        nums = sorted({i % n for i in self._static_argnums if -n <= i < n})
        named = [(f"argument {i}", args[i]) for i in nums] + [
            (f"argument {k!r}", v) for k, v in sorted(kwargs.items()) if k in self._static_argnames]
        for what, v in named:
            try:
                hash(v)
            except TypeError:
                return _unhashable_error(self._name, what, v)
        return None

    def _call_staged(self, args, kwargs):
        dyn, static, rebuild = self._split(args, kwargs)
        leaves, in_tree = tree_util.tree_flatten(dyn)
        leaves = [as_array(x, f"jit({self._name})", "an argument") for x in leaves]
        # the live named vmaps' sizes: functx.lax.axis_size is a Python int
        # in the graph (NOTE [named axes])
        # and JAX's options: what `f` traces reads them, as jax.jit keys on
        # them (NOTE [JAX options off the calling thread] in caches.py)
        key = (in_tree, static, tuple(aval_of(x) for x in leaves), live_axes(), options_id())
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs.put(key, self._stage(leaves, in_tree, rebuild))
        if entry is _Inline:
            return self._fun(*args, **kwargs)
        graph, out_tree = entry
        outs = bind(jit_call, *leaves, graph=graph, name=call_name(self._name))
        return tree_util.tree_unflatten(out_tree, outs)

    def _stage(self, leaves, in_tree, rebuild):
        out_tree = []

        def flat_fun(*flat):
            flat = list(flat)
            if self._in_shardings is not UNSPECIFIED:  # NOTE [shardings of functx.jit]
                dyn_args, _ = tree_util.tree_unflatten(in_tree, flat)
                per_leaf = _sharding_per_leaf(self._in_shardings, tuple(dyn_args), self._name,
                                              "in_shardings")
                flat[:len(per_leaf)] = [_constrain(x, sh) for x, sh in zip(flat, per_leaf)]
            a, kw = rebuild(tree_util.tree_unflatten(in_tree, flat))
            out = self._fun(*a, **kw)
            out_leaves, tree = tree_util.tree_flatten(out)
            if self._out_shardings is not UNSPECIFIED:
                per_leaf = _sharding_per_leaf(self._out_shardings, out, self._name,
                                              "out_shardings")
                out_leaves = [_constrain(x, sh) for x, sh in zip(out_leaves, per_leaf)]
            out_tree.append(tree)
            return [as_array(x, f"jit({self._name})", "an output") for x in out_leaves]

        state = _random.peek_state()
        graph, captured = stage(flat_fun, [aval_of(x) for x in leaves], f"jit({self._name})")
        if _random.peek_state() is not state:
            _random.set_rng_state(state)  # the inline run draws the same numbers
            return _Inline
        if captured:
            return _Inline
        return graph, out_tree[0]



def _miss_keeping(jitted, fun, jax_miss, args, kwargs):
    """A wrapper's cache-miss handler: its Jitted's, with the wrapper's
    function kept alive (NOTE [one jit per function])."""
    return jitted._miss(jax_miss, args, kwargs)


def _lower_keeping(jitted, fun, *args, **kwargs):
    """A wrapper's `lower`: its Jitted's, with the wrapper's function kept
    alive (`jit(f).lower(x)` drops the wrapper before lowering)."""
    return jitted.lower(*args, **kwargs)


class _Wrapper:
    """What `jit` returns where JAX's C++ jitted function cannot be built
    (NOTE [no Python in front of a cached call]): holds the function and
    its shared Jitted, and calls the Jitted's Python path."""

    def __init__(self, jitted, fun):
        functools.update_wrapper(self, fun, updated=())
        self.functx_jitted = jitted
        self.lower = functools.partial(_lower_keeping, jitted, fun)

    def __call__(self, *args, **kwargs):
        return self.functx_jitted(*args, **kwargs)


def _check_compiler_options(options, fun):
    if options is None:
        return None
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise FunctxTypeError(
            f"jit({fn_name(fun)}, compiler_options=...): compiler_options must be None or a "
            f"dict from XLA option names (str) to values, got {type(options).__name__}. "
            'Example: {"xla_cpu_enable_fast_math": False}.'
        )
    return dict(options)


def jit(func, static_argnums=(), static_argnames=(), donate_argnums=(), compiler_options=None,
        in_shardings=UNSPECIFIED, out_shardings=UNSPECIFIED):
    """Compile `func` with XLA (jax.jit), whatever functx transforms it uses
    inside, and whichever it is used under.

    The compiled program is cached per shapes, dtypes and values of the
    static arguments: a second call with the same ones does not run `func`
    again. `static_argnums` / `static_argnames` name arguments that are
    Python values (hashable; a new value compiles a new program);
    `donate_argnums` lets XLA reuse the buffers of those arguments for the
    results. Draws from functx's stateful generator inside `func` advance the
    generator on every call, as they would without jit. `compiler_options`
    (a dict of XLA options, as for jax.jit) is passed to XLA when `func` is
    compiled on its own; under an outer transform or jit the graph becomes
    part of the outer program, compiled with that program's options.

    The cache belongs to `func`, not to what `jit` returns: every
    `functx.jit(func, **same options)` shares it, so a `jit` made anew in a
    loop or inside a transformed function (`grad(lambda v: jit(f)(v))`)
    traces, stages and compiles once, as `jax.jit` does. It is keyed on
    `func` by identity (a lambda or closure made again is a new key, even
    with the same code; a function whose globals or closure cells change
    keeps what its first trace saw, as with jax.jit; a `functools.partial`
    is keyed on its function and bound values, a bound method on its
    function and object), on the options, and within that on the
    arguments' pytree structure, shapes, dtypes and static values. It holds
    `func` weakly (dropping the function frees its programs) and is bounded:
    an LRU of `CACHE_SIZE` functions (256) and `SIGNATURE_CACHE_SIZE`
    staged signatures each (64), in `functx/transforms/jit.py`, whose
    `clear_cache()` empties it and `cache_info()` reports it (NOTE [one jit
    per function] there).

    `in_shardings` / `out_shardings` (a `jax.sharding.Sharding`, a
    `PartitionSpec` under `jax.set_mesh`, or a pytree prefix of the
    positional arguments / of the outputs with those leaves) mean what
    they mean for jax.jit: the compiled program takes and returns values
    laid out so, and XLA partitions it over the devices. Under a functx
    transform they become sharding constraints on the inputs and outputs
    of the staged graph (NOTE [shardings of functx.jit]).

    Example:
      >>> step = functx.jit(functx.grad(loss), in_shardings=(replicated, by_batch))
    """
    check_callable(func, "jit")
    return _jitted_for(func, static_argnums, static_argnames, donate_argnums,
                       compiler_options, (in_shardings, out_shardings)).wrapper(func)


# NOTE [shardings of functx.jit]
# `functx.jit(f, in_shardings=, out_shardings=)` called on JAX values is a
# jax.jit with those options (the pure and the stateful programs; the
# generator state threaded through the latter is replicated). Called under
# a functx transform, `f` is staged into a graph: there the shardings are
# `jax.lax.with_sharding_constraint`s on the graph's inputs and outputs
# (translated to functx's twin of JAX's sharding_constraint primitive, with
# JAX's rules: NOTE [foreign primitives]), which every transform of the
# graph keeps (the transpose of a constraint is the same constraint on the
# cotangent; under vmap the batch dimension is left unconstrained, or put
# on the mesh axes of vmap(spmd_axis_name=): NOTE [spmd axes]), and which
# the outermost program hands to XLA's partitioner.


def _is_sharding_leaf(x):
    from jax.sharding import PartitionSpec, Sharding

    return x is None or isinstance(x, (Sharding, PartitionSpec))


def _sharding_per_leaf(shardings, tree, name, what):
    """One sharding (or None) per leaf of `tree`, from a pytree prefix."""
    if _is_sharding_leaf(shardings):
        return [shardings] * len(tree_util.tree_leaves(tree))
    per_leaf = []
    try:
        tree_util.tree_map(
            lambda sh, sub: per_leaf.extend([sh] * len(tree_util.tree_leaves(sub))),
            shardings, tree, is_leaf=_is_sharding_leaf)
    except (ValueError, TypeError) as e:
        raise FunctxValueError(
            f"jit({name}, {what}=...): {what} is not a pytree prefix of the "
            f"{'positional arguments' if what == 'in_shardings' else 'outputs'} "
            f"({tree_util.tree_structure(tree)}). Give one sharding, or a prefix with a "
            "sharding (or None) per part."
        ) from e
    return per_leaf


def _constrain(x, sharding):
    if sharding is None:
        return x
    return jax.lax.with_sharding_constraint(x, sharding)


def _checking_static_arguments(fn, jitted):
    """`fn` behind a Python function that turns JAX's error for an
    unhashable static argument (raised by its C++ dispatch, before any
    functx code runs) into a FunctxValueError naming the argument. Only
    functions with static arguments get it; it costs one Python call."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            if isinstance(e, FunctxValueError):
                raise
            error = jitted.unhashable_static(args, kwargs)
            if error is None:
                raise
            raise error from None

    for attr in ("lower", "trace", "eval_shape", "clear_cache"):
        if hasattr(fn, attr):
            setattr(call, attr, getattr(fn, attr))
    call.functx_jitted = jitted
    return call


def make_graph(func, static_argnums=()):
    """`make_graph(f)(*args)` returns the staged functx program of `f` on
    arguments like `args`: a Graph whose printout has one line per
    primitive with the shapes and dtypes it defines. Any composition of
    transforms can be staged, e.g. `make_graph(vmap(grad(f)))(xs)`.
    Arguments in `static_argnums` are fixed Python values, not inputs."""
    check_callable(func, "make_graph")
    nums = _as_tuple(static_argnums, "static_argnums", int, fn_name(func))

    def staged(*args, **kwargs):
        n = len(args)
        static = {i % n for i in nums}
        dyn = [a for i, a in enumerate(args) if i not in static]
        leaves, in_tree = tree_util.tree_flatten((dyn, kwargs))
        leaves = [as_array(x, f"make_graph({fn_name(func)})", "an argument") for x in leaves]

        def flat_fun(*flat):
            d, kw = tree_util.tree_unflatten(in_tree, list(flat))
            it = iter(d)
            full = [args[i] if i in static else next(it) for i in range(n)]
            out = tree_util.tree_leaves(func(*full, **kw))
            return [as_array(x, f"make_graph({fn_name(func)})", "an output") for x in out]

        graph, _ = stage(flat_fun, [aval_of(x) for x in leaves], "make_graph")
        return graph

    return staged


def _register_cache():
    caches.register("jit programs", clear_cache, cache_info)  # NOTE [bounded caches]


_register_cache()
