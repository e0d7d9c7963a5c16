"""`functx.custom_jvp` and `functx.custom_vjp`: JAX-style decorators that
give a function its own derivative rule.

Written like JAX's::

    @functx.custom_jvp
    def f(x):
        return fnp.log1p(fnp.exp(x))

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), t * functx.nn.sigmoid(x)

    @functx.custom_vjp
    def g(x):
        return x
    g.defvjp(lambda x: (x, None), lambda res, ct: (fnp.clip(ct, -1, 1),))

The rules are plain Python functions of functx values (functx.numpy,
functx.lax, or lifted JAX code). Under a functx transform a call binds the
primitive `custom_jvp_call` / `custom_vjp_call` (functx/primitives/custom.py,
NOTE [custom derivative rules]): the function is staged once per argument
shapes and dtypes, and the rules are called by the derivative rules of those
primitives, so the custom derivative holds under grad, vjp, jvp, vmap,
jacrev, jacfwd, hessian and functx.jit, in any nesting. `jvp` / `jacfwd` /
`hessian` of a custom_vjp function also work: forward mode transposes bwd
(NOTE [forward mode of custom_vjp]), so bwd must be linear in the
cotangents there.

Outside functx transforms the call goes to the equivalent `jax.custom_jvp`
/ `jax.custom_vjp`, so JAX's own transforms (jax.grad of a function using
it) see the same rules; so does the evaluation of the primitive while JAX
traces (a functx custom function inside lifted JAX code keeps its rule).

Arguments listed in `nondiff_argnums` are passed to the rules first (to
custom_vjp's fwd in place, as in JAX); they get no derivative (arrays among
them are stop_gradient-ed).
With symbolic_zeros=True, as in JAX: the jvp rule gets a SymbolicZero for
each input whose tangent is a functx Zero; fwd gets CustomVJPPrimal leaves,
`perturbed` being which primals carry tangents (`perturbed.flags` in
primitives/custom.py, set while fwd runs); bwd gets a SymbolicZero for a
Zero cotangent. Python scalars among fwd's residuals ride in the residual
structure, not among the traced residuals, so bwd sees them as they are.
A function may close over values of enclosing transforms, except a value
being differentiated (its rule cannot say how the output depends on it) or,
for a custom_vjp under vmap, a batched value: those raise, asking for the
value as an argument (NOTE [batched custom rules]).
"""

import copy
import functools
import inspect

import jax
import numpy as np
from jax import tree_util
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from .caches import WeaklyKeyed
from .core import Tracer, Zero, aval_of, bind, interpreter_stack
from .errors import FunctxTypeError, FunctxValueError
from .interpreters.staging import Graph, stage
from .lifting import _StaticKey
from .primitives.custom import (
    custom_jvp_call,
    custom_vjp_call,
    is_float,
    perturbed,
    tangent_value,
)

__all__ = ["custom_jvp", "custom_vjp"]

_CACHE_LIMIT = 256
_ARRAYS = (Tracer, jax.Array, np.ndarray, np.generic)
_SCALARS = (bool, int, float, complex)


def _name(fn):
    return getattr(fn, "__name__", None) or type(fn).__name__


def _tree_str(tree):
    try:
        return str(tree_util.tree_unflatten(tree, ["*"] * tree.num_leaves)).replace("'", "")
    except Exception:  # noqa: BLE001 - a description only
        return str(tree)


