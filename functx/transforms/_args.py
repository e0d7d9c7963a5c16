"""Argument handling shared by the public transforms: validation with
messages that name the call, the argument and the fix (SPEC section 5)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from ..core import Aval, Tracer, aval_of, is_inexact_dtype, is_key_dtype
from ..errors import FunctxTypeError, FunctxValueError


def fn_name(func):
    return getattr(func, "__name__", None) or type(func).__name__


def check_callable(func, transform):
    if not callable(func):
        raise FunctxTypeError(
            f"{transform}(func): expected a callable as `func`, got "
            f"{type(func).__name__}. Pass the function itself, e.g. "
            f"{transform}(f), not {transform}(f(x))."
        )


def normalize_argnums(argnums, nargs, call):
    """argnums -> (tuple of non-negative ints, whether it was a single int)."""
    single = isinstance(argnums, (int, np.integer)) and not isinstance(argnums, bool)
    if single:
        nums = (int(argnums),)
    elif isinstance(argnums, (tuple, list)) and argnums and all(
        isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in argnums
    ):
        nums = tuple(int(a) for a in argnums)
    else:
        raise FunctxTypeError(
            f"{call}: `argnums` must be an int or a non-empty tuple of ints, got "
            f"{argnums!r}. For example argnums=0 or argnums=(0, 1)."
        )
    out = []
    for a in nums:
        if not -nargs <= a < nargs:
            raise FunctxValueError(
                f"{call}: argnums={argnums!r} is out of range: the function got "
                f"{nargs} positional argument{'s' if nargs != 1 else ''}. Use "
                f"indices in [{-nargs}, {nargs}) or pass more positional arguments."
            )
        out.append(a % nargs)
    if len(set(out)) != len(out):
        raise FunctxValueError(f"{call}: argnums={argnums!r} names an argument twice.")
    return tuple(out), single


def as_array(x, call, what):
    """Convert a leaf to a value transforms can box (tracers pass through)."""
    if isinstance(x, (Tracer, jax.Array)):
        return x
    if isinstance(x, (np.ndarray, np.generic, int, float, complex, bool)):
        return jnp.asarray(x)
    raise FunctxTypeError(
        f"{call}: {what} is a {type(x).__name__}, not an array. Pass JAX arrays "
        "(or NumPy arrays / Python numbers), or move non-array values into a closure."
    )


_ARRAYS = (Tracer, jax.Array, np.ndarray, np.generic)


def differentiable_leaves(args, call, names):
    """Flatten the differentiated arguments `args` (a tuple; `names[i]` names
    args[i] in messages) and decide, leaf by leaf, what is differentiated.

    Arrays (and Python floats) are differentiated and must be floating point
    (TypeError otherwise, SPEC section 5). Other leaves nested in a pytree
    (Python ints and bools, functions, strings: an Equinox module's
    configuration) are passed through unchanged and get None as their
    derivative. An argument that is itself a non-float value is an error.

    Returns (leaves, treedef, mask): the leaves (differentiated ones as
    arrays) and a bool per leaf, True where it is differentiated.
    """
    leaves, mask = [], []
    for arg, name in zip(args, names):
        with_paths, _ = tree_util.tree_flatten_with_path(arg)
        whole = len(with_paths) == 1 and not with_paths[0][0]
        for path, x in with_paths:
            where = name + tree_util.keystr(path)
            if isinstance(x, _ARRAYS) or type(x) in (float, complex) or whole:
                x = as_array(x, call, where)
                a = aval_of(x)
                # (a key's extended dtype is no NumPy dtype: NOTE [key dtypes])
                if not is_inexact_dtype(a.dtype):
                    raise FunctxTypeError(
                        f"{call}: {where} has dtype {a.dtype.name}; only floating-point "
                        "inputs can be differentiated. Convert it with .astype(float), or "
                        "leave it out of argnums (close over it instead)."
                    )
                leaves.append(x)
                mask.append(True)
            else:
                leaves.append(x)
                mask.append(False)
    treedef = tree_util.tree_structure(tuple(args))
    return leaves, treedef, mask


def split_aux(out, call):
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise FunctxValueError(
            f"{call}: with has_aux=True the function must return a pair "
            f"(output, aux), got {type(out).__name__}"
            + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
            + ". Return `output, aux` or set has_aux=False."
        )
    return out[0], out[1]


def flatten_outputs(out, call):
    leaves, tree = tree_util.tree_flatten(out)
    return [as_array(x, call, "an output") for x in leaves], tree


def describe_tree(tree):
    return str(tree).replace("PyTreeDef", "")


def zeros_for(aval):
    if is_key_dtype(aval.dtype):  # a key's tangent is float0 (NOTE [key dtypes])
        return np.zeros(aval.shape, jax.dtypes.float0)
    return jnp.zeros(aval.shape, aval.dtype)


def check_same_structure(expected_tree, got_tree, call, what, hint):
    if expected_tree != got_tree:
        raise FunctxValueError(
            f"{call}: {what} must have the structure {describe_tree(expected_tree)}, "
            f"got {describe_tree(got_tree)}. {hint}"
        )


def check_same_avals(expected, got, call, what, check_dtype=True):
    for i, (e, g) in enumerate(zip(expected, got)):
        ea = e if isinstance(e, Aval) else aval_of(e)
        ga = aval_of(g)
        if ea.shape != ga.shape:
            raise FunctxValueError(
                f"{call}: {what} {i} has shape {ga.shape}, but the matching value has "
                f"shape {ea.shape}. Each {what} must match its value's shape."
            )
        if check_dtype and ea.dtype != ga.dtype:
            raise FunctxValueError(
                f"{call}: {what} {i} has dtype {ga.dtype.name}, but the matching value "
                f"has dtype {ea.dtype.name}. Cast it with .astype({ea.dtype.name})."
            )
