#!/usr/bin/env bash
# The static checks, with the releases the dev extra of pyproject.toml pins: ruff check on the
# repository (the package, the tests, the benchmarks, the scripts, the documentation's
# extensions and the notebooks; configured in [tool.ruff]) and mypy --strict on the package
# (configured in [tool.mypy]). Both run; the exit status is 1 when either found something.
# The pre-commit hooks (.pre-commit-config.yaml) run the same two commands.
#
# Usage: bash scripts/checks.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh dev

status=0
.venv/bin/ruff check || status=1
.venv/bin/mypy --strict nbbudget || status=1
exit "$status"
