# %% [markdown]
# # Per-sample gradients with functx
#
# `grad` of a loss gives the gradient averaged over a batch. Many methods
# (differential privacy, influence functions, gradient-noise estimates)
# need the gradient of *each example* instead. With composable transforms
# that is `vmap(grad(loss))`: `grad` differentiates the loss of one example,
# `vmap` runs it for every example of the batch at once.
#
# This example computes per-sample gradients of a small MLP, checks them
# against a loop over examples, and uses them for one step of DP-SGD
# (differentially private SGD), first on a hand-written MLP, then on an
# Equinox model through `functional_call`.

# %%
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import functx
import functx.numpy as fnp

t_start = time.perf_counter()
rng = np.random.default_rng(0)
tree_map, tree_leaves = jax.tree_util.tree_map, jax.tree_util.tree_leaves


def progress(message):
    """A line saying what the next step is, stamped with the seconds so far."""
    print(f"[{time.perf_counter() - t_start:5.1f} s] {message}", flush=True)



def max_difference(a, b):
    """Largest elementwise difference between two pytrees of arrays (in NumPy)."""
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(tree_leaves(a), tree_leaves(b)))


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
# ## Figures
#
# Figures are drawn with matplotlib: inline in a notebook; as a script, off
# screen (the Agg backend) and saved as PNG to `$FUNCTX_FIGURES_DIR`, or else
# to `examples/figures/` next to this file (a temporary folder where there is
# no file, as in a notebook).

# %%
import os
import pathlib
import sys
import tempfile

import matplotlib

if "ipykernel" not in sys.modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt


def save_figure(fig, name):
    folder = os.environ.get("FUNCTX_FIGURES_DIR") or (
        pathlib.Path(__file__).resolve().parent / "figures" if "__file__" in globals()
        else pathlib.Path(tempfile.gettempdir()) / "functx-figures")
    path = pathlib.Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"figure saved to {path}")

# %% [markdown]
# One call computes all 32 gradients. `in_dims=(None, 0, 0)`: the
# parameters are shared, the examples and labels are mapped over.

# %%
progress("per-sample gradients of 32 examples (eager) ...")
per_sample = functx.vmap(functx.grad(loss), in_dims=(None, 0, 0))(params, xs, labels)
print("per-sample gradient of the first weight matrix:", per_sample[0]["w"].shape)

# %% [markdown]
# Check against the obvious (slow) way: a Python loop over examples,
# one gradient at a time (compiled once with `functx.jit`, so the 32 calls
# do not each pay for eager dispatch).

# %%
progress("the same, one example at a time ...")
grad_one = functx.jit(functx.grad(loss))
loop = [grad_one(params, x, y) for x, y in zip(np.asarray(xs), np.asarray(labels))]
stacked = tree_map(lambda *g: np.stack(g), *loop)
err = max_difference(per_sample, stacked)
print(f"max difference from the per-example loop: {err:.2e}")
assert err < 1e-5

# %% [markdown]
# ## DP-SGD: clip each example, average, add noise
#
# DP-SGD (Abadi et al., 2016) bounds how much any single example can move
# the parameters, then hides what is left under Gaussian noise:
#
# 1. clip each example's gradient to norm at most C. The norm is taken
#    over *all* parameters of the example together (the global norm across
#    every leaf of its gradient pytree), so the whole gradient vector is
#    scaled by min(1, C / ‖g_i‖);
# 2. sum the clipped gradients, add noise N(0, σ²C² I) to the sum, divide
#    by the batch size;
# 3. take an ordinary gradient step with the result.
#
# Step 1 is why per-sample gradients are needed at all: clipping the
# averaged gradient would bound nothing about an individual example.
#
# The function below works on any pytree of per-sample gradients (leaves
# with a leading batch axis), so it serves both models of this example.

# %%
def global_norm(tree):
    """Norm of one example's gradient, across all of its leaves."""
    return fnp.sqrt(sum(fnp.sum(g ** 2) for g in tree_leaves(tree)))


per_example_norms = functx.vmap(global_norm)                       # (batch,)


def clip_per_sample(per_sample, clip_norm):
    factor = fnp.minimum(1.0, clip_norm / (per_example_norms(per_sample) + 1e-6))  # <= 1
    return tree_map(lambda g: g * factor.reshape((-1,) + (1,) * (g.ndim - 1)), per_sample)


