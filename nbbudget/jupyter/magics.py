"""The IPython layer: ``%%budget`` and ``%budget``, the ``NBBudget`` settings, and interactive
detection in the kernel.

Loaded by ``%load_ext nbbudget``; nothing here is imported by ``import nbbudget``. The core owns
every piece of state; this layer only reads it and shows it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import shlex
import sys
import tokenize
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import Bool, Dict, Int, List, Unicode
from traitlets.config import Configurable

from ..calls import call as _call
from ..calls import history as _history
from ..calls import interactive as _interactive
from ..calls import store as _store
from ..calls.background import cancel_job
from ..calls.jobs import Job
from ..calls.response import EXIT_INCOMPLETE, Response
from ..calls.runner import jobs
from ..core import streams
from ..core.duration import spoken
from ..core.endings import ENDINGS, OUT_OF_TIME, envelope_code
from ..core.errors import BudgetCut, ConfigError, show
from ..core.files import check_target
from ..core.limits import NO_LIMITS as _NO_LIMITS
from ..core.limits import (
    Limits,
    Manifest,
    budget_flags,
    limits_from_flags,
    negative_values_joined,
)
from ..run.budget import Budget, Grant, check_notices, current, settle_escaped
from .cells import (
    CompiledCell,
    awaited_cells,
    compile_cell,
    keep_output,
    pin_output,
)
from .clicks import Clicks
from .panel import Panel, run_summary
from .status import Status

__all__ = ["BudgetMagics", "NBBudget", "load", "unload"]


class NBBudget(Configurable):
    """nbbudget's settings: ``%config NBBudget.default_budget_ms = 10000``, or
    ``c.NBBudget.default_budget_ms = 10000`` in ``ipython_config.py``."""

    default_budget_ms = Int(
        None, allow_none=True,
        help="The call budget, in ms, of a call that declares detach or resume, run by a "
             "program, when it gives no budget; AGENT_CALL_BUDGET_MS still comes first. None: "
             "30000.",
    ).tag(config=True)
    limits = Dict(
        {}, help="Default run limits of every %%budget cell, as in --run-limits-json, e.g. "
                 "{'max_steps': 1000}. A cell's own flags may restrict them, never widen them.",
    ).tag(config=True)
    home = Unicode(
        "", help="The store's folder when NBBUDGET_HOME is not set (empty: nbbudget in "
                 "Jupyter's data directory).",
    ).tag(config=True)
    widget = Bool(True, help="Show the live panel under each %%budget cell (a text summary "
                             "stands in where widgets cannot render).").tag(config=True)
    update_interval_ms = Int(
        100, help="How often the panel redraws, in ms; at least 100 (ten times a second)."
    ).tag(config=True)
    status_interval_ms = Int(
        500, help="How often, at most, the status comm (nbbudget.status) tells a front end "
                  "such as JupyterLab's status bar how the running %%budget cell stands, in "
                  "ms, from 100 to 60000, when the front end asks for no interval of its own."
    ).tag(config=True)
    approach_notice = List(
        [0.8, 0.95], allow_none=True,
        help="The two approach-notice thresholds of a cell's run, each in (0, 1], first <= "
             "second: the panel turns amber, then red, and the run's notice level rises. None "
             "turns them off (see: nbbudget explain S3-5).",
    ).tag(config=True)
    cluster = Unicode(
        None, allow_none=True,
        help="The Dask scheduler (an address such as 'tcp://host:8786') whose ledger keeps the "
             "counters of every %%budget cell's run, and whose workers run its branches "
             "(run.map, run.parallel) and the work of nb.call (a detached job survives the "
             "kernel); pip install 'nbbudget[dask]'. None: this kernel.",
    ).tag(config=True)
    history = Bool(
        True, help="Keep each run that ends in this kernel (%%budget cells, nb.call, with "
                   "nb.budget() blocks) in the store's history (%budget history, nbbudget "
                   "history); NBBUDGET_HISTORY=1|0 overrides this.",
    ).tag(config=True)
    instrument = Bool(
        True, help="True: bound every model call this kernel makes by the run current when "
                   "it is made (nb.instrument(): the OpenAI, Anthropic, Gemini, Mistral, Groq "
                   "and Ollama APIs at any base URL, through any library on httpx2, httpx or "
                   "aiohttp, and Bedrock's Converse API through boto3; a model call the "
                   "LangChain, Agents SDK or pydantic-ai adapter counts is counted by it "
                   "alone). False: only the clients given to nb.instrument(client).",
    ).tag(config=True)
    interactive = Bool(
        None, allow_none=True,
        help="True: treat every execution as a person's (no default budget); False: as a "
             "program's; None: detect it from the request (a person's front end sends a "
             "cellId and allows stdin). NBBUDGET_INTERACTIVE=1|0 overrides this.",
    ).tag(config=True)

    def notices(self) -> tuple[float, float] | None:
        """The configured approach-notice thresholds, checked."""
        value: Any = self.approach_notice  # a traitlets List, None allowed
        if value is None:
            return None
        try:
            return check_notices(tuple(value))
        except ConfigError as exc:
            raise UsageError(f"NBBudget.approach_notice: {exc}") from None

    def default_limits(self) -> Limits:
        """The configured limits, checked (a bad entry is a UsageError naming it)."""
        if not self.limits:
            return _NO_LIMITS
        try:
            return Limits.from_json(self.limits)
        except ConfigError as exc:
            raise UsageError(f"NBBudget.limits: {exc}") from None


def _kernel_request(shell: Any) -> dict[str, Any] | None:
    """The execute request being run, when the shell belongs to a kernel."""
    get_parent = getattr(shell, "get_parent", None)
    if get_parent is None:
        kernel = getattr(shell, "kernel", None)
        get_parent = getattr(kernel, "get_parent", None)
    if get_parent is None:
        return None
    try:
        parent = get_parent()
    except Exception:  # noqa: BLE001  (an older kernel without a current request: no opinion)
        return None
    return parent if isinstance(parent, dict) and parent else None


def make_detector(shell: Any, config: NBBudget) -> Any:
    """N-1 after the environment: the traitlets setting, then the request itself."""

    def detect() -> bool | None:
        if config.interactive is not None:
            return bool(config.interactive)
        request = _kernel_request(shell)
        if request is None:
            return None  # not in a kernel: the core asks the terminal
        content = request.get("content") or {}
        metadata = request.get("metadata") or {}
        return bool(content.get("allow_stdin", False)) and "cellId" in metadata

    return detect


MIME = "application/vnd.nbbudget.response+json"


def _budget_flags(magic: Any) -> Any:
    """Declare on *magic* the flags that bound a run, from the one table `nbbudget run` reads
    too (in their order: IPython builds the parser from the last declared first)."""
    for flag, options in reversed(budget_flags()):
        magic = argument(flag, **options)(magic)
    return magic


class Incomplete(Exception):
    """How a non-interactive driver sees an INCOMPLETE cell: an error whose value is the one
    line that says how to continue, so batch runs stop before cells that need its result."""

    def _render_traceback_(self) -> list[str]:
        return [f"Incomplete: {self}"]


class CallFailed(Exception):
    """How a cell ends when its call failed and its work raised nothing: a refused checkpoint,
    for one. One line, the response's error message; ``code`` is the response's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def _render_traceback_(self) -> list[str]:
        return [f"CallFailed: {self}"]


