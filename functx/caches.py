"""functx's caches: bounded, weakly holding what users own, compiled off
the calling thread, and inspectable (`functx.cache_info()`,
`functx.clear_caches()`).

NOTE [bounded caches]
Eager transforms cache what they compile for work that repeats (NOTE [eager
reverse mode in few dispatches] in interpreters/reverse.py, the batched
steps of interpreters/batching.py, the per-primitive programs of
interpreters/eval.py), and lifting caches the programs of JAX functions
(lifting.py). Every one of them is a `Cache` registered here:

* **Bounded.** An LRU with a bound in entries and, where entries hold
  compiled programs, in bytes (each program counted for its generated code,
  at least `PROGRAM_BYTES`, what a small program holds in host memory). Counting "seen once" keys (a `RepeatCache` compiles on the N-th
  sighting) is an LRU of its own, so keys seen once are forgotten. The
  per-primitive programs of all primitives share one bound (NOTE [eager
  programs, bounded process-wide] in interpreters/eval.py).
* **Weak where the user owns the object.** A staged Graph or a user's
  function that appears in a key (a `jit_call`'s graph parameter, a lifted
  function) is held through a `WeakRef` key part: the cache does not keep
  it alive, and once it dies its entries can never match again and are
  purged at the next insertion (with what they hold: derived graphs,
  compiled programs).
* **Compiled off the calling thread.** The N-th sighting of a key hands
  the building of its value (staging the transformed one-primitive graph)
  and its XLA compilation to one background thread (`BACKGROUND`; XLA
  compiles without holding the GIL, staging takes turns with the caller;
  while it has work the interpreter's switch interval is shortened so the
  caller gets the GIL back quickly: `SWITCH_INTERVAL`; it starts a job
  only while no call is in progress, or after waiting `MAX_WAIT`; and while
  a call is in progress its Python yields the GIL every `SLICE_S`, so that
  a lowering spreads over several calls rather than stalling one:
  `YIELD_S`).
  Builds that only stage (fused and batched steps, staged backward passes
  and the graphs derived from them) run before XLA compilations (queue
  programs, compiled backward passes): they change which programs the calls
  need, so compiling first would spend the thread on programs of structures
  the calls are about to leave.
  Until the program is ready the caller keeps taking the uncached path (the
  per-primitive programs, already compiled), so no call stalls on a
  compilation of repeated structure. Both paths run the same primitives
  with the same rules, and tests compare their results bit for bit (NOTE
  [deferred eager steps]; on GPUs, a product and a sum fused into one
  multiply-add may still differ in the last bit: NOTE [one rounding per
  primitive] in xla_cpu.py).
  `FUNCTX_BACKGROUND_COMPILE=0` compiles on the calling thread instead
  (the first cached call then waits for it).
* **Stale work dropped.** A cache made with `stale_after` (the deferred
  queue's programs) skips a pending build whose key no lookup has asked for
  in its last `stale_after` lookups (or, with `stale_calls`, during the last
  `stale_calls` transform calls) when the compile thread reaches it, and
  the thread compiles the newest submissions first: while
  the thread is behind, calls move past the queue structures of a warm-up as
  steps land, and compiling those would keep it behind and keep programs no
  call runs. A key met again is counted and submitted anew. And a
  structure built of steps met while steps are being staged is held back
  (`HOLD_CALLS`): it is likely one the calls leave once the steps land.
* **Under the caller's JAX options.** See NOTE [JAX options off the
  calling thread] below.
* **Shared between threads.** See NOTE [caches shared between threads].

NOTE [caches shared between threads]
Every cache is used by at least two threads: the calling thread (or several,
when users run transforms on threads of their own) and the compile thread,
whose builds stage through the same caches. The LRUs are
`collections.OrderedDict`s, whose C implementation is not safe against a
mutation from another thread while one of its own operations runs Python
code: inserting, popping or moving a key compares it with the stored key of
equal hash, and functx's keys compare in Python (`WeakRef`, the lifted
functions' keys), so the interpreter may switch threads in the middle. Two
threads putting or dropping equal keys at once then free the same node
twice, and the process crashes later at an unrelated allocation (seen: a
segmentation fault in CI, four threads running one lifted function's
transforms; reproduced in tests/test_eager_caches.py). So every mutation of
an LRU (insert, drop, move to the end, evict) happens under its cache's
lock; lookups (`dict.get`, `in`) need none, dict itself being safe. The lock
is never held while building a value, and weak-reference callbacks never
wait for it (one may run inside a garbage collection triggered under the
lock, on the same thread, in the middle of an operation): they record the
dead key, and drop it at once only if the lock is free, else under the lock
at the next insertion. The LRUs of functx.jit (shared functions), functx.lax
(staged bodies) and primitives/control.py (compiled loops) follow the same
rule with their own locks.

NOTE [JAX options off the calling thread]
JAX's options (`jax.enable_x64`, `jax.default_matmul_precision`,
`jax.numpy_rank_promotion`, ...) can be set for one thread by a context
manager, and what JAX traces reads them: jax.numpy picks default dtypes and
bakes the configured precision into the products it makes, and a product
left at `precision=None` takes the option's value when it is lowered. A build
handed to the compile thread stages rules (some borrowed from JAX) and
lowers programs there, where none of the caller's contexts is entered: a
`grad` of `jax.nn.logsumexp` called inside `with jax.enable_x64(True)` ran
its first calls in float64 and then failed in its fused steps, staged with
float32 constants. So `submit` records the options the calling thread has
set for itself and the job runs with the same ones entered (`_thread_options`,
`_entered`). And as jax.jit keys its caches on `config.trace_context()`, a
`RepeatCache` keys every entry on the options in force at the lookup
(`options_id`: a small number per distinct `trace_context()`), so what was
staged under one context is never taken under another.
"""

