"""functx.lax: jax.lax on functx values.

Every public function of `jax.lax` is here with the same arguments and
results, run through `functx.lift` when it meets functx values (NOTE
[lifting] in functx/lifting.py). Structured control flow (`cond`, `scan`,
`while_loop`, `fori_loop`, `map`) works on arrays and JAX values; its
functx transform rules are not written yet, so under a functx transform it
raises an error naming the primitive (use Python control flow on concrete
values, or functx.numpy.where, meanwhile).
"""

import jax.lax as _jlax

from .numpy import populate as _populate

__all__ = [n for n in _populate(globals(), _jlax, "jax.lax") if not n.endswith("_p")]
for _n in [n for n in globals() if n.endswith("_p") and not n.startswith("_")]:
    del globals()[_n]
del _n
