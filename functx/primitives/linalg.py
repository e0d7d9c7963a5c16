"""Linear algebra: the decompositions and solvers of `jax.lax.linalg`
(cholesky, lu, qr, eigh, eig, svd, triangular_solve, tridiagonal_solve, ...)
and `custom_linear_solve`, which jax.numpy.linalg's solve / inv emit.

Evaluation is the JAX primitive of the same name (LAPACK on CPU).

NOTE [linalg derivatives borrowed from JAX]
The derivative of a matrix decomposition is a page of algebra (perturbation
theory for eigh, eig and svd; triangular-factor identities for cholesky, lu
and qr), and the tangent it produces is assembled from other primitives:
triangular solves, matrix products, masks, gathers. Rather than restating
that algebra, each jvp rule here is JAX's own: `jax.jvp` of the JAX
primitive, staged once per parameters and shapes and replayed as functx
primitives (`call_lifted`, as in NOTE [rules borrowed from JAX] in conv.py).
Only the operands with nonzero tangents are differentiated, so symbolic
zeros stay free. Because JAX writes those rules to be linear in the
tangents (it transposes them itself), every tangent operation lands, under
functx's reverse mode, on primitives that have transpose rules; the
decomposition itself runs once, on the primals. The same staging makes the
rules compose: the replayed program is made of functx primitives (these
ones included), so higher derivatives and vmap of derivatives just work.

Where JAX declines to differentiate (svd with full_matrices=True of a
non-square matrix, eig's eigenvectors without enable_eigvec_derivs, eigh of
a subset of eigenvalues), its NotImplementedError is turned into functx's
MissingRuleError naming the primitive.

NOTE [linalg batching]
Every decomposition accepts leading batch dimensions, so vmap moves the
batch axis of each operand to the front (broadcasting unbatched operands)
and binds the primitive once. triangular_solve with an unbatched matrix and
a batched right-hand side instead folds the batch into the right-hand
side's columns (rows, for right-side solves): one solve, no copies of the
matrix.

`triangular_solve` is linear in its right-hand side: its transpose solves
with the transposed matrix (`transpose_a` flipped). `tridiagonal_solve` is
linear in its right-hand side too; its transpose is borrowed from JAX
(`jax.linear_transpose`).

NOTE [custom_linear_solve]
`jax.lax.custom_linear_solve(matvec, b, solve, transpose_solve)` (what
jnp.linalg.solve and inv emit) carries four sub-programs as JAX jaxprs:
the operator A (`matvec`), its transpose (`vecmat`), and the two solvers.
Its operands are the constants of each sub-program followed by the leaves
of b. The primitive keeps the jaxprs as they are (lifting registers a
`LIFT_RULES` translation that keeps them); its rules follow the
implicit-function theorem, never differentiating through the solver:

* jvp: from A x = b, dx = A^{-1} (db - dA x). `dA x` is the jvp of the
  matvec program in its constants (borrowed: `jax.jvp` of the matvec
  jaxpr, lifted), and A^{-1} is the same primitive again, applied to the
  tangent right-hand side. That second solve is linear in its b operands.
* transpose (in b): the transpose of x = A^{-1} b is A^{-T}, which is the
  same primitive with the roles swapped: matvec <-> vecmat and
  solve <-> transpose_solve (a clear error when transpose_solve is None).
* batching: borrowed from JAX (`jax.vmap` of the primitive, lifted), which
  works out consistently which parts of x and b become batched across the
  four sub-programs and batches the jaxprs.
"""

import functools

import jax
from jax._src import core as jcore
from jax._src.lax import linalg as jlinalg
from jax._src.lax.control_flow import solves as jsolves

from ..core import Aval, is_inexact_dtype
from ..errors import MissingRuleError
from ..lifting import LIFT_RULES, call_lifted
from .common import (
    Zero,
    add_tangents,
    aval_of,
    batch_rules,
    bdim_to_front,
    bind,
    defprim,
    defzero_jvp,
    instantiate,
    is_linear,
    jvp_rules,
    moveaxis,
    shape_rules,
    transpose_rules,
)
from .elementwise import neg
from .structural import reshape


def _inexact(dtype):
    return is_inexact_dtype(dtype)


# --------------------------------------------------------------------------
# Batching (NOTE [linalg batching])


def _leading_batch(prim):
    """Batching for a primitive that accepts matching leading batch
    dimensions on all operands."""

    def rule(size, vals, dims, **params):
        vals = [bdim_to_front(v, d, size) for v, d in zip(vals, dims)]
        out = bind(prim, *vals, **params)
        if prim.multiple_results:
            return out, [0] * len(out)
        return out, 0

    batch_rules[prim] = rule
    return rule


# --------------------------------------------------------------------------
# Borrowed jvp rules (NOTE [linalg derivatives borrowed from JAX])


