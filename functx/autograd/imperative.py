"""Imperative autograd (SPEC section 4): torch-style tensors that record the
operations applied to them, and a backward pass over what they recorded.

NOTE [imperative mode]
A `Tensor` holds a JAX array and torch's autograd state (`requires_grad`,
`grad`, `grad_fn`, hooks). It is not a functx transform value: any JAX or
functx.numpy function applied to tensors reaches `apply` below (functx.numpy
sees a `core.ImperativeValue` among the arguments and calls
`lifting.call_lifted`, which hands the call here). `apply` runs the function
on the arrays; when grad mode is on and some tensor argument requires grad,
it runs it under `functx.vjp` with respect to those tensors' arrays (one
eager reverse-mode trace per operation, the same primitive rules as every
transform) and keeps the pullback in a `Node`, the outputs' `grad_fn`.

`backward` / `grad` walk the nodes reachable from the outputs in reverse
topological order (a node runs once every node that feeds it a gradient has
run), sum the gradients each tensor receives, run the tensor hooks on that
sum, keep it where torch keeps it (`.grad` of leaves, of tensors that
`retain_grad()`, or the result of `autograd.grad`) and call the node's
pullback. With `create_graph=True` a node's backward is itself applied as an
operation on tensors (a function of the node's inputs and the output
gradients that re-runs the forward under `functx.vjp`), so the gradients
carry a graph and can be differentiated again. Without `retain_graph` the
pullbacks are dropped after the pass, and a second pass through them
raises, as in torch.
"""

import itertools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from .. import core as _core
from .._array_api import _method_caller, _property_caller, attach_operators
from ..errors import FunctxRuntimeError, FunctxTypeError
from ..core import ImperativeValue, is_inexact_dtype
from ..lifting import call_lifted
from ..transforms.grad import vjp as _vjp
from .grad_mode import is_grad_enabled, set_grad_enabled

_float0 = jax.dtypes.float0


def _is_float(dtype):
    return is_inexact_dtype(dtype)


class RemovableHandle:
    """Returned by the `register_*hook` methods: `.remove()` unregisters."""

    _ids = itertools.count()

    def __init__(self, hooks):
        self._hooks = weakref.ref(hooks)
        self.id = next(self._ids)

    def remove(self):
        hooks = self._hooks()
        if hooks is not None:
            hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class _Hooks(dict):
    """An ordered id -> hook map (a dict subclass, so handles can hold a
    weak reference to it)."""

    def add(self, fn):
        handle = RemovableHandle(self)
        self[handle.id] = fn
        return handle


def _camel(name):
    return "".join(part[:1].upper() + part[1:] for part in name.replace(".", "_").split("_"))


class _GraphNode:
    """What the nodes of the backward graph share: hooks and metadata."""

    def __init__(self):
        self._pre_hooks = _Hooks()
        self._hooks = _Hooks()
        self.metadata = {}

    def register_hook(self, hook):
        """`hook(grad_inputs, grad_outputs)` runs after this node computed the
        gradients of its inputs; it may return replacements (a tuple)."""
        return self._hooks.add(hook)

    def register_prehook(self, hook):
        """`hook(grad_outputs)` runs before this node; it may return
        replacement output gradients (a tuple)."""
        return self._pre_hooks.add(hook)


class Node(_GraphNode):
    """The `grad_fn` of tensors computed from tensors that require grad: one
    recorded operation (torch's autograd Node). `_wrap_outputs` fills in
    its outputs."""

    def __init__(self, name, pullback, inputs, edges, recompute):
        super().__init__()
        self._name = name
        self._pullback = pullback
        self._inputs = inputs  # the tensor arguments that require grad, in order
        self._edges = edges  # per tensor argument: its index in _inputs, or None
        self._outputs = []  # per output leaf: a weak reference to its tensor (None: no graph)
        self._out_avals = []  # per output leaf: its shape and dtype (None: not an array)
        self._out_tree = None
        self._recompute = recompute  # (function of input arrays, for create_graph)
        self._versions = [t._version for t in inputs]  # checked before backward

    def name(self):
        """The operation's name, e.g. "SinBackward0" (after the function)."""
        return self._name

    def __repr__(self):
        return f"<{self._name}>"

    @property
    def next_functions(self):
        """Per tensor argument of the operation: `(node, index)`, where node
        is the argument's grad_fn (an `AccumulateGrad` for a leaf) or None
        when it does not require grad."""
        out = []
        for k in self._edges:
            if k is None:
                out.append((None, 0))
            else:
                t = self._inputs[k]
                out.append((_node_of(t), t._output_nr))
        return tuple(out)


