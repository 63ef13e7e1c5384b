"""A release is one step away: CI builds the sdist and the wheel (``bash scripts/build.sh``) and
checks them with ``twine check --strict`` and ``scripts/check_dist.py``: the sdist holds the
package and its metadata, the wheel holds every module and installs in a fresh virtual
environment, where ``import nbbudget`` and the ``nbbudget`` command work.

The slow test builds for real (``python -m build``, as the script does) and runs the checker on
what it built, then on a wheel that lacks a module, which the checker must refuse.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import pyproject

import nbbudget as nb

REPO = Path(__file__).resolve().parent.parent


def test_ci_runs_the_tests_first_and_builds_the_release_files() -> None:
    steps = [line.split(None, 1)[1] for line in (REPO / ".ci/run").read_text().splitlines()
             if line.startswith("step ")]
    assert steps[0] == "bash scripts/test.sh"
    assert "bash scripts/build.sh" in steps


def test_the_build_script_builds_into_dist_and_checks_what_it_built() -> None:
    script = (REPO / "scripts/build.sh").read_text()
    assert "bash scripts/setup.sh release" in script
    assert ".venv/bin/python -m build --outdir dist" in script
    assert ".venv/bin/python -m twine check --strict dist/*" in script
    assert ".venv/bin/python scripts/check_dist.py dist" in script
    assert "dist/" in (REPO / ".gitignore").read_text().splitlines()


def test_the_release_extra_brings_build_and_twine() -> None:
    extras = pyproject()["project"]["optional-dependencies"]
    names = [req.split(">")[0].split("=")[0] for req in extras["release"]]
    assert names == ["build", "twine"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built from a copy of the repository's package files."""
    pytest.importorskip("build")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "nbbudget", source / "nbbudget",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests", source / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                           capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def check_dist(dist: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(REPO / "scripts/check_dist.py"), str(dist)],
                          capture_output=True, text=True, timeout=600, check=False, env=env)


@pytest.mark.slow
def test_the_built_sdist_and_wheel_pass_the_checks(dist: Path) -> None:
    result = check_dist(dist)
    assert (result.returncode, result.stderr) == (0, "")
    version = nb.__version__
    assert result.stdout.splitlines() == [
        f"sdist nbbudget-{version}.tar.gz: the package, README.md, LICENSE and pyproject.toml",
        f"wheel nbbudget-{version}-py3-none-any.whl: every module, py.typed and the nbbudget "
        f"command",
        f"wheel installed in a fresh virtual environment: import nbbudget {version} and "
        f"nbbudget explain S0-10 work",
    ]


@pytest.mark.slow
def test_a_wheel_without_a_module_is_refused_naming_it(dist: Path, tmp_path: Path) -> None:
    shutil.copy(next(dist.glob("*.tar.gz")), tmp_path)
    wheel = next(dist.glob("*.whl"))
    with zipfile.ZipFile(wheel) as full, zipfile.ZipFile(tmp_path / wheel.name, "w") as cut:
        for item in full.infolist():
            if item.filename != "nbbudget/core/rules.py":
                cut.writestr(item, full.read(item))
    result = check_dist(tmp_path)
    assert result.returncode == 1
    assert result.stderr == (f"check_dist.py: {wheel.name} lacks nbbudget/core/rules.py; "
                             f"check [tool.setuptools] in pyproject.toml\n")
