#!/usr/bin/env bash
# Set up .venv (if needed) and run the budgeted demo. Extra arguments go to the demo.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh test

exec .venv/bin/python -m nbbudget.demo "$@"
