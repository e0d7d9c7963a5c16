"""The op table: one record per primitive (and per notable parameter
variant), swept by tests/test_primitives.py over every composition.

Each record is a JAX function of positional arrays; functx runs it through
`functx.lift`, so every equation becomes a functx primitive and JAX's own
transforms of the same function are the oracle. Known gaps are declared in
XFAIL with a reason, never hidden.
"""

import dataclasses
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass
class Op:
    name: str
    fn: Callable
    gens: list  # one generator rng -> np.ndarray per positional argument
    diff: tuple = None  # differentiable argument indices (default: all float args)
    order: int = 2  # derivative order checked
    nondiff: bool = False  # output does not depend smoothly on inputs: zero tangents
    tol: float = 1e-6
    batch: bool = True
    fd: bool = True  # compare with finite differences (not for quantizing ops)


def U(shape, lo=-2.0, hi=2.0, dtype=np.float64):
    return lambda rng: rng.uniform(lo, hi, shape).astype(dtype)


def Away(shape, lo=0.3, hi=2.0):
    """Uniform with magnitude in [lo, hi] and random sign (away from 0)."""
    return lambda rng: (rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float64)


def I(shape, lo, hi, dtype=np.int32):
    return lambda rng: rng.integers(lo, hi, shape).astype(dtype)


def B(shape):
    return lambda rng: rng.random(shape) < 0.5


def Perm(n, shape_prefix=()):
    return lambda rng: np.stack(
        [rng.permutation(n) for _ in range(int(np.prod(shape_prefix, dtype=int)) or 1)]
    ).reshape(shape_prefix + (n,)).astype(np.int32)


S = (2, 3)  # the default shape: small, to keep compilation cheap

OPS = []


def op(*args, **kwargs):
    OPS.append(Op(*args, **kwargs))


# --------------------------------------------------------------------------
# Elementwise unary

for _name, _fn, _gen in [
    ("neg", lax.neg, U(S)),
    ("sin", lax.sin, U(S)),
    ("cos", lax.cos, U(S)),
    ("tan", lax.tan, U(S, -1.2, 1.2)),
    ("asin", lax.asin, U(S, -0.9, 0.9)),
    ("acos", lax.acos, U(S, -0.9, 0.9)),
    ("atan", lax.atan, U(S)),
    ("sinh", lax.sinh, U(S)),
    ("cosh", lax.cosh, U(S)),
    ("tanh", lax.tanh, U(S)),
    ("asinh", lax.asinh, U(S)),
    ("acosh", lax.acosh, U(S, 1.2, 3.0)),
    ("atanh", lax.atanh, U(S, -0.9, 0.9)),
    ("exp", lax.exp, U(S)),
    ("exp2", lax.exp2, U(S)),
    ("log", lax.log, U(S, 0.3, 3.0)),
    ("log1p", lax.log1p, U(S, -0.7, 3.0)),
    ("expm1", lax.expm1, U(S)),
    ("sqrt", lax.sqrt, U(S, 0.3, 3.0)),
    ("rsqrt", lax.rsqrt, U(S, 0.3, 3.0)),
    ("cbrt", lax.cbrt, Away(S)),
    ("logistic", lax.logistic, U(S)),
    ("erf", lax.erf, U(S)),
    ("erfc", lax.erfc, U(S)),
    ("erf_inv", lax.erf_inv, U(S, -0.9, 0.9)),
    ("lgamma", lax.lgamma, U(S, 0.3, 3.0)),
    ("digamma", lax.digamma, U(S, 0.3, 3.0)),
    ("abs", lax.abs, Away(S)),
    ("square", lax.square, U(S)),
    ("integer_pow_3", lambda x: lax.integer_pow(x, 3), U(S)),
    ("integer_pow_neg2", lambda x: lax.integer_pow(x, -2), Away(S)),
    ("integer_pow_1", lambda x: lax.integer_pow(x, 1), U(S)),
    ("integer_pow_0", lambda x: lax.integer_pow(x, 0), U(S)),
    ("reduce_precision", lambda x: lax.reduce_precision(x, 8, 23), U(S)),
    ("copy", lambda x: lax.copy_p.bind(x), U(S)),
    ("tanh_f32", lax.tanh, U(S, dtype=np.float32)),
]:
    op(_name, _fn, [_gen], tol=1e-6 if "f32" not in _name else 1e-4, fd=_name != "reduce_precision")

