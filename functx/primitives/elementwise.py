"""Elementwise primitives: arithmetic, transcendental and special
functions, comparisons (also the total-order ones), logic and bit
operations, conversions (convert_element_type, bitcast_convert_type),
select and clamp.

Each primitive is followed by its rules. Binary primitives follow lax
broadcasting (equal ranks with size-1 dimensions, or rank-0 operands).
"""

import functools
import math

import jax
import numpy as np
from jax import lax
from jax._src.lax.lax import mulhi_p as _jax_mulhi_p  # not exported by jax.lax

from ..core import (
    Aval, FROM_JAX, Primitive, Zero, aval_of, bind, check_usable, is_complex_dtype,
    is_inexact_dtype,
    is_real_float_dtype,
)
from ..errors import MissingRuleError
from ..interpreters.eval import lower_to_jax
from .common import (
    basis_rules,
    batch_rules,
    broadcast_shapes,
    broadcast_to_shape,
    broadcasting_batch,
    defjvp,
    defjvp_out,
    defprim,
    defzero_jvp,
    full_like,
    instantiate,
    is_linear,
    jax_keeps_weak_type,
    jvp_rules,
    nary_predicate_shape,
    nary_shape,
    predicate_shape,
    same_aval,
    scalar_constant,
    scalar_like,
    shape_rules,
    transpose_rules,
    unary_batch,
    unbroadcast,
    zeros_of,
)


def _unary(name, jax_prim, shape=same_aval):
    p = defprim(name, jax_prim)
    shape_rules[p] = shape
    unary_batch(p)
    return p


def _binary(name, jax_prim, predicate=False):
    p = defprim(name, jax_prim)
    shape_rules[p] = nary_predicate_shape(name) if predicate else nary_shape(name)
    broadcasting_batch(p)
    return p


def _acc(p):
    """Binder for a unary primitive that takes lax's `accuracy` parameter."""
    return lambda x: bind(p, x, accuracy=None)


def _plain(p):
    return lambda *xs: bind(p, *xs)


def _linear_unary_transpose(fn):
    def rule(ct, x, **params):
        return [fn(ct, **params)]

    return rule


# --------------------------------------------------------------------------
# Arithmetic

neg_p = _unary("neg", lax.neg_p)
neg = _plain(neg_p)
defjvp(neg_p, lambda t, x: neg(t))
transpose_rules[neg_p] = _linear_unary_transpose(lambda ct: neg(ct))

add_p = _binary("add", lax.add_p)
add = _plain(add_p)
defjvp(add_p, lambda t, x, y: t, lambda t, x, y: t)


def _add_transpose(ct, x, y):
    return [
        unbroadcast(ct, x.aval) if is_linear(x) else None,
        unbroadcast(ct, y.aval) if is_linear(y) else None,
    ]


transpose_rules[add_p] = _add_transpose

# add_any accumulates tangents and cotangents (JAX's add_jaxvals); operands
# always have equal shapes.
add_any_p = Primitive("add_any")
add_any_p.jax = lax.add_p
lower_to_jax(add_any_p)
try:
    from jax._src.ad_util import add_jaxvals_p as _jax_add_any

    FROM_JAX[_jax_add_any] = add_any_p
except ImportError:  # pragma: no cover - older/newer JAX layouts
    pass
shape_rules[add_any_p] = nary_shape("add_any")
broadcasting_batch(add_any_p)
add_any = _plain(add_any_p)
defjvp(add_any_p, lambda t, x, y: t, lambda t, x, y: t)
transpose_rules[add_any_p] = _add_transpose

sub_p = _binary("sub", lax.sub_p)
sub = _plain(sub_p)
defjvp(sub_p, lambda t, x, y: t, lambda t, x, y: neg(t))
transpose_rules[sub_p] = lambda ct, x, y: [
    unbroadcast(ct, x.aval) if is_linear(x) else None,
    unbroadcast(neg(ct), y.aval) if is_linear(y) else None,
]

mul_p = _binary("mul", lax.mul_p)


def mul(x, y):
    return bind(mul_p, x, y, out_dtype=None)


defjvp(mul_p, lambda t, x, y, **p: mul(t, y), lambda t, x, y, **p: mul(x, t))


def _mul_transpose(ct, x, y, **params):
    if is_linear(x):
        if is_linear(y):
            raise NotImplementedError("mul: both operands are linear (a non-linear use of tangents)")
        return [unbroadcast(mul(ct, y), x.aval), None]
    return [None, unbroadcast(mul(x, ct), y.aval)]


transpose_rules[mul_p] = _mul_transpose

if hasattr(lax, "fma_p"):
    # jax 0.12.1+: a * b + c rounded once (fma) or as the backend likes
    # (fmuladd). Tangents are products and sums, so reverse mode needs no
    # transpose of these.
    def _multiply_add(name, jax_prim):
        p = _binary(name, jax_prim)
        defjvp(p, lambda t, a, b, c: mul(t, b), lambda t, a, b, c: mul(a, t),
               lambda t, a, b, c: t)
        return p

    fma_p = _multiply_add("fma", lax.fma_p)
    fmuladd_p = _multiply_add("fmuladd", lax.fmuladd_p)

div_p = _binary("div", lax.div_p)
div = _plain(div_p)
_div_jvp_squaring = defjvp(  # JAX's rule up to 0.12.0
    div_p,
    lambda t, x, y: div(t, y),
    lambda t, x, y: mul(mul(neg(t), x), integer_pow(y, -2)),
)


def _div_jvp(primals, tangents):
    """d(x / y) = (dx - q dy) / y with q = x / y, as JAX writes it from 0.12.1
    (NOTE [derivatives JAX made overflow-safe]): y is never squared."""
    if _jax_jvp_emits("div", "integer_pow"):  # JAX up to 0.12.0: y^-2
        return _div_jvp_squaring(primals, tangents)
    (x, y), (dx, dy) = primals, tangents
    q = div(x, y)
    if type(dy) is Zero:
        return q, Zero.of(q) if type(dx) is Zero else div(dx, y)
    if type(dx) is Zero:
        return q, mul(q, neg(div(dy, y)))
    return q, div(sub(dx, mul(q, dy)), y)


jvp_rules[div_p] = _div_jvp


