#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. Extra arguments go to pytest,
# e.g. bash scripts/test.sh -k limits
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# the test extra, and the Claude Agent SDK (its wheel carries Claude Code: installed here
# once, not in the other environments the test extra makes)
bash scripts/setup.sh test,claude-agent

status=0
.venv/bin/python -m pytest "$@" || status=$?
exit "$status"
