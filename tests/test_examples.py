"""The examples run (each checks its own result against an independent
computation and fails loudly otherwise)."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path):
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_examples():
    assert any(p.stem == "per_sample_grads" for p in EXAMPLES)
