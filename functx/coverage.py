"""Which JAX primitives functx can transform: `python -m functx.coverage`.

Traces every public function of the JAX numerical namespaces, of `jax.lax`
and of top-level `jax` (transforms are applied to a small function, then
called) on representative inputs, collects the primitives their jaxprs emit
(inside sub-programs too), and reports for each whether functx has its
rules:

  eval     an evaluation (lowering onto JAX)
  jvp      a jvp rule
  reverse  reverse mode: a jvp rule, and a transpose rule if the primitive
           is linear (JAX has a transpose rule for it); or an explicit
           statement that reverse mode is impossible (e.g. `while`),
           listed with its reason
  batch    a batching rule

Equations that lifting inlines (jit, closed_call, remat) or translates
(control flow, custom rules; `functx.lifting.LIFT_RULES`) count through the
primitive they become. A primitive without operands (iota) is never
differentiated or batched: only its evaluation counts.

Each function is called with the arguments of its entry in OVERRIDES, else
with the first of the generic CANDIDATES that traces. Functions that cannot
be staged at all (printing, file I/O, results of data-dependent shape,
metadata such as `shape` or `result_type`) are listed in NOT_TRACEABLE with
the reason; they are not counted as traced or as failures. Functions are
traced with a named axis "i" of size 2 bound, so the collectives of
`jax.lax` show their primitives; those, and the other primitives functx
leaves to later work (EXCLUDED), are listed with the reason.

Usage:
  python -m functx.coverage            summary per namespace
  python -m functx.coverage --missing  also every primitive lacking a rule,
                                       with functions that emit it
  python -m functx.coverage --verbose  also the functions not traced, and why
"""

import argparse
import inspect
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore

NAMESPACES = {
    "jax.numpy": jnp,
    "jax.numpy.linalg": jnp.linalg,
    "jax.numpy.fft": jnp.fft,
    "jax.nn": jax.nn,
    "jax.scipy.special": jax.scipy.special,
    "jax.random": jax.random,
}
# Inventoried for the primitives they emit beyond the numerical namespaces
# (their functions have no records in the public-function sweep,
# tests/op_table_public.py, which covers NAMESPACES).
EXTRA_NAMESPACES = {
    "jax.lax": jax.lax,
    "jax": jax,
}
ALL_NAMESPACES = {**NAMESPACES, **EXTRA_NAMESPACES}

# Primitives that are no part of a numerical program's derivative: they
# appear in traces but carry no data dependence functx must transform.
IGNORED = {
    "pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "composite",
}

# Statements of what cannot exist, with the reason (primitive -> {mode: why}).
_CUDNN_ONLY = ("cuDNN's block-scaled matmul (jax.nn.scaled_matmul): JAX runs it only on "
               "NVIDIA GPUs and defines no derivative or batching rule for it")
IMPOSSIBLE = {
    "while": {"reverse": "reverse mode needs the trip count: use functx.lax.scan "
                         "or fori_loop with static bounds"},
    "scaled_matmul_wrapper": {m: _CUDNN_ONLY for m in ("eval", "jvp", "reverse", "batch")},
    "pure_callback": {m: "a Python callback has no derivative (JAX defines none either): "
                         "give it one with functx.custom_jvp / custom_vjp"
                      for m in ("jvp", "reverse")},
    "scaled_dot": {m: "JAX defines no derivative for the block-scaled product "
                      "(lax.scaled_dot)" for m in ("jvp", "reverse")},
    "reduce_window": {"reverse": "a custom computation has no transpose (JAX has none "
                                 "either); add / max / min with their identity are "
                                 "recognised as reduce_window_sum / max / min"},
}

# Primitives functx leaves to later work (primitive -> why).
_NAMED = ("collective over a named axis that functx.vmap's named axes do not produce "
          "(shard_map / mesh collectives: issue 18's sharding items)")
_SHARDING = "sharding and device layout (SPEC 7): a later issue"
_STATE = ("mutable array references (jax.new_ref): state, not a function of values; "
          "functx transforms pure functions")
_TOKEN = "ordering tokens for side effects: no array computation to transform"
EXCLUDED = {
    **{p: _NAMED for p in (
        "all_gather_invariant", "pbroadcast", "pcast", "pvary", "psum_invariant",
        "ragged_all_to_all", "psend", "precv", "pshuffle", "pswapaxes")},
    "sharding_constraint": _SHARDING, "reshard": _SHARDING, "mesh_cast": _SHARDING,
    **{p: _STATE for p in ("new_ref", "mutable_array", "empty_ref", "freeze", "free_ref",
                           "get", "swap", "addupdate")},
    "rng_uniform": ("XLA's stateful uniform RNG (lax.rng_uniform, which JAX may remove): JAX "
                    "defines no derivative or batching rule; draw with jax.random"),
    "create_token": _TOKEN, "after_all": _TOKEN,
}