class AccumulateGrad(_GraphNode):
    """The grad_fn-like node of a leaf tensor that requires grad: the end of
    the backward pass, where the gradient is added to `.grad`."""

    def __init__(self, variable):
        super().__init__()
        self.variable = variable

    def name(self):
        return "torch::autograd::AccumulateGrad"

    def __repr__(self):
        return "<AccumulateGrad>"

    next_functions = ()


def _node_of(t):
    if t.grad_fn is not None:
        return t.grad_fn
    if t._accumulator is None:
        t._accumulator = AccumulateGrad(t)
    return t._accumulator


class Tensor(ImperativeValue):
    """A JAX array with torch's autograd state (NOTE [imperative mode]).

    Args:
      data (jax.Array | int | float | complex | list): an array, a number or
        nested lists (converted with jnp.asarray).
      requires_grad (bool): record the operations applied to it, so that
        `backward()` / `autograd.grad` can differentiate with respect to it
        (floating-point tensors only).

    Any functx.numpy / functx.nn / functx.lax function and any JAX function
    through `functx.lift` accepts tensors; operators, indexing and the
    methods and properties of jax.Array (`t.sum()`, `t.T`, ...) work on them
    and return tensors.

    Example:
      >>> x = functx.autograd.Tensor(jnp.arange(3.0), requires_grad=True)
      >>> y = (fnp.sin(x) * x).sum()
      >>> y.backward()
      >>> x.grad          # cos(x) * x + sin(x)
    """

    __array_priority__ = 1000
    __array_ufunc__ = None  # NumPy defers to the reflected operators
    __hash__ = object.__hash__

    @staticmethod
    def apply(fn, args, kwargs):
        return apply(fn, args, kwargs)

    def __init__(self, data, requires_grad=False):
        if isinstance(data, Tensor):
            data = data._value
        if isinstance(data, _core.Tracer):
            raise FunctxTypeError(
                "autograd.Tensor(data): data is a value traced by a functx transform; "
                "tensors hold concrete arrays. Create the tensor outside the transform, "
                "or use the transform's own arguments."
            )
        self._init(jnp.asarray(data), None, 0)
        if requires_grad:
            self.requires_grad = True

    def _init(self, value, grad_fn, output_nr):
        self._value = value
        self._requires_grad = False
        self.grad = None
        self.grad_fn = grad_fn
        self._output_nr = output_nr
        self._hooks = _Hooks()
        self._retains_grad = False
        self._accumulator = None
        self._version = 0  # bumped by in-place operations

    @classmethod
    def _result(cls, value, grad_fn=None, output_nr=0):
        """A tensor computed by functx (no argument checks)."""
        t = cls.__new__(cls)
        t._init(value, grad_fn, output_nr)
        return t

    # -- autograd state ---------------------------------------------------

    @property
    def requires_grad(self):
        return self._requires_grad or self.grad_fn is not None

    @requires_grad.setter
    def requires_grad(self, flag):
        if self.grad_fn is not None:
            if not flag:
                raise FunctxRuntimeError(
                    f"Tensor.requires_grad = False: this tensor was computed by "
                    f"{self.grad_fn.name()} and is not a leaf; you can only change "
                    "requires_grad flags of leaf tensors. Use t.detach() for a tensor "
                    "without a graph."
                )
            return
        if flag and not _is_float(self._value.dtype):
            raise FunctxRuntimeError(
                f"Tensor.requires_grad = True: only floating point and complex tensors "
                f"can require gradients, this one is {self._value.dtype}. Convert it "
                "first, e.g. Tensor(data.astype(jnp.float32), requires_grad=True)."
            )
        self._requires_grad = bool(flag)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def retains_grad(self):
        return self._retains_grad

    @property
    def output_nr(self):
        return self._output_nr

    def retain_grad(self):
        """Keep this non-leaf tensor's gradient in `.grad` during backward
        (accumulated over calls, as for leaves). No effect on leaves."""
        if not self.requires_grad:
            raise FunctxRuntimeError(
                "Tensor.retain_grad(): this tensor does not require grad, so it gets "
                "no gradient to retain. Compute it from tensors with requires_grad=True."
            )
        if self.grad_fn is not None:
            self._retains_grad = True

    def register_hook(self, hook):
        """`hook(grad)` runs on this tensor's whole gradient when it is
        computed; it may return a replacement. Returns a handle with
        `.remove()`."""
        if not self.requires_grad:
            raise FunctxRuntimeError(
                "Tensor.register_hook(hook): this tensor does not require grad, so "
                "no gradient will reach the hook. Set requires_grad=True first."
            )
        return self._hooks.add(hook)

    def detach(self):
        """The same array as a new leaf tensor that does not require grad."""
        return Tensor._result(self._value)

    # -- in-place updates (torch-style optimizer steps) --------------------

    def _inplace(self, name, fn, *operands):
        others = [o for o in operands if isinstance(o, Tensor)]
        if is_grad_enabled() and (self.requires_grad or any(o.requires_grad for o in others)):
            if self.is_leaf and self.requires_grad:
                raise FunctxRuntimeError(
                    f"Tensor.{name}: a leaf tensor that requires grad is being used in an "
                    "in-place operation. Update parameters inside `with functx.no_grad():`, "
                    "as in torch."
                )
            raise FunctxRuntimeError(
                f"Tensor.{name}: in-place operations are not recorded for backward. Use "
                "the out-of-place form (t = t + x), or run the update under "
                "functx.no_grad()."
            )
        value = fn(self._value, *[o._value if isinstance(o, Tensor) else o for o in operands])
        value = jnp.asarray(value)
        if value.shape != self._value.shape:
            raise FunctxRuntimeError(
                f"Tensor.{name}: the result has shape {value.shape}, but an in-place "
                f"operation keeps the tensor's shape {self._value.shape}."
            )
        self._value = value.astype(self._value.dtype)
        self._version += 1
        return self

    def __iadd__(self, other):
        return self._inplace("__iadd__", jnp.add, other)

    def __isub__(self, other):
        return self._inplace("__isub__", jnp.subtract, other)

    def __imul__(self, other):
        return self._inplace("__imul__", jnp.multiply, other)

    def __itruediv__(self, other):
        return self._inplace("__itruediv__", jnp.true_divide, other)

    def add_(self, other, *, alpha=1):
        return self._inplace("add_", lambda a, b: a + alpha * b, other)

    def sub_(self, other, *, alpha=1):
        return self._inplace("sub_", lambda a, b: a - alpha * b, other)

    def mul_(self, other):
        return self._inplace("mul_", jnp.multiply, other)

    def div_(self, other):
        return self._inplace("div_", jnp.true_divide, other)

    def zero_(self):
        return self._inplace("zero_", jnp.zeros_like)

    def fill_(self, value):
        return self._inplace("fill_", lambda a, v: jnp.full_like(a, v), value)

    def copy_(self, src):
        def copy(a, b):  # broadcast as torch does; a larger source fails the shape check
            return jnp.broadcast_to(b, a.shape) if np.ndim(b) <= a.ndim else b

        return self._inplace("copy_", copy, src)

    def detach_(self):
        self.grad_fn = None
        self._requires_grad = False
        return self

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate the gradient of this tensor into `.grad` of the leaves
        that require grad (torch.Tensor.backward)."""
        backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    # -- array behaviour --------------------------------------------------

    @property
    def array(self):
        """The JAX array this tensor holds."""
        return self._value

    @property
    def data(self):
        """The array as a tensor outside the graph (torch's `.data`)."""
        return self.detach()

    shape = property(lambda self: self._value.shape)
    dtype = property(lambda self: self._value.dtype)
    ndim = property(lambda self: self._value.ndim)

    def dim(self):
        return self._value.ndim

    def numel(self):
        return self._value.size

    def numpy(self):
        return np.asarray(self._value)

    def item(self):
        return self._value.item()

    def tolist(self):
        return self._value.tolist()

    def __array__(self, dtype=None, copy=None):
        out = np.asarray(self._value)
        return out.astype(dtype) if dtype is not None else out

    def __float__(self):
        return float(self._value)

    def __int__(self):
        return int(self._value)

    def __index__(self):
        return self._value.__index__()

    def __bool__(self):
        return bool(self._value)

    def __len__(self):
        return len(self._value)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index):
        return apply(_getitem, (self, index), {})

    def __getattr__(self, name):
        # jax.Array's other methods and properties, recorded (t.sum(), t.T, ...)
        if name.startswith("_") or not hasattr(jax.Array, name):
            raise AttributeError(f"'Tensor' object has no attribute '{name}'")
        if callable(getattr(jax.Array, name)):
            return lambda *args, **kwargs: apply(_method_caller(name), (self,) + args, kwargs)
        return apply(_property_caller(name), (self,), {})

    def __repr__(self):
        body = np.array2string(np.asarray(self._value), separator=", ", prefix="tensor(")
        extra = ""
        if self.grad_fn is not None:
            extra = f", grad_fn=<{self.grad_fn.name()}>"
        elif self._requires_grad:
            extra = ", requires_grad=True"
        return f"tensor({body}, dtype={self._value.dtype}{extra})"