def dp_gradient(per_sample, clip_norm, noise_multiplier, key):
    clipped = clip_per_sample(per_sample, clip_norm)
    leaves, treedef = jax.tree_util.tree_flatten(clipped)
    batch = leaves[0].shape[0]
    keys = jax.random.split(key, len(leaves))
    noisy = [fnp.sum(g, axis=0) + noise_multiplier * clip_norm * jax.random.normal(k, g.shape[1:], g.dtype)
             for g, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, [g / batch for g in noisy])


def sgd_step(params, grads, lr):
    return tree_map(lambda p, g: p - lr * g, params, grads)


# %% [markdown]
# These functions run eagerly as they are, but each operation on each
# new shape then compiles separately; `functx.jit` makes one XLA program
# of the whole update, compiled once (the clipping norm and noise level are
# traced arguments, so changing them does not recompile).

# %%
C, SIGMA, LR = 2.5, 1.1, 0.1        # clipping norm, noise multiplier, learning rate
key = jax.random.PRNGKey(0)


@functx.jit
def dp_sgd_update(params, per_sample, clip_norm, noise_multiplier, key):
    grad = dp_gradient(per_sample, clip_norm, noise_multiplier, key)
    return sgd_step(params, grad, LR), grad


@functx.jit
def norms_before_after(per_sample, clip_norm):
    return per_example_norms(per_sample), per_example_norms(clip_per_sample(per_sample, clip_norm))


progress("compiling the clipping ...")
norms, clipped_norms = map(np.asarray, norms_before_after(per_sample, C))
print(f"per-example gradient norms (first 6):  {np.round(norms[:6], 3)}")
print(f"after clipping to C = {C} (first 6): {np.round(clipped_norms[:6], 3)}")
assert np.all(clipped_norms <= C + 1e-5), clipped_norms
# Clipping only shrinks: examples already inside the ball are untouched,
# the others land on its surface.
inside = norms <= C
assert inside.any() and not inside.all(), "choose C between the smallest and largest norm"
np.testing.assert_allclose(clipped_norms[inside], norms[inside], rtol=1e-5)
np.testing.assert_allclose(clipped_norms[~inside], C, rtol=1e-5)
print(f"{int((~inside).sum())} of {len(norms)} examples were clipped")

# %% [markdown]
# The per-example gradient norms before and after clipping: the examples
# beyond C are pulled back onto it, the others stay where they were.

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.8))
bins = np.linspace(0.95 * float(norms.min()), 1.02 * float(norms.max()), 25)
ax.hist(norms, bins=bins, alpha=0.6, label="before clipping")
ax.hist(clipped_norms, bins=bins, alpha=0.6, label="after clipping")
ax.axvline(C, color="black", ls="--", lw=1, label=f"C = {C}")
ax.set(xlabel="per-example gradient norm (all parameters)", ylabel="examples",
       title=f"per-sample gradient norms, batch of {len(norms)}")
ax.legend()
save_figure(fig, "per_sample_grads")

# %%
progress("compiling the DP-SGD update ...")
new_params, dp_grad = dp_sgd_update(params, per_sample, C, SIGMA, key)

# %% [markdown]
# Checks of the update:
#
# * the noise is what it should be: (noisy − noiseless) · batch / (σC)
#   should look like standard normal draws (mean ≈ 0, std ≈ 1 over the
#   ~500 parameters), and the same key gives the same update;
# * with no noise and a clipping norm so large that nothing is clipped,
#   DP-SGD is plain SGD: the update must equal a step along `jax.grad` of
#   the mean loss, computed without per-sample gradients at all.

# %%
progress("checking the update against plain SGD with jax.grad ...")
_, noiseless = dp_sgd_update(params, per_sample, C, 0.0, key)
z = np.concatenate([np.ravel((np.asarray(a) - np.asarray(b)) * len(xs) / (SIGMA * C))
                    for a, b in zip(tree_leaves(dp_grad), tree_leaves(noiseless))])
print(f"noise / (sigma C / batch): mean {z.mean():+.3f}, std {z.std():.3f} over {z.size} parameters")
assert abs(z.mean()) < 0.15 and abs(z.std() - 1.0) < 0.15
_, again = dp_sgd_update(params, per_sample, C, SIGMA, key)
assert max_difference(dp_grad, again) == 0.0


