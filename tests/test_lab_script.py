"""``bash scripts/lab.sh`` opens JupyterLab in ``scratch/``, a folder of the user's in which each
notebook of ``notebooks/`` is a link: a notebook the user makes, and what the cells write, stay
there, so ``notebooks/`` keeps only the project's notebooks (what
``test_the_notebooks_folder_holds_only_notebooks`` and ``bash scripts/notebooks.sh`` read);
and the kernel the lab offers has the name the notebooks store, so a notebook opens unmodified.

The script runs as written, in a copy of the repository's layout: its ``scripts/`` (lab.sh and
the kernel of ``scripts/jupyter``) and copies of the notebooks, with this Python's environment as
its ``.venv``. Its set-up steps (``scripts/setup.sh`` and ``scripts/labextension.sh``, which
install into ``.venv`` and build the JupyterLab extension) are left out there: the environment
the tests run in is set up already, and nothing is installed by a test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
KERNEL = REPO / "scripts" / "jupyter" / "kernels" / "python3" / "kernel.json"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The repository's layout for lab.sh, in *tmp_path*/repo."""
    pytest.importorskip("jupyterlab")
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "lab.sh", repo / "scripts" / "lab.sh")
    shutil.copytree(REPO / "scripts" / "jupyter", repo / "scripts" / "jupyter")
    for step in ("setup.sh", "labextension.sh"):  # done already: see the module's docstring
        (repo / "scripts" / step).write_text("exit 0\n")
    shutil.copytree(REPO / "notebooks", repo / "notebooks",
                    ignore=shutil.ignore_patterns(".*", "__pycache__"))
    (repo / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return repo


def lab_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's shell, with Jupyter's and IPython's own folders in
    *tmp_path*: nothing of this machine's Jupyter set-up is read, and nothing written to it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "NBBUDGET"))}
    for name in ("config", "data", "runtime", "ipython", "home", "settings", "workspaces"):
        (tmp_path / name).mkdir(exist_ok=True)
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               IPYTHONDIR=str(tmp_path / "ipython"), NBBUDGET_HOME=str(tmp_path / "home"))
    return env


def lab_sh(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(repo / "scripts" / "lab.sh"), *args],
                          env=lab_env(tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)


def links(folder: Path) -> dict[str, str]:
    return {p.name: os.readlink(p) for p in folder.iterdir() if p.is_symlink()}


def test_the_lab_folder_links_every_notebook_and_leaves_the_users_files_alone(
        checkout: Path, tmp_path: Path) -> None:
    # --version: jupyter lab answers and ends, after the script has made its folder
    first = lab_sh(checkout, tmp_path, "--version")
    assert first.returncode == 0, first.stderr
    scratch = checkout / "scratch"
    assert links(scratch) == {name: f"../notebooks/{name}" for name in NOTEBOOKS}
    assert all((scratch / name).read_bytes() == (checkout / "notebooks" / name).read_bytes()
               for name in NOTEBOOKS)

    # the user's own files; a notebook added to the project; one removed from it
    (scratch / "mine.ipynb").write_text("{}")
    (scratch / "data.csv").write_text("a,b\n")
    (scratch / "quickstart.ipynb").unlink()
    (scratch / "quickstart.ipynb").write_text('{"mine": true}')
    shutil.copy(checkout / "notebooks" / "what-if.ipynb", checkout / "notebooks" / "new.ipynb")
    (checkout / "notebooks" / "agents.ipynb").unlink()
    again = lab_sh(checkout, tmp_path, "--version")
    assert again.returncode == 0, again.stderr
    assert "[lab] scratch/quickstart.ipynb is yours, not a link to notebooks/quickstart.ipynb: " \
           "left as it is" in again.stderr
    assert (scratch / "quickstart.ipynb").read_text() == '{"mine": true}'
    assert (scratch / "mine.ipynb").read_text() == "{}"
    assert (scratch / "data.csv").read_text() == "a,b\n"
    expected = set(NOTEBOOKS) - {"quickstart.ipynb", "agents.ipynb"} | {"new.ipynb"}
    assert set(links(scratch)) == expected
    assert sorted(p.name for p in (checkout / "notebooks").iterdir()) == sorted(
        set(NOTEBOOKS) - {"agents.ipynb"} | {"new.ipynb"})


def test_the_git_ignores_the_lab_folder() -> None:
    assert "scratch/" in (REPO / ".gitignore").read_text().splitlines()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """JupyterLab as ``bash scripts/lab.sh`` starts it, on a port of its own, with a token."""

    def __init__(self, repo: Path, tmp_path: Path) -> None:
        self.port = _free_port()
        self.token = "lab-script-test"
        self.log = (tmp_path / "lab.log").open("w")
        self.process = subprocess.Popen(
            ["bash", str(repo / "scripts" / "lab.sh"), "--no-browser",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
             f"--LabApp.user_settings_dir={tmp_path / 'settings'}"],
            env=lab_env(tmp_path), stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.log_path = tmp_path / "lab.log"
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("api/status")
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"JupyterLab did not start:\n{self.log_path.read_text()}")
                time.sleep(0.3)

    def call(self, path: str, method: str = "GET", body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path}", data=data, method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def get(self, path: str) -> Any:
        return self.call(path)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.log.close()


@pytest.mark.slow
def test_jupyterlab_opens_in_the_lab_folder_where_new_files_stay(checkout: Path,
                                                                 tmp_path: Path) -> None:
    server = Server(checkout, tmp_path)
    try:
        root = server.get("api/contents")
        assert sorted(item["name"] for item in root["content"]) == NOTEBOOKS

        # a notebook the user makes lands in scratch/, never in notebooks/
        server.call("api/contents/mine.ipynb", "PUT", {
            "type": "notebook", "format": "json",
            "content": {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})
        assert (checkout / "scratch" / "mine.ipynb").is_file()
        assert sorted(p.name for p in (checkout / "notebooks").iterdir()) == NOTEBOOKS

        # the project's notebook saves through its link
        quickstart = server.get("api/contents/quickstart.ipynb")
        quickstart["content"]["metadata"]["saved-by-the-test"] = True
        server.call("api/contents/quickstart.ipynb", "PUT", {
            "type": "notebook", "format": "json", "content": quickstart["content"]})
        assert (checkout / "scratch" / "quickstart.ipynb").is_symlink()
        saved = json.loads((checkout / "notebooks" / "quickstart.ipynb").read_text())
        assert saved["metadata"]["saved-by-the-test"] is True

        # the kernel the lab offers is nbbudget's (scripts/jupyter), under the name every
        # notebook stores: JupyterLab opens them without rewriting their kernelspec
        specs = server.get("api/kernelspecs")
        offered = specs["kernelspecs"][specs["default"]]["spec"]
        assert offered["display_name"] == json.loads(KERNEL.read_text())["display_name"]
        for name in NOTEBOOKS:
            stored = server.get(f"api/contents/{name}")["content"]["metadata"]["kernelspec"]
            assert (stored["name"], stored["display_name"], stored["language"]) == (
                specs["default"], offered["display_name"], offered["language"]), name
    finally:
        server.stop()
    assert server.process.returncode is not None


def test_every_notebook_stores_the_kernel_of_the_lab() -> None:
    """JupyterLab writes the kernel's name and display name into a notebook it opens: one that
    stores other words opens "modified"."""
    spec = json.loads(KERNEL.read_text())
    for name in NOTEBOOKS:
        stored = json.loads((REPO / "notebooks" / name).read_text())["metadata"]["kernelspec"]
        assert stored == {"name": "python3", "display_name": spec["display_name"],
                          "language": spec["language"]}, name
