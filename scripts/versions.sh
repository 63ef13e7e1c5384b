#!/usr/bin/env bash
# The fast test subset (no slow, real-clock or browser tests) on every other Python the package
# claims: 3.10, 3.12 and 3.13 (the full suite runs on 3.11 from .venv, by scripts/test.sh). Each
# version gets a virtual environment of its own in .venv-versions/ with the test and frames
# extras (made once, remade when pyproject.toml changes). The interpreter is `pythonX.Y` on the
# PATH, else pyenv's newest X.Y; a version found nowhere fails the run, naming it.
#
# Usage: bash scripts/versions.sh [PYTEST OPTIONS]     (PYTHONS="3.10 3.12 3.13" by default)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

hash="$(python3 -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"

find_python() {
    local version="$1" root found
    # a pyenv shim is on the PATH for every version pyenv has, and fails unless it is selected
    if "python$version" -c '' >/dev/null 2>&1; then
        "python$version" -c 'import sys; print(sys.executable)'
        return
    fi
    root="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"
    found="$(ls -d "$root/versions/$version".*/bin/python 2>/dev/null | sort -V | tail -1)"
    if [ -n "$found" ]; then
        echo "$found"
        return
    fi
    echo "[versions] Python $version is not installed (no python$version on the PATH, none in" \
         "$root/versions): install it, e.g. pyenv install $version" >&2
    return 1
}

status=0
for version in ${PYTHONS:-3.10 3.12 3.13}; do
    python="$(find_python "$version")"
    venv=".venv-versions/$version"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$hash" ]; then
        printf '[versions] creating %s with %s\n' "$venv" "$("$python" --version 2>&1)" >&2
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test,frames]"
        printf '%s\n' "$hash" > "$venv/.stamp"
    fi
    printf '\n==> the fast tests on %s\n' "$("$venv/bin/python" --version 2>&1)" >&2
    "$venv/bin/python" -m pytest -m "not slow and not realclock and not browser" \
        -p no:cacheprovider -q "$@" || status=$?
done
exit "$status"