#: the documented error of a failed response whose work raised nothing, by the response's code:
#: ``cancelled`` when the wall clock fired (S4-7) or had run out before a continuation
_FAILURES: dict[str, type[Exception]] = {
    e.envelope: e.error for e in ENDINGS.values() if e.envelope and e.error}


def _failure(resp: Response) -> BaseException:
    """What a failed response ends its cell with: the work's own error, with its traceback, or
    the error that refused the call before it started (a refused checkpoint, a damaged store, a
    spent quota); else the documented error of the response's code; else `CallFailed`."""
    error: BaseException | None = resp.job.exception() if resp.job is not None else None
    if error is None:
        error = resp.refusal
    if error is not None:
        return error
    failed = resp.error or {}
    code = failed.get("code", "failed")
    message = failed.get("message", "the cell did not finish")
    known = _FAILURES.get(code)
    return known(message) if known is not None else CallFailed(code, message)


@magics_class
class BudgetMagics(Magics):
    """``%%budget``: run a cell under a budget; ``%budget``: the jobs of this kernel."""

    def __init__(self, shell: Any, config: NBBudget) -> None:
        super().__init__(shell)
        self.settings = config
        self.last_panel: Panel | None = None  # the panel of the last cell, if it had one
        self.last_run: Budget | None = None  # the run of the last cell
        self.clicks = Clicks(shell)  # where the clicks on the panels are handled
        self.status = Status(shell, lambda: config.status_interval_ms, self.clicks.route)
        self._lines: dict[tuple[Any, ...], _Line] = {}  # cell lines read, by line and settings

    @no_var_expand  # the line is expanded here, only where it holds something to expand
    @magic_arguments("%budget")  # IPython adds a % for a cell magic: shown as %%budget
    @argument("--budget", metavar="DUR",
              help="the call budget: how long the cell may hold you (needs --detach or "
                   "--resume), e.g. --budget 2s; 0 turns it off")
    @argument("--detach", action="store_true",
              help="when the budget runs out, the work goes on as a background job")
    @argument("--resume", action="store_true",
              help="when the budget runs out, the work stops at its next nb.checkpoint(state); "
                   "running the same cell again continues from there")
    @argument("--key", metavar="NAME",
              help="name the work (instead of the cell's source and flags), to continue it "
                   "from another cell")
    @argument("--timeout", metavar="DUR",
              help="wall-clock limit of the whole work, across every continuation")
    @_budget_flags  # --time, one per kind, --run-limits-json, --manifest, --runs-per-day
    @argument("--trace", metavar="PATH", help="save the run's trace to PATH")
    @argument("--no-widget", action="store_true", help="show a text summary only")
    @argument("--cooperative", action="store_true",
              help="stop the cell only at its budget checks (nb.current().step(), .check()), "
                   "never in the middle of its code: for code that must not be interrupted "
                   "mid-way; by default --time, Stop and a cancel interrupt it (a sleep or a "
                   "read at once, Python at its next bytecode)")
    @cell_magic("budget")  # type: ignore[arg-type]  # IPython's decorator is loosely typed
    def budget_cell(self, line: str, cell: str) -> Any:
        """Run the cell under a budget; ``nb.current()`` is the cell's run.

        A spent limit stops the cell with a one-line error. With ``--detach`` or ``--resume``
        the cell holds you at most its call budget (``--budget``, else AGENT_CALL_BUDGET_MS, else
        30 s; a person at a notebook gets none by default), then answers INCOMPLETE while the
        work goes on in the background or waits at its next checkpoint. Limits from several
        sources combine by minimum, and a later source may not widen an earlier one: the
        manifest, then --run-limits-json, then the flags.

        Examples::

            %%budget --steps 1000 --time 30s
            for row in rows:
                nb.current().step()

            %%budget --detach --budget 2s
            model = train()                     # goes on in the background after 2 s

            %%budget --resume --budget 2s
            done = nb.resume_state(0)
            for i in range(done, 100):
                work(i)
                nb.checkpoint(i + 1)            # pauses here once the 2 s are spent
        """
        if "$" in line or "{" in line or "}" in line:
            line = _expanded(self.shell, line)
        args, limits, ceilings, notices = self._line(line)
        compiled = compile_cell(self.shell, cell)
        panel = self._panel(limits, args)
        try:
            if _is_call(args, ceilings):
                return self._call(compiled, line, cell, args, limits, panel, ceilings)
            run = self._cell_run(cell, args, limits, panel, notices)
            try:
                with run:
                    return compiled.run()
            finally:
                self._run_ended(run, args, panel)
        finally:
            self._cell_ended(panel)

    async def budget_awaited(self, line: str, cell: str) -> Any:
        """A ``%%budget`` cell that awaits at its top level, as IPython runs it once `load`'s
        input transformer (`nbbudget.jupyter.cells.awaited_cells`) has rewritten it: on the
        kernel's event loop, as any cell that awaits (N-6). The cell's run is current in every
        task the cell starts; its deadline, Stop and a cancel cancel the cell's task. A cell
        that may end early (``--detach``, ``--resume``, ``--timeout``) runs as the work of a
        call, on an event loop of its own in its job's thread."""
        args, limits, ceilings, notices = self._line(line)
        if _is_call(args, ceilings):
            return self.budget_cell(line, cell)
        compiled = compile_cell(self.shell, cell)
        panel = self._panel(limits, args)
        try:
            run = self._cell_run(cell, args, limits, panel, notices)
            try:
                async with run:
                    return await compiled.run_async()
            finally:
                self._run_ended(run, args, panel)
        finally:
            self._cell_ended(panel)

    def _cell_ended(self, panel: Panel | None) -> None:
        """However the cell ended: the status bar and the panel are told (a second call does
        nothing)."""
        self.status.cell_ended()
        if panel is not None:
            panel.end_cell()

    def _line(self, line: str) -> _Line:
        """A cell line read with the settings in force: its flags, limits, ceilings and
        notices, each checked (a bad one is a `UsageError`). A line that names no file is read
        once per settings; a --trace target is checked every time, as the disk may change."""
        settings = self.settings
        key = (line, tuple(sorted(settings.limits.items())), _notices_key(settings))
        found = self._lines.get(key)
        if found is None:
            args, limits = _read_flags(line, settings.default_limits())
            found = (args, limits, _ceilings(args), settings.notices())
            if args.manifest is None:  # a manifest is read from its file every time
                if len(self._lines) >= _LINES_KEPT:
                    self._lines.clear()
                self._lines[key] = found
        elif found[0].trace is not None:
            _check_trace(found[0].trace)
        return found

    def _panel(self, limits: Limits, args: Any) -> Panel | None:
        """The live panel, shown before the work starts; None where widgets are off or fail."""
        panel = None
        if self.settings.widget and not args.no_widget:
            panel = Panel(limits, widgets=True, interval_ms=self.settings.update_interval_ms,
                          pausable=args.resume, shell=self.shell, route=self.clicks.route())
            if not panel.live:
                panel = None  # no widgets here: one line of text at the end stands in
        self.last_panel = panel
        if panel is not None:
            panel.show()
            panel.start()
        return panel

    def _cell_run(self, cell: str, args: Any, limits: Limits, panel: Panel | None,
                  notices: tuple[float, float] | None) -> Budget:
        """The run of a cell that cannot end early (no --detach, --resume or --timeout), which
        runs here, as a plain cell would: its own run, or a grant of the run active around it
        (a notebook's under ``nbbudget run``, S2-1, S4-2), watched by the status bar and the
        panel. The caller enters it."""
        outer = current()
        preempt = not args.cooperative
        run = Grant(outer, limits, _label(cell), preempt) if outer is not None else \
            Budget(limits, name=_label(cell), notices=notices,
                   cluster=self.settings.cluster or None, preempt=preempt)
        if outer is None:
            _history.mark(run, "cell")
        self.last_run = run
        self.status.watch(run)
        if panel is not None:
            panel.attach(run)
        return run

    def _run_ended(self, run: Budget, args: Any, panel: Panel | None) -> None:
        """The run of a cell that ran here has ended: its trace saved, its summary shown."""
        if args.trace:
            run.trace.save(args.trace, overwrite=True)
        if panel is not None:
            panel.end_cell(run)
        else:
            _display_text(run_summary(run))

    def _call(self, compiled: CompiledCell, line: str, cell: str, args: Any, limits: Limits,
              panel: Panel | None, ceilings: Manifest | None) -> Any:
        """A cell that may end early runs under `nb.call`, on a worker whose output is tied to
        this cell (N-2)."""

        def work() -> Any:
            run, call = current(), _call.current_call()
            assert run is not None and call is not None  # nb.call runs the work in its run
            _history.mark(run, "cell")
            self.last_run = run
            self.status.watch(run)
            if panel is not None:
                panel.attach(run, call)
            with keep_output(call.job.output):  # N-2: a driver that drops late output loses
                return compiled.run()           # nothing: the job keeps it

        work = pin_output(self.shell, work)
        work.__nbbudget_label__ = args.key or _label(cell)  # type: ignore[attr-defined]
        key = args.key or compiled.identity(_identity_flags(line))
        try:
            resp = _call.call(work, detach=args.detach, resume=args.resume, budget=args.budget,
                              timeout=args.timeout, key=key, limits=limits, manifest=ceilings,
                              notices=self.settings.notices(), runs_per_day=args.runs_per_day,
                              preempt=not args.cooperative,
                              cluster=False)  # the body runs in the kernel; what it sends
                                              # (branches, calls) may go to the cluster
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if panel is not None:
            panel.end_cell(job=resp.job, state=_incomplete_state(resp))
        elif not (args.detach or args.resume) and resp.job is not None:
            _display_text(run_summary(resp.job.run))
        return self._finish(resp, args, panel)

    def _finish(self, resp: Response, args: Any, panel: Panel | None) -> Any:
        """Show the envelope, save the trace, and end the cell as the contract says. The line
        of a detached cell's envelope says so when its job is stopped later: there is no
        result left to wait for."""
        import nbbudget

        nbbudget.last_response = resp
        job = resp.job
        if args.trace and job is not None:
            job.run.trace.save(args.trace, overwrite=True)
        if args.detach or args.resume:
            shown = _display_envelope(resp)
            if panel is not None and job is not None and resp.exit_code == EXIT_INCOMPLETE \
                    and resp.data["state"] == "running":
                panel.when_job_ends(functools.partial(_envelope_after, shown, resp))
        if resp.ok:
            return resp.data
        if resp.exit_code == EXIT_INCOMPLETE:
            if _interactive.is_interactive():
                return None  # a person asked for the budget: the work is safe
            raise Incomplete(resp.data["next"])
        raise _failure(resp)

    @magic_arguments()
    @argument("command", choices=["jobs", "wait", "cancel", "status", "trace", "history"],
              help="jobs: list the background jobs; wait ID: wait for job ID and show its "
                   "result; cancel ID: stop job ID, and say "
                   "whether it did; status: what the last %%%%budget cell's run used, per "
                   "axis, and per model when it called one; trace: its trace events; "
                   "history: the last runs the store kept (cells, calls, notebook runs, with "
                   "blocks), newest first")
    @argument("job", nargs="?", help="the job id, as in %%budget jobs")
    @argument("--timeout", type=float, default=None,
              help="with wait: give up after this many seconds")
    @argument("--suggest", action="store_true",
              help="with history: the limits suggested from the history "
                   "(nb.suggest_limits())")
    @argument("--limit", type=int, default=None, metavar="N",
              help="with history: at most the N newest runs")
    @line_magic
    def budget(self, line: str) -> Any:
        """Background jobs of nbbudget, and what the last ``%%budget`` cell used.

        Examples::

            %budget jobs
            %budget wait 1a2b-3
            %budget cancel 1a2b-3
            %budget status
            %budget trace
            %budget history
            %budget history --suggest
        """
        words = _shell_words("%budget", line)
        if not words:
            raise UsageError("%budget needs a command: jobs (list the background jobs), wait ID, "
                             "cancel ID, status (what the last %%budget cell used) or trace "
                             "(its events), e.g. %budget jobs; %budget? says more")
        args = self.budget.parser.parse_args(words)
        if args.command == "jobs":
            from ..calls.jobs_frame import jobs_table  # pandas, only when asked

            try:
                return jobs_table(jobs)
            except ConfigError as exc:  # the store's records cannot be read (a damaged store)
                raise UsageError(str(exc)) from None
        if args.command in ("status", "trace"):
            return self._last_run_shown(args.command)
        if args.command == "history":
            return _history_shown(args.suggest, args.limit)
        if not args.job:
            raise UsageError(f"%budget {args.command} needs a job id, e.g. "
                             f"%budget {args.command} 1a2b-3 (see %budget jobs)")
        try:
            job = jobs[args.job]
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        if args.command == "cancel":
            print(_cancel(job))
            return None
        try:
            return job.result(timeout=args.timeout)
        except TimeoutError as exc:
            raise UsageError(str(exc)) from None

    def _last_run_shown(self, command: str) -> Any:
        """``%budget status``: what the last cell's run used, per limit (its value), and, when
        it called a model, per provider and model (``run.usage(by="model")``, shown first);
        ``%budget trace``: its events, times in ms to two decimals. A sentence where there is
        nothing to show."""
        run = self.last_run
        if run is None:
            print(f"No %%budget cell has run yet in this kernel; %budget {command} shows the "
                  f"last one's run.")
            return None
        if command == "trace":
            return run.trace.to_frame().round({"t_ms": 2})
        snap = run.snapshot()
        models = None
        if snap.models:
            from ..core.frames import models_frame  # pandas, only when asked

            models = models_frame(snap.models)
        if not snap.axes:
            print(f"The last %%budget cell ({snap.name}) set no limits, so there is no use per "
                  f"limit to show; it ran {spoken(snap.elapsed_ms)} ({snap.status})"
                  + ("." if models is None else ", and called these models:"))
            return models
        if models is not None:
            from IPython.display import display

            display(models)
        return run.usage()




