"""Per-sample gradient norms and clipped DP-SGD gradients (issue 19): an MLP
784-512-512-10 (ReLU, cross-entropy, float32) at batch 64, 256 and 1024.

Rows, each computing the same quantity from the same weights and data:
  * the ordinary gradient of the summed loss (functx.jit, jax.jit): the
    yardstick ("step" below);
  * functx.per_sample_grad_norms and functx.clipped_grad under functx.jit
    (NOTE [ghost norms]: no per-example weight gradients);
  * vmap(grad) followed by the norms / the clipped sum, in functx
    (functx.jit) and JAX (jax.jit), and torch.func eager;
  * Opacus's ghost clipping (GradSampleModuleFastGradientClipping,
    use_ghost_clipping=True; forward + its double backward) when opacus
    imports.

Time: median over rounds of one call each (results blocked on), after
warm-up. Memory: the compiled program's memory analysis (arguments +
outputs + temporaries) for the jitted rows; torch's rows report none. Every
clipped result is checked against jax.jit's vmap(grad) + clip before timing.

Usage: python benchmarks/per_sample_norms.py [--quick] [--markdown] [--rounds N]
"""

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import init_mlp, render  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import functx as fx  # noqa: E402
import functx.numpy as fnp  # noqa: E402

SIZES = (784, 512, 512, 10)
C = 1.0  # clipping norm


def make_loss(np_, nn):
    def loss(p, x, y):
        """Cross-entropy of one example (or of a batch: the sum)."""
        h = x
        for i in range(len(SIZES) - 1):
            h = h @ p[f"w{i}"] + p[f"b{i}"]
            if i < len(SIZES) - 2:
                h = np_.maximum(h, 0.0)
        logp = nn.log_softmax(h, axis=-1)
        return -np_.sum(logp * nn.one_hot(y, SIZES[-1], dtype=logp.dtype))

    return loss


fx_loss = make_loss(fnp, fx.nn)
jax_loss = make_loss(jnp, jax.nn)


def flat_norms(per_example, batch):
    return jnp.sqrt(sum(jnp.sum(g.reshape(batch, -1) ** 2, axis=1)
                        for g in jax.tree_util.tree_leaves(per_example)))


def clip_sum(per_example, norms):
    w = jnp.minimum(1.0, C / norms)
    return jax.tree_util.tree_map(lambda g: jnp.tensordot(w, g, axes=1), per_example)


def functx_rows():
    """name -> (jitted function of (params, xs, ys), kind)."""
    def fx_vmap_grad(p, x, y):
        return fx.vmap(fx.grad(fx_loss), in_dims=(None, 0, 0))(p, x, y)

    rows = {
        "grad of the summed loss, functx.jit (step)": (fx.jit(fx.grad(fx_loss)), "grad"),
        "per_sample_grad_norms, functx.jit": (
            fx.jit(fx.per_sample_grad_norms(fx_loss, in_dims=(None, 0, 0))), "norms"),
        "clipped_grad, functx.jit": (fx.jit(fx.clipped_grad(fx_loss, C, in_dims=(None, 0, 0))),
                                     "clipped"),
        "vmap(grad) + norms, functx.jit": (
            fx.jit(lambda p, x, y: flat_norms(fx_vmap_grad(p, x, y), x.shape[0])), "norms"),
        "vmap(grad) + clip, functx.jit": (
            fx.jit(lambda p, x, y: clip_sum(*(lambda g: (g, flat_norms(g, x.shape[0])))(
                fx_vmap_grad(p, x, y)))), "clipped"),
    }
    return rows


def jax_rows():
    def vg(p, x, y):
        return jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0))(p, x, y)

    return {
        "grad of the summed loss, jax.jit": (jax.jit(jax.grad(jax_loss)), "grad"),
        "jax.vmap(jax.grad) + norms, jax.jit": (
            jax.jit(lambda p, x, y: flat_norms(vg(p, x, y), x.shape[0])), "norms"),
        "jax.vmap(jax.grad) + clip, jax.jit": (
            jax.jit(lambda p, x, y: clip_sum(*(lambda g: (g, flat_norms(g, x.shape[0])))(
                vg(p, x, y)))), "clipped"),
    }


