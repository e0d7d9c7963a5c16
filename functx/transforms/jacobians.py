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

from .. import caches
from ..core import aval_of, is_complex_dtype, is_real_float_dtype
from ..errors import FunctxTypeError, FunctxValueError
from ..primitives import structural as st
from ..primitives.common import moveaxis
from . import _args
from .grad import (
    bind_argnums,
    check_holomorphic_outputs,
    grad_and_value,
    linearize_reverse,
    output_path,
    pull_back,
    vjp,
    with_static,
)
from .jvp import _check_tuple, jvp, jvp_flat
from .vmap import check_randomness, map_over_basis


# NOTE [bounded caches]: eager identity bases, an LRU bounded in entries and bytes
_BASES = caches.Cache("jacobian bases", limit=64, byte_limit=64 << 20,
                      size=lambda r: sum(b.nbytes for b in r[0]),
                      doc="eager jacfwd/jacrev/hessian: the identity basis per input avals")


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
    if not any(isinstance(b, jax.core.Tracer) for b in out):
        _BASES.put(key, result)
    return result


def _starts(sizes):
    """Where each leaf's block of the identity starts (its rows' offset)."""
    return [int(v) for v in np.cumsum([0] + list(sizes[:-1]))]


def _rows(x, start, stop):
    shape = aval_of(x).shape
    return st.slice(x, (start,) + (0,) * (len(shape) - 1), (stop,) + shape[1:])


def _check_chunk(chunk_size, call, max_memory=None):
    if chunk_size == "auto" or max_memory is not None:
        from ..memory import check_auto_chunk

        check_auto_chunk(chunk_size, max_memory, call)
        return
    if chunk_size is not None and (
        not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size < 1
    ):
        raise FunctxValueError(
            f"{call}: chunk_size must be None or a positive int, got {chunk_size!r}. Pass "
            "None for all rows at once, or the number of rows per chunk (e.g. 8)."
        )


def _diff_args(args, argnums, call):
    nums, single = _args.normalize_argnums(argnums, len(args), call)
    return nums, single, tuple(args[i] for i in nums)


def _check_rev_outputs(r, call, holomorphic):
    """jacrev's outputs: real floating point, or complex with holomorphic
    (JAX's and torch's rule: an integer output has no reverse-mode rows)."""
    if holomorphic:
        check_holomorphic_outputs(r, call)
        return
    for k, a in enumerate(r.out_avals):
        if is_real_float_dtype(a.dtype):
            continue
        where = output_path(r.out_tree, k)
        if is_complex_dtype(a.dtype):
            raise FunctxTypeError(
                f"{call}: {where} is complex ({a.str_short()}); jacrev needs real outputs "
                "unless the function is holomorphic. Pass holomorphic=True for the complex "
                "derivative of a holomorphic function, or use vjp directly."
            )
        raise FunctxTypeError(
            f"{call}: {where} has dtype {a.dtype.name} ({a.str_short()}); jacrev needs "
            "floating-point outputs, as an integer or bool output has no derivative. Cast "
            "it with .astype(float) if it should be differentiable, return it as aux "
            "(has_aux=True), or use jacfwd, which gives zeros for it."
        )


def _int_block(out_aval):
    """jacrev's block for an integer input let through by allow_int: zeros of
    the input's dtype (JAX casts its float0 rows to the input's dtype), float0
    for a key."""
    def block(in_aval):
        a = in_aval.update(shape=out_aval.shape + in_aval.shape, weak_type=False)
        if not isinstance(a.dtype, np.dtype):
            return _args.float0_zeros(a)
        return jnp.zeros(a.shape, a.dtype)

    return block