import collections
import functools
import itertools
import os
import sys
import threading
import time
import weakref

__all__ = ["Cache", "RepeatCache", "WeakRef", "clear_caches", "cache_info", "weak_key_part"]

BACKGROUND = os.environ.get("FUNCTX_BACKGROUND_COMPILE", "1") != "0"

_REGISTRY = {}  # name -> Cache
_MISSING = object()


class WeakRef:
    """A key part that refers to `obj` weakly: equal to `obj` itself (and to
    other WeakRefs of it) while it lives, to nothing after."""

    __slots__ = ("ref", "hash", "__weakref__")

    def __init__(self, obj, callback=None):
        self.ref = weakref.ref(obj, callback)
        self.hash = hash(obj)

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        obj = self.ref()
        if obj is None:
            return False
        if type(other) is WeakRef:
            return obj is other.ref()
        return obj is other

    def alive(self):
        return self.ref() is not None


class WeaklyKeyed:
    """A base class for objects that primitive parameters hold and that may
    hold a user's values (custom-rule objects: their rules' closures): held
    weakly in cache keys (`weak_key_part`), as staged Graphs are, so a key
    seen once does not keep them alive."""

    __slots__ = ()


def _weak_types():
    from .interpreters.staging import Graph

    return (Graph, WeaklyKeyed)


def weak_key_part(value, types=None):
    """`value` with the objects of `types` (default: staged Graphs) in it
    (directly, or in a tuple) replaced by `WeakRef`s; the same object when
    there are none."""
    types = types or _weak_types()
    if isinstance(value, types):
        return WeakRef(value)
    if type(value) is tuple:
        parts = tuple(weak_key_part(v, types) for v in value)
        if any(a is not b for a, b in zip(parts, value)):
            return parts
    return value


def _refs(key, out):
    if type(key) is WeakRef:
        out.append(key)
    elif type(key) is tuple:
        for k in key:
            _refs(k, out)
    else:
        parts = getattr(key, "weak_parts", None)  # a key part naming objects weakly itself
        if parts is not None:
            out.extend(parts())
    return out


def run_if_free(lock, fn):
    """Run `fn()` under `lock` if no thread holds it now, this one
    included: for weak-reference callbacks, which must never wait for a
    cache's lock (NOTE [caches shared between threads]); what they leave
    is done under the lock later."""
    try:
        if lock.acquire(blocking=False):
            try:
                fn()
            finally:
                lock.release()
    except Exception:  # noqa: BLE001, S110 - interpreter shutdown
        pass


