"""Per-example gradient norms and clipped gradients without per-example
gradients: `per_sample_grad_norms`, `grad_and_norms`, `clipped_grad`
(SPEC section 7).

NOTE [ghost norms]
`vmap(grad(loss))` materialises one gradient per example: batch x
parameters numbers, most of them for the weight matrices. DP-SGD only needs
each example's gradient *norm* (to clip) and then a weighted sum. For a
weight W used as y = dot_general(a, W), the gradient of one example's loss
is dW_i = sum_t a_it (x) g_it, where a_i is the other operand, g_i = dL_i/dy_i
the cotangent of the output and t runs over a_i's free axes (a sequence or
spatial axis; absent for a plain matrix-vector product). So

    ||dW_i||^2 = ||a_i||^2 ||g_i||^2                         (no t axis)
              = sum_{t,s} (a_it . a_is)(g_it . g_is)          (Gram form)
              = ||a_i^T g_i||^2                               (materialised)

and the (re-weighted) summed gradient is sum_i w_i a_i^T g_i: one contraction
over the batch and t. None of these holds a batch x |W| array (only the
third, chosen when it is the cheaper, holds |W| per example).

How it is found (`_analyse`): the loss of ONE example is staged into a
Graph with the parameters as inputs. A parameter is *ghosted* when every use
of it is an operand of a dot_general, directly or through transposes, and all
uses split its axes the same way into (dot batch axes, contracted axes, free
axes). A parameter used several times (shared weights) then has
dW_i = sum_u a_ui^T g_ui, which is one product again after concatenating
the uses along t, so its norm is exact with the cross terms (never the sum
of per-use norms).

Two more kinds of use have a product form:
  * the kernel of conv_general_dilated (any strides, padding, dilations,
    dimension numbers and feature groups; not batch groups): im2col
    writes the convolution as a product of the kernel with the input's
    patches, so a = the patches (t = the convolution's batch x output
    positions, contracted = a group's input channels x kernel positions),
    g = the output cotangent and the dot batch axis = the feature groups;
    the outer or Gram form applies when it is cheaper than the kernel's
    per-example gradient. The patches come from a convolution with an
    identity kernel (`_patches`). Where materialising is the cheapest
    (small kernels, many positions) the kernel falls back: its per-example
    gradient from the convolution's own transpose is smaller and faster
    than the patches (which are the input times the kernel's size) and
    their product (measured on an MNIST-sized CNN: 24 vs 32 MB, 120 vs
    190 ms at batch 256).
  * a table read by gathers whose windows are whole rows (each indexed
    axis sliced at size 1 or in full, every other axis in full: `W[ids]`,
    Equinox's Embedding, `W[i, j]`): dW_i = sum_t (window of t) += g_t, and
    two positions read the same window or disjoint ones, so
    ||dW_i||^2 = sum_{t,s} [key_t == key_s] (g_t . g_s), key the window's
    start as the gather clamps it (a window it drops counts nothing). For
    up to 128 ids per example every pair is compared ('index'); for more the
    keys are sorted and the rows of equal keys summed (a segment sum,
    'index-sorted'): ||dW_i||^2 = sum over distinct keys of ||sum g_t||^2.
    Either is used only where it is smaller than the table's own
    per-example gradient (t^2, or t x window size, <= |W|).
A parameter is ghosted only when all its uses are of one kind. Every other
parameter (biases, LayerNorm scales, anything used inside scan, cond or a
custom rule, reshaped before its product, a tied embedding that is also a
product's weight) falls back to its own per-example gradient, materialised
for that parameter only.

How it is computed (`_per_example`): the staged graph is evaluated with a
zero "probe" added to the output of each ghost product and with the other
operand recorded; `grad` with respect to the probes and the fallback
parameters (the ghosted weights are constants there, so no weight gradient
is formed) gives g_i and the fallback gradients; `vmap` over the batch runs
it for every example as one batched backward pass. Norms, and the weighted
sums, are then contractions of a, g and the fallback gradients; for a
convolution or gather the weighted sum is that operation's own backward
pass (a convolution with the input, a scatter-add) over the whole batch with
the cotangents w_i g_i, as in an ordinary gradient step.

`clipped_grad` reuses that backward pass: the re-weighted pass (the gradient
of sum_i w_i L_i with w_i = min(1, C / ||dtheta_i||) held constant) has the
output cotangents w_i g_i, so it is the weighted contraction of the same a
and g; no second forward or backward pass through the network runs.
"""

import copy
import functools

import jax
import numpy as np
from jax import tree_util

from .. import numpy as fnp
from ..core import Aval, aval_of, bind, interpreter_stack, is_complex_dtype, is_inexact_dtype
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.staging import Const, Eqn, Graph, Var, stage
from ..primitives import structural as st
from ..primitives.call import jit_call
from ..primitives.conv import conv_p
from ..primitives.dot import dot_general_p
from ..primitives.indexing import gather_p
from ..primitives.structural import transpose_p
from . import _args
from .grad import grad as _grad
from .vmap import _jax_is_tracing, broadcast_dims, check_dims, vmap

_REDUCTIONS = ("sum", "mean")


# --------------------------------------------------------------------------
# Arguments


