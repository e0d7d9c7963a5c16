"""Reverse-mode transforms: vjp, grad, grad_and_value."""

import functools

import jax
from jax import tree_util

from ..core import (
    Zero,
    aval_of,
    is_complex_dtype,
    is_inexact_dtype,
    is_real_float_dtype,
    new_interpreter,
)
from ..core import _state as _core_state
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.deferred import input_aval, values
from ..interpreters.deferred import value as value_of
from ..interpreters.reverse import ReverseInterpreter
from ..primitives.call import differentiating_alone
from ..primitives.common import scalar_constant
from . import _args
from ._linear_fn import LinearFunction


class ReverseResult:
    """What running a function under a reverse interpreter leaves behind:
    outputs, their tree and avals, the recorded linear map, the input tree,
    which input leaves were differentiated (`mask`) and their avals, the
    avals of the integer leaves let through by allow_int (`ints`: an Aval
    for those, None elsewhere), aux."""

    __slots__ = (
        "aux",
        "in_avals",
        "in_tree",
        "ints",
        "linear",
        "mask",
        "out",
        "out_avals",
        "out_tree",
    )


def linearize_reverse(func, primals, has_aux, call, names=None, allow_int=None,
                      holomorphic=False, queued=False, call_args=None):
    """Run `func(*primals)` recording its linearization (NOTE [reverse mode =
    jvp + staging + transpose] in interpreters/reverse.py). With `queued`,
    the outputs and the map's residuals may still be queued values (NOTE
    [one program per gradient]): the caller pulls back at once and forces
    what it returns. `call_args`: all the arguments of the user's call
    (`(args, kwargs)`), of which `primals` are some (NOTE [speculative
    first program])."""
    names = names or [f"primal {i}" for i in range(len(primals))]
    leaves, in_tree, mask, ints = _args.differentiable_leaves(primals, call, names, allow_int,
                                                              holomorphic)
    interp = ReverseInterpreter(call.split("(")[0])
    if not _core_state.stack:  # NOTE [speculative first program]
        interp.queue.top_call(interp.transform, leaves if call_args is None
                              else tree_util.tree_leaves(call_args))
    r = ReverseResult()
    with new_interpreter(interp):
        boxed = [interp.new_input(x) if m else x for x, m in zip(leaves, mask)]
        out = func(*tree_util.tree_unflatten(in_tree, boxed))
        aux = None
        if has_aux:
            out, aux = _args.split_aux(out, call)
        out_flat, r.out_tree = _args.flatten_outputs(out, call)
        r.linear = interp.linear_map([b for b, m in zip(boxed, mask) if m], out_flat,
                                     queued=queued)
        if queued:
            r.out = [interp.raw_primal(o) for o in out_flat]
        else:
            r.out = [interp.unbox(o)[0] for o in out_flat]
        if has_aux:
            aux = tree_util.tree_map(lambda x: interp.unbox(x)[0], aux)
    r.out_avals = [input_aval(o) for o in r.out]
    r.in_tree = in_tree
    r.mask = mask
    r.ints = [aval_of(x) if i else None for x, i in zip(leaves, ints)]
    r.in_avals = [aval_of(x) for x, m in zip(leaves, mask) if m]
    r.aux = aux
    return r


def pull_back(r, cts):
    """Cotangents of the differentiated input leaves (zeros materialised) for
    flat output cotangents."""
    return [_args.zeros_for(a) if type(c) is Zero else c
            for c, a in zip(r.linear.backward(cts), r.in_avals)]


def with_static(r, diff_values, int_value=_args.float0_zeros):
    """All input leaves: `diff_values` for the differentiated ones,
    `int_value(aval)` for the integer ones let through by allow_int (float0
    zeros), None for the static ones."""
    it = iter(diff_values)
    return [next(it) if m else (None if a is None else int_value(a))
            for m, a in zip(r.mask, r.ints)]


