"""functx.coverage (`python -m functx.coverage`): the inventory of JAX
primitives and their functx rules. The full inventory traces ~500
functions; here only its parts and one small namespace run."""

import io

import jax.numpy as jnp
import pytest

from functx import coverage


def test_rule_status_of_known_and_unknown_primitives():
    assert coverage.rule_status("sin") == {"eval": True, "jvp": True, "reverse": True, "batch": True}
    # linear: reverse mode needs (and has) its transpose rule
    assert coverage.rule_status("dot_general")["reverse"] is True
    assert coverage.rule_status("no_such_primitive") == {
        "eval": False, "jvp": False, "reverse": False, "batch": False}
    # a primitive seen only without operands is never differentiated or batched
    status = coverage.rule_status("iota", operand_free=True)
    assert status["eval"] is True and all(status.values())
    # jax 0.11+'s high-level primitives run with their own rules (foreign.py)
    assert all("foreign" in v for v in coverage.rule_status("call_hi_primitive").values())


def test_declared_names_are_public_functions():
    import jax

    # type annotations are not functions, whatever typing makes of them
    assert not {"PrecisionLike", "DotDimensionNumbers"} & set(coverage.public_functions(jax.lax))
    for table in (coverage.NOT_TRACEABLE, coverage.OVERRIDES):
        for ns, entries in table.items():
            public = set(coverage.public_functions(coverage.ALL_NAMESPACES[ns]))
            absent = set(entries) - public
            assert absent <= set(coverage.NOT_IN_EVERY_RELEASE.get(ns, {})), (ns, absent)


def test_a_namespace_traces_and_reports():
    traced, failed, untraceable = coverage.trace_namespace("jax.numpy.fft", jnp.fft)
    assert not failed and not untraceable
    assert len(traced) == len(coverage.public_functions(jnp.fft))
    assert "fft" in traced["rfft"] and "iota" in traced["fftfreq"]
    out = io.StringIO()
    statuses = coverage.report(missing=True, out=out, namespaces=["jax.numpy.fft"])
    text = out.getvalue()
    assert text.splitlines()[0].split()[:3] == ["namespace", "functions", "traced"]
    assert "jax.numpy.fft" in text and "primitives:" in text
    assert set(traced["fft"]) - coverage.IGNORED <= set(statuses)


# The primitives jax.lax and top-level jax emit beyond the numerical
# namespaces (issue 15): each has its rules, or an exclusion with a reason.
def test_lax_and_jax_functions_of_issue_15_are_covered():
    import jax

    with_operands = set()
    traced, failed, _ = coverage.trace_namespace(
        "jax.lax", jax.lax, with_operands,
        names=["reduce", "reduce_window", "optimization_barrier", "dce_sink", "psum", "composite",
               "ragged_dot", "rng_bit_generator"])
    top, top_failed, untraceable = coverage.trace_namespace(
        "jax", jax, with_operands, names=["device_put", "pure_callback", "grad", "pmap"])
    assert not failed and not top_failed, (failed, top_failed)
    assert {"reduce", "reduce_sum", "reduce_window", "reduce_window_max"} <= traced["reduce"] | \
        traced["reduce_window"]
    assert "device_put" in top["device_put"] and "pure_callback" in top["pure_callback"]
    assert "pmap" in untraceable
    prims = set().union(*traced.values(), *top.values()) - coverage.IGNORED
    for p in prims:
        status = coverage.rule_status(p, operand_free=p not in with_operands)
        assert all(v is not False for v in status.values()), (p, status)
    # Collectives are batched by the vmap naming their axis (issue 18).
    assert coverage.rule_status("psum") == {"eval": True, "jvp": True, "reverse": True,
                                            "batch": True}
    assert "named axis" in coverage.rule_status("ragged_all_to_all")["batch"]
    assert "no derivative" in coverage.rule_status("pure_callback")["jvp"]
    assert coverage.rule_status("pure_callback")["batch"] is True
    assert coverage.rule_status("reduce") == {
        "eval": True, "jvp": True, "reverse": True, "batch": True}


# Gaps the inventory of jax.lax and jax shows, each to be fixed where noted
# (a fixed gap can leave this table; a new one fails the test).
KNOWN_GAPS = {}


@pytest.mark.slow
def test_lax_and_jax_inventory_is_covered_or_excluded():
    statuses = coverage.report(out=io.StringIO(), namespaces=["jax.lax", "jax"])
    missing = {p: [m for m, v in s.items() if v is False] for p, s in statuses.items()
               if not coverage._covered(s)}
    assert set(missing) <= set(KNOWN_GAPS), missing
    assert len(statuses) > 140  # the inventory really traced jax.lax
