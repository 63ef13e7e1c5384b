"""``nbbudget run``: the call budget for a whole notebook, driven as a harness or a pipeline
drives it: the real console command in a subprocess, a real runner process, real kernels, a real
SQLite store of each test's own (S0-1, S0-2, S0-5, S0-6, S0-9, S0-11, S0-12, S2-1, S4-2, S4-3,
S4-12).

Seed 000's numbers: with ``AGENT_CALL_BUDGET_MS=2000``, a notebook of 10 s exits 14 within 3 s
of the command's start (the kernel's start-up included) and completes in the background;
``--resume`` pauses at the first cell boundary past 2 s and the identical command continues
from the next cell.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import nbformat
import pytest

from nbbudget.calls.run_store import runner_alive

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.realclock


# -- helpers ----------------------------------------------------------------------------------
@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The commands' environment: this checkout's nbbudget, a store of the test's own, no call
    budget and no interactive mode from outside. Runners left alive are killed after the test
    (their kernels follow them)."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGENT_CALL_BUDGET_MS", "NBBUDGET_INTERACTIVE", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["NBBUDGET_HOME"] = str(home)
    yield env
    pids: list[tuple[int]] = []
    with contextlib.suppress(sqlite3.DatabaseError), \
            contextlib.closing(sqlite3.connect(home / "nbbudget.db")) as db:
        pids = db.execute("SELECT pid FROM notebook_runs WHERE pid IS NOT NULL").fetchall()
    for (pid,) in pids:
        if runner_alive(pid):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Done:
    """What one command did: its exit code, its streams, how long it held its caller."""

    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def envelope(self) -> dict[str, Any]:
        return json.loads(self.stdout)


def nbbudget(env: dict[str, str], *args: str, cwd: Path, timeout: float = 120) -> Done:
    """The console command, as a harness calls it (no terminal)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nbbudget", *args], env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return Done(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def start(env: dict[str, str], *args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "nbbudget", *args], env=env, cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def on_terminal(env: dict[str, str], *args: str, cwd: Path, timeout: float = 120) -> Done:
    """The console command on a terminal (a pty for its three streams), as a person runs it;
    what the terminal showed is ``stdout``."""
    master, slave = pty.openpty()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "nbbudget", *args], env=env, cwd=cwd,
                            stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    shown = bytearray()
    try:
        while time.monotonic() - started < timeout:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal closed: the command has ended
                break
            if not chunk:
                break
            shown += chunk
        code = proc.wait(timeout=10)
    finally:
        os.close(master)
    return Done(code, shown.decode(), "", time.monotonic() - started)


def write_notebook(path: Path, *sources: str, parameters: str | None = None,
                   limits: dict[str, Any] | None = None, kernel: str = "python3") -> Path:
    """A notebook of code cells for *kernel*; *parameters* is the cell tagged ``parameters``,
    first."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata.kernelspec = {"name": kernel, "display_name": "Python 3",
                                    "language": "python"}
    if limits is not None:
        notebook.metadata.nbbudget = {"limits": limits}
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    if parameters is not None:
        tagged = nbformat.v4.new_code_cell(parameters)
        tagged.metadata.tags = ["parameters"]
        cells.insert(0, tagged)
    notebook.cells = cells
    nbformat.write(notebook, path)
    return path


def logged(i: int, seconds: float) -> str:
    """A cell that takes *seconds*, counts itself in the kernel and logs itself to ran.txt."""
    return (f"time.sleep({seconds})\ncount += 1\n"
            f"with open('ran.txt', 'a') as log:\n    log.write('{i}\\n')")


def slow_notebook(folder: Path, cells: int, seconds: float, name: str = "slow.ipynb") -> Path:
    """*cells* cells of *seconds* each after a setup cell."""
    return write_notebook(folder / name, "import time\ncount = 0",
                          *(logged(i, seconds) for i in range(cells)))


def ran(folder: Path) -> list[str]:
    log = folder / "ran.txt"
    return log.read_text().split() if log.exists() else []


def jobs(env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    done = nbbudget(env, "jobs", "--json", cwd=cwd)
    assert done.code == 0, done.stderr
    return list(json.loads(done.stdout))


def wait_for_job(env: dict[str, str], cwd: Path, job: str, state: str,
                 timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = next(row for row in jobs(env, cwd) if row["id"] == job)
        if found["state"] == state or time.monotonic() > deadline:
            assert found["state"] == state, found
            return found
        time.sleep(0.5)


def stamp(text: str) -> float:
    """A kernel's ISO timestamp, in seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def banners(cells: list[Any]) -> list[int]:
    """Where papermill's error banners are among *cells*."""
    return [i for i, cell in enumerate(cells)
            if "papermill-error-cell-tag" in cell.metadata.get("tags", [])]


def executed_cells(path: Path) -> list[int | None]:
    return [cell.get("execution_count") for cell in nbformat.read(path, 4).cells
            if cell.cell_type == "code"]


def titled(path: Path) -> Path:
    """The notebook at *path* with a markdown cell put first, so that a code cell's place among
    the notebook's cells is not its place among its code cells."""
    notebook = nbformat.read(path, 4)
    notebook.cells.insert(0, nbformat.v4.new_markdown_cell("# Title"))
    nbformat.write(notebook, path)
    return path


