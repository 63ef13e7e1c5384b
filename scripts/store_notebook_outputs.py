"""Run teaching notebooks the way ``bash scripts/notebooks.sh`` (nbval) does, and store the
outputs it will compare against: after editing a notebook, run this, review the diff, commit.

    .venv/bin/python scripts/store_notebook_outputs.py notebooks/quickstart.ipynb [...]

Each notebook runs in a fresh kernel of this Python, with ``NBBUDGET_INTERACTIVE=1`` and a
store of its own (``NBBUDGET_HOME`` in a temporary folder), as under nbval. Widget views are
not stored (a saved notebook shows each panel's text line), and stream outputs are merged as
nbval merges them. A cell that raises without the ``raises-exception`` tag, or has the tag and
does not raise, is reported and the exit status is 1. Saving from JupyterLab instead stores
the panels' final state, which nbval does not see.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import nbformat
from jupyter_client.manager import start_new_kernel
from nbformat.v4 import output_from_msg

WIDGET = "application/vnd.jupyter.widget-view+json"
KEPT = ("display_data", "execute_result", "stream", "error")


def run_notebook(path: str) -> bool:
    """Execute *path* cell by cell and write its outputs back; whether every cell behaved."""
    nb = nbformat.read(path, as_version=4)
    km, kc = start_new_kernel(kernel_name="python3",
                              cwd=os.path.dirname(os.path.abspath(path)))
    good, count = True, 0
    try:
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            count += 1
            started = time.monotonic()
            msg_id = kc.execute(cell.source, allow_stdin=False, stop_on_error=False)
            outputs = []
            while True:
                msg = kc.get_iopub_msg(timeout=120)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind = msg["msg_type"]
                if kind == "status" and msg["content"]["execution_state"] == "idle":
                    break
                if kind in KEPT:
                    out = output_from_msg(msg)
                    if kind != "stream" and kind != "error":
                        out.data.pop(WIDGET, None)
                        out.metadata = {}
                    if kind == "execute_result":
                        out.execution_count = count
                    outputs.append(out)
            cell.outputs = _merge_streams(outputs)
            cell.execution_count = count
            good &= _check(path, count, cell)
            print(f"  cell {count}: {time.monotonic() - started:.2f} s", file=sys.stderr)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return good


def _merge_streams(outputs: list) -> list:
    merged: list = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (out.output_type == "stream" and last is not None and last.output_type == "stream"
                and last.name == out.name):
            last.text += out.text
        else:
            merged.append(out)
    return merged


def _check(path: str, count: int, cell: nbformat.NotebookNode) -> bool:
    raised = [o for o in cell.outputs if o.output_type == "error"]
    tagged = "raises-exception" in cell.metadata.get("tags", [])
    if raised and not tagged:
        print(f"!! {path} cell {count} raised {raised[0].ename}: {raised[0].evalue}",
              file=sys.stderr)
        return False
    if tagged and not raised:
        print(f"!! {path} cell {count} is tagged raises-exception but did not raise",
              file=sys.stderr)
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", help="the .ipynb files to run and store")
    args = parser.parse_args()
    good = True
    for path in args.notebooks:
        with tempfile.TemporaryDirectory() as home:
            os.environ["NBBUDGET_HOME"] = os.path.join(home, "store")
            os.environ["NBBUDGET_INTERACTIVE"] = "1"
            os.environ.pop("AGENT_CALL_BUDGET_MS", None)
            print(path, file=sys.stderr)
            good &= run_notebook(path)
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
