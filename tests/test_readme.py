"""The documentation's Python examples run as written (each file's blocks
in order, sharing one namespace), so the documentation cannot rot."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_python_blocks_run(path):
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert len(blocks) >= 3
    namespace = {}
    for block in blocks:
        exec(compile(block, str(path), "exec"), namespace)