def _getitem(x, index):
    return x[index]


_getitem.__name__ = "index"


# Operators: functx.numpy's, as for transform values; they reach `apply`
# through lifting.
attach_operators(Tensor)


def tensor(data, requires_grad=False, dtype=None):
    """A new leaf tensor from data (torch.tensor): arrays, numbers or nested
    lists; `dtype` converts."""
    if isinstance(data, Tensor):
        data = data._value
    return Tensor(jnp.asarray(data, dtype=dtype), requires_grad=requires_grad)


# --------------------------------------------------------------------------
# Recording


def apply(fn, args, kwargs, functx_fn=False):
    """`fn(*args, **kwargs)` where tensors may be among the arguments (at any
    depth of a pytree, `fn` included): the result with tensors for arrays,
    recorded when it needs a graph (NOTE [imperative mode]). `fn` is a JAX
    function (run through lifting), or with `functx_fn` a functx one, such
    as an `autograd.Function`'s apply (called as it is)."""
    leaves, treedef = tree_util.tree_flatten((fn, args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
    for leaf in leaves:
        if isinstance(leaf, _core.Tracer):
            raise FunctxTypeError(
                f"{getattr(fn, '__name__', 'a function')}: an autograd.Tensor met a value "
                "traced by a functx transform. Tensors record operations for "
                "backward(); transforms differentiate functions of arrays. Pass "
                "`t.array` (or t.detach()) into the transform instead of the tensor."
            )
    tensors = [leaves[i] for i in positions]
    values = [t._value for t in tensors]

    def run(*vals):
        new = list(leaves)
        for i, v in zip(positions, vals):
            new[i] = v
        f, a, k = tree_util.tree_unflatten(treedef, new)
        return f(*a, **k) if functx_fn else call_lifted(f, a, k)

    diff = [k for k, t in enumerate(tensors) if t.requires_grad]
    if not diff or not is_grad_enabled():
        return _wrap_outputs(run(*values), None)

    def run_diff(*dvals):
        vals = list(values)
        for k, v in zip(diff, dvals):
            vals[k] = v
        return run(*vals)

    out, pullback = _vjp(run_diff, *[values[k] for k in diff])
    edges = [None] * len(tensors)
    for j, k in enumerate(diff):
        edges[k] = j
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, type):  # an autograd.Function's apply: named as torch does
        name = f"{owner.__name__}Backward"
    else:
        name = f"{_camel(getattr(fn, '__name__', 'Function'))}Backward0"
    node = Node(name, pullback, [tensors[k] for k in diff], edges, run_diff)
    return _wrap_outputs(out, node)


def _wrap_outputs(out, node):
    leaves, treedef = tree_util.tree_flatten(out)
    wrapped = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, (jax.Array, np.ndarray)):
            wrapped.append(leaf)
            if node is not None:
                node._outputs.append(None)
                node._out_avals.append(None)
            continue
        value = jnp.asarray(leaf)
        grad_fn = node if node is not None and _is_float(value.dtype) else None
        t = Tensor._result(value, grad_fn, i if grad_fn is not None else 0)
        if node is not None:
            node._outputs.append(weakref.ref(t) if grad_fn is not None else None)
            node._out_avals.append(jax.ShapeDtypeStruct(value.shape, value.dtype))
        wrapped.append(t)
    if node is not None:
        node._out_tree = treedef
    return tree_util.tree_unflatten(treedef, wrapped)


