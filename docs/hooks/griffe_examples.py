"""Griffe extension for the API pages: functx's docstrings head their
doctest lines with `Example:`, which Google style reads as an admonition of
plain text (the `>>>` lines would render as nested quotes); rename it to
the `Examples:` section, which renders them as code."""

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)


class DoctestExamples(griffe.Extension):
    def on_object(self, *, obj, **kwargs):
        if obj.docstring is not None and "Example:" in obj.docstring.value:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