def jacrev(func, argnums=0, *, has_aux=False, chunk_size=None, holomorphic=False,
           allow_int=False, _preallocate_and_copy=False, max_memory=None):
    """Jacobian by reverse mode: one vjp per output element, batched with
    vmap.

    Args:
      func (Callable): a function of arrays (pytrees allowed) with
        floating-point outputs (an integer output is an error, as in JAX and
        torch).
      argnums (int | tuple[int, ...]): the argument(s) to differentiate (int or
        tuple of ints).
      has_aux (bool): `func` returns `(output, aux)`; the result is `(jac,
        aux)`.
      chunk_size (int | str | None): compute the rows in chunks of this many
        vjps (bounded memory, same result); 'auto' with max_memory: the largest
        chunk whose estimated peak fits (NOTE [memory model] in
        functx/memory.py).
      holomorphic (bool): `func` is holomorphic with complex inputs and outputs
        (JAX's meaning): the result is the complex derivative. Without it a
        complex output is an error.
      allow_int (bool): integer, bool and key inputs get zero blocks (of the
        input's dtype, as JAX's allow_int) instead of being refused.
      max_memory (int | None): the memory budget in bytes for chunk_size='auto'.

    Returns:
      Callable: A function returning the Jacobian: for each output leaf, the
      block(s) `output.shape + input.shape` (a tuple over argnums for tuple
      argnums), each with its input's dtype and weak type (as JAX's). A function
      with no output leaves (None, ()) gives back that structure.

    Example:
      >>> functx.jacrev(functx.numpy.sin)(x)            # diag(cos(x))
      >>> functx.vmap(functx.jacrev(f))(xs)             # batched Jacobians
      >>> functx.jacfwd(functx.jacrev(f))(x)            # Hessian
    """
    _args.check_callable(func, "jacrev")
    _check_chunk(chunk_size, f"jacrev({_args.fn_name(func)})", max_memory)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        call = f"jacrev({_args.fn_name(func)}, argnums={argnums!r})(*args)"
        nums, single, diff = _diff_args(args, argnums, call)
        r = linearize_reverse(bind_argnums(func, args, kwargs, nums), diff, has_aux, call,
                              [f"argument {i}" for i in nums], bool(allow_int), holomorphic,
                              call_args=(args, kwargs))
        _check_rev_outputs(r, call, holomorphic)
        basis, sizes, total = _basis(r.out_avals)

        def pull(*cts):
            return pull_back(r, list(cts))

        if not r.in_avals or total == 0:
            rows = [jnp.zeros((total,) + ia.shape, ia.dtype) for ia in r.in_avals]
        elif total == 1:
            rows = [st.expand_dims(c, (0,)) for c in pull(*[b[0] for b in basis])]
        else:
            chunk = chunk_size
            if chunk == "auto":
                from ..memory import basis_chunk_size, call_measure

                chunk = basis_chunk_size(pull, basis, _starts(sizes), call, max_memory,
                                         measure=call_measure(lambda n: jacrev(
                                             func, argnums, has_aux=has_aux, chunk_size=n,
                                             holomorphic=holomorphic, allow_int=allow_int),
                                             args, kwargs))
            rows = map_over_basis(pull, basis, _starts(sizes), call, chunk_size=chunk)
        blocks = []
        start = 0
        for oa, n in zip(r.out_avals, sizes):
            per_input = [
                _args.match_weak(st.reshape(_rows(row, start, start + n), oa.shape + ia.shape),
                                 ia.weak_type)
                for row, ia in zip(rows, r.in_avals)
            ]
            start += n
            per_arg = tuple(tree_util.tree_unflatten(
                r.in_tree, with_static(r, per_input, _int_block(oa))))
            blocks.append(per_arg[0] if single else per_arg)
        jac = tree_util.tree_unflatten(r.out_tree, blocks)
        if has_aux:
            return jac, r.aux
        return jac

    return wrapper


