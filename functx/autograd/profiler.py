"""functx.autograd.profiler: per-primitive timings of eager execution, with
the interface of `torch.autograd.profiler` (SPEC section 4).

    with functx.autograd.profiler.profile(record_shapes=True) as prof:
        with functx.autograd.profiler.record_function("step"):
            functx.grad(loss)(params, batch)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")   # open in chrome://tracing or Perfetto

NOTE [what the profiler measures]
functx does its eager work in a few places: `core.bind` running a primitive
on JAX values (the eval interpreter at the bottom of the stack), the
compiled per-primitive steps of eager reverse mode and vmap
(interpreters/reverse.py, interpreters/batching.py), and the backward pass
of a recorded linear map. Each of those checks the module-level
`functx.core.eager_hook` once: it is None unless a `profile` is active, so
code that is not profiled pays one global lookup per dispatch and nothing
else. While a profile is active the hook runs the dispatch between two
`time.perf_counter_ns()` readings and waits for its outputs
(`block_until_ready`), so a time is the real cost of that dispatch, not of
JAX's asynchronous enqueue. (Waiting serialises work JAX would otherwise
overlap: a profiled run is a little slower than an unprofiled one.)

Each event is named by the transforms active when the primitive ran, outer
first, then the primitive: `grad/vmap/dot_general` is a `dot_general`
dispatched under a vmap inside a grad. The backward pass of a reverse-mode
transform is a range event `backward` (prefixed by the transforms around it)
and the primitives it runs are labelled `.../backward/<primitive>`; once a
backward pass of the same structure has been compiled it is a single
dispatch and shows up as the self time of `backward`. `record_function`
ranges are events of their own that enclose everything run inside them;
"Self CPU" of any event is its time minus that of the events it encloses.

NOTE [compile time in the profiler]
A primitive met for the first time with new shapes (or a new fused step,
batched step or backward pass) is traced, lowered and compiled by JAX
inside its dispatch: tens to hundreds of milliseconds once, against
microseconds per call afterwards. That time is not the op's: JAX reports
each step through `jax.monitoring` with its duration, and functx's one
listener (NOTE [compile log] in functx/config.py) hands those seconds, while
a profile records, to `_charge_compile`, which adds them to the innermost
open event of the thread that compiled. When an event closes, its compile
seconds (its own plus those of the events it encloses) are subtracted from
its CPU total, and its own from its self CPU time; they are kept as
`compile_time` (total) and `self_compile_time` on the event and summed on
`FunctionEventAvg`s. `table()` shows a "Compile" column when there was any,
and the table's last line gives the compile total whenever it is not zero.
Compile time with no event open is kept apart on the profile:
`compile_time_outside_events` (a profiled thread compiling between
dispatches, e.g. functx building a fused step before it dispatches it) and
`background_compile_time` (functx's background compile thread, which
delays no call; functx/caches.py); the table's last line names both.
What remains in the CPU times of a first call is functx's own Python work
of building a step (its interpreters running under JAX's tracer are part of
JAX's tracing, hence of compile time) and the run itself. A trace-time
compile under `jax.jit` charges the enclosing `record_function` range, the
event open while JAX compiled.

Under `functx.jit`, `jax.jit` or any other JAX transform around functx
there is no eager execution: primitives run on JAX tracers, once, while the
program is traced. The profiler records no primitive event then (a trace
time is not an execution time); `record_function` ranges are still recorded
with their wall-clock time. To profile compiled programs use
`jax.profiler` (`jax.profiler.trace(log_dir)`, viewed in TensorBoard or
Perfetto).

The profile is process-wide: dispatches on every thread are recorded while
it is active, each event with its thread id; only one profile may be
active at a time. Times are CPU wall-clock times of the calling thread;
there are no device (CUDA) timings, no memory or FLOP counts.
"""

import contextlib
import functools
import json
import os
import threading
import time

import jax

from .. import config as _config
from .. import core as _core
from ..errors import FunctxRuntimeError, FunctxValueError

__all__ = ["profile", "record_function", "EventList", "FunctionEvent", "FunctionEventAvg"]

_JaxTracer = jax.core.Tracer
_perf_ns = time.perf_counter_ns

_active = None  # the profile being recorded, or None


# --------------------------------------------------------------------------
# Events


class FunctionEvent:
    """One recorded event: a primitive dispatch or a range. Times are in
    microseconds, `start_us`/`end_us` relative to the start of the profile
    (wall clock, compile time included). `cpu_time_total` and
    `self_cpu_time_total` exclude the JAX compile time spent inside the
    event, which is `compile_time` (the event's and its children's) and
    `self_compile_time` (NOTE [compile time in the profiler])."""

    __slots__ = ("name", "start_us", "end_us", "self_cpu_time_total", "input_shapes",
                 "thread", "kind", "depth", "args", "cpu_time_total", "compile_time",
                 "self_compile_time")

    def __repr__(self):
        return (f"<FunctionEvent {self.name} start={self.start_us:.3f}us "
                f"cpu_time_total={self.cpu_time_total:.3f}us "
                f"self_cpu_time_total={self.self_cpu_time_total:.3f}us "
                f"compile_time={self.compile_time:.3f}us>")


class _Frame:
    """An event being recorded: what encloses it is the frame below it on
    the thread's stack."""

    __slots__ = ("name", "start", "children_ns", "depth", "compile_ns", "children_compile_ns")


class _Local(threading.local):
    def __init__(self):
        self.frames = []  # open _Frames, innermost last
        self.segments = []  # (interpreter-stack depth, label) of open backward ranges


_local = _Local()


def _charge_compile(secs):
    """`functx.config.profiler_sink` while a profile records: JAX spent
    `secs` tracing, lowering or compiling a program on this thread; charge
    them to the innermost open event (NOTE [compile time in the profiler])."""
    ns = int(secs * 1e9)
    frames = _local.frames
    if frames:
        frames[-1].compile_ns += ns
        return
    rec = _active
    if rec is not None:
        background = threading.current_thread().name.startswith("functx-compile")
        with rec.lock:
            if background:
                rec.background_compile_ns += ns
            else:
                rec.outside_compile_ns += ns


def _label(what):
    """`what` prefixed by the transforms (and backward ranges) active now."""
    stack = _core.interpreter_stack()
    segments = _local.segments
    if not stack and not segments:
        return what
    parts = []
    seg = iter(segments)
    nxt = next(seg, None)
    for i, interp in enumerate(stack):
        while nxt is not None and nxt[0] <= i:
            parts.append(nxt[1])
            nxt = next(seg, None)
        parts.append(interp.transform)
    while nxt is not None:
        parts.append(nxt[1])
        nxt = next(seg, None)
    parts.append(what)
    return "/".join(parts)


def _shape_of(x):
    shape = getattr(x, "shape", None)
    if shape is None:
        return []
    try:
        return [int(d) for d in shape]
    except TypeError:
        return []


def _leaves(x, out):
    if type(x) in (list, tuple):
        for y in x:
            _leaves(y, out)
    else:
        out.append(x)
    return out


