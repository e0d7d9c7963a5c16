"""XLA:CPU's cheapest compilation for the test programs, with only the
options the installed jaxlib knows.

The test programs are tiny and mostly run once, so optimising them costs
more than it saves: no LLVM optimisation, none of its expensive passes, and
(where XLA still has them) the legacy emitters instead of the fusion
emitters, which compile faster. Numerics are unchanged (no fast math).

XLA's options come and go between jaxlib releases (0.11.0 still takes
`xla_cpu_use_fusion_emitters`, 0.11.2 and 0.12 reject it), and an unknown
one is fatal: in XLA_FLAGS it aborts the process before a test runs, as a
compile option it raises. So each is asked of this jaxlib before use: the
XLA_FLAGS in a child process (`env_flags`), compile options by compiling a
tiny program (`compile_options`).
"""

import functools
import os
import subprocess
import sys

# option name -> value, cheapest compilation first
CHEAP = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_cpu_use_fusion_emitters": False,
}

_PROBE = "import jax; jax.devices('cpu')"


def _flag(name, value):
    return f"--{name}={str(value).lower()}"


def _starts_with(flags):
    """Whether a JAX process starts with these XLA_FLAGS."""
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          timeout=120).returncode == 0


def env_flags(options=CHEAP, starts=_starts_with):
    """The XLA_FLAGS string for `options`, less those this jaxlib rejects:
    one child process when all are known, one more per option otherwise."""
    flags = [_flag(k, v) for k, v in options.items()]
    if starts(flags):
        return " ".join(flags)
    return " ".join(f for f in flags if starts([f]))


@functools.cache
def _known(name, value):
    import jax

    try:
        jax.jit(lambda x: x + 1).lower(1.0).compile({name: value})
    except Exception:  # noqa: BLE001 - XLA's error for an unknown option
        return False
    return True


def compile_options(options):
    """`options` (a compile-options dict) less those this jaxlib rejects."""
    return {k: v for k, v in options.items() if _known(k, v)}