class Cache:
    """An LRU from keys to values, bounded by `limit` entries and by
    `byte_limit` bytes (`size(value)`; 0 when no size is known). Keys may
    hold `WeakRef` parts (`weakly`): an entry whose referent died is dropped
    at the next insertion."""

    def __init__(self, name, limit, byte_limit=None, size=None, doc=""):
        self.name = name
        self.limit = limit
        self.byte_limit = byte_limit
        self.size = size
        self.doc = doc
        self.entries = collections.OrderedDict()
        # A hit moves its entry to the end (most recently used) only once
        # the cache holds more than half its bound in entries or bytes:
        # `move_to_end` hashes and compares the key again, as much as the
        # lookup itself (a key of avals and parameters: Python calls), and
        # eager transforms look up a few caches per primitive. Below half
        # nothing is evicted, so the order does not matter yet; past it,
        # every entry that is used moves behind those that are not, so
        # eviction still takes entries unused since then, oldest first.
        self.half = limit // 2
        self.half_bytes = float("inf") if byte_limit is None else byte_limit // 2
        self.sizes = {}
        self.bytes = 0
        self.hits = self.misses = 0
        self._watch = {}  # stored key -> weak references watching its WeakRef parts
        self._dead = []  # stored keys whose referents died
        # held for every mutation of `entries` (NOTE [caches shared between threads])
        self.lock = threading.Lock()
        _REGISTRY[name] = self

    def get(self, key, default=None):
        value = self.entries.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self.hits += 1
        if len(self.entries) > self.half or self.bytes > self.half_bytes:  # see `half`
            with self.lock:  # NOTE [caches shared between threads]
                try:
                    self.entries.move_to_end(key)
                except KeyError:  # evicted meanwhile by another thread
                    pass
        return value

    def put(self, key, value, nbytes=None):
        entries = self.entries
        stored = weak_key_part(key) if type(key) is tuple else key
        if nbytes is None:
            nbytes = self.size(value) if self.size is not None else 0
        if self.byte_limit is not None and nbytes > self.byte_limit:
            self.pop(key)
            return  # larger than the whole cache: not kept
        watchers = self._watchers(stored) if type(stored) is tuple else None
        with self.lock:  # NOTE [caches shared between threads]
            if key in entries:
                self._drop(key)
            entries[stored] = value
            self.sizes[stored] = nbytes
            self.bytes += nbytes
            if watchers:
                self._watch[stored] = watchers
            while self._dead:
                self._drop(self._dead.pop())
            while len(entries) > self.limit or (
                    self.byte_limit is not None and self.bytes > self.byte_limit
                    and len(entries) > 1):
                self._drop(next(iter(entries)))

    def _watchers(self, stored):
        dead = self._dead
        watchers = []
        for part in _refs(stored, []):
            obj = part.ref()
            if obj is not None:
                # Only appends: the entry is dropped at the next insertion,
                # never from inside a garbage collection.
                watchers.append(weakref.ref(obj, lambda _, k=stored: dead.append(k)))
        return watchers

    def pop(self, key):
        """Drop `key`'s entry, if there is one."""
        with self.lock:
            self._drop(key)

    def _drop(self, key):  # under `lock`
        self._watch.pop(key, None)
        try:
            self.entries.pop(key)
        except KeyError:
            return
        self.bytes -= self.sizes.pop(key, 0)

    def clear(self):
        with self.lock:
            self.entries.clear()
            self.sizes.clear()
            self._watch.clear()
            self._dead.clear()
            self.bytes = 0

    def info(self):
        return {"entries": len(self.entries), "limit": self.limit, "bytes": self.bytes,
                "byte_limit": self.byte_limit, "hits": self.hits, "misses": self.misses,
                "doc": self.doc}


class RepeatCache(Cache):
    """What eager transforms compile for work that repeats: a key is
    counted until it has been seen `after` times; then `build()` makes the
    value (or None: declined) and returns `(value, compile)`, where
    `compile()` compiles the value's program and returns its size in bytes
    (or None when there is nothing to compile). With `BACKGROUND` both the
    build (staging) and the compilation run on the compile thread, and `get`
    returns None until they are done; the uncached path runs meanwhile.
    `build` must therefore not depend on the calling thread's state (the
    interpreter stack, grad mode): it stages from avals and parameters."""

    def __init__(self, name, after, limit, byte_limit=None, count_limit=4096, stale_after=None,
                 stale_calls=None, priority=None, doc=""):
        super().__init__(name, limit, byte_limit, doc=doc)
        self.after = after
        # builds that compile a program wait for those that only stage
        self.priority = COMPILING if priority is None else priority
        self.counts = collections.OrderedDict()  # key -> times seen (LRU)
        self.count_limit = count_limit
        self.pending = {}  # key -> Future of (value, bytes)
        # Dropping stale work: a pending build whose key has not been asked
        # for in the last `stale_after` lookups of this cache, or during the
        # last `stale_calls` transform calls (`calls_begun`), when the compile
        # thread reaches it is not built (see `_STALE`).
        self.stale_after = stale_after
        self.stale_calls = stale_calls
        self.tick = 0  # lookups that found no value
        self.asked = {}  # pending key -> (tick, calls_begun) of its latest lookup
        self.held = {}  # key held back by `get(hold=True)` -> calls_begun then

    def get(self, key, build, hold=False):
        """The built value for `key` under the JAX options in force, or None;
        raises TypeError when the key is not hashable. With `hold`, a key
        seen often enough is built only once it is still met `HOLD_CALLS`
        transform calls after the first held sighting, or at a sighting
        without `hold` (see `HOLD_CALLS`)."""
        key = (key, options_id())  # NOTE [JAX options off the calling thread]
        value = self.entries.get(key, _MISSING)
        if value is not _MISSING:
            if len(self.entries) > self.half or self.bytes > self.half_bytes:  # see `half`
                with self.lock:  # NOTE [caches shared between threads]
                    try:
                        self.entries.move_to_end(key)
                    except KeyError:  # evicted meanwhile by another thread
                        pass
            return value
        self.tick += 1
        if self.pending:
            if not self.tick & 63:
                self._collect()
            waiting = self.pending.get(key)
            if waiting is not None:
                if self.stale_after is not None:
                    self.asked[key] = (self.tick, calls_begun)
                return self._finish(key, waiting)
        counts = self.counts
        seen = counts.get(key, 0)
        if seen < self.after:
            stored = weak_key_part(key)
            with self.lock:  # NOTE [caches shared between threads]
                counts[stored] = seen + 1
                counts.move_to_end(stored)
                if len(counts) > self.count_limit:
                    counts.popitem(last=False)
            return None
        if hold and BACKGROUND:  # see `HOLD_CALLS`
            held = self.held
            first = held.get(key)
            if first is None:
                first = calls_begun
                with self.lock:
                    held[weak_key_part(key)] = first
                    if len(held) > self.count_limit:
                        held.pop(next(iter(held)))
            if calls_begun - first < HOLD_CALLS:
                return None
        with self.lock:
            counts.pop(key, None)
            self.held.pop(key, None)
        if not BACKGROUND:
            value, compile_fn = build()
            self.put(key, value, 0 if value is None or compile_fn is None
                     else _compiled_size(compile_fn))
            return value
        stored = weak_key_part(key)
        if self.stale_after is None:
            job = lambda: _build_and_compile(build)  # noqa: E731
        else:
            self.asked[stored] = (self.tick, calls_begun)

            def job():
                tick, call = self.asked.get(stored, (self.tick, calls_begun))
                if self.tick - tick > self.stale_after or (
                        self.stale_calls is not None and calls_begun - call > self.stale_calls):
                    # not asked for again: nothing would ever collect it
                    self.pending.pop(stored, None)
                    self.asked.pop(stored, None)
                    return _STALE
                return _build_and_compile(build)
        self.pending[stored] = _submit(job, self.priority)
        return None

    def declined(self, key):
        """Whether the build for `key` (under the JAX options in force)
        ran and gave None."""
        return self.entries.get((key, options_id()), _MISSING) is None

    def _collect(self):
        """Move every finished build into the cache (bounded like any entry),
        also those whose key is not asked for again: a build's program is
        never held outside the bounds."""
        for key, future in list(self.pending.items()):
            if future.done():
                self._finish(key, future)

    def _finish(self, key, future):
        if not future.done():
            return None
        self.pending.pop(key, None)
        self.asked.pop(key, None)
        try:
            result = future.result()
        except Exception:  # noqa: BLE001 - it did not build: stay uncached
            result = None, 0
        if result is _STALE:  # counted again from the start if it comes back
            return None
        value, nbytes = result
        self.put(key, value, nbytes)
        return value

    def clear(self):
        super().clear()
        with self.lock:
            self.counts.clear()
            self.held.clear()
        self.pending.clear()
        self.asked.clear()

    def info(self):
        info = {**super().info(), "counted": len(self.counts), "pending": len(self.pending),
                "after": self.after}
        del info["hits"], info["misses"]  # not counted on this hot path
        return info