#: IPython's own way of running a cell magic, which expands its line before calling it
_RUN_CELL_MAGIC = InteractiveShell.run_cell_magic.__code__


def _expanded(shell: Any, line: str) -> str:
    """The cell line as IPython's ``run_cell_magic`` would have expanded it (``$name`` and
    ``{expression}``, in the user's namespace and the frame it reads), had ``%%budget`` not
    opted out (``no_var_expand``) for every line: IPython copies the whole user namespace for
    each one, a fifth of what the magic added to a cell, and a line without ``$``, ``{`` or
    ``}`` comes out of it as it went in. Called by ``budget_cell`` for the others: when
    IPython's ``run_cell_magic`` called it, the line is expanded in the same frame (two above
    that one, as IPython reads it); called any other way, where IPython would not have
    expanded it either, it is left as it is."""
    magic = sys._getframe(2)  # the frame that called budget_cell
    if magic.f_code is not _RUN_CELL_MAGIC:
        return line
    # var_expand reads the frame depth + 1 above its own: run_cell_magic's caller's caller
    expanded: str = shell.var_expand(line, 4)
    return expanded


def _history_changed(change: Any) -> None:
    """``%config NBBudget.history = ...``: the history is kept, or no longer, from now on."""
    _history.refresh()


def _model_calls(on: bool) -> None:
    """Every model call of the kernel bounded (``nb.instrument()``), or no longer."""
    from ..integrations.models import everywhere

    if on:
        everywhere.install()
    else:
        switch = everywhere.installed()
        if switch is not None:
            switch.undo()


