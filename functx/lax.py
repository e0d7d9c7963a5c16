"""functx.lax: jax.lax on functx values.

Every public function of `jax.lax` is here with the same arguments and
results, run through `functx.lift` when it meets functx values (NOTE
[lifting] in functx/lifting.py).

Structured control flow is functx-native: `cond`, `switch`, `scan`,
`while_loop`, `fori_loop` and `map` stage their Python callables into functx
graphs and bind the primitives `cond`, `scan` and `while`
(functx/primitives/control.py), so they work under every functx transform,
eagerly, under `functx.jit` and under an outer `jax.jit`, and may close over
values of enclosing transforms. Reverse mode (grad, vjp, jacrev) works
through `cond`, `switch`, `scan`, `map` and `fori_loop` with static (Python
int or concrete) bounds, which becomes a `scan`; `while_loop`, and
`fori_loop` with traced bounds, support forward mode (jvp, jacfwd,
linearize) and vmap, and raise a clear error under reverse mode. JAX code
that uses `jax.lax.cond / scan / while_loop` transforms too, through
`functx.lift`.

Bodies are staged once and compiled once. A callable is staged once per
argument structure, shapes and dtypes, and looked up by its code and what
it reads (closure, defaults, the globals it names) rather than by the
function object: a lambda written inline, a new object on every call that
closes over that call's values (tracers of grad / vmap, arrays), finds the
graph staged on the first call, with the transformed graphs and compiled
loops derived from it. The arrays it closes over are inputs of that graph,
never baked into it, so new values give new results; a Python number or
other static value it closes over is part of the key, so a new one stages
again (NOTE [staged bodies: one graph per code and closure]). The body's
Python therefore runs only when it is staged, not on every call: keep side
effects out of it (as in code under jax.jit). Draws from functx's stateful generator
inside a body are made when it is staged, and such a body is staged on
every call: use explicit keys (functx.random with a key argument) for
fresh numbers per iteration.
"""

import builtins as _builtins
import threading as _threading
from collections import OrderedDict as _OrderedDict

import jax as _jax
import jax.lax as _jlax
import numpy as _np
from jax import tree_util as _tree

from .numpy import populate as _populate

__all__ = [n for n in _populate(globals(), _jlax, "jax.lax") if not n.endswith("_p")]
for _n in [n for n in globals() if n.endswith("_p") and not n.startswith("_")]:
    del globals()[_n]
del _n

# --------------------------------------------------------------------------
# Reductions with a computation: a functx function (functx.lax.max, ...)
# stands for the JAX function it wraps, so JAX recognises lax.add / max /
# min / mul / ... with their identity as the monoid reductions, which
# differentiate in reverse mode (NOTE [pooling recognised from its
# computation] in functx/primitives/windows.py).


def _as_jax_computation(computation):
    wrapped = getattr(computation, "__wrapped__", None)
    if wrapped is not None and getattr(computation, "__module__", "").startswith("functx"):
        return wrapped
    return computation


_lifted_reduce = reduce  # noqa: F821 - defined by _populate
_lifted_reduce_window = reduce_window  # noqa: F821 - defined by _populate


def reduce(operands, init_values, computation, dimensions, out_sharding=None):
    """functx version of `jax.lax.reduce`: the same arguments and results, and it
    accepts functx values. A functx computation (`functx.lax.add`, `functx.lax.max`,
    ...) counts as the JAX function it wraps, so with its identity as initial
    value this is reduce_sum / reduce_max / ...; any other computation (several
    operands reduced together, e.g. a value and its index) is differentiable in
    every mode and batches (NOTE [generic reduce] in functx/primitives/reductions.py).

    Example:
      >>> functx.grad(lambda x: functx.lax.reduce(x, 1.0, lambda a, b: a * b, (0,)))(x)
    """
    kwargs = {} if out_sharding is None else {"out_sharding": out_sharding}
    return _lifted_reduce(operands, init_values, _as_jax_computation(computation),
                          dimensions, **kwargs)


