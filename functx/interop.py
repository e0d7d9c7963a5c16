"""JAX code on functx values: the hooks that let any JAX function run inside
functx transforms, unchanged.

NOTE [JAX on functx values]
A functx tracer is not a JAX value, but JAX code (jax.numpy, jax.nn,
jax.lax, `jax.jit` helpers, optax, Equinox and Flax modules) handles it like
one:

* JAX asks a per-type table for the abstract value of each argument; for a
  functx tracer the answer is the ShapedArray of its Aval, so JAX's argument
  checks, dtype promotion and `jax.jit` tracing accept it.
* Every JAX primitive is bound through `jax.core.Primitive.bind`, wrapped
  here. A bind with a functx value among its operands is *translated*
  (`bind_jax`) into functx primitives, exactly as `functx.lift` translates
  the equations of a staged jaxpr: a primitive functx defines binds its
  functx twin with the same parameters; a call (`jit`, `closed_call`,
  `remat`) replays its jaxpr (the replay of one jaxpr is cached with the
  jaxpr, which JAX itself caches per function and signature); a primitive
  with sub-programs (cond, scan, while, custom_jvp/vjp, linear solves) is
  staged as one JAX equation and translated by the rule of its primitive
  module (`lifting.LIFT_RULES`). Functx's interpreters then see only functx
  primitives, so every transform and functx's semantics (eager Python
  control flow on concrete values, the vmap error naming the line) hold.
* `jax.jit` called outside any JAX trace runs its compiled program without
  binding: there the hook replays the traced jaxpr instead.
* A JAX transform running inside a functx transform (`jax.vmap` of a
  `jax.nn.relu` under `functx.grad`) hands a custom_jvp / custom_vjp call to
  its parent trace with `bind_with_trace`, not `bind`: that is hooked too,
  so the custom rule reaches the functx transforms below.
* A bind without functx values costs one scan of its operands for functx
  tracers before JAX's own bind.
* `jax.device_put` outside any JAX trace places arrays without binding: on
  functx values it binds its primitive instead (NOTE [device_put on functx
  values]).
* A binary operator with a JAX array on the left and a functx value on the
  right (`x @ w`, `y * logp`: data times parameters) defers to the functx
  value's reflected operator, as NumPy's operators do: JAX's operator would
  take the same functx.numpy function the long way (its jitted ufunc, a
  trace-cache miss, the jit hook above), at twice the Python per operation,
  and JAX's `x ** v` asks the exponent for a Python number (a batched one
  has none).

What stays refused: converting a functx value to NumPy (`np.asarray`,
`__array__`), which would silently drop its derivative, and functx's
autograd tensors (functx.autograd.Tensor), which record operations only
through functx.numpy / lift. `functx.lift(fn)` remains the explicit path
that stages `fn` once per signature and replays it.
"""

import weakref

import jax
import jax.extend.core
from jax._src import core as jcore

from .core import (
    FROM_JAX, TRACER_TYPES, ImperativeValue, Tracer, bind, check_usable, jax_misuse_error,
)
from .errors import ConcretizationError, equinox_batch_error
from .lifting import _AS_CALL, _INLINE_PARAM, LIFT_RULES, Macro, Program

# --------------------------------------------------------------------------
# Translation of one JAX bind

_PROGRAMS = {}  # id(jaxpr) -> (jaxpr, Program): replays of call jaxprs
_PROGRAMS_LIMIT = 512


def _program(closed):
    entry = _PROGRAMS.get(id(closed))
    if entry is None or entry[0] is not closed:
        if not isinstance(closed, jax.extend.core.ClosedJaxpr):
            closed = jax.extend.core.ClosedJaxpr(closed, [])
        entry = (closed, Program(closed))
        if len(_PROGRAMS) >= _PROGRAMS_LIMIT:
            _PROGRAMS.clear()
        _PROGRAMS[id(entry[0])] = entry
    return entry[1]


def bind_jax(prim, args, params):
    """`prim.bind(*args, **params)` for a JAX primitive with functx values
    among `args`, as functx primitives (NOTE [JAX on functx values])."""
    name = prim.name
    fx = FROM_JAX.get(prim)
    if fx is not None and name not in LIFT_RULES:
        return bind(fx, *args, **params)
    if name in _INLINE_PARAM and name not in LIFT_RULES:
        sub = params.get(_INLINE_PARAM[name], params.get("call_jaxpr"))  # (jax 0.12's composite)
        if name in _AS_CALL and isinstance(sub, jax.extend.core.ClosedJaxpr) and _eager():
            # NOTE [JAX's jit programs stay calls]
            graph = _call_graph(sub)
            if graph is not None:
                from .primitives.call import call_name, jax_call_name

                return bind(_jit_call(), *args, graph=graph,
                            name=call_name(jax_call_name(params.get("name", "jit"))))
        if isinstance(sub, (jax.extend.core.ClosedJaxpr, jcore.Jaxpr)):
            outs = _program(sub)(list(args))
            return outs if prim.multiple_results else outs[0]
    rule = LIFT_RULES.get(name)
    if rule is not None and not getattr(rule, "takes_operands", False):
        fx, fx_params = rule(dict(params))
        if isinstance(fx, Macro):
            outs = fx.fn(*args, **fx_params)
        else:
            outs = bind(fx, *args, **fx_params)
        return outs if prim.multiple_results else outs[0] if isinstance(outs, list) else outs
    if rule is None:  # NOTE [foreign primitives]
        from .primitives.foreign import foreign

        return bind(foreign(prim), *args, **params)
    return _stage_and_replay(prim, args, params)


