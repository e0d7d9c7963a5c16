"""functx.autograd: the parts of torch.autograd that fit a functional
design, built on functx's transforms (SPEC section 4).

* `functional`: jacobian, hessian, vjp, jvp, hvp, vhp with torch's
  arguments, return structures and `strict` / `create_graph` semantics.
* `gradcheck`, `gradgradcheck`: finite-difference checks of functx's
  derivatives (reverse, forward, batched, fast mode); `GradcheckError`.
* `forward_ad`: dual levels, `make_dual`, `unpack_dual`.
"""

from . import forward_ad, functional  # noqa: F401
from ._util import AutogradNotImplementedError, AutogradValueError, IndependenceError  # noqa: F401
from .gradcheck import GradcheckError, gradcheck, gradgradcheck  # noqa: F401

__all__ = [
    "functional", "forward_ad", "gradcheck", "gradgradcheck", "GradcheckError",
    "IndependenceError", "AutogradValueError", "AutogradNotImplementedError",
]
