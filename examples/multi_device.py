# %% [markdown]
# # Many devices with functx
#
# functx transforms lower onto JAX, so they run on JAX's own engine for many
# devices: arrays sharded over a `jax.sharding.Mesh`, `functx.jit` with
# `in_shardings` / `out_shardings` (XLA partitions the program), a vmapped
# axis mapped onto a mesh axis with `vmap(..., spmd_axis_name=...)`, named
# axes and collectives (`functx.lax.pmean`), and `jax.shard_map` around or
# inside functx transforms.
#
# This example runs three recipes on 8 simulated CPU devices and checks
# each against the same computation on one device:
#
# 1. data-parallel DP-SGD: per-sample gradients sharded over the batch,
#    clipped, and averaged with `pmean`;
# 2. an ensemble with one member per device: `stack_module_state` sharded
#    along the model axis;
# 3. MAML with the tasks sharded over the devices.
#
# On GPUs or TPUs nothing changes in functx: the mesh is made of those
# devices, and across hosts `jax.distributed.initialize()` comes first.

# %%
import os

# 8 CPU devices: the flag must be set before JAX starts (any XLA_FLAGS kept).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")

import time

import jax

jax.config.update("jax_enable_x64", True)  # float64: the checks below are tight

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import functx
import functx.numpy as fnp

start = time.perf_counter()
assert jax.device_count() == 8, jax.devices()


def progress(message):
    """A line saying what the next step is, stamped with the seconds so far."""
    print(f"[{time.perf_counter() - start:5.1f} s] {message}", flush=True)

tree_map, tree_leaves = jax.tree_util.tree_map, jax.tree_util.tree_leaves
rng = np.random.default_rng(0)

# One mesh axis over the 8 devices. (Auto axis types: XLA's partitioner
# propagates the layouts; functx values carry no sharding of their own.)
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
replicated = NamedSharding(mesh, P())
by_rows = NamedSharding(mesh, P("data"))  # leading axis split over the devices
one_device = jax.devices()[0]


def max_difference(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(tree_leaves(a), tree_leaves(b)))


def on_one_device(tree):
    return jax.device_put(tree, one_device)


def rows_by_device(array):
    """Which device holds each index of `array`'s leading axis."""
    owner = np.full(array.shape[0], -1)
    for shard in array.addressable_shards:
        owner[shard.index[0]] = shard.device.id
    return owner

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
# ## 1. Data-parallel DP-SGD
#
# Each example's gradient is clipped to norm `CLIP` before averaging, then
# Gaussian noise is added. Written for one example: `grad` of its loss,
# clipped, then `functx.lax.pmean` over the named batch axis. The batch is
# split over the devices (`spmd_axis_name="data"`, and `in_shardings` of
# `functx.jit`): each device computes the per-sample gradients of its rows,
# and the `pmean` becomes one all-reduce.

# %%
SIZES, BATCH, CLIP, NOISE, LR = (6, 16, 1), 64, 0.5, 0.1, 0.1


def init_mlp(sizes):
    return [{"w": jnp.asarray(rng.standard_normal((m, n)) / np.sqrt(n)), "b": jnp.zeros(m)}
            for n, m in zip(sizes[:-1], sizes[1:])]


def mlp(params, x):
    for layer in params[:-1]:
        x = fnp.tanh(layer["w"] @ x + layer["b"])
    return params[-1]["w"] @ x + params[-1]["b"]


def loss(params, x, y):
    return fnp.sum((mlp(params, x) - y) ** 2)


def clipped(g):
    norm = fnp.sqrt(sum(fnp.sum(leaf ** 2) for leaf in tree_leaves(g)))
    return tree_map(lambda leaf: leaf * fnp.minimum(1.0, CLIP / (norm + 1e-12)), g)


def dp_sgd_step(params, xs, ys, key, spmd_axis_name=None):
    def per_example(x, y):
        return functx.lax.pmean(clipped(functx.grad(loss)(params, x, y)), "batch")

    mean_grad = functx.vmap(per_example, out_dims=None, axis_name="batch",
                            spmd_axis_name=spmd_axis_name)(xs, ys)
    keys = jax.random.split(key, len(tree_leaves(params)))
    noise = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(params),
        [jax.random.normal(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, tree_leaves(params))])
    return tree_map(lambda p, g, n: p - LR * (g + NOISE * CLIP / BATCH * n),
                    params, mean_grad, noise)


