# %% [markdown]
# # A neural ODE with diffrax, differentiated by functx
#
# A neural ODE models a trajectory as the solution of `dy/dt = f_θ(t, y)`,
# with `f_θ` a small network. Fitting it means differentiating *through the
# ODE solver*. diffrax, JAX's ODE library, is written in JAX (and Equinox):
# here it runs unchanged inside functx's transforms, with no `functx.lift`
# anywhere — functx translates each JAX primitive it binds, and borrows
# JAX's rules for the ones only JAX knows (diffrax's adjoint is a
# `custom_vjp`, its error checks are Equinox primitives and callbacks).
#
# The data: a damped spiral. We fit the vector field's parameters with
# `functx.grad`, take per-trajectory gradients with `functx.vmap`, and the
# sensitivity of the final state to the initial state with `functx.jacfwd`,
# each checked against JAX's own transforms of the same program.

# %%
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64: the check against JAX is tight

import diffrax
import jax.numpy as jnp
import numpy as np

import functx

start = time.perf_counter()
TS = jnp.linspace(0.0, 2.0, 6)


def progress(message):
    """A line saying what the next step is, stamped with the seconds so far."""
    print(f"[{time.perf_counter() - start:5.1f} s] {message}", flush=True)

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
# ## Data: trajectories of a damped spiral
#
# `dy/dt = A y` with `A` a rotation plus damping, from a few initial states.

# %%
A_TRUE = jnp.array([[-0.1, 1.0], [-1.0, -0.1]])
Y0S = jnp.array([[1.0, 0.0], [0.0, 1.0], [-0.5, 0.5]])


def solve(term, params, y0, adjoint=diffrax.RecursiveCheckpointAdjoint()):
    """The trajectory of the ODE `term` (with `params`) from `y0`, saved at
    TS. (diffrax compiles the solve once per term: keep the term object.)"""
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), TS[0], TS[-1], 0.1, y0, args=params,
                              saveat=diffrax.SaveAt(ts=TS), adjoint=adjoint)
    return sol.ys


progress("simulating the data ...")
linear = diffrax.ODETerm(lambda t, y, a: a @ y)
data = jax.vmap(lambda y0: solve(linear, A_TRUE, y0))(Y0S)

# %% [markdown]
# ## The model: a 2-16-2 MLP vector field
#
# Plain `jax.numpy`: the same function runs on functx values inside every
# transform below.

# %%
rng = np.random.default_rng(0)
params = {
    "w1": jnp.asarray(rng.normal(size=(16, 2)) * 0.5), "b1": jnp.zeros(16),
    "w2": jnp.asarray(rng.normal(size=(2, 16)) * 0.1), "b2": jnp.zeros(2),
}


def mlp_field(t, y, p):
    return p["w2"] @ jnp.tanh(p["w1"] @ y + p["b1"]) + p["b2"]


neural = diffrax.ODETerm(mlp_field)


def trajectory_loss(p, y0, target):
    return jnp.mean((solve(neural, p, y0) - target) ** 2)


def loss(p):
    return jnp.mean(jax.vmap(trajectory_loss, in_axes=(None, 0, 0))(p, Y0S, data))


# %% [markdown]
# ## Gradients through the solver, checked against JAX
#
# Each transform is compiled with `functx.jit` (an ODE solve is a loop of
# many small steps: eagerly, functx and JAX alike run it step by step).

# %%
progress("compiling grad through the solver, and JAX's ...")
g_fx = functx.jit(functx.grad(loss))(params)
g_jax = jax.jit(jax.grad(loss))(params)
for k in params:
    np.testing.assert_allclose(g_fx[k], g_jax[k], rtol=1e-9, atol=1e-12)

# Per-trajectory gradients: vmap over (initial state, target) of grad.
progress("per-trajectory gradients ...")
per_traj = functx.jit(functx.vmap(functx.grad(trajectory_loss), in_dims=(None, 0, 0)))(
    params, Y0S, data)
per_traj_jax = jax.jit(jax.vmap(jax.grad(trajectory_loss), in_axes=(None, 0, 0)))(
    params, Y0S, data)
for k in params:
    np.testing.assert_allclose(per_traj[k], per_traj_jax[k], rtol=1e-9, atol=1e-12)