class _Recorder:
    """The state of an active profile, shared by all threads."""

    def __init__(self, record_shapes):
        self.record_shapes = record_shapes
        self.events = []
        self.outside_compile_ns = 0  # compiled on a calling thread with no event open
        self.background_compile_ns = 0  # compiled on functx's background compile thread
        self.t0 = _perf_ns()
        self.lock = threading.Lock()

    def open(self, name):
        frames = _local.frames
        f = _Frame()
        f.name = name
        f.children_ns = 0
        f.compile_ns = 0
        f.children_compile_ns = 0
        f.depth = len(frames)
        frames.append(f)
        f.start = _perf_ns()
        return f

    def close(self, f, kind, shapes, record=True, args=None):
        end = _perf_ns()
        frames = _local.frames
        frames.pop()
        dur = end - f.start
        if not record:
            # Not an execution (JAX tracing): the enclosing event keeps the
            # time (and compile time) of what this one enclosed as its own.
            if frames:
                parent = frames[-1]
                parent.children_ns += f.children_ns
                parent.compile_ns += f.compile_ns
                parent.children_compile_ns += f.children_compile_ns
            elif f.compile_ns or f.children_compile_ns:
                with self.lock:
                    self.outside_compile_ns += f.compile_ns + f.children_compile_ns
            return
        compile_ns = f.compile_ns + f.children_compile_ns
        if frames:
            frames[-1].children_ns += dur
            frames[-1].children_compile_ns += compile_ns
        e = FunctionEvent()
        e.name = f.name
        e.start_us = (f.start - self.t0) / 1e3
        e.end_us = (end - self.t0) / 1e3
        # JAX measures compile steps with its own clock: clamp at zero.
        e.cpu_time_total = max(dur - compile_ns, 0) / 1e3
        e.self_cpu_time_total = max(dur - f.children_ns - f.compile_ns, 0) / 1e3
        e.compile_time = compile_ns / 1e3
        e.self_compile_time = f.compile_ns / 1e3
        e.input_shapes = shapes
        e.thread = threading.get_ident()
        e.kind = kind
        e.depth = f.depth
        e.args = args
        with self.lock:
            self.events.append(e)

    def dispatch(self, what, fn, args, params=None):
        """The hook (`core.eager_hook`): run `fn(*args, **params)` as a timed
        event; `what` is a Primitive, or a str for a range (`"backward"`)."""
        is_range = type(what) is str
        name = _label(what if is_range else what.name)
        if is_range:
            _local.segments.append((len(_core.interpreter_stack()), what))
        f = self.open(name)
        try:
            out = fn(*args, **params) if params else fn(*args)
            executed = True
            waiting = []
            for leaf in _leaves(out, []):
                if isinstance(leaf, _JaxTracer):
                    executed = False
                    break
                if isinstance(leaf, jax.Array) and not isinstance(leaf, _core.Tracer):
                    waiting.append(leaf)
            if executed and waiting:
                jax.block_until_ready(waiting)
        except BaseException:
            self.close(f, "range" if is_range else "primitive", None, record=False)
            raise
        finally:
            if is_range:
                _local.segments.pop()
        shapes = [_shape_of(a) for a in args] if self.record_shapes and not is_range else []
        self.close(f, "range" if is_range else "primitive", shapes, record=executed)
        return out


# --------------------------------------------------------------------------
# Averages and the table


class FunctionEventAvg:
    """The events of one key summed: `count`, `cpu_time_total`,
    `self_cpu_time_total` and `cpu_time` (the average), in microseconds,
    compile time excluded; `compile_time` and `self_compile_time`, the JAX
    compile time the events spent (NOTE [compile time in the profiler])."""

    __slots__ = ("key", "count", "cpu_time_total", "self_cpu_time_total", "input_shapes",
                 "compile_time", "self_compile_time")

    def __init__(self, key, input_shapes):
        self.key = key
        self.input_shapes = input_shapes
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.compile_time = 0.0
        self.self_compile_time = 0.0

    @property
    def cpu_time(self):
        return self.cpu_time_total / self.count if self.count else 0.0

    def add(self, e):
        self.count += 1
        self.cpu_time_total += e.cpu_time_total
        self.self_cpu_time_total += e.self_cpu_time_total
        self.compile_time += e.compile_time
        self.self_compile_time += e.self_compile_time
        return self

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key} count={self.count} "
                f"cpu_time_total={self.cpu_time_total:.3f}us "
                f"self_cpu_time_total={self.self_cpu_time_total:.3f}us "
                f"compile_time={self.compile_time:.3f}us>")


_SORT_KEYS = ("cpu_time", "cpu_time_total", "self_cpu_time_total", "count", "compile_time")


def _format_time(us):
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _clip(s, width):
    return s if len(s) <= width else s[: max(width - 3, 0)] + "..."


