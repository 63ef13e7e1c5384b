"""``nbbudget run``, ``nbbudget jobs`` and ``nbbudget cancel``: the call budget (seed 000) for a
whole notebook, from the command line.

``nbbudget run`` checks its input (a bad one is exit 2 and nothing runs), claims the work in
the store (two identical commands never start it twice), starts a runner process
(`nbbudget.cli.runner`) that owns the kernel, and waits for it at most its call budget, the
kernel's start-up included: it answers with the run's end (exit 0, or the end's own code), or
with INCOMPLETE (exit 14) while the runner goes on (``--detach``) or waits at the first cell
boundary past the budget (``--resume``; a kernel still starting at the budget is answered
``starting``, and the run then waits at its first cell). The identical command reattaches or
continues, and the end of a run is delivered once (S0-1, S0-2, S0-11, S0-12). A paused run
waits for it at most its idle time (``--idle-timeout``, else ``NBBUDGET_IDLE_TIMEOUT``, else
1 h), then ends, and the identical command reports that end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..calls.background import await_end, cancel_run, run_row
from ..calls.call import FLAG_SPELLING, check_interruption, resolve_budget, take_run
from ..calls.jobs import JobState
from ..calls.response import EXIT_INCOMPLETE, EXIT_STOPPED, Response, meta
from ..calls.run_store import RUNNER_MODULE, Claim, RunRecord, Runs, cell_named
from ..calls.store import store
from ..core.duration import flag_duration, parse_duration, spoken
from ..core.errors import ConfigError, RunsPerDayExceeded
from ..core.limits import Limits, budget_flags, limits_from_flags

__all__ = ["add_commands"]

POLL_S = 0.05  # how often a waiting command reads the run's row
CHECK_S = 0.5  # how often it checks that the runner is alive
#: how long a paused run waits for the identical command when neither --idle-timeout nor
#: the environment variable `ENV_IDLE` says (ms)
DEFAULT_IDLE_MS = 3_600_000
ENV_IDLE = "NBBUDGET_IDLE_TIMEOUT"
_CELL_TYPES = ("code", "markdown", "raw")
#: the flags of %%budget that `nbbudget run` takes as they are
LIMIT_FLAGS = tuple(flag for flag, _ in budget_flags())
RUN_EXAMPLES = """\
examples:
  nbbudget run report.ipynb -p region emea -p year 2024 --output report.out.ipynb
  nbbudget run train.ipynb --budget 2s --json        # exit 14 after 2 s; the same command
                                                     # again waits for the result
  nbbudget run etl.ipynb --resume --timeout 1h       # pauses between cells; the same
                                                     # command continues from the next cell
  nbbudget run etl.ipynb --resume --idle-timeout 10m # a pause nobody continues for 10 min
                                                     # ends, its kernel shut down
  nbbudget run agent.ipynb --detach --steps 500 --tool-calls 50 --provider-calls 20 \\
      --turns 10 --tokens 200000 --output-tokens 20000 --cost 2.50 \\
      --agent-invocations 5 --time 10m --runs-per-day 3
  nbbudget run agent.ipynb --run-limits-json '{"max_steps": 100}' --manifest limits.json
  nbbudget run slow.ipynb --budget 0                 # wait for the end, however long

