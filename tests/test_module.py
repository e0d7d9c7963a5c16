"""functional_call, stack_module_state and named parameters on Equinox
models, against per-example / per-model loops of jax.grad (float64), plus
the argument errors and Equinox state (BatchNorm) under transforms."""

import equinox as eqx
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import functx as fx

rng = np.random.default_rng(3)
KEYS = jax.random.split(jax.random.PRNGKey(0), 8)

MLP = eqx.nn.MLP(4, 3, 8, 2, key=KEYS[0])
CNN = eqx.nn.Sequential([
    eqx.nn.Conv2d(1, 3, 3, padding=1, key=KEYS[1]),
    eqx.nn.Lambda(jax.nn.relu),
    eqx.nn.Lambda(jnp.ravel),
    eqx.nn.Linear(3 * 5 * 5, 2, key=KEYS[2]),
])
XS = jnp.asarray(rng.normal(size=(5, 4)))
IMGS = jnp.asarray(rng.normal(size=(5, 1, 5, 5)))
YS = jnp.asarray(rng.normal(size=(5, 3)))


def close(a, b, rtol=1e-6):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=1e-12)


def per_example_grads(model, xs, loss):
    """The oracle: jax.grad per example, as a dict by dotted path."""
    out = [fx.named_parameters(eqx.filter_grad(loss)(model, x)) for x in xs]
    return {k: jnp.stack([o[k] for o in out]) for k in out[0]}


def test_named_parameters_are_dotted_paths():
    names = list(fx.named_parameters(MLP))
    assert names == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                     "layers.2.weight", "layers.2.bias"]
    assert fx.named_buffers(MLP) == {}


def test_functional_call_replaces_the_named_leaves_only():
    params = fx.named_parameters(MLP)
    close(fx.functional_call(MLP, params, (XS[0],)), MLP(XS[0]))
    zero_last = {"layers.2.weight": jnp.zeros((3, 8)), "layers.2.bias": jnp.ones(3)}
    close(fx.functional_call(MLP, zero_last, XS[0]), jnp.ones(3))


@pytest.mark.parametrize("model, xs", [(MLP, XS), (CNN, IMGS)], ids=["mlp", "cnn"])
@pytest.mark.slow
def test_per_sample_gradients_equal_a_per_example_loop(model, xs):
    def loss(m, x):
        return jnp.sum(jnp.tanh(m(x)) ** 2)

    def fx_loss(p, x):
        return (fx.numpy.tanh(fx.functional_call(model, p, (x,))) ** 2).sum()

    got = fx.vmap(fx.grad(fx_loss), in_dims=(None, 0))(fx.named_parameters(model), xs)
    close(got, per_example_grads(model, xs, loss))


@pytest.mark.slow
def test_ensemble_forward_and_backward_equal_the_per_model_loop():
    models = [eqx.nn.MLP(4, 3, 8, 2, key=k) for k in KEYS[:4]]
    params, buffers = fx.stack_module_state(models)
    assert params["layers.0.weight"].shape == (4, 8, 4) and buffers == {}

    def loss(p, b, x, y):
        return ((fx.functional_call(models[0], (p, b), (x,)) - y) ** 2).sum()

    x, y = XS[0], YS[0]
    outs = fx.vmap(lambda p, b: fx.functional_call(models[0], (p, b), (x,)))(params, buffers)
    close(outs, jnp.stack([m(x) for m in models]))
    grads = fx.vmap(fx.grad(loss), in_dims=(0, 0, None, None))(params, buffers, x, y)
    want = [fx.named_parameters(eqx.filter_grad(lambda m: jnp.sum((m(x) - y) ** 2))(m))
            for m in models]
    close(grads, {k: jnp.stack([w[k] for w in want]) for k in want[0]})
    # a different minibatch per model
    outs = fx.vmap(lambda p, b, x: fx.functional_call(models[0], (p, b), (x,)))(
        params, buffers, XS[:4])
    close(outs, jnp.stack([m(x) for m, x in zip(models, XS[:4])]))


@pytest.mark.slow
def test_tied_weights_follow_each_other_unless_untied():
    lin = eqx.nn.Linear(3, 3, use_bias=False, key=KEYS[5])
    tied = eqx.nn.Sequential([lin, lin])  # the same weight array twice
    w = jnp.eye(3) * 2.0
    x = jnp.arange(3.0)
    close(fx.functional_call(tied, {"layers.0.weight": w}, x), 4.0 * x)
    close(fx.functional_call(tied, {"layers.0.weight": w}, x, tie_weights=False), lin.weight @ (w @ x))
    with pytest.raises(fx.FunctxValueError, match="tied.*different values"):
        fx.functional_call(tied, {"layers.0.weight": w, "layers.1.weight": w + 1.0}, x)
    # gradients through a tied weight add up
    g = fx.grad(lambda w: fx.functional_call(tied, {"layers.0.weight": w}, x).sum())(lin.weight)
    close(g, jax.grad(lambda w: (w @ (w @ x)).sum())(lin.weight))


