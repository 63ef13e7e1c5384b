"""The documentation site covers the package: every public name has an API entry, every rule of
the model is explained, and the reference pages are generated from the code they describe.

Sphinx is not needed here: these tests read the pages as text, and exercise the pure-Python half
of the docs' local extension (``docs/_ext/nbbudget_render.py``), which turns the magics' parser,
the command line's parser and the ``NBBudget`` traits into reStructuredText at build time.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from rules import NOTEBOOK_RULE_IDS
from rules import SEMANTIC_RULE_IDS as RULE_IDS

import nbbudget as nb
import nbbudget.testing

DOCS = Path(__file__).resolve().parent.parent / "docs"

PAGES = ["index", "quickstart", "concepts", "magics", "api", "run", "cli", "lab", "configuration",
         "bounding-agents", "limits", "scaling-out", "architecture"]
AUTODOC = re.compile(
    r"^\.\. auto(?:function|class|exception|data|attribute|method)::\s+([\w.]+)", re.M
)
AUTOMODULE = re.compile(r"^\.\. automodule::\s+([\w.]+)", re.M)


def page(name: str) -> str:
    return (DOCS / f"{name}.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def render() -> Iterator[ModuleType]:
    """The docs extension's renderer, imported from ``docs/_ext`` (no Sphinx needed)."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        yield importlib.import_module("nbbudget_render")
    finally:
        sys.path.remove(str(DOCS / "_ext"))
        sys.modules.pop("nbbudget_render", None)


def test_the_pinned_rule_list_has_every_id_once() -> None:
    assert len(RULE_IDS) == len(set(RULE_IDS)) == 43
    assert RULE_IDS[0] == "S0-1" and RULE_IDS[-1] == "S4-12"


def test_the_site_has_every_page_in_its_table_of_contents() -> None:
    toctree = page("index").split("```{toctree}", 1)[1].split("```", 1)[0]
    listed = [line.strip() for line in toctree.splitlines()
              if line.strip() and not line.strip().startswith(":")]
    assert listed == PAGES[1:]
    for name in PAGES:
        assert (DOCS / f"{name}.md").is_file(), name


def test_every_public_name_has_an_api_reference_entry() -> None:
    entries = set(AUTODOC.findall(page("api")))
    missing = [name for name in nb.__all__ if f"nbbudget.{name}" not in entries]
    assert missing == []


def test_the_testing_helpers_are_in_the_api_reference() -> None:
    text = page("api")
    documented = set(AUTODOC.findall(text))
    whole_module = "nbbudget.testing" in AUTOMODULE.findall(text)
    for name in nbbudget.testing.__all__:
        assert whole_module or f"nbbudget.testing.{name}" in documented, name


def test_the_pydantic_ai_adapter_has_its_section_when_the_module_exists() -> None:
    text = page("api")
    assert "(api-pydantic-ai)=" in text  # the section is there either way
    if (Path(nb.__file__).parent / "pydantic_ai.py").is_file():
        assert "nbbudget.pydantic_ai" in AUTOMODULE.findall(text)


RULES_DIRECTIVE = re.compile(r"^```\{nbbudget-rules\} (\S+)\n```$", re.M)


@pytest.fixture(scope="module")
def concepts(render: ModuleType) -> str:
    """The concepts page as the docs build reads it: each rules directive replaced by the
    Markdown it generates from the rules table."""
    return RULES_DIRECTIVE.sub(lambda m: "\n".join(render.rules_lines(m[1])), page("concepts"))


def test_the_rules_in_concepts_come_from_the_table_nbbudget_explain_prints() -> None:
    text = page("concepts")
    assert RULES_DIRECTIVE.findall(text) == ["S0", "S2", "S3", "S4", "N"]
    assert re.findall(r"^#+ [SN]\d?-\d+:", text, re.M) == []  # none written by hand


@pytest.mark.parametrize("rule", RULE_IDS + NOTEBOOK_RULE_IDS)
def test_every_rule_is_explained_under_its_own_heading_in_concepts(rule: str, concepts) -> None:
    heading = re.compile(rf"^#+ {re.escape(rule)}:\s+\S", re.M)
    assert heading.search(concepts), f"no '#### {rule}: ...' heading in concepts.md"
    assert f"({rule.lower()})=" in concepts, f"no ({rule.lower()})= target"


def test_concepts_explains_no_rule_that_is_not_pinned(concepts) -> None:
    headed = re.findall(r"^#+ ([SN]\d?-\d+):", concepts, re.M)
    assert headed == RULE_IDS + NOTEBOOK_RULE_IDS  # each once, in order


def test_a_rule_shows_its_text_its_example_and_what_the_example_prints(render) -> None:
    from nbbudget.core.rules import find

    rule = find("S0-10")
    text = "\n".join(render.rules_lines("S0"))
    entry = text.split("#### S0-10: ", 1)[1].split("\n(s0-11)=", 1)[0]
    assert entry.startswith(f"{rule.title}\n\n{rule.text}\n\n```python\n{rule.example}\n```")
    assert entry.rstrip().endswith(f"It prints:\n\n```text\n{rule.output}\n```")


