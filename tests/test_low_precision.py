"""bfloat16, float16 and float8 under every transform (SPEC §2: every
floating dtype JAX differentiates is differentiable in functx; NOTE
[differentiable dtypes] in functx/core.py).

* The low-precision sweep: a representative subset of the op tables
  (tests/op_table.py, tests/op_table_public.py) with its float arguments
  in bfloat16 and in float16, swept by tests/sweep.py through jvp, vjp,
  vmap∘vjp, jvp∘vjp (the Hessian-vector product) and vmap at batch dims 0
  and -1. The oracle is JAX's own transforms of the same function at the
  same dtype; results must have JAX's dtype, and agree to a tolerance
  relative to the largest entry of each result of a few ulps (bfloat16
  keeps 8 significant bits, float16 11; functx's rules and JAX's may round
  in a different order). Casts between float32, float16 and bfloat16 are
  swept both ways.
* A mixed-precision training step (float32 master parameters cast to
  bfloat16 inside the loss) under grad, per-sample vmap(grad), jacrev,
  jacfwd, jvp, vjp, hessian, linearize and functx.jit(grad), against JAX.
* Every differentiating transform accepts bfloat16, float16 and float8
  inputs (they were refused as "not floating point" before: ml_dtypes'
  types have NumPy kind 'V').
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax, tree_util

import functx as fx
import op_table
import op_table_public
import sweep

BF16, F16, F32, F8 = jnp.bfloat16, jnp.float16, jnp.float32, jnp.float8_e4m3fn

# relative to each result's largest entry: 2 to 3 ulps of the dtype
TOL = {"bfloat16": 2e-2, "float16": 3e-3}

# --------------------------------------------------------------------------
# The sweep's records

# names in tests/op_table.py
PRIMITIVES = [
    # elementwise unary
    "neg", "sin", "exp", "log", "tanh", "logistic", "rsqrt", "erf", "abs", "integer_pow_3",
    "floor", "stop_gradient",
    # elementwise binary, broadcasting, selection
    "mul", "div", "pow", "max", "atan2", "add_scalar", "div_size1", "select_n", "clamp_arrays",
    # reductions, softmax-like compositions, scans, sorting
    "reduce_sum", "reduce_max", "reduce_prod", "mean_var", "logsumexp", "softmax", "cumsum",
    "cumprod", "cummax", "sort",
    # dot_general, convolution
    "matmul", "matvec", "batched_matmul", "einsum_batch_contract", "conv2d_same",
    "conv1d_grouped_nwc",
    # structural
    "broadcast_in_dim", "reshape", "transpose", "rev", "concatenate", "pad", "slice",
    # indexing
    "dynamic_slice", "dynamic_update_slice", "gather_take", "take_along_axis", "scatter_add",
    "scatter_set", "scatter_max",
    # windows
    "reduce_window_sum", "max_pool",
    # special functions (the jvp of bessel_i1e asked NumPy for bfloat16's eps)
    "bessel_i0e_i1e",
]

# names in tests/op_table_public.py: jax.nn's compositions as models use them
PUBLIC = [
    "nn.gelu", "nn.silu", "nn.relu", "nn.log_softmax", "nn.standardize",
    "nn.dot_product_attention", "jnp.where", "jnp.std",
]


def _cast(gen, dtype):
    """`gen` with its float64 draws in `dtype` (integer and bool draws as they are)."""
    def draw(rng):
        a = gen(rng)
        return a.astype(dtype) if np.asarray(a).dtype == np.float64 else a
    return draw


def _low(record, dtype):
    name = np.dtype(dtype).name
    return dataclasses.replace(record, name=f"{record.name}[{name}]", tol=TOL[name],
                               gens=[_cast(g, dtype) for g in record.gens])


def _convert(src, dst, via=None):
    """astype from `src` to `dst` (through `via` if given), scaled so the
    results are not all ones and zeros."""
    names = [np.dtype(d).name for d in (src, via, dst) if d is not None]
    if via is None:
        fn = lambda x: lax.convert_element_type(x, dst) * jnp.asarray(3.0, dst)  # noqa: E731
    else:
        fn = lambda x: lax.convert_element_type(lax.convert_element_type(x, via), dst)  # noqa: E731
    tol = max(TOL.get(n, 0) for n in names)
    return op_table.Op("convert_" + "_".join(names), fn, [op_table.U(op_table.S, dtype=src)], tol=tol,
                       fd=False)


# astype between float32, float16 and bfloat16 both ways, and through a
# lower precision back to float32 (until NOTE [differentiable dtypes], a
# cast to bfloat16 had a zero tangent and a zero cotangent)
CONVERTS = [_convert(a, b) for a in (F32, F16, BF16) for b in (F32, F16, BF16) if a is not b]
CONVERTS += [_convert(F32, F32, via=BF16), _convert(F32, F32, via=F16)]

# record -> why it is swept in bfloat16 only
BF16_ONLY = {
    # its float16 dot_general accumulates in float32, which XLA:CPU does not
    # implement (JAX's own call fails there too)
    "nn.dot_product_attention": "XLA:CPU has no float16 x float16 -> float32 dot_general",
}

_by_name = {o.name: o for o in op_table.OPS}
_by_name.update({o.name: o for o in op_table_public.OPS})
RECORDS = [_low(_by_name[n], d) for d in (BF16, F16) for n in PRIMITIVES + PUBLIC
           if d is BF16 or n not in BF16_ONLY] + CONVERTS


def _prepare(record):
    # no finite differences (float64 only), batch dims 0 and -1, and of
    # the second-order compositions the Hessian-vector product
    return sweep.prepare(record, full=False, fd=False, second=("jvp(vjp)",),
                         order=min(record.order, 2))


_runner = sweep.GroupedRunner("test_low_precision_sweep", 8, _prepare)


def _compare(name, got, want, tol):
    """Same structure, shapes and dtypes as JAX; floating results within
    `tol` of the largest entry (relative too)."""
    got_l, got_t = tree_util.tree_flatten(got)
    want_l, want_t = tree_util.tree_flatten(want)
    assert got_t == want_t, f"{name}: structure {got_t} != {want_t}"
    for g, w in zip(got_l, want_l):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{name}: shape {g.shape} != {w.shape}"
        if w.dtype == jax.dtypes.float0:
            assert g.dtype == jax.dtypes.float0 or not np.any(g), f"{name}: nonzero float0"
            continue
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype}, JAX gives {w.dtype}"
        if jnp.issubdtype(w.dtype, jnp.inexact):
            g, w = g.astype(np.float64), w.astype(np.float64)
            scale = max(1.0, float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0)))
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


# The quick subset (`pytest -m "not slow"`, the marker in pyproject.toml) runs
# a spread sample of the records, every QUICK_EVERY-th; the full suite all.
QUICK_EVERY = 50


@pytest.mark.parametrize("op", [pytest.param(r, id=r.name, marks=[pytest.mark.slow] if i % QUICK_EVERY else [])
                                for i, r in enumerate(RECORDS)])
def test_low_precision_sweep(op, request):
    results = _runner.results_for(op, request)
    if isinstance(results, BaseException):
        raise results
    assert results, f"{op.name}: no composition was checked"
    for composition, (got, want) in results.items():
        _compare(f"{op.name}: {composition}", got, want, op.tol)


@pytest.mark.slow
def test_sweep_differentiates_low_precision_arguments():
    """The sweep's records really are low precision, and differentiated."""
    for record in RECORDS:
        case = sweep.prepare(record, full=False, fd=False)
        dtypes = {np.dtype(case.data["args"][i].dtype).name for i in case.diff}
        assert dtypes and dtypes <= {"bfloat16", "float16", "float32"}, (record.name, dtypes)
        if not record.name.startswith("convert"):
            assert dtypes == {record.name.split("[")[1][:-1]}, record.name


