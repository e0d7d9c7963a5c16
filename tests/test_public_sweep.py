"""The public-function sweep: every record of tests/op_table_public.py (one
per public function of jax.numpy, jax.numpy.linalg, jax.numpy.fft, jax.nn,
jax.scipy.special, jax.random) lifted into functx and checked against JAX's
own transforms of the same function and finite differences in float64
(machinery: tests/sweep.py).

Default (CI) mode, bounded in cost (NOTE [sweep cost] in tests/sweep.py;
about 0.15 s of CPU per record):
  jvp and vjp against JAX and finite differences; jvp∘vjp (forward over
  reverse, the Hessian-vector product) for records of order 2 that are
  not one primitive already swept to second order in tests/op_table.py;
  vmap with every argument batched at 0 and at -1, against jax.vmap.
  HEAVY records (large programs, see tests/op_table_public.py) run alone,
  checked by vjp against JAX and vmap at 0 against jax.vmap.
FUNCTX_FULL_SWEEP=1: every composition (jvp, vjp, both against finite
  differences too, vmap∘vjp, jvp∘vjp, vjp∘vjp, jvp∘jvp) for every record
  up to its order, and vmap over every batch-dim placement of every
  argument against a Python loop; about 1 s of CPU per record.
"""

import pytest

import sweep
from functx import coverage
from op_table_public import NO_RECORD, NOT_STRICT, OPS, XFAIL

GROUP = 5


def _prepare(op):
    if sweep.FULL:
        return sweep.prepare(op, second=op.second or sweep.SECOND_ORDER)
    if op.heavy:
        return sweep.prepare(op, order=1, vmap_vjp=False, fd=False, jvp=False,
                             placements_at=(0,), vmap_oracle="jax")
    second = tuple(c for c in ("jvp(vjp)",) if c in (op.second or sweep.SECOND_ORDER))
    return sweep.prepare(op, full=False, order=1 if op.simple else None, vmap_vjp=False,
                         second=second, vmap_oracle="jax")


_runner = sweep.GroupedRunner("test_public_sweep", GROUP, _prepare)

# The quick subset (`pytest -m "not slow"`, the marker in pyproject.toml) runs
# a spread sample of the records, every QUICK_EVERY-th; the full suite all.
QUICK_EVERY = 100


def _params():
    for i, op in enumerate(OPS):
        marks = []
        if op.name in XFAIL:
            marks = [pytest.mark.xfail(reason=XFAIL[op.name], strict=op.name not in NOT_STRICT)]
        if i % QUICK_EVERY or op.heavy:
            marks.append(pytest.mark.slow)
        yield pytest.param(op, id=op.name, marks=marks)


@pytest.mark.parametrize("op", list(_params()))
def test_public_sweep(op, request):
    sweep.check_results(op, _runner.results_for(op, request))


def test_table_size_and_xfail_budget():
    """At least 300 records over the six namespaces; the xfail table is
    declarative (every entry names a record) and under 5% of the table."""
    names = {op.name for op in OPS}
    assert len(OPS) >= 300
    for ns, least in [("jnp.", 200), ("linalg.", 25), ("fft.", 15), ("nn.", 30),
                      ("special.", 40), ("random.", 20)]:
        assert sum(n.startswith(ns) for n in names) >= least, ns
    assert set(XFAIL) <= names, set(XFAIL) - names
    assert all(isinstance(r, str) and r for r in XFAIL.values())
    assert len(XFAIL) < 0.05 * len(OPS)


_PREFIX = {"jax.numpy": "jnp", "jax.numpy.linalg": "linalg", "jax.numpy.fft": "fft",
           "jax.nn": "nn", "jax.scipy.special": "special", "jax.random": "random"}


def test_every_public_function_has_a_record():
    """One record per public function that can be staged (functx.coverage
    lists those that cannot), or a declared reason in NO_RECORD."""
    names = {op.name for op in OPS}
    for ns, module in coverage.NAMESPACES.items():
        for f in coverage.public_functions(module):
            name = f"{_PREFIX[ns]}.{f}"
            if f not in coverage.NOT_TRACEABLE.get(ns, {}) and name not in NO_RECORD:
                assert name in names, name
    assert set(NO_RECORD).isdisjoint(names)
