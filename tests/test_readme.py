"""Every ```python block of the README and of docs/ runs on its own, as a
reader would paste it: in a fresh namespace, in a Python process that
did not run this test suite's conftest (no float64, no strict promotion).

Blocks are run in few processes to stay cheap: one process runs every block
that leaves global state alone, each in a new namespace; a block that
changes global configuration (`jax.config.update`, `functx.config.update`,
environment variables) gets a process of its own, so it cannot change what
the blocks after it compute. Output, shell commands and other text use other
fences (```text, ```bash).
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).parent.parent
DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md"))
# a block that changes what later blocks in the same process would compute
GLOBAL_STATE = re.compile(r"config\.update\(|os\.environ|XLA_FLAGS|set_detect_anomaly\(True\)")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")

RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
results = []
for block in blocks:
    # pad so tracebacks give the line numbers of the Markdown file
    code = compile("\n" * (block["line"] - 1) + block["code"], block["path"], "exec")
    try:
        exec(code, {"__name__": "__main__"})
        results.append(None)
    except BaseException:
        results.append(traceback.format_exc())
json.dump(results, open(sys.argv[2], "w"))
"""


def python_blocks(path):
    """[(first line of the code, code)] of the file's ```python blocks."""
    blocks, lines, i = [], path.read_text().split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
            j += 1
        if lang == "python":
            body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]]
            blocks.append((i + 2, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def _start(blocks, workdir, name):
    spec = pathlib.Path(workdir) / f"{name}.json"
    out = pathlib.Path(workdir) / f"{name}.out.json"
    spec.write_text(json.dumps(blocks))
    log = open(pathlib.Path(workdir) / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(spec), str(out)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, out, log


@pytest.fixture(scope="module")
def outcomes():
    """{(path, line): None or the traceback} for every block of every file."""
    shared, alone = [], []
    for path in DOCS:
        for line, code in python_blocks(path):
            entry = {"path": str(path.relative_to(ROOT)), "line": line, "code": code}
            (alone if GLOBAL_STATE.search(code) else shared).append(entry)
    results = {}
    with tempfile.TemporaryDirectory(prefix="functx-doc-blocks-") as workdir:
        groups = [shared] + [[b] for b in alone]
        runs = [(g, *_start(g, workdir, f"group{k}")) for k, g in enumerate(groups) if g]
        for group, proc, out, log in runs:
            try:
                proc.wait(timeout=900)
            finally:
                proc.kill()
                log.close()
            if out.exists():
                for block, tb in zip(group, json.loads(out.read_text())):
                    results[(block["path"], block["line"])] = tb
            else:  # the process itself died: every block of the group failed
                text = pathlib.Path(log.name).read_text()[-4000:]
                for block in group:
                    results[(block["path"], block["line"])] = f"the process died:\n{text}"
    return results


@pytest.mark.slow  # about a minute: a few Python processes run every block
@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_python_blocks_run_alone(path, outcomes):
    rel = str(path.relative_to(ROOT))
    blocks = python_blocks(path)
    if path.name in ("README.md", "walkthrough.md"):
        assert len(blocks) >= 3, f"{rel}: expected its examples as ```python blocks"
    failures = [f"{rel}:{line}\n{outcomes[(rel, line)]}" for line, _ in blocks
                if outcomes[(rel, line)] is not None]
    assert not failures, "blocks that fail on their own:\n\n" + "\n\n".join(failures)


def test_block_parser_sees_each_fence():
    """The parser finds python blocks by their fence only (and keeps the
    Markdown line numbers), so an output block cannot be run by mistake."""
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "x.md"
        p.write_text("text\n```python\na = 1\n```\n```text\nnot python\n```\n"
                     "* item\n\n  ```python\n  b = 2\n  ```\n")
        assert python_blocks(p) == [(3, "a = 1\n"), (11, "b = 2\n")]


def test_no_alias_shadows_flax():
    """`import functx.lax as flax` would shadow the Flax library's name."""
    for path in DOCS:
        assert "as flax" not in path.read_text(), path
