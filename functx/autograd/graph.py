"""functx.autograd.graph: hooks on the values reverse mode saves
(torch.autograd.graph.saved_tensors_hooks, save_on_cpu).

NOTE [saved values]
Reverse mode records, for every primitive applied to a differentiated value,
the linear equations of its derivative on a tape (interpreters/reverse.py).
The arrays those equations hold as constants (`cos(x)` for `sin(x)`, `y`
for `x * y`, an input kept by `functx.checkpoint`, ...) are the *saved
values*: what the backward pass reads. Python scalars that a rule uses
(`2.0` in the derivative of `x ** 2`) are literals, not saved values.

`saved_tensors_hooks(pack_hook, unpack_hook)` follows torch's rule: the
hooks in force when the forward operation runs apply to the values it
saves. Each saved value goes through `pack_hook` once, when it is saved,
and the tape keeps what `pack_hook` returns. Each time the backward pass
(`vjp_fn`, or `linearize`'s `jvp_fn`) runs, every saved value it needs goes
through `unpack_hook`, which must return an array of the original shape;
it is cast back to the saved value's dtype if it comes back in another one
(so a pack hook may store, e.g., a float16 copy). Nested contexts: the
innermost one wins, as in torch.

Under a trace (`functx.jit`, `jax.jit`, or an enclosing functx transform
such as `vmap(grad(f))`) the saved values are traced values: the hooks run
once, while tracing, on those traced values, and what they compute becomes
part of the traced program (like a `jax.checkpoint` policy, and like torch,
whose compiled graphs run the hooks at trace time). A hook's Python side
effects (a counter, a list of saved values) therefore happen once per
trace, not once per call of the compiled function. A hook must then use
operations that work on the traced values (array methods, functx.numpy).
"""

import contextlib
import threading

import jax

from ..core import Tracer, aval_of
from ..errors import FunctxTypeError, FunctxValueError
from ..interpreters import reverse
from ..interpreters.staging import Const, Eqn, Graph

__all__ = ["saved_tensors_hooks", "save_on_cpu", "disable_saved_tensors_hooks"]


class _State(threading.local):
    def __init__(self):
        self.stack = []  # (pack_hook, unpack_hook), innermost last
        self.disabled = None  # message of disable_saved_tensors_hooks


_state = _State()
_active = [0]  # contexts open on any thread (the observer stays registered meanwhile)
_lock = threading.Lock()


class _Packed(Const):
    """A saved value after `pack_hook`: `value` holds what the hook returned,
    `aval` the saved array's aval; `unpack` is the hook to undo it."""

    __slots__ = ("unpack",)

    def __init__(self, packed, aval, unpack):
        self.value = packed
        self.aval = aval
        self.unpack = unpack


def _is_saved_value(v):
    return isinstance(v, (jax.Array, Tracer))


def _pack_recorded(tape, start, prim):
    """Tape observer (NOTE [tape hooks]): pack the values saved by the
    equations just recorded for `prim`."""
    stack = _state.stack
    if not stack:
        return
    pack, unpack = stack[-1]
    eqns = tape.eqns
    packed_any = False
    for i in range(start, len(eqns)):
        eqn = eqns[i]
        inputs = eqn.inputs
        for j, x in enumerate(inputs):
            if type(x) is Const and _is_saved_value(x.value):
                if inputs is eqn.inputs:
                    inputs = list(inputs)
                inputs[j] = _Packed(pack(x.value), x.aval, unpack)
                packed_any = True
        eqn.inputs = inputs
    if packed_any:
        tape.prepare = _unpack_graph


def _unpack_graph(graph):
    """`graph` with every packed saved value replaced by its unpacked value
    (`unpack_hook` runs once per saved value per use of the graph)."""
    eqns = []
    for eqn in graph.eqns:
        if any(type(x) is _Packed for x in eqn.inputs):
            new = Eqn.__new__(type(eqn))
            for cls in type(eqn).__mro__:  # copy every slot (subclasses add some)
                for s in getattr(cls, "__slots__", ()):
                    if hasattr(eqn, s):
                        setattr(new, s, getattr(eqn, s))
            new.inputs = [Const(_unpacked(x, eqn)) if type(x) is _Packed else x
                          for x in eqn.inputs]
            eqn = new
        eqns.append(eqn)
    return Graph(graph.inputs, eqns, graph.outputs)


