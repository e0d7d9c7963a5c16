"""Snapshots of what a function reads: the key under which a function's
staged form is cached, and the function rebuilt with staged inputs in place
of the arrays it reads. functx.lax looks its loop bodies up this way, and
functx.lift the JAX functions it stages (NOTE [lifted functions keyed by
what they read] in functx/lifting.py).
"""

import dis as _dis
import enum as _enum
import functools as _functools
import sys as _sys
import types as _types
import weakref as _weakref

import jax as _jax
import numpy as _np
from jax import tree_util as _tree

from .core import TRACER_TYPES as _TRACER_TYPES
from .core import _ArrayImpl
from .core import aval_of as _aval_of
from .lifting import _rules_of

_JaxTracer = _jax.core.Tracer

# NOTE [staged bodies: one graph per code and closure]
# A body (scan's `f`, a cond branch, while_loop's functions, ...) is staged
# into a Graph, and every graph derived from it (its jvp, transpose and
# batched forms, NOTE [control flow under transforms] in
# functx/primitives/control.py) and every program compiled from it is cached
# on that graph. So a repeated call costs no staging and no compilation only
# if it finds the *same* graph again. A lambda written inline is a new
# function object on every call, and under a transform it closes over that
# call's tracers, so the graph is looked up by what determines it instead:
#
# * The function's code object (by identity) and a *snapshot* of what the
#   code reads: its closure cells, defaults and the module globals its code
#   (and the code nested in it) names, followed recursively into the Python
#   functions among them (closures, `functools.partial`, bound methods).
# * Arrays met in the snapshot (functx values of enclosing transforms, JAX
#   arrays and tracers, NumPy arrays) are never baked into the graph: the
#   function is staged with a copy of itself whose closure cells, defaults
#   or globals hold staged inputs in their place, so everything computed
#   from them is staged too. The key holds only their shapes and dtypes;
#   each call passes the current arrays as the primitive's operands (the
#   loop constants). A graph therefore never holds a value that may differ
#   on the next call, and nothing it holds belongs to a body the user
#   dropped. Arrays the staged graph does not read are dropped from its
#   inputs (`_drop_unread` in functx/lax.py): a dict of parameters closed over passes only
#   the ones the body uses, as when it is staged as written.
# * Other values are keyed by value when they are immutable (None, bools,
#   numbers, strings, dtypes, tuples of these) and by identity (held
#   weakly where Python allows) when they are modules, library classes or
#   library functions (JAX, NumPy, functx, installed packages).
# * Containers and objects are keyed by what they hold, so that one whose
#   contents changed between calls is staged anew, as JAX's eager loops
#   (which trace a new function every call) see the change:
#   - a pytree (a list, a dict, an Equinox module, a registered dataclass)
#     by its tree structure and its leaves, walked as above; where it holds
#     arrays the body is staged with a copy rebuilt from the structure with
#     staged inputs in their place (an Equinox model closed over by a scan
#     body under `grad` is one graph for every call);
#   - an instance of a plain Python class (or a SimpleNamespace) by its
#     class and its instance dict, walked as above, when it holds no arrays
#     (an arbitrary object is not rebuilt) and its class neither has slots,
#     nor derives from a built-in type other than object, nor defines
#     `__getattr__`/`__getattribute__`;
#   - a class of user code (an object's, a pytree node's, or one the code
#     names) by identity and by what its methods and class attributes read,
#     walked as globals are, so a method reading a global array or a class
#     attribute changed between calls is seen; a method that cannot be
#     walked (its closure holds a set, as a dataclass's `__repr__` does) is
#     keyed by identity.
#   Among globals the walk of one object may take `_GLOBAL_WALK_LIMIT`
#   values; a global object it cannot key this way (too large, a dict
#   subclass) is keyed by identity (and its class as above), its contents
#   assumed not to change between calls, as jax.jit assumes of what a
#   traced function reads. So are values reached inside a library function
#   or a library class. An object or class holding arrays that cannot be
#   replaced by staged inputs (a plain object's attribute, a class
#   attribute, a method reading a global array) is never keyed by identity:
#   that would bake in the arrays it holds now (`_HoldsArrays`).
#
# A body is staged as written instead (concrete arrays it closes over
# become graph constants), its graph cached per function object and only
# while it captures no value of a transform (as JAX caches per function),
# when its snapshot cannot be taken or would not be sound: its closure
# or its globals reach an object that cannot be keyed as above (a plain
# object holding an array, e.g. a model object a training loop updates in
# place; an object with slots or its own `__getattr__` in the closure; a
# cycle; more than `_WALK_LIMIT` values in all), its code assigns a
# variable of its closure (`nonlocal`), or it assigns globals while arrays
# among its globals must be replaced; and when staging it with staged
# inputs in place of its arrays fails (Python control flow on a
# closed-over array, NumPy on it), which is remembered for its key. A
# body's Python runs when it is staged, so its
# side effects (appending to a list it closes over) happen once per graph,
# as under jax.jit.
#
# functx.lax caches the graphs (`_STAGED` in functx/lax.py, with how they
# are bounded and dropped); functx.lift keys its staged programs by the same
# snapshot (NOTE [lifted functions keyed by what they read] in
# functx/lifting.py).

