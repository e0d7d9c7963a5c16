"""functx.config (log_compiles, persistent_cache_dir) and the profiler's
compile-time accounting (NOTE [compile log] in functx/config.py, NOTE
[compile time in the profiler] in functx/autograd/profiler.py).

The compiles these tests force use shapes and programs no other test uses,
so they compile once in any test order without clearing JAX's caches."""

import logging
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx
import functx.numpy as fnp
from functx import config
from functx.autograd import profiler
from functx.errors import FunctxTypeError, FunctxValueError

_LINE = re.compile(r"^functx: (compiled|loaded) (\S+)( from the persistent cache)? in "
                   r"\d+\.\d{3} s( \(traced and lowered in \d+\.\d{3} s\))?( in the background)?$")


@pytest.fixture
def log_on():
    """The compile log on for one test; the logger as it was afterwards."""
    logger = logging.getLogger("functx")
    saved = (list(logger.handlers), logger.propagate, logger.level, config._handler)
    config.update("log_compiles", True)
    try:
        yield
    finally:
        config.update("log_compiles", False)
        handlers, logger.propagate, level, config._handler = saved
        logger.handlers[:] = handlers
        logger.setLevel(level)


def _lines(text):
    return [ln for ln in text.splitlines() if ln.startswith("functx:")]


def test_options_and_errors():
    assert config.read("log_compiles") is False and config.log_compiles is False
    assert config.read("persistent_cache_dir") is None
    with pytest.raises(FunctxValueError, match="'log_compiles', 'persistent_cache_dir'"):
        config.update("log_compile", True)
    with pytest.raises(ValueError, match="unknown option 'cache_dir'"):
        config.read("cache_dir")
    with pytest.raises(AttributeError, match="log_compiles"):
        config.no_such_option  # noqa: B018
    with pytest.raises(FunctxTypeError, match="bool"):
        config.update("log_compiles", "yes")
    with pytest.raises(FunctxTypeError, match="path"):
        config.update("persistent_cache_dir", 3)
    assert functx.config is config and "config" in functx.__all__
    assert [config._env_flag(t) for t in ("1", "true", "ON", "0", "", "false", "no")] == [
        True, True, True, False, False, False, False]


def test_one_listener_returns_at_once_when_off():
    from jax._src import monitoring

    listeners = monitoring.get_event_duration_listeners()
    assert sum(fn is config._on_duration for fn in listeners) == 1
    assert not config.log_compiles and config.profiler_sink is None
    # Off, nothing is kept: not even the per-name tracing/lowering seconds.
    config._before.clear()
    config._on_duration("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.5, fun_name="jit(f)")
    assert config._before == {}


def test_log_names_each_compilation(log_on, capsys):
    def compile_log_probe(v):
        return jnp.cosh(v) * 3.0

    jax.jit(compile_log_probe)(jnp.ones((3, 17, 5)))  # a program compiled nowhere else
    fnp.expm1(jnp.ones((11, 3, 7)))  # an eager functx op on a new shape
    lines = _lines(capsys.readouterr().err)
    for ln in lines:
        assert _LINE.match(ln), ln
    names = [_LINE.match(ln).group(2) for ln in lines]
    assert "jit(compile_log_probe)" in names
    probe = lines[names.index("jit(compile_log_probe)")]
    assert probe.startswith("functx: compiled") and "traced and lowered" in probe
    assert any("expm1" in n for n in names), names


def test_log_off_writes_nothing(capsys):
    def compile_log_silent(v):
        return jnp.sinh(v) - 1.0

    assert not config.log_compiles
    jax.jit(compile_log_silent)(jnp.ones((5, 17, 3)))
    assert _lines(capsys.readouterr().err) == []


def test_log_goes_to_a_handler_of_the_functx_logger(capsys):
    """A handler the user gave the "functx" logger receives the records and
    functx adds none of its own."""
    logger = logging.getLogger("functx")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    keep = Keep()
    logger.addHandler(keep)
    saved = (logger.propagate, logger.level, config._handler)
    try:
        config.update("log_compiles", True)
        assert logger.handlers == [keep]
        jax.jit(lambda v: jnp.arcsinh(v) + 2.0)(jnp.ones((13, 3, 5)))
    finally:
        config.update("log_compiles", False)
        logger.removeHandler(keep)
        logger.propagate, level, config._handler = saved
        logger.setLevel(level)
    assert any(r.startswith("compiled jit(<lambda>) in ") for r in records), records
    assert _lines(capsys.readouterr().err) == []


def test_persistent_cache_switch_sets_and_restores_jax_config(tmp_path):
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = tuple(getattr(jax.config, n) for n in names)
    try:
        config.update("persistent_cache_dir", tmp_path)
        assert config.persistent_cache_dir == str(tmp_path)
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
        assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
        # A small program (milliseconds to compile) is written to the cache.
        jax.jit(lambda v: jnp.log1p(v) * 5.0)(jnp.ones((3, 5, 17)))
        assert any(p.is_file() for p in tmp_path.rglob("*"))
        config.update("persistent_cache_dir", tmp_path / "other")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "other")
    finally:
        config.update("persistent_cache_dir", None)
    assert config.read("persistent_cache_dir") is None
    assert tuple(getattr(jax.config, n) for n in names) == before


