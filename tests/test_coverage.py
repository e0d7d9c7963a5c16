"""functx.coverage (`python -m functx.coverage`): the inventory of JAX
primitives and their functx rules. The full inventory traces ~500
functions; here only its parts and one small namespace run."""

import io

import jax.numpy as jnp

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


def test_declared_names_are_public_functions():
    for table in (coverage.NOT_TRACEABLE, coverage.OVERRIDES):
        for ns, entries in table.items():
            public = set(coverage.public_functions(coverage.NAMESPACES[ns]))
            assert set(entries) <= public, (ns, set(entries) - public)


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
