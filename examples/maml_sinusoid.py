# %% [markdown]
# # Few-shot sinusoid regression with MAML
#
# Model-Agnostic Meta-Learning (MAML, Finn et al. 2017) looks for initial
# weights from which a few gradient steps on a handful of examples of a
# *new* task already give a good model. Here a task is a sine wave
# `y = A sin(x + phase)` with an unknown amplitude `A` in [0.1, 5] and phase
# in [0, pi]; the model sees K = 10 points of it (the *support set*), takes a
# few SGD steps on them, and is scored on 10 other points of the same wave
# (the *query set*).
#
# The meta-objective is the query loss *after* adaptation, averaged over a
# batch of tasks. Its gradient with respect to the initial weights flows
# through the inner SGD steps, i.e. through `grad` itself: a
# `grad(... grad ...)` composition, with `vmap` over tasks in between.

# %%
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64: the check against JAX is tight

import jax.numpy as jnp
import numpy as np

import functx
import functx.numpy as fnp

start = time.perf_counter()
rng = np.random.default_rng(0)


def progress(message):
    """A line saying what the next step is, stamped with the seconds so far."""
    print(f"[{time.perf_counter() - start:5.1f} s] {message}", flush=True)


SHOTS = 10  # support and query points per task
TASKS = 32  # tasks per meta-batch
INNER_STEPS = 2  # SGD steps on the support set
INNER_LR = 0.03
META_STEPS = 300
META_LR = 1e-2  # Adam; higher than usual, to learn something in 300 steps


def sample_tasks(n):
    """A meta-batch of `n` sine-wave tasks: support and query sets."""
    amp = rng.uniform(0.1, 5.0, (n, 1, 1))
    phase = rng.uniform(0.0, np.pi, (n, 1, 1))

    def points():
        x = rng.uniform(-5.0, 5.0, (n, SHOTS, 1))
        return jnp.asarray(x), jnp.asarray(amp * np.sin(x + phase))

    return (*points(), *points())  # x_support, y_support, x_query, y_query

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
# ## The model
#
# A 1-40-40-1 MLP with ReLU, its weights in a plain dict. The forward pass is
# written with `functx.numpy`, so it runs on functx values inside every
# transform (and is ordinary `jax.numpy` on plain arrays).

# %%
def init_params(sizes=(1, 40, 40, 1)):
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        bound = 1.0 / np.sqrt(n_in)
        params[f"w{i}"] = jnp.asarray(rng.uniform(-bound, bound, (n_in, n_out)))
        params[f"b{i}"] = jnp.asarray(rng.uniform(-bound, bound, (n_out,)))
    return params


def mlp(params, x):
    """x: (points, 1) -> (points, 1)."""
    x = functx.nn.relu(x @ params["w0"] + params["b0"])
    x = functx.nn.relu(x @ params["w1"] + params["b1"])
    return x @ params["w2"] + params["b2"]


def mse(params, x, y):
    return fnp.mean((mlp(params, x) - y) ** 2)


# %% [markdown]
# ## Inner loop and meta-loss
#
# `adapt` is the learner of one task: `INNER_STEPS` steps of plain SGD on its
# support set, each step a `functx.grad`. `query_loss_after_adapt` scores the
# adapted weights on the query set. `meta_loss` averages that over the tasks
# of a meta-batch with `functx.vmap` (the initial weights are shared,
# `in_dims=None`; the four data arrays are mapped).
#
# Nothing here stops the gradient: differentiating `meta_loss` with
# `functx.grad` differentiates through the inner `grad` calls, which brings
# in second derivatives of the MLP (full MAML, not first-order MAML).

# %%
def adapt(params, x, y, steps=INNER_STEPS, lr=INNER_LR):
    for _ in range(steps):
        g = functx.grad(mse)(params, x, y)
        params = {k: params[k] - lr * g[k] for k in params}
    return params


def query_loss_after_adapt(params, x_s, y_s, x_q, y_q):
    return mse(adapt(params, x_s, y_s), x_q, y_q)


def meta_loss(params, tasks):
    per_task = functx.vmap(query_loss_after_adapt, in_dims=(None, 0, 0, 0, 0))
    return fnp.mean(per_task(params, *tasks))


# %% [markdown]
# `functx.jit` compiles the meta-gradient, the nested `grad`s and the `vmap`
# included, into one XLA program: the eager version would re-dispatch every
# primitive of every inner step on each of the few hundred meta-steps.

# %%
meta_grad_and_loss = functx.jit(functx.grad_and_value(meta_loss))

# %% [markdown]
# ## Check: the meta-gradient against plain JAX
#
# The same algorithm written again with `jax.numpy`, `jax.grad` and
# `jax.vmap`, sharing no code with the functions above, compiled with
# `jax.jit`, and evaluated at the initial weights on one meta-batch. The two
# meta-gradients must agree to float64 round-off.

