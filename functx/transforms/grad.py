"""Reverse-mode transforms: vjp, grad, grad_and_value."""

import functools

import jax.numpy as jnp
import numpy as np
from jax import tree_util

from ..core import Zero, aval_of, new_interpreter
from ..errors import FunctxValueError
from ..interpreters.reverse import ReverseInterpreter
from . import _args


class ReverseResult:
    """What running a function under a reverse interpreter leaves behind."""

    __slots__ = ("out", "out_tree", "out_avals", "linear", "in_tree", "in_avals", "aux")


def linearize_reverse(func, primals, has_aux, call):
    """Run `func(*primals)` recording its linearization (NOTE [reverse mode =
    jvp + staging + transpose] in interpreters/reverse.py)."""
    flat, in_tree = tree_util.tree_flatten(primals)
    flat = [_args.as_array(x, call, "an input") for x in flat]
    interp = ReverseInterpreter(call.split("(")[0])
    r = ReverseResult()
    with new_interpreter(interp):
        boxed = [interp.new_input(x) for x in flat]
        out = func(*tree_util.tree_unflatten(in_tree, boxed))
        aux = None
        if has_aux:
            out, aux = _args.split_aux(out, call)
        out_flat, r.out_tree = _args.flatten_outputs(out, call)
        r.linear = interp.linear_map(boxed, out_flat)
        r.out = [interp.unbox(o)[0] for o in out_flat]
        if has_aux:
            aux = tree_util.tree_map(lambda x: interp.unbox(x)[0], aux)
    r.out_avals = [aval_of(o) for o in r.out]
    r.in_tree = in_tree
    r.in_avals = [aval_of(x) for x in flat]
    r.aux = aux
    return r


def pull_back(r, cts):
    """Input cotangents (zeros materialised) for flat output cotangents."""
    in_cts = r.linear.backward(cts)
    return [_args.zeros_for(a) if type(c) is Zero else c for c, a in zip(in_cts, r.in_avals)]


def vjp(func, *primals, has_aux=False):
    """Vector-Jacobian product: run `func` and return a function that pulls
    output cotangents back to the inputs.

    Args:
      func: a function of arrays (pytrees allowed) returning arrays.
      *primals: the inputs at which to linearize.
      has_aux: `func` returns `(output, aux)`; aux is returned untouched.

    Returns:
      `(output, vjp_fn)` or `(output, vjp_fn, aux)`. `vjp_fn(cotangents)`
      takes cotangents with the structure of `output` and returns a tuple
      with one cotangent per primal. It can be called many times.

    Example:
      >>> out, vjp_fn = functx.vjp(functx.numpy.sin, x)
      >>> (ct,) = vjp_fn(functx.numpy.ones_like(out))
      >>> per_row = functx.vmap(vjp_fn)(basis)   # composes with vmap
    """
    call = f"vjp({_args.fn_name(func)}, *primals)"
    _args.check_callable(func, "vjp")
    _args.check_differentiable(
        [_args.as_array(x, call, "a primal") for x in tree_util.tree_leaves(primals)], call, "a primal"
    )
    r = linearize_reverse(func, primals, has_aux, call)
    output = tree_util.tree_unflatten(r.out_tree, r.out)

    def vjp_fn(cotangents, *, retain_graph=True, create_graph=None):
        fn_call = f"{call.split('(')[0]}_fn(cotangents)"
        flat, tree = tree_util.tree_flatten(cotangents)
        if tree != r.out_tree and len(r.out_avals) == 1 and isinstance(cotangents, tuple) and len(cotangents) == 1:
            flat, tree = tree_util.tree_flatten(cotangents[0])
        _args.check_same_structure(
            r.out_tree, tree, fn_call, "cotangents",
            "Pass one cotangent per output, in the output's structure.",
        )
        flat = [_args.as_array(c, fn_call, "a cotangent") for c in flat]
        _args.check_same_avals(r.out_avals, flat, fn_call, "cotangent", check_dtype=False)
        in_cts = pull_back(r, flat)
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
    if not np.issubdtype(a.dtype, np.floating):
        from ..errors import FunctxTypeError

        raise FunctxTypeError(
            f"{call}: expected the function to return a real floating-point scalar, "
            f"got {a.str_short()}. Only real-valued float outputs have a gradient; "
            "cast the output with .astype(float) if it should be differentiable."
        )


def _grad_and_value(func, argnums, has_aux, name):
    _args.check_callable(func, name)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        call = f"{name}({_args.fn_name(func)}, argnums={argnums!r})(*args)"
        nums, single = _args.normalize_argnums(argnums, len(args), call)
        diff = tuple(args[i] for i in nums)
        leaves = [_args.as_array(x, call, "a differentiated argument") for x in tree_util.tree_leaves(diff)]
        for i in nums:
            _args.check_differentiable(
                [_args.as_array(x, call, f"argument {i}") for x in tree_util.tree_leaves(args[i])],
                call, f"argument {i}",
            )
        del leaves

        def f_diff(*dargs):
            full = list(args)
            for i, a in zip(nums, dargs):
                full[i] = a
            return func(*full, **kwargs)

        r = linearize_reverse(f_diff, diff, has_aux, call)
        _scalar_check(r, call)
        one = np.ones((), r.out_avals[0].dtype)
        grads = tree_util.tree_unflatten(r.in_tree, pull_back(r, [one]))
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
        tuple of ints for a tuple of gradients.
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