# NOTE [JAX's jit programs stay calls]
# A `jax.jit` function called on functx values (jnp.matmul, jax.nn.log_softmax,
# a user's jitted helper) becomes one functx `jit_call` of its translated
# graph, not its equations inlined, when the transforms run eagerly: the
# graph is transformed as a whole (its jvp split, transpose, batched graph,
# cached on the graph) and runs as one compiled program, as JAX's eager
# transforms run it: fewer dispatches and fewer compilations than one per
# equation. JAX keeps one ClosedJaxpr per function and input types, so the
# graph (and all derived from it) is made once per jaxpr. Under functx.jit
# or a JAX trace the equations are inlined as before (the whole program is
# compiled anyway, and inlined products keep the identity-basis shortcuts
# of NOTE [identity bases] inside chunked loops). A jaxpr with a callback
# is always inlined (NOTE [callbacks run when the program runs]). The same
# holds for a `jit` equation inside a jaxpr that lifting replays (the
# functx.numpy / functx.nn wrappers of jitted JAX functions such as
# log_softmax, `functx.lift`): decided when it is replayed (`_JitCall` in
# lifting.py), so eager code compiles one program per shape for it, as JAX
# eager does, not one per equation. A program of one equation that is
# functx's own primitive (jax.numpy's functions are such jitted wrappers
# from jax 0.12 on: jnp.tanh is `jit(tanh)`) is that primitive: inlined,
# it runs as the one-primitive program JAX eager runs, and the eager engine
# keeps it apart like any primitive (NOTE [one rounding per primitive] in
# xla_cpu.py); as a call, its derived graphs (jvp, transpose, batched) are
# compiled whole, so a product and a difference in tanh's derivative fused
# into one rounding there and the first eager calls differed from later
# ones in the last bit (vmap(grad) on jax 0.12). Such a call is named
# `jax.jit(<name>)` (`jax_call_name` in primitives/call.py): its program
# keeps each primitive apart, compiled alone and inlined into a combined
# program alike, so both round the same way.
_CALL_GRAPHS = {}  # id(closed jaxpr) -> (closed jaxpr, Graph or None)
_CALL_GRAPHS_LIMIT = 512


def _call_graph(closed):
    entry = _CALL_GRAPHS.get(id(closed))
    if entry is None or entry[0] is not closed:
        from .lifting import graph_of_jaxpr

        graph = None
        if not _calls_back(closed.jaxpr) and not _one_primitive(closed.jaxpr):
            # (callbacks keep the inlined path's timing)
            try:
                graph = graph_of_jaxpr(closed)
            except Exception:  # noqa: BLE001 - what cannot be staged whole is inlined
                graph = None
        entry = (closed, graph)
        if len(_CALL_GRAPHS) >= _CALL_GRAPHS_LIMIT:
            _CALL_GRAPHS.pop(next(iter(_CALL_GRAPHS)))
        _CALL_GRAPHS[id(closed)] = entry
    return entry[1]


def _register_caches():
    from . import caches

    caches.register(  # NOTE [bounded caches]
        "jax call graphs", _CALL_GRAPHS.clear,
        lambda: {"entries": len(_CALL_GRAPHS), "limit": _CALL_GRAPHS_LIMIT,
                 "doc": "the staged graph of each jitted JAX function met eagerly (FIFO), "
                        "with its compiled and derived programs"})
    caches.register(
        "jax call replays", _PROGRAMS.clear,
        lambda: {"entries": len(_PROGRAMS), "limit": _PROGRAMS_LIMIT,
                 "doc": "replays of the jaxprs of JAX calls met on functx values"})


_register_caches()


def _one_primitive(jaxpr):
    """Whether a jaxpr is one equation of a primitive functx defines (not
    a call or loop holding a program of its own)."""
    if len(jaxpr.eqns) != 1:
        return False
    prim = jaxpr.eqns[0].primitive
    return prim in FROM_JAX and prim.name not in _INLINE_PARAM and prim.name not in LIFT_RULES


def _eager():
    """Whether the transforms on the stack run eagerly: no functx staging
    (functx.jit, make_graph) and no JAX trace around them."""
    from . import xla_cpu
    from .core import _state
    from .interpreters.staging import StagingInterpreter

    return xla_cpu.top_level() and not any(type(i) is StagingInterpreter for i in _state.stack)