# NOTE [derivatives JAX made overflow-safe]
# functx's derivative rules compute what the installed JAX's compute, in the
# same order, so that derivatives equal JAX's bit for bit on every release
# (tests/test_jax_versions.py checks jvp, grad and grad of grad of each).
# JAX 0.12.1 rewrote several so that they no longer lose accuracy or
# overflow: d(x / y) no longer squares y (the old rule gave inf or 0 for
# float32 |y| below 1e-19 or above 2e19); atan2's and complex abs's go
# through its `hypot` (a power-of-two rescaling, and +-1 / 0 at infinite
# parts instead of NaN); erf_inv's tails through erfcx; erf's and erfc's
# exp(-x^2) with x^2 split exactly; asin, acos, atanh and tanh take
# 1 - x^2 as its `one_minus_square` ((1 - x)(1 + x): no cancellation near
# |x| = 1); acosh's no longer squares x; expm1's is exp(x). Each such rule
# asks the installed JAX once which form it has (`_jax_jvp_emits`: whether
# JAX's jvp of a probe emits a primitive only one form has, or whether
# JAX has the helper), so that it is finite wherever JAX's is. JAX's
# helpers (`hypot` and `exp_neg_sq`, custom_jvp functions, and
# `erf_inv_jvp_scale`) are lifted (`call_lifted`), so their higher
# derivatives are JAX's too. A JAX release that changes another rule
# shows in that test, rather than as a silent difference.
def _jvp_probe(op, arity):
    def probe(*args):
        return jax.jvp(op, args[:arity], args[arity:])

    return probe


_JVP_PROBES = {  # name -> JAX's jvp of a probe, on float32[4] operands and tangents
    "div": _jvp_probe(lax.div, 2),
    "atan2": _jvp_probe(lax.atan2, 2),
    "abs": _jvp_probe(lambda a, b: lax.abs(lax.complex(a, b)), 2),  # complex abs
    **{op: _jvp_probe(getattr(lax, op), 1) for op in ("tanh", "asin", "acos", "atanh", "acosh", "expm1")},
}


@functools.cache
def _jax_jvp_emits(name, primitive):
    """Whether the installed JAX's jvp of `name` (`_JVP_PROBES`) emits
    `primitive`: which form of a rule JAX has (NOTE [derivatives JAX made
    overflow-safe])."""
    probe = _JVP_PROBES[name]
    spec = jax.ShapeDtypeStruct((4,), np.float32)
    n = 2 if name in ("div", "atan2", "abs") else 1
    jaxpr = jax.make_jaxpr(probe)(*[spec] * (2 * n))
    return any(e.primitive.name == primitive for e in jaxpr.eqns)


def _add_terms(a, b):
    """The sum of two tangent terms, either of them None (zero), as JAX's
    `add_tangents`."""
    return b if a is None else (a if b is None else add(a, b))


def _hypot(x, y):
    """JAX's `hypot` (jax 0.12.1 on), lifted: (r, x / r, y / r)."""
    from jax._src.lax import lax as jax_lax

    from ..lifting import call_lifted

    return call_lifted(jax_lax.hypot, (x, y), {}, replay=True)


def _div_transpose(ct, x, y):
    assert is_linear(x) and not is_linear(y), "div is linear in its numerator only"
    return [unbroadcast(div(ct, y), x.aval), None]


transpose_rules[div_p] = _div_transpose

rem_p = _binary("rem", lax.rem_p)
rem = _plain(rem_p)


def _trunc_div(x, y):
    q = div(x, y)
    return mul(sign(q), floor(abs(q)))


defjvp(rem_p, lambda t, x, y: t, lambda t, x, y: mul(neg(t), _trunc_div(x, y)))


def _where(pred, on_true, on_false):
    """select with lax broadcasting of all three operands."""
    avals = [aval_of(pred), aval_of(on_true), aval_of(on_false)]
    shape = broadcast_shapes("where", avals)
    pred, on_true, on_false = (broadcast_to_shape(v, shape) for v in (pred, on_true, on_false))
    return bind(select_n_p, pred, on_false, on_true)


pow_p = _binary("pow", lax.pow_p)
pow = _plain(pow_p)


def _pow_jvp_x(t, x, y):
    """d(x ** y)/dx = y x^(y - 1), as JAX computes it. Only an integer
    exponent gets a guard: where y == 0 the derivative is 0 (x ** 0 is 1
    for every x), and the factor y is taken as 1 there. A floating (or
    complex) exponent takes the plain formula, like JAX: 0 ** 0 has
    derivative 0 * 0^-1 = NaN in x, and the derivative in y of y x^(y - 1)
    is x^(y - 1) + y x^(y - 1) log x, 1/4 at (4, 0); a guard there would
    make both 0."""
    integer_exponent = not is_inexact_dtype(aval_of(y).dtype)
    # Both operands are cast to (strongly typed) x's dtype first, as JAX's
    # rule does: its derivative in x is strongly typed even at Python floats
    # (NOTE [weak types in rules]). The inner pow is then a floating one,
    # so derivatives of this rule take the plain formula.
    dtype = aval_of(x).dtype
    x, y = convert_element_type(x, dtype), convert_element_type(y, dtype)
    one = scalar_like(y, 1)
    if not integer_exponent:
        return mul(t, mul(y, pow(x, sub(y, one))))
    is_zero = eq(y, scalar_like(y, 0))
    jac = mul(_where(is_zero, one, y), pow(x, sub(y, one)))
    jac = _where(is_zero, scalar_like(jac, 0), jac)
    return mul(t, jac)


def _pow_jvp_y(t, out, x, y):
    safe_x = _where(eq(x, scalar_like(x, 0)), scalar_like(x, 1), x)
    # strongly typed, as JAX's (whose transpose restores y's weak type)
    return convert_element_type(mul(t, mul(log(safe_x), out)), aval_of(y).dtype)


defjvp_out(pow_p, lambda t, out, x, y: _pow_jvp_x(t, x, y), _pow_jvp_y)

integer_pow_p = _unary("integer_pow", lax.integer_pow_p)


def integer_pow(x, y):
    return bind(integer_pow_p, x, y=y)


def _integer_pow_jvp(t, x, *, y):
    if y == 0:
        return Zero.of(t)
    if y == 1:
        return t
    return mul(t, mul(scalar_like(x, y), integer_pow(x, y - 1)))


defjvp(integer_pow_p, _integer_pow_jvp)

square_p = _unary("square", lax.square_p)
square = _plain(square_p)
defjvp(square_p, lambda t, x: mul(t, mul(scalar_like(x, 2), x)))