exit codes: 0 done, 14 INCOMPLETE (run the same command again), 2 bad usage, or a store
damaged or locked past 10 s (nothing ran), 1 failed (error.code: cell_error, a limit's code
such as StepBudgetExceeded, kernel_died, kernel_failed, lost, RunsPerDayExceeded), 124
cancelled by --timeout or --idle-timeout (error.code cancelled, idle_timeout), 130 stopped by
nbbudget cancel or Ctrl-C."""


# -- the parsers ------------------------------------------------------------------------------
def add_commands(sub: Any) -> None:
    """Add ``run``, ``jobs`` and ``cancel`` to the subcommands *sub* of ``nbbudget``."""
    _add_run(sub)
    jobs = sub.add_parser(
        "jobs", help="list the notebook runs of nbbudget run in the store",
        description="List the notebook runs of nbbudget run kept in the store (NBBUDGET_HOME), "
                    "newest first: id, state, the cell it is at (cell 2 of 6: counted from 1 "
                    "in the executed notebook), why it ended, when it started, notebook. The "
                    "states are those of nb.jobs: starting, running, paused, done, failed, "
                    "cancelled (by nbbudget cancel, Ctrl-C, --timeout or --idle-timeout), lost "
                    "(its runner died).",
        epilog="example: nbbudget jobs --json")
    jobs.add_argument("--json", action="store_true",
                      help="print a JSON list of objects with id, state, notebook, output, ...")
    jobs.set_defaults(handler=jobs_command)
    cancel = sub.add_parser(
        "cancel", help="stop a notebook run of nbbudget run",
        description="Stop a notebook run: its running cell is interrupted, the notebook as far "
                    "as it got stays in its output, nbbudget jobs lists it cancelled, and the "
                    "identical nbbudget run command then reports it stopped (exit 130).",
        epilog="example: nbbudget cancel run-1a2b3c4d")
    cancel.add_argument("id", metavar="ID", help="the run's id (data.job, or nbbudget jobs)")
    cancel.set_defaults(handler=cancel_command)


def _add_run(sub: Any) -> None:
    run = sub.add_parser(
        "run", help="execute a notebook under a call budget (for pipelines and agent harnesses)",
        description="Execute NOTEBOOK in a fresh kernel with nbbudget loaded, its parameters "
                    "injected as papermill does, under one run whose limits every cell "
                    "shares; save the executed notebook after every cell. Wait at most the "
                    "call budget (--budget, else AGENT_CALL_BUDGET_MS, else 30 s; none on a "
                    "terminal), then answer INCOMPLETE (exit 14) while the notebook goes on "
                    "(--detach) or pauses at the next cell boundary (--resume): the same "
                    "command again reattaches or continues, and delivers the result once.",
        epilog=RUN_EXAMPLES, formatter_class=_ExamplesFormatter)
    run.add_argument("notebook", metavar="NOTEBOOK", help="the notebook to execute (.ipynb)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                     metavar=("NAME", "VALUE"), dest="parameters",
                     help="a parameter, injected after the cell tagged 'parameters' as papermill "
                          "does (at the top, with a warning, when no cell has that tag); VALUE "
                          "is read as papermill's -p reads it (True, 3, 0.5, None, else text), "
                          "e.g. -p alpha 0.5")
    run.add_argument("--output", metavar="PATH",
                     help="where the executed notebook is saved, after every cell, e.g. "
                          "--output out.ipynb (default: NOTEBOOK's name with .out.ipynb)")
    run.add_argument("--budget", metavar="DUR",
                     help="the call budget: how long this command may hold you, kernel start "
                          "included, e.g. --budget 2s; 0 turns it off (default: "
                          "AGENT_CALL_BUDGET_MS, else 30s; on a terminal, none)")
    run.add_argument("--detach", action="store_true",
                     help="when the budget runs out, the notebook goes on in the background "
                          "(the default)")
    run.add_argument("--resume", action="store_true",
                     help="when the budget runs out, the notebook pauses at the next cell "
                          "boundary, its kernel kept (or, its kernel still starting, at its "
                          "first cell); the same command continues it")
    run.add_argument("--timeout", metavar="DUR",
                     help="wall-clock limit of the whole execution, across every "
                          "continuation, e.g. --timeout 1h; the run ends cancelled (exit 124)")
    run.add_argument("--idle-timeout", metavar="DUR",
                     help=f"how long a paused run (--resume) keeps its kernel waiting for the "
                          f"same command, e.g. --idle-timeout 10m; then it ends, cancelled "
                          f"(error idle_timeout, exit 124), its notebook saved as far as it got; "
                          f"0: no limit (default: {ENV_IDLE}, else "
                          f"{spoken(DEFAULT_IDLE_MS)})")
    run.add_argument("--json", action="store_true",
                     help="print the JSON envelope even on a terminal")
    limits = run.add_argument_group(
        "limits of the notebook's run, shared by every cell (as %%budget's; combined by "
        "minimum with the notebook's metadata.nbbudget.limits)")
    _add_limit_flags(limits)
    run.set_defaults(handler=run_command)


class _ExamplesFormatter(argparse.HelpFormatter):
    """argparse's help, with a text of several lines (the examples) kept as it is written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" not in text:
            return super()._fill_text(text, width, indent)
        return "".join(indent + line for line in text.splitlines(keepends=True))


def _add_limit_flags(group: Any) -> None:
    """The limit flags as ``%%budget`` declares them (one table for both)."""
    for flag, options in budget_flags():
        group.add_argument(flag, **options)


