"""Reverse-mode transforms: vjp, grad, grad_and_value."""

import functools

from jax import tree_util

from ..core import Zero, aval_of, is_real_float_dtype, new_interpreter
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.reverse import ReverseInterpreter
from ..primitives.common import scalar_constant
from . import _args


class ReverseResult:
    """What running a function under a reverse interpreter leaves behind:
    outputs, their tree and avals, the recorded linear map, the input tree,
    which input leaves were differentiated (`mask`) and their avals, aux."""

    __slots__ = ("out", "out_tree", "out_avals", "linear", "in_tree", "mask", "in_avals", "aux")


def linearize_reverse(func, primals, has_aux, call, names=None):
    """Run `func(*primals)` recording its linearization (NOTE [reverse mode =
    jvp + staging + transpose] in interpreters/reverse.py)."""
    names = names or [f"primal {i}" for i in range(len(primals))]
    leaves, in_tree, mask = _args.differentiable_leaves(primals, call, names)
    interp = ReverseInterpreter(call.split("(")[0])
    r = ReverseResult()
    with new_interpreter(interp):
        boxed = [interp.new_input(x) if m else x for x, m in zip(leaves, mask)]
        out = func(*tree_util.tree_unflatten(in_tree, boxed))
        aux = None
        if has_aux:
            out, aux = _args.split_aux(out, call)
        out_flat, r.out_tree = _args.flatten_outputs(out, call)
        r.linear = interp.linear_map([b for b, m in zip(boxed, mask) if m], out_flat)
        r.out = [interp.unbox(o)[0] for o in out_flat]
        if has_aux:
            aux = tree_util.tree_map(lambda x: interp.unbox(x)[0], aux)
    r.out_avals = [aval_of(o) for o in r.out]
    r.in_tree = in_tree
    r.mask = mask
    r.in_avals = [aval_of(x) for x, m in zip(leaves, mask) if m]
    r.aux = aux
    return r


def pull_back(r, cts):
    """Cotangents of the differentiated input leaves (zeros materialised) for
    flat output cotangents."""
    return [_args.zeros_for(a) if type(c) is Zero else c
            for c, a in zip(r.linear.backward(cts), r.in_avals)]


def with_static(r, diff_values):
    """All input leaves: `diff_values` for the differentiated ones, None for
    the static ones."""
    it = iter(diff_values)
    return [next(it) if m else None for m in r.mask]


def vjp(func, *primals, has_aux=False):
    """Vector-Jacobian product: run `func` and return a function that pulls
    output cotangents back to the inputs.

    Args:
      func: a function of arrays (pytrees allowed).
      *primals: the inputs at which to linearize. Non-array leaves of a
        pytree (an Equinox module's functions, ints, strings) are passed
        through and get None as cotangent.
      has_aux: `func` returns `(output, aux)`; aux is returned untouched.

    Returns:
      `(output, vjp_fn)` or `(output, vjp_fn, aux)`. `vjp_fn(cotangents)`
      takes cotangents with the structure of `output` and returns a tuple
      with one cotangent per primal. It can be called many times.

    Example:
      >>> out, vjp_fn = functx.vjp(functx.numpy.sin, x)
      >>> (ct,) = vjp_fn(functx.numpy.ones_like(out))
      >>> rows = functx.vmap(vjp_fn)(basis)   # composes with vmap
    """
    _args.check_callable(func, "vjp")
    call = f"vjp({_args.fn_name(func)}, *primals)"
    r = linearize_reverse(func, primals, has_aux, call)
    output = tree_util.tree_unflatten(r.out_tree, r.out)

    def vjp_fn(cotangents, *, retain_graph=True, create_graph=None):
        fn_call = "vjp_fn(cotangents)"
        flat, tree = tree_util.tree_flatten(cotangents)
        if tree != r.out_tree and len(r.out_avals) == 1 and isinstance(cotangents, tuple) and len(cotangents) == 1:
            flat, tree = tree_util.tree_flatten(cotangents[0])
        _args.check_same_structure(
            r.out_tree, tree, fn_call, "cotangents",
            "Pass one cotangent per output, in the output's structure.",
        )
        flat = [_args.as_array(c, fn_call, "a cotangent") for c in flat]
        _args.check_same_avals(r.out_avals, flat, fn_call, "cotangent", check_dtype=False)
        in_cts = with_static(r, pull_back(r, flat))
        return tuple(tree_util.tree_unflatten(r.in_tree, in_cts))

    if has_aux:
        return output, vjp_fn, r.aux
    return output, vjp_fn


