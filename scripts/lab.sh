#!/usr/bin/env bash
# Set up .venv with the lab extra and nbbudget's JupyterLab extension (the status-bar item and
# the Budgets panel; scripts/labextension.sh), then open JupyterLab on the quickstart notebook.
# Its kernels load the nbbudget extension at start (the python3 kernel of scripts/jupyter, found
# first through JUPYTER_PATH for this server only; nothing is written to your home), quietly:
# a notebook's own `%load_ext nbbudget` then says nothing.
#
# JupyterLab opens in scratch/, a folder of the user's that git ignores, in which each notebook
# of notebooks/ is a link (made again at each start, for notebooks added since): the notebooks
# of the project open and save as they are, and the notebooks and files the user makes, and what
# the cells write, stay in scratch/, never in notebooks/ (which holds only the project's
# notebooks, and which bash scripts/notebooks.sh runs).
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
root="scratch"
mkdir -p "$root"
for book in notebooks/*.ipynb; do
    link="$root/$(basename "$book")"
    if [ -L "$link" ] && [ "$(readlink "$link")" = "../$book" ]; then
        continue
    elif [ -e "$link" ] || [ -L "$link" ]; then
        echo "[lab] $link is yours, not a link to $book: left as it is" >&2
    else
        ln -s "../$book" "$link"
    fi
done
for link in "$root"/*.ipynb; do  # a link of ours to a notebook that is gone
    if [ -L "$link" ] && [ ! -e "$link" ] \
            && [ "$(readlink "$link")" = "../notebooks/$(basename "$link")" ]; then
        rm -f "$link"
    fi
done
extra=()
if [ "$(id -u)" -eq 0 ]; then
    extra+=(--allow-root)  # JupyterLab refuses root without it (containers, CI machines)
fi
exec .venv/bin/jupyter lab "$root/quickstart.ipynb" ${extra[@]+"${extra[@]}"} "$@"
