"""Weak types of results, as JAX's (issue 15 item 8).

JAX marks a Python scalar's value "weakly typed": `grad(f)(0.7)` is a weak
float, which adopts the dtype of the array it meets (added to a float16
array it stays float16). functx keeps the flag where JAX does; NOTE [weak
types in rules] (functx/primitives/common.py) says how the rules do it and
NOTE [weak types of results] (functx/transforms/_args.py) how the
transforms do. Three sweeps, all against JAX on the same functions:

1. shape rules: every equation of the jaxprs of the records (plus
   EXTRA_PRIMITIVES), traced with weakly / strongly typed arguments:
   functx's shape rule of the equation's primitive gives JAX's abstract
   evaluation (shape, dtype, weak type). A staged graph then has the avals
   its values will have.
2. transforms: the records (the op tables' generators) at weakly typed
   arguments -- scalars (what a Python float is) for every record that
   accepts them, weak arrays for the others, and for records of several
   arguments also the first weak and the others strong -- through
   functx.jvp (primal and tangent), functx.vjp, functx.vmap (but of unary
   elementwise records) and, for scalar-valued ones, functx.grad: the dtype
   and weak type of every result leaf against JAX's. Traced abstractly
   (jax.eval_shape): nothing is compiled.
3. eager: the functions the issue reported, at a Python float (concrete
   values take other code paths than tracers).

The records: every record of tests/op_table.py (one per primitive), the
records of tests/op_table_public.py named in PUBLIC and EXTRA_RECORDS;
FUNCTX_FULL_SWEEP=1: every record. About 10 s in all (nothing is compiled
but the eager test's programs).

Mismatches kept on purpose are declared in KNOWN_DIFFERENCES (JAX's own
inconsistencies, with the reason functx does not copy them); mismatches
caused by functx code outside the primitives are in XFAIL, naming the
place. Both are strict: an entry that stops mismatching fails the test.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax, tree_util
from jax.extend import core as jex

import functx as fx
import op_table
import op_table_public
import sweep
from functx.core import FROM_JAX, Aval
from functx.interpreters.staging import shape_rules
from functx.lifting import LIFT_RULES

NB = 3  # batch size of the vmap checks


def weak(x):
    """`x` as a weakly typed JAX array (what a Python scalar becomes)."""
    x = jnp.asarray(x)
    return lax.convert_element_type_p.bind(x, new_dtype=x.dtype, weak_type=True, sharding=None)


def spec(shape, dtype, weak_type):
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak_type)


def types(tree):
    """(dtype, weak type) of every leaf."""
    def one(x):
        aval = getattr(x, "aval", None)
        return (str(np.dtype(x.dtype)), bool(getattr(aval, "weak_type", False)))

    return tree_util.tree_map(one, tree)


# --------------------------------------------------------------------------
# The records

# The public records of the default sweep: functions built from several
# primitives (the jnp.tanh, jnp.square, jnp.sqrt, jnp.abs,
# jnp.maximum, jnp.minimum and jnp.dot are one primitive each, swept in
# tests/op_table.py's records; jnp.clip, jnp.where and the jax.nn ones are
# here), across the namespaces.
PUBLIC = {
    "jnp.clip", "jnp.where", "jnp.select", "jnp.einsum", "jnp.hypot", "jnp.logaddexp",
    "jnp.remainder", "jnp.mean", "jnp.var", "jnp.diff", "jnp.pad", "jnp.diag", "jnp.insert",
    "jnp.take",
    "nn.sigmoid", "nn.relu", "nn.softplus", "nn.gelu", "nn.silu", "nn.elu", "nn.log_sigmoid",
    "nn.mish", "nn.softmax", "nn.logsumexp",
    "special.xlogy", "special.kl_div", "special.rel_entr", "special.polygamma", "special.boxcox",
    "linalg.det", "linalg.eigh", "linalg.svd", "linalg.cholesky", "linalg.solve",
}
assert PUBLIC <= {o.name for o in op_table_public.OPS}, PUBLIC - {o.name for o in op_table_public.OPS}


def _scan_with_constant_carry(x):
    def body(c, _):
        a, b = c
        return (a * b + 1.0, a), b
    return lax.scan(body, (x, lax.stop_gradient(x)), None, length=3)


# Records for rules the tables reach only at strongly typed values: a
# constant branch or carry (a symbolic zero tangent, instantiated), a
# product in another dtype (preferred_element_type).
U, S = op_table.U, op_table.S
EXTRA_RECORDS = [
    op_table.Op("weak.select_constant", lambda x: lax.select(x > 0.0, x, lax.full_like(x, 0.5)),
                [U(S)]),
    op_table.Op("weak.cond_constant", lambda x: lax.cond(
        x.sum() > 0.0, lambda v: v * 2.0, lax.stop_gradient, x), [U(S)]),
    op_table.Op("weak.scan_constant_carry", _scan_with_constant_carry, [U(())]),
    op_table.Op("weak.while_constant_carry", lambda x: lax.fori_loop(
        0, 3, lambda i, c: (c[0] * c[1], c[0]), (x, lax.stop_gradient(x)))[0], [U(())]),
    op_table.Op("weak.dot_preferred_f32", lambda x, y: lax.dot_general(
        x, y, (((1,), (0,)), ((), ())), preferred_element_type=np.float32), [U(S), U((3, 2))],
        batch=False),
]


def _records():
    public = [o for o in op_table_public.OPS if sweep.FULL or o.name in PUBLIC]
    return list(op_table.OPS) + public + EXTRA_RECORDS


# --------------------------------------------------------------------------
# Mismatches kept on purpose and known gaps (strict: each must mismatch)

# JAX's `lax._const(x, c)` is a Python scalar (weak) when x is a weakly
# typed *scalar*, but a strongly typed NumPy constant when x is a weakly
# typed *array*, while its `full_like(x, c)` keeps x's weak type whatever
# its shape; its rules use one or the other as it happened. functx follows
# JAX where the value is always an array (the transposes of slice and pad
# are strong, as JAX's), and otherwise gives its constants the weak type of
# the value they stand beside (scalar_like, full_like): the same as JAX at
# Python floats, which are scalars. The rest differs, on weak arrays only
# (a weak scalar broadcast inside a program):
# * elementwise rules JAX writes with `_const` (sqrt, rsqrt, cbrt, tan,
#   asin, erf, ...; test_const_at_weak_arrays): JAX's derivative is strong;
# * JAX differentiates reduce_prod and the cumulative reductions through
#   constants made by `_const` (an associative scan, for the cumulative
#   ones): even the primal output of its jvp is strong, where the
#   function's own output is weak. functx's jvp does not change the primal.
# Checked: with `_const` keeping a weak array's weak type, JAX agrees with
# functx on every CONST entry below.
CONST = ("JAX's `_const` is strongly typed for a weak array (weak for a weak scalar), "
         "functx's constants keep the weak type")
# JAX's jvp of a jax.jit-wrapped function (jnp.where, jnp.abs, jnp.real,
# jnp.linalg.*, ...) traces the tangents with their primals' weak types,
# whatever the tangents' own: a strong tangent of a weak primal comes out of
# the jit weak. functx inlines such jits and follows the values.
JIT_JVP = ("JAX's jvp of a jit-wrapped function (here jnp.where's, jnp.abs's) gives "
           "tangents their primal's weak type; functx follows the tangent's own")

# JAX's sum of two tangents or cotangents (add_jaxvals) has, when JAX traces
# it, the weak type of its first operand (its abstract evaluation returns
# that operand's type); when it runs, lax.add's (weak where both are). So
# whether JAX's sum of a weak and a strong contribution is weak depends on
# their order, and on whether JAX traces. functx's add_any evaluates as
# lax.add and says so in its shape rule. Checked: with add_jaxvals'
# abstract evaluation made lax.add's, JAX agrees with functx on every
# ADD_ANY entry below.
ADD_ANY = ("JAX's traced sum of tangent contributions takes its first operand's weak type; "
           "functx's add_any is lax.add's (weak where both are)")

KNOWN_DIFFERENCES = {
    # (record, variant, transform) -> reason (variants: see _specs)
    ("reduce_prod", "arrays", "jvp"): CONST,
    ("cumprod", "arrays", "jvp"): CONST,
    ("cumprod_reverse", "arrays", "jvp"): CONST,
    ("cummax", "arrays", "jvp"): CONST,
    ("cummin", "arrays", "jvp"): CONST,
    ("cumlogsumexp", "arrays", "jvp"): CONST,
    ("rem", "scalars mixed", "jvp"): ADD_ANY,
    ("linalg.eigh", "arrays", "vjp"): ADD_ANY,
    ("linalg.svd", "arrays", "vjp"): ADD_ANY,
    ("jnp.pad_reflect", "arrays", "vjp"): ADD_ANY,  # (FUNCTX_FULL_SWEEP=1 records from here)
    ("jnp.pad_wrap", "arrays", "vjp"): ADD_ANY,
    ("jnp.polydiv", "arrays", "vjp"): ADD_ANY,
    ("linalg.lstsq", "arrays", "vjp"): ADD_ANY,
    ("linalg.eigh", "arrays", "jvp"): JIT_JVP,
    ("linalg.svd", "arrays", "jvp"): JIT_JVP,
    ("linalg.eigvals", "arrays", "jvp"): JIT_JVP,  # (FUNCTX_FULL_SWEEP=1)
}
_JAX_VERSION = tuple(int(p) for p in re.findall(r"\d+", jax.__version__)[:3])
if _JAX_VERSION < (0, 12, 1):
    # (from jax 0.12.1, JAX's slice and pad transposes keep the weak type)
    KNOWN_DIFFERENCES[("cumlogsumexp", "arrays", "vjp")] = CONST
else:
    # (from jax 0.12.1, the only strong contribution is added second)
    KNOWN_DIFFERENCES[("complex_holomorphic", "arrays", "vjp")] = ADD_ANY
    KNOWN_DIFFERENCES[("complex_mixed", "arrays", "vjp")] = ADD_ANY
if _JAX_VERSION < (0, 12):
    # (jax 0.12 computes these two without jnp.where: no difference there)
    KNOWN_DIFFERENCES[("special.kl_div", "scalars", "jvp")] = JIT_JVP
    KNOWN_DIFFERENCES[("special.rel_entr", "scalars", "jvp")] = JIT_JVP

# Shape rules that differ from JAX's abstract evaluation on purpose:
# primitive -> reason. Checked: each does differ on the records.
SHAPE_DIFFERENCES = {"add_any": ADD_ANY}

# functx code outside functx/primitives that lost the flag: (record, variant,
# transform) -> where. (Empty: lifting's literals, custom_jvp's zero tangents
# and scatter's zeros and masks keep JAX's weak types now.)
XFAIL = {}


# --------------------------------------------------------------------------
# 1. Shape rules against JAX's abstract evaluation

# Primitives no op-table record emits, as extra records: name -> (fn, the
# argument shapes; float64, int32 for reduce_xor)
EXTRA_PRIMITIVES = {
    "add_any": (lambda x, y: jax._src.ad_util.add_jaxvals(x, y), [(3,), (3,)]),
    "igamma_grad_a": (lambda a, x: lax.igamma_grad_a(a, x), [(3,), (3,)]),
    "reduce_xor": (lambda x: lax.reduce_xor(x, (0,)), None),
    "select_and_gather_add": (
        lambda t, x: jax._src.lax.windowed_reductions._select_and_gather_add(
            t, x, lax.ge_p, (2,), (1,), ((0, 0),), (1,), (1,)), [(4,), (4,)]),
    "optimization_barrier": (lambda x, y: lax.optimization_barrier((x, y)), [(3,), ()]),
}


def _walk(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else [p]:
                if isinstance(sub, jex.ClosedJaxpr):
                    yield from _walk(sub.jaxpr)
                elif isinstance(sub, jex.Jaxpr):
                    yield from _walk(sub)


def _aval(v):
    a = v.aval
    return Aval(tuple(a.shape), a.dtype, bool(getattr(a, "weak_type", False)))


def _weak_combos(n):
    """Weak flags per argument: all weak, all strong, and each argument
    alone strong (weak types combine by "all operands weak")."""
    combos = [(True,) * n, (False,) * n]
    if n > 1:
        combos += [tuple(j != i for j in range(n)) for i in range(n)]
    return combos


def _shape_rule_mismatches(fn, arg_specs, seen):
    """Equations of `fn`'s jaxpr at `arg_specs` whose functx shape rule
    disagrees with JAX (deduplicated through `seen`)."""
    out = []
    jaxpr = jax.make_jaxpr(fn)(*arg_specs).jaxpr
    for eqn in _walk(jaxpr):
        prim = FROM_JAX.get(eqn.primitive)
        if prim is None or eqn.primitive.name in LIFT_RULES or prim not in shape_rules:
            continue
        ins = [_aval(v) for v in eqn.invars]
        key = (prim.name, tuple(ins), tuple(sorted(map(str, eqn.params.items()))))
        if key in seen:
            continue
        seen.add(key)
        got = shape_rules[prim](*ins, **eqn.params)
        got = got if prim.multiple_results else [got]
        want = [_aval(v) for v in eqn.outvars]
        if [(g.shape, g.dtype, g.weak_type) for g in got] != [
                (w.shape, w.dtype, w.weak_type) for w in want]:
            out.append((prim.name, f"{prim.name}{ins}: functx {got}, JAX {want}"))
    return out


@pytest.mark.slow
def test_shape_rules_match_jax():
    """NOTE [weak types in rules]: every shape rule computes JAX's weak
    type (and dtype, shape) for the equations of the op tables."""
    seen, bad, checked = set(), [], set()
    cases = []
    # the primitive records (the public ones add no primitive but with FULL)
    for o in (_records() if sweep.FULL else list(op_table.OPS) + EXTRA_RECORDS):
        rng = np.random.default_rng(0)
        args = [np.asarray(g(rng)) for g in o.gens]
        numeric = [i for i, a in enumerate(args) if a.dtype.kind in "fiu"]
        for combo in _weak_combos(len(numeric)):
            specs = [spec(a.shape, a.dtype, False) for a in args]
            for i, w in zip(numeric, combo):
                specs[i] = spec(args[i].shape, args[i].dtype, w)
            cases.append((o.name, o.fn, specs))
    for name, (fn, shapes) in EXTRA_PRIMITIVES.items():
        shapes = shapes or [(3,)]
        dtype = np.int32 if name == "reduce_xor" else np.float64
        for combo in _weak_combos(len(shapes)):
            cases.append((name, fn, [spec(s, dtype, w) for s, w in zip(shapes, combo)]))
    differing = set()
    for name, fn, specs in cases:
        try:
            found = _shape_rule_mismatches(fn, specs, seen)
        except Exception:  # noqa: BLE001 - JAX cannot trace this combination
            continue
        checked.add(name)
        for prim, message in found:
            if prim in SHAPE_DIFFERENCES:
                differing.add(prim)
            else:
                bad.append(f"{name}: {message}")
    assert not bad, "\n".join(bad)
    missing = set(EXTRA_PRIMITIVES) - checked
    assert not missing, f"extra primitive records that did not trace: {missing}"
    assert differing == set(SHAPE_DIFFERENCES), (
        f"SHAPE_DIFFERENCES entries that agree with JAX now: {set(SHAPE_DIFFERENCES) - differing}")


# --------------------------------------------------------------------------
# 2. Transforms at weakly typed arguments




def _cases():
    """(record, mixed): every differentiable record at weakly typed
    arguments, and for records of several differentiable arguments also
    "mixed": only the first weak."""
    out = []
    for o in _records():
        if o.nondiff or (getattr(o, "heavy", False) and not sweep.FULL):
            continue
        args, diff = _args_diff(o)
        if not diff or not all(args[i].dtype.kind == "f" for i in diff):
            continue
        out.append((o, False))
        if len(diff) > 1:
            out.append((o, True))
    return out


def _args_diff(o):
    rng = np.random.default_rng(0)
    args = [np.asarray(g(rng)) for g in o.gens]
    return args, list(sweep.diff_indices(o, args))


def _specs(o, mixed):
    """The argument specs, the output's and the variant: "scalars" (weak
    scalars, as Python floats) where the record accepts scalars, else
    "arrays" (weak arrays); " mixed": only the first differentiable
    argument weak."""
    args, diff = _args_diff(o)
    flags = [(not mixed) or k == 0 for k in range(len(diff))]
    weak_flags = [i in diff and flags[diff.index(i)] for i in range(len(args))]
    if _NEEDS_ARRAYS.get(o.name) is not True:
        specs = [spec((), a.dtype, w) for a, w in zip(args, weak_flags)]
        try:
            return specs, jax.eval_shape(o.fn, *specs), diff, "scalars" + (" mixed" * mixed)
        except Exception:  # noqa: BLE001 - the record needs arrays
            _NEEDS_ARRAYS[o.name] = True
    specs = [spec(a.shape, a.dtype, w) for a, w in zip(args, weak_flags)]
    return specs, jax.eval_shape(o.fn, *specs), diff, "arrays" + (" mixed" * mixed)


_NEEDS_ARRAYS = {}  # record name -> True: it does not accept scalars


def _transform_results(o, diff, specs, out_spec):
    """{transform: (functx types, JAX types)} for one record, traced
    abstractly. A transform JAX refuses is skipped; one only functx
    refuses gives the exception."""
    leaves = tree_util.tree_leaves(out_spec)
    if not leaves or not all(jnp.issubdtype(s.dtype, jnp.floating) for s in leaves):
        return {}
    results = {}

    def body(args, cts, batched):
        d = tuple(args[i] for i in diff)

        def F(*dargs):
            full = list(args)
            for i, v in zip(diff, dargs):
                full[i] = v
            return o.fn(*full)

        fxF = fx.lift(F)
        checks = {
            "jvp": (lambda: fx.jvp(fxF, d, d), lambda: jax.jvp(F, d, d)),
            "vjp": (lambda: fx.vjp(fxF, *d)[1](cts), lambda: jax.vjp(F, *d)[1](cts)),
        }
        if o.batch and (len(specs) > 1 or specs[0].shape != ()):
            # (vmap of a unary elementwise primitive binds the primitive
            # itself: nothing to check beyond its shape rule)
            checks["vmap"] = (lambda: fx.vmap(fx.lift(o.fn))(*batched),
                              lambda: jax.vmap(o.fn)(*batched))
        if len(leaves) == 1 and leaves[0].shape == () and len(diff) == 1:
            checks["grad"] = (lambda: fx.grad(fxF)(*d), lambda: jax.grad(F)(*d))
        for name, (mine, theirs) in checks.items():
            try:
                want = types(theirs())
            except Exception:  # noqa: BLE001 - JAX does not do it: nothing to compare
                continue
            try:
                results[name] = (types(mine()), want)
            except Exception as e:  # noqa: BLE001
                results[name] = (e, want)

    batched = [spec((NB,) + s.shape, s.dtype, s.weak_type) for s in specs]
    jax.eval_shape(body, specs, out_spec, batched)
    return results


_CASES = _cases()
# The quick subset (`pytest -m "not slow"`, the marker in pyproject.toml) runs
# a spread sample of the records, every QUICK_EVERY-th; the full suite all.
QUICK_EVERY = 30


@pytest.mark.parametrize("o,mixed", [
    pytest.param(o, m, id=f"{o.name}{'-mixed' if m else ''}",
                 marks=[pytest.mark.slow] if i % QUICK_EVERY else [])
    for i, (o, m) in enumerate(_CASES)])
def test_transforms_keep_weak_types(o, mixed):
    specs, out_spec, diff, variant = _specs(o, mixed)
    bad, stale = [], []
    for name, (got, want) in _transform_results(o, diff, specs, out_spec).items():
        key = (o.name, variant, name)
        known = KNOWN_DIFFERENCES.get(key) or XFAIL.get(key)
        if isinstance(got, BaseException):
            bad.append(f"{name}: functx raised {got!r}")
        elif got != want and not known:
            bad.append(f"{name} at weakly typed {variant}: functx {got}, JAX {want}")
        elif got == want and known:
            stale.append(f"{key} matches JAX now: remove it from the table")
    assert not bad, f"{o.name}: " + "; ".join(bad)
    assert not stale, "; ".join(stale)


def test_tables_are_declarative():
    """Every entry names a record, a variant and a transform (and is not
    in both tables)."""
    names = {o.name for o in list(op_table.OPS) + list(op_table_public.OPS) + EXTRA_RECORDS}
    variants = {"scalars", "arrays", "scalars mixed", "arrays mixed"}
    for key in list(KNOWN_DIFFERENCES) + list(XFAIL):
        assert key[0] in names and key[1] in variants, key
        assert key[2] in ("jvp", "vjp", "vmap", "grad"), key
    assert not set(KNOWN_DIFFERENCES) & set(XFAIL)


# --------------------------------------------------------------------------
# 3. Eager, at a Python float: the functions of the issue

# (the abstract sweep above checks all of the functions: jnp.tanh,
# jnp.square, ..., nn.softplus; these take the eager paths too)
EAGER = {
    "tanh": jnp.tanh,
    "maximum": lambda x: jnp.maximum(x, 0.3),
    "where": lambda x: jnp.where(x > 0, x, 2 * x),
    "softplus": jax.nn.softplus,
}


@pytest.mark.slow
def test_eager_python_float():
    """grad, jvp, vjp and vmap at a Python float, on concrete values (the
    eager paths: cached compiled rules, materialised zeros)."""
    x, xs = 0.7, weak(np.array([0.7, -0.2]))
    bad = {}
    for name, f in EAGER.items():
        pairs = {
            "grad": (fx.grad(f)(x), jax.grad(f)(x)),
            "jvp": (fx.jvp(f, (x,), (1.0,)), jax.jvp(f, (x,), (1.0,))),
            "vjp": (fx.vjp(f, x)[1](1.0), jax.vjp(f, x)[1](1.0)),
            "vmap": (fx.vmap(f)(xs), jax.vmap(f)(xs)),
        }
        for k, (got, want) in pairs.items():
            if types(got) != types(want) and (name, k) not in EAGER_XFAIL:
                bad[name, k] = (types(got), types(want))
            elif types(got) == types(want) and (name, k) in EAGER_XFAIL:
                bad[name, k] = "matches JAX now: remove it from EAGER_XFAIL"
    assert not bad, f"(functx, JAX) types differ: {bad}"


EAGER_XFAIL = {}  # (function, transform) -> where (as XFAIL)


def test_const_at_weak_arrays():
    """The elementwise part of CONST, kept visible: at a weak *array*,
    JAX's sqrt derivative is strong (its `_const`), functx's weak; at a
    weak scalar (a Python float) both are weak."""
    res = {}

    def body(x, xs):
        res["scalar"] = (types(fx.grad(jnp.sqrt)(x)), types(jax.grad(jnp.sqrt)(x)))
        res["array"] = (types(fx.jvp(jnp.sqrt, (xs,), (xs,))[1]),
                        types(jax.jvp(jnp.sqrt, (xs,), (xs,))[1]))

    jax.eval_shape(body, spec((), np.float64, True), spec((3,), np.float64, True))
    assert res["scalar"] == (("float64", True), ("float64", True))
    assert res["array"] == (("float64", True), ("float64", False))
