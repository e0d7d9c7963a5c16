"""`functx.autograd.Function`: torch's custom autograd functions, on
functx's custom-rule machinery.

NOTE [autograd.Function]
`MyFn.apply(*args)` binds the primitive `autograd_function_call`, a twin of
`custom_vjp_call` (primitives/custom.py, NOTE [custom derivative rules]):
its params are the forward staged as a Graph (`call`) and a rule object
(`_FunctionRule`) whose `fwd` runs the user's `forward` + `setup_context`
(or old-style `forward(ctx, ...)`) and returns the ctx's arrays (saved
tensors and array attributes) as residuals, and whose `bwd` rebuilds a ctx
from the residuals and calls `backward(ctx, *grads)`. So:

* reverse mode (grad, vjp, jacrev) records `custom_lin` and transposes it by
  calling `backward`;
* forward mode (jvp, jacfwd) calls the user's `jvp(ctx, *tangents)`
  staticmethod when the class has one; otherwise it transposes `backward`
  (NOTE [forward mode of custom_vjp]), which must be linear in the grads;
* vmap calls the user's `vmap(info, in_dims, *args)` staticmethod; with
  `generate_vmap_rule = True` it batches forward / backward / jvp
  automatically (NOTE [batched custom rules]); with neither it raises, as
  torch does.

Only array arguments (functx values, jax / NumPy arrays) are inputs of the
primitive; every other argument (ints, floats, None, objects) is kept as it
is and gets no gradient: `backward` must return None for it.
Outside functx transforms `apply` just runs `forward` (there is nothing to
differentiate).
"""

import contextlib
import inspect
import threading

import jax
import numpy as np
from jax import tree_util

from ..core import ImperativeValue, Tracer, Zero, aval_of, bind, interpreter_stack
from ..errors import FunctxRuntimeError, FunctxTypeError, FunctxValueError
from ..interpreters.batching import BatchTracer
from ..interpreters.reverse import _Tape
from ..interpreters.staging import Graph, StagingTracer, stage
from ..primitives import custom as _custom
from ..primitives.common import batch_rules, defprim, jvp_rules, shape_rules, transpose_rules
from ..interpreters.eval import defimpl

__all__ = ["Function", "FunctionCtx"]

_ARRAYS = (Tracer, jax.Array, np.ndarray)

function_call = defprim("autograd_function_call", multiple_results=True)


class _State(threading.local):
    def __init__(self):
        self.in_apply = 0


_state = _State()
_needs_state = _custom.Perturbed()  # needs_input_grad while a rule runs under jvp


@contextlib.contextmanager
def _applying():
    _state.in_apply += 1
    try:
        yield
    finally:
        _state.in_apply -= 1


# --------------------------------------------------------------------------
# ctx


class FunctionCtx:
    """The `ctx` handed to forward / setup_context / backward / jvp."""

    def __init__(self, needs_input_grad=()):
        self.needs_input_grad = tuple(needs_input_grad)
        self.to_save = ()
        self.non_differentiable = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors):
        for t in tensors:
            if t is not None and not isinstance(t, _ARRAYS):
                raise FunctxTypeError(
                    "autograd.Function: save_for_backward accepts arrays or None, got a "
                    f"{type(t).__name__}. Store other values as ctx attributes (ctx.foo = ...)."
                )
        self.to_save = tensors

    def save_for_forward(self, *tensors):
        self.save_for_backward(*tensors)

    @property
    def saved_tensors(self):
        return tuple(self.to_save)

    def mark_non_differentiable(self, *outputs):
        self.non_differentiable = self.non_differentiable + outputs

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)

    def mark_dirty(self, *args):
        raise FunctxRuntimeError(
            "autograd.Function: ctx.mark_dirty is not supported: functx arrays are "
            "immutable, so forward cannot modify its inputs in place. Return a new array."
        )


_CTX_FIELDS = ("needs_input_grad", "to_save", "non_differentiable", "materialize_grads")


