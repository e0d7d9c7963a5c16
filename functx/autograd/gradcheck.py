"""gradcheck and gradgradcheck: torch.autograd's numerical gradient checks
for functx functions.

`gradcheck(func, inputs)` compares the derivatives functx computes for
`func` (reverse mode: functx.vjp; with `check_forward_ad`, forward mode:
functx.jvp) with central finite differences, `(f(x + eps) - f(x - eps)) /
(2 eps)` for each input element, as torch does. `func` may be any function
functx can differentiate: written with functx.numpy / functx.lax, lifted
JAX code, or functions with functx.custom_vjp / custom_jvp rules (the point
of the check: a wrong custom rule is reported).

Which values are checked: every floating-point array in `inputs` (torch
checks the tensors with requires_grad; functx has no such flag) and every
floating-point array that `func` returns. Other inputs (integer arrays,
Python numbers, anything else) are passed to `func` unchanged, other
outputs are ignored. Inputs should be float64 (a warning says so, as in
torch): finite differences in float32 are too coarse for the default
tolerances. Complex inputs and outputs are not supported (an error says
so).

The checks, in torch's order: the Jacobians (slow mode: every element;
`fast_mode=True`: the scalar `v^T J u` for random unit vectors u, v, with
`atol` scaled as torch does), the same for forward mode, batched forward
gradients (`check_batched_forward_grad`: functx.vmap of the jvp against the
unbatched jvps), batched gradients (`check_batched_grad`: the same for the
vjp), that the vjp of zero cotangents is zero, and (`check_undefined_grad`)
that symbolic-zero cotangents and tangents give zeros. Running the vjps
twice must give the same values up to `nondet_tol`.

The analytical side of a check is computed under one jax.jit (NOTE [one
compilation per check]); a function with Python control flow on its values
is checked eagerly instead, so anything functx can differentiate can be
checked. gradcheck itself needs concrete inputs: call it outside
transforms.

A failure raises `GradcheckError` (a RuntimeError) naming the output and
the input (their positions in `func`'s outputs and in `inputs`) and the
worst element: its index in the output and in the input, the numerical
and the analytical value; with `raise_exception=False` gradcheck returns
False instead.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ..core import Tracer, Zero, aval_of, is_complex_dtype, is_real_float_dtype
from ..errors import (
    ConcretizationError,
    FunctxError,
    FunctxRuntimeError,
    FunctxTypeError,
    FunctxValueError,
)
from ..transforms.grad import linearize_reverse, pull_back
from ..transforms.grad import vjp as _fx_vjp
from ..transforms.jvp import jvp as _fx_jvp
from ..transforms.vmap import vmap as _fx_vmap

__all__ = ["GradcheckError", "gradcheck", "gradgradcheck"]


class GradcheckError(FunctxRuntimeError):
    """Raised by gradcheck / gradgradcheck when a check fails (torch's
    `torch.autograd.gradcheck.GradcheckError`)."""


_SEED = 0  # random vectors come from a private generator, never a global one


def _as_tuple(x):
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def _is_float_array(x):
    return isinstance(x, (jax.Array, np.ndarray)) and is_real_float_dtype(x.dtype)


def _is_complex_array(x):
    return isinstance(x, (jax.Array, np.ndarray)) and is_complex_dtype(x.dtype)


class _Problem:
    """`func` seen as a function of its floating-point inputs (`checked`
    positions) to its floating-point outputs (`out_idx` positions)."""

    def __init__(self, func, inputs, name):
        self.func = func
        self.name = name
        converted = []
        checked = []
        for idx, x in enumerate(_as_tuple(inputs)):
            if isinstance(x, (Tracer, jax.core.Tracer)):
                raise FunctxTypeError(
                    f"{name}: input {idx} is a traced value ({type(x).__name__}); gradcheck "
                    "compares numbers, so call it outside transforms and jax.jit, on "
                    "concrete arrays."
                )
            if isinstance(x, np.ndarray):
                x = jnp.asarray(x)
            if _is_complex_array(x):
                raise FunctxValueError(
                    f"{name}: input {idx} is complex ({x.dtype}); functx's gradcheck only "
                    "checks real floating-point inputs. Split it into real and imaginary "
                    "parts."
                )
            if _is_float_array(x):
                checked.append(idx)
                if x.dtype != np.float64:
                    warnings.warn(
                        f"{name}: input {idx} is {x.dtype}, not float64. The check will "
                        "likely fail: finite differences need double precision (enable it "
                        "with jax.config.update('jax_enable_x64', True)).",
                        UserWarning,
                        stacklevel=3,
                    )
            converted.append(x)
        if not checked:
            raise FunctxValueError(
                f"{name}: expected at least one floating-point array among the inputs, "
                "found none. Pass the values to check as float64 arrays."
            )
        self.inputs = tuple(converted)
        self.checked = checked
        # The function is evaluated 2N + 1 times for N checked elements:
        # compiled once when it can be (NOTE [one compilation per check]).
        self._compiled = jax.jit(lambda *diff: tuple(_as_tuple(func(*self.full(diff)))))
        try:
            outs = self.call_diff(self.diff_inputs())
        except _CONCRETIZATION + (TypeError,):
            self._compiled = None
            outs = self.call_diff(self.diff_inputs())
        for o, x in enumerate(outs):
            if _is_complex_array(x):
                raise FunctxValueError(
                    f"{name}: output {o} is complex ({x.dtype}); functx's gradcheck only "
                    "checks real outputs. Return the real and imaginary parts separately."
                )
        self.all_outputs = outs
        self.out_idx = [o for o, x in enumerate(outs) if _is_float_array(x)]

    def diff_inputs(self):
        return [self.inputs[i] for i in self.checked]

    def full(self, diff):
        args = list(self.inputs)
        for i, d in zip(self.checked, diff):
            args[i] = d
        return args

    def call_diff(self, diff):
        """All outputs of `func`, with the checked inputs set to `diff`."""
        if self._compiled is not None:
            return self._compiled(*diff)
        return tuple(_as_tuple(self.func(*self.full(diff))))

    def fdiff(self, *diff):
        """The function differentiated: checked inputs -> float outputs."""
        out = _as_tuple(self.func(*self.full(diff)))
        return tuple(out[o] for o in self.out_idx)

    # ---------------------------------------------------------------- numbers

    def _perturbed(self, k, flat_delta, outputs):
        """Outputs (as float64 NumPy, flattened) with checked input k moved
        by +-delta; returns their central difference divided by 2."""
        x = np.array(self.inputs[self.checked[k]])
        res = []
        for sign in (-1.0, 1.0):
            moved = (x.reshape(-1) + sign * flat_delta.astype(x.dtype)).reshape(x.shape)
            diff = self.diff_inputs()
            diff[k] = jnp.asarray(moved, x.dtype)
            outs = self.call_diff(diff)
            res.append([np.asarray(outs[o], np.float64).reshape(-1) for o in outputs])
        return [(b - a) / 2.0 for a, b in zip(*res)]

    def numerical_jacobian(self, eps, outputs=None):
        """num[o][k]: d output o / d checked input k, (out size, in size)."""
        outputs = self.out_idx if outputs is None else outputs
        num = [[None] * len(self.checked) for _ in outputs]
        for k, i in enumerate(self.checked):
            n = int(np.size(self.inputs[i]))
            cols = []
            for e in range(n):
                delta = np.zeros(n)
                delta[e] = eps
                cols.append([c / eps for c in self._perturbed(k, delta, outputs)])
            for oi, o in enumerate(outputs):
                size = int(np.size(self.all_outputs[o]))
                num[oi][k] = (np.stack([c[oi] for c in cols], axis=1) if cols
                              else np.zeros((size, 0)))
        return num

    def numerical_ju(self, k, u, eps):
        """J u for checked input k along unit vector u (flat), per output."""
        return [c / eps for c in self._perturbed(k, eps * u, self.out_idx)]


def _unit_vector(rng, shape, dtype):
    """torch's random direction: uniform in [0, 1), normalised."""
    v = rng.random_sample(int(np.prod(shape, dtype=np.int64)))
    norm = np.linalg.norm(v)
    return (v / norm if norm > 0 else v).reshape(shape).astype(dtype)


_CONCRETIZATION = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    ConcretizationError,
)


# --------------------------------------------------------------------------
# The analytical side


class _Vectors:
    """The random vectors of the checks (a private NumPy generator with a
    fixed seed: the user's random state is never touched)."""

    def __init__(self, prob):
        rng = np.random.RandomState(_SEED)
        ins = [prob.inputs[i] for i in prob.checked]
        outs = [prob.all_outputs[o] for o in prob.out_idx]
        self.u = [_unit_vector(rng, np.shape(x), x.dtype) for x in ins]
        self.v = [_unit_vector(rng, np.shape(y), y.dtype) for y in outs]
        self.batched_cts = [rng.standard_normal((2,) + np.shape(y)).astype(y.dtype) for y in outs]
        self.batched_tans = [rng.standard_normal((2,) + np.shape(x)).astype(x.dtype) for x in ins]


def _one_at_a_time(avals, rows_for):
    """Stack, for each leaf q of `avals`, the rows `rows_for(o)` (a
    (n, *shape) array) in block o == q and zeros in the other blocks: the
    arguments of a batched call that treats one leaf at a time."""
    stacked = []
    for q, a in enumerate(avals):
        blocks = []
        for o in range(len(avals)):
            rows = rows_for(o)
            n = np.shape(rows)[0]
            blocks.append(jnp.asarray(rows, a.dtype) if o == q else jnp.zeros((n,) + a.shape, a.dtype))
        stacked.append(jnp.concatenate(blocks))
    return stacked