def test_functional_call_argument_errors():
    params = fx.named_parameters(MLP)
    with pytest.raises(fx.FunctxValueError, match=r"layers\.0\.weigth.*did you mean 'layers\.0\.weight'"):
        fx.functional_call(MLP, {"layers.0.weigth": params["layers.0.weight"]}, XS[0])
    with pytest.raises(fx.FunctxValueError, match=r"strict=True.*layers\.1\.bias"):
        fx.functional_call(MLP, {k: v for k, v in params.items() if k != "layers.1.bias"}, XS[0],
                           strict=True)
    with pytest.raises(fx.FunctxValueError, match="distinct keys"):
        fx.functional_call(MLP, (params, {"layers.0.bias": params["layers.0.bias"]}), XS[0])
    with pytest.raises(fx.FunctxTypeError, match="params_and_buffers"):
        fx.functional_call(MLP, [1, 2], XS[0])


def test_stack_module_state_rejects_mismatched_models():
    with pytest.raises(fx.FunctxValueError, match="structure of model 0"):
        fx.stack_module_state([MLP, eqx.nn.MLP(4, 3, 8, 3, key=KEYS[6])])
    single = jax.tree_util.tree_map(lambda a: a.astype(np.float32) if eqx.is_array(a) else a, MLP)
    with pytest.raises(fx.FunctxValueError, match="layers.0.weight.*dtype float32"):
        fx.stack_module_state([MLP, single])
    with pytest.raises(fx.FunctxValueError, match="no models"):
        fx.stack_module_state([])


@pytest.mark.slow
def test_batchnorm_state_under_vmap_and_grad():
    # Equinox keeps BatchNorm's running statistics in an eqx.nn.State passed
    # alongside the model. Under functx transforms run it in inference mode
    # (running statistics, no cross-example collective): a pure function of
    # (params, state, x), like torch.func's replace_all_batch_norm_modules_.
    model, state = eqx.nn.make_with_state(eqx.nn.Sequential)([
        eqx.nn.Linear(4, 6, key=KEYS[7]), eqx.nn.BatchNorm(6, axis_name="batch", mode="batch"),
        eqx.nn.Linear(6, 1, key=KEYS[4])])
    model = eqx.nn.inference_mode(model)

    def fx_loss(p, x, state):
        y, _ = fx.functional_call(model, p, (x, state))
        return (y ** 2).sum()

    def jax_loss(m, x):
        return (m(x, state)[0] ** 2).sum()

    got = fx.vmap(fx.grad(fx_loss), in_dims=(None, 0, None))(fx.named_parameters(model), XS, state)
    close(got, per_example_grads(model, XS, jax_loss))


def _layer_cases():
    k = jax.random.split(jax.random.PRNGKey(9), 6)
    dropout = eqx.nn.Dropout(0.5)
    return [
        ("linear", eqx.nn.Linear(4, 3, key=k[0]), lambda m, x: m(x), XS),
        ("layernorm", eqx.nn.LayerNorm(4), lambda m, x: m(x), XS),
        ("embedding", eqx.nn.Embedding(7, 3, key=k[1]), lambda m, i: m(i), jnp.arange(5) % 7),
        ("attention", eqx.nn.MultiheadAttention(2, 4, key=k[2]),
         lambda m, x: m(x.reshape(2, 2).repeat(2, 1), x.reshape(2, 2).repeat(2, 1),
                        x.reshape(2, 2).repeat(2, 1)), XS),
        ("conv1d", eqx.nn.Conv1d(1, 2, 3, key=k[3]), lambda m, x: m(x[None]), XS),
        ("dropout_with_key", eqx.nn.Sequential([eqx.nn.Linear(4, 4, key=k[4]), dropout]),
         lambda m, x: m(x, key=k[5]), XS),
    ]


@pytest.mark.parametrize("name, layer, apply, xs", _layer_cases(), ids=[c[0] for c in _layer_cases()])
@pytest.mark.slow
def test_equinox_layers_under_vmap_grad_and_jvp(name, layer, apply, xs):
    params = fx.named_parameters(layer)

    def fx_loss(p, x):
        out = apply(lambda *a, **kw: fx.functional_call(layer, p, a, kw), x)
        return (out ** 2).sum()

    got = fx.vmap(fx.grad(fx_loss), in_dims=(None, 0))(params, xs)
    close(got, per_example_grads(layer, xs, lambda m, x: (apply(m, x) ** 2).sum()))
    tangent = {k: jnp.ones_like(v) for k, v in params.items()}
    _, t = fx.jvp(lambda p: fx_loss(p, xs[0]), (params,), (tangent,))
    _, want = jax.jvp(
        lambda ws: (apply(eqx.tree_at(lambda m: [getattr_path(m, n) for n in params], layer, list(ws)),
                          xs[0]) ** 2).sum(),
        (list(params.values()),), (list(tangent.values()),))
    close(t, want)


def getattr_path(obj, dotted):
    for part in dotted.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj
