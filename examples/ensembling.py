# %% [markdown]
# # Model ensembling with functx
#
# An ensemble is several models of one architecture with different weights.
# The direct way to evaluate it is a Python loop: one forward call per model,
# each a handful of small matrix products. With `vmap` the models become one
# more batch dimension: the weights of all models are stacked into arrays
# with a leading "model" axis, and a single call of the *one-model* function,
# vectorised over that axis, computes every model at once (batched matrix
# products instead of many small ones).
#
# This example builds ten small Equinox MLPs, stacks their parameters with
# `functx.stack_module_state`, and runs them through `functx.functional_call`
# under `functx.vmap`: forward in two settings (each model with its own
# minibatch, and all models on one shared minibatch), then per-model
# gradients of a loss, and finally one compiled ensemble training step.
# Every result is checked against a loop over the models written with plain
# Equinox and JAX.

# %%
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64: the checks below are tight

import equinox as eqx
import jax.numpy as jnp
import numpy as np

import functx
import functx.numpy as fnp

start = time.perf_counter()


def progress(message):
    """A line saying what the next step is, stamped with the seconds so far."""
    print(f"[{time.perf_counter() - start:5.1f} s] {message}", flush=True)


NUM_MODELS, IN, WIDTH, OUT, DEPTH = 10, 16, 32, 4, 2
BATCH = 64

progress(f"building {NUM_MODELS} Equinox MLPs ...")
keys = jax.random.split(jax.random.PRNGKey(0), NUM_MODELS)
models = [
    eqx.nn.MLP(IN, OUT, WIDTH, DEPTH, activation=jax.nn.tanh, key=k, dtype=jnp.float64)
    for k in keys
]

rng = np.random.default_rng(0)
# A small classification task: the label of x is the argmax of a fixed random
# linear map ("teacher") of x. Each model gets its own minibatch (its training
# data, for the first setting below); a further minibatch is shared by all
# models (the second setting, and held-out data for the trained ensemble).
teacher = rng.standard_normal((IN, OUT))


def make_data(*shape):
    xs = rng.standard_normal((*shape, IN))
    return jnp.asarray(xs), jnp.asarray(np.argmax(xs @ teacher, axis=-1))


xs_per_model, labels_per_model = make_data(NUM_MODELS, BATCH)
xs_shared, labels_shared = make_data(BATCH)

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
# ## Stacking the models
#
# `stack_module_state` returns two dicts keyed by dotted path, as torch's
# `named_parameters` names them (`layers.0.weight`): the floating-point
# parameters and the other arrays (buffers; an MLP has none). Each entry is
# the corresponding array of every model, stacked on a new leading axis.
#
# To call the architecture on *some* set of weights we keep one model as a
# template: `functional_call(template, (params, buffers), args)` runs it with
# its arrays replaced by the ones given. Under `vmap` those are the weights
# of one model, so the template's own values are never used.

# %%
params, buffers = functx.stack_module_state(models)
for name, value in params.items():
    print(f"  {name:16s} {tuple(value.shape)}")
assert params["layers.0.weight"].shape == (NUM_MODELS, WIDTH, IN)
assert buffers == {}

template = models[0]


def predict(params, buffers, xs):
    """Logits of the model with weights `params` on a minibatch `xs` (B, IN).

    An `eqx.nn.MLP` takes one example, so the minibatch is an inner `vmap`
    over examples; the weights, which the inner function closes over, are
    the same for every example."""
    one = lambda x: functx.functional_call(template, (params, buffers), (x,))
    return functx.vmap(one)(xs)


# The reference for every check: a Python loop over the models, in plain
# Equinox and JAX (compiled with `eqx.filter_jit`, which compiles once for
# all ten models since they share one structure).
@eqx.filter_jit
def eqx_predict(model, xs):
    return jax.vmap(model)(xs)


def loop_predict(xs_for):
    return jnp.stack([eqx_predict(m, xs_for(i)) for i, m in enumerate(models)])


# %% [markdown]
# ## Forward pass, a different minibatch per model
#
# `in_dims=(0, 0, 0)`: parameters, buffers and data all carry the model
# axis in front, so model `i` sees `xs_per_model[i]`. (The buffers dict is
# empty here; a dimension for an empty dict is allowed and maps nothing.)

# %%
progress("forward pass, a minibatch per model (eager), and the loop over models ...")
ensemble_different = functx.vmap(predict, in_dims=(0, 0, 0))
logits = ensemble_different(params, buffers, xs_per_model)
expected = loop_predict(lambda i: xs_per_model[i])
assert logits.shape == (NUM_MODELS, BATCH, OUT)
np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-12)
print("different minibatches: matches the loop over models")

# %% [markdown]
# ## Forward pass, the same minibatch for every model
#
# The usual way to *use* an ensemble: every model predicts on the same
# inputs, and the predictions are averaged or voted. `in_dims=(0, 0, None)`
# maps over the weights only; every model gets the whole of `xs_shared`.

# %%
progress("forward pass, one minibatch for all models ...")
ensemble_same = functx.vmap(predict, in_dims=(0, 0, None))
logits_same = ensemble_same(params, buffers, xs_shared)
expected_same = loop_predict(lambda i: xs_shared)
np.testing.assert_allclose(logits_same, expected_same, rtol=1e-10, atol=1e-12)