@jax.jit
def mean_loss(params, xs, labels):
    # `loss` is written with functx.numpy / functx.nn, which on JAX arrays
    # and tracers are jax.numpy / jax.nn: JAX's transforms accept it too.
    return jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(params, xs, labels))


plain_step = jax.jit(lambda p: sgd_step(p, jax.grad(mean_loss)(p, xs, labels), LR))(params)
no_privacy, _ = dp_sgd_update(params, per_sample, 1e10, 0.0, key)
err = max_difference(no_privacy, plain_step)
print(f"DP-SGD with sigma = 0, C = 1e10 vs plain SGD on the mean loss: max difference {err:.1e}")
assert err < 1e-6
print(f"mean loss: {float(mean_loss(params, xs, labels)):.4f} before, "
      f"{float(mean_loss(new_params, xs, labels)):.4f} after one DP-SGD step")

# %% [markdown]
# ## The same step without per-sample gradients: `functx.clipped_grad`
#
# DP-SGD needs only each example's gradient *norm* (to clip) and then a
# weighted sum, not the batch × parameters array of per-sample gradients.
# For a weight used as `W @ x`, example i's gradient is the outer product of
# the layer's output cotangent g_i and its input a_i, whose norm is
# ‖g_i‖·‖a_i‖, and the clipped sum is Σ_i w_i g_i a_iᵀ: one matrix product
# over the batch, as in an ordinary backward pass. `functx.clipped_grad`
# finds such weights in the staged program of `loss` (any function; here
# the three `w`s, while the biases get their small per-example gradients)
# and computes the clipped, noised DP-SGD gradient from one batched backward
# pass. It draws the noise as `dp_gradient` does (one key per leaf, in pytree
# order), so with the same key it must give the same update.

# %%
@functx.jit
def dp_sgd_update_fast(params, xs, labels, clip_norm, noise_multiplier, key):
    grad = functx.clipped_grad(loss, clip_norm, in_dims=(None, 0, 0), reduction="mean",
                               noise_multiplier=noise_multiplier, key=key)(params, xs, labels)
    return sgd_step(params, grad, LR), grad


progress("compiling the clipped_grad update ...")
fast_params, fast_grad = dp_sgd_update_fast(params, xs, labels, C, SIGMA, key)
err = max(max_difference(fast_grad, dp_grad), max_difference(fast_params, new_params))
print(f"clipped_grad vs the vmap(grad) DP-SGD step: max difference {err:.1e}")
assert err < 1e-6

# What the two paths hold in memory (functx.memory_report estimates it from
# the staged programs; at this size the difference is small, for a
# 784-512-512-10 MLP at batch 1024 it is 4.4 GB against 21 MB, see
# benchmarks/RESULTS.md).
def clipped_sum_via_per_sample(p):
    per_sample = functx.vmap(functx.grad(loss), in_dims=(None, 0, 0))(p, xs, labels)
    return tree_map(lambda g: fnp.sum(g, axis=0), clip_per_sample(per_sample, C))


progress("estimating the memory of both paths ...")
per_sample_path = functx.memory_report(clipped_sum_via_per_sample)(params)
ghost_path = functx.memory_report(
    lambda p: functx.clipped_grad(loss, C, in_dims=(None, 0, 0))(p, xs, labels))(params)
print(f"estimated peak: {per_sample_path.peak_bytes / 1e3:.0f} kB with per-sample gradients, "
      f"{ghost_path.peak_bytes / 1e3:.0f} kB with clipped_grad")
assert ghost_path.peak_bytes < per_sample_path.peak_bytes

# %% [markdown]
# ## The same on an Equinox model
#
# An Equinox model is a pytree that holds its own weights. To differentiate
# w.r.t. the weights, call it functionally: `functx.named_parameters(model)`
# gives its parameters as a dict keyed by dotted path, and
# `functx.functional_call(model, params, x)` runs the model with them.
# Everything else is unchanged: the per-sample gradients are a dict of
# arrays with a leading batch axis, which `dp_gradient` accepts as it is.
# Here the whole step (per-sample gradients, clipping, noise, update) is
# one compiled program.
#
# The Equinox MLP has the architecture of the hand-written one (8 → 16 →
# 16 → 4, tanh), and we give it the same weights: `filter_eval_shape`
# builds the module's structure without running its initialiser, and
# `tree_at` puts our arrays in. So its per-sample gradients must equal the
# ones computed above, name by name.