params = init_mlp(SIZES)
xs = jnp.asarray(rng.standard_normal((BATCH, SIZES[0])))
ys = jnp.asarray(rng.standard_normal((BATCH, SIZES[-1])))
key = jax.random.PRNGKey(0)

progress("compiling the sharded DP-SGD step and the one-device reference ...")
sharded_step = functx.jit(lambda p, x, y, k: dp_sgd_step(p, x, y, k, "data"),
                          in_shardings=(replicated, by_rows, by_rows, replicated),
                          out_shardings=replicated)
new_params = sharded_step(params, xs, ys, key)
reference = functx.jit(dp_sgd_step)(*on_one_device((params, xs, ys, key)))
assert all(leaf.sharding.is_fully_replicated for leaf in tree_leaves(new_params))
assert max_difference(new_params, reference) < 1e-12
print(f"DP-SGD, batch split over {len(mesh.devices.flat)} devices: equals one device "
      f"(max diff {max_difference(new_params, reference):.1e})")

# The per-sample gradients themselves stay split over the devices:
progress("sharded per-sample gradients ...")
per_sample = functx.jit(functx.vmap(functx.grad(loss), in_dims=(None, 0, 0)),
                        in_shardings=(replicated, by_rows, by_rows))(params, xs, ys)
assert per_sample[0]["w"].sharding.spec[0] == "data"
rows_owner = rows_by_device(per_sample[0]["w"])
assert np.all(np.diff(rows_owner) >= 0) and np.all(np.bincount(rows_owner) == BATCH // 8)

# The same step written per device with jax.shard_map: inside, each device
# holds its rows (plain JAX arrays), computes their clipped per-sample
# gradients with functx, and sums them across devices with jax.lax.psum.


def per_device(params, xs, ys):
    grads = functx.vmap(lambda x, y: clipped(functx.grad(loss)(params, x, y)))(xs, ys)
    return tree_map(lambda g: jax.lax.psum(g.sum(0), "data") / BATCH, grads)


progress("the same step with jax.shard_map ...")
mean_grad = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                  out_specs=P()))(params, xs, ys)
reference_grad = functx.vmap(lambda x, y: clipped(functx.grad(loss)(params, x, y)))(xs, ys)
assert max_difference(mean_grad, tree_map(lambda g: g.mean(0), reference_grad)) < 1e-12
print("DP-SGD with jax.shard_map around functx.vmap(grad): equals one device")

# %% [markdown]
# ## 2. An ensemble with one member per device
#
# `stack_module_state` stacks the weights of 8 Equinox models on a leading
# model axis; putting that axis on the mesh gives each device one member.
# `vmap(..., spmd_axis_name=...)` keeps the model axis on the mesh inside
# the program, so each device evaluates (and differentiates) its own member.

# %%
NUM_MODELS, IN, WIDTH, OUT = 8, 5, 12, 3
progress("an ensemble of 8 Equinox MLPs, one per device ...")
model_mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))
by_model = NamedSharding(model_mesh, P("model"))
members = [eqx.nn.MLP(IN, OUT, WIDTH, 2, activation=jax.nn.tanh, key=k, dtype=jnp.float64)
           for k in jax.random.split(jax.random.PRNGKey(1), NUM_MODELS)]
stacked, buffers = functx.stack_module_state(members)
sharded_weights = jax.device_put(stacked, by_model)
batch = jnp.asarray(rng.standard_normal((16, IN)))
labels = jnp.asarray(rng.standard_normal((16, OUT)))


def member_loss(weights, buffers, xs, ys):
    predict = functx.vmap(lambda x: functx.functional_call(members[0], (weights, buffers), (x,)))
    return fnp.mean((predict(xs) - ys) ** 2)


def ensemble_grads(weights, buffers, xs, ys, spmd_axis_name=None):
    return functx.vmap(functx.grad(member_loss), in_dims=(0, 0, None, None),
                       spmd_axis_name=spmd_axis_name)(weights, buffers, xs, ys)


grads = functx.jit(lambda w, b, x, y: ensemble_grads(w, b, x, y, "model"))(
    sharded_weights, buffers, batch, labels)
