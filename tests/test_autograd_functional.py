"""functx.autograd.functional against torch.autograd.functional.

Oracles: torch on the same float64 numbers (values, return structures,
which calls raise), and JAX's own transforms for compositions (functx.vmap /
functx.grad over the functional API). The functx side of the value tests
runs inside one `jax.jit` each (one XLA compilation); the strict-mode error
conditions are structural, so they are decided while tracing
(`jax.make_jaxpr`, no compilation at all).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import tree_util

import functx as fx
import functx.numpy as fnp
from functx.autograd import functional as F
from functx.autograd import AutogradNotImplementedError, AutogradValueError, IndependenceError

TF = torch.autograd.functional

X = np.array([0.3, -1.2, 2.0])
Y = np.array([0.5, 1.5])
V3 = np.array([1.0, -0.5, 0.25])
V2 = np.array([0.7, -1.1])


def _t(*arrays):
    return tuple(torch.tensor(a) for a in arrays)


class _J:
    """The namespace the test functions use, functx flavour."""
    sin, cos, exp, tanh = fnp.sin, fnp.cos, fnp.exp, fnp.tanh

    @staticmethod
    def ones(n):
        return jnp.ones(n, jnp.float64)


class _T:
    sin, cos, exp, tanh = torch.sin, torch.cos, torch.exp, torch.tanh

    @staticmethod
    def ones(n):
        return torch.ones(n, dtype=torch.float64)


def _norm(tree):
    """torch returns lists in a few places (forward-mode jacobian); compare
    as tuples."""
    if isinstance(tree, (list, tuple)):
        return tuple(_norm(t) for t in tree)
    return tree


def _assert_same(got, want, what, tol=1e-10):
    want = _norm(want)
    is_t = lambda t: isinstance(t, torch.Tensor)  # noqa: E731
    want_tree = tree_util.tree_structure(tree_util.tree_map(lambda t: 0, want, is_leaf=is_t))
    got_tree = tree_util.tree_structure(got)
    assert got_tree == want_tree, f"{what}: structure {got_tree} != torch's {want_tree}"
    for g, w in zip(tree_util.tree_leaves(got), tree_util.tree_leaves(want, is_leaf=is_t)):
        w = w.detach().numpy()
        assert np.shape(g) == w.shape, f"{what}: shape {np.shape(g)} != {w.shape}"
        np.testing.assert_allclose(np.asarray(g), w, rtol=tol, atol=tol, err_msg=what)


# --------------------------------------------------------------------------
# Values and return structures, every function, single / tuple in and out

# name -> (make(M), inputs, v for the outputs)
VECTOR_FNS = {
    "1 in, 1 out": (lambda M: lambda a: M.sin(a) * a.sum(), (X,), (V3,)),
    "1 in, 2 out": (lambda M: lambda a: (M.exp(a) * 0.5, (a ** 2).sum()), (X,),
                    (V3, np.array(2.0))),
    "2 in, 1 out": (lambda M: lambda a, b: M.tanh(a) * (b ** 2).sum(), (X, Y), (V3,)),
    "2 in, 2 out": (lambda M: lambda a, b: (M.sin(a) * b.sum(), a.sum() * M.cos(b)), (X, Y),
                    (V3, V2)),
    "2 in, one unused": (lambda M: lambda a, b: M.sin(a) * 2.0, (X, Y), (V3,)),
}
SCALAR_FNS = {
    "1 in": (lambda M: lambda a: (M.sin(a) * a ** 2).sum(), (X,)),
    "2 in": (lambda M: lambda a, b: M.exp(a).sum() * (b ** 3).sum() + (a ** 2).sum(), (X, Y)),
}


def _single(args):
    """torch's convention: one array passed bare, several as a tuple."""
    return args[0] if len(args) == 1 else tuple(args)


