"""functx.autograd: the parts of torch.autograd that fit a functional
design, built on functx's transforms (SPEC section 4).

* `functional`: jacobian, hessian, vjp, jvp, hvp, vhp with torch's
  arguments, return structures and `strict` / `create_graph` semantics.
* `gradcheck`, `gradgradcheck`: finite-difference checks of functx's
  derivatives (reverse, forward, batched, fast mode); `GradcheckError`.
* `forward_ad`: dual levels, `make_dual`, `unpack_dual`.
* `profiler`: `profile`, `record_function`: per-primitive timings of eager
  execution, torch-style tables and Chrome traces.
"""

from . import forward_ad, functional, profiler  # noqa: F401
from ._util import AutogradNotImplementedError, AutogradValueError, IndependenceError  # noqa: F401
from .gradcheck import GradcheckError, gradcheck, gradgradcheck  # noqa: F401

__all__ = [
    "functional", "forward_ad", "profiler", "gradcheck", "gradgradcheck", "GradcheckError",
    "IndependenceError", "AutogradValueError", "AutogradNotImplementedError",
]
from .function import Function, FunctionCtx, once_differentiable  # noqa: E402,F401

__all__ += ["Function", "FunctionCtx", "once_differentiable"]
from .grad_mode import (  # noqa: E402,F401
    enable_grad,
    inference_mode,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
)

__all__ += ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled"]
from . import graph  # noqa: E402,F401
from .anomaly_mode import (  # noqa: E402,F401
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)

__all__ += ["graph", "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
            "is_anomaly_check_nan_enabled"]
