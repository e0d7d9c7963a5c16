"""Saved-value hooks (functx.autograd.graph) and functx.checkpoint.

Counts of saved values are derived from the derivative each primitive
records: `sin(x)` saves `cos(x)`; `a * b` saves the factor each
differentiated side is multiplied by (`x * x`: `x` twice); a checkpointed
call saves its array inputs only. Gradients are compared with JAX
(`jax.grad` / `jax.checkpoint`), in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx
import functx.numpy as fnp
from functx.autograd.graph import save_on_cpu, saved_tensors_hooks
from functx.interpreters import reverse

X = jnp.array([0.3, 0.5, 0.7])
Y = jnp.array([1.1, 1.2, 1.3])


class Recorder:
    """pack/unpack hooks that record what they see; the packed form is a
    tagged tuple, so the test sees that unpack gets what pack returned."""

    def __init__(self):
        self.packed, self.unpacked = [], []

    def pack(self, v):
        self.packed.append(v)
        return ("packed", v)

    def unpack(self, p):
        assert isinstance(p, tuple) and p[0] == "packed"
        self.unpacked.append(p[1])
        return p[1]


def _close(a, b, tol=1e-12):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("fn, expected", [
    # sin saves cos(x); mul by the non-differentiated y saves y.
    (lambda x: (fnp.sin(x) * Y).sum(), lambda x: [jnp.cos(x), Y]),
    # x * x: each side's derivative holds the other factor, x.
    (lambda x: (x * x).sum(), lambda x: [x, x]),
    # exp(sin(x)): cos(x), then exp(sin(x)).
    (lambda x: fnp.exp(fnp.sin(x)).sum(), lambda x: [jnp.cos(x), jnp.exp(jnp.sin(x))]),
])
def test_pack_unpack_counts_and_values(fn, expected):
    want = expected(X)
    for _ in range(3):  # first sighting runs the rules, later ones the fused steps
        rec = Recorder()
        with saved_tensors_hooks(rec.pack, rec.unpack):
            out, vjp_fn = functx.vjp(fn, X)
        assert len(rec.packed) == len(want)
        got = sorted(np.asarray(v).tolist() for v in rec.packed)
        ref = sorted(np.asarray(v).tolist() for v in want)
        _close(got, ref)
        assert rec.unpacked == []  # nothing read before the backward pass
        (g1,) = vjp_fn(jnp.ones(()))
        assert len(rec.unpacked) == len(want)
        (g2,) = vjp_fn(jnp.ones(()))  # every backward pass unpacks again
        assert len(rec.unpacked) == 2 * len(want)
        assert all(a is b for a, b in zip(rec.unpacked, rec.packed * 2))
        _close(g1, g2)
    # Gradients are unchanged by identity hooks.
    (g0,) = functx.vjp(fn, X)[1](jnp.ones(()))
    _close(g1, g0)


def test_gradient_matches_jax_and_backward_outside_context():
    rec = Recorder()
    with saved_tensors_hooks(rec.pack, rec.unpack):
        _, vjp_fn = functx.vjp(lambda x: (fnp.sin(x) * Y).sum(), X)
    (g,) = vjp_fn(jnp.ones(()))  # hooks of the forward apply, as in torch
    _close(g, jax.grad(lambda x: (jnp.sin(x) * Y).sum())(X))
    assert len(rec.unpacked) == 2
    # Forward outside any context, backward inside: nothing is packed.
    _, vjp_fn = functx.vjp(lambda x: fnp.sin(x).sum(), X)
    with saved_tensors_hooks(rec.pack, rec.unpack):
        vjp_fn(jnp.ones(()))
    assert len(rec.packed) == 2
    assert reverse.tape_observers == [] and reverse.backward_check is None


def test_float16_pack_changes_gradient_as_expected():
    f = lambda x: (fnp.sin(x) * Y).sum()  # noqa: E731
    with saved_tensors_hooks(lambda v: v.astype(jnp.float16), lambda v: v):
        g16 = functx.grad(f)(X)
    assert g16.dtype == jnp.float64  # unpacked values are cast back
    # The gradient cos(x) * y, computed from float16 copies of both factors.
    want = jnp.cos(X).astype(jnp.float16).astype(jnp.float64) * Y.astype(jnp.float16).astype(jnp.float64)
    _close(g16, want)
    exact = jnp.cos(X) * Y
    assert not np.allclose(g16, exact, rtol=1e-6, atol=0)
    _close(g16, exact, tol=2e-3)


def test_innermost_hooks_win_and_bad_unpack():
    outer, inner = Recorder(), Recorder()
    with saved_tensors_hooks(outer.pack, outer.unpack):
        with saved_tensors_hooks(inner.pack, inner.unpack):
            functx.grad(lambda x: fnp.sin(x).sum())(X)
    assert (len(outer.packed), len(inner.packed)) == (0, 1)
    with saved_tensors_hooks(lambda v: v, lambda v: v[:1]):
        _, vjp_fn = functx.vjp(lambda x: fnp.sin(x).sum(), X)
    with pytest.raises(functx.FunctxValueError, match="unpack_hook"):
        vjp_fn(jnp.ones(()))
    with pytest.raises(TypeError, match="pack_hook"):
        saved_tensors_hooks(None, lambda v: v)


def test_save_on_cpu():
    f = lambda x: (fnp.sin(x) * Y).sum()  # noqa: E731
    ctx = save_on_cpu()
    stored = []
    pack = ctx.pack_hook
    ctx.pack_hook = lambda v: stored.append(pack(v)) or stored[-1]
    with ctx:
        g = functx.grad(f)(X)
    _close(g, jax.grad(lambda x: (jnp.sin(x) * Y).sum())(X))
    assert len(stored) == 2
    cpu = jax.devices("cpu")[0]
    for device, v in stored:
        assert v.devices() == {cpu} and device == X.devices().pop()
    with save_on_cpu(pin_memory=True):
        _close(functx.grad(f)(X), g)


def test_hooks_under_jit_are_traced():
    """Under jax.jit the hooks run once, at trace time, on the traced
    residuals: a float16 pack hook is part of the compiled program."""
    f = lambda x: (fnp.sin(x) * Y).sum()  # noqa: E731
    calls = []

    def pack(v):
        calls.append(type(v))
        return v.astype(jnp.float16)

    @jax.jit
    def g(x):
        with saved_tensors_hooks(pack, lambda v: v):
            return functx.grad(f)(x)

    want = jnp.cos(X).astype(jnp.float16).astype(jnp.float64) * Y.astype(jnp.float16).astype(jnp.float64)
    _close(g(X), want)
    _close(g(X), want)
    assert len(calls) == 2  # once per saved value, during the single trace


# --------------------------------------------------------------------------
# checkpoint


def _g(x, y):
    return fnp.sin(fnp.sin(x) * y)


def _jg(x, y):
    return jnp.sin(jnp.sin(x) * y)


@pytest.mark.slow
def test_checkpoint_matches_jax_under_transforms():
    c = functx.checkpoint(_g)
    f = lambda x, y: (c(x, y) ** 2).sum()  # noqa: E731
    jf = lambda x, y: (jax.checkpoint(_jg)(x, y) ** 2).sum()  # noqa: E731
    XB = jnp.stack([X, Y])

    @jax.jit
    def both(x, y, xb):
        ours = [
            functx.grad(f, argnums=(0, 1))(x, y),
            functx.vjp(lambda x: c(x, y), x)[1](y),
            functx.jvp(lambda x: c(x, y), (x,), (y,))[1],
            functx.vmap(functx.grad(f))(xb, xb),
            functx.jacrev(lambda x: c(x, y))(x),
            functx.hessian(f)(x, y),
            functx.grad(lambda x: functx.grad(lambda z: c(z, y).sum())(x)[0])(x),
            functx.grad(lambda y: functx.checkpoint(lambda x: fnp.sin(x * y), x).sum())(y),
        ]
        theirs = [
            jax.grad(jf, argnums=(0, 1))(x, y),
            jax.vjp(lambda x: jax.checkpoint(_jg)(x, y), x)[1](y),
            jax.jvp(lambda x: _jg(x, y), (x,), (y,))[1],
            jax.vmap(jax.grad(jf))(xb, xb),
            jax.jacrev(lambda x: _jg(x, y))(x),
            jax.hessian(jf)(x, y),
            jax.grad(lambda x: jax.grad(lambda z: jax.checkpoint(_jg)(z, y).sum())(x)[0])(x),
            jax.grad(lambda y: jax.checkpoint(lambda x: jnp.sin(x * y))(x).sum())(y),
        ]
        return ours, theirs

    ours, theirs = both(X, Y, XB)
    jax.tree_util.tree_map(lambda a, b: _close(a, b, 1e-10), ours, theirs)
    # functx.jit on either side, eagerly.
    _close(functx.jit(functx.grad(f))(X, Y), jax.grad(jf)(X, Y))
    _close(functx.grad(functx.jit(f))(X, Y), jax.grad(jf)(X, Y))


def test_checkpoint_saves_fewer_values_and_pytrees():
    def block(d):
        return {"out": fnp.sin(fnp.sin(fnp.sin(d["x"])))}

    plain = lambda x: block({"x": x})["out"].sum()  # noqa: E731
    ckpt = lambda x: functx.checkpoint(block)({"x": x})["out"].sum()  # noqa: E731
    torch_style = lambda x: functx.checkpoint(block, {"x": x}, use_reentrant=False)["out"].sum()  # noqa: E731
    counts, grads = [], []
    for fn in (plain, ckpt, torch_style):
        rec = Recorder()
        with saved_tensors_hooks(rec.pack, rec.unpack):
            _, vjp_fn = functx.vjp(fn, X)
        counts.append(len(rec.packed))
        grads.append(vjp_fn(jnp.ones(()))[0])
    # Three cosines without checkpoint; only the block's input x with it.
    assert counts == [3, 1, 1]
    assert all(v is X for v in rec.packed)
    want = jax.grad(lambda x: jnp.sin(jnp.sin(jnp.sin(x))).sum())(X)
    for g in grads:
        _close(g, want)


@pytest.mark.slow
def test_checkpoint_policy_decides_what_is_saved():
    """`policy=` as jax.checkpoint's: what the backward pass keeps follows
    the policy (counted with saved_tensors_hooks), the derivatives do not
    change (against JAX, under grad, vmap(grad) and hessian)."""
    from jax.ad_checkpoint import checkpoint_name

    cp = jax.checkpoint_policies
    w = jnp.arange(9.0).reshape(3, 3) / 10

    def block(x):
        a = checkpoint_name(fnp.sin(x) @ w, "a")
        return fnp.sin(a)

    def saved(policy):
        rec = Recorder()
        with saved_tensors_hooks(rec.pack, rec.unpack):
            _, vjp_fn = functx.vjp(lambda x: functx.checkpoint(block, policy=policy)(x).sum(), X)
        return len(rec.packed), vjp_fn(jnp.ones(()))[0]

    counts = {}
    want = jax.grad(lambda x: jnp.sin(jnp.sin(x) @ w).sum())(X)
    for name, policy in [("inputs", None), ("dots", cp.dots_saveable),
                         ("named", cp.save_only_these_names("a")),
                         ("all", cp.everything_saveable)]:
        counts[name], g = saved(policy)
        _close(g, want)
        jf = lambda x: jax.checkpoint(block, policy=policy)(x).sum()  # noqa: E731
        _close(functx.vmap(functx.grad(jf))(jnp.stack([X, -X])),
               jax.vmap(jax.grad(jf))(jnp.stack([X, -X])))
        _close(functx.hessian(jf)(X), jax.hessian(jf)(X))
    # The input alone; then also the product (dot or its name); then the
    # cosines the derivative needs as well.
    assert counts["inputs"] == 1
    assert counts["dots"] == counts["named"] == 2
    assert counts["all"] > counts["dots"]
    with pytest.raises(TypeError, match="policy"):
        functx.checkpoint(block, policy="dots")


def test_checkpoint_errors():
    with pytest.raises(TypeError, match="callable"):
        functx.checkpoint(3)
    with pytest.raises(ValueError, match="context_fn"):
        functx.checkpoint(_g, context_fn=lambda: None)


def test_checkpoint_recomputes_in_backward_under_jit():
    """Under jax.jit the backward pass recomputes the block (after an
    optimization barrier, so XLA cannot reuse the forward's values)."""
    block = lambda x: fnp.sin(fnp.sin(x))  # noqa: E731
    plain = str(jax.make_jaxpr(functx.grad(lambda x: block(x).sum()))(X))
    ckpt = str(jax.make_jaxpr(functx.grad(lambda x: functx.checkpoint(block)(x).sum()))(X))
    # The backward pass recomputes sin(x), which cos(sin(x)) needs, not the
    # outer sin, which nothing needs.
    assert (plain.count(" sin "), ckpt.count(" sin ")) == (2, 3)
    assert "optimization_barrier" in ckpt and "optimization_barrier" not in plain


@pytest.mark.slow
def test_save_on_cpu_leaves_values_of_outer_transforms_in_place():
    """Residuals that are functx values (of an enclosing transform) are
    jax.Array instances too; save_on_cpu must leave them alone."""
    import functx as fx
    from functx.autograd.graph import save_on_cpu

    def f(x):
        return jnp.sin(x) * x

    with save_on_cpu():
        got = fx.grad(fx.grad(f))(1.3)
    assert np.allclose(got, jax.grad(jax.grad(f))(1.3))