@functools.cache
def jax_derivative_is_weak(name, dtype):
    """Whether JAX's own jvp of the primitive `name` gives weakly typed
    scalars of `dtype` a weakly typed tangent. jax 0.12 made those of max,
    min, erf and erfc strongly typed (0.10's are weak); functx's rules for
    them follow the JAX installed (NOTE [weak types in rules] in common.py).
    Asked once per dtype, abstractly."""
    fn = {"max": lambda x: lax.max(x, x), "min": lambda x: lax.min(x, x),
          "erf": lax.erf, "erfc": lax.erfc}[name]
    weak = jax.ShapeDtypeStruct((), dtype, weak_type=True)
    try:
        return bool(jax.eval_shape(lambda x: jax.jvp(fn, (x,), (x,))[1], weak).weak_type)
    except Exception:  # noqa: BLE001 - JAX does not differentiate it at `dtype`: keep the weak type
        return True


def _rule_const(x, value, name):
    """`scalar_like(x, value)`, strongly typed where JAX's rule for the
    primitive `name` is (`jax_derivative_is_weak`)."""
    dtype, weak = aval_of(x).dtype, aval_of(x).weak_type
    return scalar_constant(value, dtype, weak and jax_derivative_is_weak(name, dtype))


def _weights(x, y, strict, tie, out, name):
    """Where each operand wins in max/min: 1, 0.5 on ties, 0 otherwise;
    with the output's dtype and weak type (strong where JAX's are)."""
    like = aval_of(out)
    if like.weak_type and not jax_derivative_is_weak(name, like.dtype):
        like = like.update(weak_type=False)
    w = convert_like(strict(x, y), like)
    return add(w, mul(convert_like(tie(x, y), like), _rule_const(out, 0.5, name)))


max_p = _binary("max", lax.max_p)
max = _plain(max_p)
defjvp_out(
    max_p,
    lambda t, out, x, y: mul(t, _weights(x, y, gt, eq, out, "max")),
    lambda t, out, x, y: mul(t, _weights(y, x, gt, eq, out, "max")),
)

min_p = _binary("min", lax.min_p)
min = _plain(min_p)
defjvp_out(
    min_p,
    lambda t, out, x, y: mul(t, _weights(x, y, lt, eq, out, "min")),
    lambda t, out, x, y: mul(t, _weights(y, x, lt, eq, out, "min")),
)

atan2_p = _binary("atan2", lax.atan2_p)
atan2 = _plain(atan2_p)
_atan2_jvp_squaring = defjvp(  # JAX's rule up to 0.12.0
    atan2_p,
    lambda t, x, y: mul(t, div(y, add(square(x), square(y)))),
    lambda t, x, y: mul(t, div(neg(x), add(square(x), square(y)))),
)


def _atan2_jvp(primals, tangents):
    """From JAX 0.12.1 (NOTE [derivatives JAX made overflow-safe]): with
    (r, u1, u2) = hypot(x, y), d atan2(x, y) = (u2 dx - u1 dy) / r for real
    operands; complex ones as before, x^2 + y^2 computed once."""
    if _jax_jvp_emits("atan2", "square"):  # JAX up to 0.12.0: x^2 + y^2
        return _atan2_jvp_squaring(primals, tangents)
    (x, y), (dx, dy) = primals, tangents
    out = atan2(x, y)
    if type(dx) is Zero and type(dy) is Zero:
        return out, Zero.of(out)
    if is_complex_dtype(aval_of(x).dtype):
        d = add(square(x), square(y))
        tx = None if type(dx) is Zero else mul(dx, div(y, d))
        ty = None if type(dy) is Zero else mul(dy, neg(div(x, d)))
        return out, _add_terms(tx, ty)
    r, u1, u2 = _hypot(x, y)
    tx = None if type(dx) is Zero else mul(u2, dx)
    ty = None if type(dy) is Zero else neg(mul(u1, dy))
    return out, div(_add_terms(tx, ty), r)


jvp_rules[atan2_p] = _atan2_jvp

nextafter_p = _binary("nextafter", lax.nextafter_p)
# (its jvp is declared below, with no_derivative: nextafter(x, y) moves
# with x, so a zero tangent would be wrong, e.g. for jnp.spacing)


def _abs_shape(x):
    if is_complex_dtype(x.dtype):
        return Aval(x.shape, np.finfo(x.dtype).dtype, x.weak_type)
    return x


abs_p = _unary("abs", lax.abs_p, shape=_abs_shape)
abs = _plain(abs_p)


def _abs_jvp(t, out, x):
    """As JAX: the derivative is +1 at x == 0; for complex x, the tangent of
    |x| is Re(t conj(x)) / |x| (0 where x == 0)."""
    if is_complex_dtype(aval_of(x).dtype):
        from .complex import conj, real

        # |x| made complex: strongly typed as JAX's rule up to 0.12.0 makes
        # it, of |x|'s weak type from 0.12.1 (NOTE [weak types in rules])
        weak = aval_of(out).weak_type and jax_keeps_weak_type(_complex_abs_probe)
        mag = convert_element_type(out, aval_of(x).dtype, weak)
        safe = _where(eq(mag, scalar_like(mag, 0)), scalar_like(mag, 1), mag)
        return real(mul(t, div(conj(x), safe)))
    return select_n(ge(x, scalar_like(x, 0)), neg(t), t)


def _complex_abs_probe(x):  # for jax_keeps_weak_type: JAX's complex abs jvp
    def f(x):
        return lax.abs(lax.complex(x, x))

    return jax.jvp(f, (x,), (x,))[1]


_abs_jvp_dividing = defjvp_out(abs_p, _abs_jvp)  # complex: JAX's rule up to 0.12.0


def _abs_jvp_hypot(primals, tangents):
    """Complex |x| from JAX 0.12.1 (NOTE [derivatives JAX made
    overflow-safe]): (r, u1, u2) = hypot(re x, im x) gives |x| = r and its
    tangent u1 re(t) + u2 im(t) (0 at x == 0)."""
    (x,), (t,) = primals, tangents
    if not is_complex_dtype(aval_of(x).dtype) or _jax_jvp_emits("abs", "div"):  # x / |x|
        return _abs_jvp_dividing(primals, tangents)
    from .complex import imag, real

    r, u1, u2 = _hypot(real(x), imag(x))
    if type(t) is Zero:
        return r, Zero.of(r)
    at_zero = eq(r, scalar_like(r, 0))
    u1 = select_n(at_zero, u1, full_like(u1, 0))
    u2 = select_n(at_zero, u2, full_like(u2, 0))
    return r, add(mul(u1, real(t)), mul(u2, imag(t)))


