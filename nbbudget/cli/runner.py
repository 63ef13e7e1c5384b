"""The runner of ``nbbudget run``: a process of its own (``python -m nbbudget.cli.runner RUN_ID``)
that owns the kernel, executes the notebook cell by cell with nbclient, saves it after every
cell, and reports to the run's row in the store (`nbbudget.calls.run_store`).

The executed notebook is what papermill would write, made with papermill's own functions: the
parameters injected after the cell tagged ``parameters`` (at the top, with a warning, when no
cell has that tag), the records of an earlier execution cleared (outputs, execution counts,
papermill's metadata and its error banners), each cell's start, end and status, the
``language_info`` of the kernel that ran it, and papermill's banners above a cell that failed.
A cell that ends with ``SystemExit`` 0 or ``None`` ends the notebook as papermill ends it: a
success, the cells after it not run. The file is written atomically, with the umask's mode, as
a user's own file.

It outlives the command that started it (S0-2): a ``--detach`` run goes on to its end; a
``--resume`` run pauses at the first cell boundary past its caller's budget, keeps the kernel
and its state, and continues when the identical command gives it a new turn. A paused run that
no command continues within its idle time (``--idle-timeout``, 1 h unless set) ends: its kernel
is shut down, the notebook as far as it got stays saved, and the run is ``cancelled`` with the
error ``idle_timeout``, which the identical command then reports. Between cells and
while a cell runs it watches for ``nbbudget cancel`` or a SIGTERM, SIGINT or SIGHUP sent to it
(the run ends ``stopped``), the wall-clock limit counted from the first start (``cancelled``,
S0-6) and the run's time grant; each interrupts the running cell, and a cell that ignores the
interrupt for `INTERRUPT_GRACE_S` loses its kernel.

Whatever happens, the runner writes how the run ended before it exits, so no command waits
for it in vain; a runner killed outright is found ``lost`` by the next command.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import signal
import sys
import time
import traceback
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..calls.history import record_notebook
from ..calls.jobs import JobState
from ..calls.run_store import RunRecord, Runs, cell_named
from ..calls.store import store
from ..core.duration import spoken
from ..core.endings import ENDINGS
from ..core.files import atomic_write
from ..core.outcome import Status
from ..jupyter.kernel_run import IN_PLACE

if TYPE_CHECKING:
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbformat import NotebookNode
    from papermill.engines import NotebookExecutionManager

__all__ = ["main"]

POLL_S = 0.1  # how often the runner reads its row while a cell runs or while it is paused
INTERRUPT_GRACE_S = 5.0  # how long an interrupted cell may take to end before its kernel dies
TIME_GRACE_S = 0.1  # the run's own timer fires first; the interrupt follows this much later
#: the signals that stop the run as ``nbbudget cancel`` does (nbclient's own handlers would shut
#: the kernel down and leave the runner waiting, a paused run for ever)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: the state of a run that ended with each status, in the words of ``nb.jobs``
_JOB_STATE = {Status.COMPLETED: JobState.DONE, Status.FAILED: JobState.FAILED,
              Status.STOPPED: JobState.CANCELLED, Status.CANCELLED: JobState.CANCELLED}
#: the mode of the executed notebook before the umask, as ``open()`` makes a file
NOTEBOOK_MODE = 0o666


class _End(Exception):
    """Ends the execution: how (*status*: `completed`, `failed`, `stopped` by ``nbbudget
    cancel``, `cancelled` by ``--timeout``), why (*error*) and where (*data*)."""

    def __init__(self, status: Status, error: dict[str, Any] | None = None,
                 **data: Any) -> None:
        super().__init__(status.value)
        self.status = status
        self.error = error
        self.data = data

    @property
    def state(self) -> JobState:
        """The run's state once it has ended so."""
        return _JOB_STATE[self.status]

    def result(self, data: dict[str, Any]) -> dict[str, Any]:
        """What the command answers: the exit code and the envelope's ``state`` of this ending
        (``stopped`` and ``cancelled`` told apart, as a call's envelope tells them), *data*
        and the error."""
        ending = ENDINGS[self.status]
        return {"exit_code": ending.exit_code, "state": ending.envelope or self.state.value,
                "data": {**data, **self.data}, "error": self.error}


