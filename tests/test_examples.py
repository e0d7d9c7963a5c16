"""The examples run (each checks its own result against an independent
computation and fails loudly otherwise) and draw their figures: PNGs written
to $FUNCTX_FIGURES_DIR, the folder the docs take them from."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_saves_its_figure(path, tmp_path):
    env = dict(os.environ, FUNCTX_FIGURES_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    saved = [pathlib.Path(p) for p in re.findall(r"^figure saved to (.+)$", result.stdout, re.M)]
    assert saved, result.stdout
    assert sorted(saved) == sorted(tmp_path.glob("*.png")), "figures saved outside FUNCTX_FIGURES_DIR"
    for png in saved:
        assert png.read_bytes()[:8] == PNG_SIGNATURE, png
        assert png.stat().st_size > 10_000, png  # a blank or empty figure is a few kB
        import matplotlib.image

        pixels = matplotlib.image.imread(png)
        assert min(pixels.shape[:2]) >= 200, (png, pixels.shape)
        # Not one colour: something was drawn.
        assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50, png


def test_there_are_examples():
    assert any(p.stem == "per_sample_grads" for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_follows_the_figure_contract(path):
    """Every example draws in a `# %%` cell, saves through the one helper
    that honours $FUNCTX_FIGURES_DIR, and picks the Agg backend only when
    not in a notebook (so figures still show inline there)."""
    source = path.read_text()
    assert source.startswith("# %%"), "a percent-format script"
    assert 'os.environ.get("FUNCTX_FIGURES_DIR")' in source
    assert re.search(r'if "ipykernel" not in sys\.modules:\n\s+matplotlib\.use\("Agg"\)', source)
    assert '"__file__" in globals()' in source  # __file__ is undefined in a notebook
    assert re.search(r"^save_figure\(fig, ", source, re.M)