# --------------------------------------------------------------------------
# The backward pass


def _as_tuple(x):
    if x is None:
        return ()
    if isinstance(x, (tuple, list)):
        return tuple(x)
    return (x,)


def _value_of(g):
    return g._value if isinstance(g, Tensor) else jnp.asarray(g)


def _add(a, b, create_graph):
    if a is None:
        return b
    if create_graph:
        return apply(jnp.add, (a, b), {})
    return Tensor._result(a._value + b._value)


def _run_hooks(hooks, grad):
    for hook in list(hooks.values()):
        new = hook(grad)
        if new is not None:
            grad = _tensors([new])[0]
    return grad


def _check_usable(node):
    for t, version in zip(node._inputs, node._versions):
        if t._version != version:
            raise FunctxRuntimeError(
                f"backward: a tensor of shape {t.shape} that {node.name()} used was "
                "modified by an in-place operation after it was used, so its gradient "
                "would be wrong. Update it after backward(), or use the out-of-place "
                "form (t = t + x)."
            )
    if node._pullback is None:
        raise FunctxRuntimeError(
            f"backward: trying to backward through {node.name()} a second time, but "
            "its saved values were freed after the first backward pass. Pass "
            "retain_graph=True to the first backward() / autograd.grad() call if "
            "you need to go through the graph again."
        )