print("per-trajectory gradient norms:",
      np.round([float(jnp.sqrt(sum(jnp.sum(per_traj[k][i] ** 2) for k in params)))
                for i in range(len(Y0S))], 4))

# Sensitivity of the final state to the initial state: forward mode needs
# diffrax's forward-mode adjoint (its default adjoint is a custom_vjp).
progress("d y(T) / d y(0) with jacfwd ...")
final = lambda y0: solve(neural, params, y0, diffrax.ForwardMode())[-1]  # noqa: E731
sens = functx.jit(functx.jacfwd(final))(Y0S[0])
np.testing.assert_allclose(sens, jax.jit(jax.jacfwd(final))(Y0S[0]), rtol=1e-9, atol=1e-12)
print("d y(T) / d y(0) =\n", np.round(sens, 4))

# %% [markdown]
# ## Fitting: a few Adam steps, compiled with `functx.jit`

# %%
progress("fitting: 30 Adam steps ...")
initial_params = dict(params)
step_grad = functx.jit(functx.grad(loss))
compiled_loss = functx.jit(loss)
lr, b1, b2 = 2e-2, 0.9, 0.999
m = {k: jnp.zeros_like(v) for k, v in params.items()}
v = {k: jnp.zeros_like(x) for k, x in params.items()}
losses = [float(compiled_loss(params))]
for step in range(1, 31):
    g = step_grad(params)
    for k in params:
        m[k] = b1 * m[k] + (1 - b1) * g[k]
        v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
        params[k] = params[k] - lr * (m[k] / (1 - b1 ** step)) / (jnp.sqrt(v[k] / (1 - b2 ** step)) + 1e-8)
    losses.append(float(compiled_loss(params)))
    if step % 10 == 0:
        progress(f"step {step}/30: loss {losses[-1]:.4f}")
print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f}")
assert losses[-1] < 0.5 * losses[0], "the fit did not improve"

# %% [markdown]
# The fitted vector field's trajectories against the data, in the phase
# plane, before and after the 30 steps. For smooth curves the model is
# solved again with more save points (plain `jax.jit` and `jax.vmap`: this
# is plotting, not differentiation); at the data's times it must agree
# with the trajectories the loss saw.

# %%
DENSE_TS = jnp.linspace(TS[0], TS[-1], 61)  # holds TS: every 12th point


@jax.jit
def dense_trajectories(p):
    def one(y0):
        return diffrax.diffeqsolve(neural, diffrax.Tsit5(), TS[0], TS[-1], 0.1, y0, args=p,
                                   saveat=diffrax.SaveAt(ts=DENSE_TS)).ys
    return jax.vmap(one)(Y0S)


progress("solving the model on a finer time grid for the plot ...")
fitted, unfitted = dense_trajectories(params), dense_trajectories(initial_params)
coarse = jax.vmap(lambda y0: solve(neural, params, y0))(Y0S)
np.testing.assert_allclose(fitted[:, ::12], coarse, rtol=1e-8, atol=1e-10)

fig, (ax_phase, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
for i, color in enumerate(["tab:blue", "tab:orange", "tab:green"]):
    ax_phase.plot(*np.asarray(unfitted[i]).T, color=color, ls=":", lw=1)
    ax_phase.plot(*np.asarray(fitted[i]).T, color=color, lw=1.5)
    ax_phase.plot(*np.asarray(data[i]).T, "o", color=color, ms=5)
ax_phase.plot([], [], "k:", lw=1, label="model before fitting")
ax_phase.plot([], [], "k-", lw=1.5, label="model after fitting")
ax_phase.plot([], [], "ko", ms=5, label="data")
ax_phase.set(xlabel="$y_1$", ylabel="$y_2$", title="trajectories from three initial states")
ax_phase.legend(fontsize=8)
ax_loss.plot(losses, "o-", ms=3)
ax_loss.set(yscale="log", xlabel="Adam step", ylabel="mean squared error",
            title="fitting through the ODE solver")
fig.tight_layout()
save_figure(fig, "neural_ode")
print(f"neural_ode.py: all checks passed in {time.perf_counter() - start:.1f} s")
