"""functx.autograd.functional: torch.autograd.functional's higher-level API
(jacobian, hessian, vjp, jvp, hvp, vhp) on functx's transforms.

Arguments, return structures and error conditions are torch's:
`inputs` is an array or a tuple of arrays and the results follow the same
choice (a tuple only where a tuple was given); `func` returns an array or a
tuple of arrays; Jacobians and Hessians are nested tuples indexed
`[output][input]` (`[input_i][input_j]` for Hessians), each block shaped
`output.shape + input.shape`.

The values are computed by functx.vjp / jvp / jacrev / jacfwd / grad, so
every function here works under any functx transform (vmap, grad, jit, ...)
and under jax.jit.

* `create_graph=False` (the default): the inputs, the outputs and the
  results are detached with stop_gradient, so an enclosing differentiation
  sees them as constants, as in torch. `create_graph=True` keeps them
  differentiable.
* `strict=True`: raise `IndependenceError` (a RuntimeError) in the
  situations torch does (NOTE [structural dependence] in _util.py): an output
  that depends on no input, an input that no output depends on, a Jacobian
  block that is structurally zero, and with `create_graph=True` a result that
  does not depend on the inputs (e.g. the vjp of a linear function).
* `vectorize` only matters for validation (torch's rules: forward mode needs
  `vectorize=True`, `strict=True` refuses it): functx always computes
  Jacobian rows with vmap, and the numbers do not depend on it.
* Nested results are always tuples (torch's forward-mode `jacobian`
  returns lists there, a quirk not reproduced).
"""

import jax.numpy as jnp

from .. import numpy as fnp
from ..core import aval_of
from ..errors import FunctxRuntimeError, FunctxValueError
from ..transforms import _args
from ..transforms.grad import grad, grad_and_value, pull_back
from ..transforms.grad import vjp as _fx_vjp
from ..transforms.jacobians import jacfwd, jacrev
from ..transforms.jvp import jvp as _fx_jvp
from . import _util
from ._util import (
    AutogradNotImplementedError,
    AutogradValueError,
    IndependenceError,
    as_tuple,
    cast_like,
    dependencies,
    detach,
    probe,
    tuple_postprocess,
)

__all__ = ["vjp", "jvp", "jacobian", "hessian", "hvp", "vhp"]

_STRATEGIES = ("forward-mode", "reverse-mode")


# --------------------------------------------------------------------------
# Shared pieces


class _Tupled:
    """`func` returning a tuple of arrays always; remembers whether `func`
    itself returned a tuple."""

    def __init__(self, func, fn_name):
        self.func = func
        self.fn_name = fn_name
        self.is_tuple = None

    def __call__(self, *xs):
        self.is_tuple, out = as_tuple(self.func(*xs), "outputs of the user-provided function",
                                      self.fn_name)
        return out


class _Scalar:
    """`func` for the Hessian family: it must return one array with one
    element; returns that element as a 0-d array (and with `with_raw`, the
    output as returned too, for the `(output, result)` pair)."""

    def __init__(self, func, fn_name, with_raw=False):
        self.func = func
        self.fn_name = fn_name
        self.with_raw = with_raw

    def __call__(self, *xs):
        out = self.func(*xs)
        if isinstance(out, (tuple, list)) or not _util.is_array(out):
            raise AutogradValueError(
                f"{self.fn_name}: the function given to {self.fn_name} should return a "
                f"single array, got a {type(out).__name__}. Return one array with one "
                "element."
            )
        a = aval_of(out)
        if a.size != 1:
            raise AutogradValueError(
                f"{self.fn_name}: the array returned by the function given to "
                f"{self.fn_name} should contain a single element, got {a.str_short()}. "
                "Reduce it (e.g. .sum()) first."
            )
        scalar = fnp.reshape(out, ())
        return (scalar, out) if self.with_raw else scalar


def _check_callable(func, name):
    _args.check_callable(func, f"autograd.functional.{name}")