def jacfwd(func, argnums=0, has_aux=False, *, randomness="error", holomorphic=False,
           chunk_size=None, max_memory=None):
    """Jacobian by forward mode: one jvp per input element, batched with
    vmap.

    Args:
      func (Callable): a function of arrays (pytrees allowed).
      argnums (int | tuple[int, ...]): the argument(s) to differentiate (int or
        tuple of ints).
      has_aux (bool): `func` returns `(output, aux)`; the result is `(jac,
        aux)`.
      randomness (str): passed to the inner vmap (see `vmap`).
      holomorphic (bool): `func` is holomorphic with complex inputs and outputs
        (JAX's meaning): the result is the complex derivative. Without it a
        complex input is an error.
      chunk_size (int | str | None): compute the columns in chunks of this many
        jvps (bounded memory, same result), or 'auto' with max_memory (as
        jacrev's).
      max_memory (int | None): the memory budget in bytes for chunk_size='auto'.

    Returns:
      Callable: A function returning the Jacobian, laid out as for `jacrev`,
      each block with its output's dtype and weak type (as JAX's).

    Example:
      >>> functx.jacfwd(f)(x)                 # cheap when inputs are few
      >>> functx.jacfwd(functx.jacrev(f))(x)  # Hessian (= functx.hessian)
    """
    _args.check_callable(func, "jacfwd")
    check_randomness(randomness, f"jacfwd({_args.fn_name(func)}, randomness={randomness!r})")
    _check_chunk(chunk_size, f"jacfwd({_args.fn_name(func)})", max_memory)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        call = f"jacfwd({_args.fn_name(func)}, argnums={argnums!r})(*args)"
        nums, single, diff = _diff_args(args, argnums, call)
        names = [f"argument {i}" for i in nums]
        flat, in_tree, mask, _ = _args.differentiable_leaves(diff, call, names,
                                                             holomorphic=holomorphic)
        if not holomorphic:
            _check_fwd_inputs(flat, mask, call)
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

        if total == 0:
            # nothing to map over: one jvp with the (empty) tangents gives the
            # outputs; every block is empty
            tans, outs, aux = push(*[jnp.zeros(a.shape, a.dtype) for a in in_avals])
            tans = [jnp.zeros((0,) + aval_of(o).shape, aval_of(o).dtype) for o in outs]
        else:
            chunk = chunk_size
            if chunk == "auto":
                from ..memory import basis_chunk_size, call_measure

                chunk = basis_chunk_size(push, basis, _starts(sizes), call, max_memory,
                                         out_dims=(0, None, None), randomness=randomness,
                                         measure=call_measure(lambda n: jacfwd(
                                             func, argnums, has_aux=has_aux, chunk_size=n,
                                             holomorphic=holomorphic, randomness=randomness),
                                             args, kwargs))
            tans, outs, aux = map_over_basis(push, basis, _starts(sizes), call,
                                             out_dims=(0, None, None), randomness=randomness,
                                             chunk_size=chunk)
        if holomorphic:
            for k, o in enumerate(outs):
                if not is_complex_dtype(aval_of(o).dtype):
                    raise FunctxTypeError(
                        f"{call}: with holomorphic=True every output must be complex, but "
                        f"{output_path(info['out_tree'], k)} is {aval_of(o).str_short()}. "
                        "Make the function return complex values, or drop holomorphic=True."
                    )
        blocks = []
        for t, o in zip(tans, outs):
            oa = aval_of(o)
            oshape = oa.shape
            t = moveaxis(t, 0, len(oshape))  # (*out_shape, N)
            per_input = []
            start = 0
            for ia, n in zip(in_avals, sizes):
                lo = (0,) * len(oshape) + (start,)
                hi = oshape + (start + n,)
                block = st.reshape(st.slice(t, lo, hi), oshape + ia.shape)
                per_input.append(_args.match_weak(block, oa.weak_type))
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


def _check_fwd_inputs(flat, mask, call):
    """jacfwd's inputs: real floating point unless holomorphic (as JAX's)."""
    for x, m in zip(flat, mask):
        if m and is_complex_dtype(aval_of(x).dtype):
            raise FunctxTypeError(
                f"{call}: a differentiated input is complex ({aval_of(x).str_short()}); "
                "jacfwd needs real inputs unless the function is holomorphic. Pass "
                "holomorphic=True for the complex derivative of a holomorphic function, "
                "use jacrev for a real-valued function of complex inputs, or use jvp "
                "directly."
            )


def hessian(func, argnums=0, *, holomorphic=False):
    """Hessian of a scalar function: `jacfwd(jacrev(func, argnums), argnums)`.

    `holomorphic=True` (complex inputs and output) is passed to both.

    Example:
      >>> functx.hessian(lambda x: (x ** 3).sum())(x)   # diag(6 x)
    """
    _args.check_callable(func, "hessian")
    return jacfwd(jacrev(func, argnums, holomorphic=holomorphic), argnums,
                  holomorphic=holomorphic)


def _grad_all(func, n):
    return grad_and_value(func, argnums=tuple(range(n)))


def hvp(func, primals, tangents):
    """Hessian-vector product by forward-over-reverse, without forming the
    Hessian.

    Args:
      func (Callable): a function returning a real scalar.
      primals (tuple): a tuple of inputs.
      tangents (tuple): a tuple of the same structure.

    Returns:
      tuple: `(output, hvp_out)` with `hvp_out` a tuple matching `primals`.

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
      func (Callable): a function returning a real scalar.
      primals (tuple): a tuple of inputs.
      cotangents (tuple): a tuple of the same structure.

    Returns:
      tuple: `(output, vhp_out)` with `vhp_out` a tuple matching `primals`.

    Example:
      >>> value, (vh,) = functx.vhp(f, (x,), (v,))
    """
    _args.check_callable(func, "vhp")
    call = f"vhp({_args.fn_name(func)}, primals, cotangents)"
    primals = _check_tuple(primals, call, "primals")
    cotangents = _check_tuple(cotangents, call, "cotangents")
    (_, value), vjp_fn = vjp(_grad_all(func, len(primals)), *primals)
    return value, vjp_fn((tuple(cotangents), jnp.zeros_like(value)))
