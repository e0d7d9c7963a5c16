"""Calling an eager transform until its caches have settled.

Which call of a loop first runs a fused step, a staged backward pass or a
queue's one program depends on when the compile thread finishes the builds
before it (a queue's key changes as its steps' programs land, a build held
back while others stage waits `caches.HOLD_CALLS` calls). A test that wants
the steady state calls until several calls in a row handed the compile
thread nothing, not a fixed number of times."""

from functx import caches


def warm(fn, *args, calls=4, quiet=3, limit=40):
    """Call `fn(*args)` at least `calls` times and until `quiet` calls in a
    row submitted no build (each followed by `caches.wait_for_compiles()`),
    at most `limit` times; returns the last result."""
    out, still = None, 0
    for i in range(limit):
        before = caches.submitted
        out = fn(*args)
        caches.wait_for_compiles()
        still = still + 1 if caches.submitted == before else 0
        if i + 1 >= calls and still >= quiet:
            break
    return out
