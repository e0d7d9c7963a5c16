"""`jit` and `make_graph`: compiling and printing whole programs.

NOTE [two ways down to XLA]
`functx.jit(f)` called on plain JAX values (no functx transform active) is a
`jax.jit` of `f`: the functx interpreters run once, while JAX traces, and
leave a pure JAX program, which XLA compiles and caches per shapes, dtypes
and static arguments. Calls that hit the cache take jax.jit's C++ path.

Called on values of an enclosing functx transform (`grad(jit(f))`,
`vmap(jit(f))`), `f` is staged once per signature into a functx `Graph` and
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
not as expected, `jit` returns a Python `Jitted` wrapper instead, which
costs ~1.5 µs more per call.

`jit` compiles with the options of NOTE [XLA:CPU's matrix-product library]
(functx/xla_cpu.py): `_miss` traces the program first (JAX caches the trace,
and compiles it when the options are the user's) and compiles one whose
options differ through the cache miss of a second C++ jitted function built
with them, whose result the first function caches, so later calls stay in
C++. A program that threads the generator state (which runs Python on every
call) makes the same choice once per signature (`_stateful_for`).
"""

import functools
import inspect
import threading

import jax
import numpy as np
from jax import tree_util

from .. import random as _random
from .. import xla_cpu
from ..core import _state as _stack_state
from ..core import aval_of, bind
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.staging import stage
from ..primitives.call import jit_call
from ._args import as_array, check_callable, fn_name


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


def _cpp_jit(fun, miss, options, with_jax_miss=False):
    """`jax.jit(fun, **options)` whose cache misses go to
    `miss(jax_miss, args, kwargs)`; None where JAX's internals differ. With
    `with_jax_miss`: (that function, JAX's own cache miss of it), or None."""
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


class Jitted:
    """The state behind `functx.jit(f)`: its C++ jitted function (what
    `jit` returns, NOTE [no Python in front of a cached call]), the cache
    miss handler, the staged graphs and the stateful program. Where the C++
    function cannot be built, the Jitted itself is returned and called.
    Either way `.lower(*args)` gives JAX's lowered program (for
    `.compile()`, `.as_text()`, `.cost_analysis()`, ...)."""

    # Internal state lives in slots, so that wrappers of a Jitted (which
    # copy its __dict__, as functools.wraps does) never copy it, and a
    # Jitted wrapping another wrapper never receives theirs.
    __slots__ = ("_fun", "_name", "_static_argnums", "_static_argnames", "_donate", "_pure",
                 "_stateful", "_graphs", "fast", "_compiler_options", "_trace_pure",
                 "_other_jits", "_stateful_programs", "__dict__", "__weakref__")

    def __init__(self, fun, static_argnums=(), static_argnames=(), donate_argnums=(),
                 compiler_options=None):
        check_callable(fun, "jit")
        self._compiler_options = _check_compiler_options(compiler_options, fun)
        self._fun = fun
        self._name = fn_name(fun)
        self._static_argnums, self._static_argnames = _resolve_static(
            fun, static_argnums, static_argnames)
        self._donate = _as_tuple(donate_argnums, "donate_argnums", int, self._name)
        self._stateful = None  # built when a trace draws from the generator
        self._stateful_programs = {}  # signature or options -> stateful jax.jit
        self._graphs = {}
        functools.update_wrapper(self, fun, updated=())

        def trace_pure(*args, **kwargs):
            with _random.assume_no_draws():
                return fun(*args, **kwargs)

        trace_pure.__name__ = trace_pure.__qualname__ = self._name
        self._trace_pure = trace_pure
        self._other_jits = {}  # sorted options -> (C++ function, its JAX cache miss)
        options = self._jit_options(self._compiler_options)
        self._pure = _cpp_jit(trace_pure, self._miss, options)
        self.fast = self._pure is not None
        if self._pure is None:
            self._pure = jax.jit(trace_pure, **options)
        else:
            functools.update_wrapper(self._pure, fun, updated=())
            self._pure.lower = self.lower
            self._pure.functx_jitted = self

    def _jit_options(self, compiler_options):
        return dict(static_argnums=self._static_argnums, static_argnames=self._static_argnames,
                    donate_argnums=self._donate, compiler_options=compiler_options)

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

    def _stateful_jit(self, options=None):
        """The jax.jit of `f` threading the generator state, compiling with
        `options` (a dict that differs from the user's), or with the user's."""
        key = None if options is None else tuple(sorted(options.items()))
        found = self._stateful_programs.get(key)
        if found is None:
            found = self._stateful_programs[key] = jax.jit(
                self._trace_stateful,
                static_argnums=tuple(i + 1 for i in self._static_argnums),
                static_argnames=self._static_argnames,
                donate_argnums=tuple(i + 1 for i in self._donate),
                compiler_options=self._compiler_options if options is None else options,
            )
        if options is None:
            self._stateful = found
        return found

    def _stateful_for(self, args, kwargs):
        """The stateful program for this call, compiling with the options of
        NOTE [XLA:CPU's matrix-product library]; the choice is made once per
        signature (the state threading runs Python on every call anyway)."""
        default = self._stateful_jit()
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
            found = self._stateful_programs[signature] = (
                default if options is self._compiler_options else self._stateful_jit(options))
        return found

    def __call__(self, *args, **kwargs):
        # (the Python wrapper, used only where `_cpp_jit` is unavailable)
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
        key = (in_tree, static, tuple(aval_of(x) for x in leaves))
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._stage(leaves, in_tree, rebuild)
        if entry is _Inline:
            return self._fun(*args, **kwargs)
        graph, out_tree = entry
        outs = bind(jit_call, *leaves, graph=graph, name=self._name)
        return tree_util.tree_unflatten(out_tree, outs)

    def _stage(self, leaves, in_tree, rebuild):
        out_tree = []

        def flat_fun(*flat):
            a, kw = rebuild(tree_util.tree_unflatten(in_tree, list(flat)))
            out_leaves, tree = tree_util.tree_flatten(self._fun(*a, **kw))
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


def jit(func, static_argnums=(), static_argnames=(), donate_argnums=(), compiler_options=None):
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
    """
    jitted = Jitted(func, static_argnums, static_argnames, donate_argnums, compiler_options)
    fn = jitted._pure if jitted.fast else jitted
    if jitted._static_argnums or jitted._static_argnames:
        return _checking_static_arguments(fn, jitted)
    return fn


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
