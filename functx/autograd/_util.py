"""Helpers shared by functx.autograd: the error classes that mirror
torch.autograd's, tuple handling in torch's style, detaching, and the
structural dependence analysis behind `strict=True`.

NOTE [structural dependence]
torch decides "output i is independent of input k" from its autograd graph:
`autograd.grad` returns None for an input the output does not reach, and a
result "requires grad" when its graph leads back to the inputs. functx has
the same information as symbolic zeros. `linearize_reverse` records the
linear part of a function on a tape: an output that does not depend on the
differentiated inputs is never boxed and comes back as a symbolic zero
(`LinearMap.zero_avals`), and the tape's equations say which input tangents
reach which output tangents. `dependencies` reads both: for each output
leaf, the set of inputs it depends on, with no arithmetic. Like torch's
graph, it is structural: `x * 0.0` depends on `x`, while a primitive with a
zero derivative (rounding, comparisons) cuts the dependence (torch keeps
those edges, so there functx is stricter). A multi-output equation (a
loop, a call) is treated as a whole: each of its outputs depends on all of
its inputs.

"Requires grad" of a derived result (a vjp with `create_graph=True`, the
gradient inside a Hessian) is the same question asked one level up:
`probe` runs a computation with its inputs boxed by a fresh reverse level
and reports, per result leaf, whether it depends on them.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from ..core import Tracer, aval_of, host_to_jax
from ..errors import FunctxRuntimeError, FunctxTypeError, FunctxValueError
from ..interpreters.staging import Var
from ..primitives.elementwise import stop_gradient
from ..transforms.grad import linearize_reverse


class AutogradValueError(FunctxValueError, RuntimeError):
    """A wrong size or structure in a functx.autograd call. Also a
    RuntimeError, because torch.autograd raises RuntimeError there."""


class AutogradNotImplementedError(FunctxRuntimeError, NotImplementedError):
    """An argument combination torch.autograd does not implement either
    (e.g. `strategy="forward-mode"` without `vectorize=True`)."""


class IndependenceError(FunctxRuntimeError):
    """`strict=True` found an output that does not depend on an input."""


_ARRAYS = (Tracer, jax.Array, np.ndarray, np.generic)
_SCALARS = (bool, int, float, complex)


def is_array(x):
    return isinstance(x, _ARRAYS) or type(x) in _SCALARS


def as_tuple(value, arg_name, fn_name):
    """torch's `_as_tuple`: `(was_a_tuple, tuple_of_arrays)`. A tuple is a
    tuple of arrays; anything else must be one array (a list is refused, as
    torch does, rather than guessed at)."""
    is_tuple = isinstance(value, tuple)
    items = value if is_tuple else (value,)
    for i, x in enumerate(items):
        if not is_array(x):
            where = f"the value at index {i}" if is_tuple else f"the given {arg_name}"
            raise FunctxTypeError(
                f"{fn_name}: the {arg_name} must be an array or a tuple of arrays, but "
                f"{where} is a {type(x).__name__}. Pass arrays (JAX or NumPy), and a "
                "tuple (not a list) for several of them."
            )
    return is_tuple, tuple(host_to_jax(x) if isinstance(x, (np.ndarray, np.generic)) or
                           type(x) in _SCALARS else x for x in items)


def tuple_postprocess(res, to_unpack):
    """torch's `_tuple_postprocess`: undo `as_tuple` on a result, for one
    flag or for a (outer, inner) pair of flags of a nested tuple."""
    if isinstance(to_unpack, tuple):
        outer, inner = to_unpack
        if not inner:
            res = tuple(r[0] for r in res)
        if not outer:
            res = res[0]
    elif not to_unpack:
        res = res[0]
    return res


def detach(tree):
    """stop_gradient on every traced leaf (functx or JAX tracers); concrete
    arrays have nothing to detach from and are returned as they are."""
    def one(x):
        if isinstance(x, (Tracer, jax.core.Tracer)):
            return stop_gradient(x)
        return x

    return tree_util.tree_map(one, tree)


def cast_like(x, aval):
    """`x` with the dtype of `aval` (torch casts a gradient to the dtype of
    the value it belongs to)."""
    if aval_of(x).dtype == aval.dtype:
        return x
    if isinstance(x, Tracer):
        return x.astype(aval.dtype)
    if isinstance(x, (np.ndarray, np.generic)) or type(x) in _SCALARS:
        return host_to_jax(x, aval.dtype)
    return jnp.asarray(x, aval.dtype)


def dependencies(func, args, call):
    """Run `func(*args)` under reverse mode (NOTE [structural dependence]).

    Returns `(result, deps)`: the `ReverseResult` of `linearize_reverse`
    and, per flat output leaf, the frozenset of positions of the input
    leaves it depends on."""
    r = linearize_reverse(func, args, False, call)
    graph = r.linear.graph
    reach = {v: frozenset([k]) for k, v in enumerate(graph.inputs)}
    empty = frozenset()
    for eqn in graph.eqns:
        srcs = [reach.get(x, empty) for x in eqn.inputs if type(x) is Var]
        d = frozenset().union(*srcs) if srcs else empty
        for o in eqn.outputs:
            reach[o] = d
    live = iter(graph.outputs)
    deps = []
    for z in r.linear.zero_avals:
        if z is not None:
            deps.append(empty)
        else:
            x = next(live)
            deps.append(reach.get(x, empty) if type(x) is Var else empty)
    return r, deps


def probe(compute, args, call):
    """Run `compute(*args)` with `args` boxed by a fresh reverse level.
    Returns `(values, depends)`: the results (as if run without the probe)
    and a matching tree of bools, True where a leaf depends on `args`
    (torch's `requires_grad` of a result)."""
    r = linearize_reverse(compute, args, False, call)
    values = tree_util.tree_unflatten(r.out_tree, r.out)
    depends = tree_util.tree_unflatten(r.out_tree, [z is None for z in r.linear.zero_avals])
    return values, depends
