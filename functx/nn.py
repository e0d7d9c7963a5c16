"""functx.nn: jax.nn on functx values, plus torch-style `dropout`.

Every public function of `jax.nn` is here with the same arguments and
results (see functx.numpy for how they accept functx values).
"""

import jax.nn as _jnn

from . import random as _random
from .numpy import populate as _populate

__all__ = _populate(globals(), _jnn, "jax.nn") + ["dropout"]


def dropout(input, p=0.5, training=True, inplace=False):
    """torch.nn.functional.dropout: zero each element with probability `p`
    and scale the rest by 1 / (1 - p), drawing from functx's global generator
    (functx.random.manual_seed). Under vmap, `randomness=` decides whether
    batch elements share the mask.

    Example:
      >>> functx.random.manual_seed(0)
      >>> functx.vmap(lambda x: functx.nn.dropout(x, 0.1), randomness="different")(xs)
    """
    del inplace
    if not 0.0 <= p <= 1.0:
        from .errors import FunctxValueError

        raise FunctxValueError(f"dropout(input, p={p!r}): p must be in [0, 1].")
    if not training or p == 0.0:
        return input
    from . import numpy as fnp

    if p == 1.0:
        return fnp.zeros_like(input)
    keep = _random.bernoulli(fnp.full_like(input, 1.0 - p))
    return input * keep / (1.0 - p)