def _analytics(prob, want, vec, vectorized, errors, *diff):
    """Everything the requested checks need from functx's derivatives of
    `prob.fdiff` at `diff`, as a dict of arrays (NOTE [one compilation per
    check]).

    All the vjps a check needs (one per Jacobian row, the projections of
    fast mode, the zero cotangent) are pulled back through one recorded
    linearization, batched by JAX's own vmap, so the rows cost one copy of
    the backward pass and do not depend on functx's batching rules; the
    batched checks compare functx.vmap with that. Likewise for the jvps.
    `vectorized=False` (the eager fallback) loops instead. Failures of
    functx.vmap are put in `errors`, to be raised in torch's order."""
    res = {}
    in_avals = [aval_of(x) for x in diff]

    def batch(fn, stacked):
        if vectorized:
            return jax.vmap(fn)(*stacked)
        n = np.shape(stacked[0])[0]
        outs = [fn(*[s[j] for s in stacked]) for j in range(n)]
        return [jnp.stack([o[k] for o in outs]) for k in range(len(outs[0]))]

    def functx_batched(fn, stacked, what, flag):
        try:
            return _fx_vmap(fn)(*stacked)
        except (RuntimeError, FunctxError) as ex:
            errors[flag] = _batched_failure(prob, what, flag, ex)
            return None

    if want & {"rev", "fast_rev", "mul", "batched", "undef"}:
        r = linearize_reverse(prob.fdiff, tuple(diff), False, f"{prob.name}(func, inputs)")
        out_avals = r.out_avals

        def pull(*cts):
            return pull_back(r, list(cts))

        parts = []
        if "rev" in want:
            parts.append(_basis(out_avals)[0])
        if "fast_rev" in want:
            parts.append(_one_at_a_time(out_avals, lambda o: vec.v[o][None]))
        parts.append([jnp.zeros((1,) + a.shape, a.dtype) for a in out_avals])  # "mul"
        stacked = [jnp.concatenate(p) for p in zip(*parts)]
        res["rows"] = batch(pull, stacked)
        if "batched" in want:
            stacked = _one_at_a_time(out_avals, lambda o: vec.batched_cts[o])
            got = functx_batched(pull, stacked, "gradients", "check_batched_grad")
            if got is not None:
                res["batched"] = (got, batch(pull, stacked))
        if "undef" in want:
            # symbolic-zero (torch: undefined) output cotangents: all at
            # once, then one output at a time
            cases = [[Zero(a) for a in out_avals]]
            if len(out_avals) > 1:
                cases += [[Zero(a) if q == o else jnp.zeros(a.shape, a.dtype)
                           for q, a in enumerate(out_avals)] for o in range(len(out_avals))]
            try:
                res["undef"] = [[None if type(g) is Zero else g for g in r.linear.backward(cts)]
                                for cts in cases]
            except (RuntimeError, FunctxError) as ex:
                errors["check_undefined_grad"] = GradcheckError(
                    f"{prob.name}: the backward pass failed on symbolic-zero (undefined) "
                    f"output cotangents: {type(ex).__name__}: {ex}. Pass "
                    "check_undefined_grad=False to skip this check."
                )

    def push(*tangents):
        return list(_fx_jvp(prob.fdiff, tuple(diff), tuple(tangents))[1])

    if want & {"fwd", "fast_fwd", "undef_fwd", "batched_fwd"}:
        parts = []
        if "fwd" in want:
            parts.append(_basis(in_avals)[0])
        if "fast_fwd" in want:
            parts.append(_one_at_a_time(in_avals, lambda k: vec.u[k][None]))
        if "undef_fwd" in want:
            # row k: the random tangents, with an explicit zero for input k
            parts.append([jnp.stack([jnp.zeros(a.shape, a.dtype) if q == k
                                     else jnp.asarray(vec.u[q], a.dtype)
                                     for k in range(len(in_avals))])
                          for q, a in enumerate(in_avals)])
        if parts:
            res["cols"] = batch(push, [jnp.concatenate(p) for p in zip(*parts)])
        if "undef_fwd" in want:
            # ... against input k not differentiated at all (a symbolic zero)
            symbolic = []
            for k in range(len(diff)):
                def without_k(*rest, k=k):
                    full = list(rest)
                    full.insert(k, diff[k])
                    return prob.fdiff(*full)

                others = tuple(x for q, x in enumerate(diff) if q != k)
                ts = tuple(jnp.asarray(vec.u[q], a.dtype)
                           for q, a in enumerate(in_avals) if q != k)
                symbolic.append(list(_fx_jvp(without_k, others, ts)[1]))
            res["undef_fwd"] = symbolic
        if "batched_fwd" in want:
            stacked = _one_at_a_time(in_avals, lambda k: vec.batched_tans[k])
            got = functx_batched(push, stacked, "forward gradients", "check_batched_forward_grad")
            if got is not None:
                res["batched_fwd"] = (got, batch(push, stacked))
    return res