for _name, _fn, _gen in [
    ("sign", lax.sign, Away(S)),
    ("floor", lax.floor, U(S)),
    ("ceil", lax.ceil, U(S)),
    ("round", lax.round, U(S)),
    ("is_finite", lax.is_finite, U(S)),
    ("stop_gradient", lax.stop_gradient, U(S)),
    ("not", lax.bitwise_not, I(S, 0, 100)),
    ("population_count", lax.population_count, I(S, 0, 100)),
    ("clz", lax.clz, I(S, 0, 100)),
]:
    op(_name, _fn, [_gen], nondiff=True)

# --------------------------------------------------------------------------
# Elementwise binary, with lax broadcasting variants

for _name, _fn, _g0, _g1 in [
    ("add", lax.add, U(S), U(S)),
    ("sub", lax.sub, U(S), U(S)),
    ("mul", lax.mul, U(S), U(S)),
    ("div", lax.div, U(S), Away(S)),
    ("rem", lax.rem, U(S, 0.1, 0.9), U(S, 1.1, 2.0)),
    ("pow", lax.pow, U(S, 0.3, 2.0), U(S)),
    ("max", lax.max, U(S), U(S)),
    ("min", lax.min, U(S), U(S)),
    ("atan2", lax.atan2, U(S), Away(S)),
    ("add_scalar", lax.add, U(S), U(())),
    ("mul_scalar", lax.mul, U(()), U(S)),
    ("div_size1", lax.div, U((2, 1)), Away((1, 3))),
    ("max_size1", lax.max, U((2, 1)), U((2, 3))),
    ("igamma", lax.igamma, U(S, 0.5, 3.0), U(S, 0.5, 3.0)),
    ("igammac", lax.igammac, U(S, 0.5, 3.0), U(S, 0.5, 3.0)),
]:
    op(_name, _fn, [_g0, _g1], order=1 if _name.startswith("igamma") else 2)

# Primitives of newer releases (log2, one_minus_square: jax 0.11.2+;
# polynomial: 0.12+); older ones compose them, and have no records for them.
if hasattr(lax, "log2_p"):
    op("log2", lax.log2, [U(S, 0.3, 3.0)])
if hasattr(lax, "one_minus_square_p"):
    op("one_minus_square", lax.one_minus_square, [U(S)])
if hasattr(lax, "polynomial_p"):
    # coefficients of every broadcast: equal shape, rank 0, size-1 dims
    op("polynomial", lambda x, a, b, c: lax.polynomial(x, [a, b, c]),
       [U(S), U(S), U(()), U((2, 1))])
    # past the unrolled length (8 terms) the primitive lowers to a scan
    op("polynomial_long", lambda x, c: lax.polynomial(x, [c[i] for i in range(10)]),
       [U(S, -1.0, 1.0), U((10,))])
    op("polynomial_scalar_x", lambda x, a, b: lax.polynomial(x, [a, b]), [U(()), U(S), U(S)])
if hasattr(lax, "sinpi_p"):  # jax 0.12.1+
    op("sinpi", lax.sinpi, [U(S)])
    op("cospi", lax.cospi, [U(S)])
    op("tanpi", lax.tanpi, [U(S, -0.4, 0.4)])
    op("asinpi", lax.asinpi, [U(S, -0.9, 0.9)])
    op("acospi", lax.acospi, [U(S, -0.9, 0.9)])
    op("atanpi", lax.atanpi, [U(S)])
    op("atan2pi", lax.atan2pi, [U(S), Away(S)])
    op("exp2m1", lax.exp2m1, [U(S)])
    op("log2p1", lax.log2p1, [U(S, -0.5, 2.0)])
    # operands of every broadcast lax's n-ary operations take
    op("fma", lax.fma, [U(S), U(S), U(S)])
    op("fma_scalar", lambda a, b, c: lax.fma(a, b, c), [U(()), U(S), U(())])
    op("fmuladd", lax.fmuladd, [U(S), U(S), U(S)])

op("polygamma", lax.polygamma, [lambda rng: np.full(S, 1.0), U(S, 0.5, 3.0)], diff=(1,))
op("pow_int_exponent", lax.pow, [U(S, 0.3, 2.0), I(S, -2, 3)], diff=(0,))

