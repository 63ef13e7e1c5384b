#!/usr/bin/env bash
# Build the sdist and the wheel into dist/ (with the JupyterLab extension, built by npm: Node.js
# 20.19+ is needed) and check them, so that a release is one step away
# (twine upload dist/*): twine check --strict (the metadata and README as PyPI would show them),
# then scripts/check_dist.py (the files each one holds, and the wheel installed in a fresh
# virtual environment, where import nbbudget and the nbbudget command must work).
#
# Usage: bash scripts/build.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh release

rm -rf dist
# the JupyterLab extension is built again, for production, by the build backend's hook (npm and
# jupyter-builder, in the build's own environment), and rides in the sdist and the wheel
rm -rf nbbudget/labextension lib tsconfig.tsbuildinfo
.venv/bin/python -m build --outdir dist .
.venv/bin/python -m twine check --strict dist/*
.venv/bin/python scripts/check_dist.py dist
