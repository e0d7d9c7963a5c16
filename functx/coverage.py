"""Which JAX primitives functx can transform: `python -m functx.coverage`.

Traces every public function of the JAX numerical namespaces on
representative inputs, collects the primitives their jaxprs emit (inside
sub-programs too), and reports for each whether functx has its rules:

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
the reason; they are not counted as traced or as failures.

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

# Primitives that are no part of a numerical program's derivative: they
# appear in traces but carry no data dependence functx must transform.
IGNORED = {
    "pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
}

# Statements of what cannot exist, with the reason (primitive -> {mode: why}).
_CUDNN_ONLY = ("cuDNN's block-scaled matmul (jax.nn.scaled_matmul): JAX runs it only on "
               "NVIDIA GPUs and defines no derivative or batching rule for it")
IMPOSSIBLE = {
    "while": {"reverse": "reverse mode needs the trip count: use functx.lax.scan "
                         "or fori_loop with static bounds"},
    "scaled_matmul_wrapper": {m: _CUDNN_ONLY for m in ("eval", "jvp", "reverse", "batch")},
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
        return jax.make_jaxpr(run)(*arrays.values())


def public_functions(module):
    names = []
    for name in sorted(dir(module)):
        if name.startswith("_"):
            continue
        fn = getattr(module, name)
        if inspect.ismodule(fn) or inspect.isclass(fn) or not callable(fn):
            continue
        names.append(name)
    return names


def trace_namespace(ns, module, with_operands=None):
    """({function: set of primitive names} for the functions that trace,
    {function: error} for those that did not, {function: reason} for those
    declared not traceable). Primitives seen with operands are added to
    `with_operands`."""
    arrays = _representatives()
    overrides = OVERRIDES.get(ns, {})
    skip = NOT_TRACEABLE.get(ns, {})
    with_operands = set() if with_operands is None else with_operands
    traced, failed, untraceable = {}, {}, {}
    for name in public_functions(module):
        if name in skip:
            untraceable[name] = skip[name]
            continue
        fn = getattr(module, name)
        calls = [overrides[name]] if name in overrides else CANDIDATES
        for call in calls:
            try:
                closed = trace_call(fn, call, arrays)
            except Exception as e:  # noqa: BLE001 - wrong arguments: try the next call
                failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
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
    from functx.interpreters.batching import batch_rules
    from functx.interpreters.eval import impl_rules
    from functx.interpreters.jvp import jvp_rules
    from functx.interpreters.reverse import transpose_rules
    from functx.lifting import LIFT_RULES
    from jax._src.interpreters import ad

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
        # tangents, so reverse mode needs its transpose rule too.
        linear = fx.jax is not None and fx.jax in ad.primitive_transposes
        status["reverse"] = fx in jvp_rules and (not linear or fx in transpose_rules)
        status["batch"] = fx in batch_rules
    for mode, why in IMPOSSIBLE.get(prim_name, {}).items():
        status[mode] = why  # (while's jvp rule exists; its reverse mode raises)
    if operand_free:
        for mode in ("jvp", "reverse", "batch"):
            if not status[mode]:
                status[mode] = "no operands: never differentiated or batched"
    return status


def _covered(status):
    return all(v is not False for v in status.values())


def report(missing=False, verbose=False, out=sys.stdout, namespaces=None):
    """Print the inventory of `namespaces` (default: all of NAMESPACES);
    returns {primitive: status}."""
    with_operands = set()
    per_ns = {}
    for ns in namespaces or NAMESPACES:
        module = NAMESPACES[ns]
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
