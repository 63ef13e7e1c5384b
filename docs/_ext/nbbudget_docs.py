"""Sphinx directives for reference pages generated from the code at build time.

Each directive renders reStructuredText (see ``nbbudget_render``) and parses it in place, so use
them inside an ``{eval-rst}`` block of a MyST page:

``.. nbbudget-magic:: MODULE.CLASS.METHOD``
    An IPython magic declared with ``@magic_arguments``: its usage line, its own docstring and
    one entry per argument, all read from the magic itself. ``:name:`` is the magic as a person
    types it (``%%budget``).

``.. nbbudget-argparse:: MODULE:FUNCTION``
    A command line built by an argparse parser factory: usage, description, arguments and every
    subcommand.

``.. nbbudget-traits:: MODULE.CLASS``
    The configurable traits of a traitlets class: name, type, default, help, and how to set it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from nbbudget_render import argparse_lines, import_object, magic_lines, traits_lines
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class _Generated(SphinxDirective):
    """Parse generated reStructuredText in place of the directive."""

    required_arguments = 1

    def render(self, lines: list[str]) -> list[nodes.Node]:
        self.note_source(self.arguments[0])
        container = nodes.container(classes=["nbbudget-generated"])
        source = self.get_source_info()[0] or self.env.docname
        self.state.nested_parse(StringList(lines, source=source), self.content_offset, container)
        return [container]

    def note_source(self, path: str) -> None:
        """Rebuild the page when the module the text comes from changes."""
        module = inspect.getmodule(import_object(path))
        filename = getattr(module, "__file__", None)
        if filename:
            self.env.note_dependency(filename)


class MagicDirective(_Generated):
    """``.. nbbudget-magic:: nbbudget._ipython.BudgetMagics.budget_cell``"""

    option_spec: ClassVar[dict[str, Callable[[str], Any]]] = {
        "name": directives.unchanged_required,
    }

    def run(self) -> list[nodes.Node]:
        path = self.arguments[0]
        name = self.options.get("name", "%" + path.rpartition(".")[2])
        return self.render(magic_lines(path, name))


class ArgparseDirective(_Generated):
    """``.. nbbudget-argparse:: nbbudget._cli:_parser``"""

    def run(self) -> list[nodes.Node]:
        return self.render(argparse_lines(self.arguments[0]))


class TraitsDirective(_Generated):
    """``.. nbbudget-traits:: nbbudget._ipython.NBBudget``"""

    def run(self) -> list[nodes.Node]:
        return self.render(traits_lines(self.arguments[0]))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nbbudget-magic", MagicDirective)
    app.add_directive("nbbudget-argparse", ArgparseDirective)
    app.add_directive("nbbudget-traits", TraitsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
