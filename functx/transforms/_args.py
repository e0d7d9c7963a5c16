"""Argument handling shared by the public transforms: validation with
messages that name the call, the argument and the fix (SPEC section 5)."""

import jax
import numpy as np
from jax import tree_util

from ..core import (
    Aval,
    Tracer,
    aval_of,
    host_to_jax,
    is_complex_dtype,
    is_inexact_dtype,
    is_key_dtype,
    jax_zeros,
)
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
        twice = sorted({a for a in out if out.count(a) > 1})
        raise FunctxValueError(
            f"{call}: argnums={argnums!r} names argument{'s' if len(twice) > 1 else ''} "
            f"{', '.join(map(str, twice))} twice (negative indices count from the end). "
            f"List each argument once, e.g. argnums={tuple(sorted(set(out)))!r}."
        )
    return tuple(out), single


def as_array(x, call, what):
    """Convert a leaf to a value transforms can box (tracers pass through)."""
    if isinstance(x, (Tracer, jax.Array)):
        return x
    if isinstance(x, (np.ndarray, np.generic, int, float, complex, bool)):
        # strings, bytes, objects, dates (bfloat16 and the other ml_dtypes are kind "V")
        if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "OSUMm":
            raise FunctxTypeError(
                f"{call}: {what} is a NumPy array of dtype {x.dtype}, which JAX has no "
                "arrays of. Pass numbers (bool, int, float or complex arrays), or move "
                "other values into a closure."
            )
        return host_to_jax(x)
    raise FunctxTypeError(
        f"{call}: {what} is a {type(x).__name__}, not an array. Pass JAX arrays "
        "(or NumPy arrays / Python numbers), or move non-array values into a closure."
    )


_ARRAYS = (Tracer, jax.Array, np.ndarray, np.generic)


def differentiable_leaves(args, call, names, allow_int=None, holomorphic=False):
    """Flatten the differentiated arguments `args` (a tuple; `names[i]` names
    args[i] in messages) and decide, leaf by leaf, what is differentiated.

    Arrays (and Python floats) are differentiated and must be floating point
    (TypeError otherwise, SPEC section 5); with `holomorphic`, complex (as
    JAX's holomorphic=True). Other leaves nested in a pytree (Python ints and
    bools, functions, strings: an Equinox module's configuration) are passed
    through unchanged and get None as their derivative. An argument that is
    itself a non-float value is an error, unless `allow_int`: then integer,
    bool and key arrays (and such a whole argument) are passed through and
    get float0 zeros as derivative, as in JAX. (`allow_int=None`: the
    transform has no such option, and its messages do not offer it.)

    Returns (leaves, treedef, mask, ints): the leaves (differentiated ones as
    arrays), a bool per leaf, True where it is differentiated, and a bool per
    leaf, True for an integer leaf let through by `allow_int`.
    """
    leaves, mask, ints = [], [], []
    for arg, name in zip(args, names):
        with_paths, _ = tree_util.tree_flatten_with_path(arg)
        whole = len(with_paths) == 1 and not with_paths[0][0]
        for path, x in with_paths:
            where = name + tree_util.keystr(path)
            if isinstance(x, _ARRAYS) or type(x) in (float, complex) or whole:
                x = as_array(x, call, where)
                a = aval_of(x)
                if holomorphic and not is_complex_dtype(a.dtype):
                    raise FunctxTypeError(
                        f"{call}: with holomorphic=True every differentiated input must be "
                        f"complex, but {where} has dtype {a.dtype.name}. Convert it with "
                        ".astype(complex), or drop holomorphic=True for real inputs."
                    )
                # (a key's extended dtype is no NumPy dtype: NOTE [key dtypes])
                if not is_inexact_dtype(a.dtype):
                    if allow_int:
                        leaves.append(x)
                        mask.append(False)
                        ints.append(True)
                        continue
                    raise FunctxTypeError(
                        f"{call}: {where} has dtype {a.dtype.name}; only floating-point "
                        "inputs can be differentiated. Convert it with .astype(float), or "
                        "leave it out of argnums (close over it instead)."
                        + (" To get a float0 (zero) derivative for it, as JAX does, pass "
                           "allow_int=True." if allow_int is False else "")
                    )
                leaves.append(x)
                mask.append(True)
            else:
                leaves.append(x)
                mask.append(False)
            ints.append(False)
    treedef = tree_util.tree_structure(tuple(args))
    return leaves, treedef, mask, ints


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


# NOTE [weak types of results]
# Results carry JAX's weak-type flag where JAX's transforms give one, so code
# that relies on weak-type promotion (the gradient at a Python scalar, added
# to a float16 array, stays float16) behaves as under JAX: materialised zeros
# are weak where their value is (zeros_for); grad seeds the backward pass
# with a one as weak as the output (jax.grad's `full_like(out, 1)`); jacrev
# gives each block the weak type of its input leaf and jacfwd that of its
# output leaf (JAX casts the blocks to those leaves). In between, the
# primitives' rules propagate the flag.


def zeros_for(aval):
    """Zeros of `aval`, weakly typed where it is (as JAX's zeros are)."""
    if is_key_dtype(aval.dtype):  # a key's tangent is float0 (NOTE [key dtypes])
        return np.zeros(aval.shape, jax.dtypes.float0)
    return match_weak(jax_zeros(aval.shape, aval.dtype), aval.weak_type)


def float0_zeros(aval):
    """The derivative JAX gives an integer, bool or key input: float0 zeros."""
    return np.zeros(aval.shape, jax.dtypes.float0)


def match_weak(x, weak_type):
    """`x` with JAX's weak-type flag set to `weak_type` (NOTE [weak types of
    results])."""
    a = aval_of(x)
    if a.weak_type == bool(weak_type) or not isinstance(a.dtype, np.dtype) or (
            a.dtype == jax.dtypes.float0):
        return x
    from ..primitives.elementwise import convert_element_type

    return convert_element_type(x, a.dtype, weak_type=bool(weak_type))


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