jvp_rules[abs_p] = _abs_jvp_hypot

sign_p = _unary("sign", lax.sign_p)
sign = _plain(sign_p)
defzero_jvp(sign_p)

floor_p = _unary("floor", lax.floor_p)
floor = _plain(floor_p)
defzero_jvp(floor_p)

ceil_p = _unary("ceil", lax.ceil_p)
defzero_jvp(ceil_p)

round_p = _unary("round", lax.round_p)
defzero_jvp(round_p)

is_finite_p = _unary("is_finite", lax.is_finite_p, shape=predicate_shape)
defzero_jvp(is_finite_p)

# --------------------------------------------------------------------------
# Exponentials, logarithms, powers

exp_p = _unary("exp", lax.exp_p)
exp = _acc(exp_p)
defjvp_out(exp_p, lambda t, out, x, **p: mul(t, out))

exp2_p = _unary("exp2", lax.exp2_p)
# log(2) computed by the log primitive, and t out multiplied first, as JAX
defjvp_out(exp2_p, lambda t, out, x, **p: mul(log(scalar_like(x, 2)), mul(t, out)))

log_p = _unary("log", lax.log_p)
log = _acc(log_p)
defjvp(log_p, lambda t, x, **p: div(t, x))

log1p_p = _unary("log1p", lax.log1p_p)
defjvp(log1p_p, lambda t, x, **p: div(t, add(x, scalar_like(x, 1))))

# Newer JAX releases have primitives for log2 and 1 - x^2 (jax 0.11.2+) and
# for polynomials (0.12+): jnp.log2, the derivatives of asin / acos / atanh,
# jnp.polyval and special functions emit them. Older releases compose these
# from other primitives, which functx has anyway.
if hasattr(lax, "log2_p"):
    log2_p = _unary("log2", lax.log2_p)
    defjvp(log2_p, lambda t, x, **p: div(t, mul(x, scalar_like(x, math.log(2.0)))))

if hasattr(lax, "one_minus_square_p"):
    one_minus_square_p = _unary("one_minus_square", lax.one_minus_square_p)
    one_minus_square = _plain(one_minus_square_p)
    defjvp(one_minus_square_p, lambda t, x: mul(t, mul(scalar_like(x, -2), x)))

if hasattr(lax, "polynomial_p"):
    # polynomial(x, c_0, ..., c_n) = c_0 + c_1 x + ... + c_n x^n (Horner),
    # its operands broadcast as lax's n-ary operations do.
    polynomial_p = _binary("polynomial", lax.polynomial_p)

    def _polynomial(x, coeffs, **params):
        if len(coeffs) == 1:  # the primitive takes two or more coefficients
            return coeffs[0]
        return bind(polynomial_p, x, *coeffs, **params)

    def _polynomial_jvp(primals, tangents, **params):
        """As JAX: d/dx the derivative polynomial times dx; d/dc the
        polynomial of the coefficients' tangents (zeros where none),
        linear in them (`_polynomial_transpose`)."""
        x, *coeffs = primals
        out = bind(polynomial_p, *primals, **params)
        terms = []
        if type(tangents[0]) is not Zero:
            slopes = [mul(scalar_like(c, k), c) for k, c in enumerate(coeffs[1:], 1)]
            terms.append(mul(tangents[0], _polynomial(x, slopes, **params)))
        if any(type(t) is not Zero for t in tangents[1:]):
            terms.append(_polynomial(x, [full_like(c, 0) if type(t) is Zero else t
                                         for c, t in zip(coeffs, tangents[1:])], **params))
        if not terms:
            return out, Zero.of(out)
        shape = aval_of(out).shape
        total = broadcast_to_shape(terms[0], shape)
        for term in terms[1:]:
            total = add_any(total, broadcast_to_shape(term, shape))
        return out, total

    def _polynomial_transpose(ct, x, *coeffs, **params):
        """Linear in the coefficients (x fixed): c_k's cotangent is ct x^k,
        by repeated products, as JAX."""
        assert not is_linear(x), "polynomial is linear in its coefficients only"
        ct_bars, xk_ct = [], ct
        for k, c in enumerate(coeffs):
            ct_bars.append(unbroadcast(xk_ct, c.aval) if is_linear(c) else None)
            if k + 1 < len(coeffs):
                xk_ct = mul(xk_ct, x)
        return [None] + ct_bars

    transpose_rules[polynomial_p] = _polynomial_transpose
    jvp_rules[polynomial_p] = _polynomial_jvp

if hasattr(lax, "exp2m1_p"):  # jax 0.12.1+: 2^x - 1 and log2(1 + x), exact near 0
    exp2m1_p = _unary("exp2m1", lax.exp2m1_p)
    defjvp_out(exp2m1_p, lambda t, out, x: mul(t, mul(add(out, scalar_like(out, 1)),
                                                       scalar_like(out, math.log(2.0)))))
    log2p1_p = _unary("log2p1", lax.log2p1_p)
    defjvp(log2p1_p, lambda t, x: div(t, mul(add(x, scalar_like(x, 1)),
                                             scalar_like(x, math.log(2.0)))))

expm1_p = _unary("expm1", lax.expm1_p)


def _expm1_jvp(t, out, x, **p):
    if _jax_jvp_emits("expm1", "add"):  # JAX up to 0.12.0: t (out + 1)
        return mul(t, add(out, scalar_like(out, 1)))
    return mul(t, exp(x))  # 0.12.1 on: exp(x), which out + 1 rounds


defjvp_out(expm1_p, _expm1_jvp)

sqrt_p = _unary("sqrt", lax.sqrt_p)
sqrt = _acc(sqrt_p)
defjvp_out(sqrt_p, lambda t, out, x, **p: mul(t, div(scalar_like(x, 0.5), out)))  # as JAX

rsqrt_p = _unary("rsqrt", lax.rsqrt_p)
rsqrt = _acc(rsqrt_p)
defjvp_out(
    rsqrt_p,
    lambda t, out, x, **p: mul(t, mul(div(out, x), scalar_like(x, -0.5))),
)

cbrt_p = _unary("cbrt", lax.cbrt_p)
defjvp_out(
    cbrt_p,
    lambda t, out, x, **p: mul(t, mul(integer_pow(out, -2), scalar_like(out, 1.0 / 3.0))),
)

logistic_p = _unary("logistic", lax.logistic_p)
logistic = _acc(logistic_p)
defjvp_out(
    logistic_p,
    lambda t, out, x, **p: mul(t, mul(out, sub(scalar_like(out, 1), out))),
)

