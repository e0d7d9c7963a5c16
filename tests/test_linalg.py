"""Linear algebra under functx transforms (functx/primitives/linalg.py).

* One op-table record per linalg primitive (and notable parameter
  variants), swept through every composition of the op sweeps
  (tests/sweep.py: jvp, vjp, jvp∘vjp, vjp∘vjp, jvp∘jvp, vmap∘vjp, vmap at
  every batch placement) against JAX's own transforms and finite
  differences, all inside one `jax.jit` per record.
* The public functions of functx.numpy.linalg under grad, jvp, vmap,
  jacrev, jacfwd and hessian against the same JAX transforms of
  jax.numpy.linalg (tests/op_table_public.py sweeps them one by one).
* The derivatives JAX refuses raise functx's MissingRuleError.

Inputs are well conditioned: SPD matrices for cholesky, distinct
eigenvalues and singular values for eigh / eig / svd. Sign-ambiguous
factors are compared through invariants (eigenvalues and the projectors
v_i v_i^T, singular values and u_i v_i^T); qr and lu factors are compared
directly, as functx reproduces JAX's (LAPACK's) convention.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.scipy import linalg as jsl

import functx as fx
from functx.lifting import LIFT_RULES
import sweep
import xla_options
from op_table import Op, U

LL = lax.linalg

# --------------------------------------------------------------------------
# Input generators


def WellCond(m, n=None):
    """A random matrix with singular values in [1, 2] (distinct)."""
    n = m if n is None else n

    def gen(rng):
        k = min(m, n)
        u, _ = np.linalg.qr(rng.standard_normal((m, k)))
        v, _ = np.linalg.qr(rng.standard_normal((n, k)))
        s = np.linspace(1.0, 2.0, k) + rng.uniform(0, 0.1, k)
        return (u * s) @ v.T + 0.0

    return gen


def SPD(n):
    def gen(rng):
        m = rng.uniform(-1, 1, (n, n))
        return m @ m.T + n * np.eye(n)

    return gen


def Sym(n):
    """Symmetric with eigenvalues at least 0.8 apart."""
    def gen(rng):
        q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        w = np.arange(n) - 1.0 + rng.uniform(0, 0.2, n)
        return (q * w) @ q.T

    return gen


def NonSym(n):
    """Non-symmetric with distinct (complex) eigenvalues."""
    def gen(rng):
        return rng.uniform(-1, 1, (n, n)) + np.diag(np.arange(n) * 1.5)

    return gen


def Tri(n):
    """Well-conditioned for a triangular solve in either triangle."""
    def gen(rng):
        return rng.uniform(-0.5, 0.5, (n, n)) + np.diag(rng.uniform(2, 3, n))

    return gen


def _outer_pairs(u, vt):
    """u_i v_i^T for every i: invariant under the sign flip of a pair."""
    return jnp.einsum("...ik,...kj->...kij", u, vt)


def _eigh_inv(x):
    v, w = LL.eigh(x)
    return w, _outer_pairs(v, jnp.swapaxes(v, -1, -2))


def _svd_inv(x, full_matrices=False):
    u, s, vt = LL.svd(x, full_matrices=full_matrices)
    k = s.shape[-1]
    return s, _outer_pairs(u[..., :k], vt[..., :k, :])


def _ri(z):
    return jnp.real(z), jnp.imag(z)


def _eig_vecs(x):
    w, v = LL.eig(x, compute_left_eigenvectors=False, enable_eigvec_derivs=True)
    return _ri(w), _ri(v)


def _solve_explicit(a, b):
    return lax.custom_linear_solve(
        lambda x: a @ x, b,
        solve=lambda _, r: jnp.linalg.solve(a, r),
        transpose_solve=lambda _, r: jnp.linalg.solve(a.T, r))


def _solve_symmetric(a, b):
    a = (a + a.T) / 2  # matvec and solve must agree in every direction of a
    factor = jsl.cho_factor(a, lower=True)
    return lax.custom_linear_solve(
        lambda x: a @ x, b, solve=lambda _, r: jsl.cho_solve(factor, r), symmetric=True)


# Compiling the large derivative programs is most of these tests' time;
# the comparisons need no optimised code, so XLA's CPU backend is told to
# skip its optimisations and (where this jaxlib still has the option) its
# slower-to-compile fusion emitters: about 3x less compile time on jax 0.10.
_FAST_COMPILE = xla_options.compile_options(xla_options.CHEAP)


def _compiled(fn, operands):
    return jax.jit(fn).lower(*operands).compile(compiler_options=_FAST_COMPILE)


OPS = [
    Op("cholesky", LL.cholesky, [SPD(3)]),
    Op("triangular_solve_left_lower", lambda a, b: LL.triangular_solve(
        a, b, left_side=True, lower=True), [Tri(3), U((3, 2))]),
    Op("triangular_solve_right_upper_T", lambda a, b: LL.triangular_solve(
        a, b, left_side=False, lower=False, transpose_a=True), [Tri(3), U((2, 3))]),
    Op("triangular_solve_unit_diagonal", lambda a, b: LL.triangular_solve(
        a, b, left_side=True, lower=True, transpose_a=True, unit_diagonal=True),
        [Tri(3), U((3, 2))]),
    Op("lu", lambda x: LL.lu(x)[0], [WellCond(3)]),
    Op("lu_pivots_permutation", lambda x: LL.lu(x)[1:], [WellCond(3)], diff=()),
    Op("lu_pivots_to_permutation", lambda p: LL.lu_pivots_to_permutation(p, 4),
       [lambda rng: rng.integers(0, 4, (3,)).astype(np.int32)]),
    Op("qr_tall", lambda x: LL.qr(x, full_matrices=False), [WellCond(3, 2)]),
    Op("qr_wide", lambda x: LL.qr(x, full_matrices=False), [WellCond(2, 3)], order=1),
    Op("qr_tall_full", lambda x: LL.qr(x, full_matrices=True), [WellCond(3, 2)], order=1),
    Op("eigh", _eigh_inv, [Sym(3)]),
    # JAX's eig jvp computes eigenvectors, which it cannot differentiate
    # again: first order only.
    Op("eig_values", lambda x: _ri(LL.eig(x, compute_left_eigenvectors=False,
                                         compute_right_eigenvectors=False)[0]),
       [NonSym(3)], order=1),
    Op("eig_vectors", _eig_vecs, [NonSym(3)], order=1),
    Op("svd_tall", _svd_inv, [WellCond(3, 2)]),
    Op("svd_square_full", lambda x: _svd_inv(x, full_matrices=True), [WellCond(3)], order=1),
    Op("svd_values_wide", lambda x: LL.svd(x, compute_uv=False), [WellCond(2, 3)]),
    Op("tridiagonal_solve", LL.tridiagonal_solve,
       [U((3,), -1, 1), U((3,), 3, 4), U((3,), -1, 1), U((3, 2))]),
    Op("custom_linear_solve", _solve_explicit, [WellCond(3), U((3,))]),
    Op("custom_linear_solve_symmetric", _solve_symmetric, [SPD(3), U((3,))]),
]


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
@pytest.mark.slow
def test_linalg_primitive_sweep(op):
    case = sweep.prepare(op)  # host arrays; the loop references run in the jit
    results = _compiled(lambda data: sweep.checks(case, data), (case.data,))(case.data)
    sweep.check_results(op, jax.device_get(results))


# --------------------------------------------------------------------------
# functx.numpy.linalg under the public transforms


def _has_cond_rules():
    return "cond" in LIFT_RULES


L = jnp.linalg
RNG = np.random.default_rng(7)
A3 = WellCond(3)(RNG)
A4 = WellCond(4)(RNG)
S3 = SPD(3)(RNG)
Y3 = Sym(3)(RNG)
R32 = WellCond(3, 2)(RNG)
V3 = RNG.uniform(-1, 1, (3,))

# name -> (scalar function of one matrix, its argument). Functions that
# only wrap these paths differently (svdvals, cond, tensorinv, matrix_norm,
# ...) are swept one by one in tests/op_table_public.py.
PUBLIC = {
    "solve": (lambda a: jnp.sum(L.solve(a, V3) ** 2), A3),
    "inv": (lambda a: jnp.sum(jnp.sin(L.inv(a))), A3),
    "cholesky": (lambda a: jnp.sum(jnp.sin(L.cholesky(a))), S3),
    "qr": (lambda a: jnp.sum(jnp.sin(L.qr(a)[1])), R32),
    "eigh": (lambda a: jnp.sum(jnp.sin(_eigh_inv(a)[1])) + jnp.sum(L.eigh(a)[0] ** 3), Y3),
    "eigvalsh": (lambda a: jnp.sum(jnp.sin(L.eigvalsh(a))), Y3),
    "svd": (lambda a: jnp.sum(jnp.sin(_svd_inv(a)[1])) + jnp.sum(L.svd(a)[1] ** 3), A3),
    "pinv": (lambda a: jnp.sum(jnp.sin(L.pinv(a))), R32),
    "lstsq": (lambda a: jnp.sum(L.lstsq(a, V3)[0] ** 2), R32),
    "norm_nuc": (lambda a: L.norm(a, "nuc") ** 2, A3),
    "norm_2": (lambda a: L.norm(a, 2) ** 2, R32),
    "matrix_power_neg": (lambda a: jnp.sum(L.matrix_power(a, -2)), A3),
    "tensorsolve": (lambda a: jnp.sum(L.tensorsolve(a.reshape(2, 2, 4), a[0].reshape(2, 2)) ** 2), A4),
    "eigvals": (lambda a: jnp.sum(jnp.real(L.eigvals(a)) ** 2), NonSym(3)(RNG)),
    "det_4x4": (lambda a: L.det(a) ** 2, A4),
    "slogdet": (lambda a: L.slogdet(a)[1] ** 2, A4),
}
# The hessian (jacfwd of jacrev) is checked where lifting adds something
# to the primitives' own second-order sweep above (custom_linear_solve
# inside solve, JAX's custom_jvp rules of slogdet / pinv, svd inside
# norm); second derivatives cost most of the compile time. (JAX cannot
# differentiate eigvals twice: its eig jvp computes eigenvectors, whose
# derivative needs enable_eigvec_derivs; functx raises as JAX does.)
SECOND_ORDER = {"solve", "pinv", "norm_nuc", "slogdet"}
NEEDS_COND = {"det_4x4", "slogdet"}  # jnp.diagonal emits cond(platform_index)


def _public_params():
    for name in PUBLIC:
        marks = []
        if name in NEEDS_COND:
            marks = [pytest.mark.skipif(not _has_cond_rules(),
                                        reason="needs functx rules for `cond` (control flow)")]
        yield pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", list(_public_params()))
@pytest.mark.slow
def test_public_linalg_under_transforms(name):
    """grad (and finite differences), jvp, vmap(grad) and for some the
    hessian (= jacfwd(jacrev)) of the same jax.numpy.linalg code, lifted."""
    jf, a = PUBLIC[name]
    ff = fx.lift(jf)  # the same code, running on functx values
    t = RNG.standard_normal(a.shape)
    batch = np.stack([a, a + 0.05 * t, a - 0.05 * t])
    eps = 1e-5

    def run(a, t, batch):
        g = fx.grad(ff)(a)
        fd = (jf(a + eps * t) - jf(a - eps * t)) / (2 * eps)
        res = {
            "grad": (g, jax.grad(jf)(a)),
            "grad vs finite differences": (jnp.vdot(g, t), fd),
            "jvp": (fx.jvp(ff, (a,), (t,))[1], jax.jvp(jf, (a,), (t,))[1]),
            "vmap(grad)": (fx.vmap(fx.grad(ff))(batch), jax.vmap(jax.grad(jf))(batch)),
        }
        if name in SECOND_ORDER:
            res["hessian"] = (fx.hessian(ff)(a), jax.hessian(jf)(a))
        return res

    for check, (got, want) in _compiled(run, (a, t, batch))(a, t, batch).items():
        sweep.compare(f"{name}: {check}", got, want, 1e-6)


@pytest.mark.slow
def test_functx_numpy_linalg_directly():
    """functx.numpy.linalg on functx values, eager (no outer jit): the eager
    caches (fused reverse steps, batched steps) replay the same rules."""
    fl = fx.numpy.linalg

    def f(a):
        return fx.numpy.sum(fl.solve(a, V3) ** 2)

    def jf(a):
        return jnp.sum(L.solve(a, V3) ** 2)

    batch = np.stack([A3, A3.T])
    want_grad, want_vmap = jax.jit(lambda a, b: (jax.grad(jf)(a), jax.vmap(jf)(b)))(A3, batch)
    for _ in range(2):  # the second call takes the cached (compiled) paths
        sweep.compare("grad", fx.grad(f)(A3), want_grad, 1e-8)
        sweep.compare("vmap", fx.vmap(f)(batch), want_vmap, 1e-8)


@pytest.mark.slow
def test_matrix_rank_under_vmap():
    fl = fx.numpy.linalg
    batch = np.stack([A3, np.outer(V3, V3), np.zeros((3, 3))])
    got = fx.vmap(lambda a: fl.matrix_rank(a * 1.0))(batch)
    np.testing.assert_array_equal(got, [3, 1, 0])


# --------------------------------------------------------------------------
# Derivatives JAX declines: a clear functx error, never a wrong number


@pytest.mark.slow
def test_svd_full_matrices_non_square_raises():
    f = fx.lift(lambda a: jnp.sum(L.svd(a, full_matrices=True)[0]))
    with pytest.raises(fx.MissingRuleError, match="svd"):
        fx.grad(f)(R32)
    # without the vectors, or reduced, it is defined
    g = lambda a: jnp.sum(L.svd(a, full_matrices=False)[0] ** 2)  # noqa: E731
    sweep.compare("svd reduced", jax.jit(fx.grad(fx.lift(g)))(R32), jax.grad(g)(R32), 1e-8)


def test_eig_vectors_need_opt_in():
    f = fx.lift(lambda a: jnp.sum(jnp.abs(L.eig(a)[1])))
    with pytest.raises(fx.MissingRuleError, match="eig.*enable_eigvec_derivs"):
        fx.grad(f)(NonSym(3)(RNG))


@pytest.mark.slow
def test_custom_linear_solve_without_transpose_solve():
    """Forward mode needs only `solve`; reverse mode needs `transpose_solve`."""
    def f(a, b):
        return lax.custom_linear_solve(lambda x: a @ x, b,
                                       solve=lambda _, r: jnp.linalg.solve(a, r))

    ff = fx.lift(f)
    sweep.compare("jvp", fx.jvp(ff, (A3, V3), (A3, V3))[1], jax.jvp(f, (A3, V3), (A3, V3))[1], 1e-8)
    sweep.compare("vmap", fx.vmap(ff, in_dims=(None, 0))(A3, np.stack([V3, 2 * V3])),
             jax.vmap(f, in_axes=(None, 0))(A3, np.stack([V3, 2 * V3])), 1e-8)
    with pytest.raises(fx.MissingRuleError, match="transpose_solve"):
        fx.grad(lambda b: fx.numpy.sum(ff(A3, b)))(V3)


_NONLINEAR_OF_FACTORS = {
    "qr": lambda a: jnp.sum(jnp.sin(jnp.linalg.qr(a)[0])) + jnp.sum(jnp.linalg.qr(a)[1] ** 2),
    "svd": lambda a: (jnp.sum(jnp.cos(jnp.linalg.svd(a, full_matrices=False)[0]))
                      + jnp.sum(jnp.linalg.svd(a, full_matrices=False)[1] ** 3)),
    "eigh": lambda a: (jnp.sum(jnp.sin(jnp.linalg.eigh(a @ a.T)[1]))
                       + jnp.sum(jnp.linalg.eigh(a @ a.T)[0] ** 3)),
}


@pytest.mark.parametrize("name", sorted(_NONLINEAR_OF_FACTORS))
def test_eager_grad_of_factors_used_nonlinearly(name):
    """Eagerly (no enclosing jit), JAX's jvp rule of a decomposition is one
    call taking primals and tangents together; reverse mode must still get
    the factors as primal values (NOTE [calls in a jvp rule] in
    interpreters/reverse.py). `sin(q)` of a qr failed with "mul: both
    operands are linear" before. Repeated calls take the eager caches."""
    f = _NONLINEAR_OF_FACTORS[name]
    a = jnp.asarray(RNG.uniform(-1, 1, (3, 2)) + 2 * np.eye(3, 2))
    batch = jnp.stack([a, a * 0.9, a + 0.1 * np.eye(3, 2)])
    want, want_b = jax.grad(f)(a), jax.vmap(jax.grad(f))(batch)
    g, gb = fx.grad(f), fx.vmap(fx.grad(f))
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(g(a)), np.asarray(want), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(gb(batch)), np.asarray(want_b), rtol=1e-10,
                                   atol=1e-12)
        fx.caches.wait_for_compiles()