def reduce_window(operand, init_value, computation, window_dimensions, window_strides=None,
                  padding="VALID", base_dilation=None, window_dilation=None):
    """functx version of `jax.lax.reduce_window`: the same arguments and results,
    and it accepts functx values. With add / max / min as the computation
    (`functx.lax.add`, `jax.lax.max`, `jnp.minimum`, ...) and a constant initial
    value equal to its identity (0, -inf, inf) it is sum / max / min pooling,
    differentiable in every mode (NOTE [pooling recognised from its
    computation] in functx/primitives/windows.py); another computation supports
    forward mode and vmap.

    Example:
      >>> functx.grad(lambda x: functx.lax.reduce_window(
      ...     x, -jnp.inf, functx.lax.max, (2,), (1,), "VALID").sum())(x)
    """
    return _lifted_reduce_window(operand, init_value, _as_jax_computation(computation),
                                 window_dimensions, window_strides, padding, base_dilation,
                                 window_dilation)


from . import caches as _caches  # noqa: E402
from . import random as _random  # noqa: E402
from .core import Tracer as _Tracer  # noqa: E402
from .core import aval_of as _aval_of  # noqa: E402
from .core import bind as _bind  # noqa: E402
from .errors import FunctxTypeError as _TypeError  # noqa: E402
from .errors import FunctxValueError as _ValueError  # noqa: E402
from .interpreters.staging import Graph as _Graph  # noqa: E402
from .interpreters.staging import Var as _Var  # noqa: E402
from .interpreters.staging import stage as _stage  # noqa: E402
from .snapshot import _Ident, _snapshot  # noqa: E402
from .primitives import control as _control  # noqa: E402
from .primitives import elementwise as _ew  # noqa: E402
from .primitives.common import scalar_like as _scalar_like  # noqa: E402

_JaxTracer = _jax.core.Tracer
_NO_OPERAND = object()


# --------------------------------------------------------------------------
# Staging callables
#
# NOTE [staged bodies: one graph per code and closure] is in
# functx/snapshot.py: a body is looked up by its code and a snapshot of
# what it reads, and staged with staged inputs in place of its arrays.
#
# Caches: `_STAGED` (staged graphs) holds at most `_STAGED_LIMIT` entries,
# least recently used first out; an entry whose key names an object that
# dies (a function object, an identity-keyed global) is dropped at once.
# Entries hold graphs, never user functions (a key keeps a pytree's structure:
# its static data, e.g. an Equinox module's class and static fields, stays
# alive until the entry is evicted). Derived graphs live on their
# graph (graph.cache), and so do the compiled loop programs, at most
# `PROGRAMS_LIMIT` of them in all (NOTE [compiled loops] in
# functx/primitives/control.py): they go with the graph. `jax.lax` loops
# called on functx values are cached by the structure of the jaxpr JAX
# traced (NOTE [lifted bodies by structure], same file).

_STAGED_LIMIT = 128  # staged body graphs kept (LRU)

_MISSING = object()
_PLAIN = object()  # a negative entry: stage the body of this key as written


class _StagedCache:
    """The bounded LRU of staged bodies: key -> `(graph, out_tree)` or
    `_PLAIN` (NOTE [staged bodies: one graph per code and closure]).
    Mutated only under `lock` (NOTE [caches shared between threads] in
    caches.py)."""

    def __init__(self, limit):
        self.limit = limit
        self.entries = _OrderedDict()
        self.idents = {}  # key -> its armed _Idents (to find dead keys)
        self.lock = _threading.Lock()
        self.died = False  # an armed _Ident's object died since the last purge

    def get(self, key):
        hit = self.entries.get(key, _MISSING)
        if hit is not _MISSING:
            with self.lock:
                try:
                    self.entries.move_to_end(key)
                except KeyError:  # dropped meanwhile by another thread
                    pass
        return hit

    def put(self, key, value, idents):
        for i in idents:
            i.arm(self.drop_dead)
        with self.lock:
            self.entries[key] = value
            self.entries.move_to_end(key)
            if idents:
                self.idents[key] = idents
            while len(self.entries) > self.limit:
                old, _ = self.entries.popitem(last=False)
                self.idents.pop(old, None)
            self._purge()

    def drop_dead(self, _ref=None):
        """An armed _Ident's object died (a weak reference's callback, so
        it may run inside a garbage collection on a thread that holds
        `lock`, in the middle of an operation on `entries`): purge now if
        the lock is free, else at the next insertion."""
        self.died = True
        try:
            _caches.run_if_free(self.lock, self._purge)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown (module globals cleared)
            pass

    def _purge(self):  # under `lock`
        if not self.died:
            return
        self.died = False
        for k, ids in list(self.idents.items()):
            if any(i.get() is None for i in ids):
                self.entries.pop(k, None)
                self.idents.pop(k, None)

    def __len__(self):
        return len(self.entries)

    def clear(self):
        with self.lock:
            self.entries.clear()
            self.idents.clear()


