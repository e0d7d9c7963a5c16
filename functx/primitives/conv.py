"""conv_general_dilated: convolutions (Equinox's Conv layers).

The convolution is linear in each operand, so its jvp is two convolutions
with the tangents. Its transpose (a convolution with a flipped, dilated
kernel, or of the input with the cotangent) and its batching (folding the
batch axis into the feature or group axes) are intricate; functx borrows
them from JAX.

NOTE [rules borrowed from JAX]
A rule may be the JAX transform of the JAX primitive, lifted: JAX's
`linear_transpose` or `vmap` of the convolution is staged once per
parameters and shapes and replayed as functx primitives (`call_lifted`), so
the result is again made of primitives with rules of their own and composes
with every transform. The function objects are cached so the lifting cache
recognises them.
"""

import functools

import jax
from jax import lax

from ..lifting import call_lifted
from .common import batch_rules, bind, defjvp, defprim, is_linear, transpose_rules

conv_p = defprim("conv_general_dilated", lax.conv_general_dilated_p)


def _jax_conv(params):
    return functools.partial(lax.conv_general_dilated_p.bind, **params)


defjvp(
    conv_p,
    lambda t, x, y, **p: bind(conv_p, t, y, **p),
    lambda t, x, y, **p: bind(conv_p, x, t, **p),
)


@functools.lru_cache(maxsize=512)
def _transposer(which, aval, items):
    """`(ct, other) -> cotangent of operand `which`` as a JAX function."""
    conv = _jax_conv(dict(items))
    struct = jax.ShapeDtypeStruct(aval.shape, aval.dtype)

    if which == 0:
        def transpose(ct, rhs):
            return jax.linear_transpose(lambda lhs: conv(lhs, rhs), struct)(ct)[0]
    else:
        def transpose(ct, lhs):
            return jax.linear_transpose(lambda rhs: conv(lhs, rhs), struct)(ct)[0]
    return transpose


def _conv_transpose(ct, x, y, **params):
    items = tuple(sorted(params.items()))
    out = [None, None]
    if is_linear(x):
        out[0] = call_lifted(_transposer(0, x.aval, items), (ct, y), {}, replay=True)
    if is_linear(y):
        out[1] = call_lifted(_transposer(1, y.aval, items), (ct, x), {}, replay=True)
    return out


transpose_rules[conv_p] = _conv_transpose


@functools.lru_cache(maxsize=512)
def _batched(dims, items):
    return jax.vmap(_jax_conv(dict(items)), in_axes=dims)


def _conv_batch(size, vals, dims, **params):
    fn = _batched(tuple(dims), tuple(sorted(params.items())))
    return call_lifted(fn, tuple(vals), {}, replay=True), 0


batch_rules[conv_p] = _conv_batch
