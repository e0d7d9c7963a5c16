"""Repeated eager calls over the op tables, by hand (minutes; not part of
the suite): `python tests/eager_repeat_sweep.py [prims|public] [FROM TO]`.

For every differentiable record of tests/op_table.py ("prims") or
tests/op_table_public.py ("public"), `grad` and `vmap(grad)` of
`sum(sin(1.3 * outputs))` are called 5 times each, waiting for the compile
thread after each call, so that the later calls take the eager engine's
caches (fused and batched steps, combined queue programs, compiled
backward passes, programs dispatched ahead). The first call is compared
with JAX's transforms of the same function (float64), every later call
with the first bit for bit. Prints one line per record that failed
(`BITS`: a later call differed; `ERR`: an exception) and a summary."""

import sys

import numpy as np

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import functx as fx  # noqa: E402
from functx import caches  # noqa: E402

CALLS = 5


def _loss(fn):
    def f(*args):
        leaves = [x for x in jax.tree_util.tree_leaves(fn(*args))
                  if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
        return sum(jnp.sum(jnp.sin(x * 1.3)) for x in leaves)
    return f


def _repeat(name, transform, ours, theirs, args):
    """None, or what failed."""
    try:
        want = theirs(*args)
    except Exception:  # noqa: BLE001 - JAX refuses it too: nothing to compare
        return None
    first = None
    for i in range(CALLS):
        got = ours(*args)
        bits = [np.asarray(x).tobytes() for x in got]
        if first is None:
            first = bits
            for a, b in zip(got, want):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)
        elif bits != first:
            return f"BITS {transform} {name} call {i}"
        caches.wait_for_compiles()
    return None


def main(which="public", lo=0, hi=None):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    if which == "prims":
        from op_table import OPS
    else:
        from op_table_public import OPS
    bad = 0
    for op in OPS[lo:hi]:
        if op.nondiff:
            continue
        rng = np.random.default_rng(0)
        draws = [[g(rng) for g in op.gens] for _ in range(4)]
        args = [jnp.asarray(a) for a in draws[0]]
        diff = tuple(op.diff) if op.diff is not None else tuple(
            i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
        if not diff:
            continue
        f = _loss(op.fn)
        cases = [("grad", fx.grad(f, argnums=diff), jax.grad(f, argnums=diff), args)]
        if op.batch:
            batch = [jnp.stack([jnp.asarray(d[j]) for d in draws[1:]]) for j in range(len(args))]
            cases.append(("vmap(grad)", fx.vmap(fx.grad(f, argnums=diff)),
                          jax.vmap(jax.grad(f, argnums=diff)), batch))
        for transform, ours, theirs, a in cases:
            try:
                failed = _repeat(op.name, transform, ours, theirs, a)
            except Exception as e:  # noqa: BLE001 - reported, then the next record
                failed = f"ERR {transform} {op.name} {type(e).__name__}: {str(e)[:200]}"
            if failed:
                bad += 1
                print(failed.replace("\n", " "), flush=True)
    print(f"{which} [{lo}:{hi}]: {bad} failed", flush=True)
    return bad


if __name__ == "__main__":
    argv = sys.argv[1:]
    which = argv[0] if argv else "public"
    lo, hi = (int(argv[1]), int(argv[2])) if len(argv) > 2 else (0, None)
    sys.exit(1 if main(which, lo, hi) else 0)
