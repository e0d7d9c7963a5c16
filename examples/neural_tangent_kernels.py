# %% [markdown]
# # Empirical neural tangent kernels with functx
#
# Linearise a network around its current parameters θ:
# f(θ + δ, x) ≈ f(θ, x) + J(x) δ, where J(x) = ∂f(θ, x)/∂θ. How a small
# gradient step on one input moves the output on another is governed by
# the *empirical neural tangent kernel*
#
#     Θ(x1, x2) = J(x1) J(x2)ᵀ        (an out × out matrix per pair of inputs)
#
# For batches of N1 and N2 inputs the kernel has shape N1 × N2 × out × out;
# its trace over the output axes (N1 × N2) is the variant often reported.
#
# This example computes Θ for a small Equinox CNN in two ways that
# trade memory for compute differently, and checks them against each other
# and against the same kernel written with JAX's own transforms:
#
# 1. **Jacobian contraction**: materialise J for every input (jacrev of the
#    network w.r.t. its parameter dict, vmapped over the batch), then
#    contract the per-parameter Jacobians and sum over parameters.
# 2. **NTK-vector products**: never form J. Θ(x1, x2) v = J(x1) (J(x2)ᵀ v)
#    is a vjp through the network on x2 followed by a jvp through the
#    network on x1; vmapping it over the basis vectors v gives the columns
#    of Θ. This costs out × (one backward + one forward pass) per pair, and
#    memory of one parameter vector per cotangent instead of out × #params
#    per input.

# %%
import functools
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64 so the cross-checks can be tight

import equinox as eqx
import jax.numpy as jnp
import numpy as np

import functx
import functx.numpy as fnp

t_start = time.perf_counter()


def progress(message):
    """A line saying what the next step is, stamped with the seconds so far."""
    print(f"[{time.perf_counter() - t_start:5.1f} s] {message}", flush=True)

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
# ## The network
#
# Nothing below depends on the architecture: any Equinox module called as
# `model(x)` works. Here a small convolutional network on 7x7 one-channel
# images: a strided 3x3 convolution to 4 channels, a 2x2 convolution, tanh
# after each, and a linear read-out to 3 outputs.
#
# The network is called functionally: `functional_call(model, params, x)`
# runs `model` with its weights replaced by the entries of `params`, a dict
# keyed by dotted path (`"layers.0.weight"`), so the transforms can
# differentiate w.r.t. `params`.

# %%
IN, OUT = (1, 7, 7), 3
rng = np.random.default_rng(0)

# Equinox's initialiser draws with jax.random, which compiles its generator
# for every weight shape (seconds on CPU, longer than the rest of this
# example). Instead: build the module's structure abstractly with
# `filter_eval_shape`, then fill in LeCun-normal weights from NumPy.