reference = functx.jit(ensemble_grads)(*on_one_device((stacked, buffers, batch, labels)))
assert all(g.sharding.spec[0] == "model" for g in tree_leaves(grads))
members_owner = rows_by_device(grads["layers.0.weight"])
assert sorted(members_owner) == list(range(8))
assert max_difference(grads, reference) < 1e-12
for i in (0, 7):  # and each member's gradient is that member's own
    own = eqx.filter_grad(lambda m: jnp.mean((jax.vmap(m)(batch) - labels) ** 2))(members[i])
    own = functx.named_parameters(own)
    assert max(float(jnp.max(jnp.abs(grads[k][i] - own[k]))) for k in grads) < 1e-12
print("ensemble, one member per device: gradients equal one device and each member's own")

# %% [markdown]
# ## 3. MAML with the tasks sharded
#
# The meta-gradient of the loss after one inner gradient step, averaged
# over sinusoid regression tasks: a `grad` of a `vmap` over tasks of a
# `grad`. The tasks are split over the devices.

# %%
TASKS, SHOTS, INNER_LR = 16, 10, 0.05


def sample_tasks(n):
    amp, phase = rng.uniform(0.1, 5.0, (n, 1)), rng.uniform(0, np.pi, (n, 1))
    x = rng.uniform(-5, 5, (n, 2 * SHOTS))
    y = amp * np.sin(x + phase)
    split = lambda a: (jnp.asarray(a[:, :SHOTS, None]), jnp.asarray(a[:, SHOTS:, None]))  # noqa: E731
    (xs_s, xs_q), (ys_s, ys_q) = split(x), split(y)
    return xs_s, ys_s, xs_q, ys_q


def task_loss(params, xs, ys):
    return fnp.mean(functx.vmap(lambda x, y: loss(params, x, y))(xs, ys))


def maml_loss(params, tasks, spmd_axis_name=None):
    def adapted_loss(xs_s, ys_s, xs_q, ys_q):
        g = functx.grad(task_loss)(params, xs_s, ys_s)
        fast = tree_map(lambda p, d: p - INNER_LR * d, params, g)
        return task_loss(fast, xs_q, ys_q)

    return fnp.mean(functx.vmap(adapted_loss, spmd_axis_name=spmd_axis_name)(*tasks))


progress("MAML with the tasks sharded, and a loop for reference ...")
meta_params = init_mlp((1, 20, 1))
tasks = sample_tasks(TASKS)
meta_grad = functx.jit(functx.grad(lambda p, t: maml_loss(p, t, "data")),
                       in_shardings=(replicated, by_rows))(meta_params, tasks)
reference = functx.jit(functx.grad(maml_loss))(*on_one_device((meta_params, tasks)))
assert max_difference(meta_grad, reference) < 1e-12
expected = jax.grad(lambda p: jnp.mean(jnp.stack([
    task_loss(tree_map(lambda a, d: a - INNER_LR * d, p,
                       jax.grad(task_loss)(p, t[0][i], t[1][i])), t[2][i], t[3][i])
    for t in [tasks] for i in range(TASKS)])))(meta_params)
assert max_difference(meta_grad, expected) < 1e-10
print("MAML, tasks split over the devices: meta-gradient equals one device and a loop")

# %% [markdown]
# ## Where the data lives
#
# The 8 devices here are simulated on one CPU, so timings would say nothing
# about speed-ups; what is worth a look is the layout. Read back from the
# arrays the programs returned (`addressable_shards`): which device holds
# each example's per-sample gradient in recipe 1, and each ensemble
# member's gradient in recipe 2.

# %%
fig, (ax_rows, ax_members) = plt.subplots(2, 1, figsize=(9, 2.6),
                                          gridspec_kw={"height_ratios": [1, 1]})
cmap = plt.get_cmap("tab10", 8)
for ax, owner, what in [(ax_rows, rows_owner, "example (per-sample gradient)"),
                        (ax_members, members_owner, "ensemble member (its gradient)")]:
    ax.imshow(owner[None, :], cmap=cmap, vmin=-0.5, vmax=7.5, aspect="auto")
    for device in np.unique(owner):
        ax.text(np.flatnonzero(owner == device).mean(), 0, f"device {device}",
                ha="center", va="center", color="white", fontsize=8)
    ax.set(yticks=[], xlabel=what)
ax_rows.set_title("which of the 8 devices holds each row")
fig.tight_layout()
save_figure(fig, "multi_device")

print(f"done in {time.perf_counter() - start:.1f} s")
