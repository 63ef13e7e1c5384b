"""Sphinx configuration of nbbudget's documentation (Markdown pages with MyST).

Build it with ``bash scripts/docs.sh``: every warning is an error. The build needs no network.
"""

from __future__ import annotations

import sys
from pathlib import Path

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

html_theme = "alabaster"
html_title = f"nbbudget {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "Budgets for Jupyter",
    "fixed_sidebar": True,
}
