#!/usr/bin/env bash
# The kernel tests (tests/test_magic_kernel.py, tests/test_panel_kernel.py) against kernels of
# older ipykernel releases, where a job's output is tied to its cell through private context
# variables instead of ipykernel 7.4's set_thread_parent (and a panel's widget updates cannot
# be tied to it at all on 6.29). Each release gets a virtual environment of its own in
# .venv-compat/ (made once, remade when pyproject.toml changes); the tests themselves run from
# .venv. Extra arguments go to pytest.
#
# Usage: bash scripts/compat.sh [PYTEST OPTIONS]     (IPYKERNELS="6.29.5 7.3.0" by default)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh test
python="${PYTHON:-python3}"
hash="$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"

status=0
for version in ${IPYKERNELS:-6.29.5 7.3.0}; do
    venv=".venv-compat/ipykernel-$version"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$hash" ]; then
        printf '[compat] creating %s\n' "$venv" >&2
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check \
            "ipykernel==$version" -e ".[frames]"
        printf '%s\n' "$hash" > "$venv/.stamp"
    fi
    printf '\n==> kernel tests with ipykernel %s\n' "$version" >&2
    NBBUDGET_KERNEL_PYTHON="$PWD/$venv/bin/python" .venv/bin/python -m pytest \
        tests/test_magic_kernel.py tests/test_panel_kernel.py -p no:cacheprovider "$@" \
        || status=$?
done
exit "$status"