# Primitives functx runs as foreign primitives, with the rules JAX has for
# them (functx/primitives/foreign.py), by design (primitive -> why).
BORROWED = {
    "call_hi_primitive": (
        "JAX's rules (primitives/foreign.py): jax 0.11+'s high-level primitives "
        "(jnp.nonzero, searchsorted, ldexp, frexp, lax.custom_root, ...) carry their own "
        "jvp, vjp and batching rules; reverse mode transposes by JAX's vjp"),
}

_PRINTING = "printing: formats concrete values on the host"
_IO = "host I/O: reads or writes files, buffers or foreign arrays"
_META = "metadata: returns shapes, dtypes or Python values, no array computation"
_DATA_SHAPE = "data-dependent output shape (has no size= argument)"

# namespace -> {function: why it cannot be staged into a jaxpr}
NOT_TRACEABLE = {
    "jax.numpy": {
        "array_repr": _PRINTING, "array_str": _PRINTING, "get_printoptions": _PRINTING,
        "printoptions": _PRINTING, "set_printoptions": _PRINTING,
        "save": _IO, "savez": _IO, "load": _IO, "fromfile": _IO, "frombuffer": _IO,
        "fromstring": _IO, "fromiter": _IO, "from_dlpack": _IO,
        "trim_zeros": _DATA_SHAPE,
        "mask_indices": _DATA_SHAPE + ": calls nonzero on the mask",
        "broadcast_shapes": _META, "can_cast": _META, "promote_types": _META,
        "result_type": _META, "isdtype": _META, "issubdtype": _META, "iterable": _META,
        "isscalar": _META, "iscomplexobj": _META, "isrealobj": _META, "ndim": _META,
        "shape": _META, "size": _META,
        "einsum_path": _META + " (a contraction plan)",
    },
    "jax.nn": {"get_scaled_dot_general_config": _META + " (a configuration object)"},
    "jax.random": {"key_impl": _META, "key_dtype": _META},
    "jax.lax": {
        **{n: _META for n in (
            "broadcast_shapes", "conv_dimension_numbers", "conv_general_permutations",
            "conv_general_shape_tuple", "conv_shape_tuple", "conv_transpose_shape_tuple",
            "padtype_to_pads", "reduce_window_shape_tuple", "dtype", "axis_size")},
        "pcast": "needs a shard_map context: named axes are a later issue",
    },
}
# Functions named in NOT_TRACEABLE or OVERRIDES that some JAX release functx
# supports does not have (namespace -> {function: the releases that have it});
# tests/test_coverage.py checks that every other name there is a public
# function of the JAX installed.
NOT_IN_EVERY_RELEASE = {
    "jax.lax": {"psend": "jax 0.10 and 0.11, not 0.12", "precv": "jax 0.10 and 0.11, not 0.12"},
    "jax.scipy.special": {"bessel_jn": "deprecated in jax 0.12.1, which adds jn"},
}
_CONFIG = "configuration: a flag or context manager, no computation"
_RUNTIME = "runtime: devices, processes, caches or compilation, no computation"
_NAMED_MAP = "maps over devices or a mesh: named axes and sharding are a later issue"
NOT_TRACEABLE["jax"] = {
    **{n: _CONFIG for n in (
        "allow_f16_reductions", "array_garbage_collection_guard", "auto_pcast",
        "check_tracer_leaks", "checking_leaks", "debug_infs", "debug_key_reuse", "debug_nans",
        "default_device", "default_matmul_precision", "default_prng_impl", "disable_jit",
        "enable_checks", "enable_custom_prng", "enable_x64", "ensure_compile_time_eval",
        "explain_cache_misses", "jax2tf_associative_scan_reductions", "legacy_prng_key",
        "log_compiles", "make_user_context", "named_scope", "no_execution", "no_tracing",
        "numpy_dtype_promotion", "numpy_rank_promotion", "remove_size_one_mesh_axis_from_type",
        "softmax_custom_jvp", "thread_guard", "threefry_partitionable", "transfer_guard",
        "transfer_guard_device_to_device", "transfer_guard_device_to_host",
        "transfer_guard_host_to_device")},
    **{n: _RUNTIME for n in (
        "clear_caches", "default_backend", "device_count", "devices", "effects_barrier",
        "host_count", "host_id", "host_ids", "live_arrays", "local_device_count",
        "local_devices", "make_mesh", "print_environment_info", "process_count",
        "process_index", "process_indices")},
    **{n: _IO for n in ("copy_to_host_async", "device_get", "make_array_from_callback",
                        "make_array_from_process_local_data",
                        "make_array_from_single_device_arrays")},
    **{n: _META for n in ("ds", "eval_shape", "make_jaxpr", "typeof")},
    **{n: _NAMED_MAP for n in ("pmap", "shard_map", "smap")},
    "reshard": "needs a mesh: sharding is a later issue (SPEC 7)",
}


