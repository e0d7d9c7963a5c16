"""The functions vjp and linearize return: callables that are pytrees.

NOTE [linear functions are pytrees]
`vjp`'s `vjp_fn` and `linearize`'s `jvp_fn` evaluate a linear map recorded
by reverse mode (a `LinearMap`: a graph whose constants are the residuals).
As JAX's are (`jax.tree_util.Partial`), they are pytrees: the arrays among
the graph's constants are the leaves; the graph's structure, its Python
scalar constants and the trees and avals of inputs and outputs are static
(the treedef's aux data, compared by identity, like Partial's function). So
they can be returned from `jax.jit` (or `functx.jit`), passed into it, and
mapped over with `jax.tree_util`; JAX rebuilds them from new leaves (under
jit: its tracers inside, its results outside).

A function rebuilt from leaves checks, once, on its first call, that every
leaf still has the shape and dtype the graph was recorded with: a function
that left a vmap (whose leaves came back batched) or was mapped over with a
shape-changing function would otherwise evaluate its graph on values it was
not built for. The treedef keeps no leaf value: the graph it holds has
empty constants in the leaves' places, so a cached treedef (jax.jit keeps
its output's) does not keep residuals or tracers alive.
"""

import jax
import numpy as np

from ..core import Tracer, aval_of
from ..errors import FunctxError, FunctxValueError
from ..interpreters.reverse import LinearMap
from ..interpreters.staging import Const, Eqn, Graph

_LEAF_TYPES = (Tracer, jax.Array, jax.core.Tracer, np.ndarray, np.generic)


class _Skeleton:
    """The static part of a linear function: its class's spec and the graph
    with the leaves' constants emptied, and where those constants sit."""

    __slots__ = ("avals", "graph", "prepare", "slots", "spec", "zero_avals")

    def __init__(self, linear, spec):
        graph = linear.graph
        slots = []
        for i, eqn in enumerate(graph.eqns):
            for j, x in enumerate(eqn.inputs):
                if type(x) is Const and isinstance(x.value, _LEAF_TYPES):
                    slots.append((i, j))
        for j, x in enumerate(graph.outputs):
            if type(x) is Const and isinstance(x.value, _LEAF_TYPES):
                slots.append((None, j))
        self.spec = spec
        self.slots = slots
        self.avals = [_const_at(graph, s).aval for s in slots]
        self.zero_avals = linear.zero_avals
        self.prepare = linear.prepare
        self.graph = _replace(graph, slots, [None] * len(slots), self.avals)

    def values(self, graph):
        return [_const_at(graph, s).value for s in self.slots]

    def linear(self, leaves):
        return LinearMap(_replace(self.graph, self.slots, leaves, self.avals),
                         self.zero_avals, self.prepare)


def _const_at(graph, slot):
    i, j = slot
    return graph.outputs[j] if i is None else graph.eqns[i].inputs[j]


def _replace(graph, slots, values, avals):
    """`graph` with the constants at `slots` holding `values` (the equations
    that change are copied; the graph is not modified)."""
    eqns = list(graph.eqns)
    outputs = list(graph.outputs)
    copied = set()
    for (i, j), v, a in zip(slots, values, avals, strict=True):
        if i is None:
            outputs[j] = Const(v, a)
            continue
        if i not in copied:
            e = eqns[i]
            eqns[i] = Eqn(e.prim, list(e.inputs), e.outputs, e.params)
            copied.add(i)
        eqns[i].inputs[j] = Const(v, a)
    return Graph(graph.inputs, eqns, outputs)


class LinearFunction:
    """Base of `VJPFunction` and `LinearizedFunction`: a `LinearMap` and a
    static spec, as a pytree (NOTE [linear functions are pytrees]).
    Subclasses are registered with `jax.tree_util` and define `__call__`."""

    __slots__ = ("_linear", "_skeleton", "_spec", "_unchecked")
    _name = "linear function"

    def __init__(self, linear, spec):
        self._linear = linear
        self._spec = spec
        self._skeleton = None
        self._unchecked = False

    def tree_flatten(self):
        sk = self._skeleton
        if sk is None:
            sk = self._skeleton = _Skeleton(self._linear, self._spec)
        return sk.values(self._linear.graph), sk

    @classmethod
    def tree_unflatten(cls, skeleton, leaves):
        new = object.__new__(cls)
        new._linear = skeleton.linear(list(leaves))
        new._spec = skeleton.spec
        new._skeleton = skeleton
        new._unchecked = True
        return new

    def _check_leaves(self, call):
        """After a rebuild from leaves: each still fits the recorded graph."""
        sk = self._skeleton
        for k, (v, a) in enumerate(zip(sk.values(self._linear.graph), sk.avals)):
            try:
                b = aval_of(v)
                got = b.str_short()
                ok = b.shape == a.shape and b.dtype == a.dtype
            except FunctxError:
                got, ok = f"a {type(v).__name__}", False
            if not ok:
                raise FunctxValueError(
                    f"{call}: this {self._name} was rebuilt from its pytree leaves (by "
                    f"jax.tree_util, or as an output of a transform), and leaf {k} is now "
                    f"{got} where its linear map was recorded with {a.str_short()}. Rebuild "
                    "it only from leaves of the same shapes and dtypes; a function returned "
                    "by vmap has batched leaves: call it inside the vmapped function instead."
                )
        self._unchecked = False

    def __repr__(self):
        return f"<functx {self._name}>"