# --------------------------------------------------------------------------
# A mixed-precision training step: float32 master parameters, cast to
# bfloat16 inside the loss; the loss in float32 (after a float32
# log-softmax) or in bfloat16. Written once with jax.numpy (run through
# functx.lift, and by JAX as the oracle) and once with functx.numpy.


def _init():
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(0, 0.5, (4, 5)), "b1": rng.normal(0, 0.1, (5,)),
        "w2": rng.normal(0, 0.5, (5, 3)), "b2": rng.normal(0, 0.1, (3,)),
    }
    params = {k: jnp.asarray(v, F32) for k, v in params.items()}
    x = jnp.asarray(rng.normal(0, 1, (6, 4)), F32)
    y = jnp.asarray(np.eye(3)[rng.integers(0, 3, 6)], F32)
    return params, x, y


def _per_sample(np_, nn, params, x, y, loss_dtype):
    """Per-sample losses (leading axis of x and y), computed in bfloat16."""
    p = {k: v.astype(BF16) for k, v in params.items()}
    h = nn.gelu(np_.matmul(x.astype(BF16), p["w1"]) + p["b1"].reshape(1, -1))
    logits = np_.matmul(h, p["w2"]) + p["b2"].reshape(1, -1)
    logp = nn.log_softmax(logits.astype(loss_dtype), axis=-1)
    return -np_.sum(logp * y.astype(loss_dtype), axis=-1)