def test_concepts_sets_the_three_clocks_side_by_side() -> None:
    text = page("concepts")
    clocks = text.split("## The three clocks", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in clocks.splitlines() if line.startswith("|"))
    for clock in ("call budget", "time grant", "wall-clock limit"):
        assert clock in header
    for flag in ("--budget", "--time", "--timeout"):
        assert f"`{flag}`" in clocks


def test_the_magics_page_is_generated_from_the_magics() -> None:
    text = page("magics")
    assert ".. nbbudget-magic:: nbbudget.jupyter.magics.BudgetMagics.budget_cell" in text
    assert ".. nbbudget-magic:: nbbudget.jupyter.magics.BudgetMagics.budget\n" in text


def test_every_budget_cell_flag_is_in_the_generated_magic_reference(render: ModuleType) -> None:
    from nbbudget.jupyter.magics import BudgetMagics

    lines = render.magic_lines("nbbudget.jupyter.magics.BudgetMagics.budget_cell", "%%budget")
    options = {line.split("::", 1)[1].split()[0]
               for line in lines if line.startswith(".. option::")}
    flags = {opt for action in BudgetMagics.budget_cell.parser._actions
             for opt in action.option_strings if opt not in ("-h", "--help")}
    assert {"--budget", "--detach", "--resume", "--steps", "--no-widget"} <= flags
    assert options == flags
    assert any(line.startswith("   %%budget [--budget DUR]") for line in lines)  # as typed
    assert "Run the cell under a budget" in "\n".join(lines)  # the magic's own docstring


def test_the_line_magic_reference_lists_its_commands(render: ModuleType) -> None:
    text = "\n".join(render.magic_lines("nbbudget.jupyter.magics.BudgetMagics.budget", "%budget"))
    for command in ("jobs", "wait", "cancel", "status", "trace"):
        assert command in text
    assert ".. option:: --timeout TIMEOUT" in text


def test_the_cli_page_is_generated_from_the_parser(render: ModuleType) -> None:
    assert ".. nbbudget-argparse:: nbbudget.cli.main:_parser" in page("cli")
    text = "\n".join(render.argparse_lines("nbbudget.cli.main:_parser"))
    assert ".. program:: nbbudget inspect" in text
    assert ".. option:: --json" in text
    assert ".. option:: TRACE.json" in text
    for program in ("run", "jobs", "cancel"):
        assert f".. program:: nbbudget {program}" in text
    assert ".. option:: -p NAME VALUE, --parameter NAME VALUE" in text


def test_the_configuration_page_lists_every_trait_and_variable(render: ModuleType) -> None:
    from nbbudget.jupyter.magics import NBBudget

    text = page("configuration")
    assert ".. nbbudget-traits:: nbbudget.jupyter.magics.NBBudget" in text
    generated = "\n".join(render.traits_lines("nbbudget.jupyter.magics.NBBudget"))
    for name in NBBudget.class_own_traits(config=True):
        assert f".. describe:: NBBudget.{name}" in generated
    for variable in ("AGENT_CALL_BUDGET_MS", "NBBUDGET_INTERACTIVE", "NBBUDGET_HOME"):
        assert f"`{variable}`" in text
    assert "at each call" in text


def test_the_limits_page_is_honest_about_threads_kernels_and_disks() -> None:
    text = page("limits")
    for phrase in ("cannot be killed", "abandoned", "C code", "ipykernel", "subshell",
                   "Stop button", "NFS", "WAL"):
        assert phrase in text, phrase


def test_the_architecture_page_draws_every_module_in_its_layer() -> None:
    """The diagram on the architecture page names each folder and every module in it, on the
    folder's lines, so a module added or moved without updating the page fails here."""
    text = page("architecture")
    diagram = text[text.index("```text"):text.index("```", text.index("```text") + 3)]
    package = Path(nb.__file__).resolve().parent
    for folder in sorted(p.parent for p in package.rglob("__init__.py") if p.parent != package):
        start = diagram.index(f"nbbudget/{folder.relative_to(package).as_posix()}/ ")
        stop = diagram.find("───", start)
        lines = diagram[start:stop]
        names = {m.stem for m in folder.glob("*.py") if m.stem != "__init__"}
        drawn = set(re.findall(r"\b[a-z_]+\b", lines))
        assert names <= drawn, f"{folder.name}: {sorted(names - drawn)} missing from the page"


def test_the_job_states_are_listed_once_in_the_words_of_job_state() -> None:
    """``nb.jobs``, ``%budget jobs`` and ``nbbudget jobs`` share one vocabulary; concepts lists
    it, and the pages about each listing link there."""
    section = page("concepts").split("## Job states", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert listed == [state.value for state in nb.JobState]
    for name in ("run", "magics", "quickstart"):
        assert "(concepts.md#job-states)" in page(name), name
    for name in PAGES:
        if name != "concepts":
            assert "| `starting` |" not in page(name), name
