#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install
# nbbudget in editable mode with the requested extras.
#
# Usage: bash scripts/setup.sh [EXTRAS]    (default: test; e.g. "test,bench")
#
# Idempotent: the install is skipped when .venv/.nbbudget-stamp records the same
# pyproject.toml hash and extras as the ones requested now.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

extras="${1:-test}"
venv=".venv"
py="$venv/bin/python"
stamp="$venv/.nbbudget-stamp"
python="${PYTHON:-python3}"

log() { printf '[setup] %s\n' "$*" >&2; }

if [ -x "$py" ] && "$py" -c 'import sys' >/dev/null 2>&1; then
    log "using existing $venv ($("$py" -c 'import platform; print(platform.python_version())'))"
else
    log "creating $venv with $("$python" --version 2>&1)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi

hash="$("$py" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
want="$hash extras=$extras"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    log "dependencies up to date (extras: $extras); skipping install"
    exit 0
fi

rm -f "$stamp"
log "upgrading pip"
"$py" -m pip install -q --disable-pip-version-check --upgrade pip
log "installing nbbudget in editable mode with extras [$extras]"
"$py" -m pip install -q --disable-pip-version-check -e ".[$extras]"
printf '%s\n' "$want" > "$stamp"
log "done"