def _functx_values(xs, vs):
    """Every functx.autograd.functional call of the value test, on the
    arguments `xs[name]` (traced by jax.jit), as a dict."""
    res = {}
    for name, (make, _, _) in VECTOR_FNS.items():
        f, ins, v = make(_J), _single(xs[name]), _single(vs[name])
        res[name, "vjp"] = F.vjp(f, ins, v)
        res[name, "jvp"] = F.jvp(f, ins, _single(tuple(x * 0.5 + 1.0 for x in xs[name])))
        res[name, "jacobian"] = F.jacobian(f, ins)
        res[name, "jacobian vectorized"] = F.jacobian(f, ins, vectorize=True)
        res[name, "jacobian forward"] = F.jacobian(f, ins, vectorize=True,
                                                   strategy="forward-mode")
        res[name, "jacobian create_graph"] = F.jacobian(f, ins, create_graph=True)
    for name, (make, _) in SCALAR_FNS.items():
        f, ins = make(_J), _single(xs[name])
        w = _single(tuple(x * 0.5 + 1.0 for x in xs[name]))
        res[name, "hessian"] = F.hessian(f, ins)
        res[name, "hessian forward"] = F.hessian(f, ins, vectorize=True,
                                                 outer_jacobian_strategy="forward-mode")
        res[name, "hvp"] = F.hvp(f, ins, w)
        res[name, "vhp"] = F.vhp(f, ins, w)
        res[name, "vhp create_graph"] = F.vhp(f, ins, w, create_graph=True)
    return res


@pytest.mark.slow
def test_values_and_structures_match_torch():
    xs = {n: tuple(jnp.asarray(a) for a in spec[1]) for n, spec in VECTOR_FNS.items()}
    xs.update({n: tuple(jnp.asarray(a) for a in spec[1]) for n, spec in SCALAR_FNS.items()})
    vs = {n: tuple(jnp.asarray(a) for a in spec[2]) for n, spec in VECTOR_FNS.items()}
    got = jax.jit(_functx_values)(xs, vs)
    for name, (make, ins, v) in VECTOR_FNS.items():
        f, tins, tv = make(_T), _single(_t(*ins)), _single(_t(*v))
        tw = _single(_t(*[x * 0.5 + 1.0 for x in ins]))
        _assert_same(got[name, "vjp"], TF.vjp(f, tins, tv), f"{name} vjp")
        _assert_same(got[name, "jvp"], TF.jvp(f, tins, tw), f"{name} jvp")
        want = TF.jacobian(f, tins)
        _assert_same(got[name, "jacobian"], want, f"{name} jacobian")
        _assert_same(got[name, "jacobian vectorized"], TF.jacobian(f, tins, vectorize=True),
                     f"{name} jacobian vectorized")
        _assert_same(got[name, "jacobian forward"],
                     TF.jacobian(f, tins, vectorize=True, strategy="forward-mode"),
                     f"{name} jacobian forward-mode")
        _assert_same(got[name, "jacobian create_graph"], TF.jacobian(f, tins, create_graph=True),
                     f"{name} jacobian create_graph")
    for name, (make, ins) in SCALAR_FNS.items():
        f, tins = make(_T), _single(_t(*ins))
        tw = _single(_t(*[x * 0.5 + 1.0 for x in ins]))
        _assert_same(got[name, "hessian"], TF.hessian(f, tins), f"{name} hessian")
        _assert_same(got[name, "hessian forward"],
                     TF.hessian(f, tins, vectorize=True, outer_jacobian_strategy="forward-mode"),
                     f"{name} hessian forward")
        _assert_same(got[name, "hvp"], TF.hvp(f, tins, tw), f"{name} hvp")
        _assert_same(got[name, "vhp"], TF.vhp(f, tins, tw), f"{name} vhp")
        _assert_same(got[name, "vhp create_graph"], TF.vhp(f, tins, tw, create_graph=True),
                     f"{name} vhp create_graph")


@pytest.mark.slow
def test_v_may_be_none_for_one_element():
    f = lambda a: (a ** 3).sum()  # noqa: E731
    x1 = jnp.array([1.5])
    for fn, tfn in ((F.vjp, TF.vjp), (F.jvp, TF.jvp), (F.hvp, TF.hvp), (F.vhp, TF.vhp)):
        _assert_same(fn(f, x1), tfn(f, torch.tensor(np.array([1.5]))), fn.__name__)


