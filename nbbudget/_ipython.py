"""The IPython layer: configuration, interactive detection in the kernel, and ``%budget``.

Loaded by ``%load_ext nbbudget``; nothing here is imported by ``import nbbudget``. The core owns
every piece of state; this layer only reads it and shows it.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Int
from traitlets.config import Configurable

from . import _call, _interactive
from ._jobs import jobs

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
    interactive = Bool(
        None, allow_none=True,
        help="True: treat every execution as a person's (no default budget); False: as a "
             "program's; None: detect it from the request (a person's front end sends a "
             "cellId and allows stdin). NBBUDGET_INTERACTIVE=1|0 overrides this.",
    ).tag(config=True)
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
    except Exception:  # an older kernel without a current request: no opinion
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


@magics_class
class BudgetMagics(Magics):
    """``%budget``: the jobs of this kernel."""

    def __init__(self, shell: Any, config: NBBudget) -> None:
        super().__init__(shell)
        self.settings = config

    @magic_arguments()
    @argument("command", choices=["jobs", "wait", "cancel"],
              help="jobs: list the background jobs; wait ID: wait for job ID and show its "
                   "result; cancel ID: ask job ID to stop")
    @argument("job", nargs="?", help="the job id, as in %%budget jobs")
    @argument("--timeout", type=float, default=None,
              help="with wait: give up after this many seconds")
    @line_magic
    def budget(self, line: str) -> Any:
        """Background jobs of nbbudget.

        Examples::

            %budget jobs
            %budget wait 1a2b-3
            %budget cancel 1a2b-3
        """
        args = parse_argstring(self.budget, line)
        if args.command == "jobs":
            return jobs.to_frame()
        if not args.job:
            raise UsageError(f"%budget {args.command} needs a job id, e.g. "
                             f"%budget {args.command} 1a2b-3 (see %budget jobs)")
        try:
            job = jobs[args.job]
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        if args.command == "cancel":
            job.cancel()
            return None
        try:
            return job.result(timeout=args.timeout)
        except TimeoutError as exc:
            raise UsageError(str(exc)) from None


_LOADED: dict[int, tuple[NBBudget, BudgetMagics]] = {}


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
    _LOADED[id(shell)] = (config, magics)


def unload(shell: Any) -> None:
    """Undo `load`: the magics, the configurable and the detector."""
    loaded = _LOADED.pop(id(shell), None)
    if loaded is None:
        return
    config, magics = loaded
    line_magics = shell.magics_manager.magics["line"]
    if line_magics.get("budget") == magics.budget:
        del line_magics["budget"]
    shell.magics_manager.registry.pop(type(magics).__name__, None)
    if config in shell.configurables:
        shell.configurables.remove(config)
    _interactive.set_detector(None)
    _call.set_default_budget(None)
