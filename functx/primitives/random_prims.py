"""JAX's random primitives: making, splitting and wrapping keys, drawing
bits (also lax.rng_bit_generator's), and gamma samples.

Every `jax.random` function reduces to these plus ordinary array
operations (`normal` is `random_bits`, shifts, a bitcast and `erf_inv`;
poisson and binomial add while loops), so lifted `jax.random` code runs
under every functx transform once these have rules.
Evaluation is JAX's own primitive. Keys are values of an extended dtype
(NOTE [key dtypes] in core.py) or, for old-style keys, raw uint32 arrays
that `random_wrap` / `random_unwrap` convert.

Derivatives: keys and bits do not vary continuously with anything, so every
primitive here except `random_gamma` has symbolic zero tangents; a key is
never differentiated. `random_gamma` is differentiable in its shape
parameter `a` (NOTE [gamma reparameterisation]).

Batching: `random_seed`, `random_bits`, `random_split`, `random_unwrap` and
`random_clone` act on each key (or seed) separately and put their own
axes after the key's, so the batch axis stays where it is. `random_wrap`
reads the trailing axis of a raw key (uint32[..., 2]) as key data, so a
batch axis there is moved to the front first. `random_fold_in` broadcasts its keys against
its data like any binary elementwise op. `random_gamma` needs the key's
shape to be a prefix of `a`'s, so both get the batch axis in front.
"""

import functools

import jax
import numpy as np
from jax._src.lax import lax as _jax_lax
from jax._src.lax.special import random_gamma_grad as _jax_random_gamma_grad
from jax._src.random import core as _jrandom
from jax._src.random import prng as _jprng
from jax._src.random import threefry2x32 as _jthreefry

from ..core import Aval, Primitive
from ..errors import FunctxValueError
from ..interpreters.eval import defimpl
from ..lifting import call_lifted
from .common import (
    Zero,
    aval_of,
    batch_rules,
    bdim_to_front,
    bind,
    broadcast_shapes,
    broadcasting_batch,
    defjvp,
    defprim,
    defzero_jvp,
    jvp_rules,
    moveaxis,
    shape_rules,
    unary_batch,
)

_UINT32 = np.dtype("uint32")


def _key_dtype(impl):
    return _jprng.KeyTy(impl)


# --------------------------------------------------------------------------
# Keys and bits

random_seed_p = defprim("random_seed", _jprng.random_seed_p)
shape_rules[random_seed_p] = lambda seeds, *, impl: Aval(seeds.shape, _key_dtype(impl))
defzero_jvp(random_seed_p)
unary_batch(random_seed_p)

# Since JAX 0.12.1 `random_bits` has several results (`num_streams`
# independent streams) and an `out_sharding`: functx's follows the
# installed JAX's (NOTE [parameters newer JAX adds]).
random_bits_p = defprim("random_bits", _jprng.random_bits_p,
                        multiple_results=_jprng.random_bits_p.multiple_results)


def _bits_shape(keys, *, bit_width, shape, num_streams=1, **params):
    aval = Aval(keys.shape + tuple(shape), np.dtype(f"uint{bit_width}"))
    return [aval] * num_streams if random_bits_p.multiple_results else aval


def _bits_batch(size, vals, dims, **params):
    out = bind(random_bits_p, vals[0], **params)
    return out, [dims[0]] * len(out) if random_bits_p.multiple_results else dims[0]


shape_rules[random_bits_p] = _bits_shape
defzero_jvp(random_bits_p)
batch_rules[random_bits_p] = _bits_batch

random_split_p = defprim("random_split", _jprng.random_split_p)
shape_rules[random_split_p] = lambda keys, *, shape, **params: Aval(
    keys.shape + tuple(shape), keys.dtype)
defzero_jvp(random_split_p)
unary_batch(random_split_p)

random_unwrap_p = defprim("random_unwrap", _jprng.random_unwrap_p)
shape_rules[random_unwrap_p] = lambda keys: Aval(
    keys.shape + tuple(keys.dtype._impl.key_shape), _UINT32)