def _graph_order(roots):
    """The nodes reachable from `roots`, each after every node that feeds
    it a gradient (iterative depth-first search; post-order reversed)."""
    order, seen = [], set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(_children(root)))]
        while stack:
            node, children = stack[-1]
            for child in children:
                if id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, iter(_children(child))))
                    break
            else:
                order.append(node)
                stack.pop()
    order.reverse()
    return order


def _children(node):
    if isinstance(node, AccumulateGrad):
        return []
    return [_node_of(t) for t in node._inputs]


def _node_grads(node, cts, create_graph):
    """The gradients of the node's inputs (tensors), given its output
    gradients (tensors or None)."""
    outs = []
    for ct, aval in zip(cts, node._out_avals):
        if aval is None:
            outs.append(Tensor._result(np.zeros((), _float0)))
        elif ct is not None:
            outs.append(ct)
        elif _is_float(aval.dtype):
            outs.append(Tensor._result(jnp.zeros(aval.shape, aval.dtype)))
        else:
            outs.append(Tensor._result(np.zeros(aval.shape, _float0)))
    if not create_graph:
        arrays = tree_util.tree_unflatten(node._out_tree, [_value_of(g) for g in outs])
        return [Tensor._result(g) for g in node._pullback(arrays)]
    run_diff, n = node._recompute, len(node._inputs)

    def backward_of(*vals):
        _, pullback = _vjp(run_diff, *vals[:n])
        return pullback(tree_util.tree_unflatten(node._out_tree, list(vals[n:])))

    backward_of.__name__ = node.name().replace("Backward0", "") + "_backward"
    return list(apply(backward_of, tuple(node._inputs) + tuple(outs), {}))


