"""The public transforms (torch.func interface): one module per family."""

from .grad import grad, grad_and_value, vjp  # noqa: F401
from .jacobians import hessian, hvp, jacfwd, jacrev, vhp  # noqa: F401
from .jvp import jvp, linearize  # noqa: F401
from .vmap import vmap  # noqa: F401
from .jit import jit, make_graph  # noqa: F401
from .module import functional_call, named_buffers, named_parameters, stack_module_state  # noqa: F401
from .per_sample import clipped_grad, grad_and_norms, per_sample_grad_norms  # noqa: F401