def output_path(tree, k):
    """How messages name output leaf `k` of an output with structure `tree`."""
    if tree.num_leaves == 1 and tree == tree_util.tree_structure(0):
        return "the output"
    paths = tree_util.tree_flatten_with_path(tree_util.tree_unflatten(tree, [0] * tree.num_leaves))[0]
    return "output" + tree_util.keystr(paths[k][0])


def check_holomorphic_outputs(r, call):
    """holomorphic=True promises complex outputs (as JAX checks)."""
    for k, a in enumerate(r.out_avals):
        if not is_complex_dtype(a.dtype):
            raise FunctxTypeError(
                f"{call}: with holomorphic=True every output must be complex, but "
                f"{output_path(r.out_tree, k)} is {a.str_short()}. Make the function return "
                "complex values, or drop holomorphic=True."
            )


def _weak_fits(got, expected):
    """A weakly typed cotangent of dtype `got` (a Python number) takes the
    dtype `expected` of its output, as JAX's promotion would give it."""
    if is_complex_dtype(got):
        return is_complex_dtype(expected)
    return is_inexact_dtype(expected)


def _cotangent(c, a, tree, k, call):
    """Cotangent `c` for output leaf `k` (aval `a`), checked: the output's
    dtype (a weak Python number is cast to it); any value for an integer,
    bool or key output, whose cotangent JAX types float0 and no rule reads."""
    if not is_inexact_dtype(a.dtype):
        return Zero(a)
    got = aval_of(c)
    if got.dtype == a.dtype:
        return c
    if got.weak_type and _weak_fits(got.dtype, a.dtype):
        from ..primitives.elementwise import convert_element_type

        return convert_element_type(c, a.dtype)
    raise FunctxValueError(
        f"{call}: the cotangent for {output_path(tree, k)} ({a.str_short()}) has dtype "
        f"{got.dtype.name}; a cotangent must have its output's dtype, "
        f"{a.dtype.name}. Cast it with .astype({a.dtype.name})."
    )


class _VJPSpec:
    __slots__ = ("in_avals", "in_tree", "ints", "mask", "out_avals", "out_tree")

    def __init__(self, r):
        for name in self.__slots__:
            setattr(self, name, getattr(r, name))


@tree_util.register_pytree_node_class
class VJPFunction(LinearFunction):
    """The `vjp_fn` of `functx.vjp`: `vjp_fn(cotangents)` pulls cotangents
    of the output back to the primals (a tuple, one per primal). Callable
    many times; a pytree whose leaves are its residuals (NOTE [linear
    functions are pytrees]), so it can be returned from `jax.jit`."""

    __slots__ = ()
    _name = "vjp_fn"

    def __call__(self, *args, retain_graph=True, create_graph=None):
        call = "vjp_fn(cotangents)"
        if len(args) != 1:
            raise FunctxTypeError(
                f"{call}: expected one argument, the cotangents in the structure of the "
                f"output, got {len(args)} arguments. Pass the cotangents of several "
                "outputs as one tuple: vjp_fn((ct_a, ct_b))."
            )
        if self._unchecked:
            self._check_leaves(call)
        (cotangents,) = args
        spec = self._spec
        flat, tree = tree_util.tree_flatten(cotangents)
        if tree != spec.out_tree and len(spec.out_avals) == 1 and isinstance(cotangents, tuple) \
                and len(cotangents) == 1:
            flat, tree = tree_util.tree_flatten(cotangents[0])
        _args.check_same_structure(
            spec.out_tree, tree, call, "cotangents",
            "Pass one cotangent per output, in the output's structure.",
        )
        flat = [_args.as_array(c, call, "a cotangent") for c in flat]
        _args.check_same_avals(spec.out_avals, flat, call, "cotangent", check_dtype=False)
        flat = [_cotangent(c, a, spec.out_tree, k, call)
                for k, (c, a) in enumerate(zip(flat, spec.out_avals))]
        cts = [_args.zeros_for(a) if type(c) is Zero else c
               for c, a in zip(self._linear.backward(flat), spec.in_avals)]
        return tuple(tree_util.tree_unflatten(spec.in_tree, with_static(spec, cts)))