def _check_strategy(strategy, arg, name):
    if strategy not in _STRATEGIES:
        raise FunctxValueError(
            f"autograd.functional.{name}: {arg} must be \"forward-mode\" or "
            f"\"reverse-mode\", got {strategy!r}. Forward mode tends to be faster when the "
            "function has more outputs than inputs."
        )


def _check_forward_mode(name, create_graph, strict, vectorize):
    """torch's order of checks for `strategy="forward-mode"`."""
    if create_graph:
        raise AutogradNotImplementedError(
            f"autograd.functional.{name}: create_graph=True and forward mode are not "
            "supported together (as in torch). Set create_graph=False or use "
            "\"reverse-mode\"."
        )
    if strict:
        raise FunctxRuntimeError(
            f"autograd.functional.{name}: strict=True and forward mode are not supported "
            "together (as in torch). Set strict=False or use \"reverse-mode\"."
        )
    if not vectorize:
        raise AutogradNotImplementedError(
            f"autograd.functional.{name}: forward mode is only implemented for "
            "vectorize=True (as in torch). Pass vectorize=True."
        )


def _strict_vectorize_error(name):
    return FunctxRuntimeError(
        f"autograd.functional.{name}: strict=True and vectorize=True are not supported "
        "together (as in torch). Set strict=False or vectorize=False."
    )


def _prepare_v(v, refs, is_ref_tuple, name, ref_name, single_hint):
    """Validate `v` against `refs` (the inputs, or the outputs for vjp) as
    torch does, and cast each entry to its reference's dtype. `v=None` is
    allowed only for a single reference with one element."""
    if v is None:
        if len(refs) != 1 or aval_of(refs[0]).size != 1:
            raise AutogradValueError(
                f"autograd.functional.{name}: v can only be None if {single_hint} "
                "a single array with a single element. Pass v."
            )
        a = aval_of(refs[0])
        return (jnp.ones(a.shape, a.dtype),)
    _, v = as_tuple(v, "v", f"autograd.functional.{name}")
    if len(v) != len(refs):
        if is_ref_tuple:
            msg = f"v is a tuple of invalid length: should be {len(refs)} but got {len(v)}."
        else:
            msg = "the given v should contain a single array."
        raise AutogradValueError(f"autograd.functional.{name}: {msg} Pass one v per {ref_name}.")
    out = []
    for i, (x, ref) in enumerate(zip(v, refs)):
        a, b = aval_of(ref), aval_of(x)
        if a.shape != b.shape:
            where = f"entry {i} in v" if is_ref_tuple else "v"
            raise AutogradValueError(
                f"autograd.functional.{name}: {where} has invalid shape: should be "
                f"{a.shape} (the shape of the {ref_name}) but got {b.shape}."
            )
        out.append(cast_like(x, a))
    return tuple(out)


def _independent_output(name, i):
    return IndependenceError(
        f"autograd.functional.{name}(strict=True): output {i} of the user-provided "
        "function does not depend on any input. strict=True requires every output to "
        "be computed differentiably from the inputs; pass strict=False to get zeros."
    )


def _independent_input(name, k, what="the output of the user-provided function"):
    return IndependenceError(
        f"autograd.functional.{name}(strict=True): {what} is independent of input {k}. "
        "This is not allowed in strict mode; pass strict=False to get zeros."
    )


def _check_first_order(name, deps, n_inputs, per_pair=False):
    """strict checks of a function's own outputs (`deps` from
    `dependencies`): every output depends on some input, and every input
    reaches some output (or, `per_pair`, every output)."""
    for i, d in enumerate(deps):
        if not d:
            raise _independent_output(name, i)
    for k in range(n_inputs):
        if per_pair:
            for i, d in enumerate(deps):
                if k not in d:
                    raise IndependenceError(
                        f"autograd.functional.{name}(strict=True): output {i} of the "
                        f"user-provided function is independent of input {k}. This is "
                        "not allowed in strict mode; pass strict=False to get a block of "
                        "zeros."
                    )
        elif not any(k in d for d in deps):
            raise _independent_input(name, k)


