#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install
# nbbudget in editable mode with the requested extras.
#
# Usage: bash scripts/setup.sh [EXTRAS]    (default: test; e.g. "test,bench")
#
# Idempotent and cumulative: .venv/.nbbudget-stamp records the pyproject.toml hash
# and every extra installed so far; the install is skipped when the hash is the
# same and the requested extras are already there, and otherwise installs the
# union, so scripts that need different extras share one environment.
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

# Prints "skip" when nothing is to install, else the stamp to write once the union of the
# extras asked for and those installed before is installed: "<pyproject hash> extras=<union>".
want="$("$py" - "$stamp" "$extras" <<'PY'
import hashlib, sys
stamp, wanted = sys.argv[1], {e for e in sys.argv[2].split(",") if e}
digest = hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest()
try:
    old_digest, _, old = open(stamp).read().strip().partition(" extras=")
except OSError:
    old_digest, old = "", ""
have = {e for e in old.split(",") if e} if old_digest == digest else set()
print("skip" if wanted <= have else f"{digest} extras={','.join(sorted(wanted | have))}")
PY
)"
if [ "$want" = "skip" ]; then
    log "dependencies up to date (extras: $extras); skipping install"
    exit 0
fi

plan="${want#* extras=}"
rm -f "$stamp"
log "upgrading pip"
"$py" -m pip install -q --disable-pip-version-check --upgrade pip
log "installing nbbudget in editable mode with extras [$plan]"
"$py" -m pip install -q --disable-pip-version-check -e ".[$plan]"
printf '%s\n' "$want" > "$stamp"
log "done"