# --------------------------------------------------------------------------
# create_graph and compositions with functx transforms, against JAX


@pytest.mark.slow
def test_create_graph_and_compositions_match_jax():
    f = lambda a: fnp.sin(a) * fnp.exp(a[0])  # noqa: E731
    jf = lambda a: jnp.sin(a) * jnp.exp(a[0])  # noqa: E731
    g = lambda a: (fnp.sin(a) * a ** 2).sum()  # noqa: E731
    jg = lambda a: (jnp.sin(a) * a ** 2).sum()  # noqa: E731

    @jax.jit
    def run(x, v, vs):
        r = {}
        # an outer grad sees the results only with create_graph=True
        r["grad vjp cg"] = fx.grad(lambda a: F.vjp(f, a, v, create_graph=True)[1].sum())(x)
        r["grad vjp"] = fx.grad(lambda a: F.vjp(f, a, v)[1].sum())(x)
        r["grad jvp cg"] = fx.grad(lambda a: F.jvp(f, a, v, create_graph=True)[1].sum())(x)
        r["grad jacobian cg"] = fx.grad(lambda a: F.jacobian(f, a, create_graph=True).sum())(x)
        r["grad hessian cg"] = fx.grad(lambda a: F.hessian(g, a, create_graph=True).sum())(x)
        r["grad hessian"] = fx.grad(lambda a: F.hessian(g, a).sum())(x)
        r["grad out"] = fx.grad(lambda a: F.vjp(f, a, v)[0].sum())(x)
        # batched
        r["vmap vjp"] = fx.vmap(lambda w: F.vjp(f, x, w)[1])(vs)
        r["vmap jacobian"] = fx.vmap(lambda a: F.jacobian(f, a))(vs)
        r["vmap hvp"] = fx.vmap(lambda w: F.hvp(g, x, w)[1])(vs)
        r["jacfwd vhp"] = fx.jacfwd(lambda a: F.vhp(g, a, v, create_graph=True)[1])(x)
        r["jit jacobian"] = fx.jit(lambda a: F.jacobian(f, a, strict=True))(x)
        r["jax.grad"] = jax.grad(lambda a: F.jvp(f, a, v, create_graph=True)[1].sum())(x)
        return r

    @jax.jit
    def oracle(x, v, vs):
        r = {}
        r["grad vjp cg"] = jax.grad(lambda a: jax.vjp(jf, a)[1](v)[0].sum())(x)
        r["grad vjp"] = jnp.zeros(3)
        r["grad jvp cg"] = jax.grad(lambda a: jax.jvp(jf, (a,), (v,))[1].sum())(x)
        r["grad jacobian cg"] = jax.grad(lambda a: jax.jacrev(jf)(a).sum())(x)
        r["grad hessian cg"] = jax.grad(lambda a: jax.hessian(jg)(a).sum())(x)
        r["grad hessian"] = jnp.zeros(3)
        r["grad out"] = jnp.zeros(3)
        r["vmap vjp"] = jax.vmap(lambda w: jax.vjp(jf, x)[1](w)[0])(vs)
        r["vmap jacobian"] = jax.vmap(jax.jacrev(jf))(vs)
        r["vmap hvp"] = jax.vmap(lambda w: jax.jvp(jax.grad(jg), (x,), (w,))[1])(vs)
        r["jacfwd vhp"] = jax.jacfwd(lambda a: jax.vjp(jax.grad(jg), a)[1](v)[0])(x)
        r["jit jacobian"] = jax.jacrev(jf)(x)
        r["jax.grad"] = r["grad jvp cg"]
        return r

    x, v = jnp.asarray(X), jnp.asarray(V3)
    vs = jnp.asarray(np.array([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0]]))
    got, want = run(x, v, vs), oracle(x, v, vs)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-10,
                                   atol=1e-12, err_msg=k)


# --------------------------------------------------------------------------
# strict=True: the same error conditions as torch