LOSS_DTYPES = {"loss_f32": F32, "loss_bf16": BF16}
VARIANTS = [(s, d) for s in ("lifted", "functx.numpy") for d in LOSS_DTYPES]
# the costlier tests run two of them: each spelling, each loss dtype once
TWO_VARIANTS = [("lifted", "loss_f32"), ("functx.numpy", "loss_bf16")]


def _variant(spelling, loss_dtype):
    """(functx loss, functx per-sample losses, JAX loss, JAX per-sample losses)."""
    dt = LOSS_DTYPES[loss_dtype]
    jax_per_sample = lambda p, x, y: _per_sample(jnp, jax.nn, p, x, y, dt)  # noqa: E731
    jax_loss = lambda p, x, y: jnp.mean(jax_per_sample(p, x, y))  # noqa: E731
    if spelling == "lifted":
        return fx.lift(jax_loss), fx.lift(jax_per_sample), jax_loss, jax_per_sample
    per_sample = lambda p, x, y: _per_sample(fx.numpy, fx.nn, p, x, y, dt)  # noqa: E731
    return (lambda p, x, y: fx.numpy.mean(per_sample(p, x, y))), per_sample, jax_loss, jax_per_sample


def _check(name, got, want, tol=TOL["bfloat16"]):
    _compare(name, jax.device_get(got), jax.device_get(want), tol)


# The transforms by their functx and JAX names (vmap's axes argument differs)
FX = dict(grad=fx.grad, vmap=lambda f, dims: fx.vmap(f, in_dims=dims), jacrev=fx.jacrev,
          jacfwd=fx.jacfwd, jvp=fx.jvp, vjp=fx.vjp, linearize=fx.linearize, hessian=fx.hessian)
JAX = dict(grad=jax.grad, vmap=lambda f, dims: jax.vmap(f, in_axes=dims), jacrev=jax.jacrev,
           jacfwd=jax.jacfwd, jvp=jax.jvp, vjp=jax.vjp, linearize=jax.linearize, hessian=jax.hessian)