def _engine(roots, root_grads, retain_graph, create_graph, targets=None, capture=False):
    """Run the backward pass from `roots` with `root_grads`. `targets`: None
    (every leaf that requires grad gets its gradient added to `.grad`) or
    the ids of the tensors that get theirs, and then only the nodes that
    lead to them run; `capture`: return those gradients by id instead
    (autograd.grad)."""
    buffers = {}  # id(node) -> {output index: summed gradient}
    root_nodes = []
    for t, g in zip(roots, root_grads):
        node = _node_of(t)
        root_nodes.append(node)
        slots = buffers.setdefault(id(node), {})
        slots[t._output_nr] = _add(slots.get(t._output_nr), g, create_graph)
    order = _graph_order(root_nodes)
    if targets is not None:
        order = _needed(order, targets)
    results = {}

    def deliver(t, g):  # `t` has its whole gradient `g` (after its hooks)
        if t._retains_grad and not capture:
            t.grad = g if t.grad is None else _add(t.grad, g, create_graph)
        if (t.is_leaf if targets is None else id(t) in targets):
            if capture:
                results[id(t)] = g
            elif t.grad is None:
                t.grad = g if create_graph else Tensor._result(g._value)
            elif not t._retains_grad:
                t.grad = _add(t.grad, g, create_graph)

    with set_grad_enabled(create_graph and is_grad_enabled()):
        for node in order:
            slots = buffers.pop(id(node), None)
            if not slots:
                continue
            if isinstance(node, AccumulateGrad):
                g = _call_pre_hooks(node, [slots[0]])[0]
                g = _run_hooks(node.variable._hooks, g)
                deliver(node.variable, g)
                for hook in list(node._hooks.values()):
                    hook((node.variable.grad,), (g,))
                continue
            _check_usable(node)
            cts = []
            for nr, ref in enumerate(node._outputs):
                g = slots.get(nr)
                t = ref() if ref is not None else None
                if g is not None and t is not None:
                    g = _run_hooks(t._hooks, g)
                    deliver(t, g)
                cts.append(g)
            cts = _call_pre_hooks(node, cts)
            grads = _node_grads(node, cts, create_graph)
            for hook in list(node._hooks.values()):
                new = hook(tuple(grads), tuple(cts))
                if new is not None:
                    grads = _tensors(new)
            if not retain_graph:
                node._pullback = None
            for t, g in zip(node._inputs, grads):
                if g is None:
                    continue
                child = _node_of(t)
                slots = buffers.setdefault(id(child), {})
                slots[t._output_nr] = _add(slots.get(t._output_nr), g, create_graph)
    return results


def _tensors(values):
    return [g if g is None or isinstance(g, Tensor) else Tensor._result(jnp.asarray(g))
            for g in values]


def _call_pre_hooks(node, cts):
    for hook in list(node._pre_hooks.values()):
        new = hook(tuple(cts))
        if new is not None:
            cts = _tensors(new)
    return cts


def _needed(order, targets):
    """The nodes of `order` from which a target tensor can be reached
    (torch runs only those when it is given the inputs)."""
    keep = set()
    for node in reversed(order):  # children before parents
        if isinstance(node, AccumulateGrad):
            if id(node.variable) in targets:
                keep.add(id(node))
            continue
        outs = [ref() for ref in node._outputs if ref is not None]
        if any(t is not None and id(t) in targets for t in outs) or any(
                id(_node_of(t)) in keep for t in node._inputs):
            keep.add(id(node))
    return [node for node in order if id(node) in keep]


