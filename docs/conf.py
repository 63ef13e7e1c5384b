"""Sphinx configuration of nbbudget's documentation (Markdown pages with MyST).

Build it with ``bash scripts/docs.sh``: every warning is an error. The build needs no network.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))       # the local extension: generated reference pages
sys.path.insert(0, str(HERE.parent))         # the package itself, when it is not installed

import nbbudget  # noqa: E402 - after the path is set

project = "nbbudget"
author = "The nbbudget authors"
copyright = "The nbbudget authors, MIT licence"
version = release = nbbudget.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "nbbudget_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

# Single backticks in docstrings name Python objects (`nb.call`), as in the code's comments.
default_role = "py:obj"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_inherit_docstrings = True

html_theme = "furo"
html_title = f"nbbudget {release}"
# furo, with a style sheet that keeps every page within the window (docs/_static/fit.css):
# tables and code wrap, the text column widens where the window has room
html_static_path = ["_static"]
html_css_files = ["fit.css"]


# A name in code in a table may break after "_", "=", "." or "/", and between the words of a
# CamelCase name, as a browser breaks text at a space: a table of long names fits the page
# without breaking a name anywhere else (docs/_static/fit.css). The marks are <wbr>: copying
# the name copies it as written.
_BREAKS = re.compile(r"(?<=[_=./])(?=\w)|(?<=[a-z])(?=[A-Z])")


def _breakable_names(app: Any, doctree: Any, docname: str) -> None:
    from docutils import nodes

    for table in doctree.findall(nodes.table):
        for literal in list(table.findall(nodes.literal)):
            parts = _BREAKS.split(literal.astext())
            if len(parts) < 2 or any(not isinstance(c, nodes.Text) for c in literal.children):
                continue
            del literal[:]
            for index, part in enumerate(parts):
                if index:
                    literal += nodes.raw("", "<wbr>", format="html")
                literal += nodes.Text(part)


def setup(app: Any) -> dict[str, Any]:
    app.connect("doctree-resolved", _breakable_names)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
