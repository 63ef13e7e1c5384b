"""The README's main command without a browser: ``bash scripts/lab.sh --headless`` runs the
quickstart notebook with nbclient and prints what each cell did (issue: the main command works
on machines without a browser)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.realclock, pytest.mark.slow]


def test_the_headless_quickstart_runs_every_cell_and_reports_each_budget_cell(tmp_path):
    pytest.importorskip("nbclient")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NBBUDGET_INTERACTIVE", "AGENT_CALL_BUDGET_MS", "NBBUDGET_HOME")}
    saved = tmp_path / "executed.ipynb"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run_quickstart.py"), "--save", str(saved)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "NBBUDGET_INTERACTIVE=1, NBBUDGET_HOME in a temporary folder" in out
    assert re.search(r"%%budget --steps 10 --tool-calls 5 .* completed; value 6", out)
    assert re.search(r"%%budget --steps 3 --no-widget .* failed \(budget-cut by steps\).*"
                     r"\(expected\)", out)
    assert re.search(r"%%budget --time 500ms --no-widget .* failed \(budget-cut, out of time\)"
                     r".*\(expected\)", out)  # --time's word, not --timeout's (N-7)
    assert re.search(r"%%budget --steps 10 --no-widget .* completed; value \[0, 1, 2\]", out)
    assert re.search(r"%%budget --detach --budget 1s .* INCOMPLETE: running, job [0-9a-f]+-1",
                     out)
    assert re.search(r"%%budget --resume --budget 1s .* INCOMPLETE: paused", out)
    assert re.search(r"%%budget --resume --budget 1s .* completed; value \[0, 1, 2, 3, 4\]", out)
    assert re.search(r"\n%budget jobs:?\n(.*\n)*"
                     r".*cell: print\(\"training started\", flush=True\) +done", out)
    assert re.search(r"\d+ code cells ran in [\d.]+ s", out)
    assert saved.exists()
