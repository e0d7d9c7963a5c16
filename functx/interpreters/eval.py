"""The bottom of the stack: evaluation by lowering onto jax.lax.

A primitive whose arguments hold no functx tracer runs here. Most functx
primitives mirror a `jax.lax` primitive with the same parameters, so their
evaluation is a call of that primitive:

* on JAX tracers (inside `jax.jit`, `jax.vmap`, ...) it binds the JAX
  primitive directly, so the functx stack leaves a pure JAX program behind;
* on concrete arrays it calls a `jax.jit`-compiled wrapper of the primitive,
  cached per parameters, which takes JAX's C++ dispatch path (about three
  times cheaper than binding the JAX primitive eagerly).
"""

from functools import partial

import jax

from .. import xla_cpu

impl_rules = {}  # Primitive -> callable(*args, **params)

_JaxTracer = jax.core.Tracer


def lower_to_jax(prim):
    """Register the evaluation of `prim` as its JAX primitive."""
    jax_prim = prim.jax
    compiled = {}
    sized = prim.name == "dot_general"  # NOTE [XLA:CPU's matrix-product library]

    def impl(*args, **params):
        for a in args:
            if isinstance(a, _JaxTracer):
                return jax_prim.bind(*args, **params)
        try:
            key = tuple(params.items())
            if sized:
                key += (xla_cpu.top_level() and xla_cpu.dot_takes_products_off(
                    args[0], args[1], params["dimension_numbers"]),)
            fn = compiled[key]
        except KeyError:
            options = xla_cpu.products_off() if sized and key[-1] else None
            fn = compiled[key] = jax.jit(partial(jax_prim.bind, **params),
                                         compiler_options=options)
        except (TypeError, AttributeError):  # unhashable parameters, shapeless args: no cache
            return jax_prim.bind(*args, **params)
        return fn(*args)

    impl.programs = compiled  # parameters (and for dot_general: large?) -> jitted bind
    impl_rules[prim] = impl
    return impl


def defimpl(prim, fn):
    """Register a hand-written evaluation of `prim` (for primitives that are
    not a single JAX primitive)."""
    impl_rules[prim] = fn
    return fn


def compiled(graph):
    """A staged graph as one jax.jit-compiled function of its inputs
    (returning the list of its outputs), made once per graph (with the
    options of NOTE [XLA:CPU's matrix-product library])."""
    fn = graph.cache.get("compiled")
    if fn is None:
        from .staging import eval_graph

        fn = graph.cache["compiled"] = xla_cpu.jit_by_size(
            lambda *args: eval_graph(graph, args), xla_cpu.sizes_in_graph(graph))
    return fn


class RepeatCache:
    """What eager transforms compile for work that repeats: a key is
    counted until it has been seen `after` times, then `build()` is made
    once and returned from then on (None until then, and when `build`
    declines). Work seen fewer times never pays for a compilation."""

    def __init__(self, after, limit):
        self.after = after
        self.limit = limit
        self.entries = {}  # key -> times seen | built value

    def get(self, key, build):
        """The built value for `key`, or None; raises TypeError when the
        key is not hashable."""
        entries = self.entries
        entry = entries.get(key, 0)
        if type(entry) is not int:
            return entry
        if entry < self.after:
            if len(entries) < self.limit:
                entries[key] = entry + 1
            return None
        entries[key] = entry = build()
        return entry