def _calls_back(jaxpr):
    """Whether a jaxpr (or one nested in its equations) has a callback or
    another effectful equation."""
    for eqn in jaxpr.eqns:
        fx = FROM_JAX.get(eqn.primitive)
        if "callback" in eqn.primitive.name or eqn.effects or (fx is not None and fx.effectful):
            return True
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    sub = sub.jaxpr
                if isinstance(sub, jcore.Jaxpr) and _calls_back(sub):
                    return True
    return False


def _jit_call():
    from .primitives.call import jit_call

    return jit_call


def _stage_and_replay(prim, args, params):
    """Stage the one bind as a JAX equation (the functx values replaced by
    abstract inputs) and replay it the way `lift` replays a jaxpr: for
    primitives whose translation needs the staged equation's operands
    (`takes_operands` rules of LIFT_RULES)."""
    positions = [i for i, a in enumerate(args) if type(a) in TRACER_TYPES]
    dynamic = [args[i] for i in positions]

    def one_bind(*xs):
        full = list(args)
        for i, x in zip(positions, xs):
            full[i] = x
        out = prim.bind(*full, **params)
        return list(out) if prim.multiple_results else [out]

    closed = jax.make_jaxpr(one_bind)(*[_shaped(a) for a in dynamic])
    outs = Program(closed)(dynamic)
    return outs if prim.multiple_results else outs[0]


def _custom_call_on_functx_values(bind_with_trace):
    def hook(self, trace, args, *rest):
        positions = [i for i, a in enumerate(args)
                     if type(a) in TRACER_TYPES and a._interp.jax_trace is trace]
        if not positions:
            return bind_with_trace(self, trace, args, *rest)
        for i in positions:
            check_usable(args[i])  # NOTE [escaped tracers]
        dynamic = [args[i] for i in positions]

        def one_bind(*xs):
            full = list(args)
            for i, x in zip(positions, xs):
                full[i] = x
            return list(bind_with_trace(self, jcore.trace_ctx.trace, full, *rest))

        fun, *rules = rest[-1].get("subfuns", (None,))
        closed = jax.make_jaxpr(one_bind)(*[_shaped(a) for a in dynamic])
        rules_before = [_filled(r) for r in rules]
        outs = Program(closed)(dynamic)
        if fun is not None and [_filled(r) for r in rules] != rules_before:
            # The functx transforms took the outputs from the rule (jvp,
            # fwd), as JAX's own would: what the JAX transforms around the
            # call read of its output layout must come from the rule too
            # (they require exactly one of the two to have run).
            for store in _stores(fun):
                store.reset()
        return outs

    hook.__wrapped__ = bind_with_trace
    return hook


def _stores(wrapped):
    """The auxiliary-output stores of a JAX WrappedFun."""
    out = []
    for s in getattr(wrapped, "stores", ()) or ():
        s = getattr(s, "_store", s)  # an EqualStore wraps a Store
        if s is not None and hasattr(s, "reset"):
            out.append(s)
    return out


def _filled(wrapped):
    return [bool(s) for s in _stores(wrapped)]


def _shaped(x):
    a = x.aval
    return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)


# --------------------------------------------------------------------------
# NOTE [device_put on functx values]
# `jax.device_put(x, device)` with a JAX tracer binds JAX's `device_put`
# primitive, linear (its jvp puts the tangents where the primals go, its
# transpose puts the cotangents back, its batching keeps the batch axes);
# outside any JAX trace it calls the transfer itself
# (`dispatch._batched_device_put_impl`), which on a functx value failed ("not
# a valid JAX type"). The hook below binds the primitive there too, for the
# functx values among the leaves (JAX's transfer takes the others), after JAX
# has turned `device`, `src`, `donate` and `may_alias` into the per-leaf
# parameters. Every bind of `device_put` on functx values (that one, a bind
# under a JAX trace, an equation of a jaxpr replayed by `lift`) is
# `_device_put_on_functx_values`: a functx value computes on the default
# device and carries no sharding or memory kind, so it is already placed
# where None, that device, a sharding of that device alone in its default
# memory, or the device memory space would put it: device_put is then the
# identity on its value and derivatives (functx's `device_put` primitive,
# primitives/misc.py). Any other placement (another device, a sharding over
# several devices, host memory, a layout) would be silently dropped, as the
# transforms compute and compile on the default device: it raises, naming
# device_put and the fix. Concrete arrays bound beside them are placed as
# JAX places them. `jax.device_get` of a functx value stays refused (it
# would give NumPy: JaxOnFunctxValueError), as `np.asarray` is.


def _default_device():
    from jax._src.interpreters import pxla

    return pxla.get_default_device()


def _already_placed(d):
    """Does device_put to `d` leave a functx value where it is (see NOTE)?"""
    if d is None:
        return True
    from jax._src.layout import Format

    default = _default_device()
    if isinstance(d, jcore.MemorySpace):
        return d == jcore.MemorySpace.Device
    if isinstance(d, jax.Device):
        return d == default
    if isinstance(d, jax.sharding.Sharding):
        return (d.device_set == {default}
                and d.memory_kind in (None, default.default_memory().kind))
    if isinstance(d, Format):
        return d.layout is None and _already_placed(d.sharding)
    return False