# --------------------------------------------------------------------------
# Trigonometric and hyperbolic functions

sin_p = _unary("sin", lax.sin_p)
sin = _acc(sin_p)
cos_p = _unary("cos", lax.cos_p)
cos = _acc(cos_p)
defjvp(sin_p, lambda t, x, **p: mul(t, cos(x)))
defjvp(cos_p, lambda t, x, **p: neg(mul(t, sin(x))))

tan_p = _unary("tan", lax.tan_p)
defjvp_out(tan_p, lambda t, out, x, **p: mul(t, add(scalar_like(out, 1), square(out))))

asin_p = _unary("asin", lax.asin_p)
defjvp(asin_p, lambda t, x: mul(t, rsqrt(_one_minus_square_as_jax("asin", x))))

acos_p = _unary("acos", lax.acos_p)
defjvp(acos_p, lambda t, x: neg(mul(t, rsqrt(_one_minus_square_as_jax("acos", x)))))

atan_p = _unary("atan", lax.atan_p)
defjvp(atan_p, lambda t, x: div(t, add(scalar_like(x, 1), square(x))))

if hasattr(lax, "sinpi_p"):
    # jax 0.12.1+: IEEE 754's trigonometry in half turns, sinpi(x) =
    # sin(pi x), asinpi(x) = asin(x) / pi, ... (jnp.sinc emits sinpi).
    # JAX writes these rules with jnp's `*`: `_jnp_mul`.
    def _times_pi(x, value):
        return mul(value, scalar_like(x, math.pi))

    def _over_pi(x, value):
        return mul(value, scalar_like(x, 1 / math.pi))

    def _inverse_slope(x):  # 1 / (pi sqrt((1 - x)(1 + x))), as JAX
        return _over_pi(x, rsqrt(one_minus_square(x)))

    sinpi_p = _unary("sinpi", lax.sinpi_p)
    cospi_p = _unary("cospi", lax.cospi_p)
    tanpi_p = _unary("tanpi", lax.tanpi_p)
    defjvp(sinpi_p, lambda t, x: _jnp_mul(t, _times_pi(x, bind(cospi_p, x))))
    defjvp(cospi_p, lambda t, x: neg(_jnp_mul(t, _times_pi(x, bind(sinpi_p, x)))))
    defjvp_out(tanpi_p, lambda t, out, x: _jnp_mul(t, _times_pi(
        out, add(scalar_like(out, 1), square(out)))))
    asinpi_p = _unary("asinpi", lax.asinpi_p)
    acospi_p = _unary("acospi", lax.acospi_p)
    atanpi_p = _unary("atanpi", lax.atanpi_p)
    defjvp(asinpi_p, lambda t, x: _jnp_mul(t, _inverse_slope(x)))
    defjvp(acospi_p, lambda t, x: neg(_jnp_mul(t, _inverse_slope(x))))

    def _atanpi_jvp(t, x):  # with (r, _, u2) = hypot(x, 1): u2 t / pi / r, as JAX
        r, _, u2 = _hypot(x, full_like(x, 1.0))
        return _jnp_div(_over_pi(x, _jnp_mul(u2, t)), r)

    defjvp(atanpi_p, _atanpi_jvp)
    atan2pi_p = _binary("atan2pi", lax.atan2pi_p)

    def _atan2pi_jvp(primals, tangents):  # (u2 dx - u1 dy) / pi / r, as JAX
        (x, y), (dx, dy) = primals, tangents
        out = bind(atan2pi_p, x, y)
        if type(dx) is Zero and type(dy) is Zero:
            return out, Zero.of(out)
        r, u1, u2 = _hypot(x, y)
        tx = None if type(dx) is Zero else _jnp_mul(u2, dx)
        ty = None if type(dy) is Zero else neg(_jnp_mul(u1, dy))
        return out, _jnp_div(_over_pi(x, _add_terms(tx, ty)), r)

    jvp_rules[atan2pi_p] = _atan2pi_jvp

sinh_p = _unary("sinh", lax.sinh_p)
sinh = _plain(sinh_p)
cosh_p = _unary("cosh", lax.cosh_p)
cosh = _plain(cosh_p)
defjvp(sinh_p, lambda t, x: mul(t, cosh(x)))
defjvp(cosh_p, lambda t, x: mul(t, sinh(x)))

tanh_p = _unary("tanh", lax.tanh_p)
tanh = _acc(tanh_p)


def _tanh_jvp(t, out, x, **p):
    if _jax_jvp_emits("tanh", "one_minus_square"):  # JAX 0.12.1 on: (1 - out)(1 + out), rounded once
        return mul(t, one_minus_square(out))
    return mul(add(t, mul(t, out)), sub(scalar_like(out, 1), out))  # up to 0.12.0: t (1 + out) (1 - out)


defjvp_out(tanh_p, _tanh_jvp)

asinh_p = _unary("asinh", lax.asinh_p)
defjvp(asinh_p, lambda t, x: mul(t, rsqrt(add(square(x), scalar_like(x, 1)))))

acosh_p = _unary("acosh", lax.acosh_p)


def _acosh_jvp(t, x):
    one = scalar_like(x, 1)
    if _jax_jvp_emits("acosh", "square"):  # JAX up to 0.12.0: x^2 - 1
        return mul(t, rsqrt(sub(square(x), one)))
    return mul(t, mul(rsqrt(sub(x, one)), rsqrt(add(x, one))))  # JAX 0.12.1 on


defjvp(acosh_p, _acosh_jvp)

atanh_p = _unary("atanh", lax.atanh_p)


def _atanh_jvp(t, x):
    if _jax_jvp_emits("atanh", "one_minus_square"):
        return div(t, one_minus_square(x))
    one = scalar_like(x, 1)  # JAX up to 0.12.0: 1 / (1 + x) (t / (1 - x))
    return mul(integer_pow(add(one, x), -1), div(t, sub(one, x)))


defjvp(atanh_p, _atanh_jvp)


def _one_minus_square_as_jax(name, x):
    """1 - x^2 in the rule of `name` as the installed JAX computes it: its
    `one_minus_square` primitive from 0.12.1 on ((1 - x)(1 + x): exact
    cancellation near |x| = 1, where 1 - x^2 loses up to half the digits),
    else 1 - x^2 (NOTE [derivatives JAX made overflow-safe])."""
    if _jax_jvp_emits(name, "one_minus_square"):
        return one_minus_square(x)
    return sub(scalar_like(x, 1), square(x))