@functools.lru_cache(maxsize=1024)
def _jax_jvp(jax_prim, items, nonzero):
    """`(primals, live_tangents) -> (outs, float_out_tangents)` as a JAX
    function: jax.jvp of `jax_prim` in the operands marked `nonzero`."""
    params = dict(items)
    idx = [i for i, nz in enumerate(nonzero) if nz]

    def jvp(primals, tangents):
        def f(*dargs):
            args = list(primals)
            for i, a in zip(idx, dargs):
                args[i] = a
            return jax_prim.bind(*args, **params)

        out, t_out = jax.jvp(f, [primals[i] for i in idx], list(tangents))
        if not jax_prim.multiple_results:
            out, t_out = [out], [t_out]
        out = list(out)
        return out, [t for o, t in zip(out, t_out) if _inexact(o.dtype)]

    # jit: one compiled call when it runs directly on arrays (eager forward
    # mode); lifting inlines it like any jit.
    return jax.jit(jvp)


def _no_derivative(prim, err):
    return MissingRuleError(
        f"jvp / grad: functx (like JAX) cannot differentiate `{prim.name}` "
        f"with these arguments: {err} Use forward and reverse mode only "
        "where JAX defines the derivative, or wrap the computation with "
        "functx.lax.stop_gradient if its derivative is not needed."
    )


def _borrowed_jvp(prim):
    """Register JAX's own jvp rule of `prim.jax` as `prim`'s jvp rule."""

    def rule(primals, tangents, **params):
        nonzero = tuple(type(t) is not Zero and _inexact(aval_of(p).dtype)
                        for p, t in zip(primals, tangents))
        if not any(nonzero):
            out = bind(prim, *primals, **params)
            outs = out if prim.multiple_results else [out]
            zeros = [Zero.of(o) for o in outs]
            return out, zeros if prim.multiple_results else zeros[0]
        live = [t for t, nz in zip(tangents, nonzero) if nz]
        fn = _jax_jvp(prim.jax, tuple(sorted(params.items())), nonzero)
        try:
            outs, float_tangents = call_lifted(fn, (list(primals), live), {})
        except NotImplementedError as e:
            raise _no_derivative(prim, e) from None
        float_tangents = iter(float_tangents)
        t_out = [next(float_tangents) if _inexact(aval_of(o).dtype) else Zero.of(o)
                 for o in outs]
        if prim.multiple_results:
            return outs, t_out
        return outs[0], t_out[0]

    jvp_rules[prim] = rule
    return rule


# --------------------------------------------------------------------------
# The decompositions

cholesky_p = defprim("cholesky", jlinalg.cholesky_p)
eig_p = defprim("eig", jlinalg.eig_p, multiple_results=True)
eigh_p = defprim("eigh", jlinalg.eigh_p, multiple_results=True)
lu_p = defprim("lu", jlinalg.lu_p, multiple_results=True)
qr_p = defprim("qr", jlinalg.qr_p, multiple_results=True)
svd_p = defprim("svd", jlinalg.svd_p, multiple_results=True)

for _p in (cholesky_p, eig_p, eigh_p, lu_p, qr_p, svd_p):
    _borrowed_jvp(_p)
    _leading_batch(_p)

# Row swaps to a permutation (integers: no derivative).
lu_pivots_to_permutation_p = defprim("lu_pivots_to_permutation",
                                     jlinalg.lu_pivots_to_permutation_p)
defzero_jvp(lu_pivots_to_permutation_p)
_leading_batch(lu_pivots_to_permutation_p)

# Decompositions JAX defines no derivative for (emitted by jax.scipy.linalg):
# evaluation and batching only; differentiating them raises functx's
# missing-rule error naming the primitive.
schur_p = defprim("schur", jlinalg.schur_p, multiple_results=True)
hessenberg_p = defprim("hessenberg", jlinalg.hessenberg_p, multiple_results=True)
tridiagonal_p = defprim("tridiagonal", jlinalg.tridiagonal_p, multiple_results=True)
geqrf_p = defprim("geqrf", jlinalg.geqrf_p, multiple_results=True)
geqp3_p = defprim("geqp3", jlinalg.geqp3_p, multiple_results=True)
householder_product_p = defprim("householder_product", jlinalg.householder_product_p)
ormqr_p = defprim("ormqr", jlinalg.ormqr_p)
for _p in (schur_p, hessenberg_p, tridiagonal_p, geqrf_p, geqp3_p,
           householder_product_p, ormqr_p):
    _leading_batch(_p)


# --------------------------------------------------------------------------
# triangular_solve: nonlinear in the matrix a, linear in the right-hand side b

triangular_solve_p = defprim("triangular_solve", jlinalg.triangular_solve_p)
_borrowed_jvp(triangular_solve_p)