class _Static:
    """A non-array ctx attribute inside the (hashable) residual structure."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        if not isinstance(other, _Static):
            return False
        if self.value is other.value:
            return True
        try:
            return bool(self.value == other.value)
        except Exception:  # noqa: BLE001 - arrays, odd objects: identity only
            return False

    def __hash__(self):
        try:
            return hash(self.value)
        except TypeError:
            return id(type(self.value))


def _ctx_to_residuals(ctx, outs):
    """(arrays, hashable structure) describing everything bwd / jvp need."""
    res = []
    saved = []
    for t in ctx.to_save:
        if t is None:
            saved.append(None)
        else:
            saved.append(len(res))
            res.append(t)
    attrs = []
    for k, v in sorted(vars(ctx).items()):
        if k in _CTX_FIELDS:
            continue
        leaves, tree = tree_util.tree_flatten(v)
        slots = []
        for x in leaves:
            if isinstance(x, _ARRAYS):
                slots.append(len(res))
                res.append(x)
            else:
                slots.append(_Static(x))
        attrs.append((k, tree, tuple(slots)))
    nondiff = tuple(i for i, o in enumerate(outs)
                    if any(o is m for m in ctx.non_differentiable))
    struct = (tuple(saved), tuple(attrs), nondiff, ctx.materialize_grads,
              ctx.needs_input_grad)
    return res, struct


def _ctx_from_residuals(struct, res):
    saved, attrs, _, materialize, needs = struct
    ctx = FunctionCtx(needs)
    ctx.to_save = tuple(None if i is None else res[i] for i in saved)
    ctx.materialize_grads = materialize
    for k, tree, slots in attrs:
        leaves = [s.value if isinstance(s, _Static) else res[s] for s in slots]
        setattr(ctx, k, tree_util.tree_unflatten(tree, leaves))
    return ctx


# --------------------------------------------------------------------------
# Running the user's methods


def _new_style(cls):
    return cls.setup_context is not _SingleLevelFunction.setup_context


def _check_style(cls, n_args):
    if _new_style(cls):
        return
    try:
        params = list(inspect.signature(cls.forward).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) == n_args and (not positional or positional[0].name != "ctx"):
        raise FunctxRuntimeError(
            f"autograd.Function `{cls.__name__}`: forward takes no ctx argument "
            "(new style), so the class must define setup_context(ctx, inputs, output). "
            "Define it, or write forward(ctx, *args) (old style)."
        )


def _bind_arguments(cls, args, kwargs):
    """apply's arguments as the positional tuple that forward, setup_context,
    backward, jvp and vmap see, and the fewest gradients backward may return.

    As torch: a new-style forward's arguments are bound to its signature,
    keywords and defaults included, and backward returns one gradient per
    bound argument. Old style (forward(ctx, ...)) binds the same way, but
    torch counts only the arguments passed (positionally or by keyword) as
    inputs, so backward may omit the gradients of defaulted ones."""
    sig = _signature(cls)
    if sig is None:
        if kwargs:
            raise FunctxTypeError(
                f"autograd.Function `{cls.__name__}`.apply: keyword arguments "
                f"{sorted(kwargs)} need a forward with an inspectable signature; "
                "pass them positionally."
            )
        return args, len(args)
    new = _new_style(cls)
    if not kwargs and len(args) == sig[1] - (not new):
        return args, len(args)
    try:
        bound = sig[0].bind(*args, **kwargs) if new else sig[0].bind(None, *args, **kwargs)
    except TypeError as e:
        raise FunctxTypeError(
            f"autograd.Function `{cls.__name__}`.apply: {e}. Pass the arguments of "
            f"forward{sig[0]}."
        ) from None
    bound.apply_defaults()
    if bound.kwargs:
        raise FunctxTypeError(
            f"autograd.Function `{cls.__name__}`.apply: forward's keyword-only "
            f"parameters {sorted(bound.kwargs)} cannot be inputs (setup_context and "
            "backward see positional inputs only). Make them positional parameters."
        )
    full = bound.args if new else bound.args[1:]
    return full, (len(full) if new else len(args) + len(kwargs))


def _signature(cls):
    """(signature of forward, its number of positional parameters), cached on
    the class; None if forward takes *args or has no signature."""
    cached = cls.__dict__.get("_functx_signature", False)
    if cached is not False:
        return cached
    try:
        sig = inspect.signature(cls.forward)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        params = sig.parameters.values()
        if any(p.kind == p.VAR_POSITIONAL for p in params):
            sig = None
        else:
            n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
            sig = (sig, n)
    type.__setattr__(cls, "_functx_signature", sig)
    return sig


def _run_forward(cls, ctx, args):
    with _applying():
        if _new_style(cls):
            out = cls.forward(*args)
            cls.setup_context(ctx, tuple(args), out)
        else:
            out = cls.forward(ctx, *args)
    return out


def _flat_outputs(cls, out):
    single = not isinstance(out, tuple)
    outs = [out] if single else list(out)
    for i, o in enumerate(outs):
        if not isinstance(o, _ARRAYS + (bool, int, float, complex)):
            raise FunctxTypeError(
                f"autograd.Function `{cls.__name__}`: forward returned a "
                f"{type(o).__name__} as output {i}; return an array or a tuple of arrays."
            )
    return outs, single


class _Spec:
    """Which positional arguments are arrays (the primitive's inputs)."""

    def __init__(self, args, required=None):
        self.n = len(args)
        self.required = self.n if required is None else required  # fewest gradients
        self.array_pos = tuple(i for i, a in enumerate(args) if isinstance(a, _ARRAYS))
        self.template = [None if isinstance(a, _ARRAYS) else a for a in args]
        self.avals = tuple(aval_of(args[i]) for i in self.array_pos)

    def key(self):
        from ..lifting import _StaticKey

        return (self.n, self.required, self.array_pos,
                tuple(_StaticKey(x) for x in self.template), self.avals)

    def rebuild(self, arrays):
        full = list(self.template)
        for i, a in zip(self.array_pos, arrays, strict=True):
            full[i] = a
        return full


class _FunctionRule:
    """Rule object of one Function class for one argument signature."""

    kind = "autograd.Function"
    # Unhashable on purpose: reverse mode's fused steps (NOTE [eager reverse
    # mode in few dispatches]) stage a primitive's jvp with a plain jvp
    # interpreter, which would pick the user's jvp staticmethod instead of
    # backward; unhashable params keep this primitive out of them.
    __hash__ = None

    def __init__(self, cls, spec, n_closure, closure, single, out_avals):
        self.cls = cls
        self.spec = spec
        self.n_closure = n_closure
        self.closure_interps = [x._interp if isinstance(x, Tracer) else None for x in closure]
        self.primal_avals = list(spec.avals)
        self.name = cls.__name__
        self.single = single
        self.out_avals = out_avals
        self.handles = {}
        self.has_jvp = cls.jvp is not _SingleLevelFunction.jvp

    def __repr__(self):
        return f"autograd.Function {self.name}"

    def _needs(self):
        needs = _needs_state.flags
        n = len(self.primal_avals)
        if needs is None or len(needs) != n:
            needs = [_custom.is_float(a) for a in self.primal_avals]
        full = [False] * self.spec.n
        for i, nd in zip(self.spec.array_pos, needs):
            full[i] = bool(nd)
        return full

    def _forward(self, primals):
        ctx = FunctionCtx(self._needs())
        out = _run_forward(self.cls, ctx, self.spec.rebuild(primals))
        outs, _ = _flat_outputs(self.cls, out)
        checked = []
        for i, (o, a) in enumerate(zip(outs, self.out_avals, strict=True)):
            o = _custom_fix(o, a)
            b = aval_of(o)
            if b.shape != a.shape or b.dtype != a.dtype:  # pragma: no cover - forward is pure
                raise FunctxValueError(
                    f"autograd.Function `{self.name}`: forward returned {b.str_short()} as "
                    f"output {i}, {a.str_short()} before. forward must be deterministic in "
                    "its shapes."
                )
            checked.append(o)
        return ctx, checked

    def fwd(self, consts, primals):
        ctx, outs = self._forward(primals)
        res, struct = _ctx_to_residuals(ctx, outs)
        return outs, res, struct

    def bwd(self, struct, res, cts):
        ctx = _ctx_from_residuals(struct, list(res))
        nondiff = struct[2]
        grads = []
        for i, (c, a) in enumerate(zip(cts, self.out_avals)):
            if type(c) is Zero or i in nondiff:
                grads.append(_custom.full_zeros(a) if ctx.materialize_grads else None)
            else:
                grads.append(c)
        with _applying():
            result = self.cls.backward(ctx, *grads)
        return self._check_grads(result, "backward", "gradient")

    def __call__(self, consts, primals, tangents):
        """Forward mode by the user's jvp staticmethod."""
        ctx, outs = self._forward(primals)
        ts = [None] * self.spec.n
        for i, t, a in zip(self.spec.array_pos, tangents, self.primal_avals):
            ts[i] = _custom.tangent_value(t, a) if type(t) is Zero else t
        with _applying():
            result = self.cls.jvp(ctx, *ts)
        touts = result if isinstance(result, tuple) else (result,)
        if len(touts) != len(outs):
            raise FunctxValueError(
                f"autograd.Function `{self.name}`: jvp returned {len(touts)} tangents for "
                f"{len(outs)} outputs; return one tangent per output of forward."
            )
        checked = []
        nondiff = {i for i, o in enumerate(outs) if any(o is m for m in ctx.non_differentiable)}
        for i, (t, a) in enumerate(zip(touts, self.out_avals)):
            if t is None or i in nondiff or not _custom.is_float(a):
                checked.append(Zero(a))
                continue
            checked.append(self._check_one(t, a, i, "jvp", "tangent", "output"))
        return outs, checked

    def _check_one(self, c, a, i, method, what, of):
        if not isinstance(c, _ARRAYS + (int, float, complex)):
            raise FunctxTypeError(
                f"autograd.Function `{self.name}`: {method} returned a {type(c).__name__} "
                f"as the {what} of {of} {i}; return arrays or None."
            )
        c = _custom_fix(c, a)
        b = aval_of(c)
        if b.shape != a.shape:
            raise FunctxValueError(
                f"autograd.Function `{self.name}`: {method} returned a {what} of shape "
                f"{b.shape} for {of} {i}, which has shape {a.shape}. A {what} has the "
                f"shape of its {of}."
            )
        if b.dtype != a.dtype:
            from ..primitives.elementwise import convert_element_type

            c = convert_element_type(c, a.dtype)
        return c

    def _check_grads(self, result, method, what):
        spec = self.spec
        grads = result if isinstance(result, tuple) else (result,)
        if isinstance(result, list):
            grads = tuple(result)
        if len(grads) > spec.n and all(g is None for g in grads[spec.n:]):
            grads = grads[:spec.n]  # as torch: surplus trailing Nones are dropped
        elif spec.required <= len(grads) < spec.n:
            grads = grads + (None,) * (spec.n - len(grads))
        if len(grads) != spec.n:
            raise FunctxValueError(
                f"autograd.Function `{self.name}`: {method} returned an incorrect number "
                f"of gradients (expected {spec.n}, got {len(grads)}). Return one gradient "
                "per argument of forward, None for arguments without one."
            )
        arrays = set(spec.array_pos)
        for i, g in enumerate(grads):
            if i not in arrays and g is not None:
                raise FunctxValueError(
                    f"autograd.Function `{self.name}`: {method} returned a gradient "
                    f"different than None at position {i}, but the corresponding forward "
                    f"input is not an array ({type(spec.template[i]).__name__}). Return None "
                    "there."
                )
        out = []
        for k, (i, a) in enumerate(zip(spec.array_pos, self.primal_avals)):
            g = grads[i]
            if g is None or not _custom.is_float(a):
                out.append(Zero(a))
            else:
                out.append(self._check_one(g, a, i, method, what, "input"))
        return out


def _custom_fix(x, aval):
    a = aval_of(x)
    if a.dtype != aval.dtype and a.weak_type:
        from ..primitives.elementwise import convert_element_type

        return convert_element_type(x, aval.dtype)
    return x


class _BatchedFunctionRule(_custom._BatchedVJPRule):
    """NOTE [batched custom rules], for generate_vmap_rule=True: forward,
    backward and jvp run on values boxed for a vmap interpreter."""

    __call__ = _custom._BatchedJVPRule.__call__
    __hash__ = None  # see _FunctionRule

    @property
    def has_jvp(self):
        return self.inner.has_jvp

    @property
    def out_avals(self):  # pragma: no cover - not needed by the rules
        return None


# --------------------------------------------------------------------------
# The primitive's rules


def _is_reverse_tangent(t):
    return type(t) is StagingTracer and isinstance(t._interp, _Tape)


def _function_jvp(primals, tangents, *, call, rule, num_consts, name):
    _custom._check_closure(tangents, rule)
    nc = num_consts
    nonzero = tuple(type(t) is not Zero for t in tangents[nc:])
    if not any(nonzero):
        outs = bind(function_call, *primals, call=call, rule=rule, num_consts=nc, name=name)
        return outs, [Zero.of(o) for o in outs]
    if rule.has_jvp and not any(_is_reverse_tangent(t) for t in tangents[nc:]):
        with _custom.perturbed_while(nonzero, _needs_state):
            return rule(list(primals[:nc]), list(primals[nc:]), list(tangents[nc:]))
    with _custom.perturbed_while(nonzero, _needs_state):
        outs, res, struct = rule.fwd(list(primals[:nc]), list(primals[nc:]))
    res_avals = tuple(aval_of(r) for r in res)
    key = (struct, res_avals, nonzero)
    lin = rule.handles.get(key)
    if lin is None:
        lin = rule.handles[key] = _custom.Lin(rule, struct, res_avals, nonzero, call.out_avals)
    if not any(lin.out_float):
        return outs, [Zero.of(o) for o in outs]
    live = [t for t in tangents[nc:] if type(t) is not Zero]
    touts = iter(bind(_custom.custom_lin, *res, *live, lin=lin))
    nondiff = struct[2]
    result = []
    for i, (o, f) in enumerate(zip(outs, lin.out_float)):
        t = next(touts) if f else None
        result.append(Zero.of(o) if t is None or i in nondiff else t)
    return outs, result


def _function_batch(size, vals, dims, *, call, rule, num_consts, name):
    inner = rule
    while isinstance(inner, _custom._BatchedRule):
        inner = inner.inner
    cls = inner.cls
    nc = num_consts
    if cls.vmap is not _SingleLevelFunction.vmap and rule is inner:
        if any(d is not None for d in dims[:nc]):
            raise FunctxRuntimeError(
                f"vmap of autograd.Function `{name}`: forward closes over a value batched "
                "by vmap; pass it as an argument instead."
            )
        in_dims = [None] * inner.spec.n
        for i, d in zip(inner.spec.array_pos, dims[nc:]):
            in_dims[i] = d
        info = VmapInfo(size, "error")
        with _applying():
            result = cls.vmap(info, tuple(in_dims), *inner.spec.rebuild(vals[nc:]))
        if not isinstance(result, tuple) or len(result) != 2:
            raise FunctxValueError(
                f"autograd.Function `{name}`: the vmap staticmethod must return a pair "
                "(outputs, out_dims)."
            )
        out, out_dims = result
        outs = [out] if inner.single else list(out)
        if isinstance(out_dims, int) or out_dims is None:
            out_dims = [out_dims] * len(outs)
        out_dims = list(out_dims)
        if len(out_dims) != len(outs):
            raise FunctxValueError(
                f"autograd.Function `{name}`: vmap returned {len(out_dims)} out_dims for "
                f"{len(outs)} outputs."
            )
        fixed = []
        for o, d in zip(outs, out_dims):
            if d is not None and d < 0:
                d += aval_of(o).ndim
            fixed.append(d)
        return outs, fixed
    if not cls.generate_vmap_rule:
        raise _no_vmap_rule(cls)
    vals, dims = _custom._to_front(vals, dims)
    brule = _custom._batched_rule(_BatchedFunctionRule, rule, size, vals, dims)
    outs = bind(function_call, *vals, call=_custom.batch_to_front(call, size, dims), rule=brule,
                num_consts=nc, name=f"vmap({name})")
    return outs, [0] * len(outs)


def _no_vmap_rule(cls):
    return FunctxRuntimeError(
        f"vmap: autograd.Function `{cls.__name__}` has neither a vmap staticmethod nor "
        "generate_vmap_rule = True. To use it under vmap, set generate_vmap_rule = True "
        "(functx batches forward and backward for you) or define the vmap staticmethod."
    )


defimpl(function_call, _custom._call_impl)
shape_rules[function_call] = _custom._call_shape
transpose_rules[function_call] = _custom._call_transpose
jvp_rules[function_call] = _function_jvp
batch_rules[function_call] = _function_batch


class VmapInfo:
    """The `info` argument of the vmap staticmethod."""

    def __init__(self, batch_size, randomness):
        self.batch_size = batch_size
        self.randomness = randomness

    def __repr__(self):
        return f"VmapInfo(batch_size={self.batch_size}, randomness={self.randomness!r})"


# --------------------------------------------------------------------------
# Function


def _batched_somewhere(x):
    while isinstance(x, Tracer):
        if type(x) is BatchTracer:
            return True
        x = getattr(x, "primal", None) if hasattr(x, "primal") else getattr(x, "val", None)
    return False


class _SingleLevelFunction:
    generate_vmap_rule = False

    @staticmethod
    def forward(*args, **kwargs):
        raise NotImplementedError("autograd.Function: define the forward staticmethod.")

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise FunctxRuntimeError(
            "autograd.Function: this Function defines no backward staticmethod, so it "
            "cannot be differentiated in reverse mode. Define backward(ctx, *grads)."
        )

    vjp = backward

    @staticmethod
    def jvp(ctx, *grad_inputs):
        raise NotImplementedError

    @staticmethod
    def vmap(info, in_dims, *args):
        raise NotImplementedError


class Function(_SingleLevelFunction):
    """torch.autograd.Function for functx transforms (NOTE [autograd.Function]).

    Subclass it with staticmethods `forward(*args)` + `setup_context(ctx,
    inputs, output)` (or old style `forward(ctx, *args)`), `backward(ctx,
    *grads)` returning one gradient per argument of forward (None for
    non-array arguments), and optionally `jvp(ctx, *tangents)` and
    `vmap(info, in_dims, *args)` or `generate_vmap_rule = True`. Call it
    with `MyFn.apply(*args, **kwargs)` (bound to forward's signature with
    its defaults, as torch does); it then works under grad, vjp, jvp, vmap,
    jacrev, jacfwd, hessian and functx.jit.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fwd = cls.__dict__.get("forward")
        if isinstance(fwd, staticmethod):
            cls.forward = staticmethod(_guard_forward(cls, fwd.__func__))

    def __init__(self, *args, **kwargs):
        raise FunctxRuntimeError(
            "autograd.Function: do not instantiate a Function; call MyFn.apply(*args)."
        )

    def __call__(self, *args, **kwargs):  # pragma: no cover - see __init__
        raise FunctxRuntimeError("autograd.Function: call MyFn.apply(*args).")

    @classmethod
    def apply(cls, *args, **kwargs):
        if any(isinstance(a, ImperativeValue) for a in (*args, *kwargs.values())):
            # autograd tensors (NOTE [imperative mode]): one recorded
            # operation, differentiated through this Function's own rules
            from .imperative import apply as record

            return record(cls.apply, args, kwargs, functx_fn=True)
        _check_style(cls, len(args) + len(kwargs))
        args, required = _bind_arguments(cls, args, kwargs)
        tracers = [a for a in args if isinstance(a, Tracer)]
        if not tracers and not interpreter_stack():
            ctx = FunctionCtx([isinstance(a, _ARRAYS) and _custom.is_float(aval_of(a))
                               for a in args])
            return _run_forward(cls, ctx, list(args))
        if (cls.vmap is _SingleLevelFunction.vmap and not cls.generate_vmap_rule
                and any(_batched_somewhere(a) for a in tracers)):
            raise _no_vmap_rule(cls)
        spec = _Spec(args, required)
        try:
            key = spec.key()
            cache = cls.__dict__.get("_functx_cache")
            if cache is None:
                cache = {}
                type.__setattr__(cls, "_functx_cache", cache)
            entry = cache.get(key)
        except TypeError:
            key = cache = entry = None
        if entry is None:
            info = {}

            def flat_fn(*xs):
                ctx = FunctionCtx([_custom.is_float(a) for a in spec.avals])
                out = _run_forward(cls, ctx, spec.rebuild(list(xs)))
                outs, info["single"] = _flat_outputs(cls, out)
                return outs

            graph, closure = stage(flat_fn, list(spec.avals), f"autograd.Function {cls.__name__}")
            n_in = len(spec.avals)
            graph = Graph(graph.inputs[n_in:] + graph.inputs[:n_in], graph.eqns, graph.outputs)
            rule = _FunctionRule(cls, spec, len(closure), closure, info["single"],
                                 graph.out_avals)
            entry = (graph, rule, closure)
            if cache is not None and not closure:
                if len(cache) > 128:
                    cache.clear()
                cache[key] = (graph, rule, ())
        graph, rule, closure = entry
        arrays = [args[i] for i in spec.array_pos]
        outs = bind(function_call, *closure, *arrays, call=graph, rule=rule,
                    num_consts=len(closure), name=cls.__name__)
        return outs[0] if rule.single else tuple(outs)


def _guard_forward(cls, fn):
    """Refuse `MyFn.forward(x)` on functx values outside `apply`: its
    derivative would be that of forward's body, not the user's backward."""

    def forward(*args, **kwargs):
        if not _state.in_apply and any(isinstance(a, Tracer) for a in args):
            raise FunctxRuntimeError(
                f"autograd.Function `{cls.__name__}`: forward was called directly on "
                "values of a functx transform. Call it as "
                f"`{cls.__name__}.apply(*args)` so that its backward / jvp / vmap rules "
                "are used."
            )
        return fn(*args, **kwargs)

    forward.__wrapped__ = fn
    forward.__name__ = getattr(fn, "__name__", "forward")
    try:
        forward.__signature__ = inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    return forward


def once_differentiable(fn):
    """torch's decorator for backward; a no-op in functx (backward is
    differentiated like any functx code)."""
    return fn
