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

One directive is written in Markdown and goes straight into a MyST page, outside ``{eval-rst}``:

````
```{nbbudget-rules} S0
```
````
    The rules of one group (``S0``, ``S2``, ``S3``, ``S4`` or ``N``) from its Markdown file,
    ``nbbudget/rules/S0.md``, which ``nbbudget explain`` prints from too (read by
    ``nbbudget.core.rules``): one heading and target (``(s0-10)=``) per rule,
    its text, its example and what the example prints.

````
```{nbbudget-kinds}
```
````
    The table of kinds from ``nbbudget.core.kinds``, the one ``Limits``, the JSON keys and the
    flags follow: per kind what it counts, its unit, flag, JSON key, error code and whether it
    is a window with ``suspend=True``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from nbbudget_render import (
    argparse_lines,
    import_object,
    kinds_lines,
    magic_lines,
    rules_lines,
    traits_lines,
)
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


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
    """``.. nbbudget-magic:: nbbudget.jupyter.magics.BudgetMagics.budget_cell``"""

    option_spec: ClassVar[dict[str, Callable[[str], Any]]] = {
        "name": directives.unchanged_required,
    }

    def run(self) -> list[nodes.Node]:
        path = self.arguments[0]
        name = self.options.get("name", "%" + path.rpartition(".")[2])
        return self.render(magic_lines(path, name))


class ArgparseDirective(_Generated):
    """``.. nbbudget-argparse:: nbbudget.cli.main:_parser``"""

    def run(self) -> list[nodes.Node]:
        return self.render(argparse_lines(self.arguments[0]))


class TraitsDirective(_Generated):
    """``.. nbbudget-traits:: nbbudget.jupyter.magics.NBBudget``"""

    def run(self) -> list[nodes.Node]:
        return self.render(traits_lines(self.arguments[0]))


class RulesDirective(SphinxDirective):
    """```{nbbudget-rules} S0``` in a MyST page: the group's rules, parsed as Markdown in place,
    their headings nested under the section the directive sits in."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        import nbbudget

        source = Path(nbbudget.__file__).parent / "rules" / f"{self.arguments[0]}.md"
        self.env.note_dependency(str(source))
        holder = nodes.section()
        holder.document = self.state.document
        lines = StringList(rules_lines(self.arguments[0]), source=f"nbbudget/rules/{source.name}")
        nested_parse_with_titles(self.state, lines, holder)
        return holder.children


class KindsDirective(SphinxDirective):
    """```{nbbudget-kinds}``` in a MyST page: the table of kinds, parsed as Markdown in place."""

    def run(self) -> list[nodes.Node]:
        import nbbudget.core.kinds

        self.env.note_dependency(nbbudget.core.kinds.__file__)
        container = nodes.container(classes=["nbbudget-generated"])
        lines = StringList(kinds_lines(), source="nbbudget/core/kinds.py")
        self.state.nested_parse(lines, self.content_offset, container)
        return [container]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nbbudget-magic", MagicDirective)
    app.add_directive("nbbudget-argparse", ArgparseDirective)
    app.add_directive("nbbudget-traits", TraitsDirective)
    app.add_directive("nbbudget-rules", RulesDirective)
    app.add_directive("nbbudget-kinds", KindsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