def _instrument_changed(change: Any) -> None:
    """``%config NBBudget.instrument = ...``: from now on."""
    _model_calls(bool(change["new"]))


def _history_shown(suggest: bool, limit: int | None) -> Any:
    """``%budget history``: the store's last runs as a DataFrame, newest first; with
    ``--suggest``, the limits suggested from them. A sentence where there is nothing to
    show; a store or row that cannot be read is a `UsageError` saying what to do."""
    if limit is not None and limit < 1:
        raise UsageError(f"%budget history --limit {limit}: give a number of runs, 1 or more")
    try:
        if suggest:
            return _history.suggest_limits()
        found = _history.entries(limit)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not found:
        print(f"The history of {_store.store().location} holds no runs yet; each run that "
              f"ends in this kernel is kept there (NBBudget.history).")
        return None
    return _history.frame(found)


def _read_flags(line: str, defaults: Limits) -> tuple[Any, Limits]:
    """A cell line's flags and limits, all checked before the cell runs: how the call may end
    (S0-10), where its trace goes, and its limits (S4-2). A bad one is a `UsageError` naming
    it."""
    args = _parse_cell_line(line)
    try:
        _call.check_interruption(args.detach, args.resume, args.budget,
                                 spelling=_call.FLAG_SPELLING)
        _call.check_options(args.budget, args.timeout, args.key, args.runs_per_day,
                            spelling=_call.FLAG_SPELLING)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.trace is not None:
        _check_trace(args.trace)
    return args, _cell_limits(args, defaults)


