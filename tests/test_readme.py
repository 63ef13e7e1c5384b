"""The README as a reader uses it: its examples run as written, and its install lines (and the
quick start's) work before there is a release.

The Python blocks of "Usage" run one after the other in a fresh kernel, as a reader following
the page would run them (a block after ``<!-- not run: REASON -->`` is left out, and says why);
the blocks of "In Jupyter" run in a fresh kernel of their own, as a person at a notebook runs
them, so they must bring everything they use.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import pyproject

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^(<!-- not run: [^>]+ -->\n)?```(\w+)\n(.*?)^```$", re.M | re.S)
BADGE_REPO = re.compile(r"mybinder\.org/v2/gh/([\w.-]+/[\w.-]+)/")


def section(title: str, text: str = README) -> str:
    """The text under the heading *title*, up to the next heading of the same or a higher
    level."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, re.M)
    assert match, f"no section {title!r}"
    rest = text[match.end():]
    end = re.search(rf"^#{{1,{len(match[1])}}} ", rest, re.M)
    return rest[:end.start()] if end else rest


def python_blocks(text: str) -> list[str]:
    """The ``python`` blocks of *text* that are meant to run, in order."""
    return [code for skip, language, code in BLOCK.findall(text)
            if language == "python" and not skip]


USAGE = section("Usage")
JUPYTER = section("In Jupyter", USAGE)
USAGE_BLOCKS = python_blocks(USAGE.replace(JUPYTER, ""))
JUPYTER_BLOCKS = python_blocks(JUPYTER)


def run_in_a_fresh_kernel(cells: list[str], tmp_path: Path, monkeypatch, interactive: str):
    """Execute *cells* in order in a new kernel of this Python, with a store of its own, in a
    folder of its own; nbclient raises at the first cell that ends in an error."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("NBBUDGET_HOME", str(tmp_path / "store"))
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", interactive)
    monkeypatch.delenv("AGENT_CALL_BUDGET_MS", raising=False)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return notebook


def test_the_readme_has_the_sections_and_blocks_these_tests_run() -> None:
    assert len(USAGE_BLOCKS) >= 5
    assert len(JUPYTER_BLOCKS) == 4
    assert "<!-- not run: " in USAGE  # and every block left out says why
    for skip in re.findall(r"<!-- not run: ([^>]*) -->", README):
        assert len(skip.split()) >= 3, skip


def test_the_in_jupyter_examples_start_by_loading_nbbudget_and_defining_what_they_use() -> None:
    first = JUPYTER_BLOCKS[0].splitlines()
    assert first[:2] == ["%load_ext nbbudget", "import nbbudget as nb"]
    for name in ("rows", "train", "work"):
        assert re.search(rf"^(def )?{name}\b", JUPYTER_BLOCKS[0], re.M), name


@pytest.mark.realclock
@pytest.mark.slow
def test_the_in_jupyter_examples_run_as_written_in_a_fresh_kernel(tmp_path, monkeypatch) -> None:
    notebook = run_in_a_fresh_kernel(JUPYTER_BLOCKS, tmp_path, monkeypatch, interactive="1")
    outputs = [o for cell in notebook.cells for o in cell.outputs]
    assert not [o for o in outputs if o["output_type"] == "error"]


@pytest.mark.realclock
@pytest.mark.slow
def test_the_usage_examples_run_as_written_one_after_the_other(tmp_path, monkeypatch) -> None:
    notebook = run_in_a_fresh_kernel(USAGE_BLOCKS, tmp_path, monkeypatch, interactive="0")
    printed = "".join(o.get("text", "") for cell in notebook.cells for o in cell.outputs)
    assert "Outcome(status='completed')" in printed
    assert '"exit_code": 14' in printed  # the call budget example pauses, as its comment says


# -- install ---------------------------------------------------------------------------------------
def install_lines(page: str) -> list[str]:
    blocks = [code for _, language, code in BLOCK.findall(section("Install", page))
              if language == "bash"]
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
            if line.startswith("pip install")]


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_install_names_a_checkout_or_the_git_url_of_the_repository_the_badge_opens(page) -> None:
    extras = set(pyproject()["project"]["optional-dependencies"])
    repo = BADGE_REPO.search(README)[1]
    from_git = re.compile(rf"^pip install 'nbbudget(\[([\w,-]+)\])? @ "
                          rf"git\+https://github\.com/{re.escape(repo)}'$")
    from_checkout = re.compile(r"^pip install (-e )?(\.|'\.\[([\w,-]+)\]')$")
    lines = install_lines((REPO / page).read_text(encoding="utf-8"))
    assert any(from_checkout.match(line) for line in lines)
    assert any(from_git.match(line) for line in lines)
    for line in lines:
        match = from_git.match(line) or from_checkout.match(line)
        assert match, f"{line!r} installs neither from a checkout nor from the git URL"
        named = match[2] if match.re is from_git else match[3]
        assert set((named or "").split(",")) - {""} <= extras, line