def _check_derived(name, depends, what):
    """strict + create_graph: every result must depend on the inputs
    (torch's `requires_grad` check). `depends` is a flat list of
    (index description, bool)."""
    for where, dep in depends:
        if not dep:
            raise IndependenceError(
                f"autograd.functional.{name}(strict=True, create_graph=True): {what} "
                f"{where} does not depend on the inputs (the function is linear there, "
                "so its derivative is a constant). This is not allowed in strict mode "
                "with create_graph=True; pass strict=False."
            )


def _second_order(name, scalar, xs, call):
    """strict checks shared by hessian / hvp / vhp. Runs the gradient of
    `scalar` under reverse mode once and returns, per gradient block,
    the inputs it depends on (`deps2`). Raises, like torch, when the output
    depends on no input, when an input does not reach the output, or when
    a gradient block is a constant."""
    first = {}

    def grads(*ys):
        r1, d1 = dependencies(scalar, ys, call)
        first["deps"] = d1
        a = r1.out_avals[0]
        return tuple(pull_back(r1, [jnp.ones(a.shape, a.dtype)]))

    _, deps2 = dependencies(grads, xs, call)
    _check_first_order(name, first["deps"], len(xs))
    for k, d in enumerate(deps2):
        if not d:
            raise IndependenceError(
                f"autograd.functional.{name}(strict=True): the gradient of the "
                f"user-provided function with respect to input {k} does not depend on the "
                "inputs (the function is linear in it), so its Hessian is zero. This is "
                "not allowed in strict mode; pass strict=False."
            )
    return deps2


def _finish(values, create_graph):
    return values if create_graph else detach(values)


# --------------------------------------------------------------------------
# vjp / jvp


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """Vector-Jacobian product of `func` at `inputs` (torch's
    `autograd.functional.vjp`).

    Args:
      func (Callable): a function of arrays returning an array or a tuple of
        arrays.
      inputs (jax.Array | tuple): an array or a tuple of arrays.
      v (jax.Array | tuple | None): the vector, with the structure and shapes of
        `func`'s output; may be None when the output is a single array with one
        element.
      create_graph (bool): keep the results differentiable (else detached).
      strict (bool): raise IndependenceError when an output does not depend on
        any input or an input does not reach any output (and with create_graph,
        when a result does not depend on the inputs).

    Returns:
      tuple: `(func_output, vjp)`: vjp has the structure of `inputs`.

    Example:
      >>> out, (gx, gy) = functional.vjp(lambda x, y: x * y, (x, y), v)
      >>> functx.vmap(lambda v: functional.vjp(f, x, v)[1])(vs)   # batched
    """
    name = "vjp"
    _check_callable(func, name)
    is_in_tuple, inputs = as_tuple(inputs, "inputs", f"autograd.functional.{name}")
    if not create_graph:
        inputs = detach(inputs)
        v = detach(v)
    tupled = _Tupled(func, f"autograd.functional.{name}")
    call = f"autograd.functional.{name}(func, inputs)"

    def compute(*xs):
        if strict:
            _, deps = dependencies(tupled, xs, call)
            for i, d in enumerate(deps):
                if not d:
                    raise _independent_output(name, i)
        outs, pull = _fx_vjp(tupled, *xs)
        vv = _prepare_v(v, outs, tupled.is_tuple, name, "output",
                        "the user-provided function returns")
        if strict:
            _check_first_order(name, deps, len(xs))
        return outs, pull(vv)

    if strict and create_graph:
        (outs, res), (_, dep) = probe(compute, inputs, call)
        _check_derived(name, [(f"with respect to input {k}", d) for k, d in enumerate(dep)],
                       "the vjp")
    else:
        outs, res = compute(*inputs)
    outs, res = _finish((outs, res), create_graph)
    return tuple_postprocess(outs, tupled.is_tuple), tuple_postprocess(res, is_in_tuple)


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """Jacobian-vector product of `func` at `inputs` (torch's
    `autograd.functional.jvp`), computed in forward mode.

    Args:
      func (Callable): a function of arrays returning an array or a tuple of
        arrays.
      inputs (jax.Array | tuple): an array or a tuple of arrays.
      v (jax.Array | tuple | None): the vector, with the structure and shapes of
        `inputs`; may be None when the input is a single array with one element.
      create_graph (bool): keep the results differentiable (else detached).
      strict (bool): raise IndependenceError when an output does not depend on
        any input or an input does not reach any output (and with create_graph,
        when a result does not depend on the inputs).

    Returns:
      tuple: `(func_output, jvp)`: jvp has the structure of the output.

    Example:
      >>> out, tangent = functional.jvp(fnp.sin, x, v)
      >>> functx.grad(lambda x: functional.jvp(f, x, v, create_graph=True)[1].sum())(x)
    """
    name = "jvp"
    _check_callable(func, name)
    is_in_tuple, inputs = as_tuple(inputs, "inputs", f"autograd.functional.{name}")
    if not create_graph:
        inputs = detach(inputs)
        v = detach(v)
    vv = _prepare_v(v, inputs, is_in_tuple, name, "input",
                    "the input to the user-provided function is")
    tupled = _Tupled(func, f"autograd.functional.{name}")
    call = f"autograd.functional.{name}(func, inputs)"

    def compute(*xs):
        if strict:
            _, deps = dependencies(tupled, xs, call)
            _check_first_order(name, deps, len(xs))
        return _fx_jvp(tupled, xs, vv)

    if strict and create_graph:
        (outs, res), (_, dep) = probe(compute, inputs, call)
        _check_derived(name, [(f"for output {i}", d) for i, d in enumerate(dep)], "the jvp")
    else:
        outs, res = compute(*inputs)
    outs, res = _finish((outs, res), create_graph)
    return tuple_postprocess(outs, tupled.is_tuple), tuple_postprocess(res, tupled.is_tuple)


