"""vmap: vectorizing map, with in_dims/out_dims pytrees, chunking and the
randomness modes of torch.func.vmap."""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from ..core import Tracer, aval_of, interpreter_stack, new_interpreter
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters.batching import AxisInfo, BatchInterpreter, BatchTracer
from ..primitives.collectives import named_vmap_running
from ..primitives import structural as st
from ..primitives.common import moveaxis
from . import _args

_RANDOMNESS = ("error", "different", "same")


def check_randomness(randomness, call):
    if not isinstance(randomness, str) or randomness not in _RANDOMNESS:
        raise FunctxValueError(
            f"{call}: randomness must be one of 'error', 'different' or 'same', got "
            f"{randomness!r}. Use 'different' for independent draws per batch element, "
            "'same' for one draw shared by the batch, 'error' to refuse random calls."
        )


def check_dims(dims, call, what):
    """in_dims / out_dims hold only ints and None, in tuples, lists and dicts
    (checked when the transform is built, before any value is seen)."""
    for d in tree_util.tree_leaves(dims, is_leaf=lambda x: x is None):
        if d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool)):
            continue
        raise FunctxTypeError(
            f"{call}: {what} entries must be an int or None, got {d!r}. Write {what} "
            f"with plain ints (e.g. {what}=0 or {what}=(0, None)); an array or a float is "
            "not a dimension."
        )


def _is_dim_leaf(x):
    return x is None or isinstance(x, (int, np.integer))


def broadcast_dims(prefix, tree, call, what):
    """Expand a pytree prefix of dims (ints/None) to one dim per leaf of
    `tree`."""
    per_leaf = []

    def expand(d, sub):
        if not _is_dim_leaf(d) or isinstance(d, bool):
            raise FunctxTypeError(
                f"{call}: {what} entries must be an int or None, got {d!r}. Give a "
                "dimension (e.g. 0) or None (not mapped) for each part."
            )
        per_leaf.append((d, len(tree_util.tree_leaves(sub))))
        return None

    try:
        tree_util.tree_map(expand, prefix, tree, is_leaf=_is_dim_leaf)
    except FunctxTypeError:
        raise
    except (ValueError, TypeError) as e:
        raise FunctxValueError(
            f"{call}: {what}={prefix!r} does not match the structure of the values "
            f"it describes ({_args.describe_tree(tree_util.tree_structure(tree))}). Give "
            "an int/None, or a pytree prefix of the values with an int/None per part."
        ) from e
    out = []
    for d, n in per_leaf:
        out.extend([d] * n)
    return out


def _in_dims_per_leaf(in_dims, args, call):
    if _is_dim_leaf(in_dims) and not isinstance(in_dims, bool):
        return broadcast_dims(in_dims, args, call, "in_dims")
    if not isinstance(in_dims, (tuple, list)):
        raise FunctxTypeError(
            f"{call}: in_dims must be an int, None, or a tuple with one entry per "
            f"positional argument, got {type(in_dims).__name__}. For example in_dims=0, "
            "or in_dims=(0, None) for two arguments."
        )
    if len(in_dims) != len(args):
        raise FunctxValueError(
            f"{call}: in_dims has {len(in_dims)} entries but the function got "
            f"{len(args)} positional argument{'s' if len(args) != 1 else ''}. Give one "
            "in_dims entry per positional argument (None for those not mapped)."
        )
    dims = []
    for i, (d, a) in enumerate(zip(in_dims, args)):
        dims.extend(broadcast_dims(d, a, call, f"in_dims[{i}]"))
    return dims


def _leaf_names(args):
    """A readable name for each leaf of the positional arguments."""
    names = []
    for i, a in enumerate(args):
        paths = tree_util.tree_flatten_with_path(a)[0]
        for path, _ in paths:
            names.append(f"argument {i}" + tree_util.keystr(path))
    return names


