"""Print a pip constraints file that pins each of nbbudget's direct dependencies to its lower
bound, so that ``pip install -c`` installs the oldest releases pyproject.toml allows.

    .venv-versions/lowest-3.10/bin/python scripts/lower_bounds.py test,frames > constraints.txt
    (bash scripts/versions.sh does this for its "lowest" entry)

The requirements are the core ``dependencies`` and those of the extras named (an extra that
asks for ``nbbudget[...]`` brings those extras' requirements too) whose environment markers hold
for the Python that runs the script: run it with the interpreter of the environment the file is
for. Each package gets one line, ``name==version``, where the version is that of its ``>=`` or
``==`` (the highest, where the package is asked for more than once).

A requirement without a lower bound, or an extra pyproject.toml does not have, is refused: one
line on stderr, exit status 1. Needs ``packaging`` and, before Python 3.11, ``tomli``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent


class Refused(Exception):
    """The extras or a requirement cannot be pinned; the message says which and the fix."""


def main(argv: list[str]) -> int:
    extras = [extra for extra in (argv[0] if argv else "").split(",") if extra]
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    try:
        pins = lower_bounds(project, extras)
    except Refused as exc:
        print(f"lower_bounds.py: {exc}", file=sys.stderr)
        return 1
    for name, version in sorted(pins.items()):
        print(f"{name}=={version}")
    return 0


def lower_bounds(project: dict[str, Any], extras: list[str]) -> dict[str, Version]:
    """The lower bound of each direct requirement of *project* with *extras* that applies here,
    by canonical package name."""
    own = canonicalize_name(project["name"])
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise Refused(f"pyproject.toml has no extra {unknown[0]!r}; the extras are "
                        f"{', '.join(sorted(optional))}")
    pending = [(line, "dependencies") for line in project["dependencies"]]
    pending += [(line, extra) for extra in extras for line in optional[extra]]
    seen = set(extras)
    pins: dict[str, Version] = {}
    while pending:
        line, where = pending.pop(0)
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(requirement.name) == own:
            for extra in sorted(requirement.extras - seen):
                seen.add(extra)
                pending += [(inner, extra) for inner in optional[extra]]
            continue
        bounds = [Version(spec.version) for spec in requirement.specifier
                  if spec.operator in (">=", "==") and not spec.version.endswith(".*")]
        if not bounds:
            raise Refused(f"{line!r} in {where} has no lower bound; give it the oldest "
                            f"release the tests pass with, as '>=VERSION'")
        name = canonicalize_name(requirement.name)
        pins[name] = max([*bounds, pins.get(name, bounds[0])])
    return pins


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
