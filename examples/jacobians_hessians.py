# %% [markdown]
# # Jacobians, Hessians and Hessian-vector products with functx
#
# For f: Rⁿ → Rᵐ the Jacobian is the m × n matrix of partial derivatives.
# functx gives it two ways:
#
# * `jacrev(f)` — reverse mode: one vector-Jacobian product (a backward
#   pass) per **output** row, m of them, vmapped into one batched pass.
# * `jacfwd(f)` — forward mode: one Jacobian-vector product (a forward
#   pass with tangents) per **input** column, n of them, vmapped likewise.
#
# Both give the same matrix; which is cheaper depends on its shape. This
# example computes Jacobians, batched Jacobians, Jacobians w.r.t. several
# arguments, Hessians and Hessian-vector products, checks each against
# JAX's own transforms (and one against finite differences), and times
# `jacrev` against `jacfwd` on a wide and a tall function.

# %%
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64: tight checks, finite differences

import jax.numpy as jnp
import numpy as np

import functx
import functx.numpy as fnp

t_start = time.perf_counter()
rng = np.random.default_rng(0)


def progress(message):
    """A line saying what the next step is, stamped with the seconds so far."""
    print(f"[{time.perf_counter() - t_start:5.1f} s] {message}", flush=True)



def close(a, b, tol=1e-10):
    """Largest difference, relative to the size of `b`; asserts it is small."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    err = float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-300))
    assert err < tol, err
    return err

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
# ## A small function and its Jacobian
#
# A tanh layer from R⁵ to R³: `layer(W, b, x) = tanh(W x + b)`. It is
# written with `functx.numpy`, which on plain JAX arrays (and JAX tracers)
# *is* `jax.numpy`, so the very same Python function can be handed to
# JAX's transforms as an independent reference. (The references are
# wrapped in `jax.jit`: one compilation is cheaper than JAX's eager mode
# compiling every operation of a nested transform separately.)

# %%
N, M = 5, 3
W = jnp.asarray(rng.standard_normal((M, N)) / np.sqrt(N))
b = jnp.asarray(rng.standard_normal(M))
x = jnp.asarray(rng.standard_normal(N))


def layer(W, b, x):
    return fnp.tanh(W @ x + b)


def f(x):
    return layer(W, b, x)


progress("Jacobians of a tanh layer, and JAX's for reference ...")
J_rev = functx.jacrev(f)(x)
J_fwd = functx.jacfwd(f)(x)
print("Jacobian of R^5 -> R^3:", J_rev.shape)
close(J_rev, jax.jit(jax.jacrev(f))(x))
close(J_fwd, jax.jit(jax.jacfwd(f))(x))
close(J_rev, J_fwd)

# The closed form, as a third opinion: diag(1 - tanh²(Wx + b)) W.
close(J_rev, (1 - f(x) ** 2)[:, None] * W)

# %% [markdown]
# A finite-difference check that needs no autodiff at all: column j of the
# Jacobian is ∂f/∂x_j ≈ (f(x + h e_j) - f(x - h e_j)) / 2h, with error
# O(h²) ≈ 1e-10 in float64 for h = 1e-5.

# %%
h = 1e-5
eye = jnp.eye(N)
J_fd = jnp.stack([(f(x + h * eye[j]) - f(x - h * eye[j])) / (2 * h) for j in range(N)], axis=1)
fd_err = close(J_rev, J_fd, tol=1e-8)
print(f"jacrev vs central finite differences: max relative difference {fd_err:.1e}")

# %% [markdown]
# ## Several arguments: `argnums`
#
# With `argnums=(0, 1, 2)` the result is a tuple with one Jacobian per
# argument, each of shape `output.shape + argument.shape`: ∂f/∂W is
# 3 × (3 × 5), ∂f/∂b is 3 × 3, ∂f/∂x is 3 × 5.

# %%
progress("Jacobians with respect to three arguments ...")
for jac_fx, jac_jax in [(functx.jacrev, jax.jacrev), (functx.jacfwd, jax.jacfwd)]:
    dW, db, dx = jac_fx(layer, argnums=(0, 1, 2))(W, b, x)
    ref = jax.jit(jac_jax(layer, argnums=(0, 1, 2)))(W, b, x)
    assert dW.shape == (M, M, N) and db.shape == (M, M) and dx.shape == (M, N)
    for ours, theirs in zip((dW, db, dx), ref):
        close(ours, theirs)
print("argnums=(0, 1, 2): shapes", dW.shape, db.shape, dx.shape)

# %% [markdown]
# ## Batched Jacobians: `vmap(jacrev(f))`
#
# For a batch of 16 inputs one usually wants one Jacobian per example:
# `vmap` of the per-example Jacobian, 16 × 3 × 5. (The Jacobian of the
# batched function, `jacrev(vmap(f))`, relates every output to every
# input of the whole batch: 16 × 3 × 16 × 5, zero off the diagonal
# blocks, and 16 times the work.)

# %%
xs = jnp.asarray(rng.standard_normal((16, N)))
progress("batched Jacobians ...")
batched = functx.vmap(functx.jacrev(f))(xs)
assert batched.shape == (16, M, N)
close(batched, jax.jit(jax.vmap(jax.jacrev(f)))(xs))
close(functx.vmap(functx.jacfwd(f))(xs), batched)

# The full Jacobian of the batched function is block diagonal, with the
# per-example Jacobians on the diagonal.
full = functx.jacrev(functx.vmap(f))(xs)            # (16, 3, 16, 5)
assert full.shape == (16, M, 16, N)
close(jnp.einsum("iaib->iab", full), batched)
print("vmap(jacrev(f)) over 16 examples:", batched.shape)

# %% [markdown]
# ## Hessians
#
# For a scalar function the Hessian is the Jacobian of the gradient.
# `hessian(g)` is `jacfwd(jacrev(g))`: the gradient is computed in reverse
# mode (one backward pass for a scalar) and then differentiated in forward
# mode (one forward pass per input). Forward-over-reverse is the usual
# choice: the inner gradient is cheap, and forward mode does not have to
# store the intermediate values of the outer differentiation.
#
# The scalar here is a squared-error loss of the tanh layer w.r.t. a
# target, as a function of the input.

# %%
target = jnp.asarray(rng.standard_normal(M))


def loss(x):
    return 0.5 * fnp.sum((layer(W, b, x) - target) ** 2)


progress("Hessians, three ways ...")
H = functx.hessian(loss)(x)
assert H.shape == (N, N)
close(H, jax.jit(jax.hessian(loss))(x))
close(H, functx.jacfwd(functx.jacrev(loss))(x))
close(H, functx.jacrev(functx.jacrev(loss))(x))       # reverse-over-reverse works too
close(H, H.T)                                         # a Hessian is symmetric
print("Hessian of the loss:", H.shape)

# %% [markdown]
# ## Hessian-vector products without the Hessian
#
# Many second-order methods (conjugate-gradient Newton steps, curvature
# estimates, influence functions) only need H v. `hvp(g, primals, tangents)`
# computes it as the forward derivative of the gradient in direction v
# (forward-over-reverse): one gradient evaluation carrying tangents, a
# small constant times the cost of a gradient, never forming the n × n
# matrix. `vhp` computes vᵀ H by reverse-over-reverse (the vjp of the
# gradient); for a symmetric Hessian it is the same vector.

# %%
v = jnp.asarray(rng.standard_normal(N))
progress("Hessian-vector products ...")
value, (Hv,) = functx.hvp(loss, (x,), (v,))
_, (vH,) = functx.vhp(loss, (x,), (v,))
close(value, loss(x))
close(Hv, H @ v)
close(vH, v @ H)
close(Hv, jax.jit(lambda x, v: jax.jvp(jax.grad(loss), (x,), (v,))[1])(x, v))  # JAX's hvp
print("hvp and vhp agree with H @ v")

# %% [markdown]
# ## The Hessian of a network's loss with respect to its weights
#
# Curvature studies look at the eigenvalues of the Hessian of the training
# loss in parameter space. For a small tanh network (3 → 10 → 10 → 1, 161
# weights) on a regression batch of 64 examples, `ravel_pytree` flattens the
# weights into one vector θ, and `functx.hessian` of the loss as a function
# of θ gives the 161 × 161 matrix, checked against `jax.hessian`.

# %%
from jax.flatten_util import ravel_pytree

small_net = [(jnp.asarray(rng.standard_normal((m, n)) / np.sqrt(n)),
              jnp.asarray(0.1 * rng.standard_normal(m)))
             for n, m in zip([3, 10, 10], [10, 10, 1])]
theta0, unravel = ravel_pytree(small_net)
X_reg = jnp.asarray(rng.standard_normal((64, 3)))
Y_reg = jnp.sin(X_reg.sum(axis=1))


def scalar_net(params, x):
    for W_, b_ in params[:-1]:
        x = fnp.tanh(W_ @ x + b_)
    W_, b_ = params[-1]
    return (W_ @ x + b_)[0]


def regression_loss(theta, X, Y):
    weights = unravel(theta)
    return fnp.mean((functx.vmap(lambda x: scalar_net(weights, x))(X) - Y) ** 2)


def jax_regression_loss(theta, X, Y):
    weights = unravel(theta)
    return jnp.mean((jax.vmap(lambda x: scalar_net(weights, x))(X) - Y) ** 2)


progress(f"compiling the {theta0.size} x {theta0.size} Hessian of the loss, and JAX's ...")
H_weights = functx.jit(functx.hessian(regression_loss))(theta0, X_reg, Y_reg)
close(H_weights, jax.jit(jax.hessian(jax_regression_loss))(theta0, X_reg, Y_reg))
close(H_weights, H_weights.T)
spectrum = np.linalg.eigvalsh(np.asarray(H_weights))
print(f"Hessian in weight space: {H_weights.shape}, eigenvalues from {spectrum[0]:.2f} "
      f"to {spectrum[-1]:.2f}; {int(np.sum(np.abs(spectrum) < 1e-3 * spectrum[-1]))} of them "
      "smaller in magnitude than 0.1% of the largest")

# %% [markdown]
# Left, the batched Jacobian of `vmap(f)` (16 examples × 3 outputs against
# 16 examples × 5 inputs): nonzero only in the diagonal blocks, the
# per-example Jacobians. Right, the eigenvalues of the weight-space Hessian,
# sorted: a few large ones, many near zero, and negative ones (at random
# initial weights the loss is not convex).

# %%
fig, (ax_jac, ax_eig) = plt.subplots(1, 2, figsize=(10, 4))
image = ax_jac.imshow(np.abs(np.asarray(full).reshape(16 * M, 16 * N)), cmap="viridis")
ax_jac.set(title="|jacrev(vmap(f))|: block diagonal", xlabel="example × input",
           ylabel="example × output")
fig.colorbar(image, ax=ax_jac, shrink=0.8)
ax_eig.plot(np.arange(1, spectrum.size + 1), spectrum, ".", color="tab:purple")
ax_eig.axhline(0.0, color="gray", lw=0.8)
ax_eig.set_yscale("symlog", linthresh=1e-2)
ax_eig.set(xlabel="index (sorted)", ylabel="eigenvalue (symlog)",
           title=f"Hessian spectrum of a {theta0.size}-weight network's loss")
fig.tight_layout()
save_figure(fig, "jacobians_hessians")

# %% [markdown]
# ## Cost: reverse mode for wide functions, forward mode for tall ones
#
# Reverse mode pays one backward pass per output row, forward mode one
# forward pass with tangents per input column. So
#
# * for a **wide** function (many inputs, few outputs, like a loss of many
#   parameters) `jacrev` needs few passes and `jacfwd` many;
# * for a **tall** function (few inputs, many outputs) it is the other way
#   round.
#
# Below, a three-layer tanh network from R⁵¹² to R⁴ (wide) and one from R⁴
# to R⁵¹² (tall). Each Jacobian is compiled with `functx.jit` and called
# once before timing, so the timings compare the programs, not tracing or
# compilation. The weights are passed as arguments of the compiled
# function: closed over, they would be constants of the program, and XLA
# would spend its compile time constant-folding the Jacobian's products of
# weights with the identity basis. (Timings on a shared machine are noisy,
# so they are printed, never asserted.)

# %%
def init_net(sizes):
    return [(jnp.asarray(rng.standard_normal((m, n)) / np.sqrt(n)),
             jnp.asarray(0.1 * rng.standard_normal(m)))
            for n, m in zip(sizes[:-1], sizes[1:])]


def net(params, x):
    for W_, b_ in params:
        x = fnp.tanh(W_ @ x + b_)
    return x


def best_time(fn, *args, repeats=20):
    jax.block_until_ready(fn(*args))                  # compile (and warm up)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return min(times)


jac_rev = functx.jit(functx.jacrev(net, argnums=1))
jac_fwd = functx.jit(functx.jacfwd(net, argnums=1))

progress("compiling and timing jacrev and jacfwd on a wide and a tall network ...")
print(f"{'function':<22}{'jacrev':>12}{'jacfwd':>12}")
for name, sizes in [("wide R^512 -> R^4", [512, 256, 256, 4]),
                    ("tall R^4 -> R^512", [4, 256, 256, 512])]:
    params = init_net(sizes)
    x0 = jnp.asarray(rng.standard_normal(sizes[0]))
    J = jac_rev(params, x0)
    assert J.shape == (sizes[-1], sizes[0])
    close(J, jac_fwd(params, x0))
    close(J, jax.jit(jax.jacrev(net, argnums=1))(params, x0))
    t_rev, t_fwd = best_time(jac_rev, params, x0), best_time(jac_fwd, params, x0)
    print(f"{name:<22}{t_rev * 1e3:>10.3f}ms{t_fwd * 1e3:>10.3f}ms")

# %% [markdown]
# Expected (and typically observed): `jacrev` wins on the wide function
# (4 backward passes against 512 forward ones) and `jacfwd` on the tall one.
# The ratio is smaller than 128 because each pass is batched by `vmap` into
# matrix-matrix products, which use the hardware better than 4 thin
# matrix-vector products do.

# %%
print(f"jacobians_hessians: all checks passed in {time.perf_counter() - t_start:.1f}s")
