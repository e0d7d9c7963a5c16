"""Forward-mode transforms: jvp and linearize."""

from jax import tree_util

from ..core import Zero, aval_of, new_interpreter
from ..errors import FunctxTypeError
from ..interpreters.jvp import JVPInterpreter, JVPTracer
from . import _args
from ._linear_fn import LinearFunction
from .grad import linearize_reverse


def _check_tuple(x, call, name):
    if not isinstance(x, (tuple, list)):
        raise FunctxTypeError(
            f"{call}: expected `{name}` to be a tuple with one entry per positional "
            f"argument, got {type(x).__name__}. Write ({name[:-1]},) for a single one."
        )
    return tuple(x)


def jvp_flat(func, primals, tangents, has_aux, call):
    """Run `func(*primals)` pushing `tangents` forward. Returns (flat outputs,
    flat output tangents with zeros materialised, output tree, aux). Static
    (non-array) leaves of the primals are passed through; their tangents are
    ignored."""
    names = [f"primal {i}" for i in range(len(primals))]
    p_flat, p_tree, mask, _ = _args.differentiable_leaves(primals, call, names)
    t_flat, t_tree = tree_util.tree_flatten(tangents)
    _args.check_same_structure(
        p_tree, t_tree, call, "tangents",
        "Pass one tangent per primal, in the primals' structure.",
    )
    p_diff = [p for p, m in zip(p_flat, mask) if m]
    t_diff = [_args.as_array(t, call, "a tangent") for t, m in zip(t_flat, mask) if m]
    _args.check_same_avals(p_diff, t_diff, call, "tangent")
    interp = JVPInterpreter(call.split("(")[0])
    with new_interpreter(interp):
        it = iter(t_diff)
        boxed = [JVPTracer(interp, p, next(it)) if m else p for p, m in zip(p_flat, mask)]
        out = func(*tree_util.tree_unflatten(p_tree, boxed))
        aux = None
        if has_aux:
            out, aux = _args.split_aux(out, call)
        out_flat, out_tree = _args.flatten_outputs(out, call)
        pairs = [interp.unbox(o) for o in out_flat]
        if has_aux:
            aux = tree_util.tree_map(lambda x: interp.unbox(x)[0], aux)
    outs = [p for p, _ in pairs]
    tans = [_args.zeros_for(aval_of(p)) if type(t) is Zero else t for p, t in pairs]
    return outs, tans, out_tree, aux


def jvp(func, primals, tangents, *, strict=False, has_aux=False):
    """Jacobian-vector product (forward-mode AD).

    Args:
      func (Callable): a function of arrays (pytrees allowed).
      primals (tuple): a tuple with one value per positional argument of `func`.
      tangents (tuple): a tuple with the structure, shapes and dtypes of
        `primals`.
      strict (bool): accepted for torch.func compatibility (no effect).
      has_aux (bool): `func` returns `(output, aux)`.

    Returns:
      tuple: `(output, jvp_out)` or `(output, jvp_out, aux)`; `jvp_out` has the
      structure of `output`.

    Example:
      >>> out, tangent = functx.jvp(f, (x,), (v,))
      >>> hvp = functx.jvp(functx.grad(f), (x,), (v,))[1]   # forward-over-reverse
    """
    _args.check_callable(func, "jvp")
    call = f"jvp({_args.fn_name(func)}, primals, tangents)"
    primals = _check_tuple(primals, call, "primals")
    tangents = _check_tuple(tangents, call, "tangents")
    outs, tans, out_tree, aux = jvp_flat(func, primals, tangents, has_aux, call)
    output = tree_util.tree_unflatten(out_tree, outs)
    tangent_out = tree_util.tree_unflatten(out_tree, tans)
    if has_aux:
        return output, tangent_out, aux
    return output, tangent_out


class _LinearizeSpec:
    __slots__ = ("in_avals", "in_tree", "mask", "out_avals", "out_tree")

    def __init__(self, r):
        for name in self.__slots__:
            setattr(self, name, getattr(r, name))


@tree_util.register_pytree_node_class
class LinearizedFunction(LinearFunction):
    """The `jvp_fn` of `functx.linearize`: `jvp_fn(*tangents)` pushes
    tangents of the primals forward without re-running the function.
    Callable many times; a pytree whose leaves are its residuals (NOTE
    [linear functions are pytrees]), so it can be returned from `jax.jit`."""

    __slots__ = ()
    _name = "jvp_fn"

    def __call__(self, *tangents):
        call = "linearize(...) jvp_fn(*tangents)"
        if self._unchecked:
            self._check_leaves(call)
        spec = self._spec
        flat, tree = tree_util.tree_flatten(tangents)
        _args.check_same_structure(
            spec.in_tree, tree, call, "tangents",
            "Pass one tangent per primal given to linearize.",
        )
        flat = [_args.as_array(t, call, "a tangent") for t, m in zip(flat, spec.mask) if m]
        _args.check_same_avals(spec.in_avals, flat, call, "tangent")
        outs = self._linear.forward(flat)
        outs = [_args.zeros_for(a) if type(t) is Zero else t for t, a in zip(outs, spec.out_avals)]
        return tree_util.tree_unflatten(spec.out_tree, outs)


def linearize(func, *primals, has_aux=False):
    """Run `func` once and return its linear approximation at `primals`.

    Args:
      func (Callable): a function of arrays (pytrees allowed).
      *primals (Any): the inputs at which to linearize.
      has_aux (bool): `func` returns `(output, aux)`; aux is returned untouched
        (as JAX's linearize).

    Returns:
      tuple: `(output, jvp_fn)`, or `(output, jvp_fn, aux)` with `has_aux`;
      `jvp_fn(*tangents)` gives the same result as `jvp(func, primals,
      tangents)[1]` without re-running `func` (the linear part was recorded
      once). `jvp_fn` is a pytree whose leaves are the residuals it holds (as
      JAX's), so it can be returned from `jax.jit` or `functx.jit`.

    Example:
      >>> out, jvp_fn = functx.linearize(f, x)
      >>> columns = functx.vmap(jvp_fn)(basis)
    """
    _args.check_callable(func, "linearize")
    call = f"linearize({_args.fn_name(func)}, *primals)"
    r = linearize_reverse(func, primals, has_aux, call)
    output = tree_util.tree_unflatten(r.out_tree, r.out)
    jvp_fn = LinearizedFunction(r.linear, _LinearizeSpec(r))
    if has_aux:
        return output, jvp_fn, r.aux
    return output, jvp_fn
