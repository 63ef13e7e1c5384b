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

from ..core import streams

__all__ = ["CompiledCell", "comms_sent_as", "compile_cell", "keep_output", "pin_output",
           "pins_all_output"]


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
        magic's work, on whichever thread runs it)."""
        __tracebackhide__ = True
        ns = self.shell.user_ns
        _settle(eval(self.body, ns))
        return _settle(eval(self.last, ns)) if self.last is not None else None

    def identity(self, flags: str) -> str:
        """The work a cell does: its transformed source and its flags, ``--budget`` and
        ``--timeout`` aside (S0-11). The magic keys the cell's call with it, so that running
        the same cell again finds its job."""
        digest = hashlib.sha256(self.transformed.encode())
        digest.update(b"\0" + flags.encode())
        return f"cell:{digest.hexdigest()}"


def _settle(value: Any) -> Any:
    """A cell that awaits at its top level evaluates to a coroutine: run it to its end, on an
    event loop of its own (in a helper thread when this thread's loop is the kernel's)."""
    if not inspect.iscoroutine(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(value)
    box: dict[str, Any] = {}

    def helper() -> None:
        try:
            box["value"] = asyncio.run(value)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the cell's thread
            box["error"] = exc

    thread = threading.Thread(target=helper, name="nbbudget-await", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


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