_STAGED = _StagedCache(_STAGED_LIMIT)


def _staged_cache_info():
    """How many staged bodies are cached, and the bound."""
    return {"entries": len(_STAGED), "limit": _STAGED.limit}


def _call(fn, *args):
    return fn(*args)


def _leaf(x, what):
    """An operand leaf as a value a primitive accepts."""
    if isinstance(x, (_Tracer, _jax.Array, _JaxTracer, _np.ndarray)):
        return x
    if isinstance(x, _np.generic):
        return _np.asarray(x)
    if isinstance(x, (bool, int, float, complex)):
        return x
    raise _TypeError(
        f"{what}: a {type(x).__name__} was found where an array was expected. Pass "
        "arrays (JAX or NumPy arrays, Python numbers) or pytrees of them; keep other "
        "values in the function's closure."
    )


def _stage_flat(fn, call, args_tree, avals, what):
    """Stage `call(fn(extra), *tree_unflatten(args_tree, inputs))`, where
    `fn(extra)` gives the callable with the inputs after `len(avals)`."""
    out_tree = []
    n = len(avals)

    def flat(*leaves):
        body = fn(leaves[n:])
        out = call(body, *_tree.tree_unflatten(args_tree, list(leaves[:n])))
        out_leaves, tree = _tree.tree_flatten(out)
        out_tree.append(tree)
        return [_leaf(x, what) for x in out_leaves]

    return flat, out_tree


def _stage_fn(fn, args_tree, avals, what, call=_call, kind=""):
    """Stage `call(fn, *tree_unflatten(args_tree, inputs))` into a Graph with
    one input per aval, then one per value of `captured`. Returns `(graph,
    captured, out_tree)`: `captured` are the arrays the function closes over
    (NOTE [staged bodies: one graph per code and closure]) and the values of
    enclosing transforms it reaches otherwise. The same code reading equal
    values (arrays of the same shapes and dtypes) finds the same graph."""
    # JAX's tracing options in force are baked into the graph (a
    # `jax.default_matmul_precision` context into its products), as in
    # jax.jit's keys
    base = (kind, call, args_tree, tuple(avals), _caches.options_id())
    snap = _snapshot(fn)
    if snap is not None:
        key = base + (snap.key,)
        hit = _STAGED.get(key)
        if hit is not _MISSING and hit is not _PLAIN:
            return hit[0], [a for a, used in zip(snap.arrays, hit[2]) if used], hit[1]
        if hit is not _PLAIN:
            dyn_avals = [_aval_of(a) for a in snap.arrays]
            flat, out_tree = _stage_flat(snap.rebuild, call, args_tree, avals, what)
            state = _random.peek_state()
            try:
                graph, captured = _stage(flat, list(avals) + dyn_avals, what)
            except Exception:  # noqa: BLE001 - retried as written below
                # Python control flow on a closed-over array, NumPy on it,
                # ...: stage it as written (which raises the user's error
                # if it is one), and do not try again for this key.
                _STAGED.put(key, _PLAIN, snap.idents)
            else:
                graph, used = _drop_unread(graph, len(avals), len(dyn_avals))
                if not captured and _random.peek_state() is state:
                    _STAGED.put(key, (graph, out_tree[0], used), snap.idents)
                arrays = [a for a, u in zip(snap.arrays, used) if u]
                return graph, arrays + captured, out_tree[0]
    # Staged as written, cached per function object while nothing is captured.
    try:
        ident = _Ident(fn)
    except TypeError:
        ident = None
    key = None
    if ident is not None and ident.ref is not None:
        key = base + ("plain", ident)
        hit = _STAGED.get(key)
        if hit is not _MISSING and hit is not _PLAIN:
            return hit[0], [], hit[1]
    flat, out_tree = _stage_flat(lambda _: fn, call, args_tree, avals, what)
    state = _random.peek_state()
    graph, captured = _stage(flat, list(avals), what)
    if key is not None and not captured and _random.peek_state() is state:
        _STAGED.put(key, (graph, out_tree[0]), [ident])
    return graph, captured, out_tree[0]


def _drop_unread(graph, n_args, n_arrays):
    """`graph` without its inputs `n_args .. n_args + n_arrays` (the arrays
    of the body's snapshot) that it does not read, and which of those it
    keeps: a dict of parameters closed over passes only the ones the body
    uses, so the loop's constants are what it reads, as when it is staged
    as written."""
    read = {x for eqn in graph.eqns for x in eqn.inputs if type(x) is _Var}
    read.update(x for x in graph.outputs if type(x) is _Var)
    used = tuple(v in read for v in graph.inputs[n_args:n_args + n_arrays])
    if all(used):
        return graph, used
    inputs = graph.inputs[:n_args] + [v for v, u in zip(graph.inputs[n_args:], used) if u] \
        + graph.inputs[n_args + n_arrays:]
    return _Graph(inputs, graph.eqns, graph.outputs), used


def _consts_first(graph, n):
    """`graph` with its inputs after the first `n` (the captured values)
    moved to the front, where the primitives keep their constants (made
    once per graph, so that what is derived from it is cached)."""
    if len(graph.inputs) == n:
        return graph
    key = ("consts-first", n)
    hit = graph.cache.get(key)
    if hit is None:
        hit = graph.cache[key] = _Graph(graph.inputs[n:] + graph.inputs[:n], graph.eqns,
                                        graph.outputs)
    return hit


def _check_callable(fn, what, name):
    if not callable(fn):
        raise _TypeError(f"{what}: `{name}` must be callable, got {type(fn).__name__}.")


def _to_dtype(x, dtype):
    if isinstance(x, (_Tracer, _JaxTracer)):
        return _ew.convert_element_type(x, dtype)
    return _np.asarray(x, dtype)


def _describe(avals):
    return ", ".join(a.str_short() for a in avals)


def _match_carry(what, init, carry_avals, out_tree, init_tree, out_avals, role):
    """Check that a loop body returns its carry's structure, shapes and
    dtypes. A weakly typed initial value (a Python number) whose dtype
    differs is converted to the body's dtype, as JAX does: returns the
    possibly converted leaves and whether any changed."""
    if out_tree != init_tree:
        raise _TypeError(
            f"{what}: {role} must return a carry with the structure of the initial "
            f"value, {init_tree}, but returned {out_tree}. Return the same containers "
            "and leaves on every iteration."
        )
    changed = False
    new = list(init)
    for i, (a, o) in enumerate(zip(carry_avals, out_avals)):
        if a.shape == o.shape and a.dtype == o.dtype:
            continue
        if a.shape == o.shape and a.weak_type and not o.weak_type:
            new[i] = _to_dtype(init[i], o.dtype)
            changed = True
            continue
        raise _TypeError(
            f"{what}: {role} must return a carry of the initial value's shapes and "
            f"dtypes. The initial carry is ({_describe(carry_avals)}) but {role} returned "
            f"({_describe(out_avals)}): leaf {i} differs. Cast the initial value (or the "
            "returned carry) to matching dtypes."
        )
    return new, changed


# --------------------------------------------------------------------------
# cond and switch


def cond(pred, true_fun, false_fun, *operands, operand=_NO_OPERAND):
    """functx version of `jax.lax.cond`: `true_fun(*operands)` if `pred` else
    `false_fun(*operands)`, as one primitive that every functx transform
    differentiates and batches (under vmap with a batched `pred` both
    branches run and each lane takes its own; reverse mode is supported).
    The branches may close over values of enclosing transforms.

    Each branch is staged once per code, closure and operand shapes (NOTE
    [staged bodies: one graph per code and closure]): calling this again
    with a new lambda of the same code, e.g. inside a function that grad
    or vmap calls repeatedly, stages and compiles nothing new, while the
    arrays it closes over are read anew on every call.

    Args:
      pred (bool | int | float | jax.Array): a boolean (or number, compared with
        0) scalar.
      true_fun (Callable): a callable of `*operands` returning a pytree of
        the same structure, shapes and dtypes as `false_fun`'s.
      false_fun (Callable): a callable of `*operands` returning a pytree of
        the same structure, shapes and dtypes as `true_fun`'s.
      *operands (Any): pytrees of arrays passed to the chosen branch.

    Returns:
      Any: The chosen branch's result.

    Example:
      >>> fnp = functx.numpy
      >>> functx.grad(lambda x: functx.lax.cond(x > 0, fnp.sin, fnp.cos, x))(1.0)
    """
    if operand is not _NO_OPERAND:
        if operands:
            raise _TypeError("cond: pass the operands positionally or as `operand=`, not both.")
        operands = (operand,)
    _check_callable(true_fun, "cond", "true_fun")
    _check_callable(false_fun, "cond", "false_fun")
    pred = _leaf(pred, "cond (pred)")
    aval = _aval_of(pred)
    if aval.shape != ():
        raise _TypeError(
            f"cond: pred must be a scalar, got {aval.str_short()}. Reduce it (e.g. "
            ".all() / .any()), or use functx.numpy.where for elementwise choices."
        )
    if aval.dtype != _np.dtype(bool):
        if not _jax.dtypes.issubdtype(aval.dtype, _np.number):
            raise _TypeError(f"cond: pred must be a boolean or a number, got {aval.str_short()}.")
        pred = _bind(_ew.ne_p, pred, _scalar_like(pred, 0))
    index = _ew.convert_element_type(pred, _np.int32)
    return _cond("cond", index, (false_fun, true_fun), operands)


