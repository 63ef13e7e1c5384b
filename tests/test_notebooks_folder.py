"""``notebooks/`` is what a reader opens in JupyterLab's file browser: notebooks only. What runs
them under nbval (``bash scripts/notebooks.sh``) lives in ``scripts/nbval/``: the sanitising
patterns, and a pytest plugin that compares the response envelope (a JSON output) as canonical
text with those patterns applied.

The plugin is checked through pytest itself: a notebook whose stored envelope differs from the
fresh one only by its real duration passes with the script's flags, and fails without the
plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NBVAL = REPO / "scripts" / "nbval"
FLAGS = ["-p", "nbbudget_nbval", "--nbval-sanitize-with", "scripts/nbval/sanitize.cfg"]
MIME = "application/vnd.nbbudget.response+json"


def test_the_notebooks_folder_holds_only_notebooks() -> None:
    shown = sorted(p.name for p in (REPO / "notebooks").iterdir()
                   if not p.name.startswith(".") and p.name != "__pycache__")
    assert shown and [name for name in shown if not name.endswith(".ipynb")] == []


def test_the_notebooks_script_loads_the_plugin_and_the_patterns_from_scripts_nbval() -> None:
    script = (REPO / "scripts" / "notebooks.sh").read_text()
    assert 'PYTHONPATH="$PWD/scripts/nbval' in script
    assert " ".join(FLAGS) in " ".join(script.replace("\\\n", " ").split())
    assert (NBVAL / "nbbudget_nbval.py").is_file() and (NBVAL / "sanitize.cfg").is_file()


def envelope_notebook(path: Path) -> Path:
    """A notebook whose one cell shows an envelope; the stored output took 5 ms, a fresh run
    shows 7 ms."""
    nbformat = pytest.importorskip("nbformat")
    code = ("from IPython.display import display\n"
            f"display({{{MIME!r}: {{'ok': True, 'meta': {{'duration_ms': 7}}}}, "
            "'text/plain': 'done'}, raw=True)")
    stored = nbformat.v4.new_output("display_data", data={
        MIME: {"ok": True, "meta": {"duration_ms": 5}}, "text/plain": "done"})
    cell = nbformat.v4.new_code_cell(code, outputs=[stored], execution_count=1)
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    return path


def nbval(notebook: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("nbval")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(NBVAL), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", *flags,
         "-p", "no:cacheprovider", "-q", str(notebook)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_with_the_scripts_flags_an_envelope_compares_after_sanitising(tmp_path: Path) -> None:
    result = nbval(envelope_notebook(tmp_path / "envelope.ipynb"), *FLAGS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


@pytest.mark.slow
def test_without_the_plugin_the_same_envelope_differs(tmp_path: Path) -> None:
    result = nbval(envelope_notebook(tmp_path / "envelope.ipynb"), *FLAGS[2:])
    assert result.returncode == 1
    assert json.dumps({"duration_ms": 7})[1:-1] in result.stdout.replace("'", '"')
