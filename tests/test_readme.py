"""The README as a reader uses it: every code block runs as written, on its own, and again
(examples are re-runnable); its install lines (and the quick start's) work before there is a
release.

Each block runs alone, twice, in a folder and a store (``NBBUDGET_HOME``) of its own: a Python
block in a fresh ``python``; a notebook block (one with IPython's ``%`` syntax) in a fresh kernel,
as a person at a notebook runs it, after the README's own cell that loads the extension when it
is a ``%%budget`` cell (a cell magic exists once it is loaded, as the README says); a shell block
in ``bash -e``, with this Python's commands first on its ``PATH``. A block after
``<!-- not run: REASON -->`` is not run, and says why (a block that installs something or opens
JupyterLab); a block after ``<!-- given: NAME.ipynb ... (WHY) -->`` runs with a small notebook of
each name in its folder, standing in for the reader's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import pyproject

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^(?:<!-- (not run|given): ([^>]+) -->\n)?```(\w+)\n(.*?)^```$",
                   re.M | re.S)
BADGE_REPO = re.compile(r"mybinder\.org/v2/gh/([\w.-]+/[\w.-]+)/")
LOAD = "%load_ext nbbudget"


@dataclass(frozen=True)
class Block:
    """A code block of the README: where it starts, how it runs, its code, and its mark."""

    line: int
    kind: str  # "python", "notebook" or "shell"
    code: str
    skipped: str | None = None  # why it is not run
    given: tuple[str, ...] = ()  # the notebooks it needs in its folder

    @property
    def id(self) -> str:
        return f"line {self.line}, {self.kind}"


def blocks(text: str = README) -> list[Block]:
    found = []
    for match in BLOCK.finditer(text):
        mark, note, language, code = match.groups()
        kind = {"bash": "shell", "python": "python"}[language]
        if kind == "python" and re.search(r"^%", code, re.M):
            kind = "notebook"
        given = tuple(re.findall(r"[\w.-]+\.ipynb", note)) if mark == "given" else ()
        found.append(Block(text.count("\n", 0, match.start(3)), kind, code,
                           note if mark == "not run" else None, given))
    return found


BLOCKS = blocks()
RUN = [block for block in BLOCKS if block.skipped is None]


def section(title: str, text: str = README) -> str:
    """The text under the heading *title*, up to the next heading of the same or a higher
    level."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, re.M)
    assert match, f"no section {title!r}"
    rest = text[match.end():]
    end = re.search(rf"^#{{1,{len(match[1])}}} ", rest, re.M)
    return rest[:end.start()] if end else rest


#: what a shell block must not do here: install something, or open JupyterLab (the scripts
#: install into .venv first)
NOT_HERE = re.compile(r"\bpip install\b|\bjupyter lab\b|\bscripts/\w+\.sh\b|\bapt(-get)? ")


def test_every_block_is_python_or_shell_and_one_not_run_says_why() -> None:
    assert len(BLOCKS) == len(re.findall(r"^```\w+$", README, re.M))  # every block was read
    assert len(RUN) >= 12
    for block in BLOCKS:
        if block.skipped is not None:
            assert len(block.skipped.split()) >= 3, block.skipped
    assert not [block.id for block in RUN if NOT_HERE.search(block.code)]


def test_the_notebook_blocks_begin_with_the_cell_that_loads_the_extension() -> None:
    notebook = [block for block in RUN if block.kind == "notebook"]
    assert notebook[0].code == LOAD + "\n"
    assert all(block.code.startswith("%%budget") for block in notebook[1:])