def torch_rows(np_params):
    try:
        import torch
        from torch.func import functional_call, grad, vmap
    except ImportError:
        return {}, None
    torch.set_num_threads(os.cpu_count() or 1)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                [torch.nn.Linear(m, n) for m, n in zip(SIZES[:-1], SIZES[1:])])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = torch.relu(x)
            return x

    def build():
        model = MLP()
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                layer.weight.copy_(torch.from_numpy(np_params[f"w{i}"].T.copy()))
                layer.bias.copy_(torch.from_numpy(np_params[f"b{i}"].copy()))
        return model

    model = build()
    params = {k: v.detach() for k, v in model.named_parameters()}
    ce = torch.nn.CrossEntropyLoss(reduction="sum")

    def loss_one(p, x, y):
        return ce(functional_call(model, p, (x[None],)), y[None])

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def torch_clip(x, y):
        g = per_example(params, x, y)
        norms = torch.sqrt(sum(torch.sum(v.reshape(v.shape[0], -1) ** 2, 1) for v in g.values()))
        w = torch.clamp(C / norms, max=1.0)
        return {k: torch.tensordot(w, v, dims=1) for k, v in g.items()}

    def torch_step(x, y):
        model.zero_grad()
        ce(model(x), y).backward()
        return {k: v.grad for k, v in model.named_parameters()}

    rows = {"grad of the summed loss, torch eager": (torch_step, "grad"),
            "torch.func vmap(grad) + clip, eager": (torch_clip, "clipped")}
    try:
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
    except ImportError:
        return rows, torch
    ghost_model = build()
    gsm = GradSampleModuleFastGradientClipping(ghost_model, max_grad_norm=C, loss_reduction="sum",
                                               use_ghost_clipping=True)
    opt = DPOptimizerFastGradientClipping(torch.optim.SGD(gsm.parameters(), lr=0.0),
                                          noise_multiplier=0.0, max_grad_norm=C,
                                          expected_batch_size=1, loss_reduction="sum")
    crit = DPLossFastGradientClipping(gsm, opt, torch.nn.CrossEntropyLoss(reduction="sum"), "sum")

    def opacus_ghost(x, y):
        opt.zero_grad()
        crit(gsm(x), y).backward()
        return {k.removeprefix("_module."): v.grad for k, v in gsm.named_parameters()}

    rows["Opacus ghost clipping, eager"] = (opacus_ghost, "clipped")
    return rows, torch


def check(got, want, name):
    """Equal up to float32 (and on GPU TF32 products) round-off; a mismatch
    is reported (largest difference relative to the leaf's scale)."""
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))
                for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))
    if worst > 2e-3:
        print(f"CHECK: {name}: largest difference {worst:.1e} of the leaf's scale", flush=True)


def compiled_bytes(fn, *args):
    try:
        m = fn.lower(*args).compile().memory_analysis()
        return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    except Exception:  # noqa: BLE001 - no analysis on this backend
        return None


def to_jax_tree(out, torch_mod):
    """A torch result (dict by parameter name) as the JAX parameter dict."""
    if torch_mod is None or not isinstance(out, dict) or "w0" in out:
        return out
    res = {}
    for k, v in out.items():
        i, what = int(k.split(".")[1]), k.split(".")[2]
        v = v.detach().numpy()
        res[f"w{i}" if what == "weight" else f"b{i}"] = v.T if what == "weight" else v
    return res


