#!/usr/bin/env bash
# The JupyterLab extension (src/, style/, schema/) built and active in .venv's JupyterLab:
# rebuilt with npm when a source is newer than the build (nbbudget/labextension), then copied
# where the wheel installs it (.venv/share/jupyter/labextensions/nbbudget), so that JupyterLab
# loads what was built last. (A copy, not jupyter-builder develop's link: pip, reinstalling the
# package, would write its own files through the link into the build.)
# The editable install of scripts/setup.sh builds it once; this keeps it current after edits.
# Needs Node.js 20.19+ and npm; without them it says so and exits 1.
#
# Usage: bash scripts/labextension.sh      (after bash scripts/setup.sh lab)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

built="nbbudget/labextension/package.json"
if ! command -v npm >/dev/null 2>&1; then
    echo "[labextension] npm is not on PATH: install Node.js 20.19 or newer to build the" \
         "JupyterLab extension" >&2
    exit 1
fi
stale=0
if [ ! -f "$built" ]; then
    stale=1
elif [ -n "$(find src style schema package.json package-lock.json tsconfig.json -newer "$built" -print -quit)" ]; then
    stale=1
fi
export PATH="$PWD/.venv/bin:$PATH"  # jupyter-builder, which the build runs
if [ "$stale" = 1 ]; then
    echo "[labextension] building the JupyterLab extension (npm)" >&2
    [ -d node_modules ] || npm ci --no-audit --no-fund
    npm run build
fi
target=".venv/share/jupyter/labextensions/nbbudget"
rm -rf "$target"
mkdir -p "$(dirname "$target")"
cp -R nbbudget/labextension "$target"
cp install.json "$target/install.json"
echo "[labextension] active: $(jupyter labextension list 2>&1 | grep -m1 ' nbbudget ' | sed 's/\x1b\[[0-9;]*m//g' | xargs)" >&2