def _device_put_on_functx_values(*xs, devices, srcs, copy_semantics):
    """`device_put` (NOTE [device_put on functx values])."""
    from .errors import FunctxValueError
    from .primitives.misc import device_put_p

    for x, d, s in zip(xs, devices, srcs, strict=True):
        if not isinstance(x, Tracer):
            continue
        for what, where in (("device", d), ("src", s)):
            if not _already_placed(where):
                raise FunctxValueError(
                    f"jax.device_put(x, {what}={where!r}) inside functx.{x._interp.transform}: "
                    f"functx cannot place a functx value ({x.aval.str_short()}) there. "
                    f"functx transforms compute on the default device ({_default_device()}) "
                    "and carry no sharding or memory kind for their values, so that "
                    "placement would be silently dropped. Call jax.device_put on the "
                    f"transform's inputs or on its results, outside it, or leave the {what} "
                    "out (to lay out a value over a mesh inside the transform, use "
                    "jax.lax.with_sharding_constraint)."
                )
    return bind(device_put_p, *xs, devices=tuple(devices), srcs=tuple(srcs),
                copy_semantics=tuple(copy_semantics))


def _lift_device_put(params):
    return _DEVICE_PUT, params


_DEVICE_PUT = Macro(_device_put_on_functx_values)


def _register_device_put():
    from .primitives.misc import device_put_p

    _lift_device_put.primitive = device_put_p  # (read by functx.coverage)
    LIFT_RULES["device_put"] = _lift_device_put


_register_device_put()


def _device_put_hook(batched_impl):
    """`dispatch._batched_device_put_impl` (jax.device_put outside any JAX
    trace), binding `device_put` for the functx values among `xs`."""

    def impl(*xs, devices, srcs, copy_semantics, dst_avals):
        mine = [i for i, x in enumerate(xs) if isinstance(x, Tracer)]
        if not mine:
            return batched_impl(*xs, devices=devices, srcs=srcs,
                                copy_semantics=copy_semantics, dst_avals=dst_avals)
        outs = list(xs)
        placed = _device_put_on_functx_values(
            *[xs[i] for i in mine], devices=[devices[i] for i in mine],
            srcs=[srcs[i] for i in mine], copy_semantics=[copy_semantics[i] for i in mine])
        for i, y in zip(mine, placed, strict=True):
            outs[i] = y
        rest = sorted(set(range(len(xs))).difference(mine))
        if rest:
            done = batched_impl(*[xs[i] for i in rest], devices=[devices[i] for i in rest],
                                srcs=[srcs[i] for i in rest],
                                copy_semantics=[copy_semantics[i] for i in rest],
                                dst_avals=[dst_avals[i] for i in rest])
            for i, y in zip(rest, done, strict=True):
                outs[i] = y
        return outs

    impl.__wrapped__ = batched_impl
    return impl


# --------------------------------------------------------------------------
# The hooks in JAX


def _aval_of_tracer(x):
    a = x.aval
    return jcore.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)


def _refuse(x):
    raise jax_misuse_error(x)


def _is_local(x):
    """Is `x` a functx value of a transform running in the current JAX
    trace? (A functx value under a JAX trace begun inside its transform is
    a constant for that trace: JAX handles it.)"""
    if isinstance(x, Tracer):
        check_usable(x)  # NOTE [escaped tracers]
        return x._interp.jax_trace is jcore.trace_ctx.trace
    return False


def _has_functx(tree):
    for leaf in jax.tree_util.tree_leaves(tree):
        if _is_local(leaf):
            return True
    return False


def _lift_on_functx_values(fn):
    """`fn` (jnp.array, jnp.asarray), called through `lift` when a functx
    value is in its first argument."""
    import functools

    from .lifting import call_lifted

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if args and _has_functx(args[0]):
            return call_lifted(fn, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


# NOTE [custom functions closing over functx values]
# A jax.custom_jvp / custom_vjp function called with no functx value among
# its arguments may still read one through its closure (a function defined
# inside the one functx.grad differentiates, closing over its argument).
# Called as JAX calls it, its primal function would run on the functx value
# eagerly, and the functx transforms would differentiate that body: the
# user's rule silently ignored. So while a functx transform runs on this
# thread, JAX traces nothing newer than it and no argument is a JAX tracer
# (JAX's trace then holds the closed-over values), such a call is staged whole
# too (`call_lifted(..., replay=True)`, cached like any lifted call): a
# closed-over functx value becomes one of the lifted custom call's consts,
# which the rule cannot differentiate, and a differentiated one is refused
# by name (NOTE [custom derivative rules] in primitives/custom.py), as JAX
# refuses it. A function that cannot be staged (Python control flow or
# NumPy on its concrete arguments, which JAX allows there) runs as JAX runs
# it, from its first such call on.


def _has_jax_tracer(tree):
    """(JAX traces the call itself then: its consts hold what it closes over.)"""
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jcore.Tracer):
            return True
    return False