class _Call:
    """One call's arguments, split into the differentiated parameters (shared
    by the batch) and the per-example data, with the loss of one example as a
    function of flat leaves (`flat_loss`)."""

    def __init__(self, loss, argnums, in_dims, args, kwargs, call):
        self.call = call
        nums, self.single = _args.normalize_argnums(argnums, len(args), call)
        self.nums = nums
        dims = _arg_dims(in_dims, args, nums, call)
        names = [f"argument {i}" for i in nums]
        p_leaves, self.p_tree, p_mask, _ = _args.differentiable_leaves(
            tuple(args[i] for i in nums), call, names)
        self.p_leaves, self.p_mask = p_leaves, p_mask
        self.params = [x for x, m in zip(p_leaves, p_mask) if m]
        # data: every other positional argument, leaf by leaf
        self.d_slots = []  # (arg index, treedef, leaves, dims, indices of Python-value leaves)
        data, data_dims = [], []
        for i, a in enumerate(args):
            if i in nums:
                continue
            leaves, tree = tree_util.tree_flatten(a)
            ldims = broadcast_dims(dims[i], a, call, f"in_dims[{i}]")
            fixed = []
            for k, (x, d) in enumerate(zip(leaves, ldims)):
                if d is not None:
                    x = leaves[k] = _args.as_array(x, call, f"argument {i} (mapped)")
                    nd = aval_of(x).ndim
                    if not -nd <= d < nd:
                        raise FunctxValueError(
                            f"{call}: in_dims[{i}]={d} is out of range for a leaf of argument "
                            f"{i} with {nd} dimension{'s' if nd != 1 else ''}. Give a dimension "
                            f"in [{-nd}, {nd}) or None for an argument that is not mapped.")
                    d %= nd
                if d is None and not isinstance(x, (jax.Array, np.ndarray, np.generic)) and not (
                        hasattr(x, "aval")):
                    fixed.append(k)  # a Python value: passed as it is
                    continue
                if d is None:
                    x = leaves[k] = _args.as_array(x, call, f"argument {i}")
                data.append(x)
                data_dims.append(d)
            self.d_slots.append((i, tree, leaves, ldims, fixed))
        self.data, self.data_dims = data, data_dims
        sizes = {aval_of(x).shape[d] for x, d in zip(data, data_dims) if d is not None}
        if not sizes:
            raise FunctxValueError(
                f"{call}: no argument is mapped over the batch: in_dims={in_dims!r} leaves "
                "every data argument unmapped. Map the examples, e.g. in_dims=0 (every "
                "argument but the differentiated ones along axis 0).")
        if len(sizes) > 1:
            raise FunctxValueError(
                f"{call}: the mapped arguments have different batch sizes {sorted(sizes)}. "
                "Every mapped argument needs the same size along its in_dims axis.")
        self.size = sizes.pop()
        self.nargs = len(args)
        self.loss, self.kwargs = loss, kwargs

    def example_avals(self):
        out = []
        for x, d in zip(self.data, self.data_dims):
            a = aval_of(x)
            if d is not None:
                a = Aval(a.shape[:d] + a.shape[d + 1:], a.dtype, a.weak_type)
            out.append(a)
        return out

    def flat_loss(self, *flat):
        """The loss of one example on (parameters..., data leaves...)."""
        n_p = len(self.params)
        it = iter(flat[:n_p])
        p_leaves = [next(it) if m else x for x, m in zip(self.p_leaves, self.p_mask)]
        p_args = tree_util.tree_unflatten(self.p_tree, p_leaves)
        args = [None] * self.nargs
        for i, a in zip(self.nums, p_args):
            args[i] = a
        it = iter(flat[n_p:])
        for i, tree, leaves, _, fixed in self.d_slots:
            new = [leaves[k] if k in fixed else next(it) for k in range(len(leaves))]
            args[i] = tree_util.tree_unflatten(tree, new)
        out = self.loss(*args, **self.kwargs)
        leaves = tree_util.tree_leaves(out)
        a = aval_of(leaves[0]) if len(leaves) == 1 else None
        if a is None or a.shape != () or not is_inexact_dtype(a.dtype) or is_complex_dtype(a.dtype):
            got = (type(out).__name__ if a is None else a.str_short())
            raise FunctxValueError(
                f"{self.call}: expected the loss to return a real floating-point scalar for "
                f"one example, got {got}. Write the loss of a single example (the "
                "transform maps it over the batch), e.g. `loss(params, x, y)` for one x "
                "and y.")
        return [leaves[0]]

    def unflatten(self, grads):
        """Gradients of the parameters, in the structure of the differentiated
        argument(s) (None for their non-array leaves, as grad gives)."""
        it = iter(grads)
        leaves = [next(it) if m else None for m in self.p_mask]
        tree = tree_util.tree_unflatten(self.p_tree, leaves)
        return tree[0] if self.single else tuple(tree)


def _arg_dims(in_dims, args, nums, call):
    """in_dims per positional argument; the differentiated ones must be
    unmapped (one parameter set shared by the batch)."""
    if in_dims is None or isinstance(in_dims, (int, np.integer)) and not isinstance(in_dims, bool):
        return [None if i in nums else in_dims for i in range(len(args))]
    if not isinstance(in_dims, (tuple, list)):
        raise FunctxTypeError(
            f"{call}: in_dims must be an int, None, or a tuple with one entry per positional "
            f"argument, got {type(in_dims).__name__}. For example in_dims=0, or "
            "in_dims=(None, 0, 0) for loss(params, x, y).")
    if len(in_dims) != len(args):
        raise FunctxValueError(
            f"{call}: in_dims has {len(in_dims)} entries but the loss got {len(args)} positional "
            f"argument{'s' if len(args) != 1 else ''}. Give one entry per positional argument "
            "(None for the parameters).")
    for i in nums:
        if any(d is not None for d in tree_util.tree_leaves(in_dims[i])):
            raise FunctxValueError(
                f"{call}: in_dims[{i}]={in_dims[i]!r} maps the differentiated argument {i}, but "
                "per-example gradients are taken with respect to parameters shared by the "
                f"batch. Set in_dims[{i}]=None (for per-model parameters, vmap over this "
                "transform instead).")
    return list(in_dims)


def _check_chunk_size(chunk_size, call):
    if chunk_size is not None and (
            not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool)
            or chunk_size < 1):
        raise FunctxValueError(
            f"{call}: chunk_size must be None or a positive int, got {chunk_size!r}. Pass None "
            "for the whole batch at once, or the number of examples per chunk (e.g. 64).")


# --------------------------------------------------------------------------
# The analysis of the staged graph (NOTE [ghost norms])


def inline_calls(graph):
    """`graph` with every jit_call equation replaced by the equations of the
    graph it calls (fresh variables per call), so a parameter's uses inside
    a `functx.jit`-ed helper are visible."""
    if not any(e.prim is jit_call for e in graph.eqns):
        return graph
    sub = {}

    def get(x):
        return sub.get(x, x) if type(x) is Var else x

    eqns = []
    for e in graph.eqns:
        ins = [get(x) for x in e.inputs]
        if e.prim is not jit_call:
            same = all(a is b for a, b in zip(ins, e.inputs))
            eqns.append(e if same else Eqn(e.prim, ins, e.outputs, e.params))
            continue
        inner = inline_calls(e.params["graph"])
        env = dict(zip(inner.inputs, ins))
        for ie in inner.eqns:
            outs = [Var(v.aval) for v in ie.outputs]
            eqns.append(Eqn(ie.prim, [env.get(x, x) if type(x) is Var else x for x in ie.inputs],
                            outs, ie.params))
            env.update(zip(ie.outputs, outs))
        for o, io in zip(e.outputs, inner.outputs):
            sub[o] = env.get(io, io) if type(io) is Var else io
    return Graph(graph.inputs, eqns, [get(x) for x in graph.outputs])


class _Use:
    """One product `eqn` with the parameter (through `axmap`: operand axis ->
    parameter axis) as operand `pos`; `a_perm`/`g_perm` order the other
    operand and the output as (dot batch, t, contracted) and (dot batch, t,
    free); `t` is the size of the t axes."""

    __slots__ = ("eqn", "pos", "a_perm", "g_perm", "t", "swap")