defzero_jvp(random_unwrap_p)
unary_batch(random_unwrap_p)

random_clone_p = defprim("random_clone", _jrandom.random_clone_p)
shape_rules[random_clone_p] = lambda keys: keys
defzero_jvp(random_clone_p)
unary_batch(random_clone_p)

random_fold_in_p = defprim("random_fold_in", _jprng.random_fold_in_p)
shape_rules[random_fold_in_p] = lambda keys, msgs: Aval(
    broadcast_shapes("random_fold_in", [keys, msgs]), keys.dtype)
defzero_jvp(random_fold_in_p)
broadcasting_batch(random_fold_in_p)

random_wrap_p = defprim("random_wrap", _jprng.random_wrap_p)


def _wrap_shape(data, *, impl):
    n = len(impl.key_shape)
    return Aval(data.shape[:len(data.shape) - n], _key_dtype(impl))


def _wrap_batch(size, vals, dims, *, impl):
    (data,), (d,) = vals, dims
    n_keys = aval_of(data).ndim - len(impl.key_shape)  # batched key axes
    if d >= n_keys:  # the batch axis is among the key-data axes
        data, d = moveaxis(data, d, 0), 0
    return bind(random_wrap_p, data, impl=impl), d


shape_rules[random_wrap_p] = _wrap_shape
defzero_jvp(random_wrap_p)
batch_rules[random_wrap_p] = _wrap_batch


# The Threefry hash itself: only emitted when a user binds it directly
# (jax.extend.random.threefry_2x32); the default configuration keeps it
# inside `random_bits`. Integer in, integer out: elementwise with lax
# broadcasting, zero tangents.
threefry2x32_p = defprim("threefry2x32", _jthreefry.threefry2x32_p, multiple_results=True)


def _threefry_shape(*avals):
    shape = broadcast_shapes("threefry2x32", avals)
    return [Aval(shape, _UINT32), Aval(shape, _UINT32)]


_threefry_bcast = broadcasting_batch(threefry2x32_p)


def _threefry_batch(size, vals, dims):
    outs, d = _threefry_bcast(size, vals, dims)
    return outs, [d, d]


shape_rules[threefry2x32_p] = _threefry_shape
defzero_jvp(threefry2x32_p)
batch_rules[threefry2x32_p] = _threefry_batch


# --------------------------------------------------------------------------
# Gamma samples

# NOTE [gamma reparameterisation]
# `random_gamma(key, a)` draws x ~ Gamma(a, 1) by rejection sampling, which
# has no derivative to follow. JAX differentiates it implicitly instead:
# with F(x; a) the gamma CDF and u = F(x; a) held fixed (the sample's
# quantile does not depend on a), dx/da = -(dF/da) / (dF/dx). JAX computes
# this with `lax.random_gamma_grad(a, x)`; functx wraps that as the
# elementwise primitive `random_gamma_grad(a, x, log_space)` below, so it
# batches elementwise and its inner while loop never has to be transformed
# for first derivatives. For `log_space` samples (loggamma), x is log of the
# sample s and d(log s)/da = (ds/da) / s, with s = exp(x) nudged up to the
# smallest normal float where it underflows to 0, as JAX does.
# The tangent of the sample is `t_a * random_gamma_grad(a, x)`: linear in
# t_a, so reverse mode transposes it as a plain multiplication. The key gets
# no tangent.
#
# Higher derivatives differentiate `random_gamma_grad` itself: its partial
# derivatives in a and x are JAX's forward-mode jvp of the function (its
# inner while loop has a forward derivative in JAX), evaluated on the
# primal values (lifted: NOTE [rules borrowed from JAX] in conv.py), so the
# tangent stays a product with the tangents and reverse mode works there
# too. Batching those partials under an enclosing vmap needs functx's
# `while` rules, since they are replayed as functx primitives.


