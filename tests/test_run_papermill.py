"""papermill's notebooks as a regression set for ``nbbudget run``: the shapes papermill's own
tests run (parameters of every type its command line reads, a cell that fails, ``sys.exit(0)``,
a notebook with no ``parameters`` cell, a notebook executed before, with a stale
``language_info``), each executed by papermill's command and by ``nbbudget run`` in
subprocesses, and the two saved notebooks compared cell by cell: sources, tags, execution
counts, outputs, papermill's records and banners, the kernel's ``language_info``, the file's
mode, and the exit code.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import nbformat
import pytest
from test_run import env, nbbudget, papermill, write_notebook  # noqa: F401  (env: a fixture)

pytestmark = pytest.mark.realclock

#: a value of each kind papermill's ``-p`` reads, and the default it replaces
PARAMETERS = {"count": ("3", "0"), "ratio": ("0.5", "1.0"), "big": ("1e3", "0.0"),
              "below": ("-2", "0"), "flag": ("True", "False"), "off": ("False", "True"),
              "nothing": ("None", "'set'"), "words": ("two words", "'one'"),
              "empty": ("", "'full'"), "accents": ("héllo wörld", "'plain'"),
              "quote": ("it's \"quoted\"", "''")}
PYTHON_2 = {"name": "python", "version": "2.7.12", "pygments_lexer": "ipython2",
            "codemirror_mode": {"name": "ipython", "version": 2}}


def parameters_notebook(folder: Path, environ: dict[str, str]) -> tuple[Path, list[str]]:
    """A notebook whose ``parameters`` cell sets a default of each kind, recorded as run on
    Python 2.7.12; a cell prints what each became."""
    defaults = "\n".join(f"{name} = {default}" for name, (_, default) in PARAMETERS.items())
    path = write_notebook(folder / "parameters.ipynb",
                          f"for value in ({', '.join(PARAMETERS)}):\n"
                          f"    print(type(value).__name__, repr(value))",
                          parameters=defaults)
    raw = json.loads(path.read_text())
    raw["metadata"]["language_info"] = PYTHON_2
    raw["cells"].insert(0, nbformat.v4.new_markdown_cell("# Every kind of parameter"))
    path.write_text(json.dumps(raw))
    args = [word for name, (value, _) in PARAMETERS.items() for word in ("-p", name, value)]
    return path, args


def failing_notebook(folder: Path, environ: dict[str, str]) -> tuple[Path, list[str]]:
    return write_notebook(folder / "failing.ipynb", "print('before')",
                          "rows = [1, 2]\nrows[5]", "print('never')"), []


def exiting_notebook(folder: Path, environ: dict[str, str]) -> tuple[Path, list[str]]:
    return write_notebook(folder / "exiting.ipynb", "print('before')",
                          "import sys\nprint('leaving')\nsys.exit(0)", "print('never')"), []


def unparameterized_notebook(folder: Path,
                             environ: dict[str, str]) -> tuple[Path, list[str]]:
    return write_notebook(folder / "plain.ipynb", "print(alpha * 2, label)"), \
        ["-p", "alpha", "21", "-p", "label", "answer"]


def executed_before_notebook(folder: Path,
                             environ: dict[str, str]) -> tuple[Path, list[str]]:
    """A notebook papermill executed before, where a cell failed: its banners, outputs and
    records are in it; this time the parameters make every cell succeed."""
    write_notebook(folder / "source.ipynb", "if fail:\n    raise ValueError('asked to fail')",
                   "print('fail was', fail)", parameters="fail = True")
    before = papermill(environ, "source.ipynb", "before.ipynb", cwd=folder)
    assert before.code == 1, before.stderr
    return folder / "before.ipynb", ["-p", "fail", "False"]


SHAPES = {"parameters": parameters_notebook, "failing": failing_notebook,
          "sys.exit(0)": exiting_notebook, "no parameters cell": unparameterized_notebook,
          "executed before": executed_before_notebook}


def compared(path: Path) -> dict[str, Any]:
    """What the two tools must agree on in a saved notebook (its times, cell ids and paths
    aside)."""
    notebook = nbformat.read(path, 4)
    cells = []
    for cell in notebook.cells:
        record = cell.metadata.get("papermill", {})
        seen = {"type": cell.cell_type, "source": cell.source,
                "tags": cell.metadata.get("tags", []), "status": record.get("status")}
        if cell.cell_type == "code":
            seen.update(count=cell.execution_count, outputs=cell.outputs,
                        exception=record.get("exception"))
        cells.append(seen)
    papermill_record = notebook.metadata.papermill
    return {"cells": cells, "language_info": notebook.metadata.get("language_info"),
            "parameters": papermill_record.get("parameters"),
            "exception": papermill_record.get("exception"),
            "mode": stat.S_IMODE(path.stat().st_mode)}


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_nbbudget_run_saves_the_notebook_papermill_saves(env, tmp_path, shape):  # noqa: F811
    notebook, args = SHAPES[shape](tmp_path, env)
    by_papermill = papermill(env, notebook.name, "by-papermill.ipynb", *args, cwd=tmp_path)
    by_nbbudget = nbbudget(env, "run", notebook.name, *args, "--output", "by-nbbudget.ipynb",
                           "--budget", "0", cwd=tmp_path)
    assert by_nbbudget.code == by_papermill.code, by_nbbudget.stdout + by_papermill.stderr
    theirs = compared(tmp_path / "by-papermill.ipynb")
    ours = compared(tmp_path / "by-nbbudget.ipynb")
    assert len(ours["cells"]) == len(theirs["cells"])
    for index, (mine, expected) in enumerate(zip(ours["cells"], theirs["cells"], strict=True)):
        assert mine == expected, f"cell {index}"
    assert ours == theirs
    assert ours["language_info"]["version"] != "2.7.12"
    assert ours["mode"] == 0o666 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