def vjp(func, *primals, has_aux=False, holomorphic=False, allow_int=False):
    """Vector-Jacobian product: run `func` and return a function that pulls
    output cotangents back to the inputs.

    Args:
      func (Callable): a function of arrays (pytrees allowed).
      *primals (Any): the inputs at which to linearize. Non-array leaves of a
        pytree (an Equinox module's functions, ints, strings) are passed
        through and get None as cotangent.
      has_aux (bool): `func` returns `(output, aux)`; aux is returned untouched.
      holomorphic (bool): promise that `func` is holomorphic (JAX's meaning):
        its inputs and outputs must be complex. The derivative computed is the
        same either way (the complex derivative where one exists).
      allow_int (bool): let integer, bool and key inputs through (as JAX's vjp
        does), with float0 zeros as cotangent; by default they are refused,
        as torch.func.vjp refuses them.

    Returns:
      tuple: `(output, vjp_fn)` or `(output, vjp_fn, aux)`. `vjp_fn(cotangents)`
      takes cotangents with the structure, shapes and dtypes of `output` and
      returns a tuple with one cotangent per primal. It can be called many
      times, and is a pytree whose leaves are the residuals it holds (as
      JAX's), so it can be returned from `jax.jit` or `functx.jit`.

    Example:
      >>> out, vjp_fn = functx.vjp(functx.numpy.sin, x)
      >>> (ct,) = vjp_fn(functx.numpy.ones_like(out))
      >>> rows = functx.vmap(vjp_fn)(basis)   # composes with vmap
    """
    _args.check_callable(func, "vjp")
    call = f"vjp({_args.fn_name(func)}, *primals)"
    r = linearize_reverse(func, primals, has_aux, call, allow_int=bool(allow_int),
                          holomorphic=holomorphic)
    if holomorphic:
        check_holomorphic_outputs(r, call)
    output = tree_util.tree_unflatten(r.out_tree, r.out)
    vjp_fn = VJPFunction(r.linear, _VJPSpec(r))
    if has_aux:
        return output, vjp_fn, r.aux
    return output, vjp_fn


def _scalar_check(r, call, holomorphic=False):
    if len(r.out_avals) != 1 or r.out_tree != tree_util.tree_structure(0):
        raise FunctxValueError(
            f"{call}: expected the function to return a scalar, got a "
            f"{_args.describe_tree(r.out_tree)} of {len(r.out_avals)} arrays. Return "
            "one scalar (use has_aux=True for extra outputs), or use jacrev for "
            "non-scalar outputs."
        )
    a = r.out_avals[0]
    if a.shape != ():
        raise FunctxValueError(
            f"{call}: expected the function to return a scalar, got {a.str_short()}. "
            "Sum the output, or use jacrev for non-scalar outputs."
        )
    if holomorphic:
        check_holomorphic_outputs(r, call)
    elif is_complex_dtype(a.dtype):
        raise FunctxTypeError(
            f"{call}: expected the function to return a real floating-point scalar, "
            f"got {a.str_short()}. For the complex derivative of a holomorphic function "
            "pass holomorphic=True; otherwise return a real value (e.g. its abs or real "
            "part), or use vjp directly."
        )
    elif not is_real_float_dtype(a.dtype):
        raise FunctxTypeError(
            f"{call}: expected the function to return a real floating-point scalar, "
            f"got {a.str_short()}. Only real-valued float outputs have a gradient; "
            "cast the output with .astype(float) if it should be differentiable."
        )


_WEAK_ONES = {}  # dtype -> a weakly typed 1 of that dtype


def seed_one(aval):
    """The cotangent grad starts from: 1, as weakly typed as the output
    (NOTE [weak types of results])."""
    one = scalar_constant(1.0, aval.dtype)
    if not aval.weak_type:
        return one
    weak = _WEAK_ONES.get(aval.dtype)
    if weak is None:
        with jax.ensure_compile_time_eval():
            weak = _WEAK_ONES[aval.dtype] = _args.match_weak(one, True)
    return weak


def bind_argnums(func, args, kwargs, nums):
    """`func` as a function of the arguments `nums` only."""
    def f_diff(*dargs):
        full = list(args)
        for i, a in zip(nums, dargs):
            full[i] = a
        return func(*full, **kwargs)

    return f_diff


