"""Running a ``%%budget`` cell: compiled on the main thread as ``%%time`` does, executed under
`nb.call` (in place, or on a worker whose output is tied to the cell that started it).

Rules: S0-1..S0-12 through `nb.call`, N-1, N-2.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import contextvars
import functools
import hashlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..core import preempt, streams

__all__ = ["CompiledCell", "awaited_cells", "comms_sent_as", "compile_cell", "keep_output",
           "pin_output", "pins_all_output"]


class CompiledCell:
    """A cell compiled like ``%%time`` compiles it: its body, and its last expression apart so
    that its value becomes ``Out[n]``. The magic (`nbbudget.jupyter.magics`) compiles each
    ``%%budget`` cell so on the main thread, then runs it (`run`) where its budget says: in
    place, or as the work of a call on a worker thread."""

    def __init__(self, shell: Any, source: str) -> None:
        self.shell = shell
        self.source = source
        transformed = shell.transform_cell(source)
        filename = shell.compile.cache(transformed)
        tree = shell.transform_ast(shell.compile.ast_parse(transformed, filename=filename))
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT  # a cell may await at its top level
        self.body = compile(tree, filename, "exec", shell.compile.flags | flags, dont_inherit=True)
        self.last = compile(last, filename, "eval", shell.compile.flags | flags,
                            dont_inherit=True) if last is not None else None
        self.transformed = transformed

    def run(self) -> Any:
        """Execute the cell in the user's namespace; the value of its last expression (the
        magic's work, on whichever thread runs it). A cell that awaits runs on an event loop
        of its own (`_settle`)."""
        __tracebackhide__ = True
        ns = self.shell.user_ns
        _settle(eval(self.body, ns))
        return _settle(eval(self.last, ns)) if self.last is not None else None

    async def run_async(self) -> Any:
        """`run` for a cell that awaits at its top level, on the event loop that awaits this
        (N-6): the kernel's, as any cell that awaits. The magic's ``budget_awaited``."""
        __tracebackhide__ = True
        ns = self.shell.user_ns
        value = eval(self.body, ns)
        if inspect.iscoroutine(value):
            await value
        if self.last is None:
            return None
        value = eval(self.last, ns)
        return await value if inspect.iscoroutine(value) else value

    def identity(self, flags: str) -> str:
        """The work a cell does: its transformed source and its flags, ``--budget`` and
        ``--timeout`` aside (S0-11). The magic keys the cell's call with it, so that running
        the same cell again finds its job."""
        digest = hashlib.sha256(self.transformed.encode())
        digest.update(b"\0" + flags.encode())
        return f"cell:{digest.hexdigest()}"


# the cell's own code runs beneath these: the kernel's timer stops it there (N-5)
preempt.calls_work(CompiledCell.run.__code__)
preempt.calls_work(CompiledCell.run_async.__code__)


def _settle(value: Any) -> Any:
    """A cell that awaits at its top level evaluates to a coroutine: run it to its end, on an
    event loop of its own. Where a loop runs in this thread already (a kernel whose autoawait
    is off, so `awaited_cells` leaves the cell alone), on a helper thread, in this context (the
    cell's run is current there); a stop of the run that interrupts the wait cancels it."""
    if not inspect.iscoroutine(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(value)
    box: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> Any:
        box["task"] = asyncio.current_task()
        box["loop"] = asyncio.get_running_loop()
        started.set()
        return await value

    def helper() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the cell's thread
            box["error"] = exc
        finally:
            started.set()

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(helper,), name="nbbudget-await",
                              daemon=True)
    thread.start()
    try:
        thread.join()
    except BaseException:  # the run's stop, or a kernel interrupt: end the helper's work too
        started.wait()
        if "task" in box:
            with contextlib.suppress(RuntimeError):  # its loop has closed: it ended
                box["loop"].call_soon_threadsafe(box["task"].cancel)
        thread.join()
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")


#: how IPython writes a ``%%budget`` cell once transformed (``inputtransformer2.cell_magic``)
_CELL_MAGIC = "get_ipython().run_cell_magic('budget', "


def awaited_cells(shell: Any) -> Callable[[list[str]], list[str]]:
    """N-6: an input transformer (``shell.input_transformers_post``) that rewrites a
    ``%%budget`` cell whose body awaits at its top level into an ``await`` of the magic's
    ``budget_awaited``, so that IPython runs it as any cell that awaits: on the kernel's event
    loop (autoawait). Every other cell is left as it is. ``nbbudget.jupyter.magics`` installs
    it when it loads."""

    def transform(lines: list[str]) -> list[str]:
        if not lines or not lines[0].startswith(_CELL_MAGIC) or not shell.autoawait:
            return lines
        try:
            tree = ast.parse("".join(lines))
        except SyntaxError:
            return lines
        node = tree.body[0].value if len(tree.body) == 1 and isinstance(
            tree.body[0], ast.Expr) else None
        if not (isinstance(node, ast.Call) and len(node.args) == 3 and not node.keywords
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                        for a in node.args)):
            return lines
        line, body = node.args[1].value, node.args[2].value  # type: ignore[attr-defined]
        if not _awaits(shell, body):
            return lines
        return [f"await get_ipython().find_cell_magic('budget').__self__.budget_awaited("
                f"{line!r}, {body!r})\n"]

    return transform


