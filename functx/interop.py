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
* A bind without functx values costs one scan of its operands for functx
  tracers before JAX's own bind.

What stays refused: converting a functx value to NumPy (`np.asarray`,
`__array__`), which would silently drop its derivative, and functx's
autograd tensors (functx.autograd.Tensor), which record operations only
through functx.numpy / lift. `functx.lift(fn)` remains the explicit path
that stages `fn` once per signature and replays it.
"""

import jax
import jax.extend.core
from jax._src import core as jcore

from .core import (
    FROM_JAX, TRACER_TYPES, ImperativeValue, Tracer, bind, check_usable, jax_misuse_error,
)
from .lifting import _INLINE_PARAM, LIFT_RULES, Macro, Program

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
        sub = params.get(_INLINE_PARAM[name])
        if name in _AS_CALL and isinstance(sub, jax.extend.core.ClosedJaxpr) and _eager():
            # NOTE [JAX's jit programs stay calls]
            graph = _call_graph(sub)
            if graph is not None:
                return bind(_jit_call(), *args, graph=graph,
                            name=str(params.get("name", "jit")))
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
# is always inlined (NOTE [callbacks run when the program runs]).
_AS_CALL = ("jit", "pjit")
_CALL_GRAPHS = {}  # id(closed jaxpr) -> (closed jaxpr, Graph or None)
_CALL_GRAPHS_LIMIT = 512


def _call_graph(closed):
    entry = _CALL_GRAPHS.get(id(closed))
    if entry is None or entry[0] is not closed:
        from .lifting import graph_of_jaxpr

        graph = None
        if not _calls_back(closed.jaxpr):  # callbacks keep the inlined path's timing
            try:
                graph = graph_of_jaxpr(closed)
            except Exception:  # noqa: BLE001 - what cannot be staged whole is inlined
                graph = None
        entry = (closed, graph)
        if len(_CALL_GRAPHS) >= _CALL_GRAPHS_LIMIT:
            _CALL_GRAPHS.pop(next(iter(_CALL_GRAPHS)))
        _CALL_GRAPHS[id(closed)] = entry
    return entry[1]


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


def _shaped(x):
    a = x.aval
    return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)


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


def _lift_on_functx_values(fn, method=False):
    """`fn`, called through `lift` when a functx value is among its
    arguments (for a method: among the arguments after `self`)."""
    import functools

    from .lifting import call_lifted

    if method:
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            if _has_functx((args, kwargs)):
                return call_lifted(fn, (self, *args), kwargs)
            return fn(self, *args, **kwargs)
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if args and _has_functx(args[0]):
                return call_lifted(fn, args, kwargs)
            return fn(*args, **kwargs)

    return wrapper


def _closes_over_functx(params):
    """Does a jit equation's program hold functx values as constants (a
    `jax.jit` function closing over a functx value)?"""
    for c in params["jaxpr"].consts:
        if _is_local(c):
            return True
    return False


def install():
    """Install the hooks (once: this module runs it when functx is imported)."""
    jax_bind = jcore.Primitive.bind
    try:
        from jax._src.pjit import jit_p
    except ImportError:  # pragma: no cover
        jit_p = None

    trace_ctx = jcore.trace_ctx

    def bind_hook(self, *args, **params):
        for a in args:
            if type(a) in TRACER_TYPES:
                check_usable(a)  # NOTE [escaped tracers]
                # Bound under a JAX trace begun inside the functx transform
                # (a loop body closing over a functx value): JAX stages the
                # functx values as constants of that trace.
                if a._interp.jax_trace is trace_ctx.trace:
                    return bind_jax(self, args, params)
        if self is jit_p and _closes_over_functx(params):
            return bind_jax(self, args, params)
        try:
            return jax_bind(self, *args, **params)
        except TypeError as e:  # a functx autograd tensor: functx's message
            if isinstance(e.__cause__, Exception) and type(e.__cause__).__name__ == "JaxOnFunctxValueError":
                raise e.__cause__.with_traceback(None) from None
            raise

    bind_hook.__wrapped__ = jax_bind
    jcore.Primitive.bind = bind_hook

    jcore.pytype_aval_mappings[Tracer] = _aval_of_tracer
    jcore.pytype_aval_mappings[ImperativeValue] = _refuse
    try:
        from jax._src import dtypes as jdtypes

        jdtypes.canonicalize_value_handlers[Tracer] = lambda x: x
        jdtypes.canonicalize_value_handlers[ImperativeValue] = _refuse
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
            for a in (*args_flat, *p.params["jaxpr"].consts):
                if _is_local(a):
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
        cls.__call__ = _lift_on_functx_values(cls.__call__, method=True)

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


install()
