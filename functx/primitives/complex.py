"""Complex numbers: real, imag, conj and complex.

All four are linear (over the reals), so their jvp applies the primitive to
the tangent and their transpose is another of the four.

NOTE [complex cotangents]
functx follows JAX's convention for complex derivatives: the cotangent of a
linear map is its *transpose*, never its conjugate transpose. Equivalently,
a cotangent `w` pairs with a value `z` through `Re(sum(w * z))` (no
conjugation). From that pairing:

  real(z)          ct -> complex(ct, 0)          (Re(c z) = ct Re(z)  =>  c = ct)
  imag(z)          ct -> complex(0, -ct)         (Re(c z) = ct Im(z)  =>  c = -i ct)
  complex(x, y)    ct -> (real(ct), -imag(ct))
  conj(z)          ct -> conj(ct); for a real input, real(ct)

and the transposes of mul, dot_general, fft, ... need no conjugation at all
(they are symmetric in this pairing), which is what their rules do. So
functx's jvp and vjp of a complex function equal JAX's jax.jvp / jax.vjp.
"""

import numpy as np
from jax import lax

from ..core import Aval, Zero, aval_of, is_complex_dtype
from .common import (
    bind,
    broadcast_shapes,
    broadcasting_batch,
    defjvp,
    defprim,
    instantiate,
    is_linear,
    jvp_rules,
    scalar_constant,
    shape_rules,
    transpose_rules,
    unary_batch,
    unbroadcast,
)


def real_dtype(dtype):
    """The real dtype of the parts of a complex dtype (float64 for complex128)."""
    return np.finfo(np.dtype(dtype)).dtype


def complex_dtype(dtype):
    """The complex dtype whose parts have `dtype` (complex64 for float32)."""
    return np.result_type(np.dtype(dtype), np.complex64)


def is_complex(x):
    return is_complex_dtype(aval_of(x).dtype)


# --------------------------------------------------------------------------
# real, imag

real_p = defprim("real", lax.real_p)
imag_p = defprim("imag", lax.imag_p)


def real(z):
    return bind(real_p, z)


def imag(z):
    return bind(imag_p, z)


def _part_shape(z):
    return Aval(z.shape, real_dtype(z.dtype), z.weak_type)


for _p in (real_p, imag_p):
    shape_rules[_p] = _part_shape
    unary_batch(_p)

defjvp(real_p, lambda t, z: real(t))
defjvp(imag_p, lambda t, z: imag(t))


def _real_transpose(ct, z):
    return [complex_(ct, scalar_constant(0, aval_of(ct).dtype))]


def _imag_transpose(ct, z):
    from .elementwise import neg

    return [complex_(scalar_constant(0, aval_of(ct).dtype), neg(ct))]


transpose_rules[real_p] = _real_transpose
transpose_rules[imag_p] = _imag_transpose

# --------------------------------------------------------------------------
# complex(x, y) = x + i y, with lax broadcasting

complex_p = defprim("complex", lax.complex_p)


def complex_(x, y):
    return bind(complex_p, x, y)


def _complex_shape(x, y):
    return Aval(broadcast_shapes("complex", [x, y]), complex_dtype(x.dtype),
                x.weak_type and y.weak_type)


shape_rules[complex_p] = _complex_shape
broadcasting_batch(complex_p)


def _complex_jvp(primals, tangents):
    x, y = primals
    tx, ty = tangents
    out = complex_(x, y)
    if type(tx) is Zero and type(ty) is Zero:
        return out, Zero.of(out)
    # A missing part is a zero of that operand's own shape: complex_
    # broadcasts the two exactly as it did the primals.
    return out, complex_(instantiate(tx), instantiate(ty))


jvp_rules[complex_p] = _complex_jvp


def _complex_transpose(ct, x, y):
    from .elementwise import neg

    return [
        unbroadcast(real(ct), x.aval) if is_linear(x) else None,
        unbroadcast(neg(imag(ct)), y.aval) if is_linear(y) else None,
    ]


transpose_rules[complex_p] = _complex_transpose

# --------------------------------------------------------------------------
# conj; JAX also accepts a real input (the result is complex)

conj_p = defprim("conj", lax.conj_p)


def conj(z):
    return bind(conj_p, z, input_dtype=aval_of(z).dtype)


shape_rules[conj_p] = lambda z, *, input_dtype: Aval(z.shape, complex_dtype(z.dtype), z.weak_type)
unary_batch(conj_p)
defjvp(conj_p, lambda t, z, *, input_dtype: bind(conj_p, t, input_dtype=input_dtype))


def _conj_transpose(ct, z, *, input_dtype):
    if is_complex_dtype(np.dtype(input_dtype)):
        return [conj(ct)]
    return [real(ct)]


transpose_rules[conj_p] = _conj_transpose
