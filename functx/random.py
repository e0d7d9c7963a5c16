"""functx.random: jax.random with explicit keys, plus torch-style stateful
functions for code ported from PyTorch.

Every public function of `jax.random` is here (see functx.numpy for how
they accept functx values). The stateful functions `manual_seed`, `rand`,
`randn`, `randint`, `randperm` and `bernoulli` draw from one global
generator, like torch's default generator.

NOTE [randomness under vmap]
A stateful draw inside `vmap` follows that vmap's `randomness`:
'error' raises, 'same' draws once for the whole batch, 'different' draws
one sample per batch element (the draw gets a leading axis per such vmap
level and is boxed as batched at those levels, outermost first).
"""

import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np

from .core import interpreter_stack
from .errors import FunctxRuntimeError, FunctxValueError
from .interpreters.batching import BatchInterpreter, BatchTracer
from .numpy import populate as _populate

__all__ = _populate(globals(), jax.random, "jax.random") + [
    "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state",
    "rand", "randn", "randint", "randperm", "bernoulli",
]


class _Generator(threading.local):
    def __init__(self):
        self.seed = 0
        self.key = None
        # > 0 while functx.jit traces a function on the assumption that it
        # draws nothing (NOTE [generator state under jit]).
        self.pure_traces = 0


class UsesGeneratorState(Exception):
    """Raised inside a `functx.jit` trace that assumed no stateful draw."""


_gen = _Generator()


def manual_seed(seed):
    """Seed the global generator (torch.manual_seed)."""
    _gen.seed = int(seed)
    _gen.key = jax.random.PRNGKey(int(seed))
    return _gen


def seed():
    """Seed the global generator from the system's entropy; return the seed."""
    s = int(np.random.SeedSequence().entropy % (2**63))
    manual_seed(s)
    return s


def initial_seed():
    return _gen.seed


def get_rng_state():
    """The generator's state (a JAX key), for set_rng_state."""
    _ensure_key()
    return _gen.key


def set_rng_state(state):
    _gen.key = state


# NOTE [generator state under jit]
# `functx.jit` first traces a function assuming it makes no stateful draw
# (`assume_no_draws`): then the compiled program takes exactly the user's
# arguments. A draw during that trace raises `UsesGeneratorState`, and the
# function is traced again with the generator's key as a hidden input and
# its final key as a hidden output (`threaded_state`), so successive calls
# of the compiled function draw different numbers, as in eager mode.


@contextlib.contextmanager
def assume_no_draws():
    _gen.pure_traces += 1
    try:
        yield
    finally:
        _gen.pure_traces -= 1


def in_pure_trace():
    return _gen.pure_traces > 0


def peek_state():
    """The generator's key as it is (None before the first draw)."""
    return _gen.key


class _FinalKey:
    key = None


@contextlib.contextmanager
def threaded_state(key):
    """Make `key` (a traced value) the generator's state inside the block;
    the yielded object's `.key` is the state at the end of the block."""
    saved = _gen.key, _gen.pure_traces
    _gen.key, _gen.pure_traces = key, 0
    final = _FinalKey()
    try:
        yield final
    finally:
        final.key = _gen.key
        _gen.key, _gen.pure_traces = saved


def _ensure_key():
    if _gen.pure_traces:
        raise UsesGeneratorState
    if _gen.key is None:
        _gen.key = jax.random.PRNGKey(_gen.seed)


def _next_key():
    _ensure_key()
    _gen.key, sub = jax.random.split(_gen.key)
    return sub


def _draw(sampler, what):
    """Draw with `sampler(key, batch_shape)` under the vmap randomness rules
    (NOTE [randomness under vmap])."""
    different = []
    for interp in interpreter_stack():
        if isinstance(interp, BatchInterpreter) and interp.alive:
            if interp.randomness == "error":
                raise FunctxRuntimeError(
                    f"vmap: {what} was called inside vmap(..., randomness='error'). Say "
                    "how random draws relate across the batch: "
                    "vmap(..., randomness='different') for independent draws per "
                    "element, or randomness='same' for one draw shared by the batch."
                )
            if interp.randomness == "different":
                different.append(interp)
    batch_shape = tuple(i.axis_size for i in different)
    x = sampler(_next_key(), batch_shape)
    for interp in different:
        x = BatchTracer(interp, x, 0)
    return x


def _shape(size, what):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    try:
        return tuple(int(s) for s in size)
    except TypeError:
        raise FunctxValueError(f"{what}: the size must be ints, got {size!r}.") from None


def _float_dtype(dtype):
    return jnp.dtype(dtype) if dtype is not None else jnp.zeros(()).dtype


def rand(*size, dtype=None):
    """Uniform samples in [0, 1) of the given shape (torch.rand)."""
    shape = _shape(size, "rand(*size)")
    dtype = _float_dtype(dtype)
    return _draw(lambda k, b: jax.random.uniform(k, b + shape, dtype), "functx.random.rand")


def randn(*size, dtype=None):
    """Standard normal samples of the given shape (torch.randn)."""
    shape = _shape(size, "randn(*size)")
    dtype = _float_dtype(dtype)
    return _draw(lambda k, b: jax.random.normal(k, b + shape, dtype), "functx.random.randn")


def randint(low, high=None, size=None, *, dtype=None):
    """Integers in [low, high) of the given shape (torch.randint); also
    `randint(high, size)`."""
    if size is None:
        if high is None:
            raise FunctxValueError("randint(low, high, size): the size is missing.")
        low, high, size = 0, low, high
    shape = _shape((size,), "randint(low, high, size)")
    dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros((), int).dtype
    return _draw(
        lambda k, b: jax.random.randint(k, b + shape, low, high, dtype), "functx.random.randint"
    )


def randperm(n, *, dtype=None):
    """A random permutation of 0..n-1 (torch.randperm)."""
    n = int(n)
    dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros((), int).dtype

    def sampler(key, batch):
        count = int(np.prod(batch, dtype=np.int64))
        keys = jax.random.split(key, count)
        perms = jax.vmap(lambda kk: jax.random.permutation(kk, n))(keys)
        return perms.reshape(batch + (n,)).astype(dtype)

    return _draw(sampler, "functx.random.randperm")


def bernoulli(p):
    """Samples 1 with probability `p` elementwise, else 0, in `p`'s dtype
    (torch.bernoulli)."""
    from . import numpy as fnp

    p_shape = tuple(np.shape(p)) if not hasattr(p, "shape") else tuple(p.shape)
    dtype = p.dtype if hasattr(p, "dtype") else _float_dtype(None)
    u = rand(*p_shape, dtype=dtype)
    return fnp.less(u, p).astype(dtype)