def build(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return eqx.nn.Sequential([
        eqx.nn.Conv2d(1, 4, 3, stride=2, key=k1), eqx.nn.Lambda(jnp.tanh),
        eqx.nn.Conv2d(4, 4, 2, key=k2), eqx.nn.Lambda(jnp.tanh),
        eqx.nn.Lambda(jnp.ravel), eqx.nn.Linear(16, OUT, key=k3),
    ])


progress("building the network ...")
skeleton = eqx.filter_eval_shape(build, jax.random.PRNGKey(0))


def init(leaf):
    if not isinstance(leaf, jax.ShapeDtypeStruct):      # the activation functions
        return leaf
    if len(leaf.shape) >= 2 and leaf.shape[1:] != (1, 1):  # weights: LeCun normal
        fan_in = int(np.prod(leaf.shape[1:]))
        return jnp.asarray(rng.standard_normal(leaf.shape) / np.sqrt(fan_in), leaf.dtype)
    return jnp.asarray(0.1 * rng.standard_normal(leaf.shape), leaf.dtype)   # biases


model = jax.tree_util.tree_map(init, skeleton)
params = functx.named_parameters(model)
print("parameters:", {name: tuple(p.shape) for name, p in params.items()})
print("number of parameters:", sum(p.size for p in params.values()))

x1 = jnp.asarray(rng.standard_normal((5, *IN)))  # N1 = 5
x2 = jnp.asarray(rng.standard_normal((4, *IN)))  # N2 = 4


def f(params, x):
    """The network on one input, as a function of its parameters."""
    return functx.functional_call(model, params, (x,))


# %% [markdown]
# ## 1. Jacobian contraction
#
# `jacrev(f)(params, x)` is a dict with the same keys as `params`; entry
# `name` has shape `(OUT,) + params[name].shape`. `vmap` over the inputs
# (parameters shared: `in_dims=(None, 0)`) adds a leading batch axis.
# Flattening each parameter's axes, the kernel is
#
#     Θ[n, m, a, b] = Σ_name Σ_k  J1[name][n, a, k] · J2[name][m, b, k]
#
# and its trace variant contracts the output axes too (`a == b`), which
# never forms the out × out blocks.
#
# `functx.jit` compiles the whole composition into one XLA program. The
# same code also runs eagerly, primitive by primitive, which for a one-off
# kernel mostly costs per-operation dispatch and compilation.

# %%
batched_jac = functx.vmap(functx.jacrev(f), in_dims=(None, 0))


@functools.partial(functx.jit, static_argnames="trace")
def ntk_by_jacobians(params, x1, x2, trace=False):
    j1, j2 = batched_jac(params, x1), batched_jac(params, x2)
    total = 0.0
    for name in params:
        a = j1[name].reshape(x1.shape[0], OUT, -1)   # (N1, out, #params of this leaf)
        b = j2[name].reshape(x2.shape[0], OUT, -1)
        total = total + (fnp.einsum("nak,mak->nm", a, b) if trace
                         else fnp.einsum("nak,mbk->nmab", a, b))
    return total


progress("compiling the Jacobian-contraction kernel (full and trace) ...")
ntk_jac = ntk_by_jacobians(params, x1, x2)
ntk_jac_trace = ntk_by_jacobians(params, x1, x2, trace=True)
print("full NTK:", ntk_jac.shape, " trace NTK:", ntk_jac_trace.shape)
assert ntk_jac.shape == (5, 4, OUT, OUT) and ntk_jac_trace.shape == (5, 4)

# The trace variant is the trace of the full kernel over its output axes.
np.testing.assert_allclose(ntk_jac_trace, np.trace(ntk_jac, axis1=2, axis2=3), rtol=1e-12)

# %% [markdown]
# ## 2. NTK-vector products
#
# For one pair (x1, x2) and one output cotangent v:
#
# * `vjp(f(·, x2))` gives J(x2)ᵀ v, a dict shaped like `params`;
# * `jvp(f(·, x1))` with that dict as the tangent gives J(x1) J(x2)ᵀ v.
#
# `vmap` over the identity basis of output cotangents gives all columns of
# Θ(x1, x2): column b is Θ(x1, x2) e_b, so the basis axis indexes columns,
# and `out_dims=1` puts it last (stacking it first would give Θᵀ). Two more
# `vmap`s run this for every x1 against every x2. The vjp of the network
# on x2 is taken once per pair and reused for all `out` cotangents.

# %%
def ntk_pair(params, a, b):
    _, vjp_fn = functx.vjp(lambda p: f(p, b), params)

    def column(v):
        (jt_v,) = vjp_fn(v)                                    # J(b)^T v
        _, jj_v = functx.jvp(lambda p: f(p, a), (params,), (jt_v,))
        return jj_v                                            # J(a) J(b)^T v

    return functx.vmap(column, out_dims=1)(jnp.eye(OUT))      # (OUT, OUT)


ntk_by_products = functx.jit(functx.vmap(functx.vmap(ntk_pair, in_dims=(None, None, 0)),
                                         in_dims=(None, 0, None)))
progress("compiling the NTK-vector-product kernel ...")
ntk_vp = ntk_by_products(params, x1, x2)
print("NTK-vector-product kernel:", ntk_vp.shape)


def rel_diff(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


rel = rel_diff(ntk_vp, ntk_jac)
print(f"Jacobian contraction vs NTK-vector products: max relative difference {rel:.1e}")
assert rel < 1e-8, rel

# %% [markdown]
# ## 3. The same kernel with JAX's transforms
#
# An independent reference: split the model into its array leaves and the
# rest with `eqx.partition`, take `jax.jacrev` w.r.t. the array pytree,
# `jax.vmap` it over the inputs, and contract leaf by leaf.

# %%
arrays, static = eqx.partition(model, eqx.is_inexact_array)


def f_jax(arrays, x):
    return eqx.combine(arrays, static)(x)


@jax.jit
def ntk_jax(arrays, x1, x2):
    jac = jax.vmap(jax.jacrev(f_jax), in_axes=(None, 0))
    leaves1 = jax.tree_util.tree_leaves(jac(arrays, x1))
    leaves2 = jax.tree_util.tree_leaves(jac(arrays, x2))
    return sum(jnp.einsum("nak,mbk->nmab", a.reshape(len(x1), OUT, -1),
                          b.reshape(len(x2), OUT, -1))
               for a, b in zip(leaves1, leaves2))


progress("compiling the kernel written with JAX's transforms ...")
ntk_ref = ntk_jax(arrays, x1, x2)
assert len(jax.tree_util.tree_leaves(arrays)) == len(params)  # same parameters on both sides

for label, ours in [("Jacobian contraction", ntk_jac), ("NTK-vector products", ntk_vp)]:
    rel = rel_diff(ours, ntk_ref)
    print(f"{label} vs JAX: max relative difference {rel:.1e}")
    assert rel < 1e-8, (label, rel)

# %% [markdown]
# Sanity properties of a kernel: Θ(x, x) is a Gram matrix, so for the same
# batch on both sides the (N·out) × (N·out) matrix is symmetric positive
# semi-definite.

# %%
progress("the kernel of x1 with itself ...")
gram = np.asarray(ntk_by_jacobians(params, x1, x1)).transpose(0, 2, 1, 3).reshape(5 * OUT, 5 * OUT)
np.testing.assert_allclose(gram, gram.T, rtol=1e-12, atol=1e-12)
eigs = np.linalg.eigvalsh(gram)
assert float(eigs.min()) > -1e-9 * float(eigs.max()), eigs
print(f"Θ(x1, x1): symmetric, eigenvalues in [{float(eigs.min()):.2e}, {float(eigs.max()):.2e}]")

# %% [markdown]
# The kernel as an image. Left, Θ(x1, x1) as the (N·out) × (N·out) Gram
# matrix: 5 × 5 blocks of 3 × 3, one block per pair of inputs; the diagonal
# blocks (an input with itself) are the largest. Right, the trace kernel
# Θ(x1, x2), one number per pair of inputs.

# %%
fig, (ax_full, ax_trace) = plt.subplots(1, 2, figsize=(10, 4.2),
                                        gridspec_kw={"width_ratios": [1.25, 1]})
limit = float(np.max(np.abs(gram)))
image = ax_full.imshow(gram, cmap="RdBu_r", vmin=-limit, vmax=limit)
for edge in np.arange(OUT, 5 * OUT, OUT) - 0.5:
    ax_full.axhline(edge, color="black", lw=0.6)
    ax_full.axvline(edge, color="black", lw=0.6)
ax_full.set(title="full NTK Θ(x1, x1)", xlabel="input × output", ylabel="input × output")
fig.colorbar(image, ax=ax_full, shrink=0.85)
trace = np.asarray(ntk_jac_trace)
image = ax_trace.imshow(trace, cmap="viridis")
for (i, j), value in np.ndenumerate(trace):
    dark = value < 0.5 * (trace.min() + trace.max())
    ax_trace.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=8,
                  color="white" if dark else "black")
ax_trace.set(title="trace NTK Θ(x1, x2)", xlabel="x2 input", ylabel="x1 input",
             xticks=range(trace.shape[1]), yticks=range(trace.shape[0]))
fig.colorbar(image, ax=ax_trace, shrink=0.85)
fig.tight_layout()
save_figure(fig, "neural_tangent_kernels")

print(f"neural_tangent_kernels: all checks passed in {time.perf_counter() - t_start:.1f}s")
