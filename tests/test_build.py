"""A release is one step away: CI builds the sdist and the wheel (``bash scripts/build.sh``) and
checks them with ``twine check --strict`` and ``scripts/check_dist.py``: the sdist holds the
package and its metadata, the wheel holds every module and installs in a fresh virtual
environment, where ``import nbbudget`` and the ``nbbudget`` command work.

The slow test builds for real (``python -m build``, as the script does) and runs the checker on
what it built, then on a wheel that lacks a module, which the checker must refuse.

Every requirement has a lower bound, and CI installs each one (``scripts/versions.sh``, its
"lowest" entry, from the constraints ``scripts/lower_bounds.py`` writes) and runs the tests
there, so a bound is a release the tests pass with.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import pyproject
from packaging.requirements import Requirement
from packaging.version import Version
from rules import ALL_RULE_IDS

import nbbudget as nb

REPO = Path(__file__).resolve().parent.parent


def test_ci_runs_the_tests_first_and_builds_the_release_files() -> None:
    steps = [line.split(None, 1)[1] for line in (REPO / ".ci/run").read_text().splitlines()
             if line.startswith("step ")]
    assert steps[0] == "bash scripts/test.sh"
    assert "bash scripts/build.sh" in steps


def test_ci_runs_ruff_and_mypy_after_the_tests_at_the_pinned_releases() -> None:
    steps = [line.split(None, 1)[1] for line in (REPO / ".ci/run").read_text().splitlines()
             if line.startswith("step ")]
    assert steps[:2] == ["bash scripts/test.sh", "bash scripts/checks.sh"]
    script = (REPO / "scripts/checks.sh").read_text()
    assert "\nbash scripts/setup.sh dev\n" in script  # the extra that pins them
    assert "\n.venv/bin/ruff check || status=1\n" in script
    assert "\n.venv/bin/mypy --strict nbbudget || status=1\n" in script
    assert script.endswith('\nexit "$status"\n')


def test_the_pre_commit_hooks_run_the_same_checks_from_the_same_environment() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert hooks["ruff"]["entry"] == ".venv/bin/ruff check --force-exclude"
    assert hooks["mypy"]["entry"] == ".venv/bin/mypy --strict nbbudget"
    assert hooks["mypy"]["pass_filenames"] is False  # the whole package, as CI checks it
    assert {hook["language"] for hook in hooks.values()} == {"system"}


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


def test_every_requirement_has_a_lower_bound() -> None:
    project = pyproject()["project"]
    unbounded = [
        (where, line)
        for where, lines in [("dependencies", project["dependencies"]),
                             *project["optional-dependencies"].items()]
        for line in lines
        if Requirement(line).name != "nbbudget"
        and not any(spec.operator in (">=", "==") for spec in Requirement(line).specifier)
    ]
    assert unbounded == []


def test_the_dev_extra_pins_ruff_and_mypy_and_brings_pre_commit() -> None:
    dev = pyproject()["project"]["optional-dependencies"]["dev"]
    pinned = {Requirement(line).name: str(Requirement(line).specifier) for line in dev}
    assert re.fullmatch(r"==\d+\.\d+\.\d+", pinned["ruff"])
    assert re.fullmatch(r"==\d+\.\d+\.\d+", pinned["mypy"])
    assert "pre-commit" in pinned


def test_ci_runs_the_tests_on_the_oldest_releases_allowed() -> None:
    steps = [line.split(None, 1)[1] for line in (REPO / ".ci/run").read_text().splitlines()
             if line.startswith("step ")]
    assert "bash scripts/versions.sh" in steps
    script = (REPO / "scripts/versions.sh").read_text()
    # 3.11 runs the whole suite (.venv); 3.12 and 3.13 the fast tests; 3.10 the oldest releases
    assert 'for entry in ${PYTHONS:-3.12 3.13 lowest}; do' in script
    assert "make_venv .venv-versions/lowest-3.10 3.10 lowest" in script
    assert '"$venv/bin/python" scripts/lower_bounds.py "$lowest_extras" > "$venv/constraints.txt"' \
        in script
    assert '"${pip[@]}" -c "$venv/constraints.txt" -e ".[$lowest_extras]"' in script


def load_lower_bounds() -> object:
    """``scripts/lower_bounds.py`` as a module."""
    spec = importlib.util.spec_from_file_location("lower_bounds", REPO / "scripts/lower_bounds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROJECT = {
    "name": "nbbudget",
    "dependencies": ["ipython>=8.12", "traitlets>=5.9"],
    "optional-dependencies": {
        "test": ["pytest>=8.2,<10", "nbbudget[dask]", "IPython>=8.20",
                 "tomli>=2; python_version < '3'", "papermill==2.5.0"],
        "dask": ["distributed>=2026.8.0"],
        "docs": ["sphinx>=9.0.4"],
        "dev": ["nbbudget[test]", "ruff"],
    },
}


def test_the_constraints_pin_each_requirement_that_applies_here_to_its_lower_bound() -> None:
    lower_bounds = load_lower_bounds().lower_bounds  # type: ignore[attr-defined]
    # the extras asked for and those they ask for (nbbudget[dask]), not the others (docs);
    # a package asked for twice at its higher bound; a marker that does not hold, left out
    assert lower_bounds(PROJECT, ["test"]) == {
        "ipython": Version("8.20"), "traitlets": Version("5.9"), "pytest": Version("8.2"),
        "papermill": Version("2.5.0"), "distributed": Version("2026.8.0")}
    assert lower_bounds(PROJECT, []) == {"ipython": Version("8.12"), "traitlets": Version("5.9")}


def test_a_requirement_without_a_lower_bound_is_refused_naming_it() -> None:
    module = load_lower_bounds()
    with pytest.raises(module.Refused) as refused:  # type: ignore[attr-defined]
        module.lower_bounds(PROJECT, ["dev"])  # type: ignore[attr-defined]
    assert str(refused.value) == ("'ruff' in dev has no lower bound; give it the oldest release "
                                  "the tests pass with, as '>=VERSION'")
    with pytest.raises(module.Refused) as refused:  # type: ignore[attr-defined]
        module.lower_bounds(PROJECT, ["lab"])  # type: ignore[attr-defined]
    assert str(refused.value) == ("pyproject.toml has no extra 'lab'; the extras are dask, dev, "
                                  "docs, test")


def test_the_script_prints_a_constraints_file_of_the_repositorys_bounds() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts/lower_bounds.py"), "test,frames"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    pins = dict(line.split("==") for line in done.stdout.splitlines())
    frames = Requirement(pyproject()["project"]["optional-dependencies"]["frames"][0])
    assert pins["pandas"] == next(spec.version for spec in frames.specifier)
    assert {"ipython", "traitlets", "ipywidgets", "ipykernel", "pytest", "distributed"} <= set(pins)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built from a copy of the repository's package files."""
    pytest.importorskip("build")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE", "package.json", "package-lock.json",
                 "tsconfig.json", "install.json"):
        shutil.copy(REPO / name, source / name)
    # the package with the extension as setup built it (the build then skips npm), and what
    # builds it again
    shutil.copytree(REPO / "nbbudget", source / "nbbudget",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("tests", "jupyter-config", "src", "schema", "style"):
        shutil.copytree(REPO / folder, source / folder,
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
        f"sdist nbbudget-{version}.tar.gz: the package, the JupyterLab extension built and its "
        f"sources, README.md, LICENSE and pyproject.toml",
        f"wheel nbbudget-{version}-py3-none-any.whl: every module, py.typed, the nbbudget "
        f"command and the JupyterLab extension",
        f"wheel installed in a fresh virtual environment: import nbbudget {version}, "
        f"nbbudget explain lists the {len(ALL_RULE_IDS)} rules and explains S0-1, the "
        f"JupyterLab extension is "
        f"in share/jupyter/labextensions",
    ]
    with zipfile.ZipFile(next(dist.glob("*.whl"))) as wheel:
        shipped = sorted(n for n in wheel.namelist() if n.startswith("nbbudget/rules/"))
    assert shipped == [f"nbbudget/rules/{group}.md" for group in ("N", "S0", "S2", "S3", "S4")]
    # the file that enables the server extension where the wheel is installed, and in the sdist
    config = "etc/jupyter/jupyter_server_config.d/nbbudget.json"
    with zipfile.ZipFile(next(dist.glob("*.whl"))) as wheel:
        enabling = json.loads(wheel.read(f"nbbudget-{version}.data/data/{config}"))
    assert enabling == {"ServerApp": {"jpserver_extensions": {"nbbudget.jupyter.server": True}}}
    with tarfile.open(next(dist.glob("*.tar.gz"))) as sdist:
        assert f"nbbudget-{version}/jupyter-config/jupyter_server_config.d/nbbudget.json" in \
            sdist.getnames()


@pytest.mark.slow
@pytest.mark.parametrize("left_out", ["nbbudget/core/rules.py", "nbbudget/rules/S2.md"])
def test_a_wheel_without_a_module_or_a_rules_file_is_refused_naming_it(
        dist: Path, tmp_path: Path, left_out: str) -> None:
    shutil.copy(next(dist.glob("*.tar.gz")), tmp_path)
    wheel = next(dist.glob("*.whl"))
    with zipfile.ZipFile(wheel) as full, zipfile.ZipFile(tmp_path / wheel.name, "w") as cut:
        for item in full.infolist():
            if item.filename != left_out:
                cut.writestr(item, full.read(item))
    result = check_dist(tmp_path)
    assert result.returncode == 1
    assert result.stderr == (f"check_dist.py: {wheel.name} lacks {left_out}; "
                             f"check [tool.hatch.build] in pyproject.toml\n")


def test_the_jupyterlab_extension_is_the_packages_version_and_its_settings_the_kernels() -> None:
    package = json.loads((REPO / "package.json").read_text())
    assert package["version"] == pyproject()["project"]["version"] == nb.__version__
    assert package["jupyterlab"]["outputDir"] == "nbbudget/labextension"
    shared = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared["nbbudget/labextension"] == "share/jupyter/labextensions/nbbudget"
    # the interval the status item asks of the kernel, by default, is the kernel's own
    from nbbudget.jupyter.magics import NBBudget
    from nbbudget.jupyter.status import MAX_INTERVAL_MS, MIN_INTERVAL_MS

    schema = json.loads((REPO / "schema/plugin.json").read_text())["properties"]
    asked = schema["statusIntervalMs"]
    assert asked["default"] == NBBudget.status_interval_ms.default_value
    assert (asked["minimum"], asked["maximum"]) == (MIN_INTERVAL_MS, MAX_INTERVAL_MS)