def _compute(prob, want, vec):
    """Run `_analytics` under one jax.jit, or eagerly when the function has
    Python control flow on its values.

    NOTE [one compilation per check]
    Eagerly, every functx primitive of a vjp / jvp is its own small XLA
    program, compiled the first time it meets new shapes, and a check needs
    many of them. So all the analytical values of one check come from a
    single jitted function: one compilation, in which each batch of vjps
    (or jvps) is one vmapped copy of the backward (or forward) pass.
    Running the compiled function a second time is the nondeterminism
    check. Returns `(results as NumPy, errors, rerun)`."""
    errors = {}
    diff = prob.diff_inputs()
    to_numpy = lambda tree: jax.tree_util.tree_map(np.asarray, tree)  # noqa: E731
    try:
        jitted = jax.jit(lambda *d: _analytics(prob, want, vec, True, errors, *d))
        res = jitted(*diff)
        return to_numpy(res), errors, lambda: to_numpy(jitted(*diff))
    except _CONCRETIZATION:
        errors.clear()

        def eager():
            return to_numpy(_analytics(prob, want, vec, False, errors, *diff))

        return eager(), errors, eager


def _basis(avals):
    from ..transforms.jacobians import _basis as basis

    return basis(avals)


class _Analytical:
    """The results of `_compute`, cut into per (output, input) pieces."""

    def __init__(self, prob, want, res):
        self.res = res
        out_sizes = [int(np.size(prob.all_outputs[o])) for o in prob.out_idx]
        in_sizes = [int(np.size(prob.inputs[i])) for i in prob.checked]
        self.n_out, self.n_in = len(out_sizes), len(in_sizes)
        if "rows" in res:
            rows = [r.reshape(r.shape[0], -1) for r in res["rows"]]  # per input
            start = 0
            if "rev" in want:
                offsets = np.cumsum([0] + out_sizes)
                self.rev = [[rows[k][offsets[o]:offsets[o + 1]] for k in range(self.n_in)]
                            for o in range(self.n_out)]
                start = offsets[-1]
            if "fast_rev" in want:
                self.fast_rev = [[rows[k][start + o] for k in range(self.n_in)]
                                 for o in range(self.n_out)]
                start += self.n_out
            self.mul = [r[-1] for r in res["rows"]]
        if "cols" in res:
            cols = [c.reshape(c.shape[0], -1) for c in res["cols"]]  # per output
            start = 0
            if "fwd" in want:
                offsets = np.cumsum([0] + in_sizes)
                self.fwd = [[cols[o][offsets[k]:offsets[k + 1]].T for k in range(self.n_in)]
                            for o in range(self.n_out)]
                start = offsets[-1]
            if "fast_fwd" in want:
                self.fast_fwd = [[cols[o][start + k] for k in range(self.n_in)]
                                 for o in range(self.n_out)]
                start += self.n_in
            if "undef_fwd" in want:
                self.undef_fwd = [[(cols[o][start + k], res["undef_fwd"][k][o])
                                   for o in range(self.n_out)] for k in range(self.n_in)]


# --------------------------------------------------------------------------
# Comparing and reporting


def _where(shape, flat):
    if not shape:
        return "[]"
    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]"


