"""Every misuse of SPEC section 5 raises a FunctxError subclass that is also
the matching built-in exception, with a message naming the transform, the
argument and the fix."""

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import functx as fx
import functx.numpy as fnp
from functx.core import Primitive
from functx.interpreters.eval import lower_to_jax

X = jnp.arange(3.0)
XS = jnp.ones((4, 3))


def raises(exc, *words):
    """Expect `exc` (a FunctxError and the built-in) whose message contains
    every word (case-insensitive regex)."""
    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *a):
            handled = self.cm.__exit__(*a)
            assert isinstance(self.info.value, fx.FunctxError), type(self.info.value)
            msg = str(self.info.value)
            for w in words:
                assert re.search(w, msg, re.IGNORECASE), f"{w!r} not in message:\n{msg}"
            return handled

    return _Ctx()


def test_error_hierarchy():
    assert issubclass(fx.FunctxTypeError, TypeError)
    assert issubclass(fx.FunctxValueError, ValueError)
    assert issubclass(fx.FunctxRuntimeError, RuntimeError)
    for cls in (fx.FunctxTypeError, fx.FunctxValueError, fx.FunctxRuntimeError):
        assert issubclass(cls, fx.FunctxError)


# --------------------------------------------------------------------------
# vmap


def test_vmap_mismatched_batch_sizes_names_each_argument():
    with raises(ValueError, r"vmap\(", "different sizes", "argument 0", "size 4",
                "argument 1", "size 5", "in_dims=None"):
        fx.vmap(lambda a, b: a + b)(XS, jnp.ones((5, 3)))


def test_vmap_in_dims_out_of_range():
    with raises(ValueError, r"vmap\(", "in_dims=2", "out of range", "argument 0", r"\(4, 3\)",
                r"\[-2, 2\)"):
        fx.vmap(fnp.sin, in_dims=2)(XS)


def test_vmap_in_dims_wrong_structure():
    with raises(ValueError, r"vmap\(", "in_dims has 1 entries", "2 positional", "one in_dims entry"):
        fx.vmap(lambda a, b: a, in_dims=(0,))(XS, XS)
    with raises(ValueError, "in_dims", "structure", "prefix"):
        fx.vmap(lambda d: d["a"], in_dims=({"b": 0},))({"a": XS})
    with raises(TypeError, "in_dims", "int or None", "'x'"):
        fx.vmap(fnp.sin, in_dims=("x",))(XS)


def test_vmap_no_batched_inputs():
    with raises(ValueError, r"vmap\(", "no input is batched", "in_dims=0"):
        fx.vmap(fnp.sin, in_dims=None)(XS)
    with raises(ValueError, r"vmap\(", "no input is batched", "hold no arrays"):
        fx.vmap(lambda b, x: x, in_dims=(0, None))({}, XS)


def test_vmap_batched_non_array_argument():
    with raises(TypeError, r"vmap\(", "argument 1", "not an array", "None"):
        fx.vmap(lambda a, b: a, in_dims=(0, 0))(XS, "text")


def test_a_numpy_array_of_strings_or_objects_names_the_transform_and_argument():
    n = XS.shape[0]
    for bad in (np.array(["a"] * n), np.array([1.0] * (n - 1) + [None], dtype=object)):
        with raises(TypeError, r"grad\(", "argument 0", "dtype", "closure"):
            fx.grad(lambda x: fnp.sum(x))(bad)
        with raises(TypeError, r"vmap\(", "argument 1", "dtype"):
            fx.vmap(lambda a, b: a)(XS, bad)
    low = np.ones(3, jnp.bfloat16)  # NumPy kind "V", as ml_dtypes' other types: still numbers
    assert fx.grad(lambda x: fnp.sum(x))(low).dtype == jnp.bfloat16


def test_vmap_out_dims_none_for_batched_output():
    with raises(ValueError, "out_dims is None", "output 0", "depends on the batched"):
        fx.vmap(fnp.sin, out_dims=None)(XS)


def test_vmap_data_dependent_control_flow_names_the_line():
    def f(x):
        if fnp.sum(x) > 0:  # the offending line
            return x
        return -x

    with raises(RuntimeError, r"vmap", "data-dependent", r"test_errors\.py:\d+",
                "if fnp.sum", "where", "cond"):
        fx.vmap(f)(XS)
    assert issubclass(fx.ConcretizationError, fx.FunctxRuntimeError)


