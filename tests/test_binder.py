"""The Binder setup (``binder/``), how kernels load nbbudget at start, and the README's Binder
badge; nothing is built or installed."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from conftest import pyproject

REPO = Path(__file__).resolve().parent.parent
BINDER = REPO / "binder"
BADGE = re.compile(r"\[!\[Binder\]\(https://mybinder\.org/badge_logo\.svg\)\]"
                   r"\((https://mybinder\.org/v2/gh/[\w.-]+/[\w.-]+/HEAD\?urlpath=([^)\s]+))\)")


def test_postBuild_is_an_executable_script_that_stops_at_the_first_error():
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK)
    text = post_build.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text  # repo2docker ignores a failing postBuild otherwise


def test_postBuild_installs_the_package_from_the_repository_with_the_lab_extra():
    text = (BINDER / "postBuild").read_text()
    assert 'cd "$(dirname "${BASH_SOURCE[0]}")/.."' in text
    assert re.search(r'pip install .*-e "\.\[lab\]"', text)


LOAD_LINE = "__import__('nbbudget').load_ipython_extension(get_ipython())"


def test_postBuild_and_the_lab_kernel_load_the_extension_at_start_the_same_way():
    text = (BINDER / "postBuild").read_text()
    assert "ipython profile create" in text and "ipython_kernel_config.py" in text
    assert f'c.InteractiveShellApp.exec_lines = ["{LOAD_LINE}"]' in text
    spec = json.loads((REPO / "scripts/jupyter/kernels/python3/kernel.json").read_text())
    assert f"--IPKernelApp.exec_lines={LOAD_LINE}" in spec["argv"]


def test_loaded_at_start_a_notebooks_own_load_ext_stays_silent(capsys, home):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    try:
        shell.run_cell(LOAD_LINE)  # what the kernel runs at start
        assert "budget" in shell.magics_manager.magics["cell"]
        capsys.readouterr()
        shell.run_line_magic("load_ext", "nbbudget")  # the quickstart's first cell
        assert capsys.readouterr().out == ""
        assert shell.run_cell("%%budget --steps 2 --no-widget\n1 + 1").result == 2
    finally:
        shell.run_line_magic("unload_ext", "nbbudget")


def test_binder_pins_python_3_11():
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"


def test_binder_requirements_are_the_projects_own():
    project = pyproject()["project"]
    declared = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared.update(extra)
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    wanted = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert wanted
    assert [req for req in wanted if req not in declared] == []


def test_there_is_one_binder_folder():
    assert not (REPO / ".binder").exists()  # repo2docker refuses binder/ and .binder/ together


def test_the_readme_badge_opens_the_quickstart_in_jupyterlab():
    found = BADGE.findall((REPO / "README.md").read_text())
    assert len(found) == 1, "one Binder badge in README.md"
    url, urlpath = found[0]
    assert url.startswith("https://mybinder.org/v2/gh/nbbudget/nbbudget/HEAD?")
    assert urlpath == "lab/tree/notebooks/quickstart.ipynb"
    assert (REPO / urlpath.removeprefix("lab/tree/")).is_file()


def test_postBuild_names_the_kernel_as_the_notebooks_store_it():
    import json

    named = re.search(r'--name python3 --display-name "([^"]+)"',
                      (BINDER / "postBuild").read_text())
    assert named is not None
    stored = {json.loads(path.read_text())["metadata"]["kernelspec"]["display_name"]
              for path in (REPO / "notebooks").glob("*.ipynb")}
    assert stored == {named.group(1)}