_WALK_LIMIT = 1000  # values a snapshot may visit before the body counts as unsnapshotable
_GLOBAL_WALK_LIMIT = 100  # values a global object's contents may take before it is keyed by identity

_MISSING = object()
_EMPTY_CELL = ("empty-cell",)


class _Ident:
    """A key part standing for an object by identity. It holds the object
    weakly where Python allows (strongly otherwise: globals that are lists,
    dicts, ...) and never equals anything once the object died. `arm`
    (for keys stored in a cache) makes its death call `on_death`, which
    drops those entries."""

    __slots__ = ("h", "ref", "strong")

    def __init__(self, obj):
        self.h = id(obj)
        try:
            self.ref, self.strong = _weakref.ref(obj), None
        except TypeError:
            self.ref, self.strong = None, obj

    def get(self):
        return self.strong if self.ref is None else self.ref()

    def arm(self, on_death):
        obj = self.get()
        if self.ref is not None and obj is not None:
            self.ref = _weakref.ref(obj, on_death)

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        if type(other) is not _Ident or other.h != self.h:
            return False
        obj = self.get()
        return obj is not None and obj is other.get()

    def __repr__(self):
        return f"_Ident({type(self.get()).__name__})"


class _Uncacheable(Exception):
    """The snapshot of a body cannot be taken (or would not be sound)."""


class _HoldsArrays(_Uncacheable):
    """An object or class the body reads holds arrays that a staged input
    cannot replace: keying it by identity instead would bake them in."""


# Per code object: (global names it and its nested code read, whether it or
# its nested code assigns a variable of its closure, whether it assigns
# globals). Keyed by id, checked through a weak reference.
_CODE_INFO = {}
_LOAD_GLOBAL = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_STORE_GLOBAL = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME"})
_STORE_DEREF = frozenset({"STORE_DEREF", "DELETE_DEREF"})


def _code_info(code):
    hit = _CODE_INFO.get(id(code))
    if hit is not None and hit[0]() is code:
        return hit[1]
    names, stores_deref, writes_global = set(), set(), False
    todo = [code]
    while todo:
        c = todo.pop()
        for ins in _dis.get_instructions(c):
            if ins.opname in _LOAD_GLOBAL:
                names.add(ins.argval)
            elif ins.opname in _STORE_GLOBAL:
                writes_global = True
            elif ins.opname in _STORE_DEREF:
                stores_deref.add(ins.argval)
        todo.extend(k for k in c.co_consts if isinstance(k, _types.CodeType))
    info = (tuple(sorted(names)), bool(stores_deref & set(code.co_freevars)), writes_global)
    key = id(code)

    def forget(ref):
        entry = _CODE_INFO.get(key)
        if entry is not None and entry[0] is ref:
            del _CODE_INFO[key]

    _CODE_INFO[key] = (_weakref.ref(code, forget), info)
    return info


def _library_types():
    kinds = {type, _types.ModuleType, _types.BuiltinFunctionType, _types.MethodWrapperType,
             _types.WrapperDescriptorType, _types.MethodDescriptorType,
             _types.ClassMethodDescriptorType, _np.ufunc, type(_jax.jit(abs)),
             type(_jax.numpy.add), _jax.custom_jvp, _jax.custom_vjp}
    return frozenset(kinds)