def _check_batched(leaves, dims, args, call):
    """Normalise in_dims and find the batch size; raise on bad dims or
    mismatched sizes (naming the leaves only then: `_leaf_names` walks every
    argument's paths, a cost each call would pay)."""
    size = None
    sizes = []
    norm = []
    for k, (x, d) in enumerate(zip(leaves, dims)):
        if d is None:
            norm.append(None)
            continue
        if not isinstance(x, (Tracer, np.ndarray, np.generic)) and not hasattr(x, "shape"):
            raise FunctxTypeError(
                f"{call}: in_dims={d} for {_leaf_names(args)[k]}, which is a "
                f"{type(x).__name__}, not an array. Use None in in_dims for non-array "
                "arguments."
            )
        shape = aval_of(x).shape
        nd = len(shape)
        if not -nd <= d < nd:
            raise FunctxValueError(
                f"{call}: in_dims={d} is out of range for {_leaf_names(args)[k]} of shape "
                f"{tuple(shape)}. Use a dimension in [{-nd}, {nd})"
                + (" or None: a 0-d value cannot be mapped." if nd == 0 else ".")
            )
        d = d % nd
        norm.append(d)
        n = shape[d]
        sizes.append((k, d, n))
        if size is None:
            size = n
    if size is None:
        raise FunctxValueError(
            f"{call}: no input is batched: no array has a batch dimension (in_dims is "
            "None for every argument, or the arguments it maps hold no arrays, e.g. an "
            "empty dict). Give at least one array argument a batch dimension (e.g. "
            "in_dims=0)."
        )
    if any(n != size for _, _, n in sizes):
        names = _leaf_names(args)
        detail = ", ".join(f"{names[k]} (in_dims={d}) has size {n}" for k, d, n in sizes)
        raise FunctxValueError(
            f"{call}: the mapped dimensions have different sizes: {detail}. Make them "
            "equal, or set in_dims=None for arguments that should not be mapped."
        )
    return norm, size


# NOTE [spmd axes]
# `vmap(f, spmd_axis_name='d')` maps the vmapped axis onto the mesh axis
# 'd' (or a tuple of mesh axes), as jax.vmap(spmd_axis_name=...) does:
# * the vmap's AxisInfo carries the names to every interpreter its rules
#   make, and JAX's batching rules of the primitives functx borrows
#   (NOTE [foreign primitives]: sharding_constraint, shard_map) are given
#   them, so a `jax.lax.with_sharding_constraint` inside `f`, or a
#   functx.jit with in_shardings / out_shardings (which constrains its
#   graph's inputs and outputs), is batched with the batch dimension split
#   over 'd', where an unnamed vmap leaves that dimension unconstrained;
# * the batched inputs and outputs of the vmap get a sharding constraint
#   splitting their batch dimension over 'd' (the other dimensions left
#   unconstrained), so that XLA's SPMD partitioner lays the whole batched
#   computation out along 'd'. The mesh is the one set by `jax.set_mesh`,
#   else that of an input's NamedSharding naming those axes; with no mesh
#   known (nothing is sharded) or a batch not divisible by the mesh axes'
#   size, these constraints are left out: they place values, never change
#   them.
# On one device (or eagerly on unsharded arrays) nothing changes.


def _spmd_names(spmd_axis_name, call):
    if spmd_axis_name is None:
        return None
    names = spmd_axis_name if isinstance(spmd_axis_name, tuple) else (spmd_axis_name,)
    if not names or not all(isinstance(n, str) for n in names):
        raise FunctxTypeError(
            f"{call}: spmd_axis_name must name a mesh axis (a str such as 'data') or a "
            f"non-empty tuple of them, got {spmd_axis_name!r}. Use the axis names of the "
            "jax.sharding.Mesh the batch is split over."
        )
    return names


def spmd_mesh(spmd, leaves, dims, call):
    """The mesh the batch is split over (NOTE [spmd axes]): jax.set_mesh's
    (its abstract mesh), else that of a batched input's NamedSharding
    naming the axes `spmd`; None when there is none."""
    from jax.sharding import NamedSharding

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = None
        for x, d in zip(leaves, dims):
            if d is None or isinstance(x, Tracer):
                continue
            try:
                sharding = x.sharding
            except Exception:  # noqa: BLE001 - a JAX tracer without one
                continue
            if (isinstance(sharding, NamedSharding)
                    and isinstance(sharding.mesh, jax.sharding.Mesh)  # not a traced abstract one
                    and all(a in sharding.mesh.axis_names for a in spmd)):
                mesh = sharding.mesh
                break
        if mesh is None:
            return None
    missing = [a for a in spmd if a not in mesh.axis_names]
    if missing:
        raise FunctxValueError(
            f"{call}: spmd_axis_name={spmd if len(spmd) > 1 else spmd[0]!r} names "
            f"{', '.join(map(repr, missing))}, which the mesh "
            f"{dict(zip(mesh.axis_names, mesh.axis_sizes))} does not have. Name one of its "
            "axes, or set the mesh that has it with jax.set_mesh(mesh)."
        )
    return mesh