# A pending build found stale when the compile thread reached it. While the
# thread is behind (warming up a workload whose calls force many flushes,
# MAML's), the deferred queue's structures change call by call as steps land:
# a structure met twice is submitted, and by the time its turn comes the
# calls may have moved on to the structure the landed steps give. Compiling
# those would keep the thread behind (each new structure is met twice while
# it waits) and keep programs no call runs.
_STALE = (None, 0)

# Held back while steps are staged. A structure built of steps (the deferred
# queue's) may be met twice within one call while the steps it is made of
# are still being staged: at a new batch size, the second call's two hidden
# layers each flushed the same two batched steps, because the fused step of
# the `tanh` after them was not staged yet. Compiled, that program served
# no later call (the third call's queue already held the fused steps) and
# cost a compilation and its memory at every new size. So a lookup made
# while a staging build is waiting or running (`staging()`) passes `hold`:
# the key is built at the next sighting with no staging in flight, or
# once it is still met `HOLD_CALLS` transform calls after it was first held
# (a loop whose calls each stage something new is not kept from its
# programs).
HOLD_CALLS = 2


def _build_and_compile(build):
    value, compile_fn = build()
    if value is None or compile_fn is None:
        return value, 0
    return value, compile_fn() or 0


def _compiled_size(compile_fn):
    try:
        return compile_fn() or 0
    except Exception:  # noqa: BLE001 - the call itself will raise if it must
        return 0


_executor = None
_executor_lock = threading.Lock()


# While the compile thread has work, the interpreter's switch interval is
# `SWITCH_INTERVAL` (Python's default is 5 ms): each time the calling thread
# waits without the GIL (an XLA dispatch, a block_until_ready) the compile
# thread's Python (staging, tracing) takes it, and the caller would wait up
# to a whole interval to get it back. The user's interval is restored when
# the queue empties.
SWITCH_INTERVAL = 0.0005
_outstanding = 0
_saved_interval = None
submitted = 0  # jobs ever handed to the compile thread (tests wait for it to stop growing)