_JAX_JITTED = type(jax.jit(lambda: None))  # what jax.jit returns (a C++ type)


def _is_jitted(func):
    """Whether `func` is what `functx.jit` or `jax.jit` returns."""
    return type(func) is _JAX_JITTED or getattr(func, "functx_jitted", None) is not None


def _grad_and_value(func, argnums, has_aux, name, holomorphic, allow_int):
    _args.check_callable(func, name)

    jitted = _is_jitted(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        call = f"{name}({_args.fn_name(func)}, argnums={argnums!r})(*args)"
        nums, single = _args.normalize_argnums(argnums, len(args), call)
        diff = tuple(args[i] for i in nums)
        # NOTE [a jitted function differentiated alone] in primitives/call.py
        was = differentiating_alone(1 if jitted and not _core_state.stack else None)
        try:
            r = linearize_reverse(bind_argnums(func, args, kwargs, nums), diff, has_aux, call,
                                  [f"argument {i}" for i in nums], bool(allow_int), holomorphic,
                                  queued=True, call_args=(args, kwargs))
            _scalar_check(r, call, holomorphic)
            one = seed_one(r.out_avals[0])
            cts = pull_back(r, [one])
            r.linear = None  # residuals no one holds stay inside the program (NOTE [one program per gradient])
            cts, value = values(cts), value_of(r.out[0])
        finally:
            differentiating_alone(was)
        grads = tree_util.tree_unflatten(r.in_tree, with_static(r, cts))
        grads = grads[0] if single else tuple(grads)
        if has_aux:
            return grads, (value, r.aux)
        return grads, value

    return wrapper


def grad_and_value(func, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    """Gradient and value of a scalar function.

    Args:
      func (Callable): a function returning a real floating-point scalar (or
        `(scalar, aux)` with `has_aux=True`).
      argnums (int | tuple[int, ...]): which positional argument(s) to
        differentiate: an int, or a tuple of ints for a tuple of gradients.
      has_aux (bool): `func` returns `(scalar, aux)`.
      holomorphic (bool): as for `grad`.
      allow_int (bool): as for `grad`.

    Returns:
      Callable: A function returning `(grad, value)`, or `(grad, (value, aux))`.

    Example:
      >>> g, loss = functx.grad_and_value(loss_fn)(params, batch)
      >>> per_sample = functx.vmap(functx.grad_and_value(loss_fn), in_dims=(None, 0))
    """
    return _grad_and_value(func, argnums, has_aux, "grad_and_value", holomorphic, allow_int)


def grad(func, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    """Gradient of a scalar function.

    Args:
      func (Callable): a function returning a real floating-point scalar (or
        `(scalar, aux)` with `has_aux=True`). Keyword arguments are passed
        through and not differentiated.
      argnums (int | tuple[int, ...]): which positional argument(s) to
        differentiate: an int, or a tuple of ints for a tuple of gradients. A
        differentiated argument may be any pytree; its non-array leaves (an
        Equinox module's functions, ints, strings) get None as gradient.
      has_aux (bool): `func` returns `(scalar, aux)`; the result is `(grad,
        aux)`.
      holomorphic (bool): `func` is holomorphic, with complex inputs and a
        complex scalar output (JAX's meaning); the result is the complex
        derivative.
      allow_int (bool): integer, bool and key arrays among the differentiated
        arguments get float0 zeros as gradient (as JAX's allow_int) instead
        of being refused.

    Returns:
      Callable: A function computing the gradient (with the structure of the
      differentiated argument).

    Example:
      >>> functx.grad(functx.numpy.sin)(x)                      # cos(x)
      >>> functx.grad(functx.grad(functx.numpy.sin))(x)         # -sin(x)
      >>> functx.vmap(functx.grad(loss), in_dims=(None, 0, 0))  # per-sample
    """
    inner = _grad_and_value(func, argnums, has_aux, "grad", holomorphic, allow_int)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        g, value = inner(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g

    return wrapper
