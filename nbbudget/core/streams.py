"""The one router on ``sys.stdout`` and ``sys.stderr``: what is written there goes to the sink
registered for the writing thread, or for the context it writes in, and otherwise to the stream
as it was.

Two parts of nbbudget route output, each in the way it needs:

- **a cell's job keeps a copy** (`copied`, by context): what the work of a ``%%budget`` cell
  prints is shown as usual and also kept in its job's output
  (`nbbudget.jupyter.cells.keep_output`), so that a driver that drops late output loses nothing
  (N-2). It goes by context, because the work's own calls, tools and branches run on other
  threads in copies of its context, and their output is the job's too; the kernel's other
  threads and cells are untouched.
- **a task on a Dask worker sends its output elsewhere** (`diverted`, by thread): what a call's
  task prints goes to the kernel, not to the worker's streams
  (`nbbudget.backends.dask.output.TaskOutput`). It goes by thread, because a worker runs
  several tasks on threads at once, each with its own output, and what a thread that the task
  starts writes stays the worker's, as before.

A thread's own sink comes first (and takes the text), then its context's (which takes a copy),
then the stream. The router is put on ``sys.stdout`` and ``sys.stderr`` by the first that needs
it (`install`, or a route) and taken off when nothing needs it any more, only if nobody
replaced it meanwhile (``contextlib.redirect_stdout``, ``%%capture``): a stream that someone
else put there is theirs to put back. A route that begins while a stream is not the router
puts a router on what is there now, so that the route is followed; a router is never put on a
router.

Thread safety: who holds the router (`install` and the routes registered), the table of the
threads' sinks, and the swap of ``sys.stdout``/``sys.stderr`` change under one lock. A write
takes no lock: it reads the table with one ``dict.get`` (atomic) and the context with one
``ContextVar.get``; the stream itself, like any stream, is for its own writer to guard.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["Router", "Sink", "copied", "diverted", "install", "uninstall"]

#: where routed text goes: called with each piece of text written
Sink = Callable[[str], object]

_NAMES = ("stdout", "stderr")

_lock = threading.Lock()  # guards the three below, and the swap of sys.stdout/sys.stderr
_diverted: dict[int, Sink] = {}  # by thread ident: the sink that takes what it writes
_installed = False  # `install` holds the router until `uninstall`
_holders = 0  # _installed + len(_diverted) + `copied` blocks open; the router is on while > 0

_get_ident = threading.get_ident

_copied: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("nbbudget_copied",
                                                                      default=None)


class Router:
    """What ``sys.stdout`` or ``sys.stderr`` is while the router is on: it writes each text to
    the thread's sink, or to the context's sink and the stream, or to the stream (*stream*: the
    one it replaced; None when there was none, and then what falls through is dropped, as
    ``print`` drops it). Every other attribute is read from the stream. One set on the router
    stays on the router: IPython sets ``write`` on ``sys.stdout`` while a cell runs, to keep
    the cell's output history, and its wrapper calls the router's own ``write`` back.

    Public so that `install`'s callers and the tests can tell the router from a stream."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> Any:
        """What ``print`` and every writer to ``sys.stdout``/``sys.stderr`` call: *text* to
        the thread's sink (its answer answered), or to the context's sink and the stream, or
        to the stream (the stream's answer answered unchanged)."""
        # the hot path of every print(): one dict test while no thread is diverted, one
        # ContextVar.get
        if _diverted:
            sink = _diverted.get(_get_ident())
            if sink is not None:
                return sink(text)
        copy = _copied.get()
        if copy is not None:
            copy(text)
        stream = self.stream
        return len(text) if stream is None else stream.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Each of *lines* through `write`, as a stream's ``writelines`` does."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush the stream; a diverted thread's sink sends on its own schedule, so its flush
        does nothing."""
        if _diverted and _get_ident() in _diverted:
            return
        if self.stream is not None:
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def install() -> None:
    """Put the router on ``sys.stdout`` and ``sys.stderr`` and keep it there until `uninstall`
    (calling it again changes nothing). The cell magics call it at ``%load_ext nbbudget``, so
    that the streams are swapped once, before any cell, and not each time a job's work begins
    while another cell may be printing."""
    global _installed
    with _lock:
        if not _installed:
            _installed = True
            _hold()


def uninstall() -> None:
    """Undo `install` (``%unload_ext nbbudget``): the streams are put back as they were once no
    route needs the router either, if nobody replaced them since."""
    global _installed
    with _lock:
        if _installed:
            _installed = False
            _release()


@contextlib.contextmanager
def diverted(sink: Sink) -> Iterator[None]:
    """While the block runs, what this thread writes to ``sys.stdout`` or ``sys.stderr`` goes
    to *sink* instead (a block in the block sends it to its own sink, and back here when it
    ends). `nbbudget.backends.dask.output.TaskOutput` calls it around a task on a worker, which
    ships what it is given to the kernel."""
    ident = threading.get_ident()
    with _lock:
        outer = _diverted.get(ident)
        _diverted[ident] = sink
        if outer is None:
            _hold()
    try:
        yield
    finally:
        with _lock:
            if outer is not None:
                _diverted[ident] = outer
            else:
                del _diverted[ident]
                _release()


@contextlib.contextmanager
def copied(sink: Sink) -> Iterator[None]:
    """While the block runs, what is written to ``sys.stdout`` or ``sys.stderr`` in this
    context (in the threads that run copies of it too) also goes to *sink*, besides the stream;
    a block in the block copies to its own sink instead. `nbbudget.jupyter.cells.keep_output`
    calls it around a cell's work, so that its job keeps what it printed."""
    with _lock:
        _hold()
    token = _copied.set(sink)
    try:
        yield
    finally:
        _copied.reset(token)
        with _lock:
            _release()


def _hold() -> None:
    """One more holder (lock held): the router goes on each stream that is not one (the
    first holder's, or one that someone replaced since)."""
    global _holders
    _holders += 1
    for name in _NAMES:
        stream = getattr(sys, name)
        if not isinstance(stream, Router):
            setattr(sys, name, Router(stream))


def _release() -> None:
    """One holder less (lock held): the last puts back each stream the router still is."""
    global _holders
    _holders -= 1
    if _holders:
        return
    for name in _NAMES:
        stream = getattr(sys, name)
        if isinstance(stream, Router):
            setattr(sys, name, stream.stream)

