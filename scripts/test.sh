#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. Extra arguments go to pytest,
# e.g. bash scripts/test.sh -k limits
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh test

status=0
.venv/bin/python -m pytest "$@" || status=$?
exit "$status"
