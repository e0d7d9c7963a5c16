"""functx: composable function transforms with the interface of torch.func,
built on a stack of interpreters that lower onto jax.lax."""

from . import core as _core  # noqa: F401  (the interpreter stack)
from . import primitives as _primitives  # noqa: F401  (registers every rule)
from . import numpy, lax, nn, random  # noqa: F401
from . import _array_api  # noqa: F401  (operators and methods of functx values)
from . import test_util  # noqa: F401
from . import autograd  # noqa: F401  (torch.autograd equivalents)
from . import config  # noqa: F401  (functx.config.update: compile log, persistent cache)
from . import interop as _interop  # noqa: F401  (NOTE [JAX on functx values])
from .errors import (
    ConcretizationError,
    EscapedTracerError,
    FunctxError,
    FunctxRuntimeError,
    FunctxTypeError,
    FunctxValueError,
    IndexConcretizationError,
    JaxOnFunctxValueError,
    MissingRuleError,
    UnboundAxisNameError,
    ChunkedCollectiveError,
    EquinoxBatchShapeError,
)
from .caches import cache_info, clear_caches
from .custom import custom_jvp, custom_vjp
from .lifting import lift
from .memory import memory_report
from .autograd.grad_mode import (  # noqa: F401  (as torch re-exports them)
    enable_grad,
    inference_mode,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
)
from .transforms.checkpoint import checkpoint
from .transforms import (
    clipped_grad,
    functional_call,
    grad,
    grad_and_norms,
    grad_and_value,
    hessian,
    hvp,
    jacfwd,
    jacrev,
    jit,
    jvp,
    linearize,
    make_graph,
    named_buffers,
    named_parameters,
    per_sample_grad_norms,
    stack_module_state,
    vhp,
    vjp,
    vmap,
)

__version__ = "0.1.0"

from . import caches as _caches  # noqa: E402

_caches.collect_if_overdue()  # NOTE [full collections between calls]

__all__ = [
    "grad", "grad_and_value", "vjp", "jvp", "linearize", "vmap", "jacrev", "jacfwd",
    "hessian", "hvp", "vhp", "jit", "make_graph", "functional_call", "stack_module_state",
    "named_parameters", "named_buffers", "lift", "custom_jvp", "custom_vjp",
    "no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled", "checkpoint",
    "numpy", "lax", "nn", "random", "test_util", "autograd", "config",
    "FunctxError", "FunctxTypeError", "FunctxValueError", "FunctxRuntimeError",
    "EscapedTracerError", "MissingRuleError", "ConcretizationError", "IndexConcretizationError",
    "JaxOnFunctxValueError", "UnboundAxisNameError", "ChunkedCollectiveError", "EquinoxBatchShapeError",
    "clear_caches", "cache_info",
    "per_sample_grad_norms", "grad_and_norms", "clipped_grad", "memory_report",
]