# -- planning ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What a ``nbbudget run`` command asks for, checked."""

    spec: dict[str, Any]  # what the runner needs
    identity: str
    budget_ms: int | None
    timeout_ms: int | None
    idle_ms: int | None  # how long a paused run waits for the same command (None: ever)
    runs_per_day: int | None
    command: str  # the identical command, for data.next
    json: bool

    @property
    def resume(self) -> bool:
        return bool(self.spec["mode"] == "resume")


def plan(args: argparse.Namespace) -> Plan:
    """Check the command's input; a `ConfigError` naming the value and the fix otherwise."""
    _check_installed()
    check_interruption(args.detach, args.resume, None, spelling=FLAG_SPELLING)
    budget = None if args.budget is None else flag_duration(args.budget, "--budget")
    budget_ms = resolve_budget(budget, declares=True)
    timeout_ms = _timeout(args.timeout)
    idle_ms = _idle(args.idle_timeout)
    notebook, data = _notebook(args.notebook)
    nb = _read(notebook, data)
    limits = limits_from_flags(args) & _metadata_limits(notebook, nb)
    _check_parameters(args.parameters)
    output = _output(notebook, args.output)
    kernelspec = nb.get("metadata", {}).get("kernelspec", {})
    spec = {"notebook": str(notebook), "sha256": hashlib.sha256(data).hexdigest(),
            "output": str(output), "cwd": os.getcwd(), "parameters": args.parameters,
            "limits": limits.to_dict(), "mode": "resume" if args.resume else "detach",
            "kernel": kernelspec.get("name") or "python3", "name": notebook.name,
            "language": kernelspec.get("language") or "python"}
    work = {k: spec[k] for k in ("notebook", "sha256", "output", "cwd", "parameters",
                                 "limits", "mode", "kernel")}
    identity = "notebook:" + hashlib.sha256(
        json.dumps(work, sort_keys=True).encode()).hexdigest()
    return Plan(spec, identity, budget_ms, timeout_ms, idle_ms, _runs_per_day(args.runs_per_day),
                identical(args), args.json)


def identical(args: argparse.Namespace) -> str:
    """The command again, as ``data.next`` gives it: what this one was given, flag by flag."""
    words = ["nbbudget", "run", args.notebook]
    for name, value in args.parameters:
        words += ["-p", name, value]
    for flag in ("--output", "--budget", "--timeout", "--idle-timeout", *LIMIT_FLAGS):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            words += [flag, str(value)]
    words += [flag for flag in ("--detach", "--resume", "--json") if getattr(args, flag[2:])]
    return shlex.join(words)


def _check_installed() -> None:
    import importlib.util

    missing = [name for name in ("nbclient", "nbformat", "papermill")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"nbbudget run needs {', '.join(missing)}, which is not installed; "
                          f"pip install 'nbbudget[run]'")


def _timeout(value: str | None) -> int | None:
    if value is None:
        return None
    ms = flag_duration(value, "--timeout")
    if ms == 0:
        raise ConfigError("--timeout 0 would cancel the notebook at once; leave --timeout out "
                          "for no wall-clock limit")
    return ms


def _idle(value: str | None) -> int | None:
    """How long a paused run waits for the same command, in ms: ``--idle-timeout``, else
    `ENV_IDLE` (read now), else `DEFAULT_IDLE_MS`; None for 0 (no limit)."""
    if value is not None:
        return flag_duration(value, "--idle-timeout") or None
    env = os.environ.get(ENV_IDLE, "").strip()
    if not env:
        return DEFAULT_IDLE_MS
    if env.isdigit() and env.lstrip("0"):  # as on a flag, a number carries its unit
        raise ConfigError(f"{ENV_IDLE}={env} has no unit: write {ENV_IDLE}={env.lstrip('0')}s "
                          f"for seconds or {ENV_IDLE}={env.lstrip('0')}m for minutes (also ms, "
                          f"h); 0 for no limit")
    return parse_duration(env, field=ENV_IDLE) or None


def _runs_per_day(value: int | None) -> int | None:
    if value is not None and not 0 < value <= 1_000_000:
        raise ConfigError(f"--runs-per-day {value}: use a whole number from 1 to 1000000; leave "
                          f"--runs-per-day out for no quota")
    return value