def _layout(eqn, pos, axmap):
    """(key, use): how one product splits the parameter's axes; key =
    (batch axes, contracted axes, free axes) of the parameter, each sorted."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    wc, wb, ac, ab = (lc, lb, rc, rb) if pos == 0 else (rc, rb, lc, lb)
    a_aval = eqn.inputs[1 - pos].aval
    wf = [i for i in range(len(axmap)) if i not in wc and i not in wb]
    af = [j for j in range(a_aval.ndim) if j not in ac and j not in ab]
    nb = len(lb)
    if pos == 0:
        wf_out = [nb + i for i in range(len(wf))]
        af_out = [nb + len(wf) + j for j in range(len(af))]
    else:
        af_out = [nb + j for j in range(len(af))]
        wf_out = [nb + len(af) + i for i in range(len(wf))]
    border = sorted(range(nb), key=lambda k: axmap[wb[k]])
    corder = sorted(range(len(wc)), key=lambda k: axmap[wc[k]])
    forder = sorted(range(len(wf)), key=lambda k: axmap[wf[k]])
    key = (tuple(axmap[wb[k]] for k in border), tuple(axmap[wc[k]] for k in corder),
           tuple(axmap[wf[k]] for k in forder))
    use = _Use()
    use.eqn, use.pos = eqn, pos
    use.a_perm = tuple([ab[k] for k in border] + af + [ac[k] for k in corder])
    use.g_perm = tuple(list(border) + af_out + [wf_out[k] for k in forder])
    use.t = int(np.prod([a_aval.shape[j] for j in af], dtype=np.int64))
    use.swap = False
    return key, use


class _Ghost:
    """A ghosted parameter: its uses, its axis split `key` and the sizes of
    the canonical (batch, contracted, free) layout; `form` is how its
    per-example squared norm is computed: 'outer' (no t axis), 'gram' or
    'materialise' for products and convolutions (`kind` 'dot' or 'conv'),
    'index' for gathers (`kind` 'gather', NOTE [ghost norms])."""

    __slots__ = ("index", "uses", "key", "bd", "x", "y", "t", "form", "kind", "conv")


def _choose_form(t, x, y):
    if t == 1:
        return "outer"
    if t * (x + y) <= x * y:
        return "gram"
    return "materialise"


# Convolutions (NOTE [ghost norms]): out[n, o, p] = sum_{c,k} K[o, c, k]
# patch[n, c k, p], so a kernel used by convolutions is a product with the
# input's patches (t = batch of the convolution x output positions,
# contracted = the input channels of a group x kernel positions, free = the
# group's output channels, dot batch = the feature groups).


def _conv_use(eqn, pos, axmap):
    """The _Use of a convolution whose kernel (operand 1, not transposed)
    is the parameter, or None when the product form does not apply."""
    p = eqn.params
    if pos != 1 or axmap != tuple(range(len(axmap))) or p["batch_group_count"] != 1:
        return None
    dn = p["dimension_numbers"]
    if not hasattr(dn, "rhs_spec"):
        return None
    lhs, rhs = eqn.inputs[0].aval, eqn.inputs[1].aval
    out = eqn.outputs[0].aval
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    groups = p["feature_group_count"]
    o = rhs.shape[rhs_spec[0]]
    if o % groups or lhs.shape[lhs_spec[1]] != groups * rhs.shape[rhs_spec[1]]:
        return None
    use = _Use()
    use.eqn, use.pos, use.swap = eqn, pos, False
    use.a_perm = use.g_perm = None
    use.t = int(out.shape[out_spec[0]] * np.prod([out.shape[d] for d in out_spec[2:]],
                                                   dtype=np.int64))
    return use


def _patches(lhs, kernel_aval, params):
    """The (groups, t, channels of a group x kernel positions) patches of one
    convolution's input, by a convolution with an identity kernel (exact:
    products with 1 and sums of zeros; HIGHEST precision against TF32)."""
    from ..primitives.conv import conv_p

    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    la = aval_of(lhs)
    c = la.shape[lhs_spec[1]]
    ks = tuple(kernel_aval.shape[d] for d in rhs_spec[2:])
    nk = int(np.prod(ks, dtype=np.int64))
    eye = np.eye(nk, dtype=np.dtype(la.dtype)).reshape((nk, 1) + ks)
    ident = np.tile(eye, (c,) + (1,) * (eye.ndim - 1))  # feature c * nk + k reads channel c
    ident = np.transpose(ident, np.argsort(rhs_spec))
    hi = jax.lax.Precision.HIGHEST
    new = dict(params, feature_group_count=c, batch_group_count=1, precision=(hi, hi),
               preferred_element_type=None)
    pt = bind(conv_p, lhs, fnp.asarray(ident, dtype=la.dtype), **new)
    # (features, batch, positions...) -> (groups, t, c / groups * nk)
    groups = params["feature_group_count"]
    pt = st.transpose(pt, (out_spec[1], out_spec[0]) + tuple(out_spec[2:]))
    t = int(np.prod(aval_of(pt).shape[1:], dtype=np.int64))
    pt = st.reshape(pt, (groups, c // groups * nk, t))
    return st.transpose(pt, (0, 2, 1))


def _conv_cotangent(ct, params):
    """A convolution's output cotangent as (groups, t, output channels of a group)."""
    dn = params["dimension_numbers"]
    out_spec = dn.out_spec
    groups = params["feature_group_count"]
    g = st.transpose(ct, (out_spec[1], out_spec[0]) + tuple(out_spec[2:]))
    shape = aval_of(g).shape
    t = int(np.prod(shape[1:], dtype=np.int64))
    return st.transpose(st.reshape(g, (groups, shape[0] // groups, t)), (0, 2, 1))


def _conv_ghost(k, p, uses):
    """A _Ghost for a kernel used only by convolutions (all with the same
    kernel layout and groups), or None."""
    first = uses[0].eqn.params
    for u in uses:
        q = u.eqn.params
        if (q["dimension_numbers"].rhs_spec != first["dimension_numbers"].rhs_spec
                or q["feature_group_count"] != first["feature_group_count"]):
            return None
    rhs_spec = first["dimension_numbers"].rhs_spec
    shape = p.aval.shape
    groups = first["feature_group_count"]
    g = _Ghost()
    g.kind, g.index, g.uses, g.key = "conv", k, uses, None
    g.bd = groups
    g.x = int(shape[rhs_spec[1]] * np.prod([shape[d] for d in rhs_spec[2:]], dtype=np.int64))
    g.y = shape[rhs_spec[0]] // groups
    g.t = sum(u.t for u in uses)
    g.form = _choose_form(g.t, g.x, g.y)
    g.conv = rhs_spec
    return None if g.form == "materialise" else g  # NOTE [ghost norms]: falls back


# Gathers (NOTE [ghost norms]): a parameter read by gathers whose windows are
# whole "rows" (every axis the indices address is sliced at size 1 or in
# full, the others in full) has per-example gradient sum_t (row of the
# window at position t) += g_t, and two positions either read the same
# window or disjoint ones, so ||dW_i||^2 = sum_{t,s} [key_t == key_s] g_t.g_s
# with key the window's effective start (clamped as the gather clamps; a
# window the gather drops contributes nothing).


def _gather_use(eqn, pos, axmap, shape):
    from jax.lax import GatherScatterMode

    p = eqn.params
    dn = p["dimension_numbers"]
    if pos != 0 or axmap != tuple(range(len(axmap))) or getattr(dn, "operand_batching_dims", ()):
        return None
    if p["mode"] not in (GatherScatterMode.CLIP, GatherScatterMode.FILL_OR_DROP,
                         GatherScatterMode.PROMISE_IN_BOUNDS):
        return None
    sizes = p["slice_sizes"]
    indexed = set(dn.start_index_map)
    if len(indexed) != len(dn.start_index_map):
        return None
    for d, (z, n) in enumerate(zip(sizes, shape)):
        if z != n and not (d in indexed and z == 1):
            return None
    use = _Use()
    use.eqn, use.pos, use.swap = eqn, pos, False
    use.a_perm = use.g_perm = None
    idx = eqn.inputs[1].aval
    use.t = int(np.prod(idx.shape[:-1], dtype=np.int64))
    return use


def _gather_ghost(k, p, uses):
    first = uses[0].eqn.params["slice_sizes"]
    if any(u.eqn.params["slice_sizes"] != first for u in uses):
        return None
    g = _Ghost()
    g.kind, g.index, g.uses, g.key, g.conv = "gather", k, uses, None, None
    g.bd, g.x = 1, int(np.prod(first, dtype=np.int64))
    g.y = int(np.prod(p.aval.shape, dtype=np.int64))
    g.t = sum(u.t for u in uses)
    # per example: t x t comparisons (short), or a sort of the t keys and a
    # segment sum of the t rows (long), against the |W| of its own gradient
    if g.t <= _SHORT and g.t * g.t <= g.y:
        g.form = "index"
    elif g.t * g.x <= g.y and g.y < 2 ** 31:
        g.form = "index-sorted"
    else:
        return None
    return g


# up to this many ids per example, compare every pair: on the 2-core CPU the
# pairs beat the sort at 32 ids of 64 features (143 vs 185 ms for the
# benchmark's transformer block at batch 256)
_SHORT = 128


def _gather_keys(idx, params, operand_shape):
    """(t, rank) effective window starts and (t,) whether the window counts."""
    from jax.lax import GatherScatterMode

    dn = params["dimension_numbers"]
    sizes = params["slice_sizes"]
    ia = aval_of(idx)
    t = int(np.prod(ia.shape[:-1], dtype=np.int64))
    idx = st.reshape(idx, (t, ia.shape[-1]))
    cols = [fnp.zeros((t,), ia.dtype)] * len(operand_shape)
    valid = None
    for j, d in enumerate(dn.start_index_map):
        s = idx[:, j]
        bound = operand_shape[d] - sizes[d]
        if params["mode"] == GatherScatterMode.CLIP:
            s = fnp.clip(s, 0, bound)
        else:
            ok = (s >= 0) & (s <= bound)
            valid = ok if valid is None else valid & ok
        cols[d] = s
    return fnp.stack(cols, axis=1), valid


def _gather_cotangent(ct, params):
    """A gather's output cotangent as (t, window size): batch axes first,
    the window's axes in the operand's order."""
    dn = params["dimension_numbers"]
    shape = aval_of(ct).shape
    offset = tuple(dn.offset_dims)
    batch = tuple(d for d in range(len(shape)) if d not in offset)
    g = st.transpose(ct, batch + offset)
    t = int(np.prod([shape[d] for d in batch], dtype=np.int64))
    return st.reshape(g, (t, int(np.prod([shape[d] for d in offset], dtype=np.int64))))


def _analyse(graph, n_params):
    """Decide, per parameter input of the per-example graph, between ghost
    (returns a _Ghost), fallback ('fallback') and unused ('unused')."""
    users = {}
    for eqn in graph.eqns:
        for pos, x in enumerate(eqn.inputs):
            if type(x) is Var:
                users.setdefault(x, []).append((eqn, pos))
    outputs = {x for x in graph.outputs if type(x) is Var}
    plans = []
    for k, p in enumerate(graph.inputs[:n_params]):
        if p not in users and p not in outputs:
            plans.append("unused")
            continue
        if not is_inexact_dtype(p.aval.dtype) or is_complex_dtype(p.aval.dtype):
            plans.append("fallback")
            continue
        found, convs, gathers = [], [], []

        def collect(var, axmap):
            if var in outputs:
                return False
            for eqn, pos in users.get(var, ()):
                if eqn.prim is dot_general_p:
                    found.append(_layout(eqn, pos, axmap))
                elif eqn.prim is transpose_p:
                    perm = eqn.params["permutation"]
                    if not collect(eqn.outputs[0], tuple(axmap[j] for j in perm)):
                        return False
                elif eqn.prim is conv_p:
                    use = _conv_use(eqn, pos, axmap)
                    if use is None:
                        return False
                    convs.append(use)
                elif eqn.prim is gather_p:
                    use = _gather_use(eqn, pos, axmap, p.aval.shape)
                    if use is None:
                        return False
                    gathers.append(use)
                else:
                    return False
            return True

        ok = collect(p, tuple(range(p.aval.ndim)))
        kinds_used = sum(bool(u) for u in (found, convs, gathers))
        if not ok or kinds_used != 1:  # one kind of use only (else: fallback)
            plans.append("fallback")
            continue
        if convs or gathers:
            g = (_conv_ghost if convs else _gather_ghost)(k, p, convs or gathers)
            plans.append(g if g is not None else "fallback")
            continue
        # a use that contracts the axes another leaves free (x @ W and
        # y @ W.T) contributes g (x) a instead of a (x) g: the same layout with
        # the roles of its operand and output cotangent swapped
        canon = found[0][0]
        for key, use in found:
            use.swap = key != canon
        if any(key != canon and key != (canon[0], canon[2], canon[1]) for key, _ in found):
            plans.append("fallback")
            continue
        g = _Ghost()
        g.kind, g.conv = "dot", None
        g.index, g.key, g.uses = k, canon, [u for _, u in found]
        shape = p.aval.shape
        g.bd, g.x, g.y = (int(np.prod([shape[i] for i in axes], dtype=np.int64))
                          for axes in g.key)
        g.t = sum(u.t for u in g.uses)
        g.form = _choose_form(g.t, g.x, g.y)
        plans.append(g)
    return plans


# --------------------------------------------------------------------------
# Evaluation


def _run_probed(graph, args, probe_of, probes):
    """Evaluate `graph` on `args`, adding `probes[probe_of[eqn]]` to the
    output of each probed product and recording its operands (`recorded[k]`:
    those of the product with probe k). Returns (outputs, recorded)."""
    env = dict(zip(graph.inputs, args, strict=True))
    seen = [None] * len(probe_of)
    for eqn in graph.eqns:
        invals = [env[x] if type(x) is Var else x.value for x in eqn.inputs]
        out = bind(eqn.prim, *invals, **eqn.params)
        k = probe_of.get(eqn)
        if k is not None:
            seen[k] = invals
            out = out + probes[k]
        if eqn.prim.multiple_results:
            env.update(zip(eqn.outputs, out, strict=True))
        else:
            env[eqn.outputs[0]] = out
    return [env[x] if type(x) is Var else x.value for x in graph.outputs], seen


def _canonical(ghost, operands, cts, probe_of):
    """The (batch, t, contracted) and (batch, t, free) views L, R of one
    example's products of a ghost parameter, its uses concatenated along t."""
    ls, rs = [], []
    for u in ghost.uses:
        k = probe_of[u.eqn]
        a = st.transpose(operands[k][1 - u.pos], u.a_perm)
        g = st.transpose(cts[k], u.g_perm)
        if u.swap:
            a, g = g, a
        ls.append(st.reshape(a, (ghost.bd, u.t, ghost.x)))
        rs.append(st.reshape(g, (ghost.bd, u.t, ghost.y)))
    dtype = np.result_type(*[aval_of(v).dtype for v in ls + rs])
    ls = [v.astype(dtype) if aval_of(v).dtype != dtype else v for v in ls]
    rs = [v.astype(dtype) if aval_of(v).dtype != dtype else v for v in rs]
    if len(ls) == 1:
        return ls[0], rs[0]
    return st.concatenate(ls, 1), st.concatenate(rs, 1)


def _at_least_f32(x):
    """Norms of low-precision values are accumulated in float32."""
    d = aval_of(x).dtype
    return x if np.dtype(d).itemsize >= 4 else x.astype(np.float32)


def _squared_norm(ghost, L, R):
    L, R = _at_least_f32(L), _at_least_f32(R)
    if ghost.form == "outer":
        return fnp.sum(fnp.sum(L * L, axis=(1, 2)) * fnp.sum(R * R, axis=(1, 2)))
    if ghost.form == "gram":
        gl = fnp.einsum("btx,bsx->bts", L, L)
        gr = fnp.einsum("bty,bsy->bts", R, R)
        return fnp.sum(gl * gr)
    m = fnp.einsum("btx,bty->bxy", L, R)
    return fnp.sum(m * m)


class _Plan:
    """The staged per-example loss and what to do with each parameter."""

    def __init__(self, c):
        graph, captured = stage(c.flat_loss, [aval_of(x) for x in c.params] + c.example_avals(),
                                "per_sample_grad_norms")
        self.graph = inline_calls(graph)
        self.captured = captured
        self.n_params = len(c.params)
        self.kinds = _analyse(self.graph, self.n_params)
        self.ghosts = [g for g in self.kinds if isinstance(g, _Ghost)]
        self.fallback = [k for k, g in enumerate(self.kinds) if g == "fallback"]
        probe_of = {}
        for g in self.ghosts:
            for u in g.uses:
                probe_of.setdefault(u.eqn, len(probe_of))
        self.probe_of = probe_of

    def summary(self):
        """Per parameter: 'outer', 'gram', 'materialise' (products),
        'conv-outer', 'conv-gram' (convolution kernels),
        'index', 'index-sorted' (gathered tables), 'fallback' or 'unused'."""
        return [(g.form if g.kind != "conv" else "conv-" + g.form) if isinstance(g, _Ghost)
                else g for g in self.kinds]

    def per_example(self, keep):
        """The function of one example mapped by vmap: (squared norm, and with
        `keep` the canonical L, R per ghost and the fallback gradients)."""
        graph, n_p = self.graph, self.n_params
        probe_eqns = sorted(self.probe_of, key=self.probe_of.get)

        def fn(params, captured, data):
            fb = [params[k] for k in self.fallback]

            def inner(probes, fb_vals):
                vals = list(params)
                for k, v in zip(self.fallback, fb_vals):
                    vals[k] = v
                outs, operands = _run_probed(graph, vals + list(data) + list(captured),
                                             self.probe_of, probes)
                return outs[0], operands

            zeros = [_args.zeros_for(e.outputs[0].aval) for e in probe_eqns]  # weak as the output
            (cts, fb_grads), operands = _grad(inner, argnums=(0, 1), has_aux=True)(zeros, fb)
            total = 0.0
            lrs = []
            for g in self.ghosts:
                if g.kind == "dot":
                    L, R = _canonical(g, operands, cts, self.probe_of)
                    total = total + _squared_norm(g, L, R)
                    lrs.append((L, R))
                    continue
                ks = [self.probe_of[u.eqn] for u in g.uses]
                if g.kind == "conv":
                    kernel = params[g.index]
                    ls = [_patches(operands[k][0], aval_of(kernel), u.eqn.params)
                          for k, u in zip(ks, g.uses)]
                    rs = [_conv_cotangent(cts[k], u.eqn.params) for k, u in zip(ks, g.uses)]
                    L, R = _joined(ls), _joined(rs)
                    total = total + _squared_norm(g, L, R)
                else:
                    total = total + _index_norm(g, [operands[k][1] for k in ks],
                                                [cts[k] for k in ks],
                                                aval_of(params[g.index]).shape)
                # the weighted sum is the operation's own kernel / table
                # gradient over the whole batch: keep its operand and cotangent
                lrs.append(([operands[k][1 - u.pos] for k, u in zip(ks, g.uses)],
                            [cts[k] for k in ks]))
            for v in fb_grads:
                v = _at_least_f32(v)
                total = total + fnp.sum(fnp.real(v * fnp.conj(v)) if is_complex_dtype(
                    aval_of(v).dtype) else v * v)
            return (total, lrs, list(fb_grads)) if keep else total

        return fn

    def weighted_sums(self, params, lrs, fb_grads, w):
        """sum_i w_i dtheta_i per parameter (w None: plain sum), from the
        batched L, R and fallback gradients."""
        out = [None] * self.n_params
        for g, (L, R) in zip(self.ghosts, lrs):
            if g.kind != "dot":
                out[g.index] = _batched_param_grad(g, params[g.index], L, R, w)
                continue
            if w is not None:  # scale the smaller of the two
                if aval_of(L).size <= aval_of(R).size:
                    L = L * w.astype(aval_of(L).dtype).reshape((-1, 1, 1, 1))
                else:
                    R = R * w.astype(aval_of(R).dtype).reshape((-1, 1, 1, 1))
            if g.bd == 1:  # a plain product over (examples, t): as grad's own
                n = aval_of(L).shape[0] * g.t
                m = fnp.tensordot(st.reshape(L, (n, g.x)), st.reshape(R, (n, g.y)), axes=((0,), (0,)))
            else:
                m = fnp.einsum("nbtx,nbty->bxy", L, R)
            perm = g.key[0] + g.key[1] + g.key[2]
            shape = aval_of(params[g.index]).shape
            m = st.reshape(m, tuple(shape[i] for i in perm))
            m = st.transpose(m, tuple(int(i) for i in np.argsort(perm)))
            out[g.index] = m
        for k, v in zip(self.fallback, fb_grads):
            out[k] = fnp.sum(v, axis=0) if w is None else fnp.tensordot(
                w.astype(aval_of(v).dtype), v, axes=1)
        for k, kind in enumerate(self.kinds):
            if kind == "unused":
                a = aval_of(params[k])
                out[k] = fnp.zeros(a.shape, a.dtype)
        dtypes = [aval_of(p).dtype for p in params]
        return [o.astype(d) if aval_of(o).dtype != d else o for o, d in zip(out, dtypes)]


def _joined(parts):
    dtype = np.result_type(*[aval_of(v).dtype for v in parts])
    parts = [v.astype(dtype) if aval_of(v).dtype != dtype else v for v in parts]
    return parts[0] if len(parts) == 1 else st.concatenate(parts, 1)


def _index_norm(ghost, idxs, cts, shape):
    """sum_{t,s} [key_t == key_s] (g_t . g_s) over a gathered parameter's
    uses (one example)."""
    keys, valid, gs = [], [], []
    for u, idx, ct in zip(ghost.uses, idxs, cts):
        k, v = _gather_keys(idx, u.eqn.params, shape)
        keys.append(k)
        valid.append(fnp.ones((aval_of(k).shape[0],), bool) if v is None else v)
        gs.append(_at_least_f32(_gather_cotangent(ct, u.eqn.params)))
    cat = (lambda xs: xs[0]) if len(keys) == 1 else (lambda xs: st.concatenate(xs, 0))
    key, ok, g = cat(keys), cat(valid), _joined([x[None] for x in gs])[0]
    if ghost.form == "index":
        same = fnp.all(key[:, None, :] == key[None, :, :], axis=2) & ok[:, None] & ok[None, :]
        gram = fnp.einsum("tx,sx->ts", g, g)
        return fnp.sum(fnp.where(same, gram, fnp.zeros_like(gram)))
    # sorted: the window's flat start as one key, rows of equal keys summed
    # into one segment each (dropped windows add zeros), the segments' norms
    strides = np.cumprod((1,) + tuple(shape[::-1]))[:-1][::-1]
    itype = np.int64 if aval_of(key).dtype == np.int64 else np.int32
    flat = fnp.sum(key.astype(itype) * fnp.asarray(np.asarray(strides, itype))[None, :], axis=1)
    g = fnp.where(ok[:, None], g, fnp.zeros_like(g))
    order = fnp.argsort(flat)
    ks, gs = flat[order], g[order]
    new = fnp.concatenate([fnp.ones((1,), bool), ks[1:] != ks[:-1]])
    seg = fnp.cumsum(new.astype(np.int32)) - 1
    sums = fnp.zeros(aval_of(g).shape, aval_of(g).dtype).at[seg].add(gs)
    return fnp.sum(sums * sums)


def _batched_param_grad(ghost, param, operands, cts, w):
    """sum_i w_i dparam_i for a convolution kernel or gathered table: the
    gradient of the operation itself with the batch folded into it (one
    ordinary backward convolution / scatter-add), cotangents scaled by w."""
    from .grad import vjp

    total = None
    for u, other, ct in zip(ghost.uses, operands, cts):
        if w is not None:
            ct = ct * w.astype(aval_of(ct).dtype).reshape((-1,) + (1,) * (aval_of(ct).ndim - 1))
        prim, params = u.eqn.prim, u.eqn.params
        if ghost.kind == "conv":
            def op(k, other=other, prim=prim, params=params):
                return vmap(lambda x: bind(prim, x, k, **params))(other)
        else:
            def op(k, other=other, prim=prim, params=params):
                return vmap(lambda i: bind(prim, k, i, **params))(other)
        _, pull = vjp(op, param)
        (d,) = pull(ct.astype(aval_of(param).dtype))
        total = d if total is None else total + d
    return total


def _batched(plan, c, data, dims, keep):
    """vmap of the per-example function over `data` (the batch or a chunk)
    mapped along `dims`."""
    fn = plan.per_example(keep)
    return vmap(fn, in_dims=(None, None, list(dims)))(
        list(c.params), list(plan.captured), list(data))


def _slice(x, d, lo, hi):
    shape = aval_of(x).shape
    start, stop = [0] * len(shape), list(shape)
    start[d], stop[d] = lo, hi
    return st.slice(x, start, stop)


def _run_chunk(plan, c, data, dims, weigh):
    """Norms (n,) of the examples in `data` and, with `weigh` (norms ->
    weights, or None for all ones), their weighted gradient sum."""
    if weigh is None:
        return fnp.sqrt(_batched(plan, c, data, dims, False)), []
    total, lrs, fbg = _batched(plan, c, data, dims, True)
    norms = fnp.sqrt(total)
    return norms, plan.weighted_sums(c.params, lrs, fbg, weigh(norms))


def _reduce(plan, c, chunk_size, weigh):
    """Per-example norms (n,) and, with `weigh` (norms -> weights or None),
    the weighted sum of per-example gradients, computed chunk by chunk."""
    keep = weigh is not None

    def run(data, dims=c.data_dims):
        return _run_chunk(plan, c, data, dims, weigh)

    size = c.size
    if chunk_size is None or chunk_size >= size:
        return run(c.data)
    n_full = size // chunk_size
    if not interpreter_stack() and _jax_is_tracing(c.data) and n_full > 1:
        # under jax.jit / functx.jit: one chunk at a time in a loop (an unrolled
        # Python loop could keep every chunk's intermediates alive)
        import jax.numpy as jnp

        stacked = []
        for x, d in zip(c.data, c.data_dims):
            if d is None:
                stacked.append(None)
                continue
            x = jnp.moveaxis(x, d, 0)[:n_full * chunk_size]
            stacked.append(x.reshape((n_full, chunk_size) + x.shape[1:]))
        mapped = [k for k, d in enumerate(c.data_dims) if d is not None]
        front = list(c.data_dims)
        for k in mapped:
            front[k] = 0

        def body(acc, xs):
            data = list(c.data)
            for k, x in zip(mapped, xs):
                data[k] = x
            norms, sums = run(data, front)
            return [a + s for a, s in zip(acc, sums)], norms

        init = [jnp.zeros(aval_of(p).shape, aval_of(p).dtype) for p in c.params] if keep else []
        acc, norms = jax.lax.scan(body, init, [stacked[k] for k in mapped])
        norms = [norms.reshape(-1)]
        first = n_full * chunk_size
    else:
        acc, norms, first = None, [], 0
    for lo in range(first, size, chunk_size):
        hi = min(lo + chunk_size, size)
        part = [x if d is None else _slice(x, d, lo, hi) for x, d in zip(c.data, c.data_dims)]
        n, sums = run(part)
        norms.append(n)
        acc = sums if acc is None else [a + s for a, s in zip(acc, sums)]
    return st.concatenate(norms, 0) if len(norms) > 1 else norms[0], acc


# --------------------------------------------------------------------------
# The public transforms


def _check(loss, name):
    _args.check_callable(loss, name)


def _make(loss, argnums, in_dims, chunk_size, name, max_memory=None):
    _check(loss, name)
    check_dims(in_dims, f"{name}({_args.fn_name(loss)}, in_dims={in_dims!r})", "in_dims")
    call0 = f"{name}({_args.fn_name(loss)})"
    if chunk_size == "auto" or max_memory is not None:
        from ..memory import check_auto_chunk

        check_auto_chunk(chunk_size, max_memory, call0)
    else:
        _check_chunk_size(chunk_size, call0)

    def setup(args, kwargs, weigh):
        call = f"{name}({_args.fn_name(loss)}, argnums={argnums!r}, in_dims={in_dims!r})(*args)"
        c = _Call(loss, argnums, in_dims, args, kwargs, call)
        plan = _Plan(c)
        chunk = chunk_size
        if chunk == "auto":
            from ..memory import auto_chunk_size, compiled_peak

            def staged_at(n):
                data = [x if d is None else _slice(x, d, 0, n)
                        for x, d in zip(c.data, c.data_dims)]

                def f(*flat):
                    norms, sums = _run_chunk(plan, c, flat, c.data_dims, weigh)
                    return [norms] + list(sums)

                graph, _ = stage(f, [aval_of(x) for x in data], name)
                mapped = [d is not None for d in c.data_dims]
                mapped += [False] * (len(graph.inputs) - len(mapped))
                return graph, mapped, [True] + [False] * (len(graph.outputs) - 1)

            def measure(n):
                # the chunked program itself, parameters, constants and data as arguments
                n_p, n_c = len(c.params), len(plan.captured)

                def prog(*flat):
                    c2, plan2 = copy.copy(c), copy.copy(plan)
                    c2.params, plan2.captured = list(flat[:n_p]), list(flat[n_p:n_p + n_c])
                    c2.data = list(flat[n_p + n_c:])
                    norms, sums = _reduce(plan2, c2, n, weigh)
                    return [norms] + list(sums)

                return compiled_peak(prog, list(c.params) + list(plan.captured) + list(c.data))

            chunk = auto_chunk_size(staged_at, c.size, max_memory, call, measure=measure)
        return c, plan, chunk

    return setup


def per_sample_grad_norms(loss, argnums=0, in_dims=0, *, chunk_size=None, max_memory=None):
    """Per-example gradient norms of a loss, without materialising the
    per-example gradients where the program allows (NOTE [ghost norms] in
    functx/transforms/per_sample.py).

    The norm of example i is ||d loss(params, x_i, ...) / d params||, taken
    over all leaves of the differentiated argument(s) together, and equals
    `vmap(grad(loss), in_dims)` followed by that norm. Weights used in
    products (`x @ W`, `W @ x`, einsum contractions, shared weights used
    several times), convolution kernels (through the input's patches) and
    embedding tables read by row (`W[ids]`, through the equality of the
    ids) contribute through their activations and output cotangents only;
    other parameters (biases, normalisation scales, weights inside scan)
    through their own per-example gradients. `ghost_plan` says which.

    Args:
      loss (Callable): the loss of ONE example, returning a real scalar, e.g.
        `loss(params, x, y)`.
      argnums (int | tuple[int, ...]): the argument(s) to differentiate
        (parameters shared by the batch): an int or a tuple of ints.
      in_dims (int | None | tuple): the batch axis of the other positional
        arguments: an int or None for all of them, or a tuple with one entry
        (int, None or pytree prefix) per positional argument, None at `argnums`.
      chunk_size (int | str | None): examples per chunk (bounded memory, same
        result), or 'auto' with `max_memory`: the largest chunk whose estimated
        peak memory (functx.memory_report's model) fits the budget.
      max_memory (int | None): the memory budget in bytes for chunk_size='auto'.

    Returns:
      Callable: A function of loss's arguments returning the norms, shape
      (batch,) (float32 at least: bfloat16 / float16 gradients are accumulated
      in float32).

    Raises:
      FunctxValueError: the loss does not return a real scalar for one
        example; in_dims maps a differentiated argument, leaves every
        argument unmapped, or the mapped sizes differ; a bad chunk_size, or
        'auto' without max_memory (or max_memory below one example's peak).
      FunctxTypeError: loss is not callable, in_dims has the wrong type, or
        a differentiated leaf is not floating-point.

    Example:
      >>> norms = functx.per_sample_grad_norms(loss, in_dims=(None, 0, 0))(params, xs, ys)
      >>> functx.jit(functx.per_sample_grad_norms(loss))(params, xs, ys)
      >>> functx.per_sample_grad_norms(loss, chunk_size="auto", max_memory=2**30)(params, xs, ys)
    """
    setup = _make(loss, argnums, in_dims, chunk_size, "per_sample_grad_norms", max_memory)

    @functools.wraps(loss)
    def norms(*args, **kwargs):
        c, plan, chunk = setup(args, kwargs, None)
        return _reduce(plan, c, chunk, None)[0]

    return norms


def grad_and_norms(loss, argnums=0, in_dims=0, *, reduction="sum", chunk_size=None,
                   max_memory=None):
    """The gradient of the summed (or mean) loss over a batch together with
    the per-example gradient norms, from one batched backward pass and
    without per-example gradients where the program allows (see
    per_sample_grad_norms).

    Args:
      loss (Callable): as per_sample_grad_norms.
      argnums (int | tuple[int, ...]): as per_sample_grad_norms.
      in_dims (int | None | tuple): as per_sample_grad_norms.
      chunk_size (int | str | None): as per_sample_grad_norms.
      max_memory (int | None): as per_sample_grad_norms.
      reduction (str): 'sum' (gradient of sum_i loss_i) or 'mean' (of the mean).

    Returns:
      Callable: A function returning `(grads, norms)`: grads with the structure
      of the differentiated argument(s) (a tuple of them for a tuple argnums),
      norms of shape (batch,).

    Raises:
      FunctxValueError: as per_sample_grad_norms, and for a reduction other
        than 'sum' or 'mean'.
      FunctxTypeError: as per_sample_grad_norms.

    Example:
      >>> grads, norms = functx.grad_and_norms(loss, in_dims=(None, 0, 0))(params, xs, ys)
    """
    _check_reduction(reduction, f"grad_and_norms({_args.fn_name(loss)})")
    setup = _make(loss, argnums, in_dims, chunk_size, "grad_and_norms", max_memory)

    @functools.wraps(loss)
    def both(*args, **kwargs):
        c, plan, chunk = setup(args, kwargs, _ones)
        norms, sums = _reduce(plan, c, chunk, _ones)
        if reduction == "mean":
            sums = [s / c.size for s in sums]
        return c.unflatten(sums), norms

    return both


def clipped_grad(loss, max_norm, argnums=0, in_dims=0, *, reduction="sum",
                 noise_multiplier=None, key=None, chunk_size=None, max_memory=None):
    """The sum (or mean) over a batch of per-example gradients, each clipped
    to norm at most `max_norm`, optionally with DP-SGD's Gaussian noise,
    without materialising per-example gradients where the program allows.

    Example i's gradient g_i (over all differentiated leaves together) is
    scaled by w_i = min(1, max_norm / ||g_i||): the result is sum_i w_i g_i
    (the gradient of sum_i w_i loss_i with the w_i held constant). The norms
    come from one batched backward pass (NOTE [ghost norms]); the
    re-weighted pass reuses its activations and output cotangents.

    Args:
      loss (Callable): as per_sample_grad_norms.
      argnums (int | tuple[int, ...]): as per_sample_grad_norms.
      in_dims (int | None | tuple): as per_sample_grad_norms.
      chunk_size (int | str | None): as per_sample_grad_norms.
      max_memory (int | None): as per_sample_grad_norms.
      max_norm (float | jax.Array): the clipping norm C (a positive number or a
        scalar array).
      reduction (str): 'sum' or 'mean' (divided by the batch size, after the
        noise is added, as DP-SGD does).
      noise_multiplier (float | None): sigma; adds N(0, (sigma * C)^2)
        independently to every coordinate of the summed clipped gradient. None
        or 0: no noise.
      key (jax.Array | None): the PRNG key for the noise (jax.random.key /
        PRNGKey), split into one key per differentiated leaf in pytree order;
        None draws from functx's stateful generator (functx.random.manual_seed).

    Returns:
      Callable: A function of loss's arguments returning the clipped gradient,
      with the structure of the differentiated argument(s).

    Raises:
      FunctxValueError: max_norm not positive and finite, noise_multiplier
        negative, a reduction other than 'sum' or 'mean', and the cases of
        per_sample_grad_norms.
      FunctxTypeError: max_norm or noise_multiplier not a number, and the
        cases of per_sample_grad_norms.

    Example:
      >>> g = functx.clipped_grad(loss, 1.0, in_dims=(None, 0, 0), reduction="mean",
      ...                         noise_multiplier=1.1, key=key)(params, xs, ys)
      >>> params = jax.tree_util.tree_map(lambda p, d: p - lr * d, params, g)
    """
    call0 = f"clipped_grad({_args.fn_name(loss)}, max_norm={max_norm!r})"
    _check_reduction(reduction, call0)
    _check_positive(max_norm, "max_norm", call0)
    if noise_multiplier is not None:
        _check_positive(noise_multiplier, "noise_multiplier", call0, allow_zero=True)
    setup = _make(loss, argnums, in_dims, chunk_size, "clipped_grad", max_memory)

    def weights(norms):
        c_ = fnp.asarray(max_norm, dtype=aval_of(norms).dtype)
        return c_ / fnp.maximum(norms, c_)  # = min(1, C / norm), 1 at norm 0

    @functools.wraps(loss)
    def clipped(*args, **kwargs):
        c, plan, chunk = setup(args, kwargs, weights)
        _, sums = _reduce(plan, c, chunk, weights)
        if noise_multiplier is not None and not (
                isinstance(noise_multiplier, (int, float)) and noise_multiplier == 0):
            sums = _add_noise(sums, max_norm, noise_multiplier, key)
        if reduction == "mean":
            sums = [s / c.size for s in sums]
        return c.unflatten(sums)

    return clipped


def _ones(norms):
    return None  # weighted_sums: a plain sum


def _add_noise(sums, max_norm, sigma, key):
    from .. import random as frandom

    if key is None:
        draws = [frandom.randn(*aval_of(s).shape, dtype=aval_of(s).dtype) for s in sums]
    else:
        keys = jax.random.split(key, len(sums))
        draws = [frandom.normal(k, aval_of(s).shape, aval_of(s).dtype) for k, s in zip(keys, sums)]
    return [s + (sigma * max_norm) * z for s, z in zip(sums, draws)]


def _check_reduction(reduction, call):
    if reduction not in _REDUCTIONS:
        raise FunctxValueError(
            f"{call}: reduction must be 'sum' or 'mean', got {reduction!r}. 'sum' adds the "
            "per-example gradients, 'mean' divides that sum by the batch size.")


def _check_positive(value, what, call, allow_zero=False):
    if isinstance(value, (bool, str)) or value is None:
        raise FunctxTypeError(
            f"{call}: {what} must be a number or a scalar array, got {type(value).__name__}. "
            f"Pass e.g. {what}=1.0.")
    if isinstance(value, (int, float, np.integer, np.floating)):
        if not (value > 0 or allow_zero and value == 0) or not np.isfinite(value):
            raise FunctxValueError(
                f"{call}: {what} must be {'non-negative' if allow_zero else 'positive'} and "
                f"finite, got {value!r}. Pass e.g. {what}=1.0.")


def ghost_plan(loss, argnums=0, in_dims=0):
    """What per_sample_grad_norms does with each differentiated leaf, in
    pytree order: the form of its ghost norm (NOTE [ghost norms]),
    'fallback' (its per-example gradient is materialised) or 'unused'.
    For tests and for checking a model's cost.

    Args:
      loss, argnums, in_dims: as per_sample_grad_norms.

    Returns:
      A function of loss's arguments returning the list of plans, one per
      differentiated floating-point leaf: 'outer', 'gram', 'materialise'
      (products), 'conv-outer', 'conv-gram' (convolution kernels), 'index',
      'index-sorted' (tables read by row gathers), 'fallback' or 'unused'.

    Raises:
      FunctxValueError, FunctxTypeError: as per_sample_grad_norms.

    Example:
      >>> functx.transforms.per_sample.ghost_plan(loss, in_dims=(None, 0, 0))(params, xs, ys)
    """
    setup = _make(loss, argnums, in_dims, None, "ghost_plan")

    def plan(*args, **kwargs):
        _, p, _ = setup(args, kwargs, None)
        return p.summary()

    return plan