class EventList(list):
    """A list of `FunctionEvent`s or `FunctionEventAvg`s, with torch's
    `table` and `export_chrome_trace`."""

    def __init__(self, items=(), *, self_cpu_time_total=None, show_shapes=False,
                 compile_time_total=None, compile_time_outside_events=0.0,
                 background_compile_time=0.0):
        super().__init__(items)
        self._self_total = self_cpu_time_total
        self._compile_total = compile_time_total
        # Of the profile (NOTE [compile time in the profiler]), for the footer.
        self.compile_time_outside_events = compile_time_outside_events
        self.background_compile_time = background_compile_time
        self._show_shapes = show_shapes  # made by key_averages(group_by_input_shape=True)

    @property
    def self_cpu_time_total(self):
        if self._self_total is not None:
            return self._self_total
        return sum(e.self_cpu_time_total for e in self)

    @property
    def compile_time_total(self):
        """JAX compile time spent inside the events (microseconds), not
        part of their CPU times."""
        if self._compile_total is not None:
            return self._compile_total
        return sum(getattr(e, "self_compile_time", 0.0) for e in self)

    def table(self, sort_by=None, row_limit=100, max_name_column_width=55,
              max_shapes_column_width=80, header=None, top_level_events_only=False,
              show_compile=None):
        """The events as a text table with torch's columns: Name, Self CPU %,
        Self CPU, CPU total %, CPU total, CPU time avg, # of Calls, and
        Input Shapes when shapes were recorded and grouped by. CPU times
        exclude JAX compile time; a "Compile" column (each row's compile
        time, its children's included) comes before "# of Calls" when a row
        has any (`show_compile=None`, the default) or always / never
        (`show_compile=True` / `False`), and the last line names the compile
        total whenever it is not zero. `sort_by`: one of "cpu_time" (the average),
        "cpu_time_total", "self_cpu_time_total", "count", "compile_time"
        (descending), or None to keep the order of first occurrence;
        `row_limit` <= 0 shows every row."""
        rows = list(self)
        if top_level_events_only:
            rows = [e for e in rows if getattr(e, "depth", 0) == 0]
        if sort_by is not None:
            if sort_by not in _SORT_KEYS:
                extra = (" functx records no device times: use jax.profiler for those."
                         if "cuda" in str(sort_by) or "device" in str(sort_by) else "")
                raise FunctxValueError(
                    f"profiler table: unknown sort_by={sort_by!r}; expected one of "
                    f"{', '.join(map(repr, _SORT_KEYS))} or None.{extra}")
            rows.sort(key=lambda e: getattr(e, sort_by), reverse=True)
        if row_limit is not None and row_limit > 0:
            rows = rows[:row_limit]
        if show_compile is None:
            show_compile = any(getattr(e, "compile_time", 0.0) > 0 for e in rows)
        total = self.self_cpu_time_total
        with_shapes = self._show_shapes

        def pct(x):
            return f"{100.0 * x / total:.2f}%" if total > 0 else "0.00%"

        names = [_clip(getattr(e, "key", None) or e.name, max_name_column_width) for e in rows]
        name_w = max([len("Name")] + [len(n) for n in names]) + 2
        cols = ["Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
        if show_compile:
            cols.append("Compile")
        cols.append("# of Calls")
        w = 12
        line_parts = ["-" * name_w] + ["-" * w] * len(cols)
        head = [f"{'Name':>{name_w}}"] + [f"{c:>{w}}" for c in cols]
        if with_shapes:
            shapes = [_clip(str(e.input_shapes), max_shapes_column_width) for e in rows]
            sw = max([len("Input Shapes")] + [len(s) for s in shapes]) + 2
            line_parts.append("-" * sw)
            head.append(f"  {'Input Shapes':<{sw - 2}}")
        sep = "  ".join(line_parts) + "  "
        out = []
        if header is not None:
            out += ["=" * len(sep), header]
        out += [sep, "  ".join(head) + "  ", sep]
        for i, (e, n) in enumerate(zip(rows, names)):
            count = e.count if hasattr(e, "count") else 1
            avg = e.cpu_time_total / count if count else 0.0
            cells = [f"{n:>{name_w}}", f"{pct(e.self_cpu_time_total):>{w}}",
                     f"{_format_time(e.self_cpu_time_total):>{w}}",
                     f"{pct(e.cpu_time_total):>{w}}", f"{_format_time(e.cpu_time_total):>{w}}",
                     f"{_format_time(avg):>{w}}"]
            if show_compile:
                cells.append(f"{_format_time(getattr(e, 'compile_time', 0.0)):>{w}}")
            cells.append(f"{count:>{w}}")
            if with_shapes:
                cells.append(f"  {shapes[i]:<{sw - 2}}")
            out.append("  ".join(cells) + "  ")
        out.append(sep)
        footer = f"Self CPU time total: {_format_time(total)}"
        parts = [(self.compile_time_total, "in events"),
                 (self.compile_time_outside_events, "outside events"),
                 (self.background_compile_time, "in the background")]
        parts = [f"{_format_time(t)} {where}" for t, where in parts if t > 0]
        if parts:
            footer += f"; JAX compile time (not in the CPU times): {', '.join(parts)}"
        out.append(footer)
        return "\n".join(out) + "\n"

    def __str__(self):
        return self.table()


# --------------------------------------------------------------------------
# The public context managers


class profile:
    """Record the eager execution of functx primitives (NOTE [what the
    profiler measures]).

    The arguments have torch's names.

    Args:
      enabled (bool): False makes the context manager do nothing.
      record_shapes (bool): record the shapes of each primitive's inputs (see
        `key_averages(group_by_input_shape=True)` and the chrome trace).
      use_cpu (bool): must stay True (CPU wall-clock times are what is
        recorded).
      use_cuda (bool): not supported (raise if set); use `jax.profiler` for
        device times and memory.
      use_device (str | None): not supported (raise if set); use `jax.profiler`
        for device times and memory.
      profile_memory (bool): not supported (raise if set); use `jax.profiler`
        for device times and memory.
      with_flops (bool): not supported (raise if set); use `jax.profiler` for
        device times and memory.
      with_stack (bool): not supported (raise if set); use `jax.profiler` for
        device times and memory.
      with_modules (bool): not supported (raise if set); use `jax.profiler` for
        device times and memory.

    After the block: `key_averages()`, `table(...)` (`show_compile=True`
    for the "Compile" column), `events()` / `function_events`,
    `self_cpu_time_total`, `compile_time_total`, `total_average()`,
    `export_chrome_trace(path)`. JAX compile time is kept apart from the
    CPU times (NOTE [compile time in the profiler]).
    """

    def __init__(self, enabled=True, *, use_cuda=False, use_device=None, record_shapes=False,
                 with_flops=False, profile_memory=False, with_stack=False, with_modules=False,
                 use_cpu=True):
        unsupported = {"use_cuda": use_cuda, "use_device": use_device,
                       "profile_memory": profile_memory, "with_flops": with_flops,
                       "with_stack": with_stack, "with_modules": with_modules}
        for name, value in unsupported.items():
            if value:
                raise FunctxValueError(
                    f"profiler.profile: {name}={value!r} is not supported; functx's "
                    "profiler records CPU wall-clock times of eager dispatches only. "
                    "Use jax.profiler.trace(log_dir) for device timings and memory.")
        if not use_cpu:
            raise FunctxValueError(
                "profiler.profile: use_cpu=False leaves nothing to record; functx's "
                "profiler measures CPU wall-clock times of eager dispatches.")
        self.enabled = bool(enabled)
        self.record_shapes = bool(record_shapes)
        self.function_events = None
        self._recorder = None
        self._entered = False

    def __enter__(self):
        global _active
        if not self.enabled:
            return self
        if self._entered:
            raise FunctxRuntimeError("profiler.profile: a profile can be entered only once; "
                                     "create a new profile() for another run.")
        if _active is not None or _core.eager_hook is not None:
            raise FunctxRuntimeError(
                "profiler.profile: another profile is already active. Profiles do "
                "not nest: use record_function(name) to mark a region inside one.")
        self._entered = True
        self._recorder = rec = _Recorder(self.record_shapes)
        _active = rec
        _core.eager_hook = rec.dispatch
        _config.profiler_sink = _charge_compile
        return self

    def __exit__(self, *exc):
        global _active
        if not self.enabled or self._recorder is None:
            return False
        rec = self._recorder
        if _active is rec:
            _active = None
            _core.eager_hook = None
            _config.profiler_sink = None
        with rec.lock:
            events = sorted(rec.events, key=lambda e: (e.start_us, -e.end_us))
            outside, background = rec.outside_compile_ns / 1e3, rec.background_compile_ns / 1e3
        self.function_events = EventList(events, compile_time_outside_events=outside,
                                         background_compile_time=background)
        return False

    # -- results -----------------------------------------------------------

    def _check_finished(self, what):
        if self.function_events is None:
            if not self.enabled:
                return EventList()
            raise FunctxRuntimeError(
                f"profiler.profile.{what}: the profile has not finished; call it "
                "after the `with profile() as prof:` block.")
        return self.function_events

    def events(self):
        """Every recorded event, ordered by start time."""
        return self._check_finished("events")

    @property
    def self_cpu_time_total(self):
        """Total self CPU time of all events (microseconds), compile time
        excluded."""
        return self._check_finished("self_cpu_time_total").self_cpu_time_total

    @property
    def compile_time_total(self):
        """JAX compile time spent inside the recorded events (microseconds)."""
        return self._check_finished("compile_time_total").compile_time_total

    @property
    def compile_time_outside_events(self):
        """JAX compile time on a profiled thread while no event was open
        (functx building a fused step before dispatching it), microseconds."""
        return self._check_finished("compile_time_outside_events").compile_time_outside_events

    @property
    def background_compile_time(self):
        """JAX compile time on functx's background compile thread while the
        profile was active (it delays no call), microseconds."""
        return self._check_finished("background_compile_time").background_compile_time

    def key_averages(self, group_by_input_shape=False):
        """Events with the same name (and input shapes, when
        `group_by_input_shape`) summed into `FunctionEventAvg`s."""
        events = self._check_finished("key_averages")
        if group_by_input_shape and not self.record_shapes:
            raise FunctxValueError(
                "profiler.profile.key_averages: group_by_input_shape=True needs "
                "profile(record_shapes=True).")
        groups = {}
        for e in events:
            key = (e.name, str(e.input_shapes)) if group_by_input_shape else e.name
            avg = groups.get(key)
            if avg is None:
                avg = groups[key] = FunctionEventAvg(
                    e.name, e.input_shapes if group_by_input_shape else None)
            avg.add(e)
        return EventList(groups.values(), self_cpu_time_total=events.self_cpu_time_total,
                         show_shapes=group_by_input_shape,
                         compile_time_total=events.compile_time_total,
                         compile_time_outside_events=events.compile_time_outside_events,
                         background_compile_time=events.background_compile_time)

    def total_average(self):
        """All events summed into one `FunctionEventAvg` ("Total")."""
        avg = FunctionEventAvg("Total", None)
        for e in self._check_finished("total_average"):
            avg.add(e)
        return avg

    def table(self, sort_by=None, row_limit=100, **kwargs):
        """`self.key_averages().table(...)`."""
        return self.key_averages().table(sort_by=sort_by, row_limit=row_limit, **kwargs)

    def export_chrome_trace(self, path):
        """Write the events as Chrome trace-event JSON (complete "X" events,
        times in microseconds), readable by chrome://tracing and Perfetto.
        An event's "dur" is its wall-clock time, compile time included (so
        events nest); "args" then carry "compile_us"."""
        events = self._check_finished("export_chrome_trace")
        pid = os.getpid()
        trace = []
        for e in events:
            args = {"kind": e.kind}
            if e.args is not None:
                args["args"] = e.args
            if e.compile_time:
                args["compile_us"] = e.compile_time
            if self.record_shapes and e.kind == "primitive":
                args["Input Shapes"] = e.input_shapes
            trace.append({"name": e.name, "cat": e.kind, "ph": "X", "ts": e.start_us,
                          "dur": e.end_us - e.start_us, "pid": pid, "tid": e.thread, "args": args})
        with open(path, "w") as f:
            json.dump({"traceEvents": trace}, f)

    def __str__(self):
        return self.table()


class record_function(contextlib.ContextDecorator):
    """Mark a range of code as an event of its own, named `name`, enclosing
    the primitives run inside it. A context manager and a decorator; costs
    nothing when no profile is active. `args` (torch's optional string) is
    kept on the event and written to the chrome trace's "args"."""

    def __init__(self, name, args=None):
        if not isinstance(name, str):
            raise FunctxValueError(
                f"profiler.record_function: name must be a str, got {type(name).__name__}.")
        self.name = name
        self.args = args
        self._frames = []

    def __enter__(self):
        rec = _active
        if rec is not None:
            self._frames.append((rec, rec.open(self.name)))
        else:
            self._frames.append(None)
        return self

    def __exit__(self, *exc):
        entry = self._frames.pop()
        if entry is not None:
            rec, f = entry
            if _local.frames and _local.frames[-1] is f:
                rec.close(f, "range", [], args=self.args)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*a, **k):
            with record_function(self.name, self.args):
                return fn(*a, **k)

        return wrapped