def spmd_constrain(x, d, spmd, mesh):
    """`x` (batched at `d`) constrained to be split along `d` over the mesh
    axes `spmd`, its other dimensions unconstrained (NOTE [spmd axes])."""
    from jax.sharding import NamedSharding, PartitionSpec

    shape = aval_of(x).shape
    n = int(np.prod([mesh.shape[a] for a in spmd]))
    if n == 1 or shape[d] % n:
        return x
    free = PartitionSpec.UNCONSTRAINED
    spec = PartitionSpec(*([free] * d + [spmd if len(spmd) > 1 else spmd[0]]
                           + [free] * (len(shape) - d - 1)))
    if isinstance(mesh, jax.sharding.AbstractMesh):
        return jax.lax.with_sharding_constraint(x, spec)  # the context's mesh
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


@contextlib.contextmanager
def _named_axis(axis, size):
    """NOTE [named axes] (functx/primitives/collectives.py): while a named
    vmap runs, JAX's axis environment holds its name too, so JAX code that
    JAX traces inside it (a jax.jit function called on its values) may name
    the axis in collectives: its jaxpr's collectives are translated to
    functx's when replayed on functx values (NOTE [JAX collectives on
    functx values] in functx/interop.py, which counts the named vmaps
    running)."""
    if axis is None or axis.name is None:
        yield
        return
    if axis.chunk is not None:
        size = axis.chunk[1]
    try:
        from jax._src import core as jcore

        env = jcore.extend_axis_env_nd([(axis.name, size)])
    except (ImportError, AttributeError):  # another JAX layout
        env = contextlib.nullcontext()
    named_vmap_running(1)
    try:
        with env:
            yield
    finally:
        named_vmap_running(-1)


def _vmap_once(func, leaves, dims, in_tree, kwargs, size, randomness, out_dims, call,
               bases=None, axis=None):
    interp = BatchInterpreter(size, randomness, "vmap",
                              axis_name=None if axis is None else axis.name, axis=axis)
    bases = bases or [None] * len(leaves)
    mesh = None
    if axis is not None and axis.spmd is not None and axis.chunk is None:
        mesh = spmd_mesh(axis.spmd, leaves, dims, call)  # NOTE [spmd axes]
        if mesh is not None:
            leaves = [x if d is None else spmd_constrain(x, d, axis.spmd, mesh)
                      for x, d in zip(leaves, dims)]
    interp.queue.top_call("vmap", leaves)  # NOTE [speculative first program]
    with _named_axis(axis, size), new_interpreter(interp):
        boxed = [x if d is None else BatchTracer(interp, x, d, b)
                 for x, d, b in zip(leaves, dims, bases)]
        out = func(*tree_util.tree_unflatten(in_tree, boxed), **kwargs)
        out_flat, out_tree = _args.flatten_outputs(out, call)
        unboxed = [interp.unbox(o) for o in out_flat]
    if _is_dim_leaf(out_dims):
        flat_out_dims = [out_dims] * len(out_flat)
    elif isinstance(out_dims, tuple) and len(out_dims) == 1 and not isinstance(out, (tuple, list)):
        flat_out_dims = [out_dims[0]] * len(out_flat)
    else:
        flat_out_dims = broadcast_dims(out_dims, out, call, "out_dims")
    results = []
    for k, ((val, bd), od) in enumerate(zip(unboxed, flat_out_dims)):
        nd = aval_of(val).ndim + (bd is None)
        if od is None:
            if bd is not None:
                raise FunctxValueError(
                    f"{call}: out_dims is None for output {k}, but that output depends "
                    "on the batched inputs. Give it an out_dims entry (e.g. 0), or make "
                    "it independent of the mapped arguments."
                )
            results.append(val)
            continue
        if not -nd <= od < nd:
            raise FunctxValueError(
                f"{call}: out_dims={od} is out of range for output {k} of shape "
                f"{tuple(aval_of(val).shape if bd is None else aval_of(val).shape[:bd] + aval_of(val).shape[bd + 1:])}"
                f" (a batched output has {nd} dimensions). Use a dimension in [{-nd}, {nd})."
            )
        od = od % nd
        if bd is None:
            shape = list(aval_of(val).shape)
            kept = tuple(i for i in range(nd) if i != od)
            shape.insert(od, size)
            out = st.broadcast_in_dim(val, tuple(shape), kept)
        else:
            out = moveaxis(val, bd, od)
        if mesh is not None:
            out = spmd_constrain(out, od, axis.spmd, mesh)
        results.append(out)
    return results, out_tree, flat_out_dims


