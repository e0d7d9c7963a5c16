"""functx.config: process-wide options of functx.

    functx.config.update("log_compiles", True)        # one stderr line per compilation
    functx.config.update("persistent_cache_dir", "/tmp/functx-cache")
    functx.config.read("log_compiles")                 # or functx.config.log_compiles

Options (both also read from the environment once, when functx is imported):

* ``log_compiles`` (bool, default False; environment ``FUNCTX_LOG_COMPILES=1``):
  write one line per XLA compilation to stderr, naming the program as JAX
  reports it and how long it took, e.g.
  ``functx: compiled jit(functx_fused_sin) in 0.012 s (traced and lowered in 0.003 s)``
  or, for a program read back from the persistent cache,
  ``functx: loaded jit(functx_fused_sin) from the persistent cache in 0.002 s``.
  See NOTE [compile log].
* ``persistent_cache_dir`` (str path or None, default None; environment
  ``FUNCTX_CACHE_DIR``): keep compiled programs in this directory so that a
  later process reads them back instead of compiling them again. See NOTE
  [persistent cache].

An unknown option name raises `functx.FunctxValueError` naming the known
ones; a value of the wrong kind raises `functx.FunctxTypeError`.

NOTE [compile log]
JAX reports the duration of each step of building a program through
`jax.monitoring`: '/jax/core/compile/jaxpr_trace_duration' (tracing the
Python function to a jaxpr), '/jax/core/compile/jaxpr_to_mlir_module_duration'
(lowering the jaxpr to an MLIR module) and
'/jax/core/compile/backend_compile_duration' (XLA compiling the module, or
reading it back from the persistent cache), each with the program's name as
the keyword `fun_name` (as jax 0.10 does; where a JAX version passes no
name the line says "<unnamed program>"). Every program functx compiles,
eager steps included, is a `jax.jit` program, so it is reported there.

functx registers ONE duration listener when it is imported (and one plain
event listener for '/jax/compilation_cache/cache_hits', which tells a read
from the persistent cache from a compilation). Each starts with one test of
two module globals and returns at once unless the log is on or a
`functx.autograd.profiler.profile` is recording, so leaving them registered
costs a function call per compilation and nothing per dispatch.

When the log is on, the listener keeps the tracing and lowering seconds
reported for each program name (tracing reports `f`, lowering and
compilation `jit(f)`) and writes one line per backend compilation: the XLA
compile time, then the tracing and lowering of that name not yet reported,
and "in the background" for a compilation on functx's background compile
thread (functx/caches.py). The line goes through the `logging` logger named
"functx", at level INFO, written to stderr by a small handler functx
attaches to that logger the first time the log is switched on (only if the
logger has no handler of its own; the logger then stops propagating to the
root logger, so a configured root logger does not print each line twice).
To route the lines elsewhere, give the "functx" logger your own handler
before switching the log on; functx then attaches none and leaves
propagation alone. Switching the log on sets the logger's level to INFO
when it has none (NOTSET), so the lines pass a root logger left at WARNING. The handler writes to whatever `sys.stderr` is at the
time of each line (so pytest's capture sees it).

The profiler (functx/autograd/profiler.py) uses the same listener: while a
profile records, the seconds of all three steps are charged to the
innermost open profiler event of the thread that compiled, shown in its
"Compile" column, and subtracted from its CPU times.

NOTE [persistent cache]
`update("persistent_cache_dir", path)` sets JAX's `jax_compilation_cache_dir`
to `path`, and lowers the thresholds under which JAX does not persist a
program: `jax_persistent_cache_min_compile_time_secs` to 0 (JAX's default
keeps only compilations over 1 s, and eager functx compiles many programs of
10-100 ms each) and `jax_persistent_cache_min_entry_size_bytes` to -1 (no
size limit). JAX's previous values of the three options are remembered the
first time and restored by `update("persistent_cache_dir", None)`.
Changing the directory resets JAX's cache object
(`jax.experimental.compilation_cache.compilation_cache.reset_cache`), which
JAX otherwise initialises once per process. The cache holds XLA executables
only: a later process still traces and lowers each program (a few ms each),
it skips the XLA compilation. As JAX warns, the cache is trusted: do not
point it at a directory others can write to.
"""

import logging
import os
import sys
import threading

import jax

from .errors import FunctxTypeError, FunctxValueError

__all__ = ["OPTIONS", "read", "update"]

OPTIONS = {
    "log_compiles": "write one line per XLA compilation to stderr (bool; env FUNCTX_LOG_COMPILES)",
    "persistent_cache_dir": "directory of JAX's persistent compilation cache, thresholds "
                            "lowered so eager steps are cached too (str or None; env "
                            "FUNCTX_CACHE_DIR)",
}

_values = {"log_compiles": False, "persistent_cache_dir": None}

# --------------------------------------------------------------------------
# The compile listener (NOTE [compile log])

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_STEPS = {_TRACE: 0, _LOWER: 1, _COMPILE: 2}

_log_on = False  # mirrors _values["log_compiles"]; read first by the listeners
# While a profile records: a function(seconds) charging compile seconds to
# the calling thread's innermost profiler event (set by the profiler).
profiler_sink = None