# --------------------------------------------------------------------------
# Special functions

erf_p = _unary("erf", lax.erf_p)
try:  # JAX 0.12.1 on: exp(-x^2) with x^2 split exactly (NOTE [derivatives JAX made overflow-safe])
    from jax._src.lax.erf import exp_neg_sq as _jax_exp_neg_sq
except ImportError:
    _jax_exp_neg_sq = None


def _exp_neg_sq(x):
    """exp(-x^2) as the installed JAX's erf and erfc rules compute it."""
    if _jax_exp_neg_sq is None:
        return exp(neg(square(x)))
    from ..lifting import call_lifted

    return call_lifted(_jax_exp_neg_sq, (x,), {}, replay=True)


defjvp(  # the constant times (t exp(-x^2)), in JAX's order
    erf_p,
    lambda t, x: mul(_rule_const(x, 2.0 / math.sqrt(math.pi), "erf"), mul(t, _exp_neg_sq(x))),
)

erfc_p = _unary("erfc", lax.erfc_p)  # (jax 0.12 gives it an `accuracy` parameter)
defjvp(
    erfc_p,
    lambda t, x, **p: mul(_rule_const(x, -2.0 / math.sqrt(math.pi), "erfc"), mul(t, _exp_neg_sq(x))),
)

erf_inv_p = _unary("erf_inv", lax.erf_inv_p)
try:  # JAX 0.12.1 on (NOTE [derivatives JAX made overflow-safe])
    from jax._src.lax.erf import erf_inv_jvp_scale as _jax_erf_inv_scale
except ImportError:
    _jax_erf_inv_scale = None


def _erf_inv_slope(x, z):
    """JAX's d erfinv(x) / dx at z = erfinv(x), computed in float32 at least
    (a JAX function, lifted)."""
    if x.dtype not in (np.float32, np.float64):
        f32 = lambda v: lax.convert_element_type(v, np.float32)  # noqa: E731
        return lax.convert_element_type(_jax_erf_inv_scale(f32(x), f32(z)), x.dtype)
    return _jax_erf_inv_scale(x, z)


def _erf_inv_jvp(t, out, x):
    if _jax_erf_inv_scale is None:  # up to 0.12.0: sqrt(pi) / 2 (t exp(z^2)), in JAX's order
        return mul(scalar_like(x, math.sqrt(math.pi) / 2.0), mul(t, exp(square(out))))
    from ..lifting import call_lifted

    return _jnp_mul(t, call_lifted(_erf_inv_slope, (x, out), {}, replay=True))


defjvp_out(erf_inv_p, _erf_inv_jvp)

lgamma_p = _unary("lgamma", lax.lgamma_p)
digamma_p = _unary("digamma", lax.digamma_p)
digamma = _plain(digamma_p)
defjvp(lgamma_p, lambda t, x: mul(t, digamma(x)))

polygamma_p = _binary("polygamma", lax.polygamma_p)
polygamma = _plain(polygamma_p)


def _jnp_promote(t, v):
    """`t` and `v` as jnp's arithmetic operators hand them to lax: an
    operand weakly typed where the other is not is cast to strong first, so
    the cotangent of a weak `t` comes back weak through that cast's
    transpose (NOTE [weak types in rules])."""
    ta, va = aval_of(t), aval_of(v)
    if ta.weak_type and not va.weak_type:
        t = convert_element_type(t, ta.dtype)
    elif va.weak_type and not ta.weak_type:
        v = convert_element_type(v, va.dtype)
    return t, v


def _jnp_mul(t, v):
    """`t * v` as jnp's `*` computes it, with which JAX writes the rules of
    the special functions."""
    return mul(*_jnp_promote(t, v))


def _jnp_div(t, v):
    """`t / v` as jnp's `/` computes it."""
    return div(*_jnp_promote(t, v))


def no_derivative(name, arg, hint=""):
    """A jvp contribution for an argument the primitive has no derivative
    for (JAX defines none either): raises, naming primitive and argument."""

    def fn(t, *primals, **params):
        raise MissingRuleError(
            f"differentiation (jvp, vjp, grad, jacfwd, jacrev): primitive `{name}` has no "
            f"derivative with respect to its {arg}, and JAX defines none either. "
            + (hint or "Pass that argument as a constant (do not differentiate it), or "
               "wrap it in functx.lax.stop_gradient.")
        )

    return fn


defjvp(
    polygamma_p,
    no_derivative("polygamma", "order m (first argument)"),
    lambda t, m, x: _jnp_mul(t, polygamma(add(m, scalar_like(m, 1)), x)),
)
defjvp(digamma_p, lambda t, x: mul(t, polygamma(scalar_like(x, 1), x)))
defjvp(nextafter_p, no_derivative("nextafter", "first argument"),
       no_derivative("nextafter", "second argument"))

igamma_grad_a_p = _binary("igamma_grad_a", lax.igamma_grad_a_p)


def _igamma_dx(a, x):
    return exp(sub(sub(mul(sub(a, scalar_like(a, 1)), log(x)), x), bind(lgamma_p, a)))


igamma_p = _binary("igamma", lax.igamma_p)
defjvp(
    igamma_p,
    lambda t, a, x: _jnp_mul(t, bind(igamma_grad_a_p, a, x)),
    lambda t, a, x: _jnp_mul(t, _igamma_dx(a, x)),
)
igammac_p = _binary("igammac", lax.igammac_p)
defjvp(
    igammac_p,
    lambda t, a, x: neg(_jnp_mul(t, bind(igamma_grad_a_p, a, x))),
    lambda t, a, x: neg(_jnp_mul(t, _igamma_dx(a, x))),
)

defjvp(
    igamma_grad_a_p,
    no_derivative("igamma_grad_a", "first argument (a)"),
    no_derivative("igamma_grad_a", "second argument (x)"),
)

# The regularized incomplete beta function I_x(a, b) (lax.betainc):
# dI/dx = x^(a-1) (1-x)^(b-1) / B(a, b); JAX defines no derivative in a, b.
regularized_incomplete_beta_p = _binary("regularized_incomplete_beta",  # three operands
                                        lax.regularized_incomplete_beta_p)


def _betainc_dx(t, a, b, x):
    one = scalar_like(x, 1)
    lbeta = sub(add(bind(lgamma_p, a), bind(lgamma_p, b)), bind(lgamma_p, add(a, b)))
    log_density = sub(add(mul(sub(b, one), bind(log1p_p, neg(x))), mul(sub(a, one), log(x))),
                      lbeta)
    return _jnp_mul(t, exp(log_density))