def _lift_custom_call(call):
    import functools

    from .core import interpreter_stack
    from .lifting import call_lifted

    @functools.wraps(call)
    def wrapper(self, *args, **kwargs):
        if _has_functx((args, kwargs)):
            return call_lifted(call, (self, *args), kwargs)
        stack = interpreter_stack()
        if (stack and stack[-1].jax_trace is jcore.trace_ctx.trace
                and not _has_jax_tracer((args, kwargs)) and self not in unstageable):
            try:
                return call_lifted(call, (self, *args), kwargs, replay=True)
            except jax.errors.JAXTypeError:
                # Python control flow or NumPy on its concrete arguments:
                # run as JAX runs it (as before this mechanism), from now on
                unstageable.add(self)
        return call(self, *args, **kwargs)

    unstageable = weakref.WeakSet()
    return wrapper


# NOTE [shard_map on functx values]
# `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` called on
# functx values (inside functx.grad, vmap, jit: the user's program shards
# its own work) is staged whole by JAX on abstract values, as a
# custom_jvp function is, and its jaxpr's shard_map equation is replayed as
# the foreign twin of JAX's shard_map primitive (NOTE [foreign
# primitives]): evaluated by JAX, differentiated and batched by staging
# jax.jvp / jax.vmap of the one equation (JAX does those in its traces'
# methods), transposed by JAX's rule. The body runs in JAX's manual SPMD
# mode on each device's block. functx transforms inside a shard_map body
# need nothing: there, values are JAX tracers (functx's bind of a JAX
# primitive lets JAX cast a device-invariant value to a varying one, as
# jax.lax does: eval.bind_varying).


def _shard_map_lifting(shard_map):
    import functools

    from .lifting import call_lifted

    @functools.wraps(shard_map)
    def wrapper(f=None, /, **kwargs):
        if f is None:  # used as a decorator factory: @jax.shard_map(mesh=...)
            return lambda g: wrapper(g, **kwargs)
        mapped = shard_map(f, **kwargs)

        @functools.wraps(mapped)
        def call(*args, **kw):
            if _has_functx((args, kw)):
                return call_lifted(mapped, args, kw)
            return mapped(*args, **kw)

        return call

    return wrapper


def _closes_over_functx(params):
    """Does a jit equation's program hold functx values as constants (a
    `jax.jit` function closing over a functx value)?"""
    for c in params["jaxpr"].consts:
        if _is_local(c):
            return True
    return False


# the operators of jax.Array whose reflected form a functx value defines
# (functx._array_api): Python then calls that one
_DEFERRING_OPERATORS = tuple(
    f"__{name}__" for name in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "matmul", "and", "or", "xor",
        "lshift", "rshift", "divmod", "pow", "eq", "ne", "lt", "le", "gt", "ge"))


def _defer_to_functx(operator):
    def deferring(self, other):
        if type(other) in TRACER_TYPES:
            return NotImplemented
        return operator(self, other)

    deferring.__name__ = operator.__name__
    deferring.__qualname__ = getattr(operator, "__qualname__", operator.__name__)
    deferring.__doc__ = operator.__doc__
    deferring.__wrapped__ = operator
    return deferring