for _name, _fn, _g0, _g1 in [
    ("eq", lax.eq, I(S, 0, 3), I(S, 0, 3)),
    ("ne", lax.ne, U(S), U(S)),
    ("lt", lax.lt, U(S), U(S)),
    ("le", lax.le, U(S), U(S)),
    ("gt", lax.gt, U(S), U(S)),
    ("ge", lax.ge, U(S), U(S)),
    ("and", lax.bitwise_and, I(S, 0, 100), I(S, 0, 100)),
    ("or", lax.bitwise_or, B(S), B(S)),
    ("xor", lax.bitwise_xor, I(S, 0, 100), I(S, 0, 100)),
    ("shift_left", lax.shift_left, I(S, 0, 100), I(S, 0, 5)),
    ("shift_right_arithmetic", lax.shift_right_arithmetic, I(S, -100, 100), I(S, 0, 5)),
    ("shift_right_logical", lax.shift_right_logical, I(S, 0, 100), I(S, 0, 5)),
]:
    op(_name, _fn, [_g0, _g1], nondiff=True)

# JAX defines no derivative of nextafter; functx raises too (test_errors)
op("nextafter", lax.nextafter, [U(S), U(S)], diff=())
op("select_n", lax.select_n, [B(S), U(S), U(S)])
op("select_n_3way", lax.select_n, [I(S, 0, 3), U(S), U(S), U(S)])
op("select_n_scalar_pred", lax.select_n, [B(()), U(S), U(S)])
# JAX's own jvp of clamp fails for rank-0 bounds with tangents, so only the
# operand is differentiated there; clamp_arrays differentiates the bounds.
op("clamp", lax.clamp, [U((), -1.5, -0.5), U(S), U((), 0.5, 1.5)], diff=(1,))
op("clamp_arrays", lax.clamp, [U(S, -1.5, -0.5), U(S), U(S, 0.5, 1.5)])
op("convert_f64_f32", lambda x: lax.convert_element_type(x, np.float32), [U(S)], tol=1e-6, fd=False)
op("convert_f32_f64", lambda x: lax.convert_element_type(x, np.float64), [U(S, dtype=np.float32)])
op("convert_f64_i32", lambda x: lax.convert_element_type(x, np.int32), [U(S)], nondiff=True)
op("convert_i32_f64", lambda x: lax.convert_element_type(x, np.float64), [I(S, -5, 5)], nondiff=True)

# --------------------------------------------------------------------------
# Shape-changing

op("broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (4, 2, 3), (1, 2)), [U(S)])
op("broadcast_in_dim_size1", lambda x: lax.broadcast_in_dim(x, (2, 4, 3), (0, 2)), [U((1, 3))])
op("broadcast_scalar", lambda x: lax.broadcast_in_dim(x, (2, 3), ()), [U(())])
op("reshape", lambda x: lax.reshape(x, (3, 2)), [U(S)])
op("reshape_flat", lambda x: jnp.ravel(x), [U((2, 2, 3))])
op("squeeze", lambda x: lax.squeeze(x, (1,)), [U((2, 1, 3))])
op("expand_dims", lambda x: lax.expand_dims(x, (0, 2)), [U(S)])
op("transpose", lambda x: lax.transpose(x, (2, 0, 1)), [U((2, 3, 4))])
op("rev", lambda x: lax.rev(x, (0, 1)), [U(S)])
op("concatenate", lambda x, y: lax.concatenate([x, y, x], 1), [U(S), U((2, 2))])
op("stack", lambda x, y: jnp.stack([x, y], axis=1), [U(S), U(S)])
op("unstack", lambda x: jnp.unstack(x, axis=1), [U(S)])
op("split", lambda x: jnp.split(x, [1], axis=1), [U(S)])
op("tile", lambda x: jnp.tile(x, (2, 2)), [U(S)])
op("pad", lambda x, v: lax.pad(x, v, ((1, 2, 0), (0, 1, 1))), [U(S), U(())])
op("pad_negative", lambda x: lax.pad(x, 0.0, ((-1, 1, 0), (1, -1, 0))), [U(S)])
op("slice", lambda x: lax.slice(x, (0, 1), (2, 3)), [U(S)])
op("slice_strided", lambda x: lax.slice(x, (0, 0), (3, 5), (2, 2)), [U((3, 5))])
op("dynamic_slice", lambda x, i: lax.dynamic_slice(x, (i, 1), (2, 2)), [U((4, 3)), I((), 0, 3, np.int64)])
op("dynamic_update_slice", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 0)),
   [U((4, 3)), U((2, 3)), I((), 0, 3, np.int64)])