VEC_STRICT = {
    "all dependent": lambda M: lambda a, b: (M.sin(a) * b.sum(), a.sum() * b ** 2),
    "constant output": lambda M: lambda a, b: ((a ** 2) * b.sum(), M.ones(2)),
    "unused input": lambda M: lambda a, b: M.sin(a) * 2.0,
    "pairwise": lambda M: lambda a, b: (M.sin(a), b ** 2),
    "linear": lambda M: lambda a, b: 3.0 * a + b.sum(),
    "half linear": lambda M: lambda a, b: (a ** 2 * b.sum(), 3.0 * b),
    "times zero": lambda M: lambda a, b: M.sin(a) + 0.0 * b.sum(),
}
SCALAR_STRICT = {
    "coupled": lambda M: lambda a, b: M.sin(a).sum() * (b ** 2).sum(),
    "separable": lambda M: lambda a, b: (a ** 3).sum() + (b ** 3).sum(),
    "quadratic": lambda M: lambda a, b: (a ** 2).sum() + (a.sum() * b).sum(),
    "linear in b": lambda M: lambda a, b: M.sin(a).sum() + b.sum(),
    "unused b": lambda M: lambda a, b: M.sin(a).sum(),
    "cubic": lambda M: lambda a, b: (a ** 3).sum() * (b ** 3).sum(),
}