def test_vmap_bad_randomness_and_chunk_size():
    with raises(ValueError, "randomness", "'different'"):
        fx.vmap(fnp.sin, randomness="sometimes")
    with raises(ValueError, "chunk_size", "positive int"):
        fx.vmap(fnp.sin, chunk_size=0)


def test_vmap_out_dims_and_in_dims_must_be_ints():
    # an array (or a float, a string) where a dimension belongs: refused when
    # the transform is built, not with NumPy's "truth value of an array"
    for out_dims in ((jnp.array([0, 1]),), (jnp.array(0), 0), 0.0, "a"):
        with raises(TypeError, r"vmap\(", "out_dims", "int or None", "plain ints"):
            fx.vmap(lambda x: (x, x), out_dims=out_dims)
    with raises(TypeError, r"vmap\(", "in_dims", "int or None", "plain ints"):
        fx.vmap(fnp.sin, in_dims=(np.array([0]),))
    # what JAX accepts still works: ints (NumPy ones too), None, containers
    out = fx.vmap(lambda x: {"a": x, "b": 2 * x}, out_dims={"a": np.int64(1), "b": None})
    with raises(ValueError, "out_dims is None"):
        out(XS)
    close_ = fx.vmap(lambda x: (x, x), out_dims=(1, 0))(XS)
    np.testing.assert_allclose(close_[0], XS.T)


def test_jacfwd_randomness_is_checked_like_vmaps():
    with raises(ValueError, r"jacfwd\(", "randomness", "'bogus'", "'different'", "'same'"):
        fx.jacfwd(fnp.sin, randomness="bogus")


# --------------------------------------------------------------------------
# grad and friends


def test_grad_non_scalar_output():
    with raises(ValueError, r"grad\(", "scalar", r"f64\[3\]", "Sum the output", "jacrev"):
        fx.grad(fnp.sin)(X)


def test_grad_non_float_output():
    with raises(TypeError, r"grad\(", "floating-point scalar", "astype"):
        fx.grad(lambda x: fnp.argmax(x))(X)


def test_grad_integer_input():
    with raises(TypeError, r"grad\(", "argument 0", "int", "floating-point", "astype"):
        fx.grad(lambda x: fnp.sum(x * 2))(jnp.arange(3))


def test_argnums_out_of_range_and_wrong_type():
    with raises(ValueError, r"grad\(", "argnums=2", "out of range", "2 positional"):
        fx.grad(lambda a, b: fnp.sum(a * b), argnums=2)(X, X)
    with raises(TypeError, "argnums", "int or a non-empty tuple"):
        fx.grad(lambda a: fnp.sum(a), argnums=1.5)(X)
    with raises(ValueError, "argnums", "out of range"):
        fx.jacrev(fnp.sin, argnums=1)(X)


def test_duplicate_argnums_names_the_fix():
    with raises(ValueError, r"grad\(", r"argnums=\(0, -2\)", "argument 0 twice",
                r"once, e\.g\. argnums=\(0,\)"):
        fx.grad(lambda a, b: fnp.sum(a * b), argnums=(0, -2))(X, X)


@pytest.mark.slow
def test_holomorphic_dtypes_are_checked_like_jax():
    z = jnp.asarray([1.0 + 1.0j, 2.0])

    def check(call, jcall, *words):
        with pytest.raises(TypeError):
            jcall()
        with raises(TypeError, *words):
            call()

    # holomorphic=True: complex inputs and outputs
    check(lambda: fx.jacrev(fnp.sin, holomorphic=True)(X),
          lambda: jax.jacrev(jnp.sin, holomorphic=True)(X),
          r"jacrev\(", "holomorphic=True", "argument 0", "float64", r"astype\(complex\)")
    check(lambda: fx.jacfwd(fnp.abs, holomorphic=True)(z),
          lambda: jax.jacfwd(jnp.abs, holomorphic=True)(z),
          r"jacfwd\(", "holomorphic=True", "the output", "f64", "drop holomorphic=True")
    check(lambda: fx.grad(lambda z: fnp.sum(fnp.abs(z)), holomorphic=True)(z),
          lambda: jax.grad(lambda z: jnp.sum(jnp.abs(z)), holomorphic=True)(z),
          r"grad\(", "holomorphic=True", "complex")
    with raises(TypeError, r"vjp\(", "holomorphic=True", "complex"):
        fx.vjp(fnp.sin, X, holomorphic=True)
    # without it: complex outputs of grad and jacrev, complex inputs of jacfwd
    check(lambda: fx.grad(lambda z: fnp.sum(z ** 2))(z),
          lambda: jax.grad(lambda z: jnp.sum(z ** 2))(z),
          r"grad\(", "c128", "pass holomorphic=True")
    check(lambda: fx.jacrev(lambda z: z ** 2)(z), lambda: jax.jacrev(lambda z: z ** 2)(z),
          r"jacrev\(", "complex", "pass holomorphic=True")
    check(lambda: fx.jacfwd(lambda z: z ** 2)(z), lambda: jax.jacfwd(lambda z: z ** 2)(z),
          r"jacfwd\(", "complex", "pass holomorphic=True")