defjvp(
    regularized_incomplete_beta_p,
    no_derivative("regularized_incomplete_beta", "first argument (a)"),
    no_derivative("regularized_incomplete_beta", "second argument (b)"),
    _betainc_dx,
)

# The Hurwitz zeta function zeta(s, q) = sum_n (n + q)^-s. JAX has no
# derivative rule for it at all; in q it is d/dq zeta(s, q) = -s zeta(s+1, q),
# which functx provides. In s there is no closed form: that raises.
zeta_p = _binary("zeta", lax.zeta_p)
zeta = _plain(zeta_p)
defjvp(
    zeta_p,
    no_derivative("zeta", "first argument (s, the exponent)"),
    lambda t, s, q: mul(t, mul(neg(s), zeta(add(s, scalar_like(s, 1)), q))),
)

# Exponentially scaled modified Bessel functions of order 0 and 1:
# i0e(x) = exp(-|x|) I0(x), i1e(x) = exp(-|x|) I1(x). With I0' = I1 and
# I1' = I0 - I1/x:  i0e' = i1e - sign(x) i0e,  i1e' = i0e - i1e (sign(x) + 1/x),
# whose limit at 0 is 1/2 (used where |x| <= eps, as JAX does).
bessel_i0e_p = _unary("bessel_i0e", lax.bessel_i0e_p)
bessel_i1e_p = _unary("bessel_i1e", lax.bessel_i1e_p)
defjvp_out(bessel_i0e_p,
           lambda t, out, x: _jnp_mul(t, sub(bind(bessel_i1e_p, x), mul(sign(x), out))))


def _bessel_i1e_jvp(t, out, x):
    # jax.dtypes.finfo: NumPy's refuses bfloat16 and float8 (NOTE [differentiable dtypes])
    eps = scalar_like(x, jax.dtypes.finfo(aval_of(x).dtype).eps)
    tiny = le(abs(x), eps)
    safe_x = _where(tiny, eps, x)
    slope = sub(bind(bessel_i0e_p, safe_x),
                mul(out, add(sign(safe_x), integer_pow(safe_x, -1))))  # JAX's reciprocal
    return _jnp_mul(t, _where(tiny, scalar_like(x, 0.5), slope))


defjvp_out(bessel_i1e_p, _bessel_i1e_jvp)

# --------------------------------------------------------------------------
# Comparisons, logic and bit operations: zero derivatives

eq_p = _binary("eq", lax.eq_p, predicate=True)
ne_p = _binary("ne", lax.ne_p, predicate=True)
lt_p = _binary("lt", lax.lt_p, predicate=True)
le_p = _binary("le", lax.le_p, predicate=True)
gt_p = _binary("gt", lax.gt_p, predicate=True)
ge_p = _binary("ge", lax.ge_p, predicate=True)
eq, ne, lt, le, gt, ge = (_plain(p) for p in (eq_p, ne_p, lt_p, le_p, gt_p, ge_p))

and_p = _binary("and", lax.and_p)
or_p = _binary("or", lax.or_p)
xor_p = _binary("xor", lax.xor_p)
and_, or_ = _plain(and_p), _plain(or_p)
not_p = _unary("not", lax.not_p)
shift_left_p = _binary("shift_left", lax.shift_left_p)
shift_right_arithmetic_p = _binary("shift_right_arithmetic", lax.shift_right_arithmetic_p)
shift_right_logical_p = _binary("shift_right_logical", lax.shift_right_logical_p)
population_count_p = _unary("population_count", lax.population_count_p)
clz_p = _unary("clz", lax.clz_p)

# Total-order comparisons (NaNs and signed zeros ordered), emitted by JAX's
# sort comparators, e.g. in jnp.searchsorted.
eq_to_p = _binary("eq_to", lax.eq_to_p, predicate=True)
le_to_p = _binary("le_to", lax.le_to_p, predicate=True)
lt_to_p = _binary("lt_to", lax.lt_to_p, predicate=True)

# The high half of an integer product (JAX's Philox random bits).
mulhi_p = _binary("mulhi", _jax_mulhi_p)

for _p in (eq_p, ne_p, lt_p, le_p, gt_p, ge_p, and_p, or_p, xor_p, not_p,
           shift_left_p, shift_right_arithmetic_p, shift_right_logical_p,
           population_count_p, clz_p, eq_to_p, le_to_p, lt_to_p, mulhi_p):
    defzero_jvp(_p)

stop_gradient_p = _unary("stop_gradient", getattr(lax, "stop_gradient_p", None))
if stop_gradient_p.jax is None:  # pragma: no cover - JAX without the primitive
    from ..interpreters.eval import defimpl

    defimpl(stop_gradient_p, lax.stop_gradient)
defzero_jvp(stop_gradient_p)


def stop_gradient(x):
    return bind(stop_gradient_p, x)


# --------------------------------------------------------------------------
# Identity-like linear operations

copy_p = _unary("copy", lax.copy_p)
defjvp(copy_p, lambda t, x: bind(copy_p, t))
transpose_rules[copy_p] = _linear_unary_transpose(lambda ct: ct)

reduce_precision_p = _unary("reduce_precision", lax.reduce_precision_p)
defjvp(reduce_precision_p, lambda t, x, **p: bind(reduce_precision_p, t, **p))
transpose_rules[reduce_precision_p] = _linear_unary_transpose(
    lambda ct, **p: bind(reduce_precision_p, ct, **p)
)

# --------------------------------------------------------------------------
# convert_element_type

convert_element_type_p = defprim("convert_element_type", lax.convert_element_type_p)


def convert_element_type(x, dtype, weak_type=False):
    dtype = np.dtype(dtype)
    a = aval_of(x)
    if a.dtype == dtype and a.weak_type == bool(weak_type):
        return check_usable(x)  # NOTE [escaped tracers]
    return bind(convert_element_type_p, x, new_dtype=dtype, weak_type=bool(weak_type),
                sharding=None)


def convert_like(x, like):
    """`x` converted to the dtype and weak type of `like` (a value or an
    Aval), e.g. a mask of `like`'s type (NOTE [weak types in rules])."""
    a = like if isinstance(like, Aval) else aval_of(like)
    return convert_element_type(x, a.dtype, a.weak_type)