# --------------------------------------------------------------------------
# Jacobian and Hessian


def _jacobian_blocks(fn, xs, n_out, strategy, per_output):
    """Jacobian of `fn` (returning a tuple of `n_out` arrays) w.r.t. all of
    `xs`, as a tuple over outputs of tuples over inputs. `per_output`
    differentiates one output at a time, so that each block's dependence on
    the inputs can be told apart (strict with create_graph)."""
    argnums = tuple(range(len(xs)))
    transform = jacrev if strategy == "reverse-mode" else jacfwd
    if not per_output:
        return tuple(transform(fn, argnums=argnums)(*xs))
    return tuple(transform(lambda *ys, i=i: fn(*ys)[i], argnums=argnums)(*xs)
                 for i in range(n_out))


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False,
             strategy="reverse-mode"):
    """The Jacobian of `func` at `inputs` (torch's
    `autograd.functional.jacobian`).

    Args:
      func (Callable): a function of arrays returning an array or a tuple of
        arrays.
      inputs (jax.Array | tuple): an array or a tuple of arrays.
      create_graph (bool): keep the Jacobian differentiable (else detached).
      strict (bool): raise IndependenceError when an output does not depend on
        an input (any block that is structurally zero), and with create_graph
        when a block does not depend on the inputs. Not with vectorize=True or
        forward mode (as in torch).
      vectorize (bool): accepted for torch compatibility; functx always
        vectorizes (forward mode requires vectorize=True, as in torch).
      strategy (str): "reverse-mode" (functx.jacrev) or "forward-mode"
        (functx.jacfwd).

    Returns:
      jax.Array | tuple: One array if `inputs` and the output are single arrays;
      a tuple over inputs (or outputs) if one of them is a tuple; else a tuple
      over outputs of tuples over inputs. Block `[i][j]` has shape
      `output_i.shape + input_j.shape`.

    Example:
      >>> functional.jacobian(lambda x: fnp.sin(x) * 2.0, x)      # (3, 3)
      >>> functx.vmap(lambda x: functional.jacobian(f, x))(xs)     # batched
    """
    name = "jacobian"
    _check_callable(func, name)
    _check_strategy(strategy, "strategy", name)
    if strategy == "forward-mode":
        _check_forward_mode(name, create_graph, strict, vectorize)
    is_in_tuple, inputs = as_tuple(inputs, "inputs", f"autograd.functional.{name}")
    if not create_graph:
        inputs = detach(inputs)
    tupled = _Tupled(func, f"autograd.functional.{name}")
    call = f"autograd.functional.{name}(func, inputs)"
    n_out = []

    def compute(*xs):
        if strict:
            _, deps = dependencies(tupled, xs, call)
            for i, d in enumerate(deps):
                if not d:
                    raise _independent_output(name, i)
            if vectorize:
                raise _strict_vectorize_error(name)
            _check_first_order(name, deps, len(xs), per_pair=True)
            n_out.append(len(deps))
        return _jacobian_blocks(tupled, xs, n_out[0] if n_out else None, strategy,
                                per_output=strict and create_graph)

    if strict and create_graph:
        jac, dep = probe(compute, inputs, call)
        _check_derived(name, [(f"block [{i}][{k}]", d) for i, row in enumerate(dep)
                              for k, d in enumerate(row)], "the Jacobian")
    else:
        jac = compute(*inputs)
    jac = _finish(jac, create_graph)
    return tuple_postprocess(jac, (tupled.is_tuple, is_in_tuple))


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False,
            outer_jacobian_strategy="reverse-mode"):
    """The Hessian of a scalar function (torch's
    `autograd.functional.hessian`): the Jacobian of its gradient.

    Args:
      func (Callable): a function of arrays returning one array with one
        element.
      inputs (jax.Array | tuple): an array or a tuple of arrays.
      create_graph (bool): keep the Hessian differentiable (else detached).
      strict (bool): raise IndependenceError when the output does not depend on
        an input, when the gradient for an input is a constant, or when a
        Hessian block is structurally zero (as torch does); with create_graph,
        also when a block does not depend on the inputs.
      vectorize (bool): accepted for torch compatibility (see `jacobian`).
      outer_jacobian_strategy (str): how the outer Jacobian is taken:
        "reverse-mode" (reverse over reverse) or "forward-mode" (forward
        over reverse, needs vectorize=True). The gradient is always taken
        in reverse mode.

    Returns:
      jax.Array | tuple: One array of shape `input.shape * 2` for a single
      input, else a tuple of tuples: `[i][j]` has shape `input_i.shape +
      input_j.shape`.

    Example:
      >>> functional.hessian(lambda x: (x ** 3).sum(), x)   # diag(6 x)
    """
    name = "hessian"
    _check_callable(func, name)
    _check_strategy(outer_jacobian_strategy, "outer_jacobian_strategy", name)
    if outer_jacobian_strategy == "forward-mode":
        _check_forward_mode(name, create_graph, strict, vectorize)
    is_in_tuple, inputs = as_tuple(inputs, "inputs", f"autograd.functional.{name}")
    if not create_graph:
        inputs = detach(inputs)
    scalar = _Scalar(func, f"autograd.functional.{name}")
    call = f"autograd.functional.{name}(func, inputs)"

    def compute(*xs):
        argnums = tuple(range(len(xs)))
        gradient = grad(scalar, argnums=argnums)
        if strict:
            deps2 = _second_order(name, scalar, xs, call)
            if vectorize:
                raise _strict_vectorize_error(name)
            for i, d in enumerate(deps2):
                for k in range(len(xs)):
                    if k not in d:
                        raise IndependenceError(
                            f"autograd.functional.{name}(strict=True): the gradient with "
                            f"respect to input {i} is independent of input {k}, so Hessian "
                            f"block [{i}][{k}] is structurally zero. This is not allowed in "
                            "strict mode; pass strict=False to get zeros."
                        )
        return _jacobian_blocks(gradient, xs, len(xs), outer_jacobian_strategy,
                                per_output=strict and create_graph)

    if strict and create_graph:
        hess, dep = probe(compute, inputs, call)
        _check_derived(name, [(f"block [{i}][{k}]", d) for i, row in enumerate(dep)
                              for k, d in enumerate(row)], "the Hessian")
    else:
        hess = compute(*inputs)
    hess = _finish(hess, create_graph)
    return tuple_postprocess(hess, (is_in_tuple, is_in_tuple))