def map_over_basis(func, basis, starts, call, out_dims=0, randomness="error", chunk_size=None):
    """`vmap(func, chunk_size=chunk_size)(*basis)` where each leaf of
    `basis` holds rows of the identity, leaf k's row i being the unit vector
    at flat position `i - starts[k]`: the batched inputs carry that fact for
    the primitives that use it (NOTE [identity bases] in
    interpreters/batching.py), in every chunk (inside a loop under jit, with
    offsets known when the loop runs)."""
    leaves = list(basis)
    size = aval_of(leaves[0]).shape[0]
    return _vmap_chunked(func, leaves, [0] * len(leaves), tree_util.tree_structure(tuple(leaves)),
                         {}, size, randomness, out_dims, call, chunk_size, list(starts))


def _vmap_chunked(func, leaves, dims, in_tree, kwargs, size, randomness, out_dims, call,
                  chunk_size, starts=None, axis=None):
    """vmap of `func` over `leaves`, in chunks when `chunk_size` is smaller
    than the batch: a `lax.map` loop while JAX traces with no functx
    transform around, else a Python loop. `starts`: see map_over_basis.
    `axis`: the AxisInfo of a named or spmd vmap. A named vmap's chunks
    run in the Python loop, each knowing its first index and the whole
    batch's size (`AxisInfo.chunk`): axis_index, axis_size and the
    reductions of values the same in every element are defined there, the
    collectives that need the whole batch raise (collectives.py)."""
    if chunk_size is None or chunk_size >= size:
        outs, out_tree, _ = _vmap_once(func, leaves, dims, in_tree, kwargs, size, randomness,
                                       out_dims, call, bases=starts, axis=axis)
        return tree_util.tree_unflatten(out_tree, outs)
    if axis is not None:
        return _chunks_in_python(func, leaves, dims, in_tree, kwargs, size, chunk_size,
                                 randomness, out_dims, call, starts, axis)
    if randomness == "error" and not interpreter_stack() and _jax_is_tracing(leaves):
        return _chunks_as_loop(func, leaves, dims, in_tree, kwargs, size, chunk_size, out_dims,
                               call, starts)
    return _chunks_in_python(func, leaves, dims, in_tree, kwargs, size, chunk_size, randomness,
                             out_dims, call, starts)


def _slice_along(x, d, start, stop):
    shape = aval_of(x).shape
    lo = [0] * len(shape)
    hi = list(shape)
    lo[d], hi[d] = start, stop
    return st.slice(x, lo, hi)


def _jax_is_tracing(leaves):
    try:
        from jax._src import core as jcore

        return not jcore.trace_ctx.is_top_level()
    except (ImportError, AttributeError):  # other JAX layouts: look at the inputs
        return any(isinstance(x, jax.core.Tracer) for x in leaves)


