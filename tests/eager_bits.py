"""Eager steps bit for bit, whichever path ran them: started by
tests/test_deferred.py in a child process with XLA's default options (the
suite's own are cheaper: tests/xla_options.py), or by hand,
`python tests/eager_bits.py [RANDOM_PROGRAMS]` (default 9). Each case is
called 7 times, waiting for the background compiles after each call, so
the first calls run per-primitive programs and the later ones the combined
programs (NOTE [deferred eager steps]); the results must agree bit for bit
(NOTE [one rounding per primitive], NOTE [transposed as if inlined]).
Prints JSON: how the eager engine keeps primitives apart on this backend
(`xla_cpu.isolation()`: "calls" or "barriers"), and the cases whose
results differed."""

import json
import random
import sys

import numpy as np

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import functx as fx  # noqa: E402
import functx.numpy as fnp  # noqa: E402
from functx import caches, xla_cpu  # noqa: E402

RNG = np.random.default_rng(0)
W, X = jnp.asarray(RNG.uniform(-1, 1, (8, 8))), jnp.asarray(RNG.uniform(-1, 1, (4, 8, 8)))
UNARY = [jnp.tanh, jnp.exp, jnp.sin, jnp.log1p, jax.nn.sigmoid, jax.nn.gelu, jnp.cosh,
         lambda v: v * v, lambda v: v ** 3, lambda v: v / 3.0, lambda v: v * 2.0 + 1.0,
         lambda v: (v + 0.1) + 0.7, lambda v: jnp.sum(jnp.broadcast_to(v[0], (8, 8)), 0) - v,
         lambda v: jnp.mean(v ** 2), lambda v: jax.nn.log_softmax(v, -1), lambda v: jnp.cumsum(v, -1),
         lambda v: jnp.exp(v) + v, lambda v: jnp.tanh(v) * v - 1.0, lambda v: v.T,
         lambda v: fx.lax.scan(lambda c, r: (c * 0.9 + jnp.sin(r), c * r), v[0], v)[1]]
BINARY = [jnp.add, jnp.subtract, jnp.multiply, jnp.maximum, lambda a, b: a / (1 + b * b),
          lambda a, b: a @ b, lambda a, b: a * b - a, lambda a, b: jnp.where(a > b, a * 0.3, b)]


_JITTED_NANVAR = fx.jit(lambda v: jnp.nanvar(v, axis=1))


def _nanvar_loss(w, x):
    return jnp.sum(jnp.sin(jnp.nanvar(w * x, axis=1) * 1.3)) + jnp.sum(jnp.tanh(w @ x) * w)


def _with_aux(w, x):
    return _nanvar_loss(w, x), jnp.tanh(w)


def random_program(seed):
    r = random.Random(seed)
    ops = [("u", r.randrange(len(UNARY)), r.randrange(i + 3)) if r.random() < 0.55 else
           ("b", r.randrange(len(BINARY)), r.randrange(i + 3), r.randrange(i + 3)) for i in range(8)]
    def f(w, x):
        vals = [w, x, w * x]
        for op in ops:
            v = UNARY[op[1]](vals[op[2]]) if op[0] == "u" else BINARY[op[1]](vals[op[2]], vals[op[3]])
            vals.append(jnp.clip(jnp.broadcast_to(v, (8, 8)), -3.0, 3.0))
        return jnp.sum(vals[-1] * vals[-2])
    return f


def transforms(f):
    return {"grad": (fx.grad(f), X[0]), "vmap(grad)": (fx.vmap(fx.grad(f), in_dims=(None, 0)), X),
            "grad(grad)": (fx.grad(lambda w, x: fnp.sum(fx.grad(f)(w, x) ** 2)), X[0])}


def bits(out):  # NaNs aside: which NaN an operation returns is not fixed
    out = np.asarray(out)
    return np.where(np.isnan(out), np.nan, out).tobytes()


def borrowed(name, fn, jvp_a, jvp_b):
    """A primitive `fn(a, b)` defined the way a JAX library defines one
    (functx has no definition of it and borrows JAX's rules), with
    functx.numpy around it: these cases are about the borrowed primitive."""
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    prim = Primitive(f"eager_bits_{name}")
    prim.def_impl(fn)
    prim.def_abstract_eval(
        lambda a, b: jax.core.ShapedArray(np.broadcast_shapes(a.shape, b.shape), a.dtype))
    mlir.register_lowering(prim, mlir.lower_fun(fn, multiple_results=False))
    ad.defjvp(prim, jvp_a, jvp_b)
    batching.defbroadcasting(prim)
    return lambda w, x: fnp.sum(fnp.tanh(prim.bind(w, x) + w * 0.5))