def _triangular_solve_transpose(ct, a, b, **params):
    if is_linear(a):
        raise MissingRuleError(
            "reverse-mode: `triangular_solve` is not linear in its matrix "
            "operand, so it cannot be transposed in it (functx internal error: "
            "its jvp should not have produced this)."
        )
    if type(ct) is Zero:
        return [None, Zero(b.aval)]
    flipped = dict(params, transpose_a=not params["transpose_a"])
    return [None, bind(triangular_solve_p, a, ct, **flipped)]


transpose_rules[triangular_solve_p] = _triangular_solve_transpose


def _triangular_solve_batch(size, vals, dims, **params):
    (a, b), (da, db) = vals, dims
    if da is not None:
        a = moveaxis(a, da, 0)
        b = bdim_to_front(b, db, size)
        return bind(triangular_solve_p, a, b, **params), 0
    # An unbatched matrix: fold the batch into b's columns (left-side
    # solves, op(a) x = b) or rows (right-side solves, x op(a) = b).
    nd = aval_of(b).ndim
    if params["left_side"]:
        b = moveaxis(b, db, nd - 1)
        shape = aval_of(b).shape
        flat = reshape(b, shape[:-2] + (shape[-2] * shape[-1],))
        out_dim = nd - 1
    else:
        b = moveaxis(b, db, nd - 3)
        shape = aval_of(b).shape
        flat = reshape(b, shape[:-3] + (shape[-3] * shape[-2], shape[-1]))
        out_dim = nd - 3
    out = bind(triangular_solve_p, a, flat, **params)
    return reshape(out, shape), out_dim


batch_rules[triangular_solve_p] = _triangular_solve_batch


# --------------------------------------------------------------------------
# tridiagonal_solve(dl, d, du, b): linear in b

tridiagonal_solve_p = defprim("tridiagonal_solve", jlinalg.tridiagonal_solve_p)
_borrowed_jvp(tridiagonal_solve_p)
_leading_batch(tridiagonal_solve_p)


@functools.lru_cache(maxsize=256)
def _tridiagonal_transposer(items, b_aval):
    params = dict(items)
    struct = jax.ShapeDtypeStruct(b_aval.shape, b_aval.dtype)

    def transpose(dl, d, du, ct):
        solve = lambda b: jlinalg.tridiagonal_solve_p.bind(dl, d, du, b, **params)  # noqa: E731
        return jax.linear_transpose(solve, struct)(ct)[0]

    return transpose


def _tridiagonal_solve_transpose(ct, dl, d, du, b, **params):
    if is_linear(dl) or is_linear(d) or is_linear(du):
        raise MissingRuleError(
            "reverse-mode: `tridiagonal_solve` is not linear in its diagonals "
            "(functx internal error: its jvp should not have produced this)."
        )
    if type(ct) is Zero:
        return [None, None, None, Zero(b.aval)]
    fn = _tridiagonal_transposer(tuple(sorted(params.items())), b.aval)
    return [None, None, None, call_lifted(fn, (dl, d, du, ct), {})]


transpose_rules[tridiagonal_solve_p] = _tridiagonal_solve_transpose


# --------------------------------------------------------------------------
# custom_linear_solve (NOTE [custom_linear_solve])

# Evaluated by JAX's primitive (its jaxprs are JAX programs), compiled once
# per parameters like every other lowered primitive.
_linear_solve_jax = jsolves.linear_solve_p
custom_linear_solve_p = defprim("custom_linear_solve", _linear_solve_jax, multiple_results=True)
shape_rules[custom_linear_solve_p] = lambda *avals, const_lengths, jaxprs: [
    Aval(a.shape, a.dtype, a.weak_type) for a in jaxprs.solve.out_avals]


def _translate_custom_linear_solve(params):
    """Lifting's translation of a JAX custom_linear_solve equation: the
    same parameters, jaxprs kept as they are for the rules borrowed from
    JAX (NOTE [custom_linear_solve])."""
    return custom_linear_solve_p, params


_translate_custom_linear_solve.primitive = custom_linear_solve_p
LIFT_RULES["custom_linear_solve"] = _translate_custom_linear_solve


def _split(args, const_lengths):
    """(matvec, vecmat, solve, transpose_solve) operand groups, and b."""
    groups = []
    start = 0
    for n in const_lengths:
        groups.append(list(args[start:start + n]))
        start += n
    return groups, list(args[start:])