class _Arrays(types.SimpleNamespace):
    """The representative inputs, as traced values (attributes)."""


def _representatives():
    """name -> array. Small, in every function's usual domain: `m` is
    symmetric positive definite (fine for solve, cholesky, eigh, log)."""
    rng = np.random.default_rng(0)
    a = rng.uniform(0.2, 0.8, (3, 3))
    return {
        "v": rng.uniform(0.2, 0.8, (3,)).astype(np.float32),
        "m": (a @ a.T + 3 * np.eye(3)).astype(np.float32),
        "x24": rng.uniform(0.2, 0.8, (2, 4)).astype(np.float32),
        "x3d": rng.uniform(0.2, 0.8, (2, 2, 2)).astype(np.float32),
        "s": np.float32(0.5),
        "i": np.array([1, 2, 0], np.int32),
        "im": np.array([[1, 2, 0], [0, 1, 2], [2, 0, 1]], np.int32),
        "b": np.array([True, False, True]),
        "u8": np.array([3, 250, 17], np.uint8),
        "c": (rng.uniform(0.2, 0.8, (3,)) + 1j * rng.uniform(0.2, 0.8, (3,))).astype(np.complex64),
        "p": np.array([0.2, 0.3, 0.5], np.float32),
        "key": jax.random.key(0),
        "raw_key": jax.random.PRNGKey(0),
    }


# Generic calls, tried in order until one traces: `f` is the function, `a`
# the representative arrays.
CANDIDATES = [
    lambda f, a: f(a.m), lambda f, a: f(a.v), lambda f, a: f(a.m, a.m), lambda f, a: f(a.v, a.v),
    lambda f, a: f(a.m, a.v), lambda f, a: f(a.v, a.v, a.v), lambda f, a: f(a.m, a.m, a.m),
    lambda f, a: f(a.i), lambda f, a: f(a.i, a.i), lambda f, a: f(a.v, 2),
    lambda f, a: f(a.m, 1), lambda f, a: f(a.v, a.i), lambda f, a: f(a.key),
    lambda f, a: f(a.key, (3,)), lambda f, a: f(a.key, a.v), lambda f, a: f(a.key, a.v, a.v),
    lambda f, a: f(a.key, 2), lambda f, a: f(a.key, a.v, (3,)), lambda f, a: f(a.key, 0.5, (3,)),
    lambda f, a: f(a.key, 2.0, 3.0, (3,)), lambda f, a: f(a.raw_key), lambda f, a: f(3),
]

