"""The teaching notebooks under ``notebooks/`` (run by ``bash scripts/notebooks.sh``): every rule
of SEMANTICS.md is shown in one of them, named in the markdown cell just before the code that
shows it, and each notebook has a title and stores its outputs. This reads the notebooks' JSON
only: no kernel is started."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
from rules import ALL_RULE_IDS as RULE_IDS
from rules import RULE_ID

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"



def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def test_the_rule_list_has_all_50_ids():
    assert len(RULE_IDS) == len(set(RULE_IDS)) == 50


def test_there_are_notebooks_and_the_quickstart_is_among_them():
    names = {path.name for path in _notebooks()}
    assert "quickstart.ipynb" in names


def test_every_rule_id_is_named_in_a_markdown_cell_followed_by_code():
    named: set[str] = set()
    for path in _notebooks():
        cells = _load(path)["cells"]
        for cell, after in pairwise(cells):
            if cell["cell_type"] == "markdown" and after["cell_type"] == "code":
                named.update(RULE_ID.findall(_source(cell)))
    missing = [rule for rule in RULE_IDS if rule not in named]
    assert not missing, f"rules no notebook shows in a markdown cell before code: {missing}"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_each_notebook_has_a_title(path):
    cells = _load(path)["cells"]
    assert cells and cells[0]["cell_type"] == "markdown"
    assert _source(cells[0]).lstrip().startswith("# "), f"{path.name} starts without a title"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_each_notebook_stores_its_outputs(path):
    code = [cell for cell in _load(path)["cells"] if cell["cell_type"] == "code"]
    assert code, f"{path.name} has no code"
    unexecuted = [i for i, cell in enumerate(code) if cell.get("execution_count") is None]
    assert not unexecuted, f"{path.name}: code cells {unexecuted} were never executed"
    assert any(cell.get("outputs") for cell in code), f"{path.name} stores no outputs"
