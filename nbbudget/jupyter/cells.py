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

__all__ = ["CompiledCell", "comms_sent_as", "compile_cell", "pin_output", "pins_all_output"]


class CompiledCell:
    """A cell compiled like ``%%time`` compiles it: its body, and its last expression apart so
    that its value becomes ``Out[n]``."""

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
        """Execute the cell in the user's namespace; the value of its last expression."""
        __tracebackhide__ = True
        ns = self.shell.user_ns
        _settle(eval(self.body, ns))
        return _settle(eval(self.last, ns)) if self.last is not None else None

    def identity(self, flags: str) -> str:
        """The work a cell does: its transformed source and its flags, ``--budget`` and
        ``--timeout`` aside (S0-11)."""
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
        except BaseException as exc:  # re-raised in the cell's thread
            box["error"] = exc

    thread = threading.Thread(target=helper, name="nbbudget-await", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def compile_cell(shell: Any, source: str) -> CompiledCell:
    return CompiledCell(shell, source)


def pin_output(shell: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """*fn*, whose output goes to the cell executing now even when it runs on another thread
    and after that cell has ended (N-2): ``set_thread_parent`` on ipykernel 7.4+, the private
    context variables of the streams and display publishers on 6.29-7.3, and the kernel's own
    context variable for widget messages on 7.1+; a plain shell (no kernel) needs nothing."""
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
    text: outside a kernel there are no cells to mix up; in one it takes ipykernel 7.1+."""
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


#: where the current work's printed text is kept, besides being shown (a job's output)
_capture: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "nbbudget_capture", default=None)


class _Tee:
    """``sys.stdout``/``sys.stderr`` as they were, plus a copy of what the work of a job writes
    into that job's output (set per context, so other threads and cells are untouched). Every
    other attribute is read from the stream; one set on the tee (IPython wraps ``write`` to keep
    output history) stays on the tee, so such wrappers keep calling the tee's own ``write``."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> Any:
        kept = _capture.get()
        if kept is not None:
            kept.append(text)
        return self._stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install_tee() -> None:
    """Keep a copy of job output from now on (``%load_ext``)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Tee):
            setattr(sys, name, _Tee(stream))


def remove_tee() -> None:
    """Put the streams back as they were (``%unload_ext``), if nobody replaced them since."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Tee):
            setattr(sys, name, stream._stream)


@contextlib.contextmanager
def keep_output(into: list[str]) -> Iterator[None]:
    """While the block runs (in this context), what is printed is also kept in *into*."""
    token = _capture.set(into)
    try:
        yield
    finally:
        _capture.reset(token)