# namespace -> {function: call}, where the generic calls fail or would only
# exercise a degenerate path (real-valued input to a complex function).
_C = lambda f, a: f(a.c)  # noqa: E731
OVERRIDES = {
    "jax.numpy": {
        "apply_along_axis": lambda f, a: f(lambda r: r * r.sum(), 0, a.m),
        "apply_over_axes": lambda f, a: f(jnp.sum, a.x3d, [0, 2]),
        "arange": lambda f, a: f(3),
        "argpartition": lambda f, a: f(a.v, 1),
        "argwhere": lambda f, a: f(a.i, size=3),
        "array_split": lambda f, a: f(a.v, 2),
        "astype": lambda f, a: f(a.v, jnp.int32),
        "bartlett": lambda f, a: f(4), "blackman": lambda f, a: f(4),
        "hamming": lambda f, a: f(4), "hanning": lambda f, a: f(4),
        "kaiser": lambda f, a: f(4, a.s),
        "bincount": lambda f, a: f(a.i, a.v, length=3),
        "broadcast_to": lambda f, a: f(a.v, (2, 3)),
        "choose": lambda f, a: f(a.i % 2, [a.v, a.v], mode="clip"),
        "compress": lambda f, a: f(a.b, a.v, size=3),
        "delete": lambda f, a: f(a.v, 1),
        "diag_indices": lambda f, a: f(3),
        "dsplit": lambda f, a: f(a.x3d, 2),
        "einsum": lambda f, a: f("ij,jk->ik", a.m, a.m),
        "empty": lambda f, a: f((3,)), "ones": lambda f, a: f((3,)), "zeros": lambda f, a: f((3,)),
        "eye": lambda f, a: f(3), "identity": lambda f, a: f(3), "tri": lambda f, a: f(3),
        "expand_dims": lambda f, a: f(a.v, 0),
        "extract": lambda f, a: f(a.b, a.v, size=3),
        "fill_diagonal": lambda f, a: f(a.m, a.s, inplace=False),
        "flatnonzero": lambda f, a: f(a.i, size=3),
        "fromfunction": lambda f, a: f(lambda i, j: i + j, (2, 2)),
        "frompyfunc": lambda f, a: f(jnp.add, 2, 1)(a.v, a.v),
        "full": lambda f, a: f((3,), a.s),
        "hsplit": lambda f, a: f(a.m, 3), "vsplit": lambda f, a: f(a.m, 3),
        "split": lambda f, a: f(a.v, 3),
        "indices": lambda f, a: f((2, 3)),
        "insert": lambda f, a: f(a.v, 1, a.s),
        "intersect1d": lambda f, a: f(a.i, a.i, size=3, fill_value=0),
        "setdiff1d": lambda f, a: f(a.i, a.i, size=3, fill_value=0),
        "setxor1d": lambda f, a: f(a.i, a.i, size=3, fill_value=0),
        "union1d": lambda f, a: f(a.i, a.i, size=3, fill_value=0),
        "unique": lambda f, a: f(a.v, size=3, fill_value=0),
        "unique_all": lambda f, a: f(a.v, size=3, fill_value=0),
        "unique_counts": lambda f, a: f(a.v, size=3, fill_value=0),
        "unique_inverse": lambda f, a: f(a.v, size=3, fill_value=0),
        "unique_values": lambda f, a: f(a.v, size=3, fill_value=0),
        "moveaxis": lambda f, a: f(a.x3d, 0, 2),
        "rollaxis": lambda f, a: f(a.x3d, 2),
        "swapaxes": lambda f, a: f(a.m, 0, 1),
        "permute_dims": lambda f, a: f(a.x3d, (2, 0, 1)),
        "nonzero": lambda f, a: f(a.i, size=3),
        "pad": lambda f, a: f(a.m, 1),
        "partition": lambda f, a: f(a.v, 1),
        "place": lambda f, a: f(a.v, a.b, a.v, inplace=False),
        "polyfit": lambda f, a: f(a.v, a.v, 1),
        "put": lambda f, a: f(a.v, a.i, a.v, inplace=False),
        "put_along_axis": lambda f, a: f(a.m, a.im, a.m, axis=1, inplace=False),
        "ravel_multi_index": lambda f, a: f((a.i, a.i), (3, 3), mode="clip"),
        "repeat": lambda f, a: f(a.v, 2),
        "reshape": lambda f, a: f(a.m, (9,)),
        "resize": lambda f, a: f(a.v, (2, 3)),
        "tile": lambda f, a: f(a.v, 2),
        "tril_indices": lambda f, a: f(3), "triu_indices": lambda f, a: f(3),
        "unpackbits": lambda f, a: f(a.u8),
        "vectorize": lambda f, a: f(jnp.sin)(a.v),
        # complex arguments
        "real": _C, "imag": _C, "conj": _C, "conjugate": _C, "angle": _C, "iscomplex": _C,
        "isreal": _C, "sort_complex": _C,
    },
    "jax.numpy.linalg": {
        "matrix_power": lambda f, a: f(a.m, 3),
        "multi_dot": lambda f, a: f([a.m, a.m, a.m]),
    },
    "jax.numpy.fft": {
        "fftfreq": lambda f, a: f(4), "rfftfreq": lambda f, a: f(4),
        "ifft": _C, "ifft2": lambda f, a: f(a.c.reshape(1, 3)),
        "ifftn": _C, "hfft": _C, "irfft": _C, "irfft2": lambda f, a: f(a.c.reshape(1, 3)),
        "irfftn": _C,
    },
    "jax.nn": {
        "glu": lambda f, a: f(a.x24),
        "one_hot": lambda f, a: f(a.i, 3),
        "scaled_matmul": lambda f, a: f(
            jnp.ones((1, 32, 64), jnp.float32), jnp.ones((1, 16, 64), jnp.float32),
            jnp.ones((1, 32, 2), jnp.float32), jnp.ones((1, 16, 2), jnp.float32)),
        "scaled_dot_general": lambda f, a: f(a.m, a.m, (((1,), (0,)), ((), ()))),
    },
    "jax.scipy.special": {
        "bernoulli": lambda f, a: f(4),
        "bessel_jn": lambda f, a: f(a.v, v=1),
        "hyp2f1": lambda f, a: f(a.v, a.v, a.v + 1, a.v * 0.5),
        "multigammaln": lambda f, a: f(a.v + 2, 2),
        "sph_harm_y": lambda f, a: f(a.i, a.i % 2, a.v, a.v, n_max=2),
        "wofz": _C,
    },
    "jax.random": {
        "ball": lambda f, a: f(a.key, 2),
        "multinomial": lambda f, a: f(a.key, 5.0, a.p),
        "multivariate_normal": lambda f, a: f(a.key, a.v, a.m),
        "orthogonal": lambda f, a: f(a.key, 3),
        "randint": lambda f, a: f(a.key, (3,), 0, 5),
        "triangular": lambda f, a: f(a.key, 0.0, 0.5, 1.0),
    },
}