# An ensemble prediction: average the models' probabilities.
probs = fnp.mean(functx.nn.softmax(logits_same, axis=-1), axis=0)
votes = fnp.argmax(probs, axis=-1)
print("same minibatch: matches the loop; untrained ensemble accuracy: "
      f"{float(jnp.mean(votes == labels_shared)):.2f}")

# %% [markdown]
# ## Forward and backward: a gradient per model
#
# Training the ensemble needs the gradient of each model's loss with
# respect to *its own* weights. `grad(loss)` differentiates the loss of one
# model with respect to its parameter dict; `vmap` over the stacked
# parameters turns that into all ten gradients at once, each with the
# model axis in front, exactly the shape of `params`.

# %%
def loss(params, buffers, xs, labels):
    """Mean cross-entropy of one model on one minibatch."""
    logp = functx.nn.log_softmax(predict(params, buffers, xs), axis=-1)
    return -fnp.mean(fnp.take_along_axis(logp, labels[:, None], axis=1))


progress("per-model gradients (eager), and eqx.filter_value_and_grad per model ...")
per_model_grad = functx.vmap(functx.grad(loss), in_dims=(0, 0, 0, 0))
grads = per_model_grad(params, buffers, xs_per_model, labels_per_model)
assert set(grads) == set(params)
assert all(grads[k].shape == params[k].shape for k in params)


# The reference: `eqx.filter_value_and_grad` on each model itself, in a loop.
@eqx.filter_jit
@eqx.filter_value_and_grad
def eqx_loss(model, xs, labels):
    logp = jax.nn.log_softmax(jax.vmap(model)(xs), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


ref_losses = []
for i, model in enumerate(models):
    value, g = eqx_loss(model, xs_per_model[i], labels_per_model[i])
    ref_losses.append(value)
    g = functx.named_parameters(g)  # the gradient is a model: name its leaves
    for name in params:
        np.testing.assert_allclose(grads[name][i], g[name], rtol=1e-6, atol=1e-10,
                                   err_msg=f"model {i}, {name}")
print("per-model gradients: match eqx.filter_value_and_grad on each model")

# %% [markdown]
# ## A compiled ensemble training step
#
# Putting it together: one SGD step for all ten models, each on its own
# minibatch, compiled by `functx.jit` into one XLA program. Its first step
# must be exactly the eager computation above (`params - lr * grads`, and
# the losses of the reference loop); then a few more steps train all ten
# models at once.

# %%
LR = 0.5


@functx.jit
def train_step(params, buffers, xs, labels):
    grads, losses = functx.vmap(functx.grad_and_value(loss))(params, buffers, xs, labels)
    return {k: params[k] - LR * grads[k] for k in params}, losses


progress("compiling the training step ...")
new_params, first_losses = train_step(params, buffers, xs_per_model, labels_per_model)
np.testing.assert_allclose(first_losses, jnp.stack(ref_losses), rtol=1e-10)
for k in params:
    np.testing.assert_allclose(new_params[k], params[k] - LR * grads[k], rtol=1e-10,
                               atol=1e-12, err_msg=k)

progress("training all models for 50 steps ...")
trained, history = new_params, [first_losses]
for step in range(1, 50):
    trained, losses = train_step(trained, buffers, xs_per_model, labels_per_model)
    history.append(losses)
history = np.asarray(jnp.stack(history))  # (step, model)
print("training loss per model, step 0: ", np.round(np.asarray(first_losses), 2))
print("training loss per model, step 49:", np.round(np.asarray(losses), 2))
assert bool(jnp.all(losses < 0.5 * first_losses)), "every model's training loss should halve"

# %% [markdown]
# The trained ensemble on the shared minibatch, which no model was trained
# on, with the same eager `ensemble_same` as before, now on the trained
# weights.

# %%
progress("the trained models on the shared minibatch ...")
logits_trained = ensemble_same(trained, buffers, xs_shared)
each = jnp.mean(fnp.argmax(logits_trained, axis=-1) == labels_shared, axis=1)
probs = fnp.mean(functx.nn.softmax(logits_trained, axis=-1), axis=0)
accuracy = float(jnp.mean(fnp.argmax(probs, axis=-1) == labels_shared))
print(f"held-out accuracy: single models {float(each.min()):.2f}-{float(each.max()):.2f}, "
      f"ensemble {accuracy:.2f}")
assert accuracy > 0.8, accuracy

# %% [markdown]
# The training losses of the ten models, trained in one vmapped program, and
# what averaging their predicted probabilities buys on held-out data.

# %%
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.8))
ax_loss.plot(np.arange(len(history)), history, lw=1)
ax_loss.set(yscale="log", xlabel="training step", ylabel="training loss (cross-entropy)",
            title=f"{NUM_MODELS} models, one vmapped training step")
ax_acc.bar(np.arange(NUM_MODELS), np.asarray(each), color="tab:blue", label="single model")
ax_acc.axhline(accuracy, color="tab:red", label=f"ensemble ({accuracy:.2f})")
ax_acc.set(ylim=(0, 1), xticks=np.arange(NUM_MODELS), xlabel="model",
           ylabel="held-out accuracy", title="held-out accuracy")
ax_acc.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
fig.tight_layout()
save_figure(fig, "ensembling")

print(f"ensembling example: all checks passed in {time.perf_counter() - start:.1f} s")