def _chunks_as_loop(func, leaves, dims, in_tree, kwargs, size, chunk_size, out_dims, call,
                    starts=None):
    """Chunked vmap while JAX traces (under jit), with no functx transform
    around: the chunks become the iterations of a `jax.lax.map` loop, so
    XLA keeps one chunk's intermediates alive at a time (a Python loop of
    chunks would be unrolled into one program that may hold them all). A
    last partial chunk runs after the loop. With `starts`, the batched
    leaves are identity bases (`map_over_basis`), and each iteration's
    offsets are its first row's index subtracted from them."""
    n_loop = size // chunk_size
    batched = [k for k, d in enumerate(dims) if d is not None]
    stacked = []
    for k in batched:
        x = jnp.moveaxis(leaves[k], dims[k], 0)[:n_loop * chunk_size]
        stacked.append(x.reshape((n_loop, chunk_size) + x.shape[1:]))
    front = [None if d is None else 0 for d in dims]
    meta = []

    def body(step):
        first, chunk = step
        part = list(leaves)
        for k, x in zip(batched, chunk):
            part[k] = x
        bases = None if starts is None else [s - first for s in starts]
        outs, out_tree, flat_out_dims = _vmap_once(func, part, front, in_tree, kwargs,
                                                   chunk_size, "error", out_dims, call, bases)
        meta[:] = [out_tree, flat_out_dims]
        return outs

    firsts = jnp.arange(n_loop, dtype=jnp.int32) * chunk_size
    looped = jax.lax.map(body, (firsts, stacked))
    out_tree, flat_out_dims = meta
    outs = []
    for y, od in zip(looped, flat_out_dims):
        if od is None:
            outs.append(y[0])
            continue
        od = od % (y.ndim - 1)
        y = jnp.moveaxis(y, 0, od)
        outs.append(y.reshape(y.shape[:od] + (n_loop * chunk_size,) + y.shape[od + 2:]))
    if n_loop * chunk_size < size:
        part = [x if d is None else _slice_along(x, d, n_loop * chunk_size, size)
                for x, d in zip(leaves, dims)]
        first = n_loop * chunk_size
        tail, _, _ = _vmap_once(func, part, dims, in_tree, kwargs, size - first, "error",
                                out_dims, call, None if starts is None else [s - first for s in starts])
        outs = [o if od is None else jnp.concatenate([o, t], od % o.ndim)
                for o, t, od in zip(outs, tail, flat_out_dims)]
    return tree_util.tree_unflatten(out_tree, outs)


def _chunks_in_python(func, leaves, dims, in_tree, kwargs, size, chunk_size, randomness,
                      out_dims, call, starts=None, axis=None):
    """Chunked vmap as a Python loop of chunks (eagerly, or under a functx
    transform). With `starts`, the batched leaves are identity bases
    (`map_over_basis`); chunk [lo, hi) of leaf k starts at `starts[k] - lo`."""
    eager = not interpreter_stack() and all(
        not isinstance(x, (Tracer, jax.core.Tracer)) for x in leaves)
    chunks = []
    for start in range(0, size, chunk_size):
        stop = min(start + chunk_size, size)
        part = [x if d is None else _slice_along(x, d, start, stop) for x, d in zip(leaves, dims)]
        bases = None if starts is None else [s - start for s in starts]
        chunk_axis = None if axis is None else axis._replace(chunk=(start, size))
        chunks.append(_vmap_once(func, part, dims, in_tree, kwargs, stop - start,
                                 randomness, out_dims, call, bases=bases, axis=chunk_axis))
        if eager:
            # JAX dispatches asynchronously (on GPU the Python loop runs
            # ahead of the device) and frees a chunk's temporaries only
            # once its kernels finish: wait, so chunks do not overlap
            jax.block_until_ready(chunks[-1][0])
    out_tree, flat_out_dims = chunks[0][1], chunks[0][2]
    outs = []
    for k, od in enumerate(flat_out_dims):
        pieces = [c[0][k] for c in chunks]
        if od is None:
            outs.append(pieces[0])
        else:
            nd = aval_of(pieces[0]).ndim
            outs.append(st.concatenate(pieces, od % nd))
    return tree_util.tree_unflatten(out_tree, outs)


def _check_axis_name(axis_name, call, what="axis_name"):
    if axis_name is None:
        return
    try:
        hash(axis_name)
    except TypeError:
        raise FunctxTypeError(
            f"{call}: {what} must be hashable (a string such as 'batch'), got "
            f"{type(axis_name).__name__}."
        ) from None
    if isinstance(axis_name, (int, np.integer)) or isinstance(axis_name, tuple):
        raise FunctxTypeError(
            f"{call}: {what}={axis_name!r} cannot name a vmap axis: ints are positional "
            "axes and tuples list several names in collectives. Use a string such as "
            "'batch'."
        )