def _torch_raises(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except RuntimeError:
        return True
    return False


def _functx_raises(call):
    """Trace `call(x, y)` only (the strict checks are structural)."""
    try:
        jax.make_jaxpr(call)(jnp.asarray(X), jnp.asarray(Y))
    except IndependenceError as e:
        assert isinstance(e, RuntimeError)
        return True
    return False


@pytest.mark.parametrize("name", list(VEC_STRICT))
def test_strict_vector_functions_raise_like_torch(name):
    ft, ff = VEC_STRICT[name](_T), VEC_STRICT[name](_J)
    out = ft(*_t(X, Y))
    tv = tuple(torch.ones_like(o) for o in out) if isinstance(out, tuple) else torch.ones_like(out)
    fv = tree_util.tree_map(lambda t: jnp.asarray(t.numpy()), tv)
    for cg in (False, True):
        cases = {
            "vjp": (lambda: TF.vjp(ft, _t(X, Y), tv, create_graph=cg, strict=True),
                    lambda a, b: F.vjp(ff, (a, b), fv, create_graph=cg, strict=True)),
            "jvp": (lambda: TF.jvp(ft, _t(X, Y), _t(X, Y), create_graph=cg, strict=True),
                    lambda a, b: F.jvp(ff, (a, b), (a, b), create_graph=cg, strict=True)),
            "jacobian": (lambda: TF.jacobian(ft, _t(X, Y), create_graph=cg, strict=True),
                         lambda a, b: F.jacobian(ff, (a, b), create_graph=cg, strict=True)),
        }
        for api, (tcall, fcall) in cases.items():
            assert _functx_raises(fcall) == _torch_raises(tcall), f"{name}: {api}, create_graph={cg}"


@pytest.mark.parametrize("name", list(SCALAR_STRICT))
def test_strict_scalar_functions_raise_like_torch(name):
    ft, ff = SCALAR_STRICT[name](_T), SCALAR_STRICT[name](_J)
    for cg in (False, True):
        cases = {
            "hessian": (lambda: TF.hessian(ft, _t(X, Y), create_graph=cg, strict=True),
                        lambda a, b: F.hessian(ff, (a, b), create_graph=cg, strict=True)),
            "hvp": (lambda: TF.hvp(ft, _t(X, Y), _t(X, Y), create_graph=cg, strict=True),
                    lambda a, b: F.hvp(ff, (a, b), (a, b), create_graph=cg, strict=True)),
            "vhp": (lambda: TF.vhp(ft, _t(X, Y), _t(X, Y), create_graph=cg, strict=True),
                    lambda a, b: F.vhp(ff, (a, b), (a, b), create_graph=cg, strict=True)),
        }
        for api, (tcall, fcall) in cases.items():
            assert _functx_raises(fcall) == _torch_raises(tcall), f"{name}: {api}, create_graph={cg}"


def test_strict_messages_name_the_output_and_the_input():
    cases = [
        ("output 1 .* independent of input 0",
         lambda x, y: F.jacobian(lambda a, b: (fnp.sin(a), b ** 2), (x, y), strict=True)),
        ("output 1 .* does not depend on any input",
         lambda x, y: F.vjp(lambda a: (a * 2.0, jnp.ones(2)), x, (x, jnp.ones(2)), strict=True)),
        ("independent of input 1", lambda x, y: F.vjp(lambda a, b: a * 2.0, (x, y), x, strict=True)),
        ("input 0 does not depend on the inputs",
         lambda x, y: F.vjp(lambda a: a * 2.0, x, x, strict=True, create_graph=True)),
        (r"block \[0\]\[1\]",
         lambda x, y: F.hessian(lambda a, b: (a ** 3).sum() + (b ** 3).sum(), (x, y), strict=True)),
    ]
    for pattern, call in cases:
        with pytest.raises(IndependenceError, match=pattern):
            jax.make_jaxpr(call)(jnp.asarray(X), jnp.asarray(Y))


# --------------------------------------------------------------------------
# Argument errors: torch's conditions and exception classes


def _exc(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        return e
    return None


def test_argument_errors_match_torch():
    x, tx = jnp.asarray(X), torch.tensor(X)
    f, tf = (lambda a: a * 2.0), (lambda a: a * 2.0)
    cases = [
        ("v None, many elements", lambda: F.vjp(f, x), lambda: TF.vjp(tf, tx)),
        ("jvp v None", lambda: F.jvp(f, x), lambda: TF.jvp(tf, tx)),
        ("v wrong shape", lambda: F.vjp(f, x, jnp.ones(2)), lambda: TF.vjp(tf, tx, torch.ones(2))),
        ("v wrong length", lambda: F.jvp(f, (x, x), (x,)),
         lambda: TF.jvp(lambda a, b: a, (tx, tx), (tx,))),
        ("hessian of a vector", lambda: F.hessian(f, x), lambda: TF.hessian(tf, tx)),
        ("hessian of a tuple", lambda: F.hessian(lambda a: (a.sum(),), x),
         lambda: TF.hessian(lambda a: (a.sum(),), tx)),
        ("forward without vectorize",
         lambda: F.jacobian(f, x, strategy="forward-mode"),
         lambda: TF.jacobian(tf, tx, strategy="forward-mode")),
        ("forward with create_graph",
         lambda: F.jacobian(f, x, vectorize=True, create_graph=True, strategy="forward-mode"),
         lambda: TF.jacobian(tf, tx, vectorize=True, create_graph=True, strategy="forward-mode")),
        ("forward with strict",
         lambda: F.jacobian(f, x, vectorize=True, strict=True, strategy="forward-mode"),
         lambda: TF.jacobian(tf, tx, vectorize=True, strict=True, strategy="forward-mode")),
        ("strict with vectorize", lambda: F.jacobian(f, x, vectorize=True, strict=True),
         lambda: TF.jacobian(tf, tx, vectorize=True, strict=True)),
        ("hessian forward without vectorize",
         lambda: F.hessian(lambda a: a.sum(), x, outer_jacobian_strategy="forward-mode"),
         lambda: TF.hessian(lambda a: a.sum(), tx, outer_jacobian_strategy="forward-mode")),
    ]
    for what, ours, theirs in cases:
        mine, torch_e = _exc(ours), _exc(theirs)
        assert torch_e is not None and mine is not None, what
        assert isinstance(mine, fx.FunctxError), what
        for base in (NotImplementedError, RuntimeError, TypeError):
            if isinstance(torch_e, base):
                assert isinstance(mine, base), f"{what}: {type(mine)} is not a {base.__name__}"
                break
    assert isinstance(_exc(lambda: F.vjp(f, x, jnp.ones(2))), AutogradValueError)
    assert isinstance(_exc(lambda: F.jacobian(f, x, strategy="forward-mode")),
                      AutogradNotImplementedError)
    # a list is not a tuple of inputs (as in torch), and strategies are checked
    with pytest.raises(TypeError, match="tuple"):
        F.jacobian(lambda a, b: a, [x, x])
    with pytest.raises(ValueError, match="reverse-mode"):
        F.jacobian(f, x, strategy="backward")