# A shorter interval is not enough: while a call runs, the compile thread's
# Python still took most of the GIL (measured: a 10 ms lowering made a 2.5 ms
# MLP call take 15-24 ms in a tight loop, with the interval at 0.5 ms or
# 0.2 ms). So, while another thread is inside a transform, the compile
# thread's own Python yields: a trace function (called at each Python
# function call it makes) sleeps `YIELD_S` once `SLICE_S` of running has
# passed, and the caller keeps at least two thirds of the time. A long call
# into C (XLA's compile, which releases the GIL; a few MLIR calls, which do
# not) is not cut. A sleep waits for nothing, so it cannot deadlock: a lock
# the thread holds across one (functx.jit's cache, one of JAX's) only delays
# a waiter by the sleep, as a switch of the GIL would. Not done where a
# tracer is already set on the thread (a debugger, coverage), nor for a job
# begun while no call has run for `CALLS_GOING_S` (a pause between notebook
# cells: the trace function doubles the time of the thread's own Python).
# From Python 3.12 on (`YIELD_BY_TRACE` false) a trace function set in any
# thread makes the interpreter instrument the code every thread runs (a
# Python loop on the calling thread ran 2.0x slower on 3.13 while another
# thread merely had one set; 3.11: no change), so there the yields come
# from `sys.monitoring` events on a few functions instead
# (`_monitor_per_equation`). XLA's compile itself runs on XLA's own
# threads and still shares the cores with the caller (benchmarks/RESULTS.md:
# a lower scheduling priority for the compile thread changed nothing, XLA's
# threads do not inherit it).
SLICE_S = 0.0005
YIELD_S = 0.001
YIELD_BY_TRACE = sys.version_info < (3, 12)
CALLS_GOING_S = 0.1
yields = 0  # sleeps taken by the compile thread so far
_slice_start = 0.0


def _maybe_yield(busy):
    """On the compile thread, while another thread is inside a transform
    (`busy`: core.busy): sleep `YIELD_S` once `SLICE_S` has passed since
    the last sleep."""
    global yields, _slice_start
    n = len(busy)
    if n and (n > 1 or compile_thread not in busy):
        now = time.perf_counter()
        if now - _slice_start > SLICE_S:
            yields += 1
            time.sleep(YIELD_S)
            _slice_start = time.perf_counter()


def _yielding():
    """The trace function of the compile thread while it runs a job."""
    from .core import busy

    maybe_yield = _maybe_yield

    def trace(frame, event, arg):
        if busy:  # else nobody to yield to: the cheap case, checked inline
            maybe_yield(busy)

    return trace


# From Python 3.12 on: `sys.monitoring` events on the functions that JAX's
# lowering and tracing, and functx's staging, call once per equation (only
# those code objects are instrumented, so every other function runs as
# before on every thread); the callback yields on the compile thread and
# returns at once on any other. A monitoring tool id is taken only if one
# is free (debuggers, coverage and profilers use theirs).
_PER_EQUATION = (
    ("jax._src.interpreters.mlir", ("lower_per_platform", "jaxpr_subcomp")),
    ("jax._src.interpreters.partial_eval", ("DynamicJaxprTrace.default_process_primitive",)),
    ("functx.interpreters.staging", ("eval_graph",)),
)
_monitoring = None  # the tool id, once taken


def _monitor_per_equation():
    """Start the per-equation events (Python 3.12 on); returns whether
    they run."""
    global _monitoring
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return False
    if _monitoring is not None:
        return True
    tool = next((i for i in (4, 3) if mon.get_tool(i) is None), None)
    if tool is None:
        return False
    import importlib

    codes = []
    for module, names in _PER_EQUATION:
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        for name in names:
            fn = obj
            for part in name.split("."):
                fn = getattr(fn, part, None)
            code = getattr(fn, "__code__", None)
            if code is not None:
                codes.append(code)
    if not codes:
        return False
    from .core import busy

    me = threading.get_ident()

    def on_start(code, offset):
        if threading.get_ident() == me:
            try:
                _maybe_yield(busy)
            except Exception:  # noqa: BLE001 - never into JAX's lowering (interpreter exit)
                pass

    mon.use_tool_id(tool, "functx compile thread")
    mon.register_callback(tool, mon.events.PY_START, on_start)
    for code in codes:
        mon.set_local_events(tool, code, mon.events.PY_START)
    _monitoring = tool
    return True