# --------------------------------------------------------------------------
# Hessian-vector products


def _hessian_product(name, func, inputs, v, create_graph, strict, forward):
    _check_callable(func, name)
    is_in_tuple, inputs = as_tuple(inputs, "inputs", f"autograd.functional.{name}")
    if not create_graph:
        inputs = detach(inputs)
        v = detach(v)
    vv = _prepare_v(v, inputs, is_in_tuple, name, "input",
                    "the input to the user-provided function is")
    scalar = _Scalar(func, f"autograd.functional.{name}", with_raw=True)
    plain = _Scalar(func, f"autograd.functional.{name}")
    call = f"autograd.functional.{name}(func, inputs)"

    def compute(*xs):
        argnums = tuple(range(len(xs)))

        def gradient(*ys):
            g, (_, raw) = grad_and_value(scalar, argnums=argnums, has_aux=True)(*ys)
            return g, raw

        if strict:
            deps2 = _second_order(name, plain, xs, call)
            if not forward:
                for k in range(len(xs)):
                    if not any(k in d for d in deps2):
                        raise _independent_input(name, k, "the gradient of the "
                                                 "user-provided function")
        if forward:
            _, res, raw = _fx_jvp(gradient, xs, vv, has_aux=True)
        else:
            _, pull, raw = _fx_vjp(gradient, *xs, has_aux=True)
            res = pull(vv)
        return raw, tuple(res)

    if strict and create_graph:
        (out, res), (_, dep) = probe(compute, inputs, call)
        _check_derived(name, [(f"with respect to input {k}", d) for k, d in enumerate(dep)],
                       f"the {name}")
    else:
        out, res = compute(*inputs)
    out, res = _finish((out, res), create_graph)
    return out, tuple_postprocess(res, is_in_tuple)


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """Vector-Hessian product `v^T H` of a scalar function (torch's
    `autograd.functional.vhp`), by reverse over reverse mode.

    Args:
      func (Callable): a function of arrays returning one array with one
        element.
      inputs (jax.Array | tuple): an array or a tuple of arrays.
      v (jax.Array | tuple | None): the vector, with the structure and shapes of
        `inputs`; may be None when the input is a single array with one element.
      create_graph (bool): as for `vjp`.
      strict (bool): as for `vjp`; it also raises when the gradient for an
        input is a constant.

    Returns:
      tuple: `(func_output, vhp)`: vhp has the structure of `inputs`.

    Example:
      >>> value, vh = functional.vhp(lambda x: (x ** 3).sum(), x, v)   # 6 x v
    """
    return _hessian_product("vhp", func, inputs, v, create_graph, strict, forward=False)


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """Hessian-vector product `H v` of a scalar function (torch's
    `autograd.functional.hvp`), by forward over reverse mode (so, unlike in
    torch, it costs about as much as `vhp`).

    Args:
      func (Callable): a function of arrays returning one array with one
        element.
      inputs (jax.Array | tuple): an array or a tuple of arrays.
      v (jax.Array | tuple | None): the vector, with the structure and shapes of
        `inputs`; may be None when the input is a single array with one element.
      create_graph (bool): as for `vjp`.
      strict (bool): as for `vjp`; it also raises when the gradient for an
        input is a constant.

    Returns:
      tuple: `(func_output, hvp)`: hvp has the structure of `inputs`.

    Example:
      >>> value, hv = functional.hvp(lambda x: (x ** 3).sum(), x, v)   # 6 x v
    """
    return _hessian_product("hvp", func, inputs, v, create_graph, strict, forward=True)