logger = logging.getLogger("functx")


class _Tls(threading.local):
    def __init__(self):
        self.cache_hit = False  # the next backend compile on this thread is a cache read


_tls = _Tls()
# Tracing and lowering seconds not yet reported, by the name of the program
# they are for (tracing reports `f`, lowering and compiling `jit(f)`).
_before = {}


class _StderrHandler(logging.Handler):
    """Writes "functx: <message>" to the current `sys.stderr`."""

    def emit(self, record):
        try:
            print(f"{record.name}: {record.getMessage()}", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 (logging's contract: never raise)
            self.handleError(record)


_handler = None


def _attach_handler():
    global _handler
    if _handler is not None or logger.handlers:
        return
    _handler = _StderrHandler()
    logger.addHandler(_handler)
    logger.propagate = False


def _on_duration(event, secs, **kwargs):
    if not _log_on and profiler_sink is None:
        return
    step = _STEPS.get(event)
    if step is None:
        return
    sink = profiler_sink
    if sink is not None:
        sink(secs)
    if not _log_on:
        return
    name = kwargs.get("fun_name")
    if step != 2:
        if name:
            if step == 0:
                name = f"jit({name})"
            if len(_before) > 512:  # traces never compiled (make_jaxpr): forget them
                _before.clear()
            _before[name] = _before.get(name, 0.0) + secs
        return
    tls = _tls
    hit, tls.cache_hit = tls.cache_hit, False
    before = _before.pop(name, 0.0) if name else 0.0
    verb = "loaded" if hit else "compiled"
    where = " from the persistent cache" if hit else ""
    extra = f" (traced and lowered in {before:.3f} s)" if before > 0 else ""
    thread = threading.current_thread().name
    if thread.startswith("functx-compile"):
        extra += " in the background"
    logger.info("%s %s%s in %.3f s%s", verb, name or "<unnamed program>", where, secs, extra)


def _on_event(event, **kwargs):
    if not _log_on:
        return
    if event == _CACHE_HIT:
        _tls.cache_hit = True


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


# --------------------------------------------------------------------------
# The persistent cache (NOTE [persistent cache])

_JAX_CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                      "jax_persistent_cache_min_entry_size_bytes")
_jax_saved = None  # JAX's values before functx first set a cache directory


def _reset_jax_cache():
    try:
        from jax.experimental.compilation_cache import compilation_cache as cc
        cc.reset_cache()
    except Exception as exc:  # noqa: BLE001 (a JAX without it: the next process uses the dir)
        logger.debug("could not reset JAX's compilation cache: %r", exc)


def _set_cache_dir(path):
    global _jax_saved
    if path is None:
        if _jax_saved is not None:
            for name, value in zip(_JAX_CACHE_OPTIONS, _jax_saved):
                jax.config.update(name, value)
            _jax_saved = None
            _reset_jax_cache()
        return
    if _jax_saved is None:
        _jax_saved = tuple(getattr(jax.config, name) for name in _JAX_CACHE_OPTIONS)
    changed = jax.config.jax_compilation_cache_dir != path
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if changed:
        _reset_jax_cache()


# --------------------------------------------------------------------------
# The interface


def _unknown(name, where):
    return FunctxValueError(
        f"functx.config.{where}: unknown option {name!r}; the options are "
        f"{', '.join(map(repr, OPTIONS))}.")


def update(name, value):
    """Set option `name` to `value` (see the module docstring)."""
    global _log_on
    if name not in OPTIONS:
        raise _unknown(name, f"update({name!r}, ...)")
    if name == "log_compiles":
        if not isinstance(value, (bool, int)):
            raise FunctxTypeError(
                f"functx.config.update('log_compiles', {value!r}): expected a bool.")
        value = bool(value)
        if value:
            _attach_handler()
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.INFO)
        _values[name] = _log_on = value
    elif name == "persistent_cache_dir":
        if value is not None:
            if not isinstance(value, (str, os.PathLike)):
                raise FunctxTypeError(
                    f"functx.config.update('persistent_cache_dir', {value!r}): expected a "
                    "directory path (str or os.PathLike) or None.")
            value = os.fspath(value)
            if not value:
                value = None
        _set_cache_dir(value)
        _values[name] = value


def read(name):
    """The current value of option `name`."""
    if name not in OPTIONS:
        raise _unknown(name, f"read({name!r})")
    return _values[name]


def __getattr__(name):
    if name in OPTIONS:
        return _values[name]
    raise AttributeError(f"module 'functx.config' has no attribute {name!r}; the options are "
                         f"{', '.join(map(repr, OPTIONS))} (read them with functx.config.read).")


def _env_flag(text):
    return text.strip().lower() not in ("", "0", "false", "no", "off")


if _env_flag(os.environ.get("FUNCTX_LOG_COMPILES", "")):
    update("log_compiles", True)
if os.environ.get("FUNCTX_CACHE_DIR"):
    update("persistent_cache_dir", os.environ["FUNCTX_CACHE_DIR"])