def run_row(env: dict[str, str], job: str) -> dict[str, Any]:
    """The run's row, read from the store itself (as often as a test likes: no command)."""
    with contextlib.closing(sqlite3.connect(Path(env["NBBUDGET_HOME"]) / "nbbudget.db")) as db:
        cursor = db.execute("SELECT * FROM notebook_runs WHERE id = ?", (job,))
        names = [d[0] for d in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


def wait_for_state(env: dict[str, str], job: str, state: str,
                   timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (row := run_row(env, job))["state"] != state and time.monotonic() < deadline:
        time.sleep(0.05)
    assert row["state"] == state, row
    return row


def children(pid: int) -> list[int]:
    """The processes *pid* started (its kernel, for a runner)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat_file.read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(stat_file.parent.name))
    return found


def alive(pid: int) -> bool:
    """Whether *pid* is a process that has not ended (a zombie has)."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_text.rpartition(")")[2].split()[0] != "Z"


# -- detach (S0-1, S0-2, S0-11) --------------------------------------------------------------
def test_S0_1_a_detached_notebook_of_10s_exits_14_within_3s_and_completes_in_the_background(
        env, tmp_path):
    notebook = slow_notebook(tmp_path, 10, 1.0)
    env["AGENT_CALL_BUDGET_MS"] = "2000"
    first = nbbudget(env, "run", notebook.name, cwd=tmp_path)
    assert first.code == 14, first.stderr
    assert first.seconds < 3.0
    envelope = first.envelope
    assert (envelope["ok"], envelope["error"]) == (False, None)
    assert envelope["meta"]["exit_code"] == 14 and envelope["meta"]["budget_ms"] == 2000
    data = envelope["data"]
    assert data["state"] == "running"
    assert data["next"] == "nbbudget run slow.ipynb"  # the identical command
    assert data["output"] == str(tmp_path / "slow.out.ipynb")
    assert len(ran(tmp_path)) < 10

    wait_for_job(env, tmp_path, data["job"], "done", timeout=40)
    assert ran(tmp_path) == [str(i) for i in range(10)]  # each cell once, in order
    result = nbbudget(env, "run", notebook.name, cwd=tmp_path)
    assert result.code == 0
    assert result.envelope["ok"] is True
    assert result.envelope["meta"]["budget_ms"] == 2000
    assert result.envelope["data"] | {"consumed": None} == {
        "state": "done", "job": data["job"], "output": data["output"], "executed": 11,
        "cells": 11, "consumed": None}
    assert executed_cells(tmp_path / "slow.out.ipynb") == list(range(1, 12))


def test_S0_11_once_delivered_the_identical_command_starts_anew_and_cancel_stops_it(
        env, tmp_path):
    notebook = slow_notebook(tmp_path, 2, 0.1, name="quick.ipynb")
    first = nbbudget(env, "run", notebook.name, "--budget", "30s", cwd=tmp_path)
    assert first.code == 0, first.stdout + first.stderr
    assert ran(tmp_path) == ["0", "1"]
    write_notebook(notebook, "import time\ntime.sleep(30)")  # new work under the same name
    again = nbbudget(env, "run", notebook.name, "--budget", "2s", cwd=tmp_path)
    assert again.code == 14
    job = again.envelope["data"]["job"]
    assert job != first.envelope["data"]["job"]

    cancelled = nbbudget(env, "cancel", job, cwd=tmp_path)
    assert cancelled.code == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"run {job} cancelled at cell 1 of 1; ")
    stopped = nbbudget(env, "run", notebook.name, "--budget", "2s", cwd=tmp_path)
    assert stopped.code == 130
    assert stopped.envelope["data"]["state"] == "stopped"
    assert stopped.envelope["error"]["code"] == "stopped"
    assert [row["state"] for row in jobs(env, tmp_path)] == ["cancelled", "done"]
    table = nbbudget(env, "jobs", cwd=tmp_path).stdout.splitlines()
    assert table[0].split() == ["id", "state", "cell", "why", "started", "notebook"]
    assert table[1].split()[:7] == [job, "cancelled", "cell", "1", "of", "1", "stopped"]


# -- resume (S0-1, S0-2, S0-11, S4-4) -------------------------------------------------------
def test_S0_1_a_resumable_notebook_pauses_at_the_first_boundary_past_2s_and_continues(
        env, tmp_path):
    notebook = write_notebook(tmp_path / "slow.ipynb", "import time\ncount = 0",
                              *(logged(i, 0.6) for i in range(8)), "print('count', count)")
    env["AGENT_CALL_BUDGET_MS"] = "2000"
    starting = 0
    for _ in range(5):  # a kernel slower to start than 2 s (a busy machine): "starting", and
        began = time.time()  # the identical command takes the turn over, with a budget of its
        first = nbbudget(env, "run", notebook.name, "--resume", cwd=tmp_path)  # own, while the
        assert first.code == 14, first.stderr  # kernel is still starting
        data = first.envelope["data"]
        if data["state"] != "starting":
            break
        starting += 1
    assert data["state"] == "paused"
    # a command that came once the kernel was up joined the turn its start had used up, and
    # may be told at once that the run paused (`Runs.claim` in nbbudget.calls.run_store)
    least = 0.0 if starting else 2.0
    assert least <= first.envelope["meta"]["duration_ms"] / 1000 < 6.0
    assert data["next"] == "nbbudget run slow.ipynb --resume"
    assert data["checkpoint"] == f"{data['job']}:{data['cell']}"
    if data["executed"]:  # the kernel was up before 2 s: the last cell ran across them
        timing = nbformat.read(tmp_path / "slow.out.ipynb", 4).cells[data["cell"] - 1] \
            .metadata.execution
        assert stamp(timing["iopub.execute_input"]) < began + 2.0 + 1.0  # its start-up
        assert stamp(timing["shell.execute_reply"]) >= began + 2.0
    done_before = ran(tmp_path)
    assert len(done_before) == max(0, data["executed"] - 1)  # the setup cell logs nothing
    time.sleep(1.0)
    assert ran(tmp_path) == done_before  # paused: nothing runs between the commands

    turns = [first]
    while turns[-1].code == 14:
        turns.append(nbbudget(env, "run", notebook.name, "--resume", cwd=tmp_path))
        assert len(turns) < 10
    last = turns[-1]
    assert last.code == 0, last.stdout + last.stderr
    assert all(turn.envelope["data"]["job"] == data["job"] for turn in turns)
    assert ran(tmp_path) == [str(i) for i in range(8)]  # continued from the next cell
    executed = nbformat.read(tmp_path / "slow.out.ipynb", 4)
    assert executed.cells[-1].outputs[0]["text"] == "count 8\n"  # the same kernel throughout
    assert executed_cells(tmp_path / "slow.out.ipynb") == list(range(1, 11))


SLOW_KERNEL_S = 5.0


def slow_kernel(env: dict[str, str], folder: Path) -> str:
    """A kernelspec, found through ``JUPYTER_PATH``, whose kernel takes `SLOW_KERNEL_S` to
    start (as a kernel does on a busy machine, or with heavy imports); its name."""
    spec = folder / "jupyter" / "kernels" / "slow-start"
    spec.mkdir(parents=True)
    start = (f"import sys, time; time.sleep({SLOW_KERNEL_S}); "
             f"from ipykernel.kernelapp import launch_new_instance; launch_new_instance()")
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", start, "-f", "{connection_file}"],
        "display_name": "slow to start", "language": "python"}))
    env["JUPYTER_PATH"] = str(folder / "jupyter")
    return "slow-start"


def test_S0_1_a_resumable_command_answers_at_its_budget_while_the_kernel_starts(env, tmp_path):
    notebook = write_notebook(tmp_path / "five.ipynb", "import time\ncount = 0",
                              *(logged(i, 0.2) for i in range(4)),
                              kernel=slow_kernel(env, tmp_path))
    command = ("run", notebook.name, "--resume", "--budget", "500ms")
    first = nbbudget(env, *command, cwd=tmp_path)
    assert first.code == 14, first.stdout + first.stderr
    assert first.envelope["meta"]["duration_ms"] < 500 + 1500  # not the kernel's 5 s
    assert first.seconds < SLOW_KERNEL_S
    data = first.envelope["data"]
    assert (data["state"], data["executed"], data["cell"]) == ("starting", 0, None)
    assert data["next"] == "nbbudget run five.ipynb --budget 500ms --resume"
    assert [row["state"] for row in jobs(env, tmp_path)] == ["starting"]
    while (row := jobs(env, tmp_path)[0])["cells"] is None:  # the runner reads the notebook
        assert row["state"] == "starting"
        time.sleep(0.1)
    again = nbbudget(env, *command, cwd=tmp_path).envelope["data"]  # the kernel sleeps on
    assert (again["state"], again["executed"], again["cell"]) == ("starting", 0, None)

    wait_for_job(env, tmp_path, data["job"], "paused", timeout=30)  # at its first cell
    assert ran(tmp_path) == []
    turns = [first]
    while turns[-1].code == 14:
        turns.append(nbbudget(env, *command, cwd=tmp_path))
        assert turns[-1].envelope["meta"]["duration_ms"] < 500 + 3000  # a cell past it, at most
        assert len(turns) < 12
    assert turns[-1].code == 0, turns[-1].stdout + turns[-1].stderr
    assert [turn.envelope["data"]["state"] for turn in turns[1:-1]] == \
        ["paused"] * (len(turns) - 2)
    assert {turn.envelope["data"]["job"] for turn in turns} == {data["job"]}
    assert ran(tmp_path) == ["0", "1", "2", "3"]  # every cell once, in order