def _mismatch(a, n, rtol, atol):
    """Index (flat) of the worst violation of |a - n| <= atol + rtol |n|,
    or None when allclose holds (NaN is a violation)."""
    a = np.asarray(a, np.float64)
    n = np.asarray(n, np.float64)
    if a.shape != n.shape:
        return 0
    excess = np.abs(a - n) - (atol + rtol * np.abs(n))
    excess = np.where(np.isnan(excess), np.inf, excess)
    if excess.size == 0 or np.all(excess <= 0):
        return None
    return int(np.argmax(excess))


def _report(prob, o, k, a, n, rtol, atol, worst, mode=""):
    """The failure message for output o / checked input k (2-d Jacobians
    (out size, in size)), naming the worst element."""
    out_shape = np.shape(prob.all_outputs[prob.out_idx[o]])
    in_shape = np.shape(prob.inputs[prob.checked[k]])
    a = np.asarray(a, np.float64)
    n = np.asarray(n, np.float64)
    r, c = np.unravel_index(worst, a.shape)
    av, nv = float(a[r, c]), float(n[r, c])
    return (
        f"{prob.name}: Jacobian {mode}mismatch for output {prob.out_idx[o]} with respect to "
        f"input {prob.checked[k]}.\nWorst element: d output{_where(out_shape, r)} / "
        f"d input{_where(in_shape, c)}: numerical {nv!r}, analytical {av!r} "
        f"(|difference| {abs(av - nv):.3g}, allowed {atol + rtol * abs(nv):.3g} with "
        f"atol={atol}, rtol={rtol}).\nnumerical:\n{n}\nanalytical:\n{a}\n"
    )


def _check_nondet(prob, first, second, nondet_tol):
    """Two runs of the same vjps must agree to `nondet_tol` (plus a few
    ulps: eagerly, functx's caches may run a repeated vjp as one compiled
    program, which can round differently)."""
    for k, (a, b) in enumerate(zip(first["rows"], second["rows"])):
        if not a.size:
            continue
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        # (jax.dtypes.finfo knows bfloat16 and float8; NumPy's does not)
        ulps = 8 * jax.dtypes.finfo(a.dtype).eps * np.max(np.abs(a64))
        diff = np.max(np.abs(a64 - b64))
        if not diff <= nondet_tol + ulps:
            raise GradcheckError(
                f"{prob.name}: backward is not reentrant: running the vjps of input "
                f"{prob.checked[k]} twice with the same cotangents gave values differing by "
                f"{diff:.3g}, more than nondet_tol={nondet_tol}."
            )


def _batched_failure(prob, what, flag, ex):
    return GradcheckError(
        f"{prob.name}: while computing batched {what} with functx.vmap, got: "
        f"{type(ex).__name__}: {ex}\nA derivative rule probably lacks a batching rule; "
        f"pass {flag}=False to skip this check."
    )


