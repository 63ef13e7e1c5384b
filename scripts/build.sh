#!/usr/bin/env bash
# Build the sdist and the wheel into dist/ and check them, so that a release is one step away
# (twine upload dist/*): twine check --strict (the metadata and README as PyPI would show them),
# then scripts/check_dist.py (the files each one holds, and the wheel installed in a fresh
# virtual environment, where import nbbudget and the nbbudget command must work).
#
# Usage: bash scripts/build.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh release

rm -rf dist
.venv/bin/python -m build --outdir dist .
.venv/bin/python -m twine check --strict dist/*
.venv/bin/python scripts/check_dist.py dist
