# %% [markdown]
# # Per-sample gradients with functx
#
# `grad` of a loss gives the gradient averaged over a batch. Many methods
# (differential privacy, influence functions, gradient-noise estimates)
# need the gradient of *each example* instead. With composable transforms
# that is `vmap(grad(loss))`: `grad` differentiates the loss of one example,
# `vmap` runs it for every example of the batch at once.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import functx
import functx.numpy as fnp

rng = np.random.default_rng(0)


def init_params(sizes):
    return [
        {"w": jnp.asarray(rng.standard_normal((m, n)) / np.sqrt(n)), "b": jnp.zeros(m)}
        for n, m in zip(sizes[:-1], sizes[1:])
    ]


def mlp(params, x):
    for layer in params[:-1]:
        x = fnp.tanh(layer["w"] @ x + layer["b"])
    last = params[-1]
    return last["w"] @ x + last["b"]


def loss(params, x, label):
    """Cross-entropy of one example."""
    logits = mlp(params, x)
    return -functx.nn.log_softmax(logits)[label]


params = init_params([8, 16, 16, 4])
xs = jnp.asarray(rng.standard_normal((32, 8)))
labels = jnp.asarray(rng.integers(0, 4, 32))

# %% [markdown]
# One call computes all 32 gradients. `in_dims=(None, 0, 0)`: the
# parameters are shared, the examples and labels are mapped over.

# %%
per_sample = functx.vmap(functx.grad(loss), in_dims=(None, 0, 0))(params, xs, labels)
print("per-sample gradient of the first weight matrix:", per_sample[0]["w"].shape)

# %% [markdown]
# Check against the obvious (slow) way: a Python loop over examples.

# %%
loop = [functx.grad(loss)(params, x, y) for x, y in zip(xs, labels)]
stacked = jax.tree_util.tree_map(lambda *g: jnp.stack(g), *loop)
err = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree_util.tree_leaves(per_sample), jax.tree_util.tree_leaves(stacked))
)
print(f"max difference from the per-example loop: {err:.2e}")
assert err < 1e-5

# %% [markdown]
# A DP-SGD style update: clip each example's gradient to norm at most 1,
# then average.

# %%
def global_norm(tree):
    return fnp.sqrt(sum(fnp.sum(g ** 2) for g in jax.tree_util.tree_leaves(tree)))


norms = functx.vmap(global_norm)(per_sample)
scale = fnp.minimum(1.0, 1.0 / norms)
clipped = jax.tree_util.tree_map(
    lambda g: fnp.mean(g * scale.reshape((-1,) + (1,) * (g.ndim - 1)), axis=0), per_sample
)
print("per-example gradient norms (first 4):", np.round(np.asarray(norms[:4]), 3))
print("clipped mean gradient norm:", float(global_norm(clipped)))
assert float(global_norm(clipped)) <= 1.0 + 1e-6