def switch(index, branches, *operands, operand=_NO_OPERAND):
    """functx version of `jax.lax.switch`: `branches[index](*operands)`, the
    index clamped to the valid range. Like `cond`, it works under every
    functx transform, and each branch is staged once per code, closure and
    operand shapes.

    Args:
      index (int | jax.Array): an integer scalar.
      branches (Sequence[Callable]): a sequence of callables of `*operands`
        returning pytrees of the same structure, shapes and dtypes.
      *operands (Any): pytrees of arrays passed to the chosen branch.

    Returns:
      Any: The chosen branch's result.

    Example:
      >>> fnp = functx.numpy
      >>> functx.vmap(lambda i, x: functx.lax.switch(i, [fnp.sin, fnp.cos], x))(
      ...     jnp.array([0, 1]), jnp.ones(2))
    """
    if operand is not _NO_OPERAND:
        if operands:
            raise _TypeError("switch: pass the operands positionally or as `operand=`, not both.")
        operands = (operand,)
    branches = tuple(branches)
    if not branches:
        raise _ValueError("switch: `branches` is empty; pass at least one callable.")
    for i, b in enumerate(branches):
        _check_callable(b, "switch", f"branches[{i}]")
    index = _leaf(index, "switch (index)")
    aval = _aval_of(index)
    if aval.shape != () or not _np.issubdtype(aval.dtype, _np.integer):
        raise _TypeError(f"switch: index must be an integer scalar, got {aval.str_short()}.")
    if len(branches) == 1:
        return branches[0](*operands)
    index = _ew.convert_element_type(index, _np.int32)
    index = _ew.clamp(_np.int32(0), index, _np.int32(len(branches) - 1))
    return _cond("switch", index, branches, operands)


def _cond(what, index, branches, operands):
    leaves, tree = _tree.tree_flatten(operands)
    leaves = [_leaf(x, what) for x in leaves]
    avals = [_aval_of(x) for x in leaves]
    staged = [_stage_fn(b, tree, avals, what) for b in branches]
    out_tree = staged[0][2]
    out_avals = staged[0][0].out_avals
    for k, (graph, _, t) in enumerate(staged):
        if t != out_tree:
            raise _TypeError(
                f"{what}: every branch must return the same structure; branch 0 returns "
                f"{out_tree} but branch {k} returns {t}."
            )
        if any(a.shape != b.shape or a.dtype != b.dtype
               for a, b in zip(out_avals, graph.out_avals)):
            raise _TypeError(
                f"{what}: every branch must return the same shapes and dtypes; branch 0 "
                f"returns ({_describe(out_avals)}) but branch {k} returns "
                f"({_describe(graph.out_avals)}). Cast the outputs to matching dtypes."
            )
    # Operands, then the values any branch closes over (each once).
    captured, position = [], {}
    for _, cap, _ in staged:
        for v in cap:
            if id(v) not in position:
                position[id(v)] = len(captured)
                captured.append(v)
    n = len(leaves)
    graphs = []
    for graph, cap, _ in staged:
        if not captured:
            graphs.append(graph)
            continue
        # The branch's own captured inputs at their positions among all
        # branches' (made once per layout, so that what is derived from
        # the branch graph is cached).
        mine = {id(v): k for k, v in enumerate(cap)}
        layout = tuple(mine.get(id(v), -1) for v in captured)
        key = ("cond-layout", n, layout, tuple(_aval_of(v) for v in captured))
        hit = graph.cache.get(key)
        if hit is None:
            own = graph.inputs[n:]
            extra = [own[k] if k >= 0 else _Var(_aval_of(v)) for k, v in zip(layout, captured)]
            hit = graph.cache[key] = _Graph(graph.inputs[:n] + extra, graph.eqns, graph.outputs)
        graphs.append(hit)
    outs = _bind(_control.cond_p, index, *leaves, *captured, branches=tuple(graphs))
    return _tree.tree_unflatten(out_tree, outs)