def _root_grads(call, outputs, grad_outputs):
    grads = list(_as_tuple(grad_outputs)) or [None] * len(outputs)
    if len(grads) != len(outputs):
        raise FunctxRuntimeError(
            f"{call}: got {len(grads)} gradients for {len(outputs)} outputs; pass one "
            "per output (None for a scalar output's implicit 1)."
        )
    out = []
    for i, (t, g) in enumerate(zip(outputs, grads)):
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise FunctxRuntimeError(
                f"{call}: element {i} of the outputs does not require grad and does "
                "not have a grad_fn. Compute it from tensors created with "
                "requires_grad=True, outside no_grad()."
            )
        if g is None:
            if t._value.size != 1:
                raise FunctxRuntimeError(
                    f"{call}: grad can be implicitly created only for scalar outputs; "
                    f"output {i} has shape {t.shape}. Pass its gradient (an array of "
                    "that shape)."
                )
            g = Tensor._result(jnp.ones(t.shape, t.dtype))
        elif not isinstance(g, Tensor):
            g = Tensor._result(jnp.asarray(g, t.dtype))
        if g.shape != t.shape:
            raise FunctxRuntimeError(
                f"{call}: the gradient for output {i} has shape {g.shape}, but the "
                f"output has shape {t.shape}. Pass a gradient of the output's shape."
            )
        out.append(g)
    return out


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate the gradients of `tensors` (a tensor or a sequence) into
    `.grad` of the leaves they were computed from (torch.autograd.backward).

    Args:
      tensors (Tensor | Sequence[Tensor]): the outputs to differentiate.
      grad_tensors (Tensor | Sequence[Tensor] | None): their gradients (None for
        a scalar output: 1).
      retain_graph (bool | None): keep the graph for another backward pass
        (default: create_graph).
      create_graph (bool): record the backward pass, so the gradients can be
        differentiated again.
      inputs (Tensor | Sequence[Tensor] | None): only these tensors' `.grad` are
        accumulated (default: every leaf that requires grad).
    """
    outputs = list(_as_tuple(tensors))
    grads = _root_grads("autograd.backward", outputs, grad_tensors)
    if retain_graph is None:
        retain_graph = create_graph
    only = None
    if inputs is not None:
        only = {id(t) for t in _as_tuple(inputs)}
    _engine(outputs, grads, retain_graph, create_graph, targets=only)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=None, materialize_grads=False):
    """The gradients of `outputs` with respect to `inputs`, returned rather
    than accumulated (torch.autograd.grad).

    Args:
      outputs (Tensor | Sequence[Tensor]): as `tensors` of `backward`.
      inputs (Tensor | Sequence[Tensor]): a tensor or a sequence of tensors that
        require grad.
      grad_outputs (Tensor | Sequence[Tensor] | None): as `grad_tensors` of
        `backward`.
      retain_graph (bool | None): as for `backward`.
      create_graph (bool): as for `backward`.
      allow_unused (bool | None): return None for an input the outputs do not
        depend on (else that raises).
      materialize_grads (bool): return zeros instead of None for such inputs.

    Returns:
      tuple: A tuple with one tensor (or None) per input.
    """
    outs = list(_as_tuple(outputs))
    ins = list(_as_tuple(inputs))
    for i, t in enumerate(ins):
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise FunctxRuntimeError(
                f"autograd.grad: input {i} does not require grad; pass tensors created "
                "with requires_grad=True (or computed from them)."
            )
    if allow_unused is None:
        allow_unused = materialize_grads
    grads = _root_grads("autograd.grad", outs, grad_outputs)
    if retain_graph is None:
        retain_graph = create_graph
    captured = _engine(outs, grads, retain_graph, create_graph,
                       targets={id(t) for t in ins}, capture=True)
    result = []
    for i, t in enumerate(ins):
        g = captured.get(id(t))
        if g is None:
            if materialize_grads:
                g = Tensor._result(jnp.zeros(t.shape, t.dtype))
            elif not allow_unused:
                raise FunctxRuntimeError(
                    f"autograd.grad: input {i} appears to not have been used in the graph "
                    "of the outputs. Set allow_unused=True if this is the desired "
                    "behavior (its gradient is then None)."
                )
        result.append(g)
    return tuple(result)
