#!/usr/bin/env bash
# The quickstart and nbbudget's JupyterLab extension in a real browser (tests/browser): set up
# .venv with the browser extra and the extension, install Debian's Chromium if /usr/bin/chromium
# is missing (Playwright's own browsers are never downloaded), then run the browser tests; here
# a missing piece fails instead of skipping.
# Extra arguments go to pytest. Screenshots: tests/browser/artifacts/ (or
# $NBBUDGET_BROWSER_ARTIFACTS).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh browser
bash scripts/labextension.sh  # the JupyterLab extension under test, built from src/

if [ ! -x /usr/bin/chromium ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "[browser] /usr/bin/chromium is missing and sudo is not available:" \
                 "install the chromium and fonts-dejavu-core packages as root" >&2
            exit 1
        fi
        sudo="sudo"
    fi
    echo "[browser] installing chromium (Debian package)" >&2
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium fonts-dejavu-core
fi

NBBUDGET_BROWSER_REQUIRED=1 exec .venv/bin/python -m pytest -m browser tests/browser \
    -p no:cacheprovider "$@"