op("index_int", lambda x: x[1], [U(S)])
op("index_traced_int", lambda x, i: x[i], [U((4, 3)), I((), 0, 4)])

# --------------------------------------------------------------------------
# gather / scatter through jax.numpy indexing

op("gather_take", lambda x, i: x[i], [U((5, 3)), I((4,), 0, 5)])
op("gather_columns", lambda x, i: x[:, i], [U((3, 5)), I((2, 2), 0, 5)])
op("gather_pairs", lambda x, i, j: x[i, j], [U((4, 5)), I((3,), 0, 4), I((3,), 0, 5)])
op("take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1), [U((3, 4)), I((3, 2), 0, 4)])
op("gather_fill", lambda x, i: jnp.take(x, i, mode="fill", fill_value=0.0), [U((5,)), I((4,), 0, 7)])
op("gather_clip", lambda x, i: jnp.take(x, i, mode="clip"), [U((5,)), I((4,), 0, 7)])
op("scatter_add", lambda x, i, u: jnp.asarray(x).at[i].add(u), [U((5, 3)), I((4,), 0, 5), U((4, 3))])
op("scatter_set_unique", lambda x, u: jnp.asarray(x).at[1:3].set(u), [U((5, 3)), U((2, 3))])
op("scatter_set_point", lambda x, u: jnp.asarray(x).at[2, 1].set(u), [U((5, 3)), U(())])
op("scatter_set", lambda x, i, u: jnp.asarray(x).at[i].set(u), [U((5, 3)), I((4,), 0, 5), U((4, 3))])
op("scatter_mul", lambda x, i, u: jnp.asarray(x).at[i].multiply(u, unique_indices=True),
   [U((5,)), lambda rng: rng.permutation(5)[:3].astype(np.int32), U((3,))])
op("scatter_mul_repeated", lambda x, i, u: jnp.asarray(x).at[i].multiply(u),
   [U((5,)), I((4,), 0, 3), U((4,))], diff=(0,))
op("scatter_sub", lambda x, i, u: lax.scatter_sub(
    x, i[:, None], u, lax.ScatterDimensionNumbers((1,), (0,), (0,))), [U((5, 3)), I((4,), 0, 5), U((4, 3))])
op("scatter_min", lambda x, i, u: jnp.asarray(x).at[i].min(u), [U((5,)), I((4,), 0, 3), U((4,))])
op("scatter_max", lambda x, i, u: jnp.asarray(x).at[i].max(u), [U((5, 2)), I((4,), 0, 3), U((4, 2))])

# --------------------------------------------------------------------------
# dot_general

op("matmul", jnp.matmul, [U((2, 3)), U((3, 4))])
op("matvec", jnp.matmul, [U((2, 3)), U((3,))])
op("vdot", jnp.dot, [U((3,)), U((3,))])
op("batched_matmul", jnp.matmul, [U((2, 2, 3)), U((2, 3, 2))])
op("einsum_batch_contract", lambda x, y: jnp.einsum("bij,jbk->bki", x, y), [U((2, 3, 4)), U((4, 2, 3))])
op("dot_general_f32", jnp.matmul, [U((2, 3), dtype=np.float32), U((3, 2), dtype=np.float32)], tol=1e-5)

# --------------------------------------------------------------------------
# conv_general_dilated

op("conv2d_same", lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME"),
   [U((1, 2, 4, 4)), U((3, 2, 3, 3))])
op("conv2d_strided_dilated", lambda x, w: lax.conv_general_dilated(
    x, w, (2, 1), ((1, 0), (0, 1)), lhs_dilation=(1, 2), rhs_dilation=(2, 1)),
   [U((2, 2, 5, 4)), U((2, 2, 2, 2))])
op("conv1d_grouped_nwc", lambda x, w: lax.conv_general_dilated(
    x, w, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=2),
   [U((2, 5, 4)), U((3, 2, 4))])
# reshape with `dimensions` (a transpose first) comes from lifted JAX code,
# e.g. JAX's own batching and transposition of grouped convolutions
op("reshape_dimensions", lambda x: lax.reshape(x, (6, 2), dimensions=(2, 0, 1)), [U((2, 3, 2))])

# --------------------------------------------------------------------------
# Reductions and scans

op("reduce_sum", lambda x: lax.reduce_sum(x, (1,)), [U((2, 3, 2))])
op("reduce_sum_all", jnp.sum, [U(S)])
op("reduce_max", lambda x: lax.reduce_max(x, (0,)), [U((3, 2))])
op("reduce_min", lambda x: lax.reduce_min(x, (1, 2)), [U((2, 3, 2))])
op("reduce_prod", lambda x: lax.reduce_prod(x, (1,)), [U((2, 3))])
op("reduce_prod_zero", lambda x: jnp.prod(jnp.asarray(x).at[0, 1].set(0.0), axis=1), [U((2, 3))])
op("mean_var", lambda x: jnp.var(x, axis=0) + jnp.mean(x), [U((3, 2))])
op("logsumexp", lambda x: jax.nn.logsumexp(x, axis=1), [U(S)])
op("softmax", lambda x: jax.nn.softmax(x, axis=-1), [U(S)])
op("argmax", lambda x: jnp.argmax(x, axis=1), [U(S)], nondiff=True)
op("argmin", lambda x: jnp.argmin(x, axis=0), [U(S)], nondiff=True)
op("reduce_and", lambda x: jnp.all(x, axis=1), [B(S)], nondiff=True)
op("reduce_or", lambda x: jnp.any(x, axis=0), [B(S)], nondiff=True)
op("cumsum", lambda x: lax.cumsum(x, 1), [U(S)])
op("cumsum_reverse", lambda x: lax.cumsum(x, 0, reverse=True), [U(S)])
op("cumprod", lambda x: lax.cumprod(x, 1), [U(S)])
op("cumprod_reverse", lambda x: lax.cumprod(x, 0, reverse=True), [U((3, 2))])
op("cummax", lambda x: lax.cummax(x, 1), [U(S)])
op("cummin", lambda x: lax.cummin(x, 0, reverse=True), [U((3, 2))])
op("cumlogsumexp", lambda x: lax.cumlogsumexp(x, 1), [U(S)])

# --------------------------------------------------------------------------
# Sorting

op("sort", lambda x: jnp.sort(x, axis=1), [U(S)])
op("sort_axis0", lambda x: jnp.sort(x, axis=0), [U((3, 2))])
op("sort_multi", lambda x, y: lax.sort((x, y), dimension=1, num_keys=1), [U(S), U(S)])
op("argsort", lambda x: jnp.argsort(x, axis=1), [U(S)], nondiff=True)

# --------------------------------------------------------------------------
# Complex numbers. The sweep differentiates real arguments only, so a
# complex record takes real arrays whose last axis holds the real and
# imaginary parts (`_c`), and returns each complex result as its (real,
# imag) pair: a complex function is then checked as the real map it is
# (C = R^2) against JAX and finite differences. tests/test_misc_prims.py
# checks JAX's conventions with complex tangents and cotangents directly.


def _split(z):
    """Complex results as (real, imag) pairs; real ones as they are."""
    if isinstance(z, tuple):
        return tuple(_split(x) for x in z)
    if jnp.iscomplexobj(z):
        return lax.real(z), lax.imag(z)
    return z


def _c(f):
    """`f` of one complex argument, as a function of one real array whose
    last axis (of size 2) holds the real and imaginary parts."""
    return lambda x: _split(f(lax.complex(x[..., 0], x[..., 1])))


def Cx(shape, lo=-2.0, hi=2.0):
    """A complex argument of `shape` for `_c`: uniform real and imaginary parts."""
    return U(shape + (2,), lo, hi)


def CxAway(shape):
    return Away(shape + (2,))


op("complex_holomorphic", _c(lambda z: lax.exp(z) / (z * z + 1.0) + jnp.sum(z * z, axis=1,
                                                                            keepdims=True)),
   [Cx(S, -1.0, 1.0)], order=1)
op("complex_abs_conj", _c(lambda z: (lax.abs(z), lax.conj(z) * z * z)), [CxAway(S)])


def _complex_mixed(parts):
    """dot_general of complex operands; conj of a real input (a complex
    result); converts between real and complex."""
    x, y = parts[..., 0], parts[..., 1]
    z = lax.complex(x, y)
    with warnings.catch_warnings():  # complex -> real keeps the real part, as intended
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        back = lax.convert_element_type(
            lax.complex(y, x) * lax.convert_element_type(x, np.complex128), np.float64)
    return _split((z @ lax.conj(z).T, lax.conj(x) * z)) + (back,)


op("complex_mixed", _complex_mixed, [Cx(S)], order=1)

# --------------------------------------------------------------------------
# fft: every fft_type, over 1 to 3 trailing axes (linear: the second-order
# checks transpose the transposes, which for rfft/irfft are other types)

_T = lax.FftType
op("fft_ifft", _c(lambda z: (lax.fft(z, _T.FFT, (3,)), lax.fft(z, _T.IFFT, (2, 3)))),
   [Cx(S)], order=1)
op("rfft", lambda x: (_split(lax.fft(x, _T.RFFT, (4,))),
                      _split(lax.fft(x[:, :3], _T.RFFT, (2, 3)))), [U((2, 4))])
op("irfft", _c(lambda z: (lax.fft(z, _T.IRFFT, (4,)), lax.fft(z, _T.IRFFT, (2, 2, 5)))),
   [Cx((2, 2, 3))])

# --------------------------------------------------------------------------
# Windowed reductions (pooling) and the selections their derivatives use

op("reduce_window_sum", lambda x: (
    lax.reduce_window(x, 0.0, lax.add, (2, 2), (2, 1), ((1, 0), (0, 1))),
    lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 2), "VALID", base_dilation=(2, 1),
                      window_dilation=(1, 2))), [U((3, 5))])