# --------------------------------------------------------------------------
# scan, fori_loop and map


def scan(f, init, xs=None, length=None, reverse=False, unroll=1, _split_transpose=False):
    """functx version of `jax.lax.scan`: loop `carry, y = f(carry, x)` over
    the leading axis of `xs`, returning the final carry and the stacked
    `y`s. Every functx transform applies, reverse mode included (the values
    of each iteration that the gradient needs are stacked by the forward
    loop). `f` may close over values of enclosing transforms.

    `f` is staged once per code, closure and argument shapes, and the loop
    (with its derivative and batched forms) compiled once (NOTE [staged
    bodies: one graph per code and closure]): `functx.grad(loss)` of a loss
    that calls `scan(lambda h, x: ..., ...)` stages and compiles on its
    first call only, though the lambda is a new object closing over new
    values each time. The arrays `f` closes over are read anew on every
    call; a new Python number in its closure stages it again.

    Args:
      f (Callable): `(carry, x) -> (carry, y)`; the carry keeps its structure,
        shapes and dtypes (a Python-number initial value takes `f`'s dtype).
      init (Any): the initial carry (a pytree of arrays).
      xs (Any): a pytree of arrays scanned along their leading axis, or None.
      length (int | None): the number of iterations when `xs` is None.
      reverse (bool): iterate from the last slice to the first.
      unroll (int | bool): iterations per loop step of the compiled loop (int or
        bool).

    Returns:
      tuple: `(final carry, stacked ys)`.

    Examples:
      The gradient through a small RNN:

      >>> def loss(w, xs):
      ...     h, _ = functx.lax.scan(lambda h, x: (functx.numpy.tanh(w @ h + x), None),
      ...                            jnp.zeros(3), xs)
      ...     return h.sum()
      >>> functx.grad(loss)(jnp.eye(3), jnp.ones((5, 3)))
    """
    del _split_transpose
    _check_callable(f, "scan", "f")
    return _scan("scan", f, _call, "", init, xs, length, reverse, unroll)


def _scan(what, fn, call, kind, init, xs, length, reverse, unroll):
    init_leaves, init_tree = _tree.tree_flatten(init)
    init_leaves = [_leaf(x, what) for x in init_leaves]
    xs_leaves, xs_tree = _tree.tree_flatten(xs)
    xs_leaves = [_leaf(x, what) for x in xs_leaves]
    x_avals = []
    for x in xs_leaves:
        a = _aval_of(x)
        if a.ndim == 0:
            raise _ValueError(f"{what}: every leaf of xs needs a leading axis to scan "
                              f"over, got a scalar {a.str_short()}.")
        x_avals.append(a.update(shape=a.shape[1:]))
    lengths = sorted({_aval_of(x).shape[0] for x in xs_leaves})
    if length is not None:
        if isinstance(length, (_Tracer, _JaxTracer)):
            raise _TypeError(f"{what}: `length` must be a Python int, not a traced value.")
        length = int(length)
        if lengths and lengths != [length]:
            raise _ValueError(f"{what}: length={length} but the leading axes of xs are "
                              f"{lengths}.")
    elif len(lengths) == 1:
        length = lengths[0]
    elif lengths:
        raise _ValueError(f"{what}: the leaves of xs have different leading axis sizes "
                          f"{lengths}; they must all be the same.")
    else:
        raise _ValueError(f"{what}: with no xs to scan over, pass `length`.")
    if isinstance(unroll, bool):
        unroll = _builtins.max(length, 1) if unroll else 1
    unroll = int(unroll)
    args_tree = _tree.tree_structure((_tree.tree_unflatten(init_tree, init_leaves),
                                      _tree.tree_unflatten(xs_tree, xs_leaves)))
    for _ in range(2):
        carry_avals = [_aval_of(x) for x in init_leaves]
        graph, captured, out_tree = _stage_fn(fn, args_tree, carry_avals + x_avals, what,
                                              call, kind)
        if out_tree.node_data() is None or out_tree.node_data()[0] not in (tuple, list) \
                or len(_tree.treedef_children(out_tree)) != 2:
            raise _TypeError(f"{what}: the body must return a pair (carry, y), got "
                             f"{out_tree}.")
        carry_tree, y_tree = _tree.treedef_children(out_tree)
        n = len(init_leaves)
        init_leaves, changed = _match_carry(what, init_leaves, carry_avals, carry_tree,
                                            init_tree, graph.out_avals[:n], "the body")
        if not changed:
            break
    outs = _bind(_control.scan_p, *captured, *init_leaves, *xs_leaves,
                 body=_consts_first(graph, n + len(xs_leaves)), length=length,
                 reverse=bool(reverse), unroll=unroll, num_consts=len(captured), num_carry=n)
    return (_tree.tree_unflatten(init_tree, outs[:n]),
            _tree.tree_unflatten(y_tree, outs[n:]))