class _CompileThread:
    """The one background thread: runs submitted jobs by priority (lower
    first: the builds that only stage, which change what the calls run,
    before XLA compilations of programs), then in order of submission. At
    interpreter exit the jobs not started are cancelled and the thread ends
    after the one it is running."""

    def __init__(self):
        import concurrent.futures
        import heapq
        import itertools

        self._future = concurrent.futures.Future
        self._push, self._pop = heapq.heappush, heapq.heappop
        self._order = itertools.count()
        self._heap = []
        self._cv = threading.Condition()
        self.staging_jobs = 0  # jobs of priority STAGING submitted and not finished
        self._stopped = False
        register = getattr(threading, "_register_atexit", None)
        self._thread = threading.Thread(target=self._run, name="functx-compile",
                                        daemon=register is None)
        self._thread.start()
        if register is not None:  # before the interpreter joins the thread
            register(self._stop)

    def submit(self, fn, priority):
        future = self._future()
        order = next(self._order)
        with self._cv:
            # compilations newest first (see `COMPILING`), the rest in order
            self._push(self._heap, (priority, -order if priority == COMPILING else order,
                                    future, fn))
            if priority == STAGING:
                self.staging_jobs += 1
            self._cv.notify()
        return future

    def _stop(self):
        with self._cv:
            self._stopped = True
            for _, _, future, _ in self._heap:
                future.cancel()
            self._heap.clear()
            self.staging_jobs = 0
            self._cv.notify()

    def _run(self):
        global compile_thread
        compile_thread = threading.get_ident()
        if not YIELD_BY_TRACE:
            try:
                _monitor_per_equation()
            except Exception:  # noqa: BLE001 - only a courtesy to the calls: go on without
                pass
        compiled = False  # a compilation ran since the heap was last released
        while True:
            if idle_collection.due():
                idle_collection.run()
            with self._cv:
                while not self._heap and not self._stopped:
                    if not idle_collection.armed():
                        # the calls' allocations arm it: look again now and then
                        self._cv.wait(idle_collection.POLL_S if idle_collection.on else None)
                        continue
                    self._cv.wait(idle_collection.QUIET_S)
                    if idle_collection.due():
                        break
                if self._stopped:
                    return
                if not self._heap:
                    continue
                priority, _, future, fn = self._pop(self._heap)
            compiled = compiled or priority == COMPILING
            run = future.set_running_or_notify_cancel()
            result = error = None
            if run:
                try:
                    result = fn()
                except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                    error = e
            if priority == STAGING:
                with self._cv:
                    self.staging_jobs -= 1
            if compiled and not self._heap:  # before `wait_for_compiles` returns
                compiled = release_heap()
            if run:
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            result = error = None


