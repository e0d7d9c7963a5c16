"""functx.autograd: the parts of torch.autograd that fit a functional
design, built on functx's transforms (SPEC section 4).

* `functional`: jacobian, hessian, vjp, jvp, hvp, vhp with torch's
  arguments, return structures and `strict` / `create_graph` semantics.
* `Function`: torch's custom operations, on functx's custom-rule primitives.
* grad modes: `no_grad`, `enable_grad`, `set_grad_enabled`,
  `inference_mode`, `is_grad_enabled` (by level, torch.func's semantics).
* `gradcheck`, `gradgradcheck`: finite-difference checks of functx's
  derivatives (reverse, forward, batched, fast mode); `GradcheckError`.
* `detect_anomaly`, `set_detect_anomaly`: the first NaN of a backward pass
  raises `AnomalyError`, naming the forward operation.
* `graph`: `saved_tensors_hooks`, `save_on_cpu`.
* `forward_ad`: dual levels, `make_dual`, `unpack_dual`.
* `profiler`: `profile`, `record_function`: per-primitive timings of eager
  execution, torch-style tables and Chrome traces.
* imperative mode: `Tensor`, `tensor`, `backward`, `grad`: torch-style
  tensors that record operations, and backward passes over them.
"""

from . import forward_ad, functional, graph, profiler
from ._util import AutogradNotImplementedError, AutogradValueError, IndependenceError
from .anomaly_mode import (
    AnomalyError,
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from .function import Function, FunctionCtx, once_differentiable
from .grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .gradcheck import GradcheckError, gradcheck, gradgradcheck
from .imperative import AccumulateGrad, Node, RemovableHandle, Tensor, backward, grad, tensor

__all__ = [
    "functional", "forward_ad", "graph", "profiler",
    "Function", "FunctionCtx", "once_differentiable",
    "no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled",
    "gradcheck", "gradgradcheck", "GradcheckError",
    "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled", "AnomalyError",
    "IndependenceError", "AutogradValueError", "AutogradNotImplementedError",
    "Tensor", "tensor", "backward", "grad", "Node", "AccumulateGrad", "RemovableHandle",
]
