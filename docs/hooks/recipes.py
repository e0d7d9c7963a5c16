"""MkDocs hook: the Recipes pages, made from `examples/*.py`.

Each example is a percent-format script (`# %%` cells). The hook reads it
with jupytext, runs it as a notebook in a fresh IPython kernel (nbclient),
and writes a Markdown page per example: markdown cells as they are, code
cells as Python blocks, then what the cell printed and the figures it
showed. Figures an example only saved to `$FUNCTX_FIGURES_DIR` are shown at
the end of its page when no cell displayed one.

FUNCTX_DOCS_EXECUTE chooses what runs:
  unset, "1" or "all"   every example (what CI's strict build does);
  "0" or "none"          nothing: the pages show the code only (fast local builds);
  "a,b"                  only the examples named (file stems), e.g. the one
                         a test looks at.
A cell that raises fails the build: a recipe page never shows a broken run.
"""

import html
import logging
import os
import pathlib
import tempfile
import time

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.recipes")

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CELL_TIMEOUT_S = 900


def _selected(stems):
    choice = os.environ.get("FUNCTX_DOCS_EXECUTE", "all").strip()
    if choice in ("", "1", "all"):
        return set(stems)
    if choice in ("0", "none"):
        return set()
    wanted = {s.strip() for s in choice.split(",") if s.strip()}
    unknown = wanted - set(stems)
    if unknown:
        raise ValueError(f"FUNCTX_DOCS_EXECUTE names no example: {sorted(unknown)} "
                         f"(examples: {sorted(stems)})")
    return wanted


def _execute(nb, figures_dir):
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    saved = {k: os.environ.get(k) for k in ("FUNCTX_FIGURES_DIR", "MPLBACKEND")}
    os.environ["FUNCTX_FIGURES_DIR"] = str(figures_dir)
    # figures appear as cell outputs, as in Jupyter
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        # the kernel talks over local socket files (not TCP), kept out of the
        # working tree: the prefix of their paths is `ip` for this transport
        km = KernelManager(kernel_name="python3", transport="ipc",
                           ip=str(pathlib.Path(figures_dir) / "kernel"))
        client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT)}})
        try:
            client.execute()
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


def _text_output(text):
    return f'<pre class="recipe-output"><code>{html.escape(text.rstrip())}</code></pre>\n'


def _render(stem, nb, executed, images):
    """The page's Markdown; `images` collects (name, bytes) of its figures."""
    import base64

    parts = []
    if not executed:
        parts.append('!!! note "Outputs not shown"\n    This build did not run the '
                     "recipe (`FUNCTX_DOCS_EXECUTE`); the documentation built in CI "
                     "shows its printed output and figures.\n")
    for index, cell in enumerate(nb.cells):
        source = cell.source.rstrip()
        if cell.cell_type == "markdown":
            parts.append(source + "\n")
            continue
        if cell.cell_type != "code" or not source:
            continue
        parts.append(f"```python\n{source}\n```\n")
        stream = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                stream.append(out.get("text", ""))
                continue
            if kind == "error":  # nbclient raised already; kept for safety
                raise RuntimeError(f"examples/{stem}.py cell {index} raised {out.get('ename')}")
            data = out.get("data", {})
            if "image/png" in data:
                if stream:
                    parts.append(_text_output("".join(stream)))
                    stream = []
                name = f"{stem}_{index}_{len(images)}.png"
                images.append((name, base64.b64decode(data["image/png"])))
                parts.append(f'![Figure from examples/{stem}.py]({stem}_files/{name})\n'
                             '{ .recipe-figure }\n')
            elif "text/plain" in data and kind == "execute_result":
                stream.append(data["text/plain"] + "\n")
        if stream:
            parts.append(_text_output("".join(stream)))
    return "\n".join(parts)


def _page(stem, path, run):
    import jupytext

    nb = jupytext.read(path)
    images = []
    took = None
    if run:
        with tempfile.TemporaryDirectory(prefix=f"functx-figures-{stem}-") as figures:
            start = time.perf_counter()
            log.info("recipes: running examples/%s", path.name)
            _execute(nb, figures)
            took = time.perf_counter() - start
            text = _render(stem, nb, True, images)
            if not images:  # saved but not displayed: show the saved files
                saved = sorted(pathlib.Path(figures).glob("*.png"))
                for f in saved:
                    images.append((f"{stem}_{f.name}", f.read_bytes()))
                    text += (f"\n![{f.stem}]({stem}_files/{stem}_{f.name})\n"
                             "{ .recipe-figure }\n")
    else:
        text = _render(stem, nb, False, images)
    source_note = (f"\n---\n\nThis page is `examples/{path.name}`, a percent-format script: "
                   f"`python examples/{path.name}` runs it, Jupyter and VS Code open it "
                   "as a notebook.")
    if took is not None:
        source_note += f" Running it for this page took {took:.0f} s."
    return text + source_note + "\n", images


def on_files(files, config):
    stems = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    run = _selected(stems)
    for stem in stems:
        content, images = _page(stem, EXAMPLES / f"{stem}.py", stem in run)
        files.append(File.generated(config, f"recipes/{stem}.md", content=content))
        for name, data in images:
            files.append(File.generated(config, f"recipes/{stem}_files/{name}", content=data))
    return files
