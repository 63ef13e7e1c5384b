"""Run the quickstart notebook without a browser and say what each cell did.

    bash scripts/lab.sh --headless             # notebooks/quickstart.ipynb
    .venv/bin/python scripts/run_quickstart.py --notebook other.ipynb --save executed.ipynb

The notebook runs top to bottom under nbclient, as a person would run it: the kernel has
NBBUDGET_INTERACTIVE=1 (an INCOMPLETE cell ends normally and its job goes on) and a store of its
own in a temporary folder, removed at the end. For each code cell the summary gives how long it
took and how it ended; for a ``%%budget`` cell: completed, stopped or failed (and by what), or
INCOMPLETE with its job. Then, after waiting a little for running jobs, the ``%budget jobs``
table. nbclient drops what a detached job prints after its cell has ended; the table's
``output`` column shows the last line each job printed.

Exit status: 0 when every cell ran, 1 when a cell failed that is not tagged
``raises-exception`` (the run stops there, as it does in JupyterLab).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nbbudget.core.endings import OUT_OF_TIME

REPO = Path(__file__).resolve().parent.parent
MIME = "application/vnd.nbbudget.response+json"

# Read in the kernel through user_expressions of a silent request: nothing is printed, no cell
# is counted and nbbudget's "jobs that ended since the last cell" notice is left for the next
# cell of the notebook.
LAST_RUN = ("(lambda r: None if r is None else (id(r), r.outcome and r.outcome.to_dict()))"
            "(getattr(get_ipython().magics_manager.registry.get('BudgetMagics'), 'last_run', "
            "None))")
JOBS_RUNNING = "sum(not j.done() for j in __import__('nbbudget').jobs)"
JOBS_TABLE = "repr(get_ipython().run_line_magic('budget', 'jobs'))"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="run_quickstart.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebook", type=Path, default=REPO / "notebooks" / "quickstart.ipynb",
                        help="the notebook to run (default: notebooks/quickstart.ipynb)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds one cell may take (default: 120)")
    parser.add_argument("--wait", type=float, default=10,
                        help="seconds to wait for running jobs before the jobs table "
                             "(default: 10)")
    parser.add_argument("--save", type=Path, metavar="PATH",
                        help="also save the executed notebook to PATH")
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"no notebook at {args.notebook}")

    with tempfile.TemporaryDirectory(prefix="nbbudget-quickstart-") as tmp:
        os.environ.update(NBBUDGET_HOME=str(Path(tmp) / "home"), NBBUDGET_INTERACTIVE="1")
        os.environ.pop("AGENT_CALL_BUDGET_MS", None)  # a person: no default call budget
        return Quickstart(args, kernel_log=Path(tmp) / "kernel.log").run()


class Quickstart:
    """One run of the notebook: the client, and a second client on the same kernel to read the
    state of nbbudget between cells."""

    def __init__(self, args: argparse.Namespace, kernel_log: Path) -> None:
        import nbformat
        from nbclient import NotebookClient

        self.args = args
        self.kernel_log = kernel_log  # the kernel's own stderr, shown if a cell fails
        self.nb = nbformat.read(args.notebook, as_version=4)
        self.client = NotebookClient(
            self.nb, timeout=int(args.timeout), record_timing=True,
            resources={"metadata": {"path": str(args.notebook.parent)}})
        self.probe: Any = None
        self.last_run: Any = None

    def run(self) -> int:
        print(f"running {self.args.notebook} (NBBUDGET_INTERACTIVE=1, NBBUDGET_HOME in a "
              f"temporary folder)\n")
        started = time.monotonic()
        with self.kernel_log.open("wb") as log, self.client.setup_kernel(stderr=log):
            self.probe = _probe_client(self.client.km)
            try:
                failed = self._cells()
                self._jobs()
            finally:
                self.probe.stop_channels()
        if self.args.save:
            import nbformat

            nbformat.write(self.nb, self.args.save)
            print(f"\nexecuted notebook saved to {self.args.save}")
        ran = sum(c.get("execution_count") is not None for c in self.nb.cells)
        print(f"\n{ran} code cells ran in {time.monotonic() - started:.1f} s"
              + (f"; stopped at the failed cell [{failed}]" if failed is not None else ""))
        if failed is not None and self.kernel_log.stat().st_size:
            log = self.kernel_log.read_text(errors="replace")
            print("\nthe kernel's own log:\n" + textwrap.indent(log, "  "))
        return 0 if failed is None else 1

    def _cells(self) -> int | None:
        """Run the code cells in order; the index of a cell that failed unexpectedly, if any."""
        from nbclient.exceptions import CellExecutionError

        for index, cell in enumerate(self.nb.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            started = time.monotonic()
            failed = False
            try:
                self.client.execute_cell(cell, index)
            except CellExecutionError:
                failed = True
            seconds = time.monotonic() - started
            print(f"[{index:2}] {_first_line(cell.source):<44} {seconds:5.1f} s  "
                  f"{self._ended(cell)}")
            if failed:
                return index
        return None

    def _ended(self, cell: Any) -> str:
        """How a cell ended, in a few words."""
        error = next((o for o in cell.outputs if o.output_type == "error"), None)
        budget = cell.source.lstrip().startswith("%%budget")
        run = self._read(LAST_RUN) if budget else None
        fresh = run is not None and run != self.last_run
        self.last_run = run if budget else self.last_run
        envelope = next((o.data[MIME] for o in reversed(cell.outputs)
                         if o.output_type == "display_data" and MIME in o.get("data", {})), None)
        if envelope is not None and envelope["meta"].get("exit_code") == 14:
            data = envelope["data"]
            how = f"INCOMPLETE: {data.get('state')}"
            how += f", job {data['job']}" if data.get("job") else ""
        elif error is not None:
            how = _outcome(run[1]) + ", " if fresh and run[1] else ""
            how += f"{error.ename}: {_first_line(error.evalue, 100)}"
            if "raises-exception" in cell.metadata.get("tags", []):
                how += " (expected)"
        elif budget and fresh and run[1]:
            how = _outcome(run[1])
        else:
            how = "ok"
        value = next((o.data.get("text/plain") for o in cell.outputs
                      if o.output_type == "execute_result"), None)
        if value is not None and budget:
            how += f"; value {_first_line(value)}"
        return how

    def _jobs(self) -> None:
        deadline = time.monotonic() + self.args.wait
        while (self._read(JOBS_RUNNING) or 0) > 0 and time.monotonic() < deadline:
            time.sleep(0.25)
        running = self._read(JOBS_RUNNING) or 0
        table = self._read(JOBS_TABLE)
        print("\n%budget jobs" + (f" ({running} still running; they end with the kernel)"
                                  if running else "") + ":")
        print(textwrap.indent(table or "(not available)", "  "))

    def _read(self, expression: str) -> Any:
        """The value of *expression* in the kernel (a Python literal), or None when it fails."""
        msg_id = self.probe.execute("", silent=True, store_history=False,
                                    user_expressions={"x": expression})
        while True:
            reply = self.probe.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        found = reply["content"].get("user_expressions", {}).get("x", {})
        if found.get("status") != "ok":
            return None
        return ast.literal_eval(found["data"]["text/plain"])


def _probe_client(km: Any) -> Any:
    from jupyter_client import BlockingKernelClient

    probe = BlockingKernelClient()
    probe.load_connection_info(km.get_connection_info())
    probe.start_channels()
    probe.wait_for_ready(timeout=30)
    return probe


def _outcome(outcome: dict[str, str]) -> str:
    """``completed``, or e.g. ``failed (budget-cut by steps)``; a spent time grant is
    ``failed (budget-cut, out of time)`` (``--time``'s, not ``--timeout``'s word)."""
    by = outcome.get("by")
    if by == "timeout":
        why = ", ".join(filter(None, [outcome.get("cause"), OUT_OF_TIME]))
    else:
        why = " ".join(filter(None, [outcome.get("cause"), by and f"by {by}"]))
    return outcome["status"] + (f" ({why})" if why else "")


def _first_line(text: str, width: int = 44) -> str:
    """The first line of *text* that is not blank or a comment, cut to *width*."""
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    line = next((s for s in lines if not s.startswith("#")), lines[0] if lines else "")
    return line if len(line) <= width else line[:width - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
