#!/usr/bin/env bash
# Build the documentation site (Sphinx with MyST) into docs/_build/html.
# Every warning is an error: the script exits non-zero when the build emits any warning.
# -E rebuilds from scratch, so warnings of pages unchanged since the last build still count.
#
# Usage: bash scripts/docs.sh [SPHINX OPTIONS]    (e.g. -j 2; the build needs no network)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh docs

.venv/bin/python -m sphinx -E -W --keep-going -b html "$@" docs docs/_build/html
