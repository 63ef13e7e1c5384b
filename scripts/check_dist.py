"""Check the sdist and the wheel that ``python -m build`` wrote into a folder.

    .venv/bin/python scripts/check_dist.py dist      (bash scripts/build.sh runs it)

- the sdist holds every file of the package, README.md, LICENSE and pyproject.toml, and no
  tests (they read the repository's docs and notebooks, which it does not carry);
- the wheel holds every file of the package (``py.typed`` and the rules' Markdown files,
  ``nbbudget/rules/*.md``, included), the ``nbbudget`` command and the JupyterLab extension,
  built (``share/jupyter/labextensions/nbbudget``: its metadata, settings schema and entry);
  the sdist holds the extension built and the sources to build it again;
- the wheel installs in a fresh virtual environment (without its dependencies: the core is the
  standard library), where ``import nbbudget`` gives the built version, ``nbbudget explain``
  lists every rule of the repository's Markdown files and ``nbbudget explain S0-1`` prints the
  first, and the extension's entry lies where JupyterLab looks for it.

One line per check on stdout; the first failure is one line on stderr, and the exit status 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Refused(Exception):
    """A check failed; the message says what and where to look."""


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "dist")
    try:
        sdist, wheel = only(folder, "*.tar.gz"), only(folder, "*.whl")
        check_sdist(sdist)
        check_wheel(wheel)
        check_install(wheel)
    except Refused as exc:
        print(f"check_dist.py: {exc}", file=sys.stderr)
        return 1
    return 0


def only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise Refused(f"{folder} holds {len(found)} files {pattern}, not one; "
                      f"build into an empty folder")
    return found[0]


#: the JupyterLab extension as npm and jupyter-builder build it (package.json "outputDir"),
#: which the wheel installs under share/jupyter/labextensions/nbbudget, not in the package
LABEXTENSION = "nbbudget/labextension"
#: where the wheel puts it, and the files without which JupyterLab would not load it
SHARED = "share/jupyter/labextensions/nbbudget"
EXTENSION_FILES = {"package.json", "schemas/nbbudget/plugin.json"}
#: what rebuilds the extension from an sdist
EXTENSION_SOURCES = {"package.json", "package-lock.json", "tsconfig.json", "install.json",
                     "src/index.ts", "schema/plugin.json", "style/index.js"}


def package_files() -> set[str]:
    """The package's files in the repository: ``nbbudget/...``, the built extension aside."""
    root = REPO / "nbbudget"
    return {path.relative_to(REPO).as_posix() for path in root.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
            and not path.relative_to(REPO).as_posix().startswith(LABEXTENSION + "/")}


def require(archive: Path, names: set[str], wanted: set[str], fix: str) -> None:
    missing = sorted(wanted - names)
    if missing:
        raise Refused(f"{archive.name} lacks {', '.join(missing)}; {fix}")


def check_extension(archive: Path, names: set[str], prefix: str, fix: str) -> None:
    """The built extension under *prefix* in *names*: its metadata, its settings schema and
    an entry point (a build that failed half way has none)."""
    require(archive, names, {f"{prefix}/{name}" for name in EXTENSION_FILES}, fix)
    if not any(name.startswith(f"{prefix}/static/remoteEntry.") for name in names):
        raise Refused(f"{archive.name} lacks {prefix}/static/remoteEntry.*.js; {fix}")


def check_sdist(sdist: Path) -> None:
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.removeprefix(f"{top}/") for name in tar.getnames()}
    wanted = package_files() | {"README.md", "LICENSE", "pyproject.toml"} | EXTENSION_SOURCES
    require(sdist, names, wanted, "check [tool.hatch.build.targets.sdist] in pyproject.toml")
    check_extension(sdist, names, LABEXTENSION,
                    "check artifacts in [tool.hatch.build.targets.sdist] of pyproject.toml")
    tests = sorted(name for name in names if name.startswith("tests/"))
    if tests:
        raise Refused(f"{sdist.name} holds {tests[0]}; [tool.hatch.build.targets.sdist] "
                      f"excludes tests/")
    print(f"sdist {sdist.name}: the package, the JupyterLab extension built and its sources, "
          f"README.md, LICENSE and pyproject.toml")


def check_wheel(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        commands = archive.read(entry_points).decode() if entry_points else ""
    require(wheel, names, package_files(), "check [tool.hatch.build] in pyproject.toml")
    version = wheel.name.split("-")[1]
    shared = f"nbbudget-{version}.data/data/{SHARED}"
    check_extension(wheel, names, shared,
                    "check [tool.hatch.build.targets.wheel.shared-data] in pyproject.toml")
    require(wheel, names, {f"{shared}/install.json"},
            "check [tool.hatch.build.targets.wheel.shared-data] in pyproject.toml")
    if "nbbudget = nbbudget.cli.main:main" not in commands:
        raise Refused(f"{wheel.name} does not declare the nbbudget command; "
                      f"check [project.scripts] in pyproject.toml")
    print(f"wheel {wheel.name}: every module, py.typed, the nbbudget command and the "
          f"JupyterLab extension")


def check_install(wheel: Path) -> None:
    version = wheel.name.split("-")[1]
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        run([sys.executable, "-m", "venv", str(venv)], tmp)
        run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
             "--disable-pip-version-check", str(wheel.resolve())], tmp)
        code = "import nbbudget; print(nbbudget.__version__, nbbudget.__file__)"
        found, where = run([str(venv / "bin/python"), "-c", code], tmp).split()
        if found != version or not Path(where).is_relative_to(venv):
            raise Refused(f"the fresh environment imported nbbudget {found} from {where}, not "
                          f"{version} from the wheel; rebuild into an empty folder")
        listed = run([str(venv / "bin/nbbudget"), "explain"], tmp).splitlines()[1:]
        rules = sorted((REPO / "nbbudget/rules").glob("*.md"))
        headings = sum(path.read_text(encoding="utf-8").count("\n## ") for path in rules)
        if len(listed) != headings:
            raise Refused(f"nbbudget explain lists {len(listed)} rules, where nbbudget/rules/ "
                          f"has {headings}; check [tool.hatch.build] in "
                          f"pyproject.toml")
        rule = run([str(venv / "bin/nbbudget"), "explain", "S0-1"], tmp)
        if not rule.startswith("S0-1: "):
            raise Refused(f"nbbudget explain S0-1 printed {rule[:80]!r}; check "
                          f"[tool.hatch.build] in pyproject.toml")
        # where JupyterLab looks for a prebuilt extension: {sys.prefix}/share/jupyter/...
        installed = venv / SHARED
        meta = json.loads((installed / "package.json").read_text(encoding="utf-8"))
        entry = installed / meta["jupyterlab"]["_build"]["load"]
        if not entry.is_file():
            raise Refused(f"the JupyterLab extension's entry {entry.name} is not installed "
                          f"beside its package.json; rebuild it (npm run build:prod)")
    print(f"wheel installed in a fresh virtual environment: import nbbudget {version}, "
          f"nbbudget explain lists the {headings} rules and explains S0-1, the JupyterLab "
          f"extension is in share/jupyter/labextensions")


def run(command: list[str], cwd: str) -> str:
    """Run *command* in *cwd*, away from the repository and its PYTHONPATH; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Refused(f"{' '.join(command[:3])} ... failed ({done.returncode}): {last}")
    return done.stdout


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
