#!/usr/bin/env bash
# Set up .venv with the notebooks extra and run the teaching notebooks in notebooks/ under
# nbval: each cell runs in a fresh kernel of .venv and its outputs are compared with the stored
# ones, after the patterns of scripts/nbval/sanitize.cfg (scripts/nbval/nbbudget_nbval.py, a
# pytest plugin, applies them to the JSON envelope too). Arguments go to pytest; a notebook or
# folder among them replaces notebooks/, e.g.
#   bash scripts/notebooks.sh notebooks/quickstart.ipynb -x
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh notebooks

# A store of this run's own: a checkpoint or job left by an earlier run would change what the
# notebooks print (a --resume cell would continue instead of starting).
home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
export NBBUDGET_HOME="$home/store"
# The notebooks are for people: no default call budget (S0-5), INCOMPLETE ends a cell normally.
export NBBUDGET_INTERACTIVE=1
unset AGENT_CALL_BUDGET_MS

# the notebooks, unless a notebook or folder is named
paths=0
for arg in "$@"; do [ -e "$arg" ] && paths=1; done
[ "$paths" = 1 ] || set -- "$@" notebooks/

status=0
# --nbval-current-env: the kernel is .venv's own ipykernel, whatever kernelspecs the user has.
# The plugin comes from scripts/nbval, so that notebooks/ holds only notebooks.
PYTHONPATH="$PWD/scripts/nbval${PYTHONPATH:+:$PYTHONPATH}" \
.venv/bin/python -m pytest --nbval --nbval-current-env --nbval-cell-timeout 120 \
    -p nbbudget_nbval --nbval-sanitize-with scripts/nbval/sanitize.cfg \
    -p no:cacheprovider "$@" || status=$?
exit "$status"
