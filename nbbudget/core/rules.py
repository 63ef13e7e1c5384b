"""The rules of the model, each with an id (``S0-10``), as ``nbbudget explain ID`` prints them
and as the documentation's Concepts page shows them.

Error messages cite a rule as ``(see: nbbudget explain S0-10)``. The ids group the rules by where
they come from: ``S0`` the call budget, ``S2`` grants and cancellation, ``S3`` task limits, ``S4``
run limits, ``N`` notebooks. The texts are package data, one Markdown file per group
(``nbbudget/rules/S0.md`` ...), read here with `importlib.resources` when this module is first
imported (by ``nbbudget explain`` and the documentation build, never by ``import nbbudget``).

A group's file is a heading of its own and a few words, then per rule, in order::

    ## S0-10: no budget without a way to stop early

    The rule's text, in Markdown: a link is reduced to its words in a terminal, and
    ``[S0-3](#s0-3)`` points at a rule's target on the Concepts page (``concepts.html#s0-3``).

    ```python
    an example that runs as written (```ipython: a notebook cell, once %load_ext nbbudget has run)
    ```

    It prints:

    ```text
    what a Python example prints, exactly (its leading spaces kept)
    ```

A file that departs from this form raises a `ValueError` naming the file and the line.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from importlib import resources

__all__ = ["DOCS_PAGE", "GROUPS", "RULES", "Rule", "explain", "find", "index", "read_group", "see"]

#: the page of the documentation that explains every rule, one section each
DOCS_PAGE = "concepts"

#: the groups of rules in the order of the documentation, each a file ``nbbudget/rules/GROUP.md``
GROUPS = ("S0", "S2", "S3", "S4", "N")

_LINK = re.compile(r"\[([^\]]+)\]\([^)\s]+\)")
#: one rule of a group's file; the text and the blocks are lines (each with its newline) of
#: which none opens or closes a block
_SECTION = re.compile(
    r"## (?P<id>(?P<group>[A-Z]\d?)-\d+): (?P<title>\S[^\n]*)\n\n"
    r"(?P<text>(?:(?!```)[^\n]*\n)+?)\n"
    r"```(?P<language>python|ipython)\n(?P<example>(?:(?!```)[^\n]*\n)*)```\n"
    r"(?:\nIt prints:\n\n```text\n(?P<output>(?:(?!```)[^\n]*\n)*)```\n)?"
    r"\s*")


@dataclass(frozen=True)
class Rule:
    """One rule of the model.

    ``language`` is ``"python"`` for an example that runs in plain Python, ``"ipython"`` for a
    notebook cell that runs once ``%load_ext nbbudget`` has run. ``output`` is what a Python
    example prints, exactly.
    """

    id: str
    title: str
    text: str
    example: str
    output: str = ""
    language: str = "python"

    @property
    def anchor(self) -> str:
        """The rule's target in the documentation: ``s0-10``."""
        return self.id.lower()

    @property
    def group(self) -> str:
        """``S0``, ``S2``, ``S3``, ``S4`` or ``N``."""
        return self.id.partition("-")[0]

    def plain_text(self) -> str:
        """The text for a terminal: each Markdown link reduced to its words."""
        return _LINK.sub(r"\1", self.text)


def see(rule_id: str) -> str:
    """How a message cites a rule: ``(see: nbbudget explain S0-10)``."""
    return f"(see: nbbudget explain {find(rule_id).id})"


def find(rule_id: str) -> Rule:
    """The rule with this id, whatever its case; a `LookupError` naming the known ids if none."""
    wanted = rule_id.strip().upper()
    for rule in RULES:
        if rule.id == wanted:
            return rule
    raise LookupError(f"no rule {rule_id!r}; the rules are {', '.join(r.id for r in RULES)}")


def explain(rule: Rule, width: int = 88) -> str:
    """The rule for a terminal: its title, its text, its example, what that prints, and where
    the documentation explains it."""
    paragraphs = [textwrap.fill(" ".join(p.split()), width)
                  for p in rule.plain_text().split("\n\n")]
    where = ("Example, a notebook cell once %load_ext nbbudget has run:"
             if rule.language == "ipython" else "Example:")
    parts = [f"{rule.id}: {rule.title}", *paragraphs, where, _indent(rule.example)]
    if rule.output:
        parts += ["It prints:", _indent(rule.output)]
    parts.append(f"Read more: docs/{DOCS_PAGE}.md#{rule.anchor} "
                 f"(the Concepts page of the documentation)")
    return "\n\n".join(parts)


def index() -> str:
    """Every rule's id and title, one a line."""
    rows = [f"  {rule.id:<7}{rule.title}" for rule in RULES]
    return "\n".join(["The rules of the model; nbbudget explain ID shows one with an example:",
                      *rows])


def _indent(block: str) -> str:
    return textwrap.indent(block, "    ")


def read_group(group: str, source: str) -> tuple[Rule, ...]:
    """The rules in the text of one group's Markdown file, in the form this module's docstring
    shows; a `ValueError` naming the file and the line of a rule that breaks the form."""
    starts = [m.start() for m in re.finditer(r"^## ", source, re.MULTILINE)]
    rules = []
    for start, end in zip(starts, [*starts[1:], len(source)], strict=True):
        section = _SECTION.fullmatch(source, start, end)
        if section is None or section["group"] != group:
            line = source.count("\n", 0, start) + 1
            raise ValueError(f"nbbudget/rules/{group}.md:{line}: a rule of group {group} is "
                             f"'## {group}-N: title', its text, its example in a ```python or "
                             f"```ipython block, and what it prints in a ```text block after "
                             f"'It prints:'")
        rules.append(Rule(section["id"], section["title"], section["text"].strip(),
                          section["example"].removesuffix("\n"),
                          (section["output"] or "").removesuffix("\n"), section["language"]))
    return tuple(rules)


def _read_all() -> tuple[Rule, ...]:
    folder = resources.files("nbbudget") / "rules"
    return tuple(rule for group in GROUPS
                 for rule in read_group(group, (folder / f"{group}.md").read_text("utf-8")))


#: every rule, in the order of the documentation
RULES: tuple[Rule, ...] = _read_all()