def _fori_scan_body(fn, carry, _):
    i, x = carry
    return (i + 1, fn(i, x)), None


def _fori_cond(carry):
    return carry[0] < carry[1]


def _fori_while_body(fn, carry):
    i, upper, x = carry
    return i + 1, upper, fn(i, x)


def _static_int(x):
    if isinstance(x, (_Tracer, _JaxTracer)):
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def fori_loop(lower, upper, body_fun, init_val, *, unroll=None):
    """functx version of `jax.lax.fori_loop`: `val = body_fun(i, val)` for i
    in range(lower, upper). With static bounds (Python ints or concrete
    arrays) it is a `scan`, so reverse mode works; with traced bounds it is
    a `while_loop` (forward mode and vmap only). `body_fun` is staged once
    per code, closure and value shapes, as for `scan`.

    Args:
      lower (int | jax.Array): the integer lower bound (inclusive).
      upper (int | jax.Array): the integer upper bound (exclusive).
      body_fun (Callable): `(i, val) -> val`, keeping `val`'s structure, shapes
        and dtypes.
      init_val (Any): the initial value (a pytree of arrays).
      unroll (int | bool | None): as for `scan`; static bounds only.

    Returns:
      Any: The final value.

    Example:
      >>> functx.grad(lambda x: functx.lax.fori_loop(0, 3, lambda i, v: v * x, 1.0))(2.0)
    """
    _check_callable(body_fun, "fori_loop", "body_fun")
    lo, hi = _static_int(lower), _static_int(upper)
    if lo is not None and hi is not None:
        (_, result), _ = _scan("fori_loop", body_fun, _fori_scan_body, "fori", (lo, init_val),
                               None, _builtins.max(hi - lo, 0), False, 1 if unroll is None else unroll)
        return result
    if unroll not in (None, False, 1):
        raise _ValueError("fori_loop: `unroll` needs static bounds (Python ints), but a bound "
                          "is a traced value.")
    lower, upper = _leaf(lower, "fori_loop"), _leaf(upper, "fori_loop")
    la, ua = _aval_of(lower), _aval_of(upper)
    if la.dtype != ua.dtype:
        if la.weak_type and not ua.weak_type:
            lower = _to_dtype(lower, ua.dtype)
        elif ua.weak_type and not la.weak_type:
            upper = _to_dtype(upper, la.dtype)
        else:
            raise _TypeError(f"fori_loop: lower and upper must have the same dtype, got "
                             f"{la.str_short()} and {ua.str_short()}.")
    _, _, result = _while("fori_loop", _fori_cond, _call, body_fun, _fori_while_body,
                          "fori", (lower, upper, init_val))
    return result


def _map_body(fn, carry, x):
    return (), fn(x)


def _map_batched_body(fn, carry, x):
    from .transforms import vmap

    return (), vmap(fn)(x)