op("max_pool", lambda x: (
    lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID"),
    lax.reduce_window(x, -jnp.inf, lax.max, (3, 2), (1, 1), "SAME")), [U((4, 4))])
# base dilation 2 with windows of 2: every window holds one real entry
op("min_pool_base_dilation", lambda x: lax.reduce_window(
    x, jnp.inf, lax.min, (2, 2), (1, 2), ((0, 0), (1, 1)), base_dilation=(2, 1)),
   [U((3, 4))])
# JAX's vjp of max pooling is a select_and_scatter_add of the cotangent
op("select_and_scatter_add", lambda x, ct: jax.vjp(
    lambda y: lax.reduce_window(y, -jnp.inf, lax.max, (2, 2), (1, 2), "VALID"), x)[1](ct)[0],
   [U((3, 4)), U((2, 2))], order=1)

# --------------------------------------------------------------------------
# top_k, approx_top_k

op("top_k", lambda x: (lax.top_k(x, 2)[0], lax.top_k(x, 2, axis=0)[0], lax.approx_max_k(x, 2)[0]),
   [U((3, 4))], order=1)

# --------------------------------------------------------------------------
# Special functions and the rest of the elementwise family. Their lowerings
# are large (series, continued fractions), so shapes are minimal and the
# batching checks, those of the shared broadcasting rule, are left to the
# cheaper records. zeta (JAX has no derivative for it to compare with) and
# the derivatives JAX does not define are checked in tests/test_misc_prims.py.