async def _ending(work: Awaitable[_End]) -> _End:
    """How *work* ended, whether it returned its end or raised it."""
    try:
        return await work
    except _End as end:
        return end


def parameter_value(text: str) -> Any:
    """A ``-p NAME VALUE`` value as papermill's command line reads it: ``True``, ``False`` and
    ``None`` are those constants, a number is an `int` or else a `float`, anything else stays
    the text it was."""
    constants: dict[str, Any] = {"True": True, "False": False, "None": None}
    if text in constants:
        return constants[text]
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **extra}


class Runner:
    """Executes one notebook run, from its row in the store to its end."""

    def __init__(self, runs: Runs, record: RunRecord) -> None:
        self.runs = runs
        self.id = record.id
        self.spec = record.spec
        self.turn = record.turn
        self.ran_this_turn = 0  # cells run since the last continuation
        self.executed = 0
        self.code_cells: list[int] = []
        self.total: int | None = None  # the cells of the executed notebook, every type
        self.index: int | None = None  # the cell that runs, or ran last
        self.warnings: list[str] = []
        self.client: NotebookClient | None = None
        self.manager: NotebookExecutionManager | None = None  # papermill's records of the cells
        self.consumed: dict[str, Any] | None = None
        self.signalled: str | None = None  # the name of a stop signal received
        self.recorded = False  # whether the run is in the store's history

    async def run(self) -> None:
        """Execute the notebook and record how it ended, whatever happens."""
        self._catch_stop_signals()
        try:
            end = await _ending(self._execute())
        except Exception as exc:  # noqa: BLE001  (a bug or the environment: reported, never silent)
            traceback.print_exc()
            end = _End(Status.FAILED, _error(
                "runner_error", f"the runner of {self.id} failed: {type(exc).__name__}: {exc}; "
                                f"its log is {self.runs.log_path(self.id)}"))
        self._finish(end)

    def _catch_stop_signals(self) -> None:
        """A stop signal asks the run to stop, as ``nbbudget cancel`` does: the running cell is
        interrupted, or the paused run ends, and the kernel is shut down. Installed when the
        runner starts and again once nbclient has put its own handlers in."""
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self._signal, signum)

    def _signal(self, signum: int) -> None:
        self.signalled = signal.Signals(signum).name

    def _finish(self, end: _End) -> None:
        """Record how the run ended (once: a run that has ended keeps its first end), and keep
        the run in the store's history (`nbbudget.calls.history`)."""
        self.runs.finish(self.id, end.state, self._result(end))
        if self.recorded:
            return
        self.recorded = True
        record = self.runs.get(self.id)
        record_notebook(self.runs.store, self.spec["notebook"],
                        record.created if record is not None else time.time(),
                        end.status.value, end.error, self.spec["limits"], self.consumed)

    def _result(self, end: _End) -> dict[str, Any]:
        data: dict[str, Any] = {"executed": self.executed, "cells": len(self.code_cells)}
        if self.consumed is not None:
            data["consumed"] = self.consumed
        return end.result(data)

    async def _execute(self) -> _End:
        """Launch the kernel first: it starts while nbclient and papermill are imported and
        the notebook is prepared (the caller's budget counts the kernel's start-up)."""
        km = await self._launch()
        try:
            return await self._execute_in(km)
        finally:
            if km.has_kernel:  # the notebook never reached its kernel
                await km.shutdown_kernel(now=True)

    async def _launch(self) -> AsyncKernelManager:
        from jupyter_client.manager import AsyncKernelManager

        km = AsyncKernelManager(kernel_name=self.spec["kernel"])
        try:
            extra = ["--HistoryManager.hist_file=:memory:"] if km.ipykernel else []
            await km.start_kernel(cwd=self.spec["cwd"], extra_arguments=extra)
        except Exception as exc:  # noqa: BLE001  (whatever stops the kernel: the run's error)
            raise _End(Status.FAILED, _error(
                "kernel_failed", f"the kernel {self.spec['kernel']!r} did not start: "
                                 f"{type(exc).__name__}: {exc}")) from None
        return km

    async def _execute_in(self, km: AsyncKernelManager) -> _End:
        from nbclient import NotebookClient

        notebook, self.warnings = self._prepare()
        self.code_cells = [i for i, cell in enumerate(notebook.cells)
                           if cell.cell_type == "code"]
        self.total = len(notebook.cells)
        self.runs.update(self.id, cells=len(self.code_cells), notebook_cells=self.total,
                         cell=self.code_cells[0] if self.code_cells else None,
                         warnings=json.dumps(self.warnings))
        client = self.client = NotebookClient(
            notebook, km=km, resources={"metadata": {"path": self.spec["cwd"]}})
        self._save()
        ready = False
        try:
            async with client.async_setup_kernel(cleanup_kc=True):  # shuts the kernel down
                ready = True  # the kernel has answered: the run is no longer starting
                self._catch_stop_signals()
                self.runs.update(self.id, state=JobState.RUNNING.value)
                await self._language_info()
                end = await _ending(self._cells())
                self._complete()
                self._finish(end)  # told before the kernel shuts down, which takes a while
                return end
        except Exception as exc:
            if ready:
                raise
            raise _End(Status.FAILED, _error(
                "kernel_failed", f"the kernel {self.spec['kernel']!r} started but never "
                                 f"answered: {type(exc).__name__}: {exc}")) from None

    async def _cells(self) -> _End:
        await self._begin()
        for index in self.code_cells:
            remaining_ms = await self._boundary(index)
            exited = await self._cell(index, remaining_ms)
            self.executed += 1
            self.ran_this_turn += 1
            if exited:  # papermill's success: the cells after it are not run
                break
        status = await self._status()
        if status["stop"] is not None:  # the last cell spent the run's budget without failing
            raise self._budget_stop(status["stop"])
        assert self.client is not None
        self.client.set_widgets_metadata()
        return _End(Status.COMPLETED)

    # -- the notebook ---------------------------------------------------------------------------
    def _prepare(self) -> tuple[NotebookNode, list[str]]:
        """The notebook as the command read it (the same bytes), made ready as papermill makes
        it: its parameters injected, the records and the error banners of an earlier execution
        cleared, its start recorded; and what to warn about its parameters."""
        from papermill.engines import NotebookExecutionManager
        from papermill.execute import prepare_notebook_metadata, remove_error_markers
        from papermill.iorw import load_notebook_node
        from papermill.parameterize import parameterize_notebook

        path = self.spec["notebook"]
        if hashlib.sha256(Path(path).read_bytes()).hexdigest() != self.spec["sha256"]:
            raise _End(Status.FAILED, _error(
                "notebook_changed", f"{path} changed after the command read it; run the "
                                    f"command again to execute the notebook as it is now"))
        notebook: NotebookNode = load_notebook_node(path)
        parameters = {name: parameter_value(value) for name, value in self.spec["parameters"]}
        warnings = self._parameter_warnings(notebook, list(parameters))
        if parameters:
            notebook = parameterize_notebook(notebook, parameters,
                                             kernel_name=self.spec["kernel"],
                                             language=self.spec["language"])
        notebook = prepare_notebook_metadata(notebook, path, self.spec["output"])
        notebook = remove_error_markers(notebook)
        self.manager = NotebookExecutionManager(notebook, output_path=None, progress_bar=False)
        self.manager.notebook_start()  # (with no output path, papermill writes nothing)
        return notebook, warnings

    def _parameter_warnings(self, notebook: NotebookNode, names: list[str]) -> list[str]:
        """What papermill warns about when it injects *names*: a notebook with no cell tagged
        ``parameters`` (they go at the top), and a name that cell does not define."""
        from papermill.translators import papermill_translators
        from papermill.utils import find_first_tagged_cell_index

        if not names:
            return []
        where = find_first_tagged_cell_index(notebook, "parameters")
        if where < 0:
            return [f"{self.spec['name']!r} has no cell tagged 'parameters': -p "
                    f"{', '.join(names)} went into a cell at its top, as papermill does; tag "
                    f"the cell that sets the defaults 'parameters' to inject them after it"]
        translator = papermill_translators.find_translator(self.spec["kernel"],
                                                           self.spec["language"])
        try:
            defined = {parameter.name for parameter in translator.inspect(notebook.cells[where])}
        except NotImplementedError:  # papermill cannot read this language's parameters
            return []
        return [f"-p {name}: the cell tagged 'parameters' of {self.spec['name']!r} does not "
                f"define {name}; it was injected all the same; check its name"
                for name in names if name not in defined]

    async def _language_info(self) -> None:
        """Record the ``language_info`` the kernel that runs the notebook gives, as papermill
        and nbclient do (the notebook's own may name another version, or be missing)."""
        from jupyter_core.utils import ensure_async

        assert self.client is not None and self.client.kc is not None
        msg_id = await ensure_async(self.client.kc.kernel_info())
        reply = await self.client.async_wait_for_reply(msg_id)
        info = (reply or {}).get("content", {}).get("language_info")
        if info is not None:
            self.client.nb.metadata["language_info"] = info

    def _save(self) -> None:
        """Write the notebook as far as it ran to the output: atomically, and with the umask's
        mode, as papermill writes it (it is the user's file, not the store's)."""
        import nbformat

        assert self.client is not None
        atomic_write(self.spec["output"], nbformat.writes(self.client.nb).encode(),
                     overwrite=True, mode=NOTEBOOK_MODE)

    def _complete(self) -> None:
        """Save the notebook as it ended: after its last cell, with its end recorded as
        papermill records it (a cell that raised has recorded it already). A notebook stopped
        between cells keeps the cells it never ran ``pending``."""
        assert self.manager is not None
        if self.manager.end_time is None and self.executed == len(self.code_cells):
            self.manager.notebook_complete()
        self._save()

    def _mark_failure(self) -> bool:
        """Judge the cells' errors as papermill does when its execution ends: a cell that ended
        with ``SystemExit`` 0 or ``None`` is no failure; any other error is one, and papermill's
        banners go at the top of the notebook and just above that cell. Whether one failed."""
        from papermill.exceptions import PapermillExecutionError
        from papermill.execute import raise_for_execution_errors

        assert self.client is not None
        try:  # with no output path papermill writes nothing: the banners go into the notebook
            raise_for_execution_errors(self.client.nb, None)  # (an nbformat 4 one: in place)
        except PapermillExecutionError:
            return True
        return False

    # -- the kernel's side (nbbudget.jupyter.kernel_run) ----------------------------------------
    async def _call(self, function: str, *args: str) -> Any:
        """Call a function of `nbbudget.jupyter.kernel_run` in the kernel, silently (no cell events,
        no history); its value, read back from its repr."""
        assert self.client is not None and self.client.kc is not None
        call = f"__import__('nbbudget.jupyter.kernel_run', fromlist=['_']).{function}" \
               f"({', '.join(map(repr, args))})"
        msg_id = self.client.kc.execute("", silent=True, store_history=False,
                                        user_expressions={"value": call})
        reply = await self.client.async_wait_for_reply(msg_id)
        assert reply is not None  # no timeout is set: the reply comes or the kernel died
        value = reply["content"].get("user_expressions", {}).get("value", {})
        if value.get("status") != "ok":
            raise _End(Status.FAILED, _error(
                "kernel_failed", f"the kernel could not run nbbudget "
                                 f"({value.get('ename')}: {value.get('evalue')}); install "
                                 f"nbbudget where the kernel {self.spec['kernel']!r} runs"))
        return ast.literal_eval(value["data"]["text/plain"])

    async def _begin(self) -> None:
        """nbbudget loaded in the kernel, and the notebook's run that every cell shares."""
        await self._call("begin", json.dumps(self.spec["limits"]), self.spec["name"])

    async def _status(self) -> dict[str, Any]:
        status: dict[str, Any] = json.loads(await self._call("status"))
        self.consumed = status["consumed"]
        if status["in_place"] and self.index is not None:
            self._warn_in_place(self.index, status["in_place"])
        return status

    def _warn_in_place(self, index: int, lines: list[str]) -> None:
        """The cell *index* declared ``--detach`` or ``--resume`` and ran to its end in place
        (`nbbudget.jupyter.kernel_run`): the envelope's warnings say so, once (IPython may
        read a cell's line more than once as it runs it)."""
        for line in dict.fromkeys(lines):
            warning = (f"{self._named(index)} ({line}) ran to its end in place, as {IN_PLACE} "
                       f"makes it: inside nbbudget run the notebook is what detaches or pauses, "
                       f"not a cell; give --detach or --resume and --budget to nbbudget run "
                       f"instead")
            if warning not in self.warnings:
                self.warnings.append(warning)
        self.runs.update(self.id, warnings=json.dumps(self.warnings))

    def _named(self, index: int) -> str:
        return cell_named(index, self.total)

    # -- between cells -------------------------------------------------------------------------
    async def _boundary(self, index: int) -> float | None:
        """Before cell *index*: end when asked to or when the run's budget stopped it; pause
        when the caller's budget has run out (``--resume``). The run's time left, in ms."""
        record = self._record()
        self._end_if_asked(record, index)
        status = await self._status()
        if status["stop"] is not None:
            raise self._budget_stop(status["stop"], cell=index)
        if self._pause_due(record):
            await self._pause(record, index)
        remaining: float | None = status["remaining_ms"]
        return remaining

    def _record(self) -> RunRecord:
        record = self.runs.get(self.id)
        assert record is not None  # nobody deletes an unfinished run
        return record

    def _end_if_asked(self, record: RunRecord, index: int) -> None:
        """``nbbudget cancel``, Ctrl-C on the command or a stop signal (stopped), or the wall
        clock since the first start (cancelled)."""
        by = self.signalled
        if by is None and record.cancel:
            by = record.cancel_by or "nbbudget cancel"
        if by is not None:
            raise _End(Status.STOPPED, _error(
                "stopped", f"run {self.id} was stopped by {by} at {self._named(index)}; the "
                           f"notebook as far as it got is in {self.spec['output']}"),
                cell=index)
        if record.timeout_ms is not None and \
                (time.time() - record.created) * 1000 >= record.timeout_ms:
            raise _End(Status.CANCELLED, _error(
                "cancelled", f"run {self.id} was cancelled at {self._named(index)}: its "
                             f"wall-clock limit of {record.timeout_ms} ms, counted from its "
                             f"first start across every continuation, ran out (see: nbbudget "
                             f"explain S0-6); the notebook as far as it got is in "
                             f"{self.spec['output']}"), cell=index)

    def _pause_due(self, record: RunRecord) -> bool:
        """S0-1: a --resume run pauses at the first boundary past its caller's budget; a
        continuation runs at least one cell first, so every turn makes progress."""
        if self.spec["mode"] != "resume" or record.deadline is None:
            return False
        return time.time() >= record.deadline and (self.turn == 1 or self.ran_this_turn > 0)

    async def _pause(self, record: RunRecord, index: int) -> None:
        """Wait at this boundary, the kernel kept, until the identical command continues, or
        the run's idle time runs out."""
        await self._call("pause")
        self._save()
        paused_turn, paused_at = record.turn, time.monotonic()
        self.runs.update(self.id, state=JobState.PAUSED.value, paused_turn=paused_turn,
                         cell=index, executed=self.executed, source=None)
        while record.turn <= paused_turn:
            await asyncio.sleep(POLL_S)
            record = self._record()
            self._end_if_asked(record, index)
            self._end_if_idle(record, index, paused_turn, time.monotonic() - paused_at)
        self.turn, self.ran_this_turn = record.turn, 0
        await self._call("unpause")
        self.runs.update(self.id, state=JobState.RUNNING.value)

    def _end_if_idle(self, record: RunRecord, index: int, turn: int, idle_s: float) -> None:
        """End the run paused in *turn* for *idle_s* when that reaches its idle time and no
        command has continued it meanwhile (the end is recorded only if so, in one
        transaction); the notebook stays saved as it paused."""
        if record.idle_ms is None or record.turn > turn or idle_s * 1000 < record.idle_ms:
            return
        idle = spoken(record.idle_ms)
        end = _End(Status.CANCELLED, _error(
            "idle_timeout", f"run {self.id} ended after {idle} paused before "
                            f"{self._named(index)} with no command continuing it (its idle "
                            f"time, --idle-timeout or NBBUDGET_IDLE_TIMEOUT); its kernel was "
                            f"shut down and the notebook as far as it got is in "
                            f"{self.spec['output']}. Run the same command again to start the "
                            f"notebook over from its first cell, with a longer --idle-timeout "
                            f"(0: no limit) if its caller may take longer than {idle} to come "
                            f"back"), cell=index)
        if self.runs.finish_paused(self.id, turn, end.state, self._result(end)):
            raise end

    # -- one cell -----------------------------------------------------------------------------
    async def _cell(self, index: int, remaining_ms: float | None) -> bool:
        """Execute cell *index*, interrupting it when asked to stop or when the run's time
        grant is spent; its start, end and status recorded as papermill records them. Whether
        it ended the notebook with ``SystemExit`` 0 or ``None``, which papermill counts a
        success."""
        from nbclient.exceptions import CellExecutionError, DeadKernelError

        client, manager = self.client, self.manager
        assert client is not None and manager is not None
        cell = client.nb.cells[index]
        self.index = index
        self.runs.update(self.id, cell=index, executed=self.executed,
                         source=_first_line(cell.source))
        manager.cell_start(cell, index)
        task = asyncio.ensure_future(client.async_execute_cell(
            cell, index, execution_count=client.code_cells_executed + 1))
        time_up = None if remaining_ms is None else \
            time.monotonic() + remaining_ms / 1000 + TIME_GRACE_S
        asked = await self._watch(task, index, time_up)
        raised: CellExecutionError | DeadKernelError | None = None
        try:
            task.result()
        except (CellExecutionError, DeadKernelError) as exc:
            manager.cell_exception(cell, cell_index=index)
            raised = exc
        manager.cell_complete(cell, cell_index=index)
        if raised is not None:  # the notebook ends at this cell, as papermill's execution does
            manager.notebook_complete()
        failed = isinstance(raised, CellExecutionError) and self._mark_failure()
        self._save()  # the cell's outputs and records, whatever its end
        if asked is not None:
            raise asked
        if isinstance(raised, DeadKernelError):
            raise _End(Status.FAILED, _error(
                "kernel_died", f"the kernel died while it ran {self._named(index)}; the "
                               f"notebook as far as it got is in {self.spec['output']}",
                cell_index=index))
        if failed:
            raise await self._cell_failure(index, raised)
        return raised is not None

    async def _watch(self, task: asyncio.Future[Any], index: int,
                     time_up: float | None) -> _End | None:
        """Wait for the cell; interrupt it when the run is stopped or cancelled (that end is
        returned) or out of time; kill the kernel when an interrupt is ignored too long."""
        from jupyter_core.utils import ensure_async

        client = self.client
        assert client is not None and client.km is not None
        asked: _End | None = None
        interrupted: float | None = None
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            if task.done():
                break
            if asked is None:
                try:
                    self._end_if_asked(self._record(), index)
                except _End as end:
                    asked = end
            now = time.monotonic()
            if interrupted is None and (asked is not None or (time_up and now >= time_up)):
                interrupted = now
                await ensure_async(client.km.interrupt_kernel())
            elif interrupted is not None and now - interrupted > INTERRUPT_GRACE_S:
                await ensure_async(client.km.shutdown_kernel(now=True))
                break
        if not task.done():
            await asyncio.wait({task})
        return asked

    async def _cell_failure(self, index: int, exc: Any) -> _End:
        """A cell raised: a budget stop when the run's budget ended it, else a cell error."""
        where = {"cell_index": index, "ename": exc.ename, "evalue": exc.evalue}
        status = await self._status()
        if status["error"] is not None:  # the budget error the cell ended with
            error = status["error"]
            where.update(ename=error["ename"], evalue=error["message"])
            return self._budget_stop(error, **where)
        if status["stop"] is not None:  # interrupted as the run's time ran out
            return self._budget_stop(status["stop"], **where)
        return _End(Status.FAILED, _error(
            "cell_error", f"{self._named(index)} raised {exc.ename}: {exc.evalue}; the notebook "
                          f"as far as it got is in {self.spec['output']}", **where))

    def _budget_stop(self, stop: dict[str, Any], **where: Any) -> _End:
        """The run's budget ended the notebook: the error names the limit (S3-2)."""
        return _End(Status.FAILED, _error(stop["code"], stop["message"], **where))


def _first_line(source: str) -> str:
    """What the progress line shows of a cell: its first line of code."""
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()[:80]
    return ""


def main(argv: list[str] | None = None) -> int:
    """``python -m nbbudget.cli.runner RUN_ID``: execute the run *RUN_ID* of the store in
    ``NBBUDGET_HOME``."""
    args = sys.argv[1:] if argv is None else argv
    runs = Runs(store())
    record = runs.get(args[0]) if args else None
    if record is None:
        print(f"nbbudget runner: no run {args[:1]} in {runs.store.path}", file=sys.stderr)
        return 2
    asyncio.run(Runner(runs, record).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