def _every_transform(T, loss, per_sample, params, x, y, t):
    """The mixed-precision loss under every transform of the library `T`."""
    f = lambda p: loss(p, x, y)  # noqa: E731
    out, vjp_fn = T["vjp"](f, params)
    lin_out, lin_fn = T["linearize"](f, params)

    def one(p, xi, yi):  # one example, a batch of one
        return loss(p, xi[None], yi[None])

    def head(w2, b2):  # the output layer's 18 parameters
        return loss({**params, "w2": w2, "b2": b2}, x, y)

    return {
        "grad": T["grad"](loss)(params, x, y),
        "vmap(grad) (per-sample)": T["vmap"](T["grad"](one), (None, 0, 0))(params, x, y),
        "jacrev": T["jacrev"](lambda p: per_sample(p, x, y))(params),
        "jacfwd": T["jacfwd"](lambda p: per_sample(p, x, y))(params),
        "jvp": T["jvp"](f, (params,), (t,)),
        "vjp": (out, vjp_fn(jnp.asarray(1.5, out.dtype))),
        "linearize": (lin_out, lin_fn(t)),
        "hessian": T["hessian"](head, argnums=(0, 1))(params["w2"], params["b2"]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("spelling,loss_dtype", TWO_VARIANTS)
def test_mixed_precision_every_transform(spelling, loss_dtype):
    """bfloat16 compute on float32 parameters under grad, per-sample
    vmap(grad), jacrev, jacfwd, jvp, vjp, linearize and hessian: JAX's
    results, in float32 wherever JAX's are. (One jax.jit around both, so
    the test compiles once: functx runs at trace time.)"""
    loss, per_sample, jax_loss, jax_per_sample = _variant(spelling, loss_dtype)
    params, x, y = _init()
    rng = np.random.default_rng(3)
    t = {k: jnp.asarray(rng.normal(size=v.shape), F32) for k, v in params.items()}
    got, want = jax.jit(lambda *a: (_every_transform(FX, loss, per_sample, *a),
                                    _every_transform(JAX, jax_loss, jax_per_sample, *a)))(
        params, x, y, t)
    for name in want:
        _check(name, got[name], want[name])
    assert got["grad"]["w1"].dtype == F32 and got["hessian"][0][0].shape == (5, 3, 5, 3)
    assert got["vmap(grad) (per-sample)"]["w1"].shape == (6, 4, 5)


@pytest.mark.slow
@pytest.mark.parametrize("spelling,loss_dtype", TWO_VARIANTS)
def test_mixed_precision_training_step(spelling, loss_dtype):
    """One SGD step, eagerly: float32 gradients of bfloat16 compute, the
    updated master parameters equal JAX's, and the loss goes down."""
    loss, _, jax_loss, _ = _variant(spelling, loss_dtype)
    params, x, y = _init()
    g, value = fx.grad_and_value(loss)(params, x, y)
    want_value, want = jax.jit(jax.value_and_grad(jax_loss))(params, x, y)
    _check("grad_and_value", (g, value), (want, want_value))
    assert all(v.dtype == F32 and np.abs(np.asarray(v)).max() > 0
               for v in jax.tree_util.tree_leaves(g))
    step = lambda p, g: jax.tree_util.tree_map(lambda a, b: a - 0.5 * b, p, g)  # noqa: E731
    new = step(params, g)
    _check("updated parameters", new, step(params, want))
    assert float(jax.jit(jax_loss)(new, x, y)) < float(value)


@pytest.mark.parametrize("spelling,loss_dtype", VARIANTS)
@pytest.mark.slow
def test_mixed_precision_jit_grad(spelling, loss_dtype):
    loss, _, jax_loss, _ = _variant(spelling, loss_dtype)
    params, x, y = _init()
    _check("jit(grad)", fx.jit(fx.grad(loss))(params, x, y), jax.jit(jax.grad(jax_loss))(params, x, y))


# --------------------------------------------------------------------------
# Low-precision inputs are differentiable (before NOTE [differentiable
# dtypes], bfloat16 and float8 inputs were refused as "not floating point").

INPUT_DTYPES = {"bfloat16": BF16, "float16": F16, "float8_e4m3fn": F8}


def _scalar_fn(x):
    return jnp.sum(x * x * x - 2 * x)


def _vector_fn(x):
    return x * x - x[::-1] * 3


def _input_transforms(T, x):
    """Every differentiating transform of library `T` at low-precision `x`."""
    return {
        "grad": T["grad"](_scalar_fn)(x),
        "vjp": T["vjp"](_vector_fn, x)[1](x),
        "jvp": T["jvp"](_vector_fn, (x,), (x,)),
        "jacrev": T["jacrev"](_vector_fn)(x),
        "jacfwd": T["jacfwd"](_vector_fn)(x),
        "hessian": T["hessian"](_scalar_fn)(x),
        "linearize": T["linearize"](_vector_fn, x)[1](x),
        "vmap(grad)": T["vmap"](T["grad"](_scalar_fn), 0)(x),
    }


# functx's transforms of the lifted functions
FX_LIFTED = {name: (lambda t: lambda f, *a, **k: t(fx.lift(f), *a, **k))(t)
             for name, t in FX.items() if name != "vmap"}
FX_LIFTED["vmap"] = FX["vmap"]


@pytest.mark.parametrize("dtype", list(INPUT_DTYPES))
@pytest.mark.slow
def test_low_precision_inputs_are_differentiable(dtype):
    """grad, vjp, jvp, jacrev, jacfwd, hessian, linearize and vmap(grad)
    take bfloat16, float16 and float8 inputs and give JAX's results, in
    the input's dtype."""
    x = jnp.asarray([0.5, -1.25, 1.5], INPUT_DTYPES[dtype])
    got, want = jax.jit(lambda x: (_input_transforms(FX_LIFTED, x), _input_transforms(JAX, x)))(x)
    for name in want:
        # float8 results are exact here (small dyadic numbers)
        _check(f"{name} at {dtype}", got[name], want[name], TOL.get(dtype, 0.0))
        assert all(v.dtype == x.dtype for v in jax.tree_util.tree_leaves(got[name])), name


@pytest.mark.parametrize("dtype", list(INPUT_DTYPES))
@pytest.mark.slow
def test_low_precision_inputs_eagerly(dtype):
    """The same, outside jax.jit (functx's eager paths) for grad and jvp."""
    x = jnp.asarray([0.5, -1.25, 1.5], INPUT_DTYPES[dtype])
    g = fx.grad(fx.lift(_scalar_fn))(x)
    _check("grad", g, jax.jit(jax.grad(_scalar_fn))(x), TOL.get(dtype, 0.0))
    t = fx.jvp(fx.lift(_vector_fn), (x,), (x,))
    _check("jvp", t, jax.jit(lambda x: jax.jvp(_vector_fn, (x,), (x,)))(x), TOL.get(dtype, 0.0))
    assert g.dtype == x.dtype and t[1].dtype == x.dtype