def _notebook(path: str) -> tuple[Path, bytes]:
    notebook = Path(path).expanduser().resolve()
    try:
        return notebook, notebook.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no notebook at {path!r}; check the path") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the notebook {path!r} ({exc.strerror}); check the "
                          f"path and its permissions") from None


def _read(path: Path, data: bytes) -> dict[str, Any]:
    """The notebook's JSON, checked as far as running it needs: an nbformat 4 notebook whose
    cells each have a type and a source. (The runner reads it with nbformat; the command does
    not import nbformat, which takes seconds where jsonschema's format checkers are installed,
    and the call budget counts this command's own start.)"""
    try:
        nb = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{str(path)!r} is not a valid notebook (not JSON: {exc}); give the "
                          f"path of an .ipynb file") from None
    problem = _problem(nb)
    if problem is not None:
        raise ConfigError(f"{str(path)!r} is not a valid notebook ({problem}); give the path "
                          f"of an .ipynb file in nbformat 4")
    return dict(nb)


def _problem(nb: Any) -> str | None:
    if not isinstance(nb, dict) or nb.get("nbformat") != 4:
        return "not an nbformat 4 notebook"
    if not isinstance(nb.get("cells"), list) or not isinstance(nb.get("metadata", {}), dict):
        return "it has no list of cells and metadata"
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in _CELL_TYPES or \
                not isinstance(cell.get("source"), (str, list)):
            return f"cell {i} has no cell_type or no source"
    return None


def _metadata_limits(path: Path, nb: dict[str, Any]) -> Limits:
    declared = nb.get("metadata", {}).get("nbbudget", {}).get("limits")
    if declared is None:
        return Limits()
    try:
        return Limits.from_json(dict(declared))
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"metadata.nbbudget.limits of {path.name!r}: {exc}") from None


def _check_parameters(parameters: list[list[str]]) -> None:
    """A parameter's name is a name the notebook can use (where it goes, and whether the
    notebook defines it, the runner tells in the envelope's warnings, as papermill does)."""
    for name, _ in parameters:
        if not name.isidentifier():
            raise ConfigError(f"-p {name!r}: a parameter's name is a Python name such as "
                              f"alpha or n_rows")


def _output(notebook: Path, given: str | None) -> Path:
    output = Path(given).expanduser().resolve() if given else \
        notebook.with_name(notebook.name.removesuffix(".ipynb") + ".out.ipynb")
    if output == notebook:
        raise ConfigError(f"--output {given!r} is the notebook itself; save the executed "
                          f"notebook elsewhere, e.g. --output {notebook.stem}.out.ipynb")
    if not output.parent.is_dir():
        raise ConfigError(f"the folder of the output {str(output)!r} does not exist; create "
                          f"it or choose another path with --output")
    return output


# -- run --------------------------------------------------------------------------------------
def run_command(args: argparse.Namespace) -> int:
    """``nbbudget run``: the exit code (0 done, 14 INCOMPLETE, 2 bad usage, ...)."""
    started = time.monotonic()
    try:
        checked = plan(args)
        runs = Runs(store())
        budget_end = None if not checked.budget_ms else (
            time.time() + checked.budget_ms / 1000 - (time.monotonic() - started))
        claim = runs.claim(checked.identity, checked.spec, budget_end, checked.timeout_ms,
                           checked.idle_ms)
    except ConfigError as exc:  # bad input or settings, a damaged or locked store: nothing runs
        print(f"nbbudget run: {exc}", file=sys.stderr)
        return 2
    if claim.new:
        _start(runs, claim.record, checked)
    progress = Progress(sys.stderr) if _tty(sys.stderr) else None
    try:
        resp = _wait(runs, claim, checked, started, progress)
    except KeyboardInterrupt:  # a person stopped the command: stop the notebook with it
        resp = _stop(runs, claim.record, checked, started)
    finally:
        if progress is not None:
            progress.clear()
    if checked.json or not _tty(sys.stdout):
        print(resp.to_json())
    else:
        record = runs.get(claim.record.id)
        print(summary(resp, record.notebook_cells if record is not None else None))
    return resp.exit_code