def install():
    """Install the hooks (once: this module runs it when functx is imported)."""
    jax_bind = jcore.Primitive.bind
    try:
        from jax._src.pjit import jit_p
    except ImportError:  # pragma: no cover
        jit_p = None

    trace_ctx = jcore.trace_ctx
    from jax._src.config import eager_constant_folding as folding

    from .primitives.collectives import LIVE_NAMED as live_named

    def bind_hook(self, *args, **params):
        constants = False
        for a in args:
            if type(a) in TRACER_TYPES:
                check_usable(a)  # NOTE [escaped tracers]
                if a._interp.jax_trace is trace_ctx.trace:
                    return bind_jax(self, args, params)
                # Bound under a JAX trace begun inside the functx transform
                # (a loop body closing over a functx value): JAX stages the
                # functx values as constants of that trace.
                constants = True
        if constants and folding.value:
            # ...also under functx's staging, which folds constants
            # (staging.stage): a functx value is no JAX tracer, so JAX would
            # evaluate the operation on it rather than stage it
            with folding(False):
                return bind_hook(self, *args, **params)
        if self is jit_p and _closes_over_functx(params):
            return bind_jax(self, args, params)
        if live_named[0] and self.name in _CALLS and _names_at_this_level(params):
            return bind_jax(self, args, params)  # NOTE [JAX collectives on functx values]
        try:
            return jax_bind(self, *args, **params)
        except TypeError as e:  # a functx autograd tensor: functx's message
            if isinstance(e.__cause__, Exception) and type(e.__cause__).__name__ == "JaxOnFunctxValueError":
                raise e.__cause__.with_traceback(None) from None
            hinted = equinox_batch_error(e)  # NOTE [Equinox's one-example convention]
            if hinted is not None:
                raise hinted from None
            raise

    bind_hook.__wrapped__ = jax_bind
    jcore.Primitive.bind = bind_hook

    jcore.pytype_aval_mappings[Tracer] = _aval_of_tracer

    # JAX asks `core.is_concrete(x)` before specialising on a value (a
    # fori_loop's trip count, a cond's index under disable_jit, a power's
    # integer exponent), and a value that is not JAX's tracer counts as
    # concrete: a functx value whose transform knows no value for it (under
    # vmap, or staged) is not, so JAX takes its traced path rather than
    # calling int() on it (functx's ConcretizationError escaped JAX's
    # fallback). A concrete functx value stays the value itself.
    jax_to_concrete = jcore.to_concrete_value

    def to_concrete_value(x):
        if type(x) in TRACER_TYPES:
            try:
                x._concrete()
            except ConcretizationError:
                return None
            return x
        return jax_to_concrete(x)

    jcore.to_concrete_value = to_concrete_value
    jcore.pytype_aval_mappings[ImperativeValue] = _refuse
    try:
        from jax._src import dtypes as jdtypes

        jdtypes.canonicalize_value_handlers[Tracer] = lambda x: x
        jdtypes.canonicalize_value_handlers[ImperativeValue] = _refuse
    except (ImportError, AttributeError):  # pragma: no cover - other JAX layouts
        pass

    # JAX arrays' binary operators defer to functx values (NOTE above).
    try:
        from jax._src.array import ArrayImpl

        for name in _DEFERRING_OPERATORS:
            original = ArrayImpl.__dict__.get(name)
            if original is not None:
                setattr(ArrayImpl, name, _defer_to_functx(original))
    except (ImportError, AttributeError):  # pragma: no cover - other JAX layouts
        pass

    # jax.numpy's argument checks ask `_arraylike` of each argument.
    try:
        from jax._src.numpy import util as jnp_util

        arraylike = jnp_util._arraylike

        def _arraylike(x):
            if isinstance(x, Tracer):
                return True
            if isinstance(x, ImperativeValue):
                raise jax_misuse_error(x)
            return arraylike(x)

        jnp_util._arraylike = _arraylike
    except (ImportError, AttributeError):  # pragma: no cover
        pass

    try:
        from jax._src import pjit

        infer = pjit._infer_input_type

        def _infer_input_type(fun, dbg_fn, explicit_args):
            for a in explicit_args:
                if isinstance(a, ImperativeValue):
                    raise jax_misuse_error(a)
            return infer(fun, dbg_fn, explicit_args)

        pjit._infer_input_type = _infer_input_type

        # Outside any JAX trace, jax.jit runs its program without binding.
        run = pjit._run_python_pjit

        def _run_python_pjit(p, args_flat, fun, args, kwargs):
            if any(_is_local(a) for a in (*args_flat, *p.params["jaxpr"].consts)) or (
                    live_named[0] and _names_at_this_level(p.params)):
                out_flat = bind_jax(pjit.jit_p, args_flat, p.params)
                outs = jax.tree_util.tree_unflatten(p.out_tree, out_flat)
                return (outs, out_flat, p.out_tree, args_flat, p.params["jaxpr"],
                        None, None, [])
            return run(p, args_flat, fun, args, kwargs)

        pjit._run_python_pjit = _run_python_pjit
    except (ImportError, AttributeError):  # pragma: no cover
        pass

    # JAX's conversions to arrays test `isinstance(x, jax.Array)` (a C++
    # check that only knows JAX's own tracers) and otherwise fall back to
    # NumPy: on a functx value they are the identity, or (jnp.array's dtype,
    # copy, ndmin) the same conversion lifted.
    try:
        from jax._src.lax import lax as lax_module

        lax_asarray = lax_module.asarray

        def asarray(x):
            if type(x) in TRACER_TYPES:  # (a constant for a newer JAX trace too)
                return x
            return lax_asarray(x)

        asarray.__wrapped__ = lax_asarray
        lax_module.asarray = asarray
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    # JAX's lax wrappers make a number into a constant shaped like their
    # operand with `lax._const`, after asking `isinstance(c, core.Tracer)`
    # (a functx value is not one): jax 0.12's `lax.polynomial` sends a
    # rank-0 functx coefficient there, to `np.array`. A functx value is
    # never a constant to JAX: it takes the operand's dtype and stays a value.
    try:
        from jax._src.lax import lax as lax_module

        lax_const = lax_module._const

        def _const(example, val):
            if type(val) in TRACER_TYPES:
                return lax_module.convert_element_type(val, lax_module._dtype(example))
            return lax_const(example, val)

        _const.__wrapped__ = lax_const
        lax_module._const = _const
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    try:
        import jax.numpy as jnp
        from jax._src.numpy import array_constructors

        for name in ("array", "asarray"):
            original = getattr(array_constructors, name)
            converted = _lift_on_functx_values(original)
            setattr(array_constructors, name, converted)
            if getattr(jnp, name) is original:
                setattr(jnp, name, converted)
    except (ImportError, AttributeError):  # pragma: no cover
        pass

    # A custom_jvp / custom_vjp function binds its primitive with Python
    # functions, whose result stores JAX reads after the bind: on functx
    # values the call is staged whole (its rules stay lazy) and replayed.
    from jax._src import custom_derivatives

    for cls in (custom_derivatives.custom_jvp, custom_derivatives.custom_vjp):
        cls.__call__ = _lift_custom_call(cls.__call__)

    # A JAX transform that processes a custom_jvp / custom_vjp call (jax.vmap's
    # batch trace, jax.jit's tracing) binds the primitive again on its parent
    # trace with `bind_with_trace`, past the bind hook: on functx values its
    # parent (an eval trace) would run the primal function alone, and the
    # custom rule would be lost to the functx transforms around it (a
    # silently wrong derivative: relu's at 0 through `jax.vmap`). There the
    # call is staged whole and replayed, as a direct bind is.
    for cls in (custom_derivatives.CustomJVPCallPrimitive,
                custom_derivatives.CustomVJPCallPrimitive):
        cls.bind_with_trace = _custom_call_on_functx_values(cls.bind_with_trace)

    # So does a jax.shard_map function (NOTE [shard_map on functx values]).
    try:
        from jax._src import shard_map as shard_map_module

        original = shard_map_module.shard_map
        wrapped = _shard_map_lifting(original)
        shard_map_module.shard_map = wrapped
        if getattr(jax, "shard_map", None) is original:
            jax.shard_map = wrapped
    except (ImportError, AttributeError):  # pragma: no cover - other JAX layouts
        pass

    try:  # NOTE [device_put on functx values]
        from jax._src import dispatch

        dispatch._batched_device_put_impl = _device_put_hook(dispatch._batched_device_put_impl)
    except (ImportError, AttributeError):  # pragma: no cover - other JAX layouts
        pass

    try:
        from jax._src import dispatch

        check_arg = dispatch.check_arg

        def _check_arg(arg):
            if type(arg) in TRACER_TYPES:
                return None
            return check_arg(arg)

        dispatch.check_arg = _check_arg
    except (ImportError, AttributeError):  # pragma: no cover
        pass

    # jax.closure_convert hoists the values a function closes over that may
    # carry a derivative (JAX's tracers) into explicit arguments, so that a
    # custom_vjp function can take them (the idiom JAX documents for a
    # custom rule over a closure). A functx value may carry one too: it is
    # hoisted likewise, rather than left in the closure, where functx (as
    # JAX) refuses to differentiate it.
    maybe_perturbed = getattr(custom_derivatives, "_maybe_perturbed", None)
    if maybe_perturbed is not None:
        def _maybe_perturbed(x):
            return type(x) in TRACER_TYPES or maybe_perturbed(x)

        custom_derivatives._maybe_perturbed = _maybe_perturbed