def _awaits(shell: Any, body: str) -> bool:
    """Whether a cell's *body* awaits at its top level (as IPython tells a cell that does)."""
    try:
        code = compile(shell.transform_cell(body), "<cell>", "exec",
                       ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False  # the magic reports it, as for any cell
    return bool(code.co_flags & inspect.CO_COROUTINE)


def compile_cell(shell: Any, source: str) -> CompiledCell:
    """*source* compiled in *shell* (`CompiledCell`): what the magic runs, and what the
    magic's benchmark runs plain to tell what the magic adds."""
    return CompiledCell(shell, source)


def pin_output(shell: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """*fn*, whose output goes to the cell executing now even when it runs on another thread
    and after that cell has ended (N-2): ``set_thread_parent`` on ipykernel 7.4+, the private
    context variables of the streams and display publishers on 6.29-7.3, and the kernel's own
    context variable for widget messages on 7.1+; a plain shell (no kernel) needs nothing.
    The magic wraps a cell's work so, and the panel its updater thread."""
    get_parent = getattr(shell, "get_parent", None)
    parent = get_parent() if get_parent is not None else None

    def pinned() -> Any:
        if not parent:
            return fn()
        undo = _pin(shell, parent)
        try:
            return fn()
        finally:
            for step in reversed(undo):
                step()

    return pinned


def pins_all_output(shell: Any) -> bool:
    """Whether `pin_output` ties displays and widget messages to their cell, not only printed
    text: outside a kernel there are no cells to mix up; in one it takes ipykernel 7.1+. The
    panel asks, to know whether it may still send updates after its cell has ended."""
    if getattr(shell, "get_parent", None) is None:
        return True
    displays = hasattr(shell, "set_thread_parent") or isinstance(
        getattr(getattr(shell, "display_pub", None), "_parent_header", None),
        contextvars.ContextVar)
    return displays and _comm_parent(shell) is not None


def _pin(shell: Any, parent: dict[str, Any]) -> list[Callable[[], Any]]:
    """Tie this thread's output to *parent*; what undoes each tie."""
    undo: list[Callable[[], Any]] = []
    setter = getattr(shell, "set_thread_parent", None)
    if setter is not None:  # ipykernel >= 7.4
        undo.append(functools.partial(shell.reset_thread_parent, setter(parent)))
    else:
        from jupyter_client.session import extract_header

        header = extract_header(parent)  # what the streams and publishers keep, as set_parent
        for target in (sys.stdout, sys.stderr, getattr(shell, "display_pub", None),
                       getattr(shell, "displayhook", None)):
            var = getattr(target, "_parent_header", None)
            if var is not None and hasattr(var, "set"):
                undo.append(functools.partial(var.reset, var.set(header)))
    comms = _comm_parent(shell)
    if comms is not None:  # what widget messages (comm) are sent as part of
        undo.append(functools.partial(comms.reset, comms.set(parent)))
    return undo


@contextlib.contextmanager
def comms_sent_as(shell: Any, parent: dict[str, Any] | None) -> Iterator[None]:
    """While the block runs (in this context), widget (comm) messages are sent as part of
    *parent*; None, or a kernel that cannot tie them (before ipykernel 7.1), changes nothing.
    The panel sends its widgets' messages so, addressed to the subshell that handles their
    clicks (`nbbudget.jupyter.clicks`)."""
    comms = _comm_parent(shell) if parent is not None else None
    if comms is None:
        yield
        return
    token = comms.set(parent)
    try:
        yield
    finally:
        comms.reset(token)


def _comm_parent(shell: Any) -> contextvars.ContextVar[Any] | None:
    """The kernel's per-context request, which comm messages read (ipykernel 7.1+; on older
    kernels it is one value for every thread, and cannot be tied to a cell)."""
    var = getattr(getattr(shell, "kernel", None), "_shell_parent", None)
    return var if isinstance(var, contextvars.ContextVar) else None


@contextlib.contextmanager
def keep_output(into: list[str]) -> Iterator[None]:
    """While the block runs (in this context), what is printed is also kept in *into*, besides
    being shown. The magic runs a cell's work so, with its job's output as *into* (N-2: a driver
    that drops output arriving after the cell's end loses nothing, the job keeps it); the router
    (`nbbudget.core.streams`) is on the streams from ``%load_ext nbbudget``."""
    with streams.copied(into.append):
        yield