@functools.lru_cache(maxsize=256)
def _matvec_tangent(matvec, nonzero):
    """`(consts, live_dots, x) -> dA x` as a JAX function: the jvp of the
    matvec program in its constants (marked `nonzero`), at fixed x."""
    fun = jcore.jaxpr_as_fun(matvec)
    idx = [i for i, nz in enumerate(nonzero) if nz]

    def tangent(consts, dots, x):
        def f(*dconsts):
            full = list(consts)
            for i, c in zip(idx, dconsts):
                full[i] = c
            return fun(*full, *x)

        return list(jax.jvp(f, [consts[i] for i in idx], list(dots))[1])

    return tangent


def _custom_linear_solve_jvp(primals, tangents, *, const_lengths, jaxprs):
    params = dict(const_lengths=const_lengths, jaxprs=jaxprs)
    x = bind(custom_linear_solve_p, *primals, **params)
    consts, _ = _split(primals, const_lengths)
    dconsts, db = _split(tangents, const_lengths)
    n_b = len(db)
    # Only the operator (matvec) and b define x; the constants of vecmat
    # and of the solvers do not (the solvers must return A^{-1} b).
    nonzero = tuple(type(t) is not Zero and _inexact(aval_of(c).dtype)
                    for c, t in zip(consts[0], dconsts[0]))
    rhs = list(db)
    if any(nonzero):
        fn = _matvec_tangent(jaxprs.matvec, nonzero)
        live = [t for t, nz in zip(dconsts[0], nonzero) if nz]
        dAx = call_lifted(fn, (consts[0], live, list(x[:n_b])), {})
        rhs = [add_tangents(t, neg(m)) for t, m in zip(rhs, dAx)]
    aux = [Zero.of(o) for o in x[n_b:]]
    if all(type(t) is Zero for t in rhs):
        return x, [Zero.of(o) for o in x[:n_b]] + aux
    rhs = [instantiate(t) for t in rhs]
    flat_consts = [c for group in consts for c in group]
    dx = bind(custom_linear_solve_p, *flat_consts, *rhs, **params)
    return x, list(dx[:n_b]) + aux


jvp_rules[custom_linear_solve_p] = _custom_linear_solve_jvp


def _custom_linear_solve_transpose(cts, *args, const_lengths, jaxprs):
    consts, b = _split(args, const_lengths)
    if any(is_linear(c) for group in consts for c in group):
        raise MissingRuleError(
            "reverse-mode: `custom_linear_solve` is linear in its right-hand "
            "side only (functx internal error: its jvp should not have "
            "produced a tangent in the operator's constants)."
        )
    if jaxprs.transpose_solve is None:
        raise MissingRuleError(
            "reverse-mode (grad, vjp, jacrev): `custom_linear_solve` was "
            "called without `transpose_solve`, so functx (like JAX) cannot "
            "transpose the solve. Pass transpose_solve= (or symmetric=True "
            "for a symmetric operator) to jax.lax.custom_linear_solve, or use "
            "forward mode (jvp, jacfwd)."
        )
    n_b = len(b)
    if any(type(c) is not Zero for c in cts[n_b:]):
        raise MissingRuleError(
            "reverse-mode: `custom_linear_solve` cannot be differentiated in "
            "its auxiliary outputs (has_aux=True); JAX cannot either. Apply "
            "functx.lax.stop_gradient to them."
        )
    if all(type(c) is Zero for c in cts[:n_b]):
        return [None] * sum(const_lengths) + [
            Zero(v.aval) if is_linear(v) else None for v in b]
    x_cts = [instantiate(c) for c in cts[:n_b]]
    # The transposed operator: matvec <-> vecmat, solve <-> transpose_solve.
    matvec, vecmat, solve, transpose_solve = consts
    out = bind(custom_linear_solve_p, *vecmat, *matvec, *transpose_solve, *solve, *x_cts,
               const_lengths=const_lengths.transpose(), jaxprs=jaxprs.transpose())
    return [None] * sum(const_lengths) + [
        o if is_linear(v) else None for o, v in zip(out[:n_b], b)]


transpose_rules[custom_linear_solve_p] = _custom_linear_solve_transpose


@functools.lru_cache(maxsize=256)
def _batched_linear_solve(dims, const_lengths, jaxprs):
    solve = functools.partial(_linear_solve_jax.bind, const_lengths=const_lengths,
                              jaxprs=jaxprs)
    return jax.vmap(solve, in_axes=dims)


def _custom_linear_solve_batch(size, vals, dims, *, const_lengths, jaxprs):
    fn = _batched_linear_solve(tuple(dims), const_lengths, jaxprs)
    out = call_lifted(fn, tuple(vals), {})
    return out, [0] * len(out)


batch_rules[custom_linear_solve_p] = _custom_linear_solve_batch

__all__ = [
    "cholesky_p", "eig_p", "eigh_p", "lu_p", "qr_p", "svd_p", "triangular_solve_p",
    "tridiagonal_solve_p", "lu_pivots_to_permutation_p", "custom_linear_solve_p",
]
