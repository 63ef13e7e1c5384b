"""The rules shipped in the package as Markdown (``nbbudget/rules/S0.md`` ..., one file per group,
read by ``nbbudget/core/rules.py``): one entry per rule of the model, in order, each with a title,
its text, and an example that runs as written; a file that breaks the form is refused, naming the
file and the line; and the package's messages cite a rule as ``(see: nbbudget explain ID)``, an
id from the table.

Every Python example runs in a fresh ``python`` process of its own (its own store, no settings in
the environment, stdin not a terminal) and must print exactly the output the table shows; every
notebook-cell example runs in a real kernel with nbbudget loaded and must end without error.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rules import ALL_RULE_IDS, RULE_ID

import nbbudget
from nbbudget.core.rules import GROUPS, RULES, find, read_group, see

PYTHON_RULES = [rule for rule in RULES if rule.language == "python"]
CELL_RULES = [rule for rule in RULES if rule.language == "ipython"]


def test_the_table_has_every_rule_once_in_order() -> None:
    assert [rule.id for rule in RULES] == ALL_RULE_IDS


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_every_rule_has_a_title_a_text_and_an_example(rule) -> None:
    assert rule.title and rule.title == rule.title.strip() and not rule.title.endswith(".")
    assert len(rule.text.split()) >= 8
    assert rule.example.strip()
    assert rule.language in ("python", "ipython")
    assert rule.anchor == rule.id.lower()


def test_a_python_example_imports_what_it_uses_and_shows_what_it_prints() -> None:
    for rule in PYTHON_RULES:
        assert "import nbbudget as nb" in rule.example, rule.id
        assert rule.output, rule.id
    for rule in CELL_RULES:
        assert rule.example.startswith("%%budget "), rule.id


def test_each_group_is_a_markdown_file_of_the_package_with_its_rules_in_order() -> None:
    folder = Path(nbbudget.__file__).parent / "rules"
    assert sorted(path.name for path in folder.iterdir()) == sorted(f"{g}.md" for g in GROUPS)
    for group in GROUPS:
        text = (folder / f"{group}.md").read_text(encoding="utf-8")
        headings = re.findall(r"^## (\S+): ", text, re.MULTILINE)
        assert headings == [rule.id for rule in RULES if rule.group == group]


SECTION = """\
# Task limits (S3)

## S3-1: one rule

Its text, in two
lines.

```python
import nbbudget as nb
print(  1)
```

It prints:

```text
   1
```

## S3-2: a cell

A cell's text.

```ipython
%%budget --steps 1
```
"""


def test_a_group_file_is_read_into_rules_with_their_text_example_output_and_language() -> None:
    first, second = read_group("S3", SECTION)
    assert first == RULES[0].__class__("S3-1", "one rule", "Its text, in two\nlines.",
                                       "import nbbudget as nb\nprint(  1)", "   1", "python")
    assert (second.id, second.text, second.example, second.output, second.language) == (
        "S3-2", "A cell's text.", "%%budget --steps 1", "", "ipython")


@pytest.mark.parametrize(("broken", "line"), [
    (SECTION.replace("```python", "```py"), 3),  # an example block of no language it knows
    (SECTION.replace("It prints:", "It shows:"), 3),  # words the form does not have
    (SECTION.replace("lines.\n", "lines.\n```text\nx\n```\n"), 3),  # a block in the text
    (SECTION.replace("## S3-2: a cell", "## S4-2: a cell"), 19),  # a rule of another group
    (SECTION.replace("## S3-2: a cell", "## S3-2 a cell"), 19),  # a heading without its colon
    (SECTION.rstrip("\n").removesuffix("```"), 19),  # a block never closed
])
def test_a_group_file_that_breaks_the_form_is_refused_naming_the_file_and_the_line(
        broken, line) -> None:
    with pytest.raises(ValueError) as err:
        read_group("S3", broken)
    assert str(err.value) == (
        f"nbbudget/rules/S3.md:{line}: a rule of group S3 is '## S3-N: title', its text, its "
        f"example in a ```python or ```ipython block, and what it prints in a ```text block "
        f"after 'It prints:'")


def test_find_takes_an_id_in_any_case() -> None:
    assert find("s0-10") is find("S0-10") is find(" S0-10 ")
    assert find("n-2").id == "N-2"


def test_find_names_an_unknown_id_and_the_known_ones() -> None:
    with pytest.raises(LookupError) as err:
        find("S9-1")
    assert str(err.value).startswith("no rule 'S9-1'; the rules are S0-1, S0-2, ")
    assert str(err.value).endswith("N-3, N-4, N-5, N-6, N-7")


def test_see_is_how_a_message_cites_a_rule() -> None:
    assert see("s4-5") == "(see: nbbudget explain S4-5)"


def test_plain_text_keeps_the_words_of_each_link() -> None:
    assert "[N-1](#n-1)" in find("S0-5").text
    assert "as described in N-1." in " ".join(find("S0-5").plain_text().split())


def _clean_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NBBUDGET_INTERACTIVE", "AGENT_CALL_BUDGET_MS")}
    env["NBBUDGET_HOME"] = str(tmp_path / "store")
    return env


@pytest.mark.realclock
@pytest.mark.parametrize("rule", PYTHON_RULES, ids=lambda rule: rule.id)
def test_every_python_example_prints_what_the_table_says(rule, tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", rule.example], env=_clean_env(tmp_path),
                          cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == rule.output + "\n"


@pytest.mark.realclock
@pytest.mark.slow
def test_every_cell_example_runs_in_a_real_kernel(tmp_path, monkeypatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for name, value in _clean_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AGENT_CALL_BUDGET_MS", raising=False)
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "1")  # a person: INCOMPLETE ends a cell normally
    cells = ["%load_ext nbbudget", *(rule.example for rule in CELL_RULES)]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(notebook, timeout=60, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError at the first cell that fails
    outputs = [o for cell in notebook.cells for o in cell.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert "started" in "".join(o.get("text", "") for o in notebook.cells[1].outputs)


# -- how the package's messages cite the rules -----------------------------------------------------
PACKAGE = Path(nbbudget.__file__).resolve().parent
CITED = re.compile(r"\(see: nbbudget explain (\w+-\d+)\)|^example: nbbudget explain (\S+)$")


def message_strings() -> list[tuple[str, str]]:
    """Every string in the package's code that is not documentation, with ``file:line``: a
    string that stands as a statement of its own (a docstring, or the docstring of a field
    written under it) is never shown to a user."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        found += [(f"{path.name}:{node.lineno}", node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings]
    return found


def test_every_rule_a_message_cites_is_cited_as_a_look_up_and_is_in_the_table() -> None:
    known = {rule.id for rule in RULES}
    bare, unknown, cited = [], [], 0
    for where, text in message_strings():
        for match in CITED.finditer(text):
            rule_id = match[1] or match[2]
            cited += 1
            if rule_id not in known:
                unknown.append(f"{where}: {rule_id}")
        bare += [f"{where}: {text!r}" for _ in RULE_ID.findall(CITED.sub("", text))]
    assert bare == [], "cite a rule as (see: nbbudget explain ID)"
    assert unknown == []
    assert cited >= 3  # the scan reads the messages that cite rules