def _sample_grad(a, x, log_space):
    """dx/da for a gamma sample x (or log-sample, `log_space`) of shape a."""
    if log_space:
        s = jax.numpy.exp(x)
        s = jax.numpy.where(s == 0, jax.numpy.finfo(s.dtype).tiny, s)
        return _jax_random_gamma_grad(a, s) / s
    return _jax_random_gamma_grad(a, x)


random_gamma_grad_p = Primitive("random_gamma_grad")


@functools.cache
def _compiled_sample_grad(log_space):
    return jax.jit(functools.partial(_sample_grad, log_space=log_space))


def _gamma_grad_impl(a, x, *, log_space):
    if isinstance(a, jax.core.Tracer) or isinstance(x, jax.core.Tracer):
        return _sample_grad(a, x, log_space)
    return _compiled_sample_grad(log_space)(a, x)


def _gamma_grad_shape(a, x, *, log_space):
    if a.shape != x.shape or a.dtype != x.dtype:
        raise FunctxValueError(
            f"random_gamma_grad: a and x must have equal shapes and dtypes, got "
            f"{a.str_short()} and {x.str_short()}."
        )
    return Aval(a.shape, a.dtype, a.weak_type and x.weak_type)


@functools.cache
def _partial(which, log_space):
    """The partial derivative of `_sample_grad` in argument `which` (0: a,
    1: x), as a JAX function of (a, x): a jvp with a unit tangent there
    (the function is elementwise)."""

    def partial(a, x):
        ones = jax.numpy.ones_like(a)
        zeros = jax.numpy.zeros_like(a)
        tangents = (ones, zeros) if which == 0 else (zeros, ones)
        f = functools.partial(_sample_grad, log_space=log_space)
        return jax.jvp(f, (a, x), tangents)[1]

    return partial


def _gamma_grad_partial(which):
    def contribution(t, a, x, *, log_space):
        from .elementwise import mul

        return mul(t, call_lifted(_partial(which, log_space), (a, x), {}, replay=True))

    return contribution


defimpl(random_gamma_grad_p, _gamma_grad_impl)
shape_rules[random_gamma_grad_p] = _gamma_grad_shape
defjvp(random_gamma_grad_p, _gamma_grad_partial(0), _gamma_grad_partial(1))
broadcasting_batch(random_gamma_grad_p)


random_gamma_p = defprim("random_gamma", _jrandom.random_gamma_p)
shape_rules[random_gamma_p] = lambda key, a, *, log_space, **params: a


def _gamma_jvp(primals, tangents, *, log_space, **params):
    key, a = primals
    out = bind(random_gamma_p, key, a, log_space=log_space, **params)
    ta = tangents[1]
    if type(ta) is Zero:
        return out, Zero.of(out)
    from .elementwise import mul

    return out, mul(ta, bind(random_gamma_grad_p, a, out, log_space=log_space))


def _gamma_batch(size, vals, dims, *, log_space, **params):
    key, a = (bdim_to_front(v, d, size) for v, d in zip(vals, dims))
    return bind(random_gamma_p, key, a, log_space=log_space, **params), 0


jvp_rules[random_gamma_p] = _gamma_jvp
batch_rules[random_gamma_p] = _gamma_batch

# --------------------------------------------------------------------------
# rng_bit_generator (lax.rng_bit_generator, the `rbg` PRNG): (key, bits) from
# a raw key. Integer outputs: zero tangents. JAX has no batching rule for it;
# a batched key draws one batch element at a time, in a scan.

rng_bit_generator_p = defprim("rng_bit_generator", _jax_lax.rng_bit_generator_p,
                              multiple_results=True)
defzero_jvp(rng_bit_generator_p)


def _bit_generator_batch(size, vals, dims, **params):
    from .. import lax as fxlax

    keys = bdim_to_front(vals[0], dims[0], size)
    outs = fxlax.map(lambda key: bind(rng_bit_generator_p, key, **params), keys)
    return list(outs), [0, 0]


batch_rules[rng_bit_generator_p] = _bit_generator_batch
