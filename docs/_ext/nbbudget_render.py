"""Reference text generated from the code: an IPython magic, an argparse command line and the
configurable traits of a traitlets class, each as lines of reStructuredText; the rules of the
model, from their Markdown files read by ``nbbudget.core.rules``, and the kinds of limits, from
the table in ``nbbudget.core.kinds``, as lines of Markdown (MyST).

This module needs neither Sphinx nor docutils, so the test suite can check what the
documentation will say; ``nbbudget_docs`` wraps it in Sphinx directives.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from typing import Any

__all__ = ["argparse_lines", "escape", "import_object", "kinds_lines", "magic_lines",
           "rules_lines", "source_docstring", "traits_lines", "usage"]

WIDTH = 88  # usage lines and help are wrapped at this width, whatever the terminal
_SPECIAL = re.compile(r"([\\*`|_\[\]])")


def escape(text: str) -> str:
    """Plain text made safe to embed in reStructuredText: no markup is interpreted."""
    return _SPECIAL.sub(r"\\\1", text)


def import_object(path: str) -> Any:
    """``package.module.Class.attr`` or ``package.module:function``: the object it names."""
    if ":" in path:
        module_name, _, attrs = path.partition(":")
        obj: Any = importlib.import_module(module_name)
        for attr in attrs.split("."):
            obj = getattr(obj, attr)
        return obj
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {path!r}")


def source_docstring(cls: type, method: str) -> str:
    """The docstring a method was written with. ``@magic_arguments`` rewrites ``__doc__`` to
    add the usage and the options; the source keeps the author's text."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
            return ast.get_docstring(node) or ""
    raise LookupError(f"{cls.__qualname__}.{method} not found in its source")


def usage(parser: argparse.ArgumentParser, prog: str) -> str:
    """The usage line of *parser*, as *prog*, wrapped at a fixed width."""
    formatter = argparse.HelpFormatter(prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    prefix = "usage: "
    lines = formatter.format_help().strip().removeprefix(prefix).splitlines()
    # continuation lines are indented under the program name, which now starts the line
    return "\n".join([lines[0], *(line[len(prefix):] for line in lines[1:])])


def _documented(action: argparse.Action) -> bool:
    return not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))


def option_label(action: argparse.Action) -> str:
    """How an argument is written: ``--steps N``, ``--detach`` or ``command``."""
    if not action.option_strings:
        return str(action.metavar or action.dest)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):  # several values: -p NAME VALUE
        metavar = " ".join(metavar)
    return ", ".join(f"{opt} {metavar}" for opt in action.option_strings)


def expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An argument's help as argparse prints it (``%(default)s`` filled in, ``%%`` halved)."""
    if not action.help:
        return ""
    return parser._get_formatter()._expand_help(action)


def argument_lines(parser: argparse.ArgumentParser) -> Iterator[str]:
    """One ``.. option::`` entry per argument of *parser* (help and subcommands aside)."""
    for action in filter(_documented, parser._actions):
        yield f".. option:: {option_label(action)}"
        yield ""
        text = expanded_help(parser, action)
        if action.choices and not action.option_strings:
            text = f"One of: {', '.join(map(str, action.choices))}. {text}"
        for line in textwrap.wrap(escape(text), WIDTH) or ["(no help)"]:
            yield f"   {line}"
        yield ""


def literal_lines(text: str) -> Iterator[str]:
    yield ".. code-block:: text"
    yield ""
    for line in text.splitlines():
        yield f"   {line}" if line.strip() else ""
    yield ""


def magic_lines(path: str, name: str) -> list[str]:
    """A magic declared with ``@magic_arguments`` (*path*: ``module.Class.method``), typed as
    *name* (``%%budget``): its usage, its docstring and its arguments."""
    cls_path, _, method = path.rpartition(".")
    cls = import_object(cls_path)
    parser = getattr(cls, method).parser
    # option targets are named after the program, and Sphinx's ids cannot hold "%"
    program = f"{name.lstrip('%')} {'cell' if name.startswith('%%') else 'line'} magic"
    lines = [f".. program:: {program}", "", *literal_lines(usage(parser, name))]
    lines += source_docstring(cls, method).splitlines()
    lines += ["", ".. rubric:: Arguments", "", *argument_lines(parser)]
    return lines