def _start(runs: Runs, record: RunRecord, checked: Plan) -> None:
    """A new run: count it against its quota of runs per day (S4-12), then start its
    runner, a process of its own that never holds this command's streams."""
    if checked.runs_per_day is not None:
        try:
            take_run(runs.store, checked.identity, checked.spec["name"], checked.runs_per_day,
                     time.time())
        except RunsPerDayExceeded as exc:
            runs.finish(record.id, JobState.FAILED, {
                "exit_code": 1, "state": JobState.FAILED.value, "data": {"executed": 0},
                "error": {"code": exc.code, "message": str(exc)}})
            return
    env = dict(os.environ, NBBUDGET_HOME=str(runs.store.folder))
    with open(runs.log_path(record.id), "ab") as log:
        runner = subprocess.Popen(
            [sys.executable, "-m", RUNNER_MODULE, record.id], stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=checked.spec["cwd"],
            start_new_session=True)
    runs.update(record.id, pid=runner.pid)


def _wait(runs: Runs, claim: Claim, checked: Plan, started: float,
          progress: Progress | None) -> Response:
    """Hold the caller until the run ends, or its budget runs out (S0-1): a detached run then
    goes on; a resumable one is waited for until it pauses at the next cell boundary, unless
    its kernel is still starting (it will wait at its first cell)."""
    deadline = started + checked.budget_ms / 1000 if checked.budget_ms else None
    record, next_check = claim.record, 0.0
    while True:
        if record.state.final:
            return _ended(runs, record, checked, started)
        if record.state is JobState.PAUSED and record.paused_turn >= claim.turn:
            return _incomplete(record, checked, started)
        now = time.monotonic()
        if deadline is not None and now >= deadline and \
                (not checked.resume or record.state is JobState.STARTING):
            return _incomplete(record, checked, started)
        if progress is not None:
            progress.show(record)
        time.sleep(POLL_S)
        record = runs.get(record.id) or record
        if now >= next_check:
            record, next_check = runs.check(record), now + CHECK_S


def _stop(runs: Runs, record: RunRecord, checked: Plan, started: float) -> Response:
    """Ctrl-C: stop the run, and tell how it ended (stopped by Ctrl-C, as a rule). A second
    Ctrl-C, or a runner slow to stop it, leaves at once: the runner stops the run all the
    same, and the identical command tells how it ended."""
    runs.request_cancel(record.id, by="Ctrl-C")
    try:
        ended = await_end(runs, record)
    except KeyboardInterrupt:
        ended = runs.get(record.id) or record
    if ended.state.final:
        return _ended(runs, ended, checked, started)
    data = {"state": ended.state.value, "job": ended.id, "output": ended.output,
            "cell": ended.cell, "executed": ended.executed, "cells": ended.cells}
    error = {"code": "stopped", "message": (
        f"run {ended.id} was asked to stop by Ctrl-C at {ended.where} and has not stopped yet; "
        f"nbbudget jobs shows when it does, and the same command then tells how it ended; "
        f"the notebook as far as it got is in {ended.output}")}
    return _respond(ended, checked, started, EXIT_STOPPED, data, error)


def _ended(runs: Runs, record: RunRecord, checked: Plan, started: float) -> Response:
    """The run's end: delivered now, so the next identical command starts anew (S0-11)."""
    runs.deliver(record.id)
    result = record.result or record.lost_result()
    data = {"state": result["state"], "job": record.id, "output": record.output,
            **result["data"]}
    return _respond(record, checked, started, result["exit_code"], data, result["error"])


def _incomplete(record: RunRecord, checked: Plan, started: float) -> Response:
    """INCOMPLETE (S0-12): the run goes on (``running``) or waits (``paused``, or ``starting``:
    a resumable run whose kernel is starting); the identical command continues it."""
    state = record.state
    if state is JobState.STARTING and not checked.resume:
        state = JobState.RUNNING  # a detached run goes on, its kernel started or not (S0-12)
    cell = None if record.state is JobState.STARTING else record.cell  # none runs yet
    data: dict[str, Any] = {
        "state": state.value, "job": record.id, "output": record.output, "cell": cell,
        "executed": record.executed, "cells": record.cells, "next": checked.command}
    if record.state is JobState.PAUSED:
        data["checkpoint"] = f"{record.id}:{record.cell}"
    return _respond(record, checked, started, EXIT_INCOMPLETE, data, None)


def _respond(record: RunRecord, checked: Plan, started: float, exit_code: int,
             data: dict[str, Any], error: dict[str, Any] | None) -> Response:
    """The envelope, with what the runner warned about the notebook (once it has read it)."""
    return Response(exit_code == 0, data, error, list(record.warnings),
                    meta(exit_code, started, checked.budget_ms, checked.timeout_ms))


def _tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (ValueError, OSError):
        return False