def test_integer_inputs_offer_allow_int():
    with raises(TypeError, r"grad\(", "argument 1", "int", "allow_int=True"):
        fx.grad(lambda x, n: fnp.sum(x * n), argnums=(0, 1))(X, jnp.arange(3))
    with raises(TypeError, r"jacrev\(", "allow_int=True"):
        fx.jacrev(lambda n: n * 2.0)(jnp.arange(3))
    # jvp has no such option, and does not offer it
    with raises(TypeError, r"jvp\(", "int") as e:
        fx.jvp(lambda n: n * 2.0, (jnp.arange(3),), (jnp.arange(3),))
    assert "allow_int" not in str(e.value)


def test_non_callable():
    for transform in (fx.grad, fx.vmap, fx.jacrev, fx.jacfwd, fx.hessian, fx.grad_and_value):
        with raises(TypeError, transform.__name__, "callable", "not"):
            transform(jnp.sin(1.0))
    with raises(TypeError, "jvp", "callable"):
        fx.jvp(3, (X,), (X,))
    with raises(TypeError, "lift", "callable"):
        fx.lift(None)


def test_has_aux_without_pair():
    with raises(ValueError, "has_aux=True", "pair", "has_aux=False"):
        fx.grad(lambda x: fnp.sum(x), has_aux=True)(X)


# --------------------------------------------------------------------------
# jvp / vjp argument structure


def test_jvp_tangent_mismatches():
    with raises(ValueError, r"jvp\(", "tangent 0", r"shape \(2,\)", r"\(3,\)"):
        fx.jvp(fnp.sin, (X,), (jnp.ones(2),))
    with raises(ValueError, r"jvp\(", "tangent 0", "dtype float32", "float64", "astype"):
        fx.jvp(fnp.sin, (X,), (jnp.ones(3, jnp.float32),))
    with raises(ValueError, r"jvp\(", "tangents", "structure", "one tangent per primal"):
        fx.jvp(lambda a, b: a + b, (X, X), (X,))
    with raises(TypeError, r"jvp\(", "primals", "tuple"):
        fx.jvp(fnp.sin, X, X)


def test_vjp_cotangent_mismatches():
    _, vjp_fn = fx.vjp(lambda x: (fnp.sin(x), x), X)
    with raises(ValueError, "cotangents", "structure", "one cotangent per output"):
        vjp_fn(X)
    with raises(ValueError, "cotangent 0", r"shape \(2,\)"):
        vjp_fn((jnp.ones(2), X))


@pytest.mark.slow
def test_vjp_cotangent_dtype_is_checked_like_jax():
    f = lambda x: (fnp.sin(x), {"n": fnp.sum(x)})
    _, vjp_fn = fx.vjp(f, X)
    _, jax_vjp_fn = jax.vjp(f, X)
    ones = jnp.ones(3)
    for bad in ((jnp.ones(3, jnp.int32), 1.0), (ones, {"n": jnp.float32(1.0)}),
                (ones.astype(jnp.complex128), 1.0)):
        bad = (bad[0], bad[1] if isinstance(bad[1], dict) else {"n": bad[1]})
        with pytest.raises(ValueError):
            jax_vjp_fn(bad)
        with raises(ValueError, r"vjp_fn\(cotangents\)", "cotangent for output", "dtype",
                    "float64", r"astype\(float64\)"):
            vjp_fn(bad)
    with raises(ValueError, r"output\[1\]\['n'\]", "float32"):
        vjp_fn((ones, {"n": jnp.float32(1.0)}))
    # a Python number is weakly typed: it takes the output's dtype, as in JAX
    want = jax_vjp_fn((ones, {"n": 2.0}))
    np.testing.assert_allclose(vjp_fn((ones, {"n": 2.0}))[0], want[0])
    np.testing.assert_allclose(vjp_fn((ones, {"n": 2}))[0], want[0])
    # an integer output's cotangent is ignored (JAX types it float0)
    _, int_vjp = fx.vjp(lambda x: (x * 2.0, (x > 0).astype(jnp.int32)), X)
    np.testing.assert_allclose(int_vjp((ones, jnp.ones(3)))[0], 2 * ones)
    # one argument: the cotangents, as one tuple
    with raises(TypeError, r"vjp_fn\(cotangents\)", "one argument", r"vjp_fn\(\(ct_a, ct_b\)\)"):
        vjp_fn(ones, {"n": 1.0})


