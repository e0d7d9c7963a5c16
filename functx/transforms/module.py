"""Equinox modules as functions of their parameters: `functional_call`,
`stack_module_state`, `named_parameters`, `named_buffers`.

An Equinox module is a pytree: its arrays are leaves, its configuration
(activation functions, sizes) non-array leaves. A leaf is named by its path
with dots, as torch names parameters: `layers.0.weight`. *Parameters* are
the floating-point arrays; *buffers* are the other arrays (integer or
boolean arrays, and what an `eqx.nn.State` holds is passed separately, as
Equinox does).
"""

import jax
import numpy as np
from jax import tree_util

from ..core import Tracer, is_inexact_dtype
from ..errors import FunctxTypeError, FunctxValueError
from ..lifting import call_lifted

_ARRAYS = (Tracer, jax.Array, np.ndarray)


def _key_name(entry):
    for attr in ("name", "key", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def path_name(path):
    """A pytree path as a dotted name: `layers.0.weight`."""
    return ".".join(_key_name(e) for e in path)


def _is_param(x):
    # (keys have an extended dtype, no NumPy one: NOTE [key dtypes] in core.py)
    return (isinstance(x, _ARRAYS) and isinstance(x.dtype, np.dtype)
            and is_inexact_dtype(x.dtype))


def _named(module, keep):
    with_paths, _ = tree_util.tree_flatten_with_path(module)
    out = {}
    for path, leaf in with_paths:
        if isinstance(leaf, _ARRAYS) and keep(leaf):
            out[path_name(path)] = leaf
    return out


def named_parameters(module):
    """The module's floating-point arrays, by dotted path (a dict; the same
    leaf reachable twice appears under its first path only when it is one
    pytree leaf, as with `eqx.nn.Shared`)."""
    return _named(module, _is_param)


def named_buffers(module):
    """The module's arrays that are not floating point (counters, indices,
    masks), by dotted path."""
    return _named(module, lambda x: not _is_param(x))


def _merge(params_and_buffers, call):
    if isinstance(params_and_buffers, dict):
        return dict(params_and_buffers)
    if isinstance(params_and_buffers, (tuple, list)) and all(
            isinstance(d, dict) for d in params_and_buffers):
        merged = {}
        for d in params_and_buffers:
            twice = sorted(set(merged) & set(d))
            if twice:
                raise FunctxValueError(
                    f"{call}: the dicts in `params_and_buffers` must have distinct keys, "
                    f"but {twice} appear in more than one. Merge them into one dict."
                )
            merged.update(d)
        return merged
    raise FunctxTypeError(
        f"{call}: `params_and_buffers` must be a dict keyed by dotted path "
        f"(e.g. 'layers.0.weight') or a tuple of such dicts, got "
        f"{type(params_and_buffers).__name__}."
    )


def _close_names(name, names):
    import difflib

    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def replace_leaves(module, values, *, tie_weights=True, strict=False, call="functional_call"):
    """A copy of `module` with the leaves named in `values` replaced."""
    with_paths, treedef = tree_util.tree_flatten_with_path(module)
    names = [path_name(p) for p, _ in with_paths]
    leaves = [leaf for _, leaf in with_paths]
    index = {n: i for i, n in enumerate(names)}
    array_names = [n for n, leaf in zip(names, leaves) if isinstance(leaf, _ARRAYS)]
    unexpected = [k for k in values if k not in index]
    if unexpected:
        hints = "".join(f"\n  '{k}'{_close_names(k, array_names)}" for k in sorted(unexpected))
        raise FunctxValueError(
            f"{call}: `params_and_buffers` names leaves the module does not have:{hints}\n"
            f"The module's array leaves are: {array_names}."
        )
    if strict:
        missing = [n for n in array_names if n not in values]
        if missing:
            raise FunctxValueError(
                f"{call}: strict=True, but `params_and_buffers` has no value for "
                f"{missing}. Pass every parameter and buffer, or use strict=False to "
                "keep the module's own values for the ones not given."
            )
    new = list(leaves)
    # Leaves that are one and the same array in the module are tied.
    groups = {}
    for n, leaf in zip(names, leaves):
        if isinstance(leaf, _ARRAYS):
            groups.setdefault(id(leaf), []).append(n)
    for name, value in values.items():
        tied = groups.get(id(leaves[index[name]]), [name]) if tie_weights else [name]
        for other in tied:
            if other != name and other in values and values[other] is not value:
                raise FunctxValueError(
                    f"{call}: '{name}' and '{other}' are tied (the same array in the "
                    "module) but got different values. Pass one of them, or "
                    "tie_weights=False to untie them."
                )
            new[index[other]] = value
    return tree_util.tree_unflatten(treedef, new)


def functional_call(module, params_and_buffers, args, kwargs=None, *, tie_weights=True,
                    strict=False):
    """Call an Equinox module with some of its leaves replaced.

    Args:
      module (Callable): an Equinox module (any pytree that is callable).
      params_and_buffers (dict | tuple[dict, ...]): a dict from dotted leaf path
        (`"layers.0.weight"`, see `named_parameters`) to the value to use, or a
        tuple of such dicts with distinct keys. Values may be functx values
        (inside transforms).
      args (tuple | Any): the positional arguments: a tuple, or a single
        argument.
      kwargs (dict | None): keyword arguments for the call.
      tie_weights (bool): leaves that are the same array in `module` stay tied:
        giving a value for one gives it to all of them (different values
        for them are an error). With False only the named leaves change.
      strict (bool): every array leaf must be given a value.

    A name the module does not have is always an error (a misspelt key would
    otherwise be silently ignored). The call runs the module through
    `functx.lift`, so any Equinox layer works under every transform.
    """
    call = f"functional_call({type(module).__name__})"
    if not callable(module):
        raise FunctxTypeError(
            f"{call}: `module` must be callable (an Equinox module), got "
            f"{type(module).__name__}. Pass the module itself as the first argument."
        )
    values = _merge(params_and_buffers, call)
    new = replace_leaves(module, values, tie_weights=tie_weights, strict=strict, call=call)
    if not isinstance(args, tuple):
        args = (args,)
    return call_lifted(new, args, dict(kwargs or {}))


def stack_module_state(models):
    """Stack the parameters and buffers of models of one structure on a new
    leading axis: returns `(params, buffers)`, dicts by dotted path, ready
    for `vmap(lambda p, b, x: functional_call(model, (p, b), (x,)))`."""
    models = list(models)
    if not models:
        raise FunctxValueError(
            "stack_module_state(models): got no models. Pass a non-empty list of models "
            "of one architecture."
        )
    first = tree_util.tree_structure(models[0])
    for i, m in enumerate(models[1:], 1):
        if tree_util.tree_structure(m) != first:
            raise FunctxValueError(
                f"stack_module_state(models): model {i} does not have the structure of "
                "model 0 (different layers, sizes or configuration). Only models of one "
                "architecture can be stacked."
            )
    params = [named_parameters(m) for m in models]
    buffers = [named_buffers(m) for m in models]
    for i, (p, b) in enumerate(zip(params, buffers)):
        for name, leaf in {**p, **b}.items():
            ref = params[0].get(name, buffers[0].get(name))
            if ref is None or leaf.shape != ref.shape or leaf.dtype != ref.dtype:
                raise FunctxValueError(
                    f"stack_module_state(models): leaf '{name}' of model {i} has shape "
                    f"{leaf.shape} and dtype {leaf.dtype}, model 0's has "
                    f"{None if ref is None else (ref.shape, str(ref.dtype))}."
                )
    stack = jax.numpy.stack
    return ({k: stack([p[k] for p in params]) for k in params[0]},
            {k: stack([b[k] for b in buffers]) for k in buffers[0]})