def stand_in(path: Path) -> None:
    """A small notebook with a cell tagged ``parameters`` (``region``), standing in for one of
    the reader's."""
    nbformat = pytest.importorskip("nbformat")
    cells = [nbformat.v4.new_code_cell("region = 'us'", metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell("print(f'report for {region}')")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)


def run_in_a_fresh_kernel(cells: list[str], tmp_path: Path) -> None:
    """Execute *cells* in order in a new kernel of this Python, with a store of its own, in a
    folder of its own; nbclient raises at the first cell that ends in an error."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()


@pytest.mark.realclock
@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=lambda block: block.id)
def test_every_block_runs_as_written_alone_and_again(block: Block, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NBBUDGET_HOME", str(tmp_path / "store"))
    monkeypatch.delenv("AGENT_CALL_BUDGET_MS", raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))
    for name in block.given:
        stand_in(tmp_path / name)
    if block.kind == "notebook":
        monkeypatch.setenv("NBBUDGET_INTERACTIVE", "1")  # a person at a notebook
        first = [LOAD] if block.code.startswith("%%budget") else []
        run_in_a_fresh_kernel([*first, block.code, block.code], tmp_path)
        return
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "0")
    if NOT_HERE.search(block.code):  # never run: it would install something, or open a lab
        pytest.fail(f"the block at {block.id} installs something or opens JupyterLab: mark it "
                    f"<!-- not run: WHY --> in the README")
    command = [sys.executable, "-c"] if block.kind == "python" else ["bash", "-e", "-c"]
    for attempt in ("first", "again"):
        done = subprocess.run([*command, block.code], capture_output=True, text=True,
                              timeout=180, stdin=subprocess.DEVNULL, check=False)
        assert done.returncode == 0, f"{attempt} run of the block at {block.id}:\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr


# -- install ---------------------------------------------------------------------------------------
def install_lines(page: str) -> list[str]:
    shell = [block.code for block in blocks(section("Install", page)) if block.kind == "shell"]
    return [line.split("#")[0].strip() for code in shell for line in code.splitlines()
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


#: every ``pip install`` of a page, in a code block or in running text (where it may be wrapped
#: across lines), and what it installs
PIP_INSTALL = re.compile(r"pip\s+install\s+(?:-e\s+)?('[^']*'|\"[^\"]*\"|[^\s`#'\"]+)")
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_every_install_line_installs_from_the_git_url_or_a_checkout(page: str) -> None:
    """There is no release: ``pip install 'nbbudget[lab]'`` fails. Every install a page shows
    names the git URL the README's Install section uses (that of the repository its Binder badge
    opens), or a checkout (``.``), and only extras that pyproject.toml defines."""
    extras = set(pyproject()["project"]["optional-dependencies"])
    repo = BADGE_REPO.search(README)[1]
    from_git = re.compile(rf"nbbudget(?:\[([\w,-]+)\])? @ git\+https://github\.com/"
                          rf"{re.escape(repo)}")
    from_checkout = re.compile(r"\.(?:\[([\w,-]+)\])?")
    text = (REPO / page).read_text(encoding="utf-8")
    for match in PIP_INSTALL.finditer(text):
        target = " ".join(match[1].strip("'\"").split())
        line = text.count("\n", 0, match.start()) + 1
        found = from_git.fullmatch(target) or from_checkout.fullmatch(target)
        assert found, (f"{page}:{line}: pip install {target!r} does not install from the git URL "
                       f"(pip install 'nbbudget[EXTRA] @ git+https://github.com/{repo}') nor "
                       f"from a checkout (pip install '.[EXTRA]')")
        assert set((found[1] or "").split(",")) - {""} <= extras, f"{page}:{line}: {target}"


def test_the_install_lines_of_the_pages_that_had_none_from_git_are_found() -> None:
    """The pages whose install lines named a release that does not exist are read by the test
    above: it finds their lines, in code blocks and wrapped in running text."""
    for page, least in {"docs/lab.md": 1, "docs/bounding-agents.md": 4, "docs/api.md": 2,
                        "docs/quickstart.md": 10, "README.md": 14}.items():
        found = PIP_INSTALL.findall((REPO / page).read_text(encoding="utf-8"))
        assert len(found) >= least, (page, found)


def test_installing_from_git_says_that_it_needs_node() -> None:
    """A git or checkout install builds the JupyterLab extension: without Node.js and npm,
    pip stops; the README's Install section, the quick start and the lab page say so."""
    for text in (section("Install"), section("Quick start"),
                 (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8"),
                 (REPO / "docs" / "lab.md").read_text(encoding="utf-8")):
        assert "Node.js 20.19 or newer" in " ".join(text.split())
    assert "`pip install -e .` in a checkout works without Node.js" in " ".join(
        section("Install").split())


# -- the Jupyter section ---------------------------------------------------------------------------
def test_the_jupyter_section_comes_first_and_says_the_three_clocks_and_what_a_stop_stops() -> None:
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings.index("In Jupyter") == headings.index("Quick start") + 1  # before the rest
    assert headings.index("In Jupyter") < headings.index("In Python")
    jupyter = section("In Jupyter")
    clocks = section("Three clocks: `--budget`, `--time`, `--timeout`")
    rows = [line for line in clocks.splitlines() if line.startswith("| `--")]
    assert [row.split("`")[1] for row in rows] == ["--budget DUR", "--time DUR", "--timeout DUR"]
    stop = " ".join(section("What a stop interrupts").split())
    for said in ("never calls nbbudget", "C code", "--cooperative", "except Exception"):
        assert said in stop, said
    assert "(docs/limits.md#what-a-stop-interrupts)" in stop
    assert re.search(r"^## What a stop interrupts$", (REPO / "docs" / "limits.md").read_text(
        encoding="utf-8"), re.M)
    assert "three-clocks" in jupyter


def test_the_jupyter_section_names_every_flag_of_the_cell_magic() -> None:
    from nbbudget.jupyter.magics import BudgetMagics

    flags = {option for action in BudgetMagics.budget_cell.parser._actions
             for option in action.option_strings if option not in ("-h", "--help")}
    named = set(re.findall(r"`(--[a-z-]+)", section("In Jupyter")))
    assert flags - named == set()