def _profiled_call(fn, x):
    t0 = time.perf_counter()
    with profiler.profile() as prof:
        out = fn(x)
    wall_us = (time.perf_counter() - t0) * 1e6
    return prof, out, wall_us


def test_profiler_keeps_compile_time_out_of_op_time():
    # (7, 13, 3) and arcsinh: a shape and primitive no other test compiles.
    x = jnp.full((7, 13, 3), 0.5)
    g = functx.grad(lambda v: fnp.sum(fnp.arcsinh(v)))
    prof, out, wall = _profiled_call(g, x)
    np.testing.assert_allclose(out, 1 / np.sqrt(1 + 0.25) * np.ones((7, 13, 3)), rtol=1e-12)
    events = prof.events()
    compile_total = prof.compile_time_total
    assert compile_total > 0
    assert compile_total == pytest.approx(sum(e.self_compile_time for e in events))
    (asinh,) = [e for e in events if e.name == "grad/asinh"]
    assert asinh.compile_time > 0
    for e in events:
        # CPU times are the wall time of the event less its compile time.
        assert e.cpu_time_total == pytest.approx(
            max(e.end_us - e.start_us - e.compile_time, 0.0), abs=1e-3)
        assert 0 <= e.self_compile_time <= e.compile_time
        assert 0 <= e.self_cpu_time_total <= e.cpu_time_total + 1e-3
    top = [e for e in events if e.depth == 0]
    all_compile = compile_total + prof.compile_time_outside_events
    slack = 2e4  # 20 ms: the clocks of JAX and the profiler differ
    assert sum(e.cpu_time_total for e in top) < wall - all_compile + slack
    assert sum(e.compile_time for e in top) <= wall + slack
    # The table's Compile column, summed by key, and its footer.
    avgs = prof.key_averages()
    assert {a.key: a.compile_time for a in avgs}["grad/asinh"] == pytest.approx(asinh.compile_time)
    table = avgs.table(show_compile=True)
    lines = table.splitlines()
    head = lines[1].split()
    assert head[head.index("Compile") - 3:head.index("Compile") + 1] == ["CPU", "time", "avg",
                                                                         "Compile"]
    col = 6  # Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, Compile
    (row,) = [ln.split() for ln in lines[3:-2] if ln.split()[0] == "grad/asinh"]
    assert row[col] != "0.000us" and row[col].endswith(("ms", "s"))
    assert "JAX compile time (not in the CPU times)" in lines[-1]
    assert "Compile" in avgs.table().splitlines()[1]  # shown whenever a row compiled
    assert "Compile" not in avgs.table(show_compile=False).splitlines()[1]
    assert avgs.table(sort_by="compile_time").splitlines()[3].split()[0] in {
        a.key for a in avgs if a.compile_time == max(b.compile_time for b in avgs)}

    # The next calls compile less and, once every step of this structure is
    # compiled (fused steps, the backward pass), nothing.
    seen = [compile_total]
    for _ in range(8):
        prof, _, _ = _profiled_call(g, x)
        seen.append(prof.compile_time_total)
        if seen[-1] == 0:
            break
    assert seen[1] < seen[0] and seen[-1] == 0, seen
    assert all(e.compile_time == 0 for e in prof.events())
    assert "JAX compile time" not in prof.table().splitlines()[-1] or (
        prof.compile_time_outside_events + prof.background_compile_time > 0)


def test_chrome_trace_dur_is_wall_time(tmp_path):
    import json

    x = jnp.full((3, 13, 7), 0.25)
    with profiler.profile() as prof:
        functx.vmap(fnp.cbrt)(x)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    evs = json.loads(path.read_text())["traceEvents"]
    for e, fe in zip(evs, prof.events()):
        assert e["dur"] == pytest.approx(fe.end_us - fe.start_us)
        if fe.compile_time:
            assert e["args"]["compile_us"] == fe.compile_time