shape_rules[convert_element_type_p] = lambda a, *, new_dtype, weak_type, sharding: Aval(
    a.shape, np.dtype(new_dtype), weak_type
)
unary_batch(convert_element_type_p)


def _convert_basis(size, vals, dims, bases, *, new_dtype, **params):
    """Zeros and ones stay exact between float dtypes: still the identity's
    rows (NOTE [identity bases])."""
    if not (is_real_float_dtype(aval_of(vals[0]).dtype)
            and is_real_float_dtype(new_dtype)):
        return None
    out = bind(convert_element_type_p, vals[0], new_dtype=new_dtype, **params)
    return out, dims[0], bases[0]


basis_rules[convert_element_type_p] = _convert_basis


def _convert_jvp(primals, tangents, *, new_dtype, weak_type, sharding):
    (x,), (t,) = primals, tangents
    out = bind(convert_element_type_p, x, new_dtype=new_dtype, weak_type=weak_type, sharding=sharding)
    floats = is_inexact_dtype(aval_of(x).dtype) and is_inexact_dtype(new_dtype)
    if type(t) is Zero or not floats:
        return out, Zero.of(out)
    return out, bind(convert_element_type_p, t, new_dtype=new_dtype, weak_type=weak_type, sharding=sharding)


jvp_rules[convert_element_type_p] = _convert_jvp


def _convert_transpose(ct, x, *, new_dtype, weak_type, sharding):
    return [bind(convert_element_type_p, ct, new_dtype=x.aval.dtype,
                 weak_type=x.aval.weak_type, sharding=sharding)]


transpose_rules[convert_element_type_p] = _convert_transpose

# bitcast_convert_type reinterprets the bits: not differentiable (zero
# tangents, as JAX). Between dtypes of different widths the last axis
# appears (wide -> narrow: one entry per piece) or is consumed.
bitcast_convert_type_p = defprim("bitcast_convert_type", lax.bitcast_convert_type_p)


def _bitcast_shape(x, *, new_dtype):
    new_dtype = np.dtype(new_dtype)
    old, new = x.dtype.itemsize, new_dtype.itemsize
    if old == new:
        shape = x.shape
    elif old > new:
        shape = x.shape + (old // new,)
    else:
        shape = x.shape[:-1]
    return Aval(shape, new_dtype, False)


shape_rules[bitcast_convert_type_p] = _bitcast_shape
defzero_jvp(bitcast_convert_type_p)


def _bitcast_batch(size, vals, dims, *, new_dtype):
    from .common import moveaxis

    x, d = vals[0], dims[0]
    a = aval_of(x)
    if np.dtype(new_dtype).itemsize > a.dtype.itemsize and d == a.ndim - 1:
        x, d = moveaxis(x, d, 0), 0  # the last axis is consumed
    return bind(bitcast_convert_type_p, x, new_dtype=new_dtype), d


batch_rules[bitcast_convert_type_p] = _bitcast_batch

# --------------------------------------------------------------------------
# select_n and clamp

select_n_p = defprim("select_n", lax.select_n_p)


def select_n(pred, *cases):
    return bind(select_n_p, pred, *cases)


def _select_n_shape(pred, *cases):
    c = cases[0]
    return Aval(c.shape, c.dtype, all(x.weak_type for x in cases))


shape_rules[select_n_p] = _select_n_shape


def _select_n_jvp(primals, tangents):
    pred, *cases = primals
    out = select_n(pred, *cases)
    ts = tangents[1:]
    if all(type(t) is Zero for t in ts):
        return out, Zero.of(out)
    return out, select_n(pred, *[instantiate(t) for t in ts])


jvp_rules[select_n_p] = _select_n_jvp


def _select_n_transpose(ct, pred, *cases):
    assert not is_linear(pred)
    zeros = zeros_of(aval_of(ct))  # as weak as ct (NOTE [weak types in rules])
    out = [None]
    for i, c in enumerate(cases):
        if is_linear(c):
            out.append(select_n(pred, *[ct if j == i else zeros for j in range(len(cases))]))
        else:
            out.append(None)
    return out


transpose_rules[select_n_p] = _select_n_transpose


def _select_n_batch(size, vals, dims):
    from .common import bdim_to_front
    from .structural import broadcast_in_dim

    pred, *cases = vals
    pdim, *cdims = dims
    if pdim is None and aval_of(pred).shape == ():
        # Scalar predicate: only the cases need aligning.
        if all(d == cdims[0] for d in cdims) and cdims[0] is not None:
            return select_n(pred, *cases), cdims[0]
        return select_n(pred, *[bdim_to_front(c, d, size) for c, d in zip(cases, cdims)]), 0
    cases = [bdim_to_front(c, d, size) for c, d in zip(cases, cdims)]
    full_shape = aval_of(cases[0]).shape
    pred = bdim_to_front(pred, pdim, size)
    if aval_of(pred).shape != full_shape:  # a batched scalar predicate
        pred = broadcast_in_dim(pred, full_shape, (0,))
    return select_n(pred, *cases), 0


batch_rules[select_n_p] = _select_n_batch

clamp_p = defprim("clamp", lax.clamp_p)


def clamp(lo, x, hi):
    return bind(clamp_p, lo, x, hi)


shape_rules[clamp_p] = lambda lo, x, hi: x.update(
    weak_type=lo.weak_type and x.weak_type and hi.weak_type)


defjvp(
    clamp_p,
    lambda t, lo, x, hi: mul(t, convert_like(gt(lo, x), x)),
    lambda t, lo, x, hi: mul(t, convert_like(and_(gt(x, lo), lt(x, hi)), x)),
    lambda t, lo, x, hi: mul(t, convert_like(lt(hi, x), x)),
)


def _clamp_batch(size, vals, dims):
    from .common import bdim_to_front
    from .structural import broadcast_in_dim

    lo, x, hi = vals
    ldim, xdim, hdim = dims
    if ldim is None and hdim is None and aval_of(lo).shape == () and aval_of(hi).shape == ():
        return clamp(lo, x, hi), xdim
    x = bdim_to_front(x, xdim, size)
    shape = aval_of(x).shape
    out = []
    for v, d in ((lo, ldim), (hi, hdim)):
        if d is None and aval_of(v).shape == ():
            out.append(v)
            continue
        v = bdim_to_front(v, d, size)
        if aval_of(v).shape != shape:  # batched scalar bound
            v = broadcast_in_dim(v, shape, (0,))
        out.append(v)
    return clamp(out[0], x, out[1]), 0


batch_rules[clamp_p] = _clamp_batch