# NOTE [the compile thread's heap]
# XLA's compilation allocates tens of megabytes that it frees when done
# (LLVM's and XLA's passes; the program keeps a few). Freed, they stay in
# the allocator's heap of the thread that compiled, and glibc returns a
# thread's heap to the system only from its top: the compile thread's
# heaps, where little else is allocated, kept 5-20 MB per queue program
# compiled at a new batch size (benchmarks/batch_sizes.py, RSS after the
# compile against after `malloc_trim`). JAX compiles on the calling thread,
# whose main heap glibc trims as it frees. So once the compile thread has
# compiled and has nothing left to do, it asks glibc to return the free
# pages of every heap (`malloc_trim(0)`: a walk over the free lists, 5-14
# ms on the 2-core VM, without the GIL; a tight loop's warm-up leaves the
# thread idle about once). Elsewhere (another C library) nothing is done.
def _heap_trimmer():
    """glibc's `malloc_trim`, from the symbols already loaded (no search for
    the library); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has none)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_trim = _heap_trimmer()
heap_releases = [0, 0.0]  # times the compile thread released its heap, seconds spent


def release_heap():
    """Return the allocator's free pages to the system (NOTE [the compile
    thread's heap]); nothing without glibc's `malloc_trim`. Returns False
    (nothing compiled since)."""
    if _trim is not None:
        t0 = time.perf_counter()
        _trim(0)
        heap_releases[0] += 1
        heap_releases[1] += time.perf_counter() - t0
    return False


def _calls_running():
    """Whether a thread other than this one is inside a transform."""
    from .core import busy

    me = threading.get_ident()
    return any(t != me for t in list(busy))


# NOTE [full collections between calls]
# CPython's cyclic garbage collector runs a full collection once it has
# counted `threshold2` (10) collections of the younger generations since the
# last full one and the objects moved into the oldest generation since then
# exceed a quarter of those it kept. A full collection walks every tracked
# object holding the GIL: 50-100 ms on the 2-core test machine once a
# process holds JAX, functx and a warm-up's caches (170k objects after 20
# MAML calls). Eager warm-ups fill caches (staged graphs, jaxprs, programs),
# so one lands inside a call every few calls, on whichever thread allocated
# last (the calling thread, or the compile thread, which holds the GIL all
# the while): in MAML with 0.2 s between calls, call 11 took 150 ms between
# calls of 60 ms, its excess a full collection of 87-105 ms.
# So the compile thread runs that collection itself when it is near and
# the calls are quiet: between its jobs, or polling every `POLL_S` while it
# has none, once no call is running and none has ended in the last
# `QUIET_S` (a pause between notebook cells). Near: CPython has counted half
# the younger collections it waits for, and the heap has grown since the
# last full collection by `NEAR` of the quarter that triggers it (the heap
# measured by pymalloc's allocated blocks, 20 us to read, where counting the
# oldest generation's objects walks them). Garbage is collected a little
# earlier, while nothing waits, and not more often (two test files ran 15
# full collections with it and 15 without; collecting on the count alone
# made 22). Calls in a tight loop leave no quiet time, and nothing changes
# there. Importing JAX and functx leaves the next full collection overdue by
# CPython's count (JAX's import ran the last ones, on a far smaller heap):
# left alone it lands in the first call (40-80 ms of the rejit first call
# in benchmarks/first_calls.py); so when it is, the import starts a thread
# that runs it in the quiet before that call (between a notebook's cells,
# or while a script builds its inputs) and then ends. Off where the
# collector is disabled or its third threshold is 0, and on Python 3.14 and
# later, whose incremental collector does not pause for the whole heap.
class _IdleCollection:
    QUIET_S = 0.03
    POLL_S = 0.25
    # collect once the heap has grown by this fraction of CPython's trigger
    NEAR = 0.6

    def __init__(self):
        import gc

        self.gc = gc
        self.on = sys.version_info < (3, 14) and sys.implementation.name == "cpython"
        self.runs = 0  # full collections run here
        self.base = sys.getallocatedblocks()  # the heap after the last full collection
        self.seen = False  # a full collection has ended since functx was imported
        if self.on:
            gc.callbacks.append(self._observe)

    def _observe(self, phase, info):
        if info["generation"] == 2 and phase == "stop":
            self.base = sys.getallocatedblocks()
            self.seen = True

    def armed(self):
        """A full collection is near: CPython has counted half the younger
        collections it waits for, and the heap (pymalloc's blocks, a cheap
        stand-in for the objects CPython counts) has grown by `NEAR` of the
        quarter that triggers it."""
        gc = self.gc
        if not self.on or not gc.isenabled():
            return False
        threshold = gc.get_threshold()[2]
        count = gc.get_count()[2]
        if threshold <= 0 or count < max(1, threshold // 2):
            return False
        if not self.seen and count >= threshold:
            # overdue when functx was imported: the heap at CPython's last
            # full collection (during JAX's import) is not known here
            return True
        return sys.getallocatedblocks() - self.base >= self.NEAR * self.base / 4

    def due(self):
        """Armed, and the calls quiet: none running, none ended in the
        last `QUIET_S` seconds."""
        return (self.armed() and time.perf_counter() - last_call_end >= self.QUIET_S
                and not _calls_running())

    def run(self):
        self.gc.collect()
        self.runs += 1


idle_collection = _IdleCollection()


def collect_if_overdue():
    """Called at the end of functx's import: when the process's next full
    collection is already overdue (NOTE [full collections between calls]),
    a short-lived thread runs it while no call is running, rather than
    CPython inside the first call. The thread ends once it has (or CPython
    has), so importing functx leaves no thread behind."""
    if idle_collection.armed():
        threading.Thread(target=_collect_when_quiet, name="functx-collect", daemon=True).start()


def _collect_when_quiet(give_up_s=10.0):
    deadline = time.perf_counter() + give_up_s  # calls running all the while: leave it to CPython
    while idle_collection.armed() and time.perf_counter() < deadline:
        if idle_collection.due():
            idle_collection.run()
            return
        time.sleep(idle_collection.QUIET_S)


# Priorities of the compile thread's jobs. Builds that stage run in the
# order they were submitted; compilations of programs newest first: while the
# thread is behind (a warm-up, whose queue structures change call by call as
# steps land), the newest structure met twice is the one the calls are
# running now, and the older ones are likely stale by the time their turn
# comes (measured: the ensemble of benchmarks/run.py compiled its lasting
# program at its 75th call, after nine programs of structures it had left).
STAGING, COMPILING, LAST = 0, 1, 2

# Transform calls begun at the top of a thread's stack, on any thread but
# the compile thread (core.py's `new_interpreter` counts them; the compile
# thread's staging is not a call): the clock of `RepeatCache(stale_calls=)`.
calls_begun = 0
compile_thread = None  # its thread id, once started
last_call_end = 0.0  # time.perf_counter() when a thread's outermost transform call last returned


def _submit(compile_fn, priority=COMPILING):
    global _executor, _outstanding, _saved_interval, submitted
    options = _thread_options()  # NOTE [JAX options off the calling thread]
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = _CompileThread()
    with _executor_lock:
        _outstanding += 1
        submitted += 1
        if _saved_interval is None and sys.getswitchinterval() > SWITCH_INTERVAL:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL)
    return _executor.submit(lambda: _counted(compile_fn, options), priority)


def staging():
    """Whether a build that stages (a fused or batched step, a staged
    backward pass, a graph derived from a call) is waiting for the compile
    thread or running on it: the steps the calls queue are about to change
    (see `HOLD_CALLS`)."""
    return getattr(_executor, "staging_jobs", 0) > 0


def submit(fn, priority=STAGING):
    """Run `fn()` on the compile thread (NOTE [bounded caches]); returns its
    Future."""
    return _submit(fn, priority)


# The compile thread starts a job only when no other thread is inside a
# transform, or after waiting `MAX_WAIT` seconds for that: its Python
# (staging, tracing) would otherwise take turns with a call in progress.
MAX_WAIT = 0.03


def wait_for_idle():
    """Wait (at most `MAX_WAIT` seconds) until no other thread is inside a
    transform; returns whether none is."""
    deadline = time.perf_counter() + MAX_WAIT
    while _calls_running():
        if time.perf_counter() >= deadline:
            return False
        time.sleep(0.0005)
    return True


def _counted(compile_fn, options=()):
    global _outstanding, _saved_interval
    trace = None
    if options:
        compile_fn = functools.partial(_entered, options, compile_fn)
    try:
        idle = wait_for_idle()
        if (YIELD_BY_TRACE and sys.gettrace() is None
                and (not idle or time.perf_counter() - last_call_end < CALLS_GOING_S)):
            # calls are running or just ran (a loop): yield to them; a trace
            # function makes all of this thread's Python about 2x slower,
            # so a job begun in a pause (a notebook's) goes without
            trace = _yielding()
            sys.settrace(trace)
        return compile_fn()
    finally:
        if trace:
            sys.settrace(None)
        with _executor_lock:
            _outstanding -= 1
            if _outstanding == 0 and _saved_interval is not None:
                if sys.getswitchinterval() == SWITCH_INTERVAL:  # unless changed since
                    sys.setswitchinterval(_saved_interval)
                _saved_interval = None


def _jax_config():
    from jax._src import config

    return config


def _thread_options():
    """The JAX options the calling thread has set for itself (its entered
    context managers): `(option, value)` pairs."""
    config = _jax_config()
    unset = config.config_ext.unset
    found = []
    for option in list(config.config_states.values()):
        value = option.get_local()
        if value is not unset:
            found.append((option, value))
    return tuple(found)


def _entered(options, fn):
    """`fn()` with `options` (from `_thread_options`) set for this thread, as
    their context managers set them; then the thread's own values again."""
    saved = []
    try:
        for option, value in options:
            saved.append((option, option.swap_local(value)))
            hook = getattr(option, "_update_thread_local_hook", None)
            if hook:
                hook(value)
        return fn()
    finally:
        unset = _jax_config().config_ext.unset
        for option, value in reversed(saved):
            option.set_local(value)
            hook = getattr(option, "_update_thread_local_hook", None)
            if hook:
                hook(None if value is unset else value)


