#!/usr/bin/env bash
# The tests on every other Python the package claims, and on the oldest releases it allows.
#
# 3.12 and 3.13: the fast test subset (no slow, real-clock or browser tests) with the newest
# releases (the full suite runs on 3.11 from .venv, by scripts/test.sh). Python 3.10 is tested by
# "lowest" below, real-clock tests included; PYTHONS=3.10 runs the fast subset there with the
# newest releases too.
#
# lowest: every direct dependency of the core and of the test, frames, run and plot extras
# pinned to its lower bound in pyproject.toml (the constraints scripts/lower_bounds.py writes),
# on Python 3.10 with the real-clock tests too, which start kernels and run notebooks; then on
# Python 3.11 the tests of the pydantic-ai adapter, whose bound holds on 3.11 and newer only.
#
# Each gets a virtual environment of its own in .venv-versions/ (made once, remade when
# pyproject.toml or scripts/lower_bounds.py changes). The interpreter is `pythonX.Y` on the PATH,
# else pyenv's newest X.Y; a version found nowhere fails the run, naming it. Extra arguments go
# to pytest.
#
# Usage: bash scripts/versions.sh [PYTEST OPTIONS]   (PYTHONS="3.12 3.13 lowest" by default)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

hash="$(cat pyproject.toml scripts/lower_bounds.py | python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
lowest_extras="test,frames,run,plot"

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

# make_venv VENV VERSION newest|lowest: the environment, made unless it is up to date
make_venv() {
    local venv="$1" version="$2" releases="$3" python
    if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$hash" ]; then
        return
    fi
    python="$(find_python "$version")"
    printf '[versions] creating %s with %s\n' "$venv" "$("$python" --version 2>&1)" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" --upgrade pip
    if [ "$releases" = lowest ]; then
        # the script reads pyproject.toml, and evaluates its markers, with this Python
        "${pip[@]}" packaging 'tomli; python_version < "3.11"'
        "$venv/bin/python" scripts/lower_bounds.py "$lowest_extras" > "$venv/constraints.txt"
        "${pip[@]}" -c "$venv/constraints.txt" -e ".[$lowest_extras]"
    else
        "${pip[@]}" -e ".[test,frames]"
    fi
    printf '%s\n' "$hash" > "$venv/.stamp"
}

status=0
for entry in ${PYTHONS:-3.12 3.13 lowest}; do
    if [ "$entry" = lowest ]; then
        make_venv .venv-versions/lowest-3.10 3.10 lowest
        printf '[versions] pinned: %s\n' "$(tr '\n' ' ' < .venv-versions/lowest-3.10/constraints.txt)" >&2
        printf '\n==> the fast and real-clock tests on %s, the oldest releases allowed\n' \
            "$(.venv-versions/lowest-3.10/bin/python --version 2>&1)" >&2
        .venv-versions/lowest-3.10/bin/python -m pytest -m "not slow and not browser" \
            -p no:cacheprovider -q "$@" || status=$?
        make_venv .venv-versions/lowest-3.11 3.11 lowest
        printf '\n==> the pydantic-ai adapter on %s, the oldest releases allowed (%s)\n' \
            "$(.venv-versions/lowest-3.11/bin/python --version 2>&1)" \
            "$(grep pydantic-ai .venv-versions/lowest-3.11/constraints.txt)" >&2
        .venv-versions/lowest-3.11/bin/python -m pytest tests/test_pydantic_ai.py \
            tests/test_pydantic_ai_versions.py -p no:cacheprovider -q "$@" || status=$?
        continue
    fi
    make_venv ".venv-versions/$entry" "$entry" newest
    printf '\n==> the fast tests on %s\n' "$(".venv-versions/$entry/bin/python" --version 2>&1)" >&2
    ".venv-versions/$entry/bin/python" -m pytest -m "not slow and not realclock and not browser" \
        -p no:cacheprovider -q "$@" || status=$?
done
exit "$status"
