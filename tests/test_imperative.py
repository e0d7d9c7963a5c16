"""Imperative autograd (functx.autograd.Tensor, backward, grad) against
torch.autograd running the same programs on the same float64 values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx as fx
import functx.numpy as fnp
from functx.autograd import Tensor, tensor

torch = pytest.importorskip("torch")

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 3))
W = rng.standard_normal((3, 5))
B = rng.standard_normal((1, 5))


def close(a, b, rtol=1e-10):
    a = a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-12)


def both(requires=(True, True, True)):
    """The same leaves as functx tensors and as torch tensors."""
    ours = [Tensor(jnp.asarray(v), requires_grad=r) for v, r in zip((X, W, B), requires)]
    theirs = [torch.tensor(v, requires_grad=r) for v, r in zip((X, W, B), requires)]
    return ours, theirs


def mlp_loss(np_, relu, x, w, b):
    h = relu(x @ w + b)
    y = np_.tanh(h[:, 1:4]) * x.sum(1, keepdims=True) ** 2
    return (y / 3.0 - h.mean()).sum()


def ours_loss(x, w, b):
    return mlp_loss(fnp, fx.nn.relu, x, w, b)


def torch_loss(x, w, b):
    return mlp_loss(torch, torch.relu, x, w, b)


@pytest.mark.slow
def test_backward_accumulates_into_leaves_like_torch():
    ours, theirs = both()
    ours_loss(*ours).backward(retain_graph=True)
    torch_loss(*theirs).backward(retain_graph=True)
    for a, b in zip(ours, theirs):
        close(a.grad, b.grad)
    # a second pass over a new graph adds to .grad
    ours_loss(*ours).backward()
    torch_loss(*theirs).backward()
    for a, b in zip(ours, theirs):
        close(a.grad, b.grad)
        assert a.is_leaf and a.grad_fn is None and not a.grad.requires_grad


def test_second_backward_needs_retain_graph():
    x = Tensor(jnp.asarray(X), requires_grad=True)
    y = (fnp.sin(x) * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    close(x.grad, 2 * (np.cos(X) * X + np.sin(X)))
    with pytest.raises(fx.FunctxRuntimeError, match="second time.*retain_graph=True") as e:
        y.backward()
    assert isinstance(e.value, RuntimeError)


def test_autograd_grad_returns_gradients_without_accumulating():
    ours, theirs = both()
    got = fx.autograd.grad(ours_loss(*ours), ours[:2])
    want = torch.autograd.grad(torch_loss(*theirs), theirs[:2])
    assert isinstance(got, tuple) and len(got) == 2
    for a, b in zip(got, want):
        close(a, b)
    assert all(t.grad is None for t in ours)


def test_grad_of_non_leaf_inputs_and_grad_outputs():
    ours, theirs = both()
    hs = [x @ w + b for x, w, b in (ours, theirs)]
    outs = [fnp.tanh(hs[0]), torch.tanh(hs[1])]
    v = rng.standard_normal(outs[1].shape)
    got = fx.autograd.grad(outs[0], (hs[0], ours[1]), grad_outputs=jnp.asarray(v))
    want = torch.autograd.grad(outs[1], (hs[1], theirs[1]), grad_outputs=torch.tensor(v))
    for a, b in zip(got, want):
        close(a, b)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.slow
def test_create_graph_gives_second_derivatives():
    x = Tensor(jnp.asarray(X[0]), requires_grad=True)
    tx = torch.tensor(X[0], requires_grad=True)
    v = rng.standard_normal(3)

    def f(np_, x):
        return (np_.exp(x) * x[0] + x ** 3).sum()

    (g,) = fx.autograd.grad(f(fnp, x), x, create_graph=True)
    (tg,) = torch.autograd.grad(f(torch, tx), tx, create_graph=True)
    close(g, tg)
    assert g.requires_grad and g.grad_fn is not None
    (hv,) = fx.autograd.grad((g * jnp.asarray(v)).sum(), x)
    (thv,) = torch.autograd.grad((tg * torch.tensor(v)).sum(), tx)
    close(hv, thv)
    # backward(create_graph=True) leaves a differentiable .grad
    f(fnp, x).backward(create_graph=True)
    assert x.grad.requires_grad
    (hh,) = fx.autograd.grad(x.grad.sum(), x)
    f(torch, tx).backward(create_graph=True)
    (thh,) = torch.autograd.grad(tx.grad.sum(), tx)
    close(hh, thh)


@pytest.mark.slow
def test_shared_subgraphs_several_outputs_and_third_order():
    v0 = rng.standard_normal((1, 4))

    def prog(np_, split, x, v):
        a, b, _ = split(x)
        s = np_.sin(a) * b  # x reaches s along two paths
        return (s * s).sum() + (a * v).sum(), np_.exp(s).sum()

    x, v = Tensor(jnp.asarray(X.T), requires_grad=True), Tensor(jnp.asarray(v0), requires_grad=True)
    tx, tv = torch.tensor(X.T, requires_grad=True), torch.tensor(v0, requires_grad=True)
    outs = prog(fnp, lambda t: fnp.split(t, 3, axis=0), x, v)
    touts = prog(torch, lambda t: torch.split(t, 1, dim=0), tx, tv)
    g = fx.autograd.grad(outs, (x, v), grad_outputs=(jnp.asarray(2.0), jnp.asarray(-1.0)),
                         create_graph=True)
    tg = torch.autograd.grad(touts, (tx, tv), grad_outputs=(torch.tensor(2.0, dtype=torch.float64),
                             torch.tensor(-1.0, dtype=torch.float64)), create_graph=True)
    for a, b in zip(g, tg):
        close(a, b)
    h = fx.autograd.grad((g[0] ** 2).sum() + g[1].sum(), (x, v))
    th = torch.autograd.grad((tg[0] ** 2).sum() + tg[1].sum(), (tx, tv))
    for a, b in zip(h, th):
        close(a, b)
    # third order, each gradient differentiated again
    y, ty = (fnp.sin(x) ** 3).sum(), (torch.sin(tx) ** 3).sum()
    for _ in range(3):
        (y,) = fx.autograd.grad(y, x, create_graph=True)
        (ty,) = torch.autograd.grad(ty, tx, create_graph=True)
        close(y, ty)
        y, ty = y.sum(), ty.sum()


def test_unused_inputs():
    x = Tensor(jnp.asarray(X), requires_grad=True)
    u = Tensor(jnp.asarray(W), requires_grad=True)
    y = (x * 2).sum()
    with pytest.raises(fx.FunctxRuntimeError, match="not have been used.*allow_unused=True"):
        fx.autograd.grad(y, (x, u), retain_graph=True)
    gx, gu = fx.autograd.grad(y, (x, u), allow_unused=True, retain_graph=True)
    close(gx, np.full(X.shape, 2.0))
    assert gu is None
    _, gu = fx.autograd.grad(y, (x, u), materialize_grads=True)
    close(gu, np.zeros(W.shape))


@pytest.mark.slow
def test_hooks_retain_grad_and_node_hooks_like_torch():
    def run(lib, make, relu):
        x = make(X)
        w = make(W)
        seen = []
        hx = x.register_hook(lambda g: g * 3.0)
        h = x @ w
        h.retain_grad()
        h.register_hook(lambda g: seen.append(g.shape))
        z = relu(h)
        s = (z * z).sum()
        z.grad_fn.register_prehook(lambda gouts: tuple(g * 0.5 for g in gouts))
        h.grad_fn.register_hook(lambda gins, gouts: tuple(2.0 * g for g in gins))
        s.backward(retain_graph=True)
        hx.remove()
        x.grad = None
        (z * 1.0).sum().backward()
        return x.grad, w.grad, h.grad, seen

    ours = run(fnp, lambda v: Tensor(jnp.asarray(v), requires_grad=True), fx.nn.relu)
    theirs = run(torch, lambda v: torch.tensor(v, requires_grad=True), torch.relu)
    for a, b in zip(ours[:3], theirs[:3]):
        close(a, b)
    assert [tuple(s) for s in ours[3]] == [tuple(s) for s in theirs[3]] == [(4, 5), (4, 5)]


def test_graph_structure_like_torch():
    x = Tensor(jnp.asarray(X), requires_grad=True)
    c = Tensor(jnp.asarray(X))
    y = x * c
    assert not c.requires_grad and y.requires_grad and not y.is_leaf
    assert y.grad_fn.name() == "MultiplyBackward0"
    (first, second) = y.grad_fn.next_functions
    assert first[0].variable is x and first[0].name().endswith("AccumulateGrad")
    assert second == (None, 0)
    s = y.sum()
    assert s.grad_fn.next_functions[0][0] is y.grad_fn
    assert y.detach().grad_fn is None and not y.detach().requires_grad
    np.testing.assert_array_equal(y.detach().numpy(), X * X)


@pytest.mark.slow
def test_multiple_outputs_and_lifted_jax_functions():
    x = Tensor(jnp.asarray(X), requires_grad=True)
    tx = torch.tensor(X, requires_grad=True)
    a, b = fnp.split(x, 2, axis=0)
    ta, tb = torch.split(tx, 2, dim=0)
    (fx.lift(jax.nn.softplus)(a).sum() * 2).backward()
    (torch.nn.functional.softplus(ta).sum() * 2).backward()
    close(x.grad, tx.grad)
    assert b.grad_fn is a.grad_fn and b.output_nr == 1


def test_autograd_function_on_tensors_uses_its_backward():
    def make(base, np_):
        class ScaledExp(base):
            @staticmethod
            def forward(x, k):
                return np_.exp(x) * k

            @staticmethod
            def setup_context(ctx, inputs, output):
                ctx.save_for_backward(output)

            @staticmethod
            def backward(ctx, g):
                (out,) = ctx.saved_tensors
                return 2.0 * g * out, None  # twice the true derivative, on purpose

        return ScaledExp

    ours, theirs = make(fx.autograd.Function, fnp), make(torch.autograd.Function, torch)
    x = Tensor(jnp.asarray(X), requires_grad=True)
    tx = torch.tensor(X, requires_grad=True)
    y, ty = ours.apply(x * 1.0, 3.0), theirs.apply(tx * 1.0, 3.0)
    assert y.grad_fn.name() == ty.grad_fn.name() == "ScaledExpBackward"
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    close(x.grad, tx.grad)


@pytest.mark.slow
def test_equinox_model_with_tensor_parameters():
    """A torch-style training step on an Equinox model whose parameters are
    tensors (called through functx.lift), against jax.grad."""
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    is_tensor = lambda v: isinstance(v, Tensor)  # noqa: E731
    tparams = jax.tree_util.tree_map(lambda a: Tensor(a, requires_grad=True), params)
    x = jnp.asarray(X)
    tmodel = eqx.combine(tparams, static, is_leaf=is_tensor)
    out = fx.lift(lambda m, v: jax.vmap(m)(v))(tmodel, x)  # tensors found in the model's leaves
    (out ** 2).sum().backward()
    want = jax.grad(lambda p: (jax.vmap(eqx.combine(p, static))(x) ** 2).sum())(params)
    got = jax.tree_util.tree_map(lambda t: t.grad.array, tparams, is_leaf=is_tensor)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        close(a, b)
    assert out.shape == (4, 2) and out.grad_fn is not None


def test_backward_inputs_and_grad_modes():
    ours, theirs = both()
    ours_loss(*ours).backward(inputs=[ours[1]])
    torch_loss(*theirs).backward(inputs=[theirs[1]])
    assert ours[0].grad is None and theirs[0].grad is None
    close(ours[1].grad, theirs[1].grad)
    # a non-leaf among `inputs` gets its gradient in .grad, and only what
    # leads to the inputs runs (the leaf hook below must not fire)
    ours, theirs = both()
    fired = []
    for x, w, b in (ours, theirs):
        x.register_hook(lambda g: fired.append(1))
    hs = [x @ w for x, w, _ in (ours, theirs)]
    (fnp.sin(hs[0]) * ours[2]).sum().backward(inputs=[hs[0], ours[2]])
    (torch.sin(hs[1]) * theirs[2]).sum().backward(inputs=[hs[1], theirs[2]])
    close(hs[0].grad, hs[1].grad)
    close(ours[2].grad, theirs[2].grad)
    assert ours[0].grad is None and theirs[0].grad is None and not fired
    with fx.no_grad():
        y = ours[0] * 2
    assert not y.requires_grad and y.grad_fn is None
    with fx.enable_grad():
        assert (ours[0] * 2).requires_grad


def test_sgd_steps_update_leaves_in_place_like_torch():
    def train(lib, make, relu, no_grad):
        x, w, b = make(X, False), make(W, True), make(B, True)
        for _ in range(3):
            loss = (relu(x @ w + b) ** 2).mean()
            loss.backward()
            with no_grad():
                w -= 0.1 * w.grad
                b.sub_(b.grad, alpha=0.1)
            w.grad.zero_()
            b.grad = None
        return w, b, loss

    ours = train(fnp, lambda v, r: Tensor(jnp.asarray(v), requires_grad=r), fx.nn.relu,
                 fx.no_grad)
    theirs = train(torch, lambda v, r: torch.tensor(v, requires_grad=r), torch.relu,
                   torch.no_grad)
    for a, b in zip(ours, theirs):
        close(a, b)
    assert ours[0].is_leaf and ours[0].requires_grad and ours[0].grad_fn is None
    np.testing.assert_array_equal(ours[0].grad.numpy(), 0.0)


def test_in_place_misuse():
    w = Tensor(jnp.asarray(W), requires_grad=True)
    with pytest.raises(fx.FunctxRuntimeError, match="leaf tensor that requires grad.*no_grad"):
        w += 1.0
    c = Tensor(jnp.asarray(X))
    y = (c @ w).sum()
    with fx.no_grad():
        w += 1.0  # after it was used: its gradient would be stale
    with pytest.raises(fx.FunctxRuntimeError, match="modified by an in-place operation"):
        y.backward()
    h = c @ w
    with pytest.raises(fx.FunctxRuntimeError, match="not recorded"):
        h *= 2.0
    with pytest.raises(fx.FunctxRuntimeError, match="shape"), fx.no_grad():
        c.copy_(jnp.ones((2, 4, 3)))


@pytest.mark.slow
def test_tensor_behaves_like_an_array():
    t = tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    assert t.shape == (2, 2) and t.ndim == 2 and t.dtype == jnp.float64
    close(t.T @ t, np.array([[10.0, 14.0], [14.0, 20.0]]))
    assert float(t[1, 0]) == 3.0 and (t > 2.0).dtype == jnp.bool_
    assert not (t > 2.0).requires_grad
    close(1.0 - t, 1.0 - t.numpy())
    close(np.ones((2, 2)) * t, t.numpy())
    assert len(t) == 2 and [r.shape for r in t] == [(2,), (2,)]
    assert "requires_grad=True" in repr(t) and "grad_fn=<" in repr(t * 1.0)
    assert isinstance(t.array, jax.Array)


def test_misuse_errors_name_the_fix():
    with pytest.raises(fx.FunctxRuntimeError, match="floating point"):
        Tensor(jnp.arange(3), requires_grad=True)
    x = Tensor(jnp.asarray(X), requires_grad=True)
    y = x * 2
    with pytest.raises(fx.FunctxRuntimeError, match="leaf"):
        y.requires_grad = False
    with pytest.raises(fx.FunctxRuntimeError, match="implicitly created only for scalar"):
        y.backward()
    with pytest.raises(fx.FunctxRuntimeError, match="does not require grad"):
        Tensor(jnp.asarray(X)).sum().backward()
    with pytest.raises(fx.FunctxRuntimeError, match="shape"):
        y.backward(jnp.ones(3))
    with pytest.raises(fx.JaxOnFunctxValueError, match="autograd.Tensor.*functx.numpy.*t.array"):
        jnp.sin(x)
    with pytest.raises(fx.FunctxTypeError, match="transform.*t.array") as e:
        fx.grad(lambda v: (v * x).sum())(jnp.asarray(X))
    assert isinstance(e.value, TypeError)
