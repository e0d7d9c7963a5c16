"""MkDocs hook: the API reference pages, written from what functx exports.

Every name in a public module's `__all__` gets an entry with the HTML id
`module.name` (tests/test_site.py checks that none is missing):

* functions and classes written in functx get their docstring rendered by
  mkdocstrings (`::: functx.grad`);
* the functions `functx.numpy`, `functx.lax`, `functx.nn` and
  `functx.random` take over from JAX (the same arguments and results,
  accepting functx values) get one table row each: the JAX function it
  follows, linked to JAX's documentation, and the first line of its docstring;
* classes, dtypes and constants re-exported from JAX get a row too.

Nothing here is written by hand, so a new export shows up on the next build.
"""

import importlib
import inspect
import re
import types

from mkdocs.structure.files import File

JAX_DOCS = "https://docs.jax.dev/en/latest/_autosummary/{}.html"

# (page, title, introduction, [(module, section title or None), ...])
PAGES = [
    ("api/functx.md", "functx",
     "The transforms, module helpers, custom rules, compilation, grad modes and "
     "errors: everything `import functx` exports. The namespaces `functx.numpy`, "
     "`functx.lax`, `functx.nn`, `functx.random`, `functx.autograd`, "
     "`functx.test_util` and `functx.config` have pages of their own.",
     [("functx", None)]),
    ("api/autograd.md", "functx.autograd",
     "torch.autograd's surface on functx's transforms: see also the "
     "[functx.autograd guide](../autograd.md).",
     [("functx.autograd", None), ("functx.autograd.functional", "functx.autograd.functional"),
      ("functx.autograd.forward_ad", "functx.autograd.forward_ad"),
      ("functx.autograd.graph", "functx.autograd.graph"),
      ("functx.autograd.profiler", "functx.autograd.profiler")]),
    ("api/numpy.md", "functx.numpy",
     "Every public name of `jax.numpy` (and of `jax.numpy.linalg` and "
     "`jax.numpy.fft`), with the same arguments and results. On plain arrays a "
     "function *is* the JAX call; on functx values it runs through lifting. "
     "See [Using JAX libraries](../jax-libraries.md): `jax.numpy` itself works "
     "on functx values too.",
     [("functx.numpy", None), ("functx.numpy.linalg", "functx.numpy.linalg"),
      ("functx.numpy.fft", "functx.numpy.fft")]),
    ("api/lax.md", "functx.lax",
     "Every public function of `jax.lax`. Control flow (`cond`, `switch`, "
     "`scan`, `while_loop`, `fori_loop`, `map`), reductions with a computation "
     "and the collectives over named `vmap` axes are functx's own "
     "([control flow](../control-flow.md), [vmap](../vmap.md)).",
     [("functx.lax", None)]),
    ("api/nn-random.md", "functx.nn and functx.random",
     "`jax.nn` and `jax.random` on functx values, plus torch-style dropout and "
     "a global random generator (`manual_seed`, `rand`, `randn`, ...).",
     [("functx.nn", "functx.nn"), ("functx.random", "functx.random")]),
    ("api/util.md", "functx.test_util and functx.config",
     "Checking derivatives of your own rules, and functx's configuration "
     "(compile log, persistent compilation cache).",
     [("functx.test_util", "functx.test_util"), ("functx.config", "functx.config")]),
]

# which page documents a public submodule (for the entries of modules)
MODULE_PAGES = {"numpy": "numpy.md", "lax": "lax.md", "nn": "nn-random.md#functx.nn",
                "random": "nn-random.md#functx.random", "autograd": "autograd.md",
                "test_util": "util.md#functx.test_util", "config": "util.md#functx.config",
                "functional": "#functx.autograd.functional",
                "forward_ad": "#functx.autograd.forward_ad", "graph": "#functx.autograd.graph",
                "profiler": "#functx.autograd.profiler"}


def exported(module_name):
    """The names `module_name` exports, in order, without repeats."""
    module = importlib.import_module(module_name)
    return list(dict.fromkeys(module.__all__)), module


def kind(obj):
    """'module', 'own' (written in functx), 'jax' (a function taken over from
    JAX) or 'value' (a class, dtype or constant re-exported)."""
    if isinstance(obj, types.ModuleType):
        return "module"
    if hasattr(obj, "__wrapped__") and callable(obj):
        return "jax"
    module = getattr(obj, "__module__", "") or ""
    if (inspect.isfunction(obj) or inspect.isclass(obj) or callable(obj)) and module.startswith("functx"):
        return "own"
    return "value"


def _summary(obj):
    doc = inspect.getdoc(obj) or ""
    line = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    # JAX's docstrings are reStructuredText: ":func:`~jax.numpy.absolute`" -> code
    line = re.sub(r":(?:py:)?\w+:`~?([^`]+)`", r"`\1`", line)
    line = re.sub(r"``([^`]+)``", r"`\1`", line)
    line = line.replace("|", "\\|")
    return line[:160] + ("..." if len(line) > 160 else "")


def _source_name(module_name):
    return {"functx.numpy": "jax.numpy", "functx.numpy.linalg": "jax.numpy.linalg",
            "functx.numpy.fft": "jax.numpy.fft", "functx.lax": "jax.lax",
            "functx.nn": "jax.nn", "functx.random": "jax.random"}.get(module_name)


def section(module_name, title):
    names, module = exported(module_name)
    out = []
    if title:
        out.append(f"## `{title}` {{ #{module_name} }}\n")
    own, table = [], []
    for name in names:
        obj = getattr(module, name)
        k = kind(obj)
        if k == "module":
            target = MODULE_PAGES[name]
            out.append(f'<span id="{module_name}.{name}"></span>`{module_name}.{name}`: '
                       f"see [{module_name}.{name}]({target}).\n")
        elif k == "own":
            own.append(name)
        else:
            table.append((name, obj, k))
    for name in own:
        # render the object where it is defined (a re-export such as
        # `functx.grad` names a submodule too, which static analysis would
        # find instead), under the public name and its anchor
        obj = getattr(module, name)
        out.append(f'<div id="{module_name}.{name}" class="api-entry"></div>\n')
        out.append(f"::: {obj.__module__}.{obj.__qualname__}\n"
                   f"    options:\n      heading: \"{module_name}.{name}\"\n"
                   f"      toc_label: \"{name}\"\n")
    if table:
        source = _source_name(module_name)
        out.append(f"### Taken over from `{source}`\n" if source else "### Re-exported\n")
        out.append("| name | follows | summary |\n|---|---|---|")
        for name, obj, k in table:
            anchor = f'<span id="{module_name}.{name}"></span>`{name}`'
            if k == "jax" and source:
                follows = f"[`{source}.{name}`]({JAX_DOCS.format(f'{source}.{name}')})"
                summary = _summary(obj.__wrapped__)
            else:
                follows = f"`{source}.{name}`" if source else "re-exported"
                summary = _summary(obj) if not isinstance(obj, (int, float)) else repr(obj)
                if k == "value":
                    summary = f"(re-exported as it is) {summary}"
            out.append(f"| {anchor} | {follows} | {summary} |")
        out.append("")
    return "\n".join(out)


def page(title, intro, sections):
    parts = [f"# {title}\n", intro + "\n"]
    for module_name, heading in sections:
        parts.append(section(module_name, heading))
    return "\n".join(parts)


def on_files(files, config):
    for path, title, intro, sections in PAGES:
        files.append(File.generated(config, path, content=page(title, intro, sections)))
    return files