_options_ids = {}  # trace_context() -> its number (few: one per distinct context)
_options_last = (None, 0)  # the latest (trace_context(), number) looked up
_trace_context = None


def options_id():
    """A number standing for the JAX options in force on this thread
    (`config.trace_context()`, what jax.jit keys its caches on): equal
    numbers, equal options (NOTE [JAX options off the calling thread])."""
    global _options_last, _trace_context
    if _trace_context is None:
        _trace_context = _jax_config().trace_context
    context = _trace_context()
    last = _options_last
    if context == last[0]:
        return last[1]
    found = _options_ids.get(context)
    if found is None:
        if len(_options_ids) >= 4096:  # a context made anew each call: numbers stay unique
            _options_ids.clear()
        found = _options_ids[context] = next(_options_numbers)
    _options_last = (context, found)
    return found


_options_numbers = itertools.count()


def wait_for_compiles():
    """Block until the background compilations submitted so far are done
    (for tests and benchmarks that want the steady state at once)."""
    if _executor is not None:
        _executor.submit(lambda: None, LAST).result()


# Host memory one small compiled program holds beyond its generated code
# (the executable, its HLO module and buffer assignment, JAX's records of
# it): measured about 1.7 MB per eager step on XLA:CPU (jax 0.10), where
# XLA reports no generated code size at all. Counted for every program, so
# the byte bounds hold in memory a process actually uses.
PROGRAM_BYTES = 1 << 20


def program_size(compiled):
    """The bytes a compiled program is counted for: its generated code as
    XLA reports it, at least `PROGRAM_BYTES`."""
    try:
        analysis = compiled.memory_analysis()
        code = int(getattr(analysis, "generated_code_size_in_bytes", 0) or 0)
    except Exception:  # noqa: BLE001 - backends without a memory analysis
        code = 0
    return max(code, PROGRAM_BYTES)


def clear_caches():
    """Empty every functx cache (compiled eager steps, per-primitive
    programs, lifted and jitted programs). Like `jax.clear_caches()`, for
    functx's own caches; the next calls stage and compile again."""
    for cache in list(_REGISTRY.values()):
        cache.clear()
    for hook in _CLEAR_HOOKS:
        hook()


_CLEAR_HOOKS = []  # extra clear functions of caches kept elsewhere
_INFO_HOOKS = {}  # name -> function returning an info dict


def cache_info():
    """Per cache: entries, its bound, bytes held (compiled code) and its
    bound, hits and misses, and for the caches of repeated work the keys
    still being counted and the programs still compiling."""
    info = {name: cache.info() for name, cache in _REGISTRY.items()}
    for name, fn in _INFO_HOOKS.items():
        info[name] = fn()
    return info


_COMPILE_HOOKS = []  # functions called after each XLA compilation JAX reports


def on_compile(hook):
    """Call `hook()` after every XLA compilation JAX reports (any thread,
    any program; it must be quick and take no lock JAX may hold)."""
    if not _COMPILE_HOOKS:
        import jax

        jax.monitoring.register_event_duration_secs_listener(_compiled)
    _COMPILE_HOOKS.append(hook)


def _compiled(event, secs, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        for hook in _COMPILE_HOOKS:
            hook()


def register(name, clear, info):
    """Register a cache kept outside this module (a dict on a wrapper, an
    lru_cache) with its clear and info functions."""
    _CLEAR_HOOKS.append(clear)
    _INFO_HOOKS[name] = info