# %%
def jax_meta_loss(params, tasks):
    def mse(p, x, y):
        h = jax.nn.relu(x @ p["w0"] + p["b0"])
        h = jax.nn.relu(h @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def one_task(p, x_s, y_s, x_q, y_q):
        for _ in range(INNER_STEPS):
            g = jax.grad(mse)(p, x_s, y_s)
            p = jax.tree_util.tree_map(lambda w, gw: w - INNER_LR * gw, p, g)
        return mse(p, x_q, y_q)

    return jnp.mean(jax.vmap(one_task, in_axes=(None, 0, 0, 0, 0))(params, *tasks))


params0 = init_params()
check_tasks = sample_tasks(TASKS)
progress("compiling the meta-gradient (functx.jit), and JAX's reference ...")
g_functx, loss_functx = meta_grad_and_loss(params0, check_tasks)
loss_jax, g_jax = jax.jit(jax.value_and_grad(jax_meta_loss))(params0, check_tasks)
np.testing.assert_allclose(loss_functx, loss_jax, rtol=1e-10)
for k in params0:
    np.testing.assert_allclose(g_functx[k], g_jax[k], rtol=1e-6, atol=1e-9, err_msg=k)
print(f"meta-gradient at the initial weights: matches JAX (meta-loss {float(loss_functx):.3f})")

# %% [markdown]
# ## Meta-training
#
# Each meta-step samples a fresh meta-batch of tasks, takes the
# meta-gradient and updates the initial weights with Adam, written out by
# hand: running means of the gradients and of their squares, corrected for
# their start at zero. The update is compiled too.

# %%
@functx.jit
def adam_update(params, grads, state, b1=0.9, b2=0.999, eps=1e-8):
    m, v, t = state
    t = t + 1
    m = {k: b1 * m[k] + (1 - b1) * grads[k] for k in params}
    v = {k: b2 * v[k] + (1 - b2) * grads[k] ** 2 for k in params}
    new = {
        k: params[k] - META_LR * (m[k] / (1 - b1 ** t)) / (fnp.sqrt(v[k] / (1 - b2 ** t)) + eps)
        for k in params
    }
    return new, (m, v, t)


zeros = {k: jnp.zeros_like(w) for k, w in params0.items()}
adam_state = (zeros, zeros, jnp.asarray(0.0))
params, losses = params0, []
progress(f"meta-training for {META_STEPS} meta-iterations ...")
for step in range(META_STEPS):
    grads, loss = meta_grad_and_loss(params, sample_tasks(TASKS))
    params, adam_state = adam_update(params, grads, adam_state)
    losses.append(float(loss))
    if (step + 1) % 50 == 0:
        progress(f"meta-iteration {step + 1}/{META_STEPS}: meta-loss "
                 f"{np.mean(losses[-50:]):.3f} (mean of the last 50)")
first, last = np.mean(losses[:20]), np.mean(losses[-20:])
print(f"meta-loss (query loss after {INNER_STEPS} inner steps), mean of 20 steps: "
      f"first {first:.3f}, last {last:.3f}")
assert last < 0.5 * first, (first, last)

# %% [markdown]
# ## Adapting to new tasks
#
# What the meta-learned weights are for: on tasks never seen in training, a
# few SGD steps from them should fit far better than the same steps from
# the random initial weights. `adaptation_curve` records the mean query loss
# over a batch of new tasks after 0, 1, ..., 5 inner steps.

# %%
@functx.jit
def adaptation_curve(params, tasks, steps=5):
    def one_task(x_s, y_s, x_q, y_q):
        p, curve = params, [mse(params, x_q, y_q)]
        for _ in range(steps):
            p = adapt(p, x_s, y_s, steps=1)
            curve.append(mse(p, x_q, y_q))
        return fnp.stack(curve)

    return fnp.mean(functx.vmap(one_task)(*tasks), axis=0)


test_tasks = sample_tasks(100)
progress("compiling and running the adaptation curves on 100 new tasks ...")
before = np.asarray(adaptation_curve(params0, test_tasks))
after = np.asarray(adaptation_curve(params, test_tasks))
print("query loss on new tasks after 0..5 inner steps")
print("  from the random initial weights:", np.round(before, 3))
print("  from the meta-learned weights:  ", np.round(after, 3))
assert after[INNER_STEPS] < 0.5 * before[INNER_STEPS], (before, after)
assert after[-1] < after[0], "adapting should help from the meta-learned weights"

# %% [markdown]
# Left, the meta-loss during meta-training (each point one meta-batch of new
# tasks, so it is noisy; the line is a running mean). Right, what it buys:
# the query loss on new tasks along a few SGD steps, from the random and
# from the meta-learned initial weights.

# %%
fig, (ax_meta, ax_adapt) = plt.subplots(1, 2, figsize=(10, 3.8))
window = 20
running = np.convolve(losses, np.ones(window) / window, mode="valid")
ax_meta.plot(np.arange(1, META_STEPS + 1), losses, color="tab:blue", alpha=0.3, lw=1,
             label="meta-batch")
ax_meta.plot(np.arange(window, META_STEPS + 1), running, color="tab:blue",
             label=f"running mean of {window}")
ax_meta.set(yscale="log", xlabel="meta-iteration",
            ylabel=f"query loss after {INNER_STEPS} inner steps", title="MAML meta-training")
ax_meta.legend()
steps = np.arange(len(before))
ax_adapt.plot(steps, before, "o-", label="from random weights")
ax_adapt.plot(steps, after, "o-", label="from meta-learned weights")
ax_adapt.axvline(INNER_STEPS, color="gray", ls=":", lw=1)
ax_adapt.set(yscale="log", xlabel="inner SGD steps on the support set",
             ylabel="mean query loss, 100 new tasks", title="adapting to new tasks")
ax_adapt.legend()
fig.tight_layout()
save_figure(fig, "maml_sinusoid")

print(f"maml example: all checks passed in {time.perf_counter() - start:.1f} s")