def map(f, xs, *, batch_size=None):
    """functx version of `jax.lax.map`: `f` applied to each slice of `xs`
    along its leading axis, as a `scan` (so every functx transform applies).
    With `batch_size`, slices are processed `batch_size` at a time with
    `functx.vmap` inside the scan, and the remainder by one more vmap. `f`
    is staged once per code, closure and slice shapes, as for `scan`.

    Args:
      f (Callable): a function of one slice (a pytree) of `xs`.
      xs (Any): a pytree of arrays with a common leading axis.
      batch_size (int | None): slices per step (0: all at once, a plain vmap).

    Returns:
      Any: The stacked results of `f`.

    Example:
      >>> functx.lax.map(lambda x: x ** 2, jnp.arange(4.0), batch_size=3)
    """
    _check_callable(f, "map", "f")
    if batch_size is None:
        return _scan("map", f, _map_body, "map", (), xs, None, False, 1)[1]
    from . import numpy as fnp
    from .transforms import vmap

    leaves, tree = _tree.tree_flatten(xs)
    if not leaves:
        raise _ValueError("map: xs holds no arrays to map over.")
    n = _aval_of(leaves[0]).shape[0]
    batch_size = int(batch_size)
    num, rest = (0, n) if batch_size == 0 else divmod(n, batch_size)
    done = num * batch_size
    ys = None
    if num:
        chunks = [x[:done].reshape((num, batch_size) + tuple(_aval_of(x).shape[1:]))
                  for x in leaves]
        ys = _scan("map", f, _map_batched_body, "map-batched", (),
                   _tree.tree_unflatten(tree, chunks), None, False, 1)[1]
        ys = _tree.tree_map(lambda y: y.reshape((done,) + tuple(_aval_of(y).shape[2:])), ys)
    if rest:
        tail = vmap(f)(_tree.tree_unflatten(tree, [x[done:] for x in leaves]))
        ys = tail if ys is None else _tree.tree_map(
            lambda a, b: fnp.concatenate([a, b], axis=0), ys, tail)
    return ys


# --------------------------------------------------------------------------
# while_loop


def while_loop(cond_fun, body_fun, init_val):
    """functx version of `jax.lax.while_loop`: `val = body_fun(val)` while
    `cond_fun(val)`. Forward mode (jvp, jacfwd, linearize) and vmap apply
    (under vmap with a batched condition the loop runs until every lane is
    done, finished lanes unchanged); reverse mode raises an error that
    suggests `scan` or `fori_loop` with static bounds. `cond_fun` and
    `body_fun` are staged once per code, closure and value shapes, and the
    loop compiled once, as for `scan`.

    Args:
      cond_fun (Callable): `val -> boolean scalar`.
      body_fun (Callable): `val -> val`, keeping `val`'s structure, shapes and
        dtypes.
      init_val (Any): the initial value (a pytree of arrays).

    Returns:
      Any: The value for which `cond_fun` first returned False.

    Example:
      >>> functx.jvp(lambda x: functx.lax.while_loop(lambda v: v < 10, lambda v: v * x, 1.0),
      ...            (3.0,), (1.0,))
    """
    _check_callable(cond_fun, "while_loop", "cond_fun")
    _check_callable(body_fun, "while_loop", "body_fun")
    return _while("while_loop", cond_fun, _call, body_fun, _call, "", init_val)


def _while(what, cond_fn, cond_call, body_fn, body_call, kind, init_val):
    leaves, tree = _tree.tree_flatten(init_val)
    leaves = [_leaf(x, what) for x in leaves]
    for _ in range(2):
        avals = [_aval_of(x) for x in leaves]
        args_tree = _tree.tree_structure((_tree.tree_unflatten(tree, leaves),))
        body, b_captured, out_tree = _stage_fn(body_fn, args_tree, avals, what, body_call, kind)
        leaves, changed = _match_carry(what, leaves, avals, out_tree, tree, body.out_avals,
                                       "body_fun")
        if not changed:
            break
    cond_graph, c_captured, c_tree = _stage_fn(cond_fn, args_tree, avals, what, cond_call, kind)
    pred = cond_graph.out_avals
    if c_tree.num_leaves != 1 or pred[0].shape != () or pred[0].dtype != _np.dtype(bool):
        raise _TypeError(
            f"{what}: cond_fun must return a boolean scalar, got "
            f"({_describe(pred)}). Compare with <, ==, ... and reduce with .all() / .any()."
        )
    n = len(leaves)
    outs = _bind(_control.while_p, *c_captured, *b_captured, *leaves,
                 cond_graph=_consts_first(cond_graph, n), body_graph=_consts_first(body, n),
                 cond_nconsts=len(c_captured), body_nconsts=len(b_captured))
    return _tree.tree_unflatten(tree, outs)


def _register_cache():
    from . import caches

    caches.register("staged control-flow bodies", _STAGED.clear, _staged_cache_info)


_register_cache()


# --------------------------------------------------------------------------
# Collectives over named vmap axes: functx primitives (NOTE [named axes] in
# functx/primitives/collectives.py), replacing the lifted jax.lax ones

from .primitives.collectives import (  # noqa: E402
    UnboundAxisNameError,
    all_gather,
    all_to_all,
    axis_index,
    axis_size,
    pmax,
    pmean,
    pmin,
    ppermute,
    psum,
    psum_scatter,
)