def time_once(fn, args, block):
    t = time.perf_counter()
    block(fn(*args))
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="batch 64 and 256 only")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    opts = ap.parse_args()
    batches = (64, 256) if opts.quick else (64, 256, 1024)
    rng = np.random.default_rng(0)
    np_params = init_mlp(rng, SIZES)
    params = {k: jnp.asarray(v) for k, v in np_params.items()}
    print(f"# per-sample norms / clipped gradients, {datetime.datetime.now():%Y-%m-%d %H:%M}, "
          f"{platform.node()}, jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{os.cpu_count()} CPUs\n", flush=True)
    fx_r, jax_r = functx_rows(), jax_rows()
    t_r, torch_mod = torch_rows(np_params)
    step = "grad of the summed loss, functx.jit (step)"
    summary = []
    for batch in batches:
        xs_np = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
        ys_np = rng.integers(0, SIZES[-1], batch).astype(np.int32)
        xs, ys = jnp.asarray(xs_np), jnp.asarray(ys_np)
        want = {"clipped": jax_r["jax.vmap(jax.grad) + clip, jax.jit"][0](params, xs, ys),
                "norms": jax_r["jax.vmap(jax.grad) + norms, jax.jit"][0](params, xs, ys),
                "grad": jax_r["grad of the summed loss, jax.jit"][0](params, xs, ys)}
        calls = {}  # name -> (fn, args, block, kind)
        for name, (fn, kind) in list(fx_r.items()) + list(jax_r.items()):
            calls[name] = (fn, (params, xs, ys), jax.block_until_ready, kind)
        if torch_mod is not None:
            tx, ty = torch_mod.from_numpy(xs_np), torch_mod.from_numpy(ys_np.astype(np.int64))
            for name, (fn, kind) in t_r.items():
                calls[name] = (fn, (tx, ty), lambda r: r, kind)
        memory = {}
        for name, (fn, args, block, kind) in calls.items():  # check, warm up
            got = fn(*args)
            check(to_jax_tree(got, torch_mod) if block is not jax.block_until_ready else got,
                  want[kind], name)
            del got
            memory[name] = compiled_bytes(fn, *args) if block is jax.block_until_ready else None
        gc.collect()
        # interleaved rounds: each round times every row once, so the machine's
        # drift affects every row alike; ratios to the step are per round
        times = {name: [] for name in calls}
        for _ in range(opts.rounds):
            for name, (fn, args, block, _) in calls.items():
                times[name].append(time_once(fn, args, block))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        ratio = {name: statistics.median(a / b for a, b in zip(ts, times[step]))
                 for name, ts in times.items()}
        rows = []
        for name in calls:
            m = memory[name]
            rows.append([name, f"{med[name] * 1e3:.1f}", f"{ratio[name]:.2f}x",
                         "-" if m is None else f"{m / 2**20:.1f}",
                         "-" if m is None else f"{m / memory[step]:.2f}x"])
        render(f"MLP 784-512-512-10, batch {batch}",
               ["row", "time ms (median)", "time / step (median of per-round ratios)",
                "peak MiB (compiled)", "peak / step"], rows, opts.markdown)
        summary.append((batch, ratio, memory))
    rows = []
    for batch, ratio, memory in summary:
        cg = "clipped_grad, functx.jit"

        def over(name):
            return "-" if name not in ratio else f"{ratio[name] / ratio[cg]:.1f}x"

        rows.append([str(batch), f"{memory[cg] / memory[step]:.2f}x", f"{ratio[cg]:.2f}x",
                     over("vmap(grad) + clip, functx.jit"),
                     over("jax.vmap(jax.grad) + clip, jax.jit"),
                     over("torch.func vmap(grad) + clip, eager"),
                     over("Opacus ghost clipping, eager")])
    render("clipped_grad against the targets",
           ["batch", "peak / step (<= 1.5x)", "time / step (<= 2x)",
            "functx vmap(grad)+clip / it", "JAX vmap(grad)+clip / it", "torch.func / it",
            "Opacus ghost / it"], rows, opts.markdown,
           notes=["step: grad of the summed loss under functx.jit, same program and data; "
                  "'/ it': that row's time over clipped_grad's (medians of per-round ratios)."])


if __name__ == "__main__":
    main()