def borrowed_product():
    """A borrowed product, whose result a sum reads next."""
    return borrowed("product", lambda a, b: a * b, lambda t, a, b: t * b, lambda t, a, b: a * t)


def borrowed_tangent():
    """A borrowed `tan(a) * b`: tan is one of the functions XLA:CPU rounds
    differently under different compile options (its two fusion emitters,
    jaxlib 0.10-0.11.0), so JAX's own dispatch of the primitive and the
    eager engine's programs must agree on them."""
    return borrowed("tangent", lambda a, b: jnp.tan(a) * b,
                    lambda t, a, b: t * b / jnp.cos(a) ** 2, lambda t, a, b: jnp.tan(a) * t)


def _svd_loss(w, x):
    u, s, _ = jnp.linalg.svd(w[:4, :3] + 0.5 * x[:4, :3], full_matrices=False)
    return jnp.sum(jnp.sin(s * 1.3)) + jnp.sum(jnp.sin(jnp.abs(u) * 1.3))


def main(programs):
    borrowed = borrowed_product()
    tangent = borrowed_tangent()
    cases = {  # jax 0.12's jnp.tanh is a jitted one-equation JAX function; first, while
             # no other case has built what it shares (tanh's per-primitive programs)
             "vmap(grad) of jax.numpy's tanh": (
                 fx.vmap(fx.grad(lambda w, x: jnp.sum(jnp.tanh(w * x + w))), in_dims=(None, 0)), X),
             "tanh's derivative": (fx.grad(lambda w, x: fnp.sum(fnp.tanh(w @ x))), X[0]),
             "grad of a borrowed JAX primitive": (fx.grad(borrowed), X[0]),
             # functions XLA:CPU's two fusion emitters round differently: every
             # eager program must use the same ones
             "tan's and cbrt's derivatives": (fx.grad(lambda w, x: fnp.sum(fnp.sin(
                 fnp.tan(w * x) * 1.3 + fnp.cbrt(w + x * x + 2.0)))), X[0]),
             "grad of a borrowed tan": (fx.grad(tangent), X[0]),
             # its derivative, polygamma(1, .), has a constant operand
             "digamma's derivative": (fx.grad(lambda w, x: fnp.sum(fnp.sin(
                 jax.scipy.special.digamma(fnp.exp(w) + 0.3 + x * x) * 1.3))), X[0]),
             # a jitted JAX function, one call eagerly
             "nanvar's derivative": (fx.grad(lambda w, x: fnp.sum(fnp.sin(
                 jnp.nanvar(w * x, axis=1) * 1.3))), X[0]),
             # the same inside a user's functx.jit: its graph, one call eagerly
             "a functx.jit graph's derivative": (fx.grad(lambda w, x: fnp.sum(fnp.sin(
                 _JITTED_NANVAR(w * x) * 1.3))), X[0]),
             # a jitted function differentiated alone, its programs compiled whole,
             # rewrapped in every call or not (NOTE [a jitted function
             # differentiated alone] in functx/primitives/call.py)
             "grad of a functx.jit": (fx.grad(fx.jit(_nanvar_loss)), X[0]),
             "grad of a functx.jit made in every call": (
                 lambda w, x: fx.grad(fx.jit(_nanvar_loss))(w, x), X[0]),
             "grad of a jax.jit, with aux": (fx.grad(jax.jit(_with_aux), has_aux=True), X[0]),
             "vmap(grad) of a functx.jit": (fx.vmap(fx.grad(fx.jit(_nanvar_loss)), in_dims=(None, 0)), X),
             # a jitted JAX function whose program holds calls (an unrolled loop)
             "spence's derivative": (fx.grad(lambda w, x: fnp.sum(fnp.sin(
                 jax.scipy.special.spence(fnp.exp(-w * w) * 0.9 + 0.05 + x * 0.0) * 1.3))), X[0]),
             "vmap(grad) of a borrowed JAX primitive": (fx.vmap(fx.grad(borrowed), in_dims=(None, 0)), X),
             # JAX's jvp rule, one call mixing primals and tangents (NOTE [calls in a jvp rule])
             "svd's gradient": (fx.grad(_svd_loss), X[0]),
             "vmap(grad) of svd": (fx.vmap(fx.grad(_svd_loss), in_dims=(None, 0)), X)}
    for seed in range(programs):
        name, case = list(transforms(random_program(seed)).items())[seed % 3]
        cases[f"{name} of random program {seed}"] = case
    mismatched = []
    for name, (g, arg) in cases.items():
        seen = set()
        for _ in range(7):
            seen.add(bits(g(W, arg)))
            caches.wait_for_compiles()
        if len(seen) != 1:
            mismatched.append(name)
    print(json.dumps({"isolation": xla_cpu.isolation(), "mismatched": mismatched}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