def _unpacked(x, eqn):
    value = x.unpack(x.value)
    try:
        got = aval_of(value)
    except Exception:
        got = None
    if got is None or got.shape != x.aval.shape:
        raise FunctxValueError(
            f"saved_tensors_hooks: unpack_hook returned "
            f"{got.str_short() if got is not None else type(value).__name__} for a value "
            f"saved as {x.aval.str_short()} (by `{eqn.prim.name}` in the backward "
            "graph). unpack_hook must return an array of the saved value's shape.")
    if got.dtype != x.aval.dtype:
        value = value.astype(x.aval.dtype)
    return value


def _push(pack_hook, unpack_hook):
    if _state.disabled is not None:
        raise FunctxValueError(f"saved_tensors_hooks: {_state.disabled}")
    _state.stack.append((pack_hook, unpack_hook))
    with _lock:
        if _active[0] == 0:
            reverse.tape_observers.append(_pack_recorded)
        _active[0] += 1


def _pop():
    _state.stack.pop()
    with _lock:
        _active[0] -= 1
        if _active[0] == 0:
            reverse.tape_observers.remove(_pack_recorded)


class saved_tensors_hooks:
    """Context manager: pack and unpack hooks for the values reverse mode
    saves (see NOTE [saved values] in this module).

    `pack_hook(array) -> anything` runs once per saved value when the
    forward operation runs inside the context; `unpack_hook(packed) ->
    array` runs when the backward pass reads it, and must return an array
    of the saved value's shape (its dtype is restored if it differs).

    Example:
      >>> def pack(x): return x.astype(jnp.float16)        # halve memory
      >>> def unpack(x): return x                           # cast back for us
      >>> with functx.autograd.graph.saved_tensors_hooks(pack, unpack):
      ...     out, vjp_fn = functx.vjp(f, x)
      >>> vjp_fn(ct)   # uses the float16 copies
    """

    def __init__(self, pack_hook, unpack_hook):
        for name, h in (("pack_hook", pack_hook), ("unpack_hook", unpack_hook)):
            if not callable(h):
                raise FunctxTypeError(
                    f"saved_tensors_hooks(pack_hook, unpack_hook): {name} must be "
                    f"callable, got {type(h).__name__}.")
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self):
        _push(self.pack_hook, self.unpack_hook)
        return self

    def __exit__(self, *exc):
        _pop()
        return False


def _cpu():
    return jax.devices("cpu")[0]


class save_on_cpu(saved_tensors_hooks):
    """Context manager: keep the values reverse mode saves in host memory,
    and move each back to its device when the backward pass reads it
    (torch.autograd.graph.save_on_cpu).

    A concrete array is copied with `jax.device_put` to the CPU device (on a
    CPU-only machine this is a copy on the same device); `pin_memory=True`
    asks for page-locked host memory (`memory_kind="pinned_host"` of the
    array's own device) where the platform offers it, and falls back to the
    CPU device otherwise. A traced value (under `jit`, or an enclosing
    transform) has no buffer to move: it is saved as it is.

    Example:
      >>> with functx.autograd.graph.save_on_cpu():
      ...     loss, vjp_fn = functx.vjp(model_loss, params)
    """

    def __init__(self, pin_memory=False, device_type="cuda"):
        self.pin_memory = bool(pin_memory)
        del device_type  # torch's argument; the device is each array's own

        def pack(x):
            # (functx values are jax.Array instances too: left in place)
            if not isinstance(x, jax.Array) or isinstance(x, (jax.core.Tracer, Tracer)):
                return (None, x)
            devices = x.devices()
            if len(devices) != 1:
                return (None, x)  # sharded over several devices: left in place
            (device,) = devices
            if device.platform == "cpu":
                return (device, jax.device_put(x, device, may_alias=False))
            if self.pin_memory:
                try:
                    host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
                    return (device, jax.device_put(x, host))
                except Exception:  # no pinned host memory on this platform
                    pass
            return (device, jax.device_put(x, _cpu()))

        def unpack(packed):
            device, x = packed
            if device is None:
                return x
            return jax.device_put(x, device)

        super().__init__(pack, unpack)


@contextlib.contextmanager
def disable_saved_tensors_hooks(error_message):
    """Context manager: opening `saved_tensors_hooks` inside raises an error
    with `error_message` (torch.autograd.graph.disable_saved_tensors_hooks)."""
    prev = _state.disabled
    _state.disabled = error_message
    try:
        yield
    finally:
        _state.disabled = prev