def _check_trace(path: str) -> None:
    try:
        check_target(path)
    except ConfigError as exc:
        raise UsageError(f"--trace {exc}") from None


#: a cell line read: its flags, limits, ceilings (S2-8) and approach notices
_Line = tuple[Any, Limits, "Manifest | None", "tuple[float, float] | None"]
_LINES_KEPT = 64


def _notices_key(settings: NBBudget) -> tuple[float, ...] | None:
    value: Any = settings.approach_notice
    return None if value is None else tuple(value)


@functools.lru_cache(maxsize=64)
def _parse_cell_line(line: str) -> Any:
    """The flags of a cell line, its words read as a shell reads them (a value quoted in single
    or double quotes is read without them, a negative one after its flag read as its value);
    the same line is parsed once."""
    return BudgetMagics.budget_cell.parser.parse_args(
        negative_values_joined(_shell_words("%%budget", line)))


def _shell_words(magic: str, line: str) -> list[str]:
    """The words of a magic's line as a shell reads them; what a shell could not read (an
    unclosed quote, a backslash at the end) is a `UsageError` naming the line."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot read {magic} {show(line)}: {str(exc).lower()}; quote a value "
                         f"as a shell does, e.g. --key 'my work' or --key \"my work\"") from None


def _cancel(job: Job) -> str:
    """Cancel *job* and say what that did, in one line (`nbbudget.calls.background.cancel_job`:
    the server extension's cancel says the same)."""
    return cancel_job(job, "cancelled with %budget cancel").message


_CANCEL_NOTES = {"stopped": " (stopped)",
                 "not honoured": " (cancel not honoured)"}


def _ended_how(job: Job) -> str:
    """How a job ended, for the line before the next cell."""
    error = job.exception()
    how = job.state.value
    if error is not None and how == "failed":
        how = f"failed: {type(error).__name__}: {error}"
    return how + _CANCEL_NOTES.get(job.cancel_status or "", "")


def _cell_limits(args: Any, defaults: Limits) -> Limits:
    """S4-2: the configured defaults, the manifest, --run-limits-json, then the flags; each
    later source restricts, never widens. A bad one is a `UsageError` naming it."""
    try:
        return limits_from_flags(args, defaults)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _ceilings(args: Any) -> Manifest | None:
    """S2-8: the runtime's ceilings that the cell's manifest declares (its limits are in the
    cell's limits already), or None."""
    if args.manifest is None:
        return None
    try:
        loaded = Manifest.load(args.manifest)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if loaded.wall_clock_ms is None:
        return None
    return dataclasses.replace(loaded, limits=_NO_LIMITS)


@functools.lru_cache(maxsize=256)
def _label(cell: str) -> str:
    """A cell's name in its panel and in ``%budget jobs``: its first line of code that is not
    an import or a magic (else its first line of code), without a closing colon."""
    lines = [text.strip() for text in cell.splitlines()
             if text.strip() and not text.lstrip().startswith("#")]
    telling = [text for text in lines if not text.startswith(("import ", "from ", "%"))]
    for text in telling or lines:
        text = _without_comment(text).rstrip(":").rstrip()  # "for row in rows:": "for row in rows"
        return f"cell: {text[:47]}..." if len(text) > 50 else f"cell: {text}"
    return "cell"


def _without_comment(text: str) -> str:
    """A line of code without its trailing comment, as Python's tokenizer reads it (a ``#``
    inside a string stays); the line as it is where it does not tokenize alone."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                return text[:token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return text


#: flags that do not name the work: a continuation may change them (S0-11)
_NOT_THE_WORK = frozenset({"budget", "timeout", "runs_per_day"})


def _identity_flags(line: str) -> str:
    """The flags that name the work, as read: all but --budget, --timeout and --runs-per-day.
    However a value is quoted and wherever a flag is placed, the same flags name the same
    work."""
    named = {name: value for name, value in vars(_parse_cell_line(line)).items()
             if name not in _NOT_THE_WORK and value is not None and value is not False}
    return json.dumps(named, sort_keys=True)


def _display_text(text: str) -> None:
    """The summary where no panel is shown: printed, as %%time prints its timing."""
    print(text)


def _display_envelope(resp: Response) -> Any:
    """Show the envelope under the cell; its display handle."""
    from IPython.display import display

    return display(_envelope_bundle(resp, _summary(resp)), raw=True, display_id=True)


def _envelope_bundle(resp: Response, text: str) -> dict[str, Any]:
    return {MIME: json.loads(resp.to_json()), "text/plain": text}


def _envelope_after(shown: Any, resp: Response, job: Job) -> None:
    """The envelope of a detached cell once its job has ended: the same envelope, its line
    saying that a job stopped since (by Stop, ``%budget cancel`` or its wall clock) has no
    result to wait for; a job that finished keeps the line, which still says how to get it."""
    ended = job.run.outcome
    if ended is None or ended.status.value not in ("stopped", "cancelled"):
        return
    then = f"job {job.id} was then {ended.status.value}: there is no result to wait for"
    with contextlib.suppress(Exception):  # the kernel may have gone: no one to show it to
        shown.update(_envelope_bundle(resp, _summary(resp, then=then)), raw=True)


def _incomplete_state(resp: Response) -> str | None:
    """How an INCOMPLETE cell left its run, for its panel, in its envelope's words."""
    if resp.exit_code != EXIT_INCOMPLETE:
        return None
    if resp.data["state"] == "paused":
        return f"paused at checkpoint {resp.data['checkpoint']}"
    return f"running in the background as job {resp.data['job']}"


def _summary(resp: Response, *, then: str | None = None) -> str:
    """The envelope's line; for INCOMPLETE, *then* in place of the next step (what happened
    since)."""
    meta = resp.meta
    budget = f", budget {meta['budget_ms']} ms" if "budget_ms" in meta else ""
    if resp.exit_code == EXIT_INCOMPLETE:
        return (f"INCOMPLETE (exit 14): {resp.data['state']} after {meta['duration_ms']} ms"
                f"{budget}; {then or resp.data['next']}")
    code = str((resp.error or {}).get("code"))
    state = "done" if resp.ok else f"failed ({_OUT_OF_TIME.get(code, code)})"
    return f"nbbudget: {state} in {meta['duration_ms']} ms{budget} (exit {resp.exit_code})"


#: a person reads that the work ran out of the time it was given (--time), not a code that
#: says "timeout", which is --timeout's word (the envelope's JSON keeps the code)
_OUT_OF_TIME: dict[str, str] = {envelope_code(BudgetCut("timeout", "")): OUT_OF_TIME}


class _EndedJobs:
    """Before each execution, say which background jobs ended since the last one: drivers such
    as nbclient drop output sent after a cell ended, so this is how they learn it (N-2)."""

    def __init__(self) -> None:
        self.told: set[str] = set()

    def __call__(self, *args: Any) -> None:
        for job in jobs:
            if job.done() and job.id not in self.told:
                self.told.add(job.id)
                print(f"nbbudget: job {job.id} ({job.label}) ended since the last cell: "
                      f"{_ended_how(job)}; see nb.jobs[{job.id!r}]")


_LOADED: dict[int, tuple[NBBudget, BudgetMagics, _EndedJobs, Callable[[list[str]], list[str]]]] = {}


def _is_call(args: Any, ceilings: Manifest | None) -> bool:
    """Whether a cell's flags make it the work of a call: it may end early, or answers to a
    quota or a manifest's ceilings."""
    return bool(args.detach or args.resume or args.timeout or args.runs_per_day is not None
                or ceilings is not None)


def _escaped_blocks(*args: Any) -> None:
    """After each cell: a ``with nb.budget()`` block of the cell that a stop left without its
    end running (CPython 3.13) is ended now, and the cell says so (stderr, as a warning)."""
    for text in settle_escaped():
        print(text, file=sys.stderr)


def load(shell: Any) -> None:
    """Register the magics and the kernel's interactive detector on *shell*."""
    if id(shell) in _LOADED:
        return
    config = NBBudget(parent=shell)
    magics = BudgetMagics(shell, config)
    shell.register_magics(magics)
    shell.configurables.append(config)
    _interactive.set_detector(make_detector(shell, config))
    _call.set_default_budget(lambda: config.default_budget_ms)
    _call.set_default_cluster(lambda: config.cluster or None)
    _store.set_default_home(lambda: config.home or None)
    _history.set_default(lambda: bool(config.history))
    config.observe(_history_changed, names="history")
    if config.instrument:
        _model_calls(True)
    config.observe(_instrument_changed, names="instrument")
    ended = _EndedJobs()
    ended.told.update(job.id for job in jobs if job.done())
    shell.events.register("pre_run_cell", ended)
    shell.events.register("post_run_cell", magics.status.wake)  # a job may have come or gone
    shell.events.register("post_run_cell", _escaped_blocks)
    magics.status.register()  # the comm a status bar opens (nbbudget.status)
    streams.install()  # a job keeps a copy of what its work prints (N-2)
    awaited = awaited_cells(shell)  # a cell that awaits runs on the kernel's loop (N-6)
    shell.input_transformers_post.append(awaited)
    _LOADED[id(shell)] = (config, magics, ended, awaited)


def unload(shell: Any) -> None:
    """Undo `load`: the magics, the configurable and the detector."""
    loaded = _LOADED.pop(id(shell), None)
    if loaded is None:
        return
    config, magics, ended, awaited = loaded
    with contextlib.suppress(ValueError):
        shell.input_transformers_post.remove(awaited)
    magics.status.unregister()
    shell.events.unregister("post_run_cell", magics.status.wake)
    shell.events.unregister("post_run_cell", _escaped_blocks)
    shell.events.unregister("pre_run_cell", ended)
    streams.uninstall()
    for kind, method in (("line", magics.budget), ("cell", magics.budget_cell)):
        registered = shell.magics_manager.magics[kind]
        if registered.get("budget") == method:
            del registered["budget"]
    shell.magics_manager.registry.pop(type(magics).__name__, None)
    if config in shell.configurables:
        shell.configurables.remove(config)
    _interactive.set_detector(None)
    _call.set_default_budget(None)
    _call.set_default_cluster(None)
    _store.set_default_home(None)
    config.unobserve(_history_changed, names="history")
    _history.set_default(None)
    config.unobserve(_instrument_changed, names="instrument")
    _model_calls(False)
