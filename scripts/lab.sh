#!/usr/bin/env bash
# Set up .venv with the lab extra and nbbudget's JupyterLab extension (the status-bar item and
# the Budgets panel; scripts/labextension.sh), then open JupyterLab on
# notebooks/quickstart.ipynb. Its
# kernels load the nbbudget extension at start (the python3 kernel of scripts/jupyter, found
# first through JUPYTER_PATH for this server only; nothing is written to your home), quietly:
# a notebook's own `%load_ext nbbudget` then says nothing.
#
# Usage: bash scripts/lab.sh [JUPYTER LAB OPTIONS]
#        bash scripts/lab.sh --headless [OPTIONS]    no browser: run the quickstart with nbclient
#                                                   and print what each cell did
#                                                   (options: python scripts/run_quickstart.py -h)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh lab

export JUPYTER_PATH="$PWD/scripts/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"

if [ "${1:-}" = "--headless" ]; then
    shift
    exec .venv/bin/python scripts/run_quickstart.py "$@"
fi
if ! bash scripts/labextension.sh; then
    echo "[lab] JupyterLab opens without nbbudget's status-bar item and Budgets panel" >&2
fi
extra=()
if [ "$(id -u)" -eq 0 ]; then
    extra+=(--allow-root)  # JupyterLab refuses root without it (containers, CI machines)
fi
exec .venv/bin/jupyter lab notebooks/quickstart.ipynb ${extra[@]+"${extra[@]}"} "$@"