def argparse_lines(path: str) -> list[str]:
    """The command line built by the parser factory *path* (``module:function``)."""
    parser = import_object(path)()
    return list(_program_lines(parser, parser.prog))


def _program_lines(parser: argparse.ArgumentParser, prog: str) -> Iterator[str]:
    yield f".. program:: {prog}"
    yield ""
    yield from literal_lines(usage(parser, prog))
    if parser.description:
        yield escape(parser.description)
        yield ""
    if any(map(_documented, parser._actions)):
        yield ".. rubric:: Arguments"
        yield ""
        yield from argument_lines(parser)
    if parser.epilog:
        yield from literal_lines(parser.epilog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for sub_name, sub in action.choices.items():
                yield f".. rubric:: {prog} {sub_name}"
                yield ""
                if helps.get(sub_name) and not sub.description:
                    yield escape(str(helps[sub_name]))
                    yield ""
                yield from _program_lines(sub, f"{prog} {sub_name}")


def traits_lines(path: str) -> list[str]:
    """The configurable traits of the traitlets class *path*, one entry each."""
    cls = import_object(path)
    lines: list[str] = []
    for name, trait in sorted(cls.class_own_traits(config=True).items()):
        default = trait.default_value_repr()
        lines += [f".. describe:: {cls.__name__}.{name}", ""]
        lines += [f"   :type: ``{type(trait).__name__}``", f"   :default: ``{default}``"]
        lines += [f"   :set with: ``%config {cls.__name__}.{name} = {default}``", ""]
        lines += [f"   {line}" for line in textwrap.wrap(escape(trait.help), WIDTH)]
        lines += [""]
    return lines


def rules_lines(group: str) -> list[str]:
    """The rules whose ids start with *group* (``S0``, ..., ``N``), each under a heading of its
    own with a target named after its id, its text, its example and what the example prints."""
    from nbbudget.core.rules import RULES

    rules = [rule for rule in RULES if rule.group == group]
    if not rules:
        raise LookupError(f"no rules in group {group!r}")
    lines: list[str] = []
    for rule in rules:
        lines += [f"({rule.anchor})=", f"#### {rule.id}: {rule.title}", "", rule.text, ""]
        if rule.language == "ipython":
            lines += ["In a notebook, once `%load_ext nbbudget` has run:", ""]
        lines += ["```python", rule.example, "```", ""]
        if rule.output:
            lines += ["It prints:", "", "```text", rule.output, "```", ""]
    return "\n".join(lines).splitlines()


KINDS_HEAD = ("kind", "what it counts", "unit", "flag", "JSON key", "error code",
              "window with `suspend=True`")


def kinds_lines() -> list[str]:
    """The table of kinds as a Markdown table, one row per kind in the attribution order: its
    `Limits` field, what it counts, its unit, its flag in ``%%budget`` and ``nbbudget run``
    (with the value it takes), its JSON keys, its error code, and whether it is a window."""
    from nbbudget.core.kinds import KINDS
    from nbbudget.core.limits import budget_flags

    metavars = {flag: options["metavar"] for flag, options in budget_flags()}
    lines = [_row(KINDS_HEAD), _row(("---",) * len(KINDS_HEAD))]
    for kind in KINDS:
        lines.append(_row((f"`{kind.name}`", kind.counts, kind.unit,
                           f"`{kind.flag} {metavars[kind.flag]}`",
                           f"`{kind.key}` or `{kind.name}`", f"`{kind.code}`",
                           "yes" if kind.window else "no")))
    return lines


def _row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(cells) + " |"