def _scalar_check(r, call):
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
    if not is_real_float_dtype(a.dtype):
        raise FunctxTypeError(
            f"{call}: expected the function to return a real floating-point scalar, "
            f"got {a.str_short()}. Only real-valued float outputs have a gradient; "
            "cast the output with .astype(float) if it should be differentiable."
        )


def bind_argnums(func, args, kwargs, nums):
    """`func` as a function of the arguments `nums` only."""
    def f_diff(*dargs):
        full = list(args)
        for i, a in zip(nums, dargs):
            full[i] = a
        return func(*full, **kwargs)

    return f_diff


def _grad_and_value(func, argnums, has_aux, name):
    _args.check_callable(func, name)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        call = f"{name}({_args.fn_name(func)}, argnums={argnums!r})(*args)"
        nums, single = _args.normalize_argnums(argnums, len(args), call)
        diff = tuple(args[i] for i in nums)
        r = linearize_reverse(bind_argnums(func, args, kwargs, nums), diff, has_aux, call,
                              [f"argument {i}" for i in nums])
        _scalar_check(r, call)
        one = scalar_constant(1.0, r.out_avals[0].dtype)
        grads = tree_util.tree_unflatten(r.in_tree, with_static(r, pull_back(r, [one])))
        grads = grads[0] if single else tuple(grads)
        value = r.out[0]
        if has_aux:
            return grads, (value, r.aux)
        return grads, value

    return wrapper


def grad_and_value(func, argnums=0, has_aux=False):
    """Gradient and value of a scalar function.

    Args:
      func: a function returning a real floating-point scalar (or
        `(scalar, aux)` with `has_aux=True`).
      argnums: which positional argument(s) to differentiate: an int, or a
        tuple of ints for a tuple of gradients.
      has_aux: `func` returns `(scalar, aux)`.

    Returns:
      A function returning `(grad, value)`, or `(grad, (value, aux))`.

    Example:
      >>> g, loss = functx.grad_and_value(loss_fn)(params, batch)
      >>> per_sample = functx.vmap(functx.grad_and_value(loss_fn), in_dims=(None, 0))
    """
    return _grad_and_value(func, argnums, has_aux, "grad_and_value")


def grad(func, argnums=0, has_aux=False):
    """Gradient of a scalar function.

    Args:
      func: a function returning a real floating-point scalar (or
        `(scalar, aux)` with `has_aux=True`). Keyword arguments are passed
        through and not differentiated.
      argnums: which positional argument(s) to differentiate: an int, or a
        tuple of ints for a tuple of gradients. A differentiated argument may
        be any pytree; its non-array leaves (an Equinox module's functions,
        ints, strings) get None as gradient.
      has_aux: `func` returns `(scalar, aux)`; the result is `(grad, aux)`.

    Returns:
      A function computing the gradient (with the structure of the
      differentiated argument).

    Example:
      >>> functx.grad(functx.numpy.sin)(x)                      # cos(x)
      >>> functx.grad(functx.grad(functx.numpy.sin))(x)         # -sin(x)
      >>> functx.vmap(functx.grad(loss), in_dims=(None, 0, 0))  # per-sample
    """
    inner = _grad_and_value(func, argnums, has_aux, "grad")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        g, value = inner(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g

    return wrapper
