"""fft: the discrete Fourier transforms over the trailing `len(fft_lengths)`
axes (FFT, IFFT: complex to complex; RFFT: real to half-spectrum; IRFFT:
half-spectrum to real). All four are linear, so the jvp applies the same
transform to the tangent.

NOTE [fft transposes]
With JAX's pairing of complex cotangents (NOTE [complex cotangents] in
complex.py: transpose, no conjugation):

* FFT and IFFT: the DFT matrix is symmetric, so each is its own transpose.
* RFFT is "embed the real input in C, FFT, keep the first n//2+1 entries of
  the last axis". Its transpose is Re(FFT(zero-padded ct)). The same thing
  costs one real-output transform as  N * IRFFT(conj(ct) / mask),  where N is
  the product of fft_lengths and `mask` is 2 on the last-axis entries that
  stand for a pair of conjugate frequencies and 1 on the self-conjugate ones
  (index 0, and n/2 when n is even): IRFFT counts every paired entry twice
  and divides by N, and conj turns its e^{+i...} kernel into the forward one.
* IRFFT (x = (1/N) Re(sum_k mask_k y_k e^{+i...}) over the half spectrum,
  imaginary parts of the self-conjugate entries ignored) has the transpose
  conj(mask * RFFT(ct) / N).

Both are written with functx primitives (fft, conj, mul), so transposing a
transpose (vjp of vjp) is again covered by these rules.
"""

import math

import numpy as np
from jax import lax

from ..core import Aval, aval_of
from .common import (
    batch_rules,
    bind,
    defjvp,
    defprim,
    moveaxis,
    scalar_constant,
    shape_rules,
    transpose_rules,
)
from .complex import complex_dtype, conj, real_dtype

FftType = lax.FftType

fft_p = defprim("fft", lax.fft_p)


def fft(x, fft_type, fft_lengths):
    return bind(fft_p, x, fft_type=FftType(fft_type), fft_lengths=tuple(fft_lengths))


def _fft_shape(x, *, fft_type, fft_lengths):
    k = len(fft_lengths)
    if fft_type == FftType.RFFT:
        shape = x.shape[:-1] + (fft_lengths[-1] // 2 + 1,)
        return Aval(shape, complex_dtype(x.dtype), x.weak_type)
    if fft_type == FftType.IRFFT:
        return Aval(x.shape[:-k] + tuple(fft_lengths), real_dtype(x.dtype), x.weak_type)
    return x


shape_rules[fft_p] = _fft_shape
defjvp(fft_p, lambda t, x, **p: bind(fft_p, t, **p))


def _half_spectrum_mask(fft_lengths, shape, dtype):
    """2 for the last-axis entries of a half spectrum that stand for a
    conjugate pair, 1 for the self-conjugate ones; broadcast to `shape`."""
    from .structural import broadcast_in_dim

    n = fft_lengths[-1]
    m = n // 2 + 1
    mask = np.full((m,), 2.0, dtype)
    mask[0] = 1.0
    if n % 2 == 0:
        mask[-1] = 1.0
    return broadcast_in_dim(mask, shape, (len(shape) - 1,))


def _fft_transpose(ct, x, *, fft_type, fft_lengths):
    from .elementwise import div, mul

    if fft_type in (FftType.FFT, FftType.IFFT):
        return [fft(ct, fft_type, fft_lengths)]
    a = aval_of(ct)
    n_total = math.prod(fft_lengths)
    if fft_type == FftType.RFFT:
        mask = _half_spectrum_mask(fft_lengths, a.shape, a.dtype)
        out = fft(div(conj(ct), mask), FftType.IRFFT, fft_lengths)
        return [mul(out, scalar_constant(n_total, real_dtype(a.dtype)))]
    # IRFFT
    spectrum = fft(ct, FftType.RFFT, fft_lengths)
    s = aval_of(spectrum)
    mask = _half_spectrum_mask(fft_lengths, s.shape, s.dtype)
    return [conj(mul(spectrum, mul(mask, scalar_constant(1.0 / n_total, s.dtype))))]


transpose_rules[fft_p] = _fft_transpose


def _fft_batch(size, vals, dims, *, fft_type, fft_lengths):
    x, d = vals[0], dims[0]
    if d >= aval_of(x).ndim - len(fft_lengths):  # the batch axis is a transformed one
        x, d = moveaxis(x, d, 0), 0
    return bind(fft_p, x, fft_type=fft_type, fft_lengths=fft_lengths), d


batch_rules[fft_p] = _fft_batch