# --------------------------------------------------------------------------
# NOTE [JAX collectives on functx values]
# JAX's psum (and pmean, axis_size, built on it) treats any operand that is
# not a JAX tracer as a constant and multiplies it by the size of the named
# axis in JAX's own axis environment, before binding any primitive; and
# axis_index has no operand for the bind hook to see. So
# `jax.lax.psum(x, 'batch')` on a functx value (Equinox's BatchNorm, user
# code) would never reach functx. The public collectives of `jax.lax` are
# wrapped (`install_collectives`): with a functx value among the operands,
# or (for axis_index and axis_size) a name bound by a functx.vmap and not
# by JAX, the call is functx's; otherwise JAX's own function runs
# unchanged.
#
# A program JAX traces inside a named functx.vmap with no functx value
# among its operands (`jax.jit(h)(2.0)`, a jax.lax loop body, the compiled
# graph of a functx.jit called on unbatched values) records JAX's own
# collectives: the vmap extends JAX's axis environment with its name
# (transforms/vmap.py). When the JAX equation holding that program (jit,
# cond, scan, while, checkpoint, custom_jvp/vjp: `_CALLS`) is bound at the
# vmap's level, its program names a live functx axis, and it is translated
# (`bind_jax`) into a functx call whose graph holds functx collectives: the
# vmap processes it (GraphCallPrimitive in primitives/collectives.py), as
# JAX batches a jit whose program uses the vmap's axis. Binds pay for the
# check only while a named functx.vmap runs (`LIVE_NAMED`), and only for
# those equations.

_CALLS = frozenset(("jit", "pjit", "closed_call", "core_call", "checkpoint", "remat", "remat2",
                    "cond", "scan", "while", "custom_jvp_call", "custom_vjp_call"))
_JAXPR_NAMES = {}  # id(jaxpr) -> (jaxpr, frozenset of axis names its collectives use)
_JAXPR_NAMES_LIMIT = 512


def _jaxprs(v):
    if isinstance(v, (tuple, list)):
        return [j for j in v if isinstance(j, (jax.extend.core.ClosedJaxpr, jcore.Jaxpr))]
    if isinstance(v, (jax.extend.core.ClosedJaxpr, jcore.Jaxpr)):
        return [v]
    return []