# %%
progress("the Equinox model: compiling its DP-SGD step ...")
skeleton = eqx.filter_eval_shape(eqx.nn.MLP, 8, 4, width_size=16, depth=2,
                                 activation=jax.nn.tanh, key=jax.random.PRNGKey(1))
model = eqx.tree_at(lambda m: [x for layer in m.layers for x in (layer.weight, layer.bias)],
                    skeleton, [x for layer in params for x in (layer["w"], layer["b"])])
eqx_params = functx.named_parameters(model)
print("Equinox parameters:", list(eqx_params))


def eqx_loss(params, x, label):
    logits = functx.functional_call(model, params, (x,))
    return -functx.nn.log_softmax(logits)[label]


@functx.jit
def dp_sgd_step(params, xs, labels, key, clip_norm, noise_multiplier):
    grads = functx.vmap(functx.grad(eqx_loss), in_dims=(None, 0, 0))(params, xs, labels)
    new_params, _ = dp_sgd_update(params, grads, clip_norm, noise_multiplier, key)
    return new_params, grads


new_eqx_params, eqx_per_sample = dp_sgd_step(eqx_params, xs, labels, key, C, SIGMA)

# %% [markdown]
# Reference with JAX alone: split the model into its arrays and the rest
# (`eqx.partition`), and take `jax.vmap(jax.grad(...))` w.r.t. the arrays.
# `named_parameters` lists the arrays in the order of the pytree's leaves,
# which pairs each name with its reference leaf. (Compare by name, not by
# position: a dict that went through a JAX or functx transform comes back
# with its keys sorted, `layers.0.bias` before `layers.0.weight`.)

# %%
arrays, static = eqx.partition(model, eqx.is_inexact_array)


def jax_loss(arrays, x, label):
    return -jax.nn.log_softmax(eqx.combine(arrays, static)(x))[label]


def by_name(tree):
    return dict(zip(eqx_params, tree_leaves(tree)))


progress("checking it against jax.vmap(jax.grad) ...")
ref_per_sample = by_name(jax.jit(jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0)))(arrays, xs, labels))
for name, ours in eqx_per_sample.items():
    assert ours.shape == (len(xs),) + eqx_params[name].shape
    np.testing.assert_allclose(ours, ref_per_sample[name], rtol=1e-5, atol=1e-6, err_msg=name)

# The same weights as the hand-written MLP, so the same per-sample gradients.
for i, layer in enumerate(per_sample):
    np.testing.assert_allclose(eqx_per_sample[f"layers.{i}.weight"], layer["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(eqx_per_sample[f"layers.{i}.bias"], layer["b"], rtol=1e-5, atol=1e-6)

clipped_norms = np.asarray(norms_before_after(eqx_per_sample, C)[1])
assert np.all(clipped_norms <= C + 1e-5)

no_privacy, _ = dp_sgd_step(eqx_params, xs, labels, key, 1e10, 0.0)
mean_grad = by_name(jax.jit(jax.grad(
    lambda a: jnp.mean(jax.vmap(jax_loss, (None, 0, 0))(a, xs, labels))))(arrays))
for name, ours in no_privacy.items():
    np.testing.assert_allclose(ours, np.asarray(eqx_params[name]) - LR * np.asarray(mean_grad[name]),
                               rtol=1e-5, atol=1e-6, err_msg=name)


@functx.jit
def eqx_mean_loss(params):
    return fnp.mean(functx.vmap(eqx_loss, in_dims=(None, 0, 0))(params, xs, labels))


# Same weights, data and key as the hand-written MLP, and the noise is
# drawn for the leaves in the same order (the sorted keys `b` < `w` and
# `bias` < `weight`), so the noisy DP-SGD step itself must agree too.
for i, layer in enumerate(new_params):
    np.testing.assert_allclose(new_eqx_params[f"layers.{i}.weight"], layer["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_eqx_params[f"layers.{i}.bias"], layer["b"], rtol=1e-5, atol=1e-6)

print("Equinox model: per-sample gradients match jax.vmap(jax.grad) and the hand-written MLP; "
      "noiseless, unclipped DP-SGD step matches plain SGD; noisy step matches the hand-written one")
print(f"Equinox mean loss: {float(eqx_mean_loss(eqx_params)):.4f} before, "
      f"{float(eqx_mean_loss(new_eqx_params)):.4f} after one DP-SGD step")
print(f"per_sample_grads: all checks passed in {time.perf_counter() - t_start:.1f}s")