_LIBRARY_TYPES = _library_types()
_CUSTOM_TYPES = (_jax.custom_jvp, _jax.custom_vjp)
_STATIC_TYPES = frozenset({type(None), bool, int, str, bytes, type(Ellipsis),
                           type(NotImplemented), range})
_LIBRARY_ROOTS = frozenset({"jax", "jaxlib", "numpy", "functx", "scipy", "builtins", "math",
                            "operator", "functools", "itertools", "typing", "abc"})
_LIBRARY_MODULES = {}  # module name -> is it a library (not user code)?


def _is_library_function(fn):
    """A Python function of JAX, NumPy, functx, the standard library or an
    installed package: keyed by identity, not followed into."""
    mod = getattr(fn, "__module__", None)
    if not isinstance(mod, str):
        return False
    hit = _LIBRARY_MODULES.get(mod)
    if hit is None:
        if mod.split(".")[0] in _LIBRARY_ROOTS:
            hit = True
        else:
            m = _sys.modules.get(mod)
            path = getattr(m, "__file__", None) or ""
            hit = ("site-packages" in path or "dist-packages" in path
                   or path.startswith(_STDLIB))
        _LIBRARY_MODULES[mod] = hit
    return hit


def _stdlib_dir():
    import sysconfig

    return sysconfig.get_paths().get("stdlib") or "//no-stdlib"


_STDLIB = _stdlib_dir()


def _is_array(x):
    t = type(x)
    if t in _TRACER_TYPES or t is _ArrayImpl or isinstance(x, _JaxTracer):
        return True
    return t is _np.ndarray and x.dtype.kind in "biufc"


def _node_types(treedef):
    """The classes of the nodes of a pytree structure (user classes among
    them have methods the body may call)."""
    todo, seen = [treedef], []
    while todo:
        node = todo.pop()
        data = node.node_data()
        if data is None:
            continue
        if data[0] not in seen:
            seen.append(data[0])
        todo.extend(node.children())
    return seen


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
_ATTRIBUTE_BAGS = (object, _types.SimpleNamespace)


def _plain_attributes(cls):
    """Whether an instance of `cls` is what its instance dict holds: Python
    classes over `object` (or SimpleNamespace) without slots and without a
    `__getattr__`/`__getattribute__` of their own. Not a subclass of a
    built-in container (a dict subclass's items are not in its `__dict__`)."""
    for base in cls.__mro__:
        if base in _ATTRIBUTE_BAGS:
            continue
        if not base.__flags__ & _HEAP_TYPE or "__slots__" in base.__dict__:
            return False
        for name in ("__getattr__", "__getattribute__"):
            if isinstance(base.__dict__.get(name), _types.FunctionType):
                return False
    return True