def _resolve_args(fun, args, kwargs, what):
    """Keyword arguments bound to their positions (as JAX does)."""
    if not kwargs:
        return tuple(args)
    try:
        bound = inspect.signature(fun).bind(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise FunctxTypeError(
            f"{what}: the arguments could not be matched to the parameters of "
            f"`{_name(fun)}` ({e}). Pass them positionally."
        ) from None
    bound.apply_defaults()
    if bound.kwargs:
        raise FunctxTypeError(
            f"{what}: keyword-only arguments {sorted(bound.kwargs)} cannot be passed to a "
            f"function with a custom derivative. Make them positional, or close over them."
        )
    return tuple(bound.args)


class _Spec:
    """How one call's arguments map to the primitive's inputs: the
    nondiff_argnums arguments (static leaves kept, array leaves passed as
    consts) and the differentiable leaves."""

    def __init__(self, owner, args):
        n = len(args)
        for i in owner.nondiff_argnums:
            if not 0 <= i < n:
                raise FunctxValueError(
                    f"{owner.kind} function `{owner.__name__}`: nondiff_argnums="
                    f"{owner.nondiff_argnums} names argument {i}, but the call passes {n} "
                    "positional arguments. Fix nondiff_argnums or the call."
                )
        self.n_args = n
        self.nondiff = owner.nondiff_argnums
        self.diff_idx = [i for i in range(n) if i not in self.nondiff]
        nd_leaves, self.nd_tree = tree_util.tree_flatten([args[i] for i in self.nondiff])
        self.nd_pos = [k for k, x in enumerate(nd_leaves) if isinstance(x, _ARRAYS)]
        self.nd_template = [None if isinstance(x, _ARRAYS) else x for x in nd_leaves]
        self.nd_dynamic = [nd_leaves[k] for k in self.nd_pos]
        leaves, self.in_tree = tree_util.tree_flatten(tuple(args[i] for i in self.diff_idx))
        for x in leaves:
            if not isinstance(x, _ARRAYS + _SCALARS):
                raise FunctxTypeError(
                    f"{owner.kind} function `{owner.__name__}`: an argument holds a "
                    f"{type(x).__name__}, which is not an array. List that argument in "
                    "nondiff_argnums, or close over it."
                )
        self.leaves = leaves
        self.avals = tuple(aval_of(x) for x in leaves)

    def layout(self):
        """A copy without this call's values (what the cached rules keep)."""
        layout = copy.copy(self)
        layout.leaves = layout.nd_dynamic = None
        return layout

    def key(self):
        return (self.n_args, self.in_tree, self.avals, self.nd_tree,
                tuple(_StaticKey(x) for x in self.nd_template),
                tuple(aval_of(x) for x in self.nd_dynamic))

    def rebuild(self, nd_values, leaves):
        """(all positional arguments, the nondiff arguments, the tuple of
        differentiable arguments) from the dynamic values."""
        nd = list(self.nd_template)
        for k, v in zip(self.nd_pos, nd_values, strict=True):
            nd[k] = v
        nd_args = tree_util.tree_unflatten(self.nd_tree, nd)
        diff_args = tree_util.tree_unflatten(self.in_tree, list(leaves))
        full = [None] * self.n_args
        for i, a in zip(self.nondiff, nd_args):
            full[i] = a
        for i, a in zip(self.diff_idx, diff_args):
            full[i] = a
        return full, nd_args, diff_args


class _Staged:
    """A custom function staged for one argument signature: its graph
    (inputs: closed-over values, nondiff arrays, differentiable leaves), the
    closed-over values, its output structure and avals, and its rule
    object."""

    __slots__ = ("graph", "closure", "out_tree", "out_avals", "rule", "spec")


def _stage_primal(owner, spec):
    out = {}

    def flat_fn(*xs):
        nd_n = len(spec.nd_pos)
        full, _, _ = spec.rebuild(xs[:nd_n], xs[nd_n:])
        leaves, out["tree"] = tree_util.tree_flatten(owner.fun(*full))
        for x in leaves:
            if not isinstance(x, _ARRAYS + _SCALARS):
                raise FunctxTypeError(
                    f"{owner.kind} function `{owner.__name__}` returned a "
                    f"{type(x).__name__}; it must return arrays (a pytree of arrays). Return "
                    "other values through a closure, or compute them outside the function."
                )
        return leaves

    in_avals = [aval_of(x) for x in spec.nd_dynamic] + list(spec.avals)
    graph, closure = stage(flat_fn, in_avals, owner.kind)
    n_in = len(in_avals)
    staged = _Staged()
    staged.graph = Graph(graph.inputs[n_in:] + graph.inputs[:n_in], graph.eqns, graph.outputs)
    staged.closure = closure
    staged.out_tree = out["tree"]
    staged.out_avals = graph.out_avals
    staged.spec = spec.layout()
    return staged


def _prepare(owner, args):
    """The staged form of `owner` for these arguments (cached when it
    closes over no traced value)."""
    spec = _Spec(owner, args)
    key = spec.key()
    staged = owner._staged.get(key)
    if staged is None:
        staged = _stage_primal(owner, spec)
        staged.rule = owner._rule_type(owner, staged)
        if not staged.closure:
            if len(owner._staged) >= _CACHE_LIMIT:
                owner._staged.clear()
            owner._staged[key] = staged
    return spec, staged


def _interps_of(values):
    """The interpreter of each closed-over value (None for a JAX value): what
    the batch rules need to know about them, without holding the values."""
    return [x._interp if isinstance(x, Tracer) else None for x in values]


def _stop_gradient(x):
    if isinstance(x, Tracer):
        from .primitives.elementwise import stop_gradient

        return stop_gradient(x)
    return x


def _use_functx(args):
    """Whether a call binds functx's primitive: whenever a functx transform
    is active (an argument, or a value the function closes over, may be a
    functx value). Otherwise the call goes to the jax.custom_jvp /
    custom_vjp twin, so JAX's own transforms see the same rule."""
    return bool(interpreter_stack()) or any(
        isinstance(x, Tracer) for x in tree_util.tree_leaves(args))


def _bind(prim, owner, args, rule_param):
    spec, staged = _prepare(owner, args)
    consts = list(staged.closure) + [_stop_gradient(x) for x in spec.nd_dynamic]
    if staged.closure:  # not cached: let the values go with this call
        staged.closure = ()
    outs = bind(prim, *consts, *spec.leaves, call=staged.graph,
                **{rule_param: staged.rule}, num_consts=len(consts), name=owner.__name__)
    return tree_util.tree_unflatten(staged.out_tree, outs)


# --------------------------------------------------------------------------
# Checking what the rules return


def _fix_dtype(x, aval):
    """A weakly typed rule output (a Python scalar) takes the dtype it
    stands for."""
    a = aval_of(x)
    if a.dtype != aval.dtype and a.weak_type:
        from .primitives.elementwise import convert_element_type

        return convert_element_type(x, aval.dtype)
    return x


def _check_primal_out(owner, rule_name, out, staged, what):
    leaves, tree = tree_util.tree_flatten(out)
    fn = owner.__name__
    if tree != staged.out_tree:
        raise FunctxValueError(
            f"{owner.kind} function `{fn}`: the {what} `{rule_name}` returned a primal "
            f"output with structure {_tree_str(tree)}, but `{fn}` returns "
            f"{_tree_str(staged.out_tree)}. Return `{fn}(*args)` (or the same values) "
            "as the primal output."
        )
    checked = []
    for i, (x, a) in enumerate(zip(leaves, staged.out_avals)):
        if not isinstance(x, _ARRAYS + _SCALARS):
            raise FunctxTypeError(
                f"{owner.kind} function `{fn}`: the {what} `{rule_name}` returned a "
                f"{type(x).__name__} as primal output leaf {i}; return arrays."
            )
        x = _fix_dtype(x, a)
        b = aval_of(x)
        if b.shape != a.shape or b.dtype != a.dtype:
            raise FunctxValueError(
                f"{owner.kind} function `{fn}`: the {what} `{rule_name}` returned a primal "
                f"output {b.str_short()} at leaf {i}, but `{fn}` returns {a.str_short()} "
                f"there. Return `{fn}(*args)` (or the same values) as the primal output."
            )
        checked.append(x)
    return checked


def _jax_call(rule, primals):
    """The function applied by its JAX twin (no consts: see
    primitives/custom.py `_call_impl`); flat outputs."""
    full, _, _ = rule.staged.spec.rebuild([], primals)
    return tree_util.tree_leaves(rule.owner._jax_version()(*full))


class _UserRule(WeaklyKeyed):
    """What the rule objects (NOTE [custom derivative rules]) of
    functx.custom_jvp and functx.custom_vjp functions share: the owner, its
    staged function for one argument signature, and the JAX twin's call."""

    kind = None
    describes = None  # "jvp" or "fwd/bwd", for the repr

    def __init__(self, owner, staged):
        self.owner = owner
        self.staged = staged
        self.n_closure = len(staged.closure)
        self.closure_interps = _interps_of(staged.closure)
        self.primal_avals = list(staged.spec.avals)
        self.name = owner.__name__
        self.handles = {}

    def __repr__(self):
        return f"{self.describes} of {self.name}"

    def jax_call(self, primals):
        return _jax_call(self, primals)


class _UserJVPRule(_UserRule):
    """The jvp rule object of a functx.custom_jvp function, for one argument
    signature."""

    kind = "custom_jvp"
    describes = "jvp"

    def __call__(self, consts, primals, tangents):
        owner, staged, spec = self.owner, self.staged, self.staged.spec
        _, nd_args, diff_args = spec.rebuild(consts[self.n_closure:], primals)
        ts = [_symbolic_zero(a) if owner.symbolic_zeros and type(t) is Zero
              else tangent_value(t, a) for t, a in zip(tangents, self.primal_avals)]
        t_args = tree_util.tree_unflatten(spec.in_tree, ts)
        rule = owner.jvp
        rule_name = _name(rule)
        result = rule(*nd_args, diff_args, t_args)
        fn = owner.__name__
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise FunctxValueError(
                f"custom_jvp function `{fn}`: the jvp rule `{rule_name}` must return a pair "
                f"(primal_out, tangent_out), got {type(result).__name__}"
                f"{'' if not isinstance(result, (tuple, list)) else f' of length {len(result)}'}. "
                f"Return `{fn}(*primals), tangent_out`."
            )
        outs = _check_primal_out(owner, rule_name, result[0], staged, "jvp rule")
        t_leaves, t_tree = tree_util.tree_flatten(result[1])
        if t_tree != staged.out_tree:
            raise FunctxValueError(
                f"custom_jvp function `{fn}`: the jvp rule `{rule_name}` returned a tangent "
                f"with structure {_tree_str(t_tree)}, but the output has structure "
                f"{_tree_str(staged.out_tree)}. Return one tangent per output, in the "
                "output's structure."
            )
        touts = []
        for i, (t, a) in enumerate(zip(t_leaves, staged.out_avals)):
            if not is_float(a) or isinstance(t, SymbolicZero):
                touts.append(_zero(a))
                continue
            if not isinstance(t, _ARRAYS + _SCALARS):
                raise FunctxTypeError(
                    f"custom_jvp function `{fn}`: the jvp rule `{rule_name}` returned a "
                    f"{type(t).__name__} as tangent leaf {i}; return arrays."
                )
            t = _fix_dtype(t, a)
            b = aval_of(t)
            if b.shape != a.shape or b.dtype != a.dtype:
                raise FunctxValueError(
                    f"custom_jvp function `{fn}`: the jvp rule `{rule_name}` returned a "
                    f"tangent {b.str_short()} for the output {a.str_short()} at leaf {i}. "
                    f"A tangent has its primal's shape and dtype: return a {a.str_short()} "
                    f"there (e.g. cast it with .astype({a.dtype.name}))."
                )
            touts.append(t)
        return outs, touts


def _zero(aval):
    return Zero(aval)


def _symbolic_zero(aval):
    """JAX's marker for a zero tangent, given to rules defined with
    symbolic_zeros=True."""
    return SymbolicZero(jax.core.ShapedArray(aval.shape, aval.dtype).to_tangent_aval())


class _UserVJPRule(_UserRule):
    """The fwd/bwd rule object of a functx.custom_vjp function, for one
    argument signature. The nondiff arrays ride along at the end of the
    residuals, so bwd gets them back under every transform."""

    kind = "custom_vjp"
    describes = "fwd/bwd"

    def fwd(self, consts, primals):
        owner, staged, spec = self.owner, self.staged, self.staged.spec
        nd_values = list(consts[self.n_closure:])
        if owner.symbolic_zeros:  # JAX's CustomVJPPrimal per differentiable leaf
            flags = perturbed.flags or (True,) * len(primals)
            full, _, _ = spec.rebuild(nd_values, [
                CustomVJPPrimal(p, bool(f) and is_float(a))
                for p, f, a in zip(primals, flags, self.primal_avals, strict=True)])
        else:
            full, _, _ = spec.rebuild(nd_values, primals)
        fwd = owner.fwd
        fwd_name = _name(fwd)
        fn = owner.__name__
        result = fwd(*full)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise FunctxValueError(
                f"custom_vjp function `{fn}`: the fwd rule `{fwd_name}` must return a pair "
                f"(primal_out, residuals), got {type(result).__name__}. Return "
                f"`{fn}(*args), residuals`."
            )
        outs = _check_primal_out(owner, fwd_name, result[0], staged, "fwd rule")
        leaves, res_tree = tree_util.tree_flatten(result[1])
        for x in leaves:
            if not isinstance(x, _ARRAYS + _SCALARS):
                raise FunctxTypeError(
                    f"custom_vjp function `{fn}`: the fwd rule `{fwd_name}` returned a "
                    f"{type(x).__name__} among its residuals; residuals must be arrays. "
                    "Pass non-array values through nondiff_argnums or a closure."
                )
        # Python scalars among the residuals (a `.perturbed` flag, a count)
        # reach bwd as they are, as in JAX, so that bwd may branch on them:
        # they ride in the structure, not among the traced residuals.
        statics = tuple((i, x) for i, x in enumerate(leaves) if isinstance(x, _SCALARS))
        res = [x for x in leaves if not isinstance(x, _SCALARS)]
        return outs, res + nd_values, (res_tree, len(nd_values), statics)

    def bwd(self, res_tree, res, cts):
        owner, staged, spec = self.owner, self.staged, self.staged.spec
        tree, n_nd, statics = res_tree
        n_res = len(res) - n_nd
        arrays, fixed = iter(res[:n_res]), dict(statics)
        res_obj = tree_util.tree_unflatten(tree, [
            fixed[i] if i in fixed else next(arrays) for i in range(n_res + len(statics))])
        _, nd_args, _ = spec.rebuild(list(res[n_res:]), [None] * len(self.primal_avals))
        ct_vals = [c if type(c) is not Zero else
                   _symbolic_zero(c.aval) if owner.symbolic_zeros else tangent_value(c, c.aval)
                   for c in cts]
        ct_obj = tree_util.tree_unflatten(staged.out_tree, ct_vals)
        bwd = owner.bwd
        bwd_name = _name(bwd)
        fn = owner.__name__
        result = bwd(*nd_args, res_obj, ct_obj)
        n_diff = len(spec.diff_idx)
        if isinstance(result, list) and len(result) == n_diff:
            result = tuple(result)
        if not isinstance(result, tuple) or len(result) != n_diff:
            got = (f"a {type(result).__name__}" if not isinstance(result, (tuple, list))
                   else f"{len(result)} entries")
            raise FunctxValueError(
                f"custom_vjp function `{fn}`: the bwd rule `{bwd_name}` must return a tuple "
                f"with one cotangent per differentiable argument ({n_diff}), got {got}. "
                "Return a tuple such as `(ct_x,)`, with None for an argument without one."
            )
        # One entry per leaf of the differentiable arguments; None (for a
        # whole argument or a subtree) means a zero cotangent.
        sentinel = tree_util.tree_unflatten(spec.in_tree, list(range(spec.in_tree.num_leaves)))
        flat = [None] * spec.in_tree.num_leaves

        def place(ct, sub):
            idx = tree_util.tree_leaves(sub)
            if ct is None or isinstance(ct, SymbolicZero):
                return
            if not isinstance(sub, int):
                raise ValueError
            flat[idx[0]] = ct

        try:
            tree_util.tree_map(place, result, sentinel, is_leaf=lambda x: x is None)
        except ValueError:
            raise FunctxValueError(
                f"custom_vjp function `{fn}`: the bwd rule `{bwd_name}` returned cotangents "
                f"with structure {_tree_str(tree_util.tree_structure(result))}, but the "
                f"differentiable arguments have structure {_tree_str(spec.in_tree)}. Return "
                "one cotangent per argument, in the argument's structure (None for none)."
            ) from None
        out = []
        for i, (c, a) in enumerate(zip(flat, self.primal_avals)):
            if c is None or not is_float(a):
                out.append(_zero(a))
                continue
            if not isinstance(c, _ARRAYS + _SCALARS):
                raise FunctxTypeError(
                    f"custom_vjp function `{fn}`: the bwd rule `{bwd_name}` returned a "
                    f"{type(c).__name__} as cotangent leaf {i}; return arrays or None."
                )
            c = _fix_dtype(c, a)
            b = aval_of(c)
            if b.shape != a.shape or b.dtype != a.dtype:
                raise FunctxValueError(
                    f"custom_vjp function `{fn}`: the bwd rule `{bwd_name}` returned a "
                    f"cotangent {b.str_short()} for the input {a.str_short()} at leaf {i}. "
                    f"A cotangent has its input's shape and dtype: return a {a.str_short()} "
                    f"there (e.g. cast it with .astype({a.dtype.name}))."
                )
            out.append(c)
        return out


# --------------------------------------------------------------------------
# The decorators


class _CustomBase:
    def __init__(self, fun, nondiff_argnums):
        if not callable(fun):
            raise FunctxTypeError(
                f"{self.kind}(fun): expected a function, got {type(fun).__name__}. "
                f"Use it as a decorator: @functx.{self.kind}."
            )
        functools.update_wrapper(self, fun)
        self.__name__ = _name(fun)
        self.fun = fun
        try:
            nums = tuple(int(i) for i in nondiff_argnums)
        except TypeError:
            raise FunctxTypeError(
                f"{self.kind}({_name(fun)}, nondiff_argnums=...): nondiff_argnums must be a "
                f"tuple of ints, got {nondiff_argnums!r}. Give argument positions, e.g. "
                "nondiff_argnums=(1,)."
            ) from None
        if len(set(nums)) != len(nums) or any(i < 0 for i in nums):
            raise FunctxValueError(
                f"{self.kind}({_name(fun)}, nondiff_argnums={nondiff_argnums!r}): "
                "nondiff_argnums must list distinct non-negative positions. List each "
                "position once, counting from 0."
            )
        self.nondiff_argnums = nums
        self._staged = {}
        self._jax = None

    def _reset(self):
        self._staged = {}
        self._jax = None

    def __call__(self, *args, **kwargs):
        what = f"{self.kind} function `{self.__name__}`"
        self._check_defined()
        args = _resolve_args(self.fun, args, kwargs, what)
        if not _use_functx(args):
            return self._jax_version()(*args)
        return _bind(self._prim, self, args, self._rule_param)


class custom_jvp(_CustomBase):
    """A function with a custom forward-mode derivative rule (JAX's
    `jax.custom_jvp`, for functx transforms).

    Args:
      fun (Callable): the function; its derivative is never taken through its
        body.
      nondiff_argnums (tuple[int, ...]): positions of arguments that are not
        differentiated (they are passed to the rule first: `jvp(*nondiff,
        primals, tangents)`).

    Define the rule with `@f.defjvp` (`rule(primals, tangents) ->
    (primal_out, tangent_out)`, the tangent linear in `tangents`) or with
    `f.defjvps(*per_argument_rules)`. Reverse mode transposes the rule's
    tangent computation, so grad/vjp/jacrev/hessian all use it.

    Example:
      >>> @functx.custom_jvp
      ... def relu(x):
      ...     return fnp.maximum(x, 0.0)
      >>> relu.defjvp(lambda p, t: (relu(p[0]), fnp.where(p[0] > 0, t[0], 0.0)))
      >>> functx.vmap(functx.grad(relu))(fnp.array([-1.0, 0.0, 2.0]))  # [0, 0, 1]
    """

    kind = "custom_jvp"
    _prim = custom_jvp_call
    _rule_param = "jvp"
    _rule_type = _UserJVPRule

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.jvp = None
        self.symbolic_zeros = False

    def defjvp(self, jvp, symbolic_zeros=False):
        """Set the jvp rule; returns it, so it can be used as a decorator."""
        if not callable(jvp):
            raise FunctxTypeError(
                f"{self.__name__}.defjvp(jvp): custom_jvp function `{self.__name__}` expects "
                f"`jvp` to be a function (primals, tangents) -> (primal_out, tangent_out), got "
                f"{type(jvp).__name__} {jvp!r}. Pass the rule itself, e.g. decorate "
                f"`def {self.__name__}_jvp(primals, tangents): ...` with @{self.__name__}.defjvp."
            )
        self.jvp = jvp
        self.symbolic_zeros = bool(symbolic_zeros)
        self._reset()
        return jvp

    def defjvps(self, *jvps):
        """One rule per positional argument, `rule(t, primal_out, *primals)
        -> that argument's contribution to the output tangent` (None: the
        argument does not contribute)."""
        if self.nondiff_argnums:
            raise FunctxTypeError(
                f"{self.__name__}.defjvps(*jvps): custom_jvp function `{self.__name__}` has "
                "nondiff_argnums, which defjvps does not support. Define the rule with "
                f"@{self.__name__}.defjvp instead."
            )

        def jvp(primals, tangents):
            out = self(*primals)
            total = None
            for rule, t in zip(jvps, tangents, strict=True):
                if rule is None:
                    continue
                c = rule(t, out, *primals)
                total = c if total is None else tree_util.tree_map(lambda a, b: a + b, total, c)
            if total is None:
                from . import numpy as fnp

                total = tree_util.tree_map(fnp.zeros_like, out)
            return out, total

        jvp.__name__ = "defjvps rule"
        self.defjvp(jvp)

    def _check_defined(self):
        if self.jvp is None:
            raise FunctxTypeError(
                f"custom_jvp function `{self.__name__}` was called before its rule was "
                f"defined. Define it with @{self.__name__}.defjvp (or "
                f"{self.__name__}.defjvps) first."
            )

    def _jax_version(self):
        if self._jax is None:
            j = jax.custom_jvp(self.fun, nondiff_argnums=self.nondiff_argnums)
            j.defjvp(self.jvp, symbolic_zeros=self.symbolic_zeros)
            self._jax = j
        return self._jax


class custom_vjp(_CustomBase):
    """A function with a custom reverse-mode derivative rule (JAX's
    `jax.custom_vjp`, for functx transforms).

    Args:
      fun (Callable): the function; its derivative is never taken through its
        body.
      nondiff_argnums (tuple[int, ...]): positions of arguments that are not
        differentiated (passed to `fwd` in place, to `bwd` first: `bwd(*nondiff,
        res, ct)`).

    Define the rules with `f.defvjp(fwd, bwd)`: `fwd(*args) -> (out,
    residuals)`, `bwd(residuals, ct_out) -> tuple with one cotangent per
    differentiable argument` (None for none). Unlike JAX, forward mode (jvp,
    jacfwd, hessian) works too, by transposing bwd, which must then be
    linear in `ct_out`.

    Example:
      >>> @functx.custom_vjp
      ... def clip_gradient(x):
      ...     return x
      >>> clip_gradient.defvjp(lambda x: (x, None),
      ...                      lambda _, g: (fnp.clip(g, -1.0, 1.0),))
      >>> functx.grad(lambda x: 3.0 * clip_gradient(x))(2.0)  # 1.0
    """

    kind = "custom_vjp"
    _prim = custom_vjp_call
    _rule_param = "rule"
    _rule_type = _UserVJPRule

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.fwd = None
        self.bwd = None
        self.symbolic_zeros = False

    def defvjp(self, fwd, bwd, symbolic_zeros=False, optimize_remat=False):
        """Set the forward rule `fwd(*args) -> (out, residuals)` and the
        backward rule `bwd(*nondiff, residuals, ct) -> cotangents`."""
        for what, rule in (("fwd", fwd), ("bwd", bwd)):
            if not callable(rule):
                raise FunctxTypeError(
                    f"{self.__name__}.defvjp(fwd, bwd): custom_vjp function "
                    f"`{self.__name__}` expects functions fwd(*args) -> (out, residuals) and "
                    f"bwd(residuals, ct) -> cotangents, got {type(rule).__name__} {rule!r} as "
                    f"`{what}`. Pass the two rule functions themselves."
                )
        self.fwd = fwd
        self.bwd = bwd
        self.symbolic_zeros = bool(symbolic_zeros)
        self._reset()

    def _check_defined(self):
        if self.fwd is None:
            raise FunctxTypeError(
                f"custom_vjp function `{self.__name__}` was called before its rules were "
                f"defined. Define them with {self.__name__}.defvjp(fwd, bwd) first."
            )

    def _jax_version(self):
        if self._jax is None:
            j = jax.custom_vjp(self.fun, nondiff_argnums=self.nondiff_argnums)
            j.defvjp(self.fwd, self.bwd, symbolic_zeros=self.symbolic_zeros)
            self._jax = j
        return self._jax