# --------------------------------------------------------------------------
# Escaped tracers, missing rules, JAX functions on functx values


def test_escaped_tracer_is_caught_and_names_the_transform():
    leaked = []

    def f(x):
        leaked.append(x)
        return fnp.sum(x)

    fx.grad(f)(X)
    with raises(RuntimeError, "grad", "escaped", "after grad returned", "has_aux"):
        fnp.sin(leaked[0])
    assert issubclass(fx.EscapedTracerError, fx.FunctxRuntimeError)

    leaked_batched = []
    fx.vmap(lambda x: leaked_batched.append(x) or x)(XS)
    with raises(RuntimeError, "vmap", "escaped"):
        leaked_batched[0] * 2.0
    with raises(RuntimeError, "escaped"):
        bool(leaked_batched[0][0] > 0)


def test_missing_rule_names_primitive_and_transform():
    test_only = Primitive("test_only_sin")
    test_only.jax = lax.sin_p
    lower_to_jax(test_only)

    def f(x):
        return fnp.sum(test_only.bind(x, accuracy=None))

    assert np.allclose(f(X), jnp.sum(jnp.sin(X)))  # evaluation works
    with raises(RuntimeError, "test_only_sin", "no grad rule", "grad"):
        fx.grad(f)(X)
    with raises(RuntimeError, "test_only_sin", "vmap"):
        fx.vmap(f)(XS)
    with raises(RuntimeError, "test_only_sin", "jvp"):
        fx.jvp(f, (X,), (X,))
    assert issubclass(fx.MissingRuleError, fx.FunctxRuntimeError)


@pytest.mark.slow
def test_jax_primitive_functx_does_not_know():
    # cholesky_update is a jax.lax.linalg primitive outside the public
    # namespaces functx covers (functx.coverage), with no functx rules
    update = fx.lift(lambda v: jax.lax.linalg.cholesky_update(jnp.eye(2), v))
    with raises(RuntimeError, "primitive `cholesky_update`", "grad", "functx.numpy"):
        fx.grad(lambda v: fnp.sum(update(v)))(jnp.ones(2))
    v = jnp.array([0.5, 0.25])  # no functx value reaches it: plain JAX
    assert np.allclose(update(v), jax.lax.linalg.cholesky_update(jnp.eye(2), v))


def test_scatter_mul_with_repeated_indices_explains_itself():
    with raises(ValueError, "scatter-mul", "unique", "unique_indices=True"):
        fx.grad(lambda u: fnp.sum((X + u[0]).at[jnp.array([0, 0])].multiply(u)))(jnp.ones(2))


def test_numpy_function_on_functx_value():
    """JAX functions accept functx values (NOTE [JAX on functx values]);
    NumPy's would drop the derivative, so they raise, naming the fix."""
    with raises(TypeError, "NumPy", "jax.numpy or functx.numpy", "outside the transform") as e:
        fx.grad(lambda x: float(np.sum(np.asarray(x))))(X)
    assert "cannot see through" not in str(e.value)  # JAX code does work on them
    assert isinstance(e.value, fx.JaxOnFunctxValueError)
    assert issubclass(fx.JaxOnFunctxValueError, fx.FunctxTypeError)


def test_stateful_random_under_vmap_with_error_randomness():
    with raises(RuntimeError, "vmap", "randomness='error'", "'different'", "'same'"):
        fx.vmap(lambda x: x + fx.random.rand(3))(XS)