class _Snapshot:
    """Walks what a body reads (NOTE [staged bodies: one graph per code and
    closure]): `key` identifies it, `arrays` are the arrays in it, in order,
    and `rebuild(tracers)` returns the body with `tracers` in their place."""

    def __init__(self, fn, key_only=False):
        # `key_only`: only the key and the arrays are wanted (NOTE [lifted
        # functions keyed by what they read] in functx/lifting.py), never a
        # rebuilt body, so objects holding arrays are walked like any other
        self.key_only = key_only
        self.arrays = []
        self.idents = []
        self.budget = _WALK_LIMIT
        self.visiting = set()
        self.funcs = {}  # id(fn) -> (key, rebuild, has arrays): functions walked
        self.classes = {}  # id(cls) -> key: classes of objects walked
        self.globals = {}  # id(G) -> (G, index, {name: [key, rebuild, has arrays]})
        self.copied = set()  # id(G) of the globals dicts staging needs a copy of
        self.writers = []  # globals dicts of walked functions that assign globals
        self.fn = fn
        self.key, self.top, _ = self.value(fn)
        if any(id(g) in self.copied for g in self.writers):
            raise _Uncacheable

    def ident(self, obj):
        i = _Ident(obj)
        self.idents.append(i)
        return ("I", i)

    def value(self, v, global_=False):
        """(key, rebuild, has arrays) of a value the body reads. `rebuild`
        is None (the value itself), an int (an array's position) or a
        callable of the rebuild context."""
        self.budget -= 1
        if self.budget < 0:
            raise _Uncacheable
        t = type(v)
        if t in _STATIC_TYPES:
            return (t, v), None, False
        if t is float:
            return (t, v.hex()), None, False
        if t is complex:
            return (t, v.real.hex(), v.imag.hex()), None, False
        if _is_array(v):
            self.arrays.append(v)
            return ("A", _aval_of(v)), len(self.arrays) - 1, True
        if isinstance(v, _np.generic):
            return (t, v.dtype.str, v.tobytes()), None, False
        if isinstance(v, _np.dtype):
            return ("dtype", v), None, False
        if t is _types.FunctionType:
            if _is_library_function(v):
                return self.ident(v), None, False
            return self.function(v)
        if t is tuple or (isinstance(v, tuple) and hasattr(t, "_fields")):
            parts = [self.value(x, global_=global_) for x in v]
            dyn = any(p[2] for p in parts)
            rebuild = None
            if dyn:
                def rebuild(ctx, parts=parts, v=v, t=t):
                    vals = [ctx.apply(r, x) for (_, r, _), x in zip(parts, v)]
                    return tuple(vals) if t is tuple else t(*vals)
            tkey = "T" if t is tuple else self.ident(t)
            return (tkey,) + tuple(p[0] for p in parts), rebuild, dyn
        if t is _functools.partial:
            f = self.value(v.func, global_=global_)
            a = self.value(v.args, global_=global_)
            kw = [(k, self.value(x, global_=global_)) for k, x in sorted(v.keywords.items())]
            dyn = f[2] or a[2] or any(p[2] for _, p in kw)
            rebuild = None
            if dyn:
                def rebuild(ctx, v=v, f=f, a=a, kw=kw):
                    return _functools.partial(
                        ctx.apply(f[1], v.func), *ctx.apply(a[1], v.args),
                        **{k: ctx.apply(p[1], v.keywords[k]) for k, p in kw})
            return ("P", f[0], a[0], tuple((k, p[0]) for k, p in kw)), rebuild, dyn
        if t is _types.MethodType:
            f = self.value(v.__func__, global_=global_)
            s = self.value(v.__self__, global_=global_)
            rebuild = None
            if f[2] or s[2]:
                def rebuild(ctx, v=v, f=f, s=s):
                    return _types.MethodType(ctx.apply(f[1], v.__func__),
                                             ctx.apply(s[1], v.__self__))
            return ("M", f[0], s[0]), rebuild, f[2] or s[2]
        if isinstance(v, type) and not _is_library_function(v):
            return self.klass(v), None, False
        if isinstance(v, _CUSTOM_TYPES):
            return self.custom(v), None, False
        if t in _LIBRARY_TYPES or isinstance(v, (type, _enum.Enum)):
            return self.ident(v), None, False
        if self.key_only and t in (list, dict):
            # (a lifted function's log or config: NOTE [lifted functions
            # keyed by what they read]) by identity, and the arrays it holds
            # by identity, its other contents assumed unchanged, as jax.jit
            # assumes; a list the function appends to does not restage it
            for x in _tree.tree_leaves(v):
                if _is_array(x):
                    self.arrays.append(x)
            return ("Mut", self.ident(v)), None, False
        if not global_:
            return self.container(v)
        # A global list, dict or instance: by its contents where they can be
        # walked within a smaller budget, else by identity, its contents then
        # assumed unchanged (as jax.jit assumes of what a function reads).
        saved, budget = self.save(), self.budget
        self.budget = min(budget, _GLOBAL_WALK_LIMIT)
        try:
            found = self.container(v)
        except _HoldsArrays:
            raise
        except Exception:  # noqa: BLE001 - unwalkable (too large, a failing flatten): by identity
            self.restore(saved)
            found = ("I-obj", self.ident(v), self.klass(type(v))), None, False
        self.budget = budget - (min(budget, _GLOBAL_WALK_LIMIT) - max(self.budget, 0))
        return found

    def save(self):
        return (len(self.arrays), len(self.idents), len(self.writers), set(self.visiting),
                dict(self.funcs), {k: (G, i, dict(slots)) for k, (G, i, slots) in self.globals.items()},
                set(self.copied), dict(self.classes))

    def restore(self, saved):
        """Forget what a walk that failed added (its arrays, functions, globals)."""
        (n_arrays, n_idents, n_writers, self.visiting, self.funcs, self.globals, self.copied,
         self.classes) = saved
        del self.arrays[n_arrays:], self.idents[n_idents:], self.writers[n_writers:]

    def container(self, v):
        """(key, rebuild, has arrays) of a list, dict or other object the
        body's closure, defaults or bound method hold: a pytree by its
        structure and leaves (rebuilt from them where it holds arrays), an
        instance of a plain class by its class and attributes when it holds
        no arrays."""
        if id(v) in self.visiting:  # a cycle
            raise _Uncacheable
        leaves, treedef = _tree.tree_flatten(v)
        if treedef.num_nodes != 1 or treedef.num_leaves != 1:  # a pytree node
            hash(treedef)  # static data that cannot be compared: TypeError, as written
            self.visiting.add(id(v))
            classes = tuple(self.klass(c) for c in _node_types(treedef))
            parts = [self.value(x) for x in leaves]
            self.visiting.discard(id(v))
            dyn = any(p[2] for p in parts)
            rebuild = None
            if dyn:
                def rebuild(ctx, parts=parts, leaves=leaves, treedef=treedef):
                    return treedef.unflatten([ctx.apply(r, x)
                                              for (_, r, _), x in zip(parts, leaves)])
            return ("Tr", treedef, classes, tuple(p[0] for p in parts)), rebuild, dyn
        t = type(v)
        attrs = getattr(v, "__dict__", None)
        if type(attrs) is not dict or not _plain_attributes(t):
            raise _Uncacheable
        self.visiting.add(id(v))
        cls = self.klass(t)
        parts = [(k, self.value(x)) for k, x in sorted(attrs.items())]
        self.visiting.discard(id(v))
        if any(p[2] for _, p in parts) and not self.key_only:  # an arbitrary object is not rebuilt
            raise _HoldsArrays
        return ("O", cls, tuple((k, p[0]) for k, p in parts)), None, False

    def klass(self, cls):
        """The key of the class of an object the body reads: its identity,
        and for the classes of user code in its MRO what their methods and
        class attributes read (walked as functions and values are). A
        method or class attribute holding arrays cannot be rebuilt."""
        hit = self.classes.get(id(cls))
        if hit is not None:
            return hit
        key = self.classes[id(cls)] = ("C", self.ident(cls))  # a class its methods name
        parts = []
        for base in cls.__mro__:
            if _is_library_function(base):
                continue
            for name, attr in base.__dict__.items():
                if type(attr) in (staticmethod, classmethod):
                    attr = attr.__func__
                elif type(attr) is property:
                    attr = (attr.fget, attr.fset, attr.fdel)
                elif not isinstance(attr, _types.FunctionType) and (
                        name.startswith("__") or name.startswith("_abc_")):
                    continue  # the class's own bookkeeping
                parts.append((name, self.class_attribute(attr)))
        key = self.classes[id(cls)] = key + (tuple(parts),)
        return key

    def class_attribute(self, attr):
        """The key of a method or class attribute: walked as a global is;
        one that cannot be walked (a closure holding a set, e.g. a
        dataclass's `__repr__`) by identity. Arrays in it cannot be
        replaced (the class is not rebuilt): the body is staged as written."""
        saved, budget = self.save(), self.budget
        try:
            k, _, dyn = self.value(attr, global_=True)
        except _HoldsArrays:
            raise
        except Exception:  # noqa: BLE001 - unwalkable: by identity
            if self.budget < 0:
                raise
            self.restore(saved)
            self.budget = budget - 1
            return self.ident(attr)
        if dyn and not self.key_only:
            raise _HoldsArrays
        return k

    def custom(self, obj):
        """The key of a jax.custom_jvp / custom_vjp object: its identity and
        what its function and rules read, so that rules redefined with
        `defjvp` / `defvjp`, or reading a global changed between calls, are
        seen. Arrays they read cannot be replaced (the object is not
        rebuilt)."""
        hit = self.classes.get(id(obj))
        if hit is not None:  # met again (a fwd rule calling the function itself)
            return hit
        key = self.classes[id(obj)] = ("CR", self.ident(obj))
        parts = [self.value(r, global_=True) for r in _rules_of(obj)]
        if any(p[2] for p in parts) and not self.key_only:
            raise _HoldsArrays
        key = self.classes[id(obj)] = key + tuple(p[0] for p in parts)
        return key

    def function(self, fn):
        hit = self.funcs.get(id(fn))
        if hit is not None:
            return ("f", hit[0]), hit[1], hit[2]
        if id(fn) in self.visiting:  # a closure cycle
            raise _Uncacheable
        code = fn.__code__
        names, writes_closure, writes_global = _code_info(code)
        if writes_closure:
            raise _Uncacheable
        self.visiting.add(id(fn))
        index = len(self.funcs)
        cells = []
        for c in fn.__closure__ or ():
            try:
                content = c.cell_contents
            except ValueError:
                cells.append((_EMPTY_CELL, None, False))
                continue
            cells.append(self.value(content))
        defaults = self.value(fn.__defaults__) if fn.__defaults__ else ((), None, False)
        kwd = sorted((fn.__kwdefaults__ or {}).items())
        kwdefaults = [(k, self.value(x)) for k, x in kwd]
        G = fn.__globals__
        gkeys = []
        gdyn = False
        for name in names:
            k, d = self.global_(G, name)
            gkeys.append(k)
            gdyn = gdyn or d
        if writes_global:
            self.writers.append(G)
        self.visiting.discard(id(fn))
        dyn = (gdyn or defaults[2] or any(p[2] for p in cells)
               or any(p[2] for _, p in kwdefaults))
        key = ("F", index, self.ident(code), tuple(p[0] for p in cells), defaults[0],
               tuple((k, p[0]) for k, p in kwdefaults), tuple(gkeys))

        def rebuild(ctx):
            done = ctx.funcs.get(id(fn))
            if done is not None:
                return done
            if not dyn:
                return fn
            G2 = ctx.globals_for(G)
            done = ctx.funcs.get(id(fn))  # rebuilt while filling G2 (a global recursion)
            if done is not None:
                return done
            closure = []
            for c, (_, r, _) in zip(fn.__closure__ or (), cells):
                closure.append(c if r is None else _types.CellType(ctx.apply(r, c.cell_contents)))
            new = _types.FunctionType(code, G2, fn.__name__,
                                      ctx.apply(defaults[1], fn.__defaults__),
                                      tuple(closure) or None)
            if kwdefaults:
                new.__kwdefaults__ = {k: ctx.apply(p[1], fn.__kwdefaults__[k])
                                      for k, p in kwdefaults}
            new.__qualname__ = fn.__qualname__
            new.__dict__.update(fn.__dict__)
            ctx.funcs[id(fn)] = new
            return new

        self.funcs[id(fn)] = (key, rebuild, dyn)
        return key, rebuild, dyn

    def global_(self, G, name):
        """(key, has arrays) of the global `name` of the globals dict `G`."""
        entry = self.globals.get(id(G))
        if entry is None:
            entry = self.globals[id(G)] = (G, len(self.globals), {})
        _, gi, slots = entry
        slot = slots.get(name)
        if slot is not None:
            return ("g", gi, name), slot[2]
        v = G.get(name, _MISSING)
        if v is _MISSING:
            slots[name] = [None, None, False]
            return ("g-absent", gi, name), False
        slot = slots[name] = [None, None, False]  # before following it: a recursion
        key, rebuild, dyn = self.value(v, global_=True)
        slot[:] = [key, rebuild, dyn]
        if dyn:
            self.copied.add(id(G))
        return ("g", gi, name, key), dyn

    def rebuild(self, tracers):
        """The body with `tracers` in place of its arrays."""
        return _RebuildContext(self, tracers).apply(self.top, self.fn)


class _RebuildContext:
    def __init__(self, snap, tracers):
        self.snap = snap
        self.tracers = tracers
        self.funcs = {}
        self.gmap = {}

    def apply(self, r, v):
        if r is None:
            return v
        if type(r) is int:
            return self.tracers[r]
        return r(self)

    def globals_for(self, G):
        if id(G) not in self.snap.copied:
            return G
        G2 = self.gmap.get(id(G))
        if G2 is None:
            G2 = self.gmap[id(G)] = dict(G)
            for name, (_, r, dyn) in self.snap.globals[id(G)][2].items():
                if dyn:
                    G2[name] = self.apply(r, G[name])
        return G2


def _snapshot(fn, key_only=False):
    """The snapshot of `fn`, or None where it cannot be taken."""
    try:
        return _Snapshot(fn, key_only)
    except (_Uncacheable, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - an unexpected value: stage it as written
        return None