def _compare_batched(prob, pair, forward):
    """functx.vmap's results against JAX's vmap (or a loop): blocks of two
    rows per output (reverse) or per input (forward)."""
    got, want = pair
    what = "forward gradient" if forward else "gradient"
    for outer, (g_all, w_all) in enumerate(zip(got, want)):
        g_all = np.asarray(g_all, np.float64)
        w_all = np.asarray(w_all, np.float64)
        for inner in range(g_all.shape[0] // 2):
            g, w = g_all[2 * inner:2 * inner + 2], w_all[2 * inner:2 * inner + 2]
            o, k = (outer, inner) if forward else (inner, outer)
            if not np.allclose(g, w, rtol=1e-5, atol=1e-8):
                raise GradcheckError(
                    f"{prob.name}: batched {what} for output {prob.out_idx[o]} with respect "
                    f"to input {prob.checked[k]} differs from the unbatched one (functx.vmap "
                    f"over two random vectors).\nbatched:\n{g}\nexpected:\n{w}\n"
                )


# --------------------------------------------------------------------------
# The checks


def _check_no_differentiable_outputs(prob, eps):
    arrays = [o for o, x in enumerate(prob.all_outputs) if isinstance(x, (jax.Array, np.ndarray))]
    for row in prob.numerical_jacobian(eps, arrays):
        for j in row:
            if np.any(j != 0):
                raise GradcheckError(
                    f"{prob.name}: the function has no floating-point outputs, so its "
                    "numerical gradient was expected to be zero, but it is not."
                )


def _jacobian_check(prob, ana, eps, rtol, atol, forward):
    """ana[o][k] against the numerical Jacobian, element by element."""
    num = prob.numerical_jacobian(eps)
    mode = "computed with forward mode " if forward else ""
    for o in range(len(prob.out_idx)):
        for k in range(len(prob.checked)):
            worst = _mismatch(ana[o][k], num[o][k], rtol, atol)
            if worst is not None:
                raise GradcheckError(_report(prob, o, k, ana[o][k], num[o][k], rtol, atol,
                                             worst, mode))


def _fast_check(prob, ana, vec, eps, rtol, atol, forward):
    """torch's fast mode: compare v^T (J u) (numerical J u) with (v^T J) u
    or, in forward mode, J u with the jvp along u; atol is scaled by
    sum(u) sum(v) as in torch."""
    for k, u in enumerate(vec.u):
        u = np.asarray(u, np.float64).reshape(-1)
        num_ju = prob.numerical_ju(k, u, eps)
        for o in range(len(prob.out_idx)):
            if forward:
                a = np.asarray(ana.fast_fwd[o][k], np.float64).reshape(1, -1)
                n = num_ju[o].reshape(1, -1)
                tol = atol * float(u.sum())
            else:
                v = np.asarray(vec.v[o], np.float64).reshape(-1)
                a = np.array([[np.asarray(ana.fast_rev[o][k], np.float64) @ u]])
                n = np.array([[v @ num_ju[o]]])
                tol = atol * float(u.sum()) * float(v.sum())
            if _mismatch(a, n, rtol, tol) is not None:
                _fast_failure(prob, vec, o, k, a, n, eps, rtol, atol, tol, forward)


def _fast_failure(prob, vec, o, k, ana, num, eps, rtol, atol, tol, forward):
    """Report a fast-mode failure with the slow-mode Jacobians of that
    output / input pair (and their worst element), as torch does."""
    what = "J u" if forward else "v^T J u"
    head = (
        f"{prob.name} (fast_mode): {what} mismatch for output {prob.out_idx[o]} with "
        f"respect to input {prob.checked[k]}: numerical {num.ravel()}, analytical "
        f"{ana.ravel()} (allowed difference {tol:.3g}).\n"
    )
    num_full = prob.numerical_jacobian(eps, [prob.out_idx[o]])[0][k]
    want = {"fwd"} if forward else {"rev"}
    slow = _Analytical(prob, want, _compute(prob, want, vec)[0])
    ana_full = (slow.fwd if forward else slow.rev)[o][k]
    worst = _mismatch(ana_full, num_full, rtol, atol)
    if worst is None:
        raise GradcheckError(
            head + "Recomputed in slow mode, the Jacobians match element-wise: the check "
            "might pass with fast_mode=False.\n"
            f"numerical:\n{num_full}\nanalytical:\n{ana_full}\n"
        )
    raise GradcheckError(head + "Recomputed in slow mode:\n" +
                         _report(prob, o, k, ana_full, num_full, rtol, atol, worst,
                                 "computed with forward mode " if forward else ""))


def _gradcheck(func, inputs, eps, atol, rtol, nondet_tol, check_undefined_grad,
               check_grad_dtypes, check_batched_grad, check_batched_forward_grad,
               check_forward_ad, check_backward_ad, fast_mode, name):
    prob = _Problem(func, inputs, name)
    if not prob.out_idx:
        _check_no_differentiable_outputs(prob, eps)
        return True
    want = set()
    if check_backward_ad:
        want |= {"fast_rev" if fast_mode else "rev", "mul"}
        if check_batched_grad:
            want.add("batched")
        if check_undefined_grad:
            want.add("undef")
    if check_forward_ad:
        want.add("fast_fwd" if fast_mode else "fwd")
        if check_undefined_grad:
            want.add("undef_fwd")
    if check_batched_forward_grad:
        want.add("batched_fwd")
    vec = _Vectors(prob)
    res, errors, rerun = _compute(prob, want, vec)
    ana = _Analytical(prob, want, res)

    # torch's order: reverse Jacobian, forward Jacobian (and undefined
    # tangents), batched forward, batched reverse, zero cotangents,
    # undefined cotangents
    if check_backward_ad:
        for k, rows in enumerate(res["rows"]):
            dtype = prob.inputs[prob.checked[k]].dtype
            if check_grad_dtypes and rows.dtype != dtype:
                raise GradcheckError(
                    f"{prob.name}: gradient has dtype mismatch for input {prob.checked[k]}: "
                    f"{rows.dtype} for an input of dtype {dtype}."
                )
        _check_nondet(prob, res, rerun(), nondet_tol)
        if fast_mode:
            _fast_check(prob, ana, vec, eps, rtol, atol, forward=False)
        else:
            _jacobian_check(prob, ana.rev, eps, rtol, atol, forward=False)
    if check_forward_ad:
        if check_grad_dtypes:
            for o, cols in enumerate(res["cols"]):
                if cols.dtype != prob.all_outputs[prob.out_idx[o]].dtype:
                    raise GradcheckError(f"{prob.name}: forward AD gradient has dtype mismatch.")
        if fast_mode:
            _fast_check(prob, ana, vec, eps, rtol, atol, forward=True)
        else:
            _jacobian_check(prob, ana.fwd, eps, rtol, atol, forward=True)
        if check_undefined_grad:
            for k, per_output in enumerate(ana.undef_fwd):
                for o, (with_zero, symbolic) in enumerate(per_output):
                    if not np.allclose(with_zero.reshape(-1), np.asarray(symbolic).reshape(-1)):
                        raise GradcheckError(
                            f"{prob.name}: mismatch in tangent values for output "
                            f"{prob.out_idx[o]} when input {prob.checked[k]} has an undefined "
                            "(symbolic zero) tangent instead of a zero array."
                        )
    if check_batched_forward_grad:
        if "check_batched_forward_grad" in errors:
            raise errors["check_batched_forward_grad"]
        _compare_batched(prob, res["batched_fwd"], forward=True)
    if not check_backward_ad:
        return True
    if check_batched_grad:
        if "check_batched_grad" in errors:
            raise errors["check_batched_grad"]
        _compare_batched(prob, res["batched"], forward=False)
    for k, g in enumerate(ana.mul):
        i = prob.checked[k]
        if not np.all(g == 0):
            raise GradcheckError(
                f"{prob.name}: backward not multiplied by grad_output: the vjp with zero "
                f"cotangents gave a nonzero gradient for input {i}."
            )
    if check_undefined_grad:
        if "check_undefined_grad" in errors:
            raise errors["check_undefined_grad"]
        for grads in res["undef"]:
            for k, g in enumerate(grads):
                if g is not None and not np.all(g == 0):
                    raise GradcheckError(
                        f"{prob.name}: expected all input gradients to be zero when the "
                        "output cotangents are zero or undefined, got a nonzero one for "
                        f"input {prob.checked[k]}."
                    )
    return True


def gradcheck(func, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True,
              nondet_tol=0.0, check_undefined_grad=True, check_grad_dtypes=False,
              check_batched_grad=False, check_batched_forward_grad=False,
              check_forward_ad=False, check_backward_ad=True, fast_mode=False, masked=None):
    """Check functx's derivatives of `func` against central finite
    differences (torch's `torch.autograd.gradcheck`).

    Args:
      func (Callable): a function of arrays returning an array or a tuple of
        arrays.
      inputs (jax.Array | tuple): an array or a tuple of values; its
        floating-point arrays (float64 expected) are checked, the rest passed
        through.
      eps (float): the finite-difference step.
      atol (float): the absolute tolerance: |analytical - numerical| <=
        atol + rtol |numerical| element-wise.
      rtol (float): the relative tolerance, in the same test as `atol`.
      raise_exception (bool): raise GradcheckError on failure (else return
        False).
      nondet_tol (float): how much two runs of the same vjp may differ.
      check_undefined_grad (bool): check that symbolic-zero cotangents (and,
        with check_forward_ad, tangents) give zero derivatives.
      check_grad_dtypes (bool): check that the gradients have the inputs'
        dtypes.
      check_batched_grad (bool): check functx.vmap of the vjp against a loop.
      check_batched_forward_grad (bool): same for the jvp (needs
        check_forward_ad).
      check_forward_ad (bool): also check forward mode (functx.jvp).
      check_backward_ad (bool): check reverse mode (functx.vjp).
      fast_mode (bool): compare `v^T J u` for random unit u, v instead of every
        element.
      masked (bool | None): accepted for torch compatibility (functx has no
        sparse arrays).

    Returns:
      bool: True when every check passes (False on failure with
      raise_exception=False).

    Example:
      >>> autograd.gradcheck(lambda x: fnp.sin(x) * x, (jnp.arange(3.0),))
      True
    """
    if not (check_forward_ad or check_backward_ad):
        raise FunctxValueError("gradcheck: check_forward_ad or check_backward_ad must be True.")
    if check_batched_grad and not check_backward_ad:
        raise FunctxValueError("gradcheck: check_batched_grad=True requires check_backward_ad=True.")
    if check_batched_forward_grad and not check_forward_ad:
        raise FunctxValueError(
            "gradcheck: check_batched_forward_grad=True requires check_forward_ad=True.")
    if not callable(func):
        raise FunctxTypeError(f"gradcheck(func, inputs): func must be callable, got "
                              f"{type(func).__name__}.")
    try:
        return _gradcheck(func, inputs, eps, atol, rtol, nondet_tol, check_undefined_grad,
                          check_grad_dtypes, check_batched_grad, check_batched_forward_grad,
                          check_forward_ad, check_backward_ad, fast_mode, "gradcheck")
    except GradcheckError:
        if raise_exception:
            raise
        return False


def gradgradcheck(func, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3,
                  gen_non_contig_grad_outputs=False, raise_exception=True, nondet_tol=0.0,
                  check_undefined_grad=True, check_grad_dtypes=False, check_batched_grad=False,
                  check_fwd_over_rev=False, check_rev_over_rev=True, fast_mode=False,
                  masked=False):
    """Check second derivatives (torch's `torch.autograd.gradgradcheck`):
    gradcheck of `(inputs, grad_outputs) -> vjp(func, inputs)(grad_outputs)`.

    Args:
      func (Callable): as for `gradcheck`.
      inputs (jax.Array | tuple): as for `gradcheck`.
      eps (float): as for `gradcheck`.
      atol (float): as for `gradcheck`.
      rtol (float): as for `gradcheck`.
      raise_exception (bool): as for `gradcheck`.
      nondet_tol (float): as for `gradcheck`.
      check_undefined_grad (bool): as for `gradcheck`.
      check_grad_dtypes (bool): as for `gradcheck`.
      check_batched_grad (bool): as for `gradcheck`.
      fast_mode (bool): as for `gradcheck`.
      masked (bool): as for `gradcheck`.
      grad_outputs (jax.Array | tuple | None): the output cotangents (an array
        or a tuple, one per floating-point output); default: random in [-1, 1]
        from a fixed private seed. They are checked too.
      gen_non_contig_grad_outputs (bool): accepted for torch compatibility (JAX
        arrays have no strides).
      check_fwd_over_rev (bool): check forward mode over the vjp.
      check_rev_over_rev (bool): check reverse mode over the vjp.

    Returns:
      bool: True when every check passes (False on failure with
      raise_exception=False).

    Example:
      >>> autograd.gradgradcheck(lambda x: (x ** 3).sum(), (x,))
      True
    """
    if not (check_fwd_over_rev or check_rev_over_rev):
        raise FunctxValueError(
            "gradgradcheck: check_fwd_over_rev or check_rev_over_rev must be True.")
    if check_undefined_grad and not check_rev_over_rev:
        raise FunctxValueError(
            "gradgradcheck: check_undefined_grad=True requires check_rev_over_rev=True.")
    if check_batched_grad and not check_rev_over_rev:
        raise FunctxValueError(
            "gradgradcheck: check_batched_grad=True requires check_rev_over_rev=True.")
    try:
        prob = _Problem(func, inputs, "gradgradcheck")
        if grad_outputs is None:
            rng = np.random.RandomState(_SEED + 4)
            grad_outputs = tuple(
                jnp.asarray(rng.uniform(-1.0, 1.0, np.shape(prob.all_outputs[o])),
                            prob.all_outputs[o].dtype)
                for o in prob.out_idx)
        else:
            grad_outputs = tuple(jnp.asarray(g) for g in _as_tuple(grad_outputs))
        if len(grad_outputs) != len(prob.out_idx):
            raise FunctxValueError(
                f"gradgradcheck: got {len(grad_outputs)} grad_outputs for "
                f"{len(prob.out_idx)} floating-point outputs. Pass one per output.")
        n_in = len(prob.inputs)

        def new_func(*args):
            ins, gos = args[:n_in], args[n_in:]
            first = _Problem.__new__(_Problem)
            first.func, first.inputs, first.checked = func, ins, prob.checked
            first.out_idx = prob.out_idx
            _, pull = _fx_vjp(first.fdiff, *[ins[i] for i in prob.checked])
            return pull(tuple(gos))

        return _gradcheck(new_func, prob.inputs + grad_outputs, eps, atol, rtol, nondet_tol,
                          check_undefined_grad, check_grad_dtypes, check_batched_grad, False,
                          check_fwd_over_rev, check_rev_over_rev, fast_mode, "gradgradcheck")
    except GradcheckError:
        if raise_exception:
            raise
        return False