# -- what a person reads ------------------------------------------------------------------------
class Progress:
    """The live progress line of a run in the foreground: the running cell (``cell 3 of 7``,
    counted from 1 in the executed notebook), elapsed, its first line; redrawn in place on a
    terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.shown = ""

    def show(self, record: RunRecord) -> None:
        elapsed = time.monotonic() - self.started
        if record.state is JobState.STARTING or record.cell is None:
            line = f"nbbudget: starting the kernel, {elapsed:.0f} s"
        else:
            line = f"nbbudget: {record.where}, {elapsed:.0f} s: {record.source or ''}"
        # a terminal that reports 0 columns (a new pty) gets the fallback, on Python 3.10 too
        columns = shutil.get_terminal_size((100, 24)).columns or 100
        width = columns - 1
        line = line[:width]
        if line != self.shown:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self.shown = line

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def summary(resp: Response, notebook_cells: int | None = None) -> str:
    """The envelope in a few words, for a person at a terminal; a cell is named as in every
    text, counted from 1 among the *notebook_cells* of the executed notebook."""
    data = resp.data or {}
    took = f"{resp.meta['duration_ms'] / 1000:.1f} s"
    warned = "".join(f"\n  warning: {warning}" for warning in resp.warnings)
    if resp.exit_code == EXIT_INCOMPLETE:
        where = None if data["cell"] is None else cell_named(data["cell"], notebook_cells)
        if data["state"] == "paused":
            how = f"paused before {where}"
        elif data["state"] == "starting":
            how = "is starting its kernel, then waits before its first cell"
        elif where is not None:
            how = f"goes on in the background at {where}"
        else:
            how = "goes on in the background, its kernel starting"
        return (f"INCOMPLETE (exit 14): {data['job']} {how} ({data['executed']} of "
                f"{data['cells']} code cells ran) after {took}; run the same command again:\n"
                f"  {data['next']}{warned}")
    consumed = ", ".join(f"{k} {v}" for k, v in (data.get("consumed") or {}).items())
    usage = f"\n  consumed: {consumed}" if consumed else ""
    if resp.ok:
        return (f"done: {data['executed']} of {data['cells']} code cells ran in {took}; the "
                f"executed notebook is {data['output']}{usage}{warned}")
    error = resp.error or {}
    return (f"{data.get('state')} ({error.get('code')}, exit {resp.exit_code}): "
            f"{error.get('message')}{usage}{warned}")


# -- jobs and cancel --------------------------------------------------------------------------
def jobs_command(args: argparse.Namespace) -> int:
    """``nbbudget jobs``: the store's notebook runs, as a table or as JSON."""
    runs = _open("jobs")
    if runs is None:
        return 2
    records = runs.all()
    if args.json:
        print(json.dumps([run_row(record) for record in records], indent=2))
    elif not records:
        print(f"no notebook runs in {runs.store.folder}")
    else:
        print(_jobs_table(records))
    return 0


def _jobs_table(records: list[RunRecord]) -> str:
    """``nbbudget jobs`` for a person: one line per run, with the cell it is at (``cell 3 of
    7``, as every text names a cell) and why it ended (its error's code), each column as wide
    as its widest value."""
    header = ("id", "state", "cell", "why", "started", "notebook")
    lines = [header]
    for record in records:
        row = run_row(record)
        lines.append((row["id"], row["state"], "-" if record.cell is None else record.where,
                      row["error"] or "-", row["started"], row["notebook"]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join([*(value.ljust(width) for value, width in zip(line, widths, strict=False)),
                   line[-1]])
        for line in lines)


def _open(command: str) -> Runs | None:
    """The runs of the store, or None (and one line on stderr) when it cannot be opened."""
    try:
        return Runs(store())
    except ConfigError as exc:
        print(f"nbbudget {command}: {exc}", file=sys.stderr)
        return None


def cancel_command(args: argparse.Namespace) -> int:
    """``nbbudget cancel ID``: stop a run, and say how it ended."""
    runs = _open("cancel")
    if runs is None:
        return 2
    record = runs.get(args.id)
    if record is None:
        print(f"nbbudget cancel: no run {args.id!r} in the store at {runs.store.folder}; "
              f"nbbudget jobs lists the runs", file=sys.stderr)
        return 2
    cancel = cancel_run(runs, record)
    print(cancel.message)
    return 1 if cancel.outcome == "requested" else 0