def _lhs(a):
    return a.m.reshape(1, 1, 3, 3)


def _rhs(a):
    return a.m[:2, :2].reshape(1, 1, 2, 2)


def _argmax_computation(x, y):
    take = x[0] >= y[0]
    return jnp.where(take, x[0], y[0]), jnp.where(take, x[1], y[1])


_SCATTER = jax.lax.ScatterDimensionNumbers(
    update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
_GATHER = jax.lax.GatherDimensionNumbers(
    offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
_scatter = lambda f, a: f(a.v, a.i[:, None], a.v, _SCATTER)  # noqa: E731
_reduce_over_0 = lambda f, a: f(a.m, (0,))  # noqa: E731
_bool_reduce = lambda f, a: f(a.b, (0,))  # noqa: E731
_collective = lambda f, a: f(a.v, "i")  # noqa: E731

OVERRIDES["jax.lax"] = {
    "after_all": lambda f, a: f(jax.lax.create_token(), jax.lax.create_token()),
    "all_gather": _collective, "pmax": _collective, "pmean": _collective,
    "pmin": _collective, "psum": _collective,
    "psum_scatter": lambda f, a: f(a.x24, "i"),
    "all_to_all": lambda f, a: f(a.x24, "i", 0, 0),
    "axis_index": lambda f, a: f("i"),
    "pbroadcast": lambda f, a: f(a.v, "i", 0),
    "pcast": lambda f, a: f(a.v, "i", to="varying"),
    "ppermute": lambda f, a: f(a.v, "i", [(0, 1), (1, 0)]),
    "pshuffle": lambda f, a: f(a.v, "i", [1, 0]),
    "pswapaxes": lambda f, a: f(a.x24, "i", 0),
    "psend": lambda f, a: f(a.v, "i", [(0, 1)]),
    "precv": lambda f, a: f(jax.lax.create_token(), jax.ShapeDtypeStruct((3,), jnp.float32),
                            "i", [(0, 1)]),
    "ragged_all_to_all": lambda f, a: f(
        a.v, jnp.zeros(3), jnp.array([0, 1], jnp.int32), jnp.array([1, 2], jnp.int32),
        jnp.array([0, 1], jnp.int32), jnp.array([1, 2], jnp.int32), axis_name="i"),
    "argmax": lambda f, a: f(a.m, 0, np.int32), "argmin": lambda f, a: f(a.m, 0, np.int32),
    "associative_scan": lambda f, a: f(jax.lax.add, a.v),
    "bitcast_convert_type": lambda f, a: f(a.v, jnp.int32),
    "broadcast_in_dim": lambda f, a: f(a.v, (2, 3), (1,)),
    "broadcasted_iota": lambda f, a: f(jnp.int32, (2, 3), 1),
    "composite": lambda f, a: f(lambda x: jnp.sin(x) * 2, "functx.coverage_op")(a.v),
    "concatenate": lambda f, a: f([a.v, a.v], 0),
    "cond": lambda f, a: f(a.s > 0, jnp.sin, jnp.cos, a.v),
    "conv": lambda f, a: f(_lhs(a), _rhs(a), (1, 1), "VALID"),
    "conv_general_dilated": lambda f, a: f(_lhs(a), _rhs(a), (1, 1), "VALID"),
    "conv_general_dilated_local": lambda f, a: f(
        _lhs(a), jnp.ones((1, 4, 2, 2), jnp.float32), (1, 1), "VALID", (2, 2)),
    "conv_general_dilated_patches": lambda f, a: f(_lhs(a), (2, 2), (1, 1), "VALID"),
    "conv_transpose": lambda f, a: f(_lhs(a), _rhs(a), (1, 1), "VALID",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW")),
    "conv_with_general_padding": lambda f, a: f(_lhs(a), _rhs(a), (1, 1), ((0, 0), (0, 0)),
                                                (1, 1), (1, 1)),
    "convert_element_type": lambda f, a: f(a.v, jnp.int32),
    "custom_linear_solve": lambda f, a: f(lambda x: a.m @ x, a.v,
                                          lambda mv, b: jnp.linalg.solve(a.m, b)),
    "custom_root": lambda f, a: f(lambda x: x * x - a.v, a.v, lambda g, x0: jnp.sqrt(a.v),
                                  lambda g, y: y / (2 * jnp.sqrt(a.v))),
    "dot_general": lambda f, a: f(a.m, a.m, (((1,), (0,)), ((), ()))),
    "dynamic_slice": lambda f, a: f(a.v, (a.i[0],), (2,)),
    "dynamic_slice_in_dim": lambda f, a: f(a.v, a.i[0], 2),
    "dynamic_update_index_in_dim": lambda f, a: f(a.m, a.v, a.i[0], 0),
    "dynamic_update_slice": lambda f, a: f(a.v, a.v[:2], (a.i[0],)),
    "dynamic_update_slice_in_dim": lambda f, a: f(a.v, a.v[:2], a.i[0], 0),
    "empty": lambda f, a: f((3,), jnp.float32),
    "expand_dims": lambda f, a: f(a.v, (0,)),
    "fft": lambda f, a: f(a.c, jax.lax.FftType.FFT, (3,)),
    "fori_loop": lambda f, a: f(0, 3, lambda i, x: x * a.s, a.v),
    "full": lambda f, a: f((3,), a.s),
    "gather": lambda f, a: f(a.v, a.i[:, None], _GATHER, (1,)),
    "imag": _C, "real": _C,
    "index_take": lambda f, a: f(a.m, (a.i,), (0,)),
    "iota": lambda f, a: f(jnp.int32, 3),
    "map": lambda f, a: f(jnp.sin, a.v),
    "optimization_barrier": lambda f, a: f((a.v, a.m)),
    "pad": lambda f, a: f(a.v, a.s, ((1, 1, 0),)),
    "platform_dependent": lambda f, a: f(a.v, cpu=jnp.sin, default=jnp.cos),
    "ragged_dot": lambda f, a: f(jnp.concatenate([a.m, a.m[:1]]),
                                 jnp.stack([a.m[:, :2], a.m[:, 1:]]),
                                 jnp.array([1, 3], jnp.int32)),
    "ragged_dot_general": lambda f, a: f(
        jnp.concatenate([a.m, a.m[:1]]), jnp.stack([a.m[:, :2], a.m[:, 1:]]),
        jnp.array([1, 3], jnp.int32), jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([1], [1]), ([], [])), lhs_ragged_dimensions=[0],
            rhs_group_dimensions=[0])),
    # a monoid, a custom computation, and a variadic one (value and index)
    "reduce": lambda f, a: (f(a.m, np.float32(0), jax.lax.add, (0,)),
                            f(a.v, np.float32(1), lambda x, y: x * y, (0,)),
                            f((a.v, a.i), (np.float32(-np.inf), np.int32(0)),
                              _argmax_computation, (0,))),
    "reduce_and": _bool_reduce, "reduce_or": _bool_reduce, "reduce_xor": _bool_reduce,
    "reduce_max": _reduce_over_0, "reduce_min": _reduce_over_0,
    "reduce_prod": _reduce_over_0, "reduce_sum": _reduce_over_0,
    "reduce_precision": lambda f, a: f(a.v, 5, 10),
    # max pooling, and a custom computation
    "reduce_window": lambda f, a: (f(a.m, -np.inf, jax.lax.max, (2, 2), (1, 1), "VALID"),
                                   f(a.m, np.float32(1), jax.lax.mul, (2, 2), (1, 1),
                                     "VALID")),
    "rev": lambda f, a: f(a.v, (0,)),
    "rng_uniform": lambda f, a: f(np.float32(0), np.float32(1), (3,)),
    "scan": lambda f, a: f(lambda c, x: (c + x, c * x), a.s, a.v),
    "scatter": _scatter, "scatter_add": _scatter, "scatter_max": _scatter,
    "scatter_min": _scatter, "scatter_mul": _scatter, "scatter_sub": _scatter,
    "scatter_apply": lambda f, a: f(a.v, a.i[:, None], jnp.sin, _SCATTER, update_shape=(3,)),
    "rng_bit_generator": lambda f, a: f(jnp.zeros(4, jnp.uint32), (3,)),
    "select": lambda f, a: f(a.b, a.v, a.v),
    "slice": lambda f, a: f(a.v, (0,), (2,)),
    "slice_in_dim": lambda f, a: f(a.v, 0, 2),
    "split": lambda f, a: f(a.v, (1, 2)),
    "squeeze": lambda f, a: f(a.v[None], (0,)),
    "switch": lambda f, a: f(a.i[0], [jnp.sin, jnp.cos], a.v),
    "tile": lambda f, a: f(a.v, (2,)),
    "transpose": lambda f, a: f(a.m, (1, 0)),
    "while_loop": lambda f, a: f(lambda x: x.sum() < 10, lambda x: x * 2, a.v),
    "with_sharding_constraint": lambda f, a: f(
        a.v, jax.sharding.SingleDeviceSharding(jax.devices()[0])),
}

_unary_transform = lambda f, a: f(jnp.sin)(a.v)  # noqa: E731
_scalar_transform = lambda f, a: f(jnp.sin)(a.s)  # noqa: E731


def _fwd_and_bwd(f, a):
    fwd, bwd = f(jnp.sin, 0, jitted=False)
    y, residuals = fwd(a.v)
    return bwd(residuals, y)


def _closure_convert(f, a):
    fn, consts = f(lambda x: jnp.sin(x) * a.v, a.v)
    return fn(a.v, *consts)


OVERRIDES["jax"] = {
    "checkpoint": _unary_transform, "remat": _unary_transform, "jit": _unary_transform,
    "named_call": _unary_transform, "jacfwd": _unary_transform, "jacrev": _unary_transform,
    "jacobian": _unary_transform, "vmap": _unary_transform,
    "grad": _scalar_transform, "value_and_grad": _scalar_transform,
    "hessian": lambda f, a: f(lambda x: jnp.sin(x).sum())(a.v),
    "jvp": lambda f, a: f(jnp.sin, (a.v,), (a.v,)),
    "vjp": lambda f, a: f(jnp.sin, a.v)[1](a.v),
    "linearize": lambda f, a: f(jnp.sin, a.v)[1](a.v),
    "linear_transpose": lambda f, a: f(lambda x: 2 * x, a.v)(a.v),
    "custom_gradient": lambda f, a: f(lambda x: (jnp.sin(x), lambda g: g * jnp.cos(x)))(a.s),
    "closure_convert": _closure_convert,
    "fwd_and_bwd": _fwd_and_bwd,
    "block_until_ready": lambda f, a: f(a.v),
    "device_put": lambda f, a: (f(a.v), f((a.v, a.m), jax.devices()[0])),
    "pure_callback": lambda f, a: f(np.sin, jax.ShapeDtypeStruct((3,), np.float32), a.v,
                                    vmap_method="sequential"),
    "new_ref": lambda f, a: jax.freeze(f(a.v)),
    "freeze": lambda f, a: f(jax.new_ref(a.v)),
    "empty_ref": lambda f, a: jax.freeze(f(jax.typeof(a.v))),
    "free_ref": lambda f, a: f(jax.new_ref(a.v)),
}


def _prims_of(jaxpr, into, with_operands):
    for eqn in jaxpr.eqns:
        into.add(eqn.primitive.name)
        if eqn.invars:
            with_operands.add(eqn.primitive.name)
        for sub in jcore.jaxprs_in_params(eqn.params):
            _prims_of(sub, into, with_operands)


def trace_call(fn, call, arrays):
    """The ClosedJaxpr of `call(fn, a)`, the representative arrays traced."""
    names = list(arrays)

    def run(*vals):
        return call(fn, _Arrays(**dict(zip(names, vals))))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jax.make_jaxpr(run, axis_env=[("i", 2)])(*arrays.values())


def _is_annotation(obj):
    """Whether `obj` is a type annotation (`jax.lax.PrecisionLike`), not a
    function: typing's aliases are callable objects on some Python versions
    and JAX releases, `X | Y` unions are not."""
    return (isinstance(obj, (types.UnionType, types.GenericAlias))
            or type(obj).__module__ == "typing")


def public_functions(module):
    names = []
    for name in sorted(dir(module)):
        if name.startswith("_"):
            continue
        fn = getattr(module, name)
        if inspect.ismodule(fn) or inspect.isclass(fn) or not callable(fn) or _is_annotation(fn):
            continue
        names.append(name)
    return names


def trace_namespace(ns, module, with_operands=None, names=None):
    """({function: set of primitive names} for the functions that trace,
    {function: error} for those that did not, {function: reason} for those
    declared not traceable). Primitives seen with operands are added to
    `with_operands`. `names`: only these functions (default: all public)."""
    arrays = _representatives()
    overrides = OVERRIDES.get(ns, {})
    skip = NOT_TRACEABLE.get(ns, {})
    with_operands = set() if with_operands is None else with_operands
    traced, failed, untraceable = {}, {}, {}
    for name in public_functions(module) if names is None else names:
        if name in skip:
            untraceable[name] = skip[name]
            continue
        fn = getattr(module, name)
        calls = [overrides[name]] if name in overrides else CANDIDATES
        for call in calls:
            try:
                closed = trace_call(fn, call, arrays)
            except Exception as e:  # noqa: BLE001 - wrong arguments: try the next call
                failed[name] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
                continue
            prims = set()
            _prims_of(closed.jaxpr, prims, with_operands)
            traced[name] = prims
            failed.pop(name, None)
            break
    return traced, failed, untraceable


def rule_status(prim_name, operand_free=False):
    """{mode: True | False | reason string} for a JAX primitive name.
    `operand_free`: the primitive was only seen without operands (iota), so
    it is never differentiated or batched."""
    import functx  # noqa: F401 - registers every primitive
    from functx.core import FROM_JAX
    from functx.interpreters.batching import batch_rules, collective_rules
    from functx.interpreters.eval import impl_rules
    from functx.interpreters.jvp import jvp_rules
    from functx.lifting import LIFT_RULES

    if prim_name in BORROWED:  # (its foreign twin may exist by now: the same rules)
        return {m: BORROWED[prim_name] for m in ("eval", "jvp", "reverse", "batch")}
    if prim_name in LIFT_RULES:
        fx = LIFT_RULES[prim_name].primitive
    else:
        fx = next((p for jp, p in FROM_JAX.items() if jp.name == prim_name), None)
    status = {}
    if fx is None:
        status = {m: False for m in ("eval", "jvp", "reverse", "batch")}
    else:
        status["eval"] = fx in impl_rules
        status["jvp"] = fx in jvp_rules
        # A primitive JAX transposes is linear: its jvp applies it to
        # tangents, so reverse mode needs a transpose rule too: functx's own,
        # or JAX's, which reverse mode borrows (primitives/foreign.py).
        status["reverse"] = fx in jvp_rules
        # Collectives are batched by the vmap that names their axis
        # (collective_rules: NOTE [named axes] in primitives/collectives.py).
        status["batch"] = fx in batch_rules or fx in collective_rules
    for mode, why in IMPOSSIBLE.get(prim_name, {}).items():
        status[mode] = why  # (while's jvp rule exists; its reverse mode raises)
    if prim_name in EXCLUDED:
        for mode in status:
            if status[mode] is False:
                status[mode] = EXCLUDED[prim_name]
    if operand_free:
        for mode in ("jvp", "reverse", "batch"):
            if not status[mode]:
                status[mode] = "no operands: never differentiated or batched"
        if not status["eval"]:
            status["eval"] = ("no operands: lifting evaluates it with JAX's own primitive "
                              "(it never meets a functx value)")
    return status


def _covered(status):
    return all(v is not False for v in status.values())


def report(missing=False, verbose=False, out=sys.stdout, namespaces=None):
    """Print the inventory of `namespaces` (default: all of ALL_NAMESPACES);
    returns {primitive: status}."""
    with_operands = set()
    per_ns = {}
    for ns in namespaces or ALL_NAMESPACES:
        module = ALL_NAMESPACES[ns]
        per_ns[ns] = trace_namespace(ns, module, with_operands)
    all_prims = set()
    for traced, _, _ in per_ns.values():
        for ps in traced.values():
            all_prims |= ps - IGNORED
    statuses = {p: rule_status(p, operand_free=p not in with_operands) for p in sorted(all_prims)}

    print(f"{'namespace':<18} {'functions':>9} {'traced':>7} {'not traceable':>14} "
          f"{'fully covered':>14} {'primitives':>11} {'covered':>8}", file=out)
    for ns, (traced, failed, untraceable) in per_ns.items():
        prims = set().union(*traced.values()) - IGNORED if traced else set()
        full = sum(_covered(statuses[p]) for p in prims)
        funcs_ok = sum(all(_covered(statuses[p]) for p in ps - IGNORED) for ps in traced.values())
        n = len(traced) + len(failed) + len(untraceable)
        print(f"{ns:<18} {n:>9} {len(traced):>7} {len(untraceable):>14} {funcs_ok:>14} "
              f"{len(prims):>11} {full:>8}", file=out)
    full = [p for p, s in statuses.items() if _covered(s)]
    print(f"\nprimitives: {len(full)} / {len(statuses)} covered for eval, jvp, reverse "
          "and batching, or excluded with a reason:", file=out)
    for p, s in statuses.items():
        reasons = {}
        for m, why in s.items():
            if isinstance(why, str):
                reasons.setdefault(why, []).append(m)
        for why, modes in reasons.items():
            print(f"  {p} ({', '.join(modes)}): {why}", file=out)
    if verbose:
        for ns, (traced, failed, untraceable) in per_ns.items():
            if failed:
                print(f"\n{ns}: failed to trace:", file=out)
                for name, err in failed.items():
                    print(f"  {name}: {err}", file=out)
            if untraceable:
                print(f"\n{ns}: not traceable:", file=out)
                for name, why in untraceable.items():
                    print(f"  {name}: {why}", file=out)
    if missing:
        lacks = {p: [m for m, v in s.items() if v is False] for p, s in statuses.items()}
        print("\nmissing:" if any(lacks.values()) else "\nmissing: none", file=out)
        for p, lacking in lacks.items():
            if lacking:
                users = [f"{ns.rsplit('.', 1)[-1]}.{f}" for ns, (traced, _, _) in per_ns.items()
                         for f, ps in traced.items() if p in ps]
                more = f" +{len(users) - 3}" if len(users) > 3 else ""
                print(f"  {p:<28} {' '.join(lacking):<24} ({', '.join(users[:3])}{more})", file=out)
    return statuses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--missing", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    report(args.missing, args.verbose)


if __name__ == "__main__":
    main()