def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None, axis_name=None,
         spmd_axis_name=None, max_memory=None):
    """Vectorizing map: run `func` on every slice of its inputs along a
    batch dimension, as one batched computation.

    Args:
      func (Callable): a function of arrays (pytrees allowed).
      in_dims (int | None | tuple): the batch dimension of each input: an int or
        None for all positional arguments, or a tuple with one entry per
        positional argument, each an int, None (not mapped) or a pytree prefix
        of that argument. Negative dimensions count from the end. Keyword
        arguments are never mapped.
      out_dims (int | None | tuple | list | dict): where the batch dimension
        goes in each output: an int, None (output must not depend on the batch)
        or a pytree prefix.
      randomness (str): how functx's stateful random functions
        (functx.random.rand, ..., functx.nn.dropout) behave inside: 'error'
        (raise), 'different' (independent draws per batch element) or 'same'
        (one draw shared).
      chunk_size (int | str | None): evaluate the batch in chunks of this size
        (bounded memory, same result); 'auto' (with max_memory) picks the
        largest chunk whose estimated peak memory fits (NOTE [memory model] in
        functx/memory.py).
      axis_name (Hashable | None): a hashable name (e.g. 'batch') for the mapped
        axis, which the collectives of functx.lax (psum, pmean, pmax, pmin,
        axis_index, axis_size, all_gather, psum_scatter, ppermute, all_to_all)
        and JAX's (jax.lax.psum, ... called on functx values, e.g. by Equinox's
        BatchNorm) reduce over, as in `jax.vmap(..., axis_name=...)`. With
        chunk_size, only axis_index, axis_size and reductions of values the same
        in every element are defined (the others raise ChunkedCollectiveError).
      spmd_axis_name (str | tuple[str, ...] | None): a mesh axis name (or tuple
        of them) the mapped axis is split over, as in `jax.vmap(...,
        spmd_axis_name=...)`: sharding constraints inside `func` (and functx.jit
        shardings) are batched with the batch dimension on that mesh axis, and
        the batched inputs and outputs are constrained to be split along it
        (NOTE [spmd axes] in functx/transforms/vmap.py). Results are unchanged.
      max_memory (int | None): the memory budget in bytes for chunk_size='auto'.

    Returns:
      Callable: The batched function.

    Example:
      >>> per_sample_grads = functx.vmap(functx.grad(loss), in_dims=(None, 0, 0))
      >>> batched_jacobians = functx.vmap(functx.jacrev(f))(xs)
    """
    _args.check_callable(func, "vmap")
    _check_axis_name(axis_name, f"vmap({_args.fn_name(func)}, axis_name={axis_name!r})")
    spmd = _spmd_names(spmd_axis_name,
                       f"vmap({_args.fn_name(func)}, spmd_axis_name={spmd_axis_name!r})")
    axis = None if axis_name is None and spmd is None else AxisInfo(axis_name, spmd, None)
    check_randomness(randomness, f"vmap({_args.fn_name(func)}, randomness={randomness!r})")
    check_dims(in_dims, f"vmap({_args.fn_name(func)}, in_dims={in_dims!r})", "in_dims")
    check_dims(out_dims, f"vmap({_args.fn_name(func)}, out_dims={out_dims!r})", "out_dims")
    if chunk_size == "auto" or max_memory is not None:
        from ..memory import check_auto_chunk

        check_auto_chunk(chunk_size, max_memory, f"vmap({_args.fn_name(func)}, chunk_size="
                         f"{chunk_size!r}, max_memory={max_memory!r})")
    elif chunk_size is not None and (
        not isinstance(chunk_size, (int, np.integer)) or isinstance(chunk_size, bool) or chunk_size < 1
    ):
        raise FunctxValueError(
            f"vmap({_args.fn_name(func)}, chunk_size={chunk_size!r}): chunk_size must be "
            "None or a positive int. Pass None to map the whole batch at once, or the "
            "number of elements per chunk (e.g. 8)."
        )

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        call = f"vmap({_args.fn_name(func)}, in_dims={in_dims!r}, out_dims={out_dims!r})(*args)"
        dims = _in_dims_per_leaf(in_dims, args, call)
        leaves, in_tree = tree_util.tree_flatten(args)
        dims, size = _check_batched(leaves, dims, args, call)
        try:
            leaves = [x if d is None else _args.as_array(x, call, "a mapped argument")
                      for x, d in zip(leaves, dims)]
        except FunctxTypeError:  # raise it again naming the leaf
            for x, d, name in zip(leaves, dims, _leaf_names(args)):
                if d is not None:
                    _args.as_array(x, call, name)
            raise
        chunk = chunk_size
        if chunk == "auto":
            from ..memory import vmap_chunk_size

            chunk = vmap_chunk_size(func, leaves, dims, in_tree, kwargs, size, randomness,
                                    out_dims, call, max_memory, axis)
        return _vmap_chunked(func, leaves, dims, in_tree, kwargs, size, randomness, out_dims,
                             call, chunk, axis=axis)

    return wrapped
