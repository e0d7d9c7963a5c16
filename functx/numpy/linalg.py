"""functx.numpy.linalg: jax.numpy.linalg on functx values (see
functx.numpy)."""

import jax.numpy.linalg as _source

from . import populate as _populate

__all__ = _populate(globals(), _source, "jax.numpy.linalg")
