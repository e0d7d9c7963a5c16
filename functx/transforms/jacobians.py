"""Jacobians and Hessians: jacrev, jacfwd, hessian, hvp, vhp.

Both Jacobian transforms return, for every output leaf, the Jacobian with
respect to the differentiated arguments (a tuple of them for tuple
`argnums`), each block shaped `output.shape + input.shape`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from ..core import aval_of
from ..errors import FunctxValueError
from ..primitives import structural as st
from ..primitives.common import moveaxis
from . import _args
from .grad import bind_argnums, grad_and_value, linearize_reverse, pull_back, vjp, with_static
from .jvp import _check_tuple, jvp, jvp_flat
from .vmap import map_over_basis


_BASES = {}


def _basis(avals):
    """Rows of the identity, split per leaf: leaf k gets shape (N, *shape_k).

    Built with jax.numpy, so under a JAX trace (functx.jit) the identity is
    computed inside the program (iota and compare, fused by XLA) instead of
    being baked into it as an N x N constant; eager bases are cached."""
    key = tuple(avals)
    cached = _BASES.get(key)
    if cached is not None:
        return cached
    sizes = [a.size for a in avals]
    total = sum(sizes)
    out = []
    start = 0
    for a, n in zip(avals, sizes):
        block = jnp.eye(total, n, k=-start, dtype=a.dtype)
        out.append(jnp.reshape(block, (total,) + a.shape))
        start += n
    result = out, sizes, total
    if not any(isinstance(b, jax.core.Tracer) for b in out) and len(_BASES) < 64:
        _BASES[key] = result
    return result


def _starts(sizes):
    """Where each leaf's block of the identity starts (its rows' offset)."""
    return [int(v) for v in np.cumsum([0] + list(sizes[:-1]))]


def _rows(x, start, stop):
    shape = aval_of(x).shape
    return st.slice(x, (start,) + (0,) * (len(shape) - 1), (stop,) + shape[1:])


def _check_chunk(chunk_size, call):
    if chunk_size is not None and (
        not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size < 1
    ):
        raise FunctxValueError(f"{call}: chunk_size must be None or a positive int, got {chunk_size!r}.")


def _diff_args(args, argnums, call):
    nums, single = _args.normalize_argnums(argnums, len(args), call)
    return nums, single, tuple(args[i] for i in nums)


def jacrev(func, argnums=0, *, has_aux=False, chunk_size=None, _preallocate_and_copy=False):
    """Jacobian by reverse mode: one vjp per output element, batched with
    vmap.

    Args:
      func: a function of arrays (pytrees allowed).
      argnums: the argument(s) to differentiate (int or tuple of ints).
      has_aux: `func` returns `(output, aux)`; the result is `(jac, aux)`.
      chunk_size: compute the rows in chunks of this many vjps (bounded
        memory, same result).

    Returns:
      A function returning the Jacobian: for each output leaf, the block(s)
      `output.shape + input.shape` (a tuple over argnums for tuple argnums).

    Example:
      >>> functx.jacrev(functx.numpy.sin)(x)            # diag(cos(x))
      >>> functx.vmap(functx.jacrev(f))(xs)             # batched Jacobians
      >>> functx.jacfwd(functx.jacrev(f))(x)            # Hessian
    """
    _args.check_callable(func, "jacrev")
    _check_chunk(chunk_size, f"jacrev({_args.fn_name(func)})")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        call = f"jacrev({_args.fn_name(func)}, argnums={argnums!r})(*args)"
        nums, single, diff = _diff_args(args, argnums, call)
        r = linearize_reverse(bind_argnums(func, args, kwargs, nums), diff, has_aux, call,
                              [f"argument {i}" for i in nums])
        basis, sizes, total = _basis(r.out_avals)

        def pull(*cts):
            return pull_back(r, list(cts))

        if total == 1:
            rows = [st.expand_dims(c, (0,)) for c in pull(*[b[0] for b in basis])]
        else:
            rows = map_over_basis(pull, basis, _starts(sizes), call, chunk_size=chunk_size)
        blocks = []
        start = 0
        for oa, n in zip(r.out_avals, sizes):
            per_input = [
                st.reshape(_rows(row, start, start + n), oa.shape + ia.shape)
                for row, ia in zip(rows, r.in_avals)
            ]
            start += n
            per_arg = tuple(tree_util.tree_unflatten(r.in_tree, with_static(r, per_input)))
            blocks.append(per_arg[0] if single else per_arg)
        jac = tree_util.tree_unflatten(r.out_tree, blocks)
        if has_aux:
            return jac, r.aux
        return jac

    return wrapper


def jacfwd(func, argnums=0, has_aux=False, *, randomness="error"):
    """Jacobian by forward mode: one jvp per input element, batched with
    vmap.

    Args:
      func: a function of arrays (pytrees allowed).
      argnums: the argument(s) to differentiate (int or tuple of ints).
      has_aux: `func` returns `(output, aux)`; the result is `(jac, aux)`.
      randomness: passed to the inner vmap (see `vmap`).

    Returns:
      A function returning the Jacobian, laid out as for `jacrev`.

    Example:
      >>> functx.jacfwd(f)(x)                 # cheap when inputs are few
      >>> functx.jacfwd(functx.jacrev(f))(x)  # Hessian (= functx.hessian)
    """
    _args.check_callable(func, "jacfwd")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        call = f"jacfwd({_args.fn_name(func)}, argnums={argnums!r})(*args)"
        nums, single, diff = _diff_args(args, argnums, call)
        flat, in_tree, mask = _args.differentiable_leaves(diff, call, [f"argument {i}" for i in nums])
        diff = tree_util.tree_unflatten(in_tree, flat)
        in_avals = [aval_of(x) for x, m in zip(flat, mask) if m]
        basis, sizes, total = _basis(in_avals)
        f_diff = bind_argnums(func, args, kwargs, nums)
        info = {}

        def push(*tangent_leaves):
            it = iter(tangent_leaves)
            tangents = tree_util.tree_unflatten(in_tree, [next(it) if m else x for x, m in zip(flat, mask)])
            outs, tans, out_tree, aux = jvp_flat(f_diff, diff, tangents, has_aux, call)
            info["out_tree"] = out_tree
            return tans, outs, aux

        tans, outs, aux = map_over_basis(push, basis, _starts(sizes), call,
                                         out_dims=(0, None, None), randomness=randomness)
        blocks = []
        for t, o in zip(tans, outs):
            oshape = aval_of(o).shape
            t = moveaxis(t, 0, len(oshape))  # (*out_shape, N)
            per_input = []
            start = 0
            for ia, n in zip(in_avals, sizes):
                lo = (0,) * len(oshape) + (start,)
                hi = oshape + (start + n,)
                per_input.append(st.reshape(st.slice(t, lo, hi), oshape + ia.shape))
                start += n
            it = iter(per_input)
            leaves = [next(it) if m else None for m in mask]
            per_arg = tuple(tree_util.tree_unflatten(in_tree, leaves))
            blocks.append(per_arg[0] if single else per_arg)
        jac = tree_util.tree_unflatten(info["out_tree"], blocks)
        if has_aux:
            return jac, aux
        return jac

    return wrapper


def hessian(func, argnums=0):
    """Hessian of a scalar function: `jacfwd(jacrev(func, argnums), argnums)`.

    Example:
      >>> functx.hessian(lambda x: (x ** 3).sum())(x)   # diag(6 x)
    """
    _args.check_callable(func, "hessian")
    return jacfwd(jacrev(func, argnums), argnums)


def _grad_all(func, n):
    return grad_and_value(func, argnums=tuple(range(n)))


def hvp(func, primals, tangents):
    """Hessian-vector product by forward-over-reverse, without forming the
    Hessian.

    Args:
      func: a function returning a real scalar.
      primals: a tuple of inputs; tangents: a tuple of the same structure.

    Returns:
      `(output, hvp_out)` with `hvp_out` a tuple matching `primals`.

    Example:
      >>> value, (hv,) = functx.hvp(f, (x,), (v,))
    """
    _args.check_callable(func, "hvp")
    call = f"hvp({_args.fn_name(func)}, primals, tangents)"
    primals = _check_tuple(primals, call, "primals")
    tangents = _check_tuple(tangents, call, "tangents")
    (_, value), (product, _) = jvp(_grad_all(func, len(primals)), primals, tangents)
    return value, tuple(product)


def vhp(func, primals, cotangents):
    """Vector-Hessian product by reverse-over-reverse.

    Args:
      func: a function returning a real scalar.
      primals: a tuple of inputs; cotangents: a tuple of the same structure.

    Returns:
      `(output, vhp_out)` with `vhp_out` a tuple matching `primals`.

    Example:
      >>> value, (vh,) = functx.vhp(f, (x,), (v,))
    """
    _args.check_callable(func, "vhp")
    call = f"vhp({_args.fn_name(func)}, primals, cotangents)"
    primals = _check_tuple(primals, call, "primals")
    cotangents = _check_tuple(cotangents, call, "cotangents")
    (_, value), vjp_fn = vjp(_grad_all(func, len(primals)), *primals)
    return value, vjp_fn((tuple(cotangents), jnp.zeros_like(value)))