def _jaxpr_names(jaxpr):
    """The axis names the collectives of `jaxpr` (and of its sub-programs)
    name; cached per jaxpr."""
    entry = _JAXPR_NAMES.get(id(jaxpr))
    if entry is not None and entry[0] is jaxpr:
        return entry[1]
    from .primitives.collectives import CollectivePrimitive, _names

    found = set()
    inner = jaxpr.jaxpr if isinstance(jaxpr, jax.extend.core.ClosedJaxpr) else jaxpr
    for eqn in inner.eqns:
        fx = FROM_JAX.get(eqn.primitive)
        if type(fx) is CollectivePrimitive:
            found.update(_names(eqn.params[fx.axis_param]))
        for v in eqn.params.values():
            for sub in _jaxprs(v):
                found.update(_jaxpr_names(sub))
    names = frozenset(found)
    if len(_JAXPR_NAMES) >= _JAXPR_NAMES_LIMIT:
        _JAXPR_NAMES.clear()
    _JAXPR_NAMES[id(jaxpr)] = (jaxpr, names)
    return names


def _names_at_this_level(params):
    """Does a program among `params` name the axis of a live functx.vmap
    whose JAX trace is the current one?"""
    from .interpreters.batching import named_interpreter

    cur = jcore.trace_ctx.trace
    for v in params.values():
        for j in _jaxprs(v):
            for n in _jaxpr_names(j):
                interp = named_interpreter(n)
                if interp is not None and interp.jax_trace is cur:
                    return True
    return False


def _has_functx_value(tree):
    return any(type(leaf) in TRACER_TYPES for leaf in jax.tree_util.tree_leaves(tree))


def _functx_names(axis_name, staged_by_jax=True):
    """Does a functx.vmap bind every name of `axis_name`? (JAX's axis
    environment holds them too while it runs: transforms/vmap.py.) With
    `staged_by_jax=False`: and is JAX not staging a program begun inside
    that vmap (a jax.jit function, whose jaxpr keeps JAX's collective, to
    be translated when replayed on functx values)?"""
    from .interpreters.batching import named_interpreter
    from .primitives.collectives import _JaxprTrace, _names

    names = _names(axis_name)
    if not names:
        return False
    trace = jcore.trace_ctx.trace
    for n in names:
        interp = named_interpreter(n)
        if interp is None:
            return False
        if (not staged_by_jax and interp.jax_trace is not trace
                and isinstance(trace, _JaxprTrace)):
            return False
    return True


def _jax_pmean(x, axis_name, *, axis_index_groups=None):
    """jax.lax.pmean of JAX values (a jax.vmap inside a functx.vmap, as in
    Equinox's BatchNorm) over a functx.vmap's axis: JAX's psum reaches
    functx through the bind hook; the size is functx's."""
    from .primitives.collectives import _check_groups, axis_size

    _check_groups("pmean", axis_index_groups)
    n = axis_size(axis_name)
    total = jax.lax.psum._functx_original(x, axis_name)
    return jax.tree_util.tree_map(lambda t: t / n, total)


def _has_jax_tracer(tree):
    return any(isinstance(x, jcore.Tracer) for x in jax.tree_util.tree_leaves(tree))


def _wrap_jax_collective(name, ours, by_value=True, by_names=None):
    import functools

    original = getattr(jax.lax, name, None)
    if original is None or getattr(original, "_functx_wrapped", False):
        return

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if (by_value and args and _has_functx_value(args[0])) or (
                not by_value and args and _functx_names(args[0], staged_by_jax=False)):
            return ours(*args, **kwargs)
        if by_names is not None and len(args) > 1 and _functx_names(args[1]):
            return by_names(*args, **kwargs)
        if by_value and args and by_names is None:
            # a value no transform traces (a constant) over a functx.vmap's
            # axis: an unbatched operand of functx's collective (JAX's would
            # reach its eager implementation, which has no axis: an
            # internal AssertionError)
            names = args[1] if len(args) > 1 else kwargs.get("axis_name")
            if (names is not None and not _has_jax_tracer(args[0])
                    and _functx_names(names, staged_by_jax=False)):
                return ours(*args, **kwargs)
        return original(*args, **kwargs)

    wrapper._functx_wrapped = True
    wrapper._functx_original = original
    setattr(jax.lax, name, wrapper)


def install_collectives():
    """Wrap the collectives of jax.lax (NOTE [JAX collectives on functx
    values]); once, when functx is imported."""
    from .primitives import collectives as c

    for name in ("psum", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
                 "all_to_all"):
        _wrap_jax_collective(name, getattr(c, name))
    _wrap_jax_collective("pmean", c.pmean, by_names=_jax_pmean)
    _wrap_jax_collective("axis_index", c.axis_index, by_value=False)
    _wrap_jax_collective("axis_size", c.axis_size, by_value=False)


install()
install_collectives()