def test_S0_11_a_command_that_finds_the_kernel_still_starting_takes_over_the_turn(
        env, tmp_path):
    """The caller that was answered ``starting`` is gone: the identical command's budget is
    the turn's, and the notebook runs within it rather than pausing at once."""
    notebook = write_notebook(tmp_path / "one.ipynb", "open('ran.txt', 'a').write('0\\n')",
                              kernel=slow_kernel(env, tmp_path))
    first = nbbudget(env, "run", notebook.name, "--resume", "--budget", "500ms", cwd=tmp_path)
    assert first.envelope["data"]["state"] == "starting"
    again = nbbudget(env, "run", notebook.name, "--resume", "--budget", "30s", cwd=tmp_path)
    assert again.code == 0, again.stdout + again.stderr
    assert again.envelope["data"]["job"] == first.envelope["data"]["job"]
    assert ran(tmp_path) == ["0"]


# -- within the budget (S0-9), parameters, limits shared by every cell (S4-2, S4-3, S2-1) -----
def test_S0_9_a_notebook_within_its_budget_returns_its_result_with_its_cells_sharing_one_run(
        env, tmp_path):
    notebook = write_notebook(
        tmp_path / "params.ipynb",
        "import nbbudget as nb\nfor _ in range(rows):\n    nb.current().step()",
        "%%budget --steps 2 --no-widget\nnb.current().step()\nnb.current().step()\n"
        "print(type(nb.current()).__name__)",
        "print(label, nb.current().consumed['steps'])",
        parameters="rows = 1\nlabel = 'default'", limits={"max_steps": 10})
    done = nbbudget(env, "run", notebook.name, "-p", "rows", "3", "-p", "label", "hello",
                    "--steps", "8", "--budget", "30s", "--output", "out.ipynb", cwd=tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    envelope = done.envelope
    assert envelope["meta"]["budget_ms"] == 30000
    assert envelope["data"]["state"] == "done"
    assert envelope["data"]["output"] == str(tmp_path / "out.ipynb")
    assert envelope["data"]["consumed"]["steps"] == 5  # 3 in a cell, 2 in a grant of the run
    cells = nbformat.read(tmp_path / "out.ipynb", 4).cells
    assert cells[1].metadata.tags == ["injected-parameters"]  # after the parameters cell
    assert "rows = 3" in cells[1].source and "label = \"hello\"" in cells[1].source
    grant = cells[3].outputs[0]["text"]  # the cell's run, and its own allowance used up
    assert grant.startswith("Grant\nnbbudget cell: nb.current().step(): completed, ")
    assert grant.endswith("; steps 2/2\n")
    assert cells[4].outputs[0]["text"] == "hello 5\n"


@pytest.mark.parametrize(("flag", "metadata"), [("4", 10), ("8", 4)],
                         ids=["flag-lower", "metadata-lower"])
def test_S4_2_a_budget_stop_names_the_limit_the_lower_of_flags_and_metadata(
        env, tmp_path, flag, metadata):
    notebook = write_notebook(
        tmp_path / "steps.ipynb",
        "import nbbudget as nb\nfor _ in range(3):\n    nb.current().step()",
        "%%budget --steps 5 --no-widget\nfor _ in range(3):\n    nb.current().step()",
        "print('never')", limits={"steps": metadata})
    done = nbbudget(env, "run", notebook.name, "--steps", flag, "--budget", "30s",
                    cwd=tmp_path)
    assert done.code == 1, done.stdout + done.stderr
    error = done.envelope["error"]
    assert (error["code"], error["cell_index"], error["ename"]) == (
        "StepBudgetExceeded", 1, "BudgetExceeded")
    assert error["message"] == ("steps would exceed the run's limit of 4 (4 used, 1 more "
                                "requested); raise the limit or do less work")
    assert done.envelope["data"]["consumed"]["steps"] == 4
    assert executed_cells(tmp_path / "steps.out.ipynb") == [1, 2, None]


SPENT = ("long.ipynb ran out of time: its time grant of 2000 ms is spent; give it more time "
         "or do less work")


@pytest.mark.parametrize(("cell", "ename", "evalue"), [
    ("time.sleep(60)", "KeyboardInterrupt", ""),
    ("import nbbudget as nb\nwhile True:\n    time.sleep(0.05)\n    nb.current().check()",
     "BudgetCut", SPENT),
], ids=["interrupted", "checked"])
def test_S4_7_the_runs_time_grant_ends_the_cell_that_spends_it(env, tmp_path, cell, ename,
                                                                evalue):
    notebook = write_notebook(tmp_path / "long.ipynb", "import time\ntime.sleep(0.5)", cell,
                              "print('never')")
    done = nbbudget(env, "run", notebook.name, "--time", "2s", "--budget", "30s", cwd=tmp_path)
    assert done.code == 1, done.stdout + done.stderr
    assert done.envelope["data"]["consumed"]["run_ms"] < 2000 + 1500  # not the cell's 60 s
    error = done.envelope["error"]
    assert (error["code"], error["message"], error["cell_index"], error["ename"],
            error["evalue"]) == ("RunTimeBudgetExceeded", SPENT, 1, ename, evalue)


def test_a_failing_cell_names_its_index_ename_and_evalue_and_its_notebook_is_kept(
        env, tmp_path):
    notebook = write_notebook(tmp_path / "fails.ipynb", "print('before')", "1 / 0",
                              "print('after')")
    done = nbbudget(env, "run", notebook.name, "--budget", "0", cwd=tmp_path)
    assert done.code == 1
    envelope = done.envelope
    assert envelope["meta"]["budget_ms"] == 0  # S0-4: no budget, waited for the end
    assert envelope["data"]["state"] == "failed"
    error = envelope["error"]
    assert (error["code"], error["cell_index"], error["ename"], error["evalue"]) == (
        "cell_error", 1, "ZeroDivisionError", "division by zero")
    cells = nbformat.read(tmp_path / "fails.out.ipynb", 4).cells  # with papermill's banners
    assert banners(cells) == [0, 2]
    assert "An Exception was encountered at '<a href=\"#papermill-error-cell\">In [2]</a>'" \
        in cells[0].source
    assert cells[1].outputs[0]["text"] == "before\n"
    assert 'id="papermill-error-cell"' in cells[2].source  # just above the cell that failed
    assert cells[3].outputs[0]["ename"] == "ZeroDivisionError"
    assert cells[4].get("execution_count") is None
    assert [cell.metadata.papermill["status"] for cell in cells if cell.cell_type == "code"] \
        == ["completed", "failed", "pending"]


def test_text_names_a_cell_counting_from_1_among_every_cell_and_json_counts_from_0(
        env, tmp_path):
    notebook = titled(write_notebook(tmp_path / "fails.ipynb", "x = 1", "1 / 0", "x = 2"))
    shown = on_terminal(env, "run", notebook.name, cwd=tmp_path)
    assert shown.code == 1, shown.stdout
    output = tmp_path / "fails.out.ipynb"
    assert shown.stdout.replace("\r", "").rsplit("\x1b[K", 1)[-1].startswith(
        f"failed (cell_error, exit 1): cell 3 of 4 raised ZeroDivisionError: division by zero; "
        f"the notebook as far as it got is in {output}")
    row = jobs(env, tmp_path)[0]
    assert (row["cell"], row["executed"], row["cells"]) == (2, 1, 3)  # JSON: from 0; code cells
    table = nbbudget(env, "jobs", cwd=tmp_path).stdout.splitlines()
    assert table[1].split()[1:7] == ["failed", "cell", "3", "of", "4", "cell_error"]
    again = nbbudget(env, "run", notebook.name, "--budget", "0", cwd=tmp_path)
    assert again.envelope["error"]["cell_index"] == 2
    assert again.envelope["error"]["message"].startswith("cell 3 of 4 raised ZeroDivisionError")


# -- the notebook detaches or pauses, not a cell ---------------------------------------------
IN_PLACE_CELLS = (
    "%%budget --detach --budget 500ms\ntime.sleep(1.5)\nprint('detached cell ended')",
    "%%budget --resume --budget 500ms\ni = nb.resume_state(0)\nwhile i < 3:\n"
    "    time.sleep(0.5)\n    i += 1\n    nb.checkpoint(i)\nprint('resumable cell ended', i)",
    "%%budget --detach --budget 500ms\nawait asyncio.sleep(1.5)\nprint('awaiting cell ended')",
)


def test_a_cells_own_detach_or_resume_runs_to_its_end_in_place_with_a_warning(env, tmp_path):
    notebook = write_notebook(tmp_path / "cells.ipynb",
                              "import asyncio, time\nimport nbbudget as nb", *IN_PLACE_CELLS,
                              "print('last')")
    env["AGENT_CALL_BUDGET_MS"] = "60000"
    done = nbbudget(env, "run", notebook.name, cwd=tmp_path)
    assert done.code == 0, done.stdout + done.stderr  # never an INCOMPLETE of a cell
    assert (done.envelope["data"]["state"], done.envelope["data"]["executed"]) == ("done", 5)
    assert done.envelope["warnings"] == [
        f"cell {i} of 5 ({source.splitlines()[0]}) ran to its end in place, as --budget 0 "
        f"makes it: inside nbbudget run the notebook is what detaches or pauses, not a cell; "
        f"give --detach or --resume and --budget to nbbudget run instead"
        for i, source in enumerate(IN_PLACE_CELLS, start=2)]
    cells = nbformat.read(tmp_path / "cells.out.ipynb", 4).cells
    assert [cell.source for cell in cells] == [  # the notebook keeps its cells as written
        cell.source for cell in nbformat.read(notebook, 4).cells]
    printed = ["".join(out.get("text", "") for out in cell.outputs) for cell in cells]
    assert printed[1:] == ["detached cell ended\n", "resumable cell ended 3\n",
                           "awaiting cell ended\n", "last\n"]
    assert [row["state"] for row in jobs(env, tmp_path)] == ["done"]


# -- the executed notebook, as papermill writes it ---------------------------------------------
def papermill(env: dict[str, str], *args: str, cwd: Path) -> Done:
    """papermill's own command, as a pipeline runs it."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "papermill", "--no-progress-bar", *args],
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120, check=False)
    return Done(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


@pytest.mark.parametrize("source", ["import sys\nsys.exit(0)", "import sys\nsys.exit()",
                                    "raise SystemExit"],
                         ids=["sys.exit(0)", "sys.exit()", "raise SystemExit"])
def test_a_cell_that_ends_with_SystemExit_0_or_None_ends_the_run_done_as_papermill_does(
        env, tmp_path, source):
    notebook = write_notebook(tmp_path / "exits.ipynb", "print('before')", source,
                              "open('ran.txt', 'a').write('after')")
    done = nbbudget(env, "run", notebook.name, "--budget", "30s", cwd=tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    assert (done.envelope["ok"], done.envelope["error"]) == (True, None)
    data = done.envelope["data"]
    assert (data["state"], data["executed"], data["cells"]) == ("done", 2, 3)
    assert not (tmp_path / "ran.txt").exists()  # the cells after it do not run, as in papermill
    cells = nbformat.read(tmp_path / "exits.out.ipynb", 4).cells
    assert banners(cells) == []
    assert cells[1].outputs[0]["ename"] == "SystemExit"
    assert [cell.get("execution_count") for cell in cells] == [1, 2, None]


def test_a_cell_that_ends_with_a_non_zero_SystemExit_fails_the_run(env, tmp_path):
    notebook = write_notebook(tmp_path / "exits.ipynb", "print('before')",
                              "import sys\nsys.exit(3)", "print('after')")
    done = nbbudget(env, "run", notebook.name, "--budget", "30s", cwd=tmp_path)
    assert done.code == 1, done.stdout + done.stderr
    error = done.envelope["error"]
    assert (error["code"], error["cell_index"], error["ename"], error["evalue"]) == (
        "cell_error", 1, "SystemExit", "3")
    assert banners(nbformat.read(tmp_path / "exits.out.ipynb", 4).cells) == [0, 2]


def test_a_notebook_papermill_executed_before_keeps_no_banner_output_or_record_of_that_run(
        env, tmp_path):
    write_notebook(tmp_path / "report.ipynb", "if fail:\n    raise ValueError('asked to fail')",
                   "print('end')", parameters="fail = True")
    before = papermill(env, "report.ipynb", "before.ipynb", cwd=tmp_path)
    assert before.code == 1, before.stderr  # papermill left its banners in before.ipynb
    assert banners(nbformat.read(tmp_path / "before.ipynb", 4).cells) == [0, 2]

    done = nbbudget(env, "run", "before.ipynb", "-p", "fail", "False", "--output", "after.ipynb",
                    "--budget", "30s", cwd=tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    after = nbformat.read(tmp_path / "after.ipynb", 4)
    assert banners(after.cells) == []
    assert [cell.source for cell in after.cells] == [
        "fail = True", "# Parameters\nfail = False\n",
        "if fail:\n    raise ValueError('asked to fail')", "print('end')"]
    assert [cell.outputs for cell in after.cells][2:] == [
        [], [{"name": "stdout", "output_type": "stream", "text": "end\n"}]]
    assert [cell.metadata.papermill["status"] for cell in after.cells] == ["completed"] * 4
    assert after.metadata.papermill["exception"] is None
    assert after.metadata.papermill["parameters"] == {"fail": False}


def test_a_notebook_executed_before_gets_its_banner_where_the_new_failure_is(env, tmp_path):
    write_notebook(tmp_path / "steps.ipynb", "if where == 1:\n    raise ValueError('one')",
                   "if where == 2:\n    raise ValueError('two')", parameters="where = 1")
    first = nbbudget(env, "run", "steps.ipynb", "--output", "first.ipynb", "--budget", "30s",
                     cwd=tmp_path)
    assert first.envelope["error"]["evalue"] == "one"
    assert banners(nbformat.read(tmp_path / "first.ipynb", 4).cells) == [0, 2]

    again = nbbudget(env, "run", "first.ipynb", "-p", "where", "2", "--output", "again.ipynb",
                     "--budget", "30s", cwd=tmp_path)
    assert again.envelope["error"]["evalue"] == "two"
    assert again.envelope["error"]["cell_index"] == 3  # of the notebook without its banners
    cells = nbformat.read(tmp_path / "again.ipynb", 4).cells
    assert banners(cells) == [0, 4]  # at the top, and just above the cell that failed now
    assert "In [4]" in cells[0].source
    assert cells[3].outputs == [] and cells[5].outputs[0]["evalue"] == "two"


@pytest.mark.parametrize("language_info", [
    {"name": "python", "version": "2.7.12", "pygments_lexer": "ipython2"}, None],
    ids=["python-2.7.12", "none"])
def test_the_saved_notebook_has_the_language_info_of_the_kernel_that_ran_it(
        env, tmp_path, language_info):
    notebook = write_notebook(tmp_path / "old.ipynb",
                              "import platform\nprint(platform.python_version())")
    if language_info is not None:
        raw = json.loads(notebook.read_text())
        raw["metadata"]["language_info"] = language_info
        notebook.write_text(json.dumps(raw))
    done = nbbudget(env, "run", notebook.name, "--budget", "30s", cwd=tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    executed = nbformat.read(tmp_path / "old.out.ipynb", 4)
    version = executed.cells[0].outputs[0]["text"].strip()
    assert executed.metadata.language_info["version"] == version
    assert executed.metadata.language_info["pygments_lexer"] == "ipython3"


def test_parameters_for_a_notebook_without_a_parameters_cell_go_at_the_top_with_a_warning(
        env, tmp_path):
    notebook = write_notebook(tmp_path / "plain.ipynb", "print(alpha, label)")
    done = nbbudget(env, "run", notebook.name, "-p", "alpha", "0.5", "-p", "label", "hi",
                    "--budget", "30s", cwd=tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    assert done.envelope["warnings"] == [
        "'plain.ipynb' has no cell tagged 'parameters': -p alpha, label went into a cell at its "
        "top, as papermill does; tag the cell that sets the defaults 'parameters' to inject "
        "them after it"]
    cells = nbformat.read(tmp_path / "plain.out.ipynb", 4).cells
    assert cells[0].metadata.tags == ["injected-parameters"]
    assert cells[1].outputs[0]["text"] == "0.5 hi\n"


def test_a_parameter_the_parameters_cell_does_not_define_is_injected_with_a_warning(
        env, tmp_path):
    notebook = write_notebook(tmp_path / "typo.ipynb", "print(rows, rwos)",
                              parameters="rows = 1  # how many")
    done = nbbudget(env, "run", notebook.name, "-p", "rows", "2", "-p", "rwos", "3",
                    "--budget", "30s", cwd=tmp_path)
    assert done.code == 0, done.stdout + done.stderr
    assert done.envelope["warnings"] == [
        "-p rwos: the cell tagged 'parameters' of 'typo.ipynb' does not define rwos; it was "
        "injected all the same; check its name"]
    assert nbformat.read(tmp_path / "typo.out.ipynb", 4).cells[2].outputs[0]["text"] == "2 3\n"
    listed = nbbudget(env, "run", notebook.name, "-p", "rows", "2", "-p", "rwos", "3",
                      "--budget", "30s", cwd=tmp_path)
    assert listed.envelope["warnings"] == done.envelope["warnings"]  # every run says it


def test_the_executed_notebook_is_written_with_the_umask_and_the_store_stays_private(
        env, tmp_path):
    write_notebook(tmp_path / "mine.ipynb", "x = 1")
    done = subprocess.run(["sh", "-c", f"umask 027 && exec {sys.executable} -m nbbudget run "
                                       f"mine.ipynb --budget 30s"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert stat.S_IMODE((tmp_path / "mine.out.ipynb").stat().st_mode) == 0o640
    home = Path(env["NBBUDGET_HOME"])
    assert stat.S_IMODE((home / "nbbudget.db").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


# -- on a terminal (S0-5) ---------------------------------------------------------------------
def test_S0_5_on_a_terminal_without_budget_it_runs_to_the_end_with_a_progress_line(
        env, tmp_path):
    notebook = write_notebook(tmp_path / "term.ipynb", "import time",
                              "time.sleep(1.5)  # first", "time.sleep(1.5)  # second")
    with_title = nbformat.read(notebook, 4)
    with_title.cells.insert(0, nbformat.v4.new_markdown_cell("# Terminal"))
    nbformat.write(with_title, notebook)
    env["AGENT_CALL_BUDGET_MS"] = "1000"  # a person's command ignores it
    done = on_terminal(env, "run", notebook.name, "--json", cwd=tmp_path)
    assert done.code == 0, done.stdout
    assert done.seconds > 3.0
    # the running cell counted from 1 among every cell of the notebook, as cell_index + 1
    assert "nbbudget: cell 3 of 4, " in done.stdout
    assert "time.sleep(1.5)  # first" in done.stdout
    envelope = json.loads(done.stdout[done.stdout.index('{"ok"'):].splitlines()[0])
    assert envelope["data"]["state"] == "done"
    assert "budget_ms" not in envelope["meta"]


def test_S0_5_a_person_reads_a_short_summary(env, tmp_path):
    notebook = write_notebook(tmp_path / "term.ipynb", "x = 1", "print(x)")
    done = on_terminal(env, "run", notebook.name, cwd=tmp_path)
    assert done.code == 0, done.stdout
    final = done.stdout.rsplit("\x1b[K", 1)[-1]  # after the progress line, cleared
    said, used = final.replace("\r", "").rstrip("\n").splitlines()
    assert said.startswith("done: 2 of 2 code cells ran in ")
    assert said.endswith(f" s; the executed notebook is {tmp_path / 'term.out.ipynb'}")
    assert used.startswith("  consumed: run_ms ")


def test_ctrl_c_on_a_terminal_stops_the_notebook_and_says_so(env, tmp_path):
    notebook = write_notebook(tmp_path / "long.ipynb", "import time\ntime.sleep(60)")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "nbbudget", "run", notebook.name, "--json"],
                            env=env, cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "long.out.ipynb").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the cell is running
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        shown = b""
        while select.select([master], [], [], 0.2)[0]:
            try:
                shown += os.read(master, 65536)
            except OSError:
                break
    finally:
        os.close(master)
    envelope = json.loads(shown.decode()[shown.decode().index('{"ok"'):].splitlines()[0])
    assert (envelope["data"]["state"], envelope["error"]["code"]) == ("stopped", "stopped")
    job = envelope["data"]["job"]
    assert envelope["error"]["message"] == (
        f"run {job} was stopped by Ctrl-C at cell 1 of 1; the notebook as far as it got is in "
        f"{tmp_path / 'long.out.ipynb'}")
    row = jobs(env, tmp_path)[0]
    assert (row["state"], row["error"]) == ("cancelled", "stopped")
    assert "Ctrl-C" in row["message"]


@pytest.mark.parametrize("how", ["paused", "in a cell"])
def test_a_stop_signal_to_the_runner_stops_the_run_as_cancel_does(env, tmp_path, how):
    if how == "paused":
        notebook = slow_notebook(tmp_path, 6, 0.5, name="s.ipynb")
        command = ("run", notebook.name, "--resume", "--budget", "1s")
        job = nbbudget(env, *command, cwd=tmp_path).envelope["data"]["job"]
        wait_for_job(env, tmp_path, job, "paused", timeout=30)
    else:
        notebook = write_notebook(tmp_path / "s.ipynb", "import time\ntime.sleep(60)")
        command = ("run", notebook.name, "--detach", "--budget", "1s")
        job = nbbudget(env, *command, cwd=tmp_path).envelope["data"]["job"]
        wait_for_job(env, tmp_path, job, "running", timeout=30)
        time.sleep(1.0)  # the cell is running
    pid = jobs(env, tmp_path)[0]["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while runner_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not runner_alive(pid)  # it stopped its kernel and left, not waiting for ever
    row = jobs(env, tmp_path)[0]
    assert (row["state"], row["error"]) == ("cancelled", "stopped")
    again = nbbudget(env, *command, cwd=tmp_path)  # the identical command: how it ended
    assert again.code == 130
    cell, cells = again.envelope["data"]["cell"], len(nbformat.read(notebook, 4).cells)
    assert again.envelope["error"]["message"] == (
        f"run {job} was stopped by SIGTERM at cell {cell + 1} of {cells}; "
        f"the notebook as far as it got is in {tmp_path / 's.out.ipynb'}")


# -- bad input: exit 2, nothing runs ----------------------------------------------------------
BAD_INPUT = [
    (["missing.ipynb"], "nbbudget run: no notebook at 'missing.ipynb'; check the path"),
    (["junk.ipynb"], "junk.ipynb' is not a valid notebook (not JSON: Expecting property name"),
    (["cells.ipynb"], "cells.ipynb' is not a valid notebook (it has no list of cells and "
                      "metadata); give the path of an .ipynb file in nbformat 4"),
    (["v3.ipynb"], "v3.ipynb' is not a valid notebook (not an nbformat 4 notebook)"),
    (["good.ipynb", "--stepz", "3"],
     "nbbudget run: error: unrecognized arguments: --stepz 3 (did you mean --steps?)"),
    (["good.ipynb", "--budget", "2x"],
     "nbbudget run: --budget='2x' is not a duration; write a number with a unit"),
    (["good.ipynb", "--timeout", "0"], "nbbudget run: --timeout 0 would cancel the notebook"),
    (["good.ipynb", "--idle-timeout", "5"],
     "nbbudget run: --idle-timeout 5 has no unit: write --idle-timeout 5s for seconds"),
    (["good.ipynb", "--detach", "--resume"],
     "nbbudget run: --detach and --resume exclude each other: choose how the work outlives "
     "its budget"),
    (["tagged.ipynb", "-p", "two words", "1"], "nbbudget run: -p 'two words': a parameter's"),
    (["good.ipynb", "--steps", "0"],
     "nbbudget run: --steps 0 must be greater than 0; leave --steps out for no limit"),
    (["good.ipynb", "--runs-per-day", "0"],
     "nbbudget run: --runs-per-day 0: use a whole number from 1 to 1000000; leave --runs-per-day "
     "out for no quota"),
    (["good.ipynb", "--steps", "None"],
     "nbbudget run: error: argument --steps: invalid int value: 'None'"),
    (["good.ipynb", "--budget", "-1s"],
     "nbbudget run: --budget='-1s' is negative; a duration is 0 or more milliseconds"),
    (["good.ipynb", "--budget=-1s"],
     "nbbudget run: --budget='-1s' is negative; a duration is 0 or more milliseconds"),
    (["limits.ipynb"], "nbbudget run: metadata.nbbudget.limits of 'limits.ipynb': "),
    (["good.ipynb", "--output", "good.ipynb"],
     "nbbudget run: --output 'good.ipynb' is the notebook itself"),
    (["good.ipynb", "--output", "nowhere/out.ipynb"], "nbbudget run: the folder of the output "),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT,
                         ids=[" ".join(args) for args, _ in BAD_INPUT])
def test_bad_input_exits_2_with_a_message_naming_the_value_and_nothing_runs(
        env, tmp_path, args, message):
    write_notebook(tmp_path / "good.ipynb", "open('ran.txt', 'a').write('ran')")
    write_notebook(tmp_path / "tagged.ipynb", "x = 1", parameters="alpha = 0")
    write_notebook(tmp_path / "limits.ipynb", "x = 1", limits={"max_stepz": 3})
    (tmp_path / "junk.ipynb").write_text("{not json")
    (tmp_path / "cells.ipynb").write_text('{"cells": 3, "nbformat": 4, "nbformat_minor": 5}')
    (tmp_path / "v3.ipynb").write_text('{"worksheets": [], "nbformat": 3, "nbformat_minor": 0}')
    done = nbbudget(env, "run", *args, cwd=tmp_path)
    assert done.code == 2
    assert done.stdout == ""
    assert message in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.out.ipynb")) and not (tmp_path / "ran.txt").exists()
    assert not (tmp_path / "home").exists()  # no run was even recorded


def test_a_bad_call_budget_in_the_environment_exits_2_naming_it(env, tmp_path):
    write_notebook(tmp_path / "good.ipynb", "x = 1")
    env["AGENT_CALL_BUDGET_MS"] = "soon"
    done = nbbudget(env, "run", "good.ipynb", cwd=tmp_path)
    assert done.code == 2
    assert done.stderr.startswith("nbbudget run: AGENT_CALL_BUDGET_MS='soon' is not a duration")


@pytest.mark.parametrize(("value", "message"), [
    ("soon", "nbbudget run: NBBUDGET_IDLE_TIMEOUT='soon' is not a duration"),
    ("10", "nbbudget run: NBBUDGET_IDLE_TIMEOUT=10 has no unit: write NBBUDGET_IDLE_TIMEOUT=10s "
           "for seconds or NBBUDGET_IDLE_TIMEOUT=10m for minutes (also ms, h); 0 for no limit")])
def test_a_bad_idle_time_in_the_environment_exits_2_naming_it(env, tmp_path, value, message):
    write_notebook(tmp_path / "good.ipynb", "x = 1")
    env["NBBUDGET_IDLE_TIMEOUT"] = value
    done = nbbudget(env, "run", "good.ipynb", cwd=tmp_path)
    assert done.code == 2
    assert done.stderr.startswith(message)
    assert not (tmp_path / "home").exists()


def test_an_unknown_flag_shows_the_usage_of_its_command_and_the_flag_it_is_like(env, tmp_path):
    write_notebook(tmp_path / "x.ipynb", "x = 1")
    done = nbbudget(env, "run", "x.ipynb", "--stpes", "3", cwd=tmp_path)
    assert (done.code, done.stdout) == (2, "")
    assert done.stderr.startswith("usage: nbbudget run [-h] [-p NAME VALUE] [--output PATH]")
    assert done.stderr.splitlines()[-1] == \
        "nbbudget run: error: unrecognized arguments: --stpes 3 (did you mean --steps?)"
    listing = nbbudget(env, "jobs", "--jsn", cwd=tmp_path)
    assert listing.code == 2
    assert listing.stderr == ("usage: nbbudget jobs [-h] [--json]\nnbbudget jobs: error: "
                              "unrecognized arguments: --jsn (did you mean --json?)\n")


def test_a_damaged_store_exits_2_naming_it_and_nothing_runs(env, tmp_path):
    write_notebook(tmp_path / "good.ipynb", "open('ran.txt', 'a').write('ran')")
    home = Path(env["NBBUDGET_HOME"])
    home.mkdir()
    (home / "nbbudget.db").write_bytes(b"not a database" * 100)
    for args in (["run", "good.ipynb"], ["jobs"], ["cancel", "run-00000000"]):
        done = nbbudget(env, *args, cwd=tmp_path)
        assert done.code == 2
        assert done.stderr.startswith(f"nbbudget {args[0]}: the nbbudget store ")
        assert " is damaged: " in done.stderr
    assert not (tmp_path / "ran.txt").exists()


def test_a_store_of_an_earlier_version_lists_a_run_stopped_by_cancel_as_cancelled(
        env, tmp_path):
    assert nbbudget(env, "jobs", cwd=tmp_path).code == 0  # the store, made as it is now
    with contextlib.closing(sqlite3.connect(Path(env["NBBUDGET_HOME"]) / "nbbudget.db")) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(notebook_runs)")]
        later = columns[columns.index("warnings"):]
        assert later == ["warnings", "notebook_cells", "idle_ms", "cancel_by"]
        for column in later:  # as an earlier version made it
            db.execute(f"ALTER TABLE notebook_runs DROP COLUMN {column}")
        db.execute("INSERT INTO notebook_runs (id, identity, spec, state, created, updated) "
                   "VALUES ('run-0ld', 'notebook:x', ?, 'stopped', 1, 2)",
                   (json.dumps({"notebook": "/x.ipynb", "output": "/x.out.ipynb",
                                "mode": "detach"}),))
        db.commit()
    assert [(row["id"], row["state"]) for row in jobs(env, tmp_path)] == [("run-0ld", "cancelled")]


def test_cancel_of_an_unknown_run_exits_2_naming_it(env, tmp_path):
    done = nbbudget(env, "cancel", "run-00000000", cwd=tmp_path)
    assert done.code == 2
    assert done.stderr == (f"nbbudget cancel: no run 'run-00000000' in the store at "
                           f"{env['NBBUDGET_HOME']}; nbbudget jobs lists the runs\n")


def test_run_help_shows_every_flag_with_an_example(env, tmp_path):
    done = nbbudget(env, "run", "--help", cwd=tmp_path)
    assert done.code == 0
    usage, _, examples = done.stdout.partition("\nexamples:\n")
    flags = ["-p", "--output", "--budget", "--detach", "--resume", "--timeout",
             "--idle-timeout", "--json",
             "--time", "--steps", "--tool-calls", "--agent-invocations", "--provider-calls",
             "--turns", "--tokens", "--output-tokens", "--cost", "--run-limits-json",
             "--manifest", "--runs-per-day"]
    for flag in flags:
        assert f"{flag} " in usage, flag
        assert f"{flag} " in examples, flag
    assert "nbbudget run report.ipynb -p region emea" in examples


# -- a paused run nobody continues ----------------------------------------------------------------
def test_a_paused_run_nobody_continues_ends_after_its_idle_time_and_the_same_command_says_so(
        env, tmp_path):
    notebook = titled(slow_notebook(tmp_path, 6, 0.5, name="idle.ipynb"))  # 8 cells, 7 of code
    output = tmp_path / "idle.out.ipynb"
    env["NBBUDGET_IDLE_TIMEOUT"] = "3s"
    command = ("run", notebook.name, "--resume", "--budget", "1s")
    first = nbbudget(env, *command, cwd=tmp_path)
    assert first.code == 14, first.stdout + first.stderr
    job = first.envelope["data"]["job"]
    paused = wait_for_state(env, job, "paused")
    paused_at, runner = time.monotonic(), paused["pid"]
    kernels = children(runner)
    assert kernels  # a paused run holds its kernel

    ended = wait_for_state(env, job, "cancelled", timeout=30)
    assert time.monotonic() - paused_at > 2.5  # not before its idle time
    deadline = time.monotonic() + 20
    while (runner_alive(runner) or any(map(alive, kernels))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not runner_alive(runner) and not any(map(alive, kernels))  # kernel and runner ended
    cell = ended["cell"]
    message = (f"run {job} ended after 3.0 s paused before cell {cell + 1} of 8 with no command "
               f"continuing it (its idle time, --idle-timeout or NBBUDGET_IDLE_TIMEOUT); its "
               f"kernel was shut down and the notebook as far as it got is in {output}. Run the "
               f"same command again to start the notebook over from its first cell, with a "
               f"longer --idle-timeout (0: no limit) if its caller may take longer than 3.0 s "
               f"to come back")
    row = jobs(env, tmp_path)[0]
    assert (row["state"], row["error"], row["message"]) == ("cancelled", "idle_timeout", message)
    table = nbbudget(env, "jobs", cwd=tmp_path).stdout.splitlines()
    assert table[1].split()[1:7] == ["cancelled", "cell", str(cell + 1), "of", "8",
                                     "idle_timeout"]
    saved = executed_cells(output)  # the notebook as far as it got
    assert sum(count is not None for count in saved) == ended["executed"]
    assert saved[ended["executed"]:] == [None] * (7 - ended["executed"])

    again = nbbudget(env, *command, cwd=tmp_path)  # the identical command: says so, at once
    assert (again.code, again.envelope["data"]["state"]) == (124, "cancelled")
    assert again.seconds < 5.0
    assert again.envelope["error"] == {"code": "idle_timeout", "message": message}
    before = ran(tmp_path)
    anew = nbbudget(env, "run", notebook.name, "--resume", "--budget", "0", cwd=tmp_path)
    assert anew.code == 0, anew.stdout + anew.stderr  # then the same work starts over
    assert anew.envelope["data"]["job"] != job
    assert ran(tmp_path) == before + [str(i) for i in range(6)]


# -- faults ------------------------------------------------------------------------------------
def test_a_runner_killed_with_sigkill_is_reported_lost_and_its_partial_notebook_kept(
        env, tmp_path):
    notebook = slow_notebook(tmp_path, 10, 1.0)
    first = nbbudget(env, "run", notebook.name, "--budget", "2s", cwd=tmp_path)
    assert first.code == 14
    job = first.envelope["data"]["job"]
    deadline = time.monotonic() + 30
    while len(ran(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    row = next(row for row in jobs(env, tmp_path) if row["id"] == job)
    os.kill(row["pid"], signal.SIGKILL)

    lost = nbbudget(env, "run", notebook.name, "--budget", "2s", cwd=tmp_path)
    assert lost.code == 1
    assert lost.seconds < 5.0  # never hangs
    assert lost.envelope["data"]["state"] == "lost"
    assert lost.envelope["error"]["code"] == "lost"
    assert lost.envelope["error"]["message"].startswith(f"run {job} was lost: its runner (pid ")
    assert sum(count is not None for count in executed_cells(tmp_path / "slow.out.ipynb")) >= 2
    assert next(row for row in jobs(env, tmp_path) if row["id"] == job)["state"] == "lost"
    anew = nbbudget(env, "run", notebook.name, "--budget", "2s", cwd=tmp_path)
    assert anew.code == 14
    assert anew.envelope["data"]["job"] != job


def test_a_paused_runner_killed_with_sigkill_is_reported_lost_where_it_paused(env, tmp_path):
    notebook = slow_notebook(tmp_path, 6, 0.5)
    first = nbbudget(env, "run", notebook.name, "--resume", "--budget", "1s", "--idle-timeout",
                     "1h", cwd=tmp_path)
    assert first.code == 14, first.stdout + first.stderr
    job = first.envelope["data"]["job"]
    assert first.envelope["data"]["next"] == \
        "nbbudget run slow.ipynb --budget 1s --idle-timeout 1h --resume"
    paused = wait_for_state(env, job, "paused")
    os.kill(paused["pid"], signal.SIGKILL)

    lost = nbbudget(env, "run", notebook.name, "--resume", "--budget", "1s", cwd=tmp_path)
    assert (lost.code, lost.envelope["data"]["state"]) == (1, "lost")
    assert lost.seconds < 5.0  # never waits for a runner that is gone
    assert f"ended without finishing, at cell {paused['cell'] + 1} of 7; " in \
        lost.envelope["error"]["message"]


def test_a_kernel_that_dies_is_reported_with_its_cell_and_the_notebook_kept(env, tmp_path):
    notebook = write_notebook(tmp_path / "dies.ipynb", "print('alive')",
                              "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                              "print('never')")
    done = nbbudget(env, "run", notebook.name, "--budget", "30s", cwd=tmp_path)
    assert done.code == 1, done.stdout + done.stderr
    error = done.envelope["error"]
    assert (error["code"], error["cell_index"]) == ("kernel_died", 1)
    assert done.envelope["data"]["state"] == "failed"
    cells = nbformat.read(tmp_path / "dies.out.ipynb", 4).cells
    assert cells[0].outputs[0]["text"] == "alive\n"


def test_a_kernel_that_cannot_start_is_reported_and_nothing_runs(env, tmp_path):
    notebook = write_notebook(tmp_path / "alien.ipynb", "open('ran.txt', 'a').write('ran')")
    raw = json.loads(notebook.read_text())
    raw["metadata"]["kernelspec"]["name"] = "no-such-kernel"
    notebook.write_text(json.dumps(raw))
    done = nbbudget(env, "run", notebook.name, "--budget", "30s", cwd=tmp_path)
    assert done.code == 1, done.stdout + done.stderr
    error = done.envelope["error"]
    assert error["code"] == "kernel_failed"
    assert error["message"].startswith("the kernel 'no-such-kernel' did not start: NoSuchKernel")
    assert not (tmp_path / "ran.txt").exists()


def test_two_identical_commands_at_once_share_one_runner_and_one_execution(env, tmp_path):
    notebook = slow_notebook(tmp_path, 4, 1.0)
    both = [start(env, "run", notebook.name, "--budget", "2s", cwd=tmp_path) for _ in range(2)]
    answers = [json.loads(proc.communicate(timeout=60)[0]) for proc in both]
    assert [proc.returncode for proc in both] == [14, 14]
    job = answers[0]["data"]["job"]
    assert answers[1]["data"]["job"] == job
    assert len(jobs(env, tmp_path)) == 1
    wait_for_job(env, tmp_path, job, "done", timeout=40)
    assert ran(tmp_path) == ["0", "1", "2", "3"]  # executed once
    assert nbbudget(env, "run", notebook.name, "--budget", "2s", cwd=tmp_path).code == 0


def test_S0_6_timeout_bounds_the_whole_execution_across_continuations(env, tmp_path):
    notebook = slow_notebook(tmp_path, 10, 1.0)
    first = nbbudget(env, "run", notebook.name, "--resume", "--budget", "2s",
                     "--timeout", "5s", cwd=tmp_path)
    assert first.code == 14
    assert first.envelope["meta"]["timeout_ms"] == 5000
    time.sleep(4.0)  # paused time counts: the wall clock runs from the first start
    again = nbbudget(env, "run", notebook.name, "--resume", "--budget", "2s",
                     "--timeout", "5s", cwd=tmp_path)
    assert again.code == 124, again.stdout + again.stderr
    assert again.envelope["data"]["state"] == "cancelled"
    assert again.envelope["error"]["code"] == "cancelled"
    assert "its wall-clock limit of 5000 ms, counted from its first start across every " \
           "continuation, ran out" in again.envelope["error"]["message"]


def test_S4_12_runs_per_day_counts_notebook_starts_and_refuses_one_over_it(env, tmp_path):
    notebook = slow_notebook(tmp_path, 1, 0.0, name="daily.ipynb")
    args = ("run", notebook.name, "--runs-per-day", "1", "--budget", "30s")
    assert nbbudget(env, *args, cwd=tmp_path).code == 0
    refused = nbbudget(env, *args, cwd=tmp_path)
    assert refused.code == 1
    assert refused.envelope["error"]["code"] == "RunsPerDayExceeded"
    assert "quota of runs_per_day=1; nothing was run" in refused.envelope["error"]["message"]
    assert ran(tmp_path) == ["0"]
