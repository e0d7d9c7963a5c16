"""functx.numpy.fft: jax.numpy.fft on functx values (see functx.numpy)."""

import jax.numpy.fft as _source

from . import populate as _populate

__all__ = _populate(globals(), _source, "jax.numpy.fft")