op("bessel_i0e_i1e", lambda x: (lax.bessel_i0e(x), lax.bessel_i1e(x)), [U((3,), -3.0, 3.0)],
   order=1, batch=False)
op("betainc_x", lax.betainc, [U((2,), 0.5, 3.0), U((2,), 0.5, 3.0), U((2,), 0.1, 0.9)],
   diff=(2,), order=1, batch=False)
_ties = lambda rng: rng.integers(0, 3, (3,)).astype(np.float64)  # noqa: E731
op("total_order_compare", lambda x, y: (lax.eq_to_p.bind(x, y), lax.le_to_p.bind(x, y),
                                        lax.lt_to_p.bind(x, y)), [_ties, _ties], nondiff=True)
# unsigned: XLA:CPU fails to compile some fusions of a signed mulhi (JAX's own too)
_u32 = I((3,), 0, 2**31 - 1, np.uint32)
op("mulhi", lambda x, y: jax._src.lax.lax.mulhi(x, y), [_u32, _u32], nondiff=True)
op("bitcast", lambda x: (lax.bitcast_convert_type(x, np.int64),
                         lax.bitcast_convert_type(x, np.int32)), [U(S)], nondiff=True)
op("bitcast_wide", lambda x: lax.bitcast_convert_type(x, np.int64), [I((2, 2), -100, 100)],
   nondiff=True)

# --------------------------------------------------------------------------
# Known gaps: name -> reason. Checked: each listed record does fail.

XFAIL = {}
