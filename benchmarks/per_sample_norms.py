"""Per-sample gradient norms and clipped DP-SGD gradients (issue 19): an MLP
784-512-512-10 (ReLU, cross-entropy, float32) at batch 64, 256 and 1024; a
small CNN (MNIST-sized: two strided convolutions and a Linear head) and a
transformer block (token and position embeddings, LayerNorm, 4-head
attention, a ReLU MLP, mean pooling, a Linear head) at batch 64 and 256.

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

Opacus is a benchmark-only dependency (`pip install opacus`); its rows are
left out when it does not import.

Usage: python benchmarks/per_sample_norms.py [--quick] [--markdown] [--rounds N]
           [--models mlp,cnn,transformer]
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


def summed(loss, vmap, np_):
    """The summed loss over a batch, of a loss written for one example."""
    def total(p, x, y):
        return np_.sum(vmap(loss, (None, 0, 0))(p, x, y))

    return total


def functx_rows(fx_loss=fx_loss, per_example_only=False):
    """name -> (jitted function of (params, xs, ys), kind). `per_example_only`:
    the loss takes one example (the step sums its vmap over the batch)."""
    def fx_vmap_grad(p, x, y):
        return fx.vmap(fx.grad(fx_loss), in_dims=(None, 0, 0))(p, x, y)

    batch_loss = summed(fx_loss, fx.vmap, fnp) if per_example_only else fx_loss
    rows = {
        "grad of the summed loss, functx.jit (step)": (fx.jit(fx.grad(batch_loss)), "grad"),
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


def jax_rows(jax_loss=jax_loss, per_example_only=False):
    def vg(p, x, y):
        return jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0))(p, x, y)

    batch_loss = summed(jax_loss, jax.vmap, jnp) if per_example_only else jax_loss
    return {
        "grad of the summed loss, jax.jit": (jax.jit(jax.grad(batch_loss)), "grad"),
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


# --------------------------------------------------------------------------
# The CNN and the transformer block: parameters named and laid out as the
# torch modules' (Linear weights (out, in), Conv2d kernels OIHW), so one
# dict serves functx, JAX and torch alike.

CNN_IN, T, VOCAB, D, HEADS, D_FF, CLASSES = (1, 28, 28), 32, 1000, 64, 4, 256, 10


def _conv(lax_, x, k, b, stride, pad):
    y = lax_.conv_general_dilated(x[None], k, (stride, stride), ((pad, pad), (pad, pad)))[0]
    return y + b[:, None, None]


def make_cnn_loss(np_, nn):
    import jax.lax as lax_

    def loss(p, x, y):
        """Cross-entropy of one image (1, 28, 28)."""
        h = np_.maximum(_conv(lax_, x, p["conv1.weight"], p["conv1.bias"], 2, 2), 0.0)
        h = np_.maximum(_conv(lax_, h, p["conv2.weight"], p["conv2.bias"], 2, 1), 0.0)
        logits = h.reshape(-1) @ p["fc.weight"].T + p["fc.bias"]
        logp = nn.log_softmax(logits)
        return -np_.sum(logp * nn.one_hot(y, CLASSES, dtype=logp.dtype))

    return loss


def init_cnn(rng):
    def u(*shape, fan):
        return (rng.uniform(-1, 1, shape) / np.sqrt(fan)).astype(np.float32)

    return {"conv1.weight": u(16, 1, 5, 5, fan=25), "conv1.bias": u(16, fan=25),
            "conv2.weight": u(32, 16, 3, 3, fan=144), "conv2.bias": u(32, fan=144),
            "fc.weight": u(CLASSES, 32 * 7 * 7, fan=32 * 49), "fc.bias": u(CLASSES, fan=32 * 49)}


def make_block_loss(np_, nn):
    def ln(h, w, b):
        mu = np_.mean(h, axis=-1, keepdims=True)
        var = np_.mean((h - mu) ** 2, axis=-1, keepdims=True)
        return (h - mu) / np_.sqrt(var + 1e-5) * w + b

    def lin(h, p, name):
        out = h @ p[name + ".weight"].T
        return out + p[name + ".bias"] if name + ".bias" in p else out

    def loss(p, ids, y):
        """Cross-entropy of one sequence of T token ids."""
        h = p["emb.weight"][ids] + p["pos"]
        a = ln(h, p["ln1.weight"], p["ln1.bias"])
        q, k, v = (lin(a, p, n).reshape(T, HEADS, D // HEADS).transpose(1, 0, 2)
                   for n in ("q", "k", "v"))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(D // HEADS)
        att = (nn.softmax(s, axis=-1) @ v).transpose(1, 0, 2).reshape(T, D)
        h = h + lin(att, p, "o")
        h = h + lin(np_.maximum(lin(ln(h, p["ln2.weight"], p["ln2.bias"]), p, "ff1"), 0.0),
                    p, "ff2")
        logp = nn.log_softmax(lin(np_.mean(h, axis=0), p, "head"))
        return -np_.sum(logp * nn.one_hot(y, CLASSES, dtype=logp.dtype))

    return loss


def init_block(rng):
    def u(*shape, fan):
        return (rng.uniform(-1, 1, shape) / np.sqrt(fan)).astype(np.float32)

    p = {"emb.weight": rng.standard_normal((VOCAB, D)).astype(np.float32),
         "pos": (0.1 * rng.standard_normal((T, D))).astype(np.float32),
         "ln1.weight": np.ones(D, np.float32), "ln1.bias": np.zeros(D, np.float32),
         "ln2.weight": np.ones(D, np.float32), "ln2.bias": np.zeros(D, np.float32)}
    for name, (i, o) in {"q": (D, D), "k": (D, D), "v": (D, D), "o": (D, D), "ff1": (D, D_FF),
                         "ff2": (D_FF, D), "head": (D, CLASSES)}.items():
        p[name + ".weight"], p[name + ".bias"] = u(o, i, fan=i), u(o, fan=i)
    del p["k.bias"]  # its gradient is zero (softmax ignores a shift of a query's scores)
    return p


def torch_generic_rows(model, np_params):
    """torch.func vmap(grad) + clip on the same functional loss, and Opacus
    ghost clipping on an equivalent nn.Module (Conv2d / Linear / LayerNorm /
    Embedding layers, which its ghost clipping supports)."""
    try:
        import torch
        from torch.func import grad, vmap
    except ImportError:
        return {}, None
    torch.set_num_threads(os.cpu_count() or 1)
    tp = {k: torch.from_numpy(v.copy()) for k, v in np_params.items()}

    class CNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 16, 5, stride=2, padding=2)
            self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.fc = torch.nn.Linear(32 * 7 * 7, CLASSES)

        def forward(self, x):
            h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
            return self.fc(h.flatten(1))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, D)
            self.pos = torch.nn.Parameter(torch.zeros(T, D))
            self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
            for n in ("q", "k", "v", "o"):
                setattr(self, n, torch.nn.Linear(D, D, bias=n != "k"))
            self.ff1, self.ff2 = torch.nn.Linear(D, D_FF), torch.nn.Linear(D_FF, D)
            self.head = torch.nn.Linear(D, CLASSES)

        def forward(self, ids):
            n = ids.shape[0]
            h = self.emb(ids) + self.pos
            a = self.ln1(h)

            def heads(x):
                return x.reshape(n, T, HEADS, D // HEADS).transpose(1, 2)

            q, k, v = heads(self.q(a)), heads(self.k(a)), heads(self.v(a))
            s = q @ k.transpose(-1, -2) / np.sqrt(D // HEADS)
            att = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(n, T, D)
            h = h + self.o(att)
            h = h + self.ff2(torch.relu(self.ff1(self.ln2(h))))
            return self.head(h.mean(1))

    def build():
        m = CNN() if model == "cnn" else Block()
        with torch.no_grad():
            for k, v in m.named_parameters():
                v.copy_(tp[k])
        return m

    module = build()
    ce = torch.nn.CrossEntropyLoss(reduction="sum")

    def loss_one(p, x, y):
        from torch.func import functional_call

        return ce(functional_call(module, p, (x[None],)), y[None])

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))
    params = {k: v.detach() for k, v in module.named_parameters()}

    def torch_clip(x, y):
        g = per_example(params, x, y)
        norms = torch.sqrt(sum(torch.sum(v.reshape(v.shape[0], -1) ** 2, 1) for v in g.values()))
        w = torch.clamp(C / norms, max=1.0)
        return {k: torch.tensordot(w, v, dims=1) for k, v in g.items()}

    def torch_step(x, y):
        module.zero_grad()
        ce(module(x), y).backward()
        return {k: v.grad for k, v in module.named_parameters()}

    rows = {"grad of the summed loss, torch eager": (torch_step, "grad"),
            "torch.func vmap(grad) + clip, eager": (torch_clip, "clipped")}
    try:
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
    except ImportError:
        return rows, torch
    try:
        gsm = GradSampleModuleFastGradientClipping(build(), max_grad_norm=C, loss_reduction="sum",
                                                   use_ghost_clipping=True)
    except Exception as e:  # noqa: BLE001 - a layer Opacus does not support
        print(f"Opacus: {model}: {type(e).__name__}: {e}", flush=True)
        return rows, torch
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
    if not all(k.startswith("layers.") for k in out):  # named as the JAX dict already
        return {k: v.detach().numpy() for k, v in out.items()}
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


def models(names, quick):
    """(title, batches, params, fx loss, jax loss, torch rows, data(rng, batch))."""
    rng = np.random.default_rng(0)
    out = []
    if "mlp" in names:
        np_params = init_mlp(rng, SIZES)

        def data(r, n):
            return (r.standard_normal((n, SIZES[0])).astype(np.float32),
                    r.integers(0, SIZES[-1], n).astype(np.int32))

        out.append(("MLP 784-512-512-10", (64, 256) if quick else (64, 256, 1024), np_params,
                    fx_loss, jax_loss, torch_rows(np_params), data))
    if "cnn" in names:
        np_params = init_cnn(rng)

        def data(r, n):
            return (r.standard_normal((n,) + CNN_IN).astype(np.float32),
                    r.integers(0, CLASSES, n).astype(np.int32))

        out.append(("CNN conv(1-16, 5x5/2) conv(16-32, 3x3/2) linear(1568-10)", (64, 256),
                    np_params, make_cnn_loss(fnp, fx.nn), make_cnn_loss(jnp, jax.nn),
                    torch_generic_rows("cnn", np_params), data))
    if "transformer" in names:
        np_params = init_block(rng)

        def data(r, n):
            return (r.integers(0, VOCAB, (n, T)).astype(np.int32),
                    r.integers(0, CLASSES, n).astype(np.int32))

        out.append((f"Transformer block (vocab {VOCAB}, seq {T}, d {D}, {HEADS} heads, ff {D_FF})",
                    (64, 256), np_params, make_block_loss(fnp, fx.nn),
                    make_block_loss(jnp, jax.nn), torch_generic_rows("transformer", np_params),
                    data))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="batch 64 and 256 only")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="mlp,cnn,transformer")
    opts = ap.parse_args()
    print(f"# per-sample norms / clipped gradients, {datetime.datetime.now():%Y-%m-%d %H:%M}, "
          f"{platform.node()}, jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{os.cpu_count()} CPUs\n", flush=True)
    rng = np.random.default_rng(1)
    summary = []
    step = "grad of the summed loss, functx.jit (step)"
    for title, batches, np_params, fl, jl, (t_r, torch_mod), data in models(
            opts.models.split(","), opts.quick):
        params = {k: jnp.asarray(v) for k, v in np_params.items()}
        one = fl is not fx_loss  # the CNN and block losses take one example
        fx_r, jax_r = functx_rows(fl, one), jax_rows(jl, one)
        for batch in batches:
            xs_np, ys_np = data(rng, batch)
            xs, ys = jnp.asarray(xs_np), jnp.asarray(ys_np)
            want = {"clipped": jax_r["jax.vmap(jax.grad) + clip, jax.jit"][0](params, xs, ys),
                    "norms": jax_r["jax.vmap(jax.grad) + norms, jax.jit"][0](params, xs, ys),
                    "grad": jax_r["grad of the summed loss, jax.jit"][0](params, xs, ys)}
            calls = {}  # name -> (fn, args, block, kind)
            for name, (fn, kind) in list(fx_r.items()) + list(jax_r.items()):
                calls[name] = (fn, (params, xs, ys), jax.block_until_ready, kind)
            if torch_mod is not None:
                tx = torch_mod.from_numpy(xs_np.astype(np.int64) if xs_np.dtype.kind == "i"
                                          else xs_np)
                ty = torch_mod.from_numpy(ys_np.astype(np.int64))
                for name, (fn, kind) in t_r.items():
                    calls[name] = (fn, (tx, ty), lambda r: r, kind)
            memory = {}
            for name, (fn, args, block, kind) in calls.items():  # check, warm up
                got = fn(*args)
                check(to_jax_tree(got, torch_mod) if block is not jax.block_until_ready else got,
                      want[kind], f"{title}, batch {batch}: {name}")
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
            render(f"{title}, batch {batch}",
                   ["row", "time ms (median)", "time / step (median of per-round ratios)",
                    "peak MiB (compiled)", "peak / step"], rows, opts.markdown)
            summary.append((title.split(" ")[0], batch, ratio, memory))
    rows = []
    for model, batch, ratio, memory in summary:
        cg = "clipped_grad, functx.jit"

        def over(name):
            return "-" if name not in ratio else f"{ratio[name] / ratio[cg]:.1f}x"

        rows.append([model, str(batch), f"{memory[cg] / memory[step]:.2f}x", f"{ratio[cg]:.2f}x",
                     over("vmap(grad) + clip, functx.jit"),
                     over("jax.vmap(jax.grad) + clip, jax.jit"),
                     over("torch.func vmap(grad) + clip, eager"),
                     over("Opacus ghost clipping, eager")])
    render("clipped_grad against the targets",
           ["model", "batch", "peak / step (<= 1.5x)", "time / step (<= 2x)",
            "functx vmap(grad)+clip / it", "JAX vmap(grad)+clip / it", "torch.func / it",
            "Opacus ghost / it"], rows, opts.markdown,
           notes=["step: grad of the summed loss under functx.jit, same program and data; "
                  "'/ it': that row's time over clipped_grad's (medians of per-round ratios)."])


if __name__ == "__main__":
    main()
