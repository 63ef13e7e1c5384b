"""The one router on ``sys.stdout`` and ``sys.stderr`` (`nbbudget.core.streams`): a diverted
thread's writes go to its sink only, a copied context's to its sink and the stream, everything
else to the stream as it was; the router goes on once, comes off when nothing holds it (unless
someone replaced it since), and keeps all of that under contention from real threads. It is the
only code of the package that sets ``sys.stdout`` or ``sys.stderr``.

The cells' copy of a job's output is shown end to end in a kernel by
``tests/test_magic_kernel.py`` (N-2), a Dask task's output by ``tests/test_dask_job_output.py``.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import io
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from nbbudget.core import streams
from nbbudget.core.streams import Router

PACKAGE = Path(__file__).resolve().parent.parent / "nbbudget"


class Counted(io.StringIO):
    """A stream that counts its flushes."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


@contextlib.contextmanager
def own_streams() -> Iterator[Counted]:
    """``sys.stdout`` and ``sys.stderr`` of the test's own while the block runs (set in the
    test itself: pytest sets its capture's streams again between a fixture and its test); at
    its end both must be as they were: no router left on them."""
    saved = sys.stdout, sys.stderr
    stdout, stderr = Counted(), Counted()
    sys.stdout, sys.stderr = stdout, stderr
    try:
        yield stdout
        assert (sys.stdout, sys.stderr) == (stdout, stderr), "the router was left on a stream"
    finally:
        streams.uninstall()  # so that one failure does not spill into the next test
        sys.stdout, sys.stderr = saved


def in_thread(fn: Callable[[], object], name: str = "test-streams-writer") -> None:
    """Run *fn* on a thread of its own, to its end (its error raised here)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def test_install_puts_one_router_on_each_stream_and_uninstall_puts_them_back() -> None:
    with own_streams() as out:
        err = sys.stderr
        streams.install()
        router = sys.stdout
        assert isinstance(router, Router) and router.stream is out
        assert isinstance(sys.stderr, Router) and sys.stderr.stream is err
        streams.install()  # again: the same router, not one on top of it
        assert sys.stdout is router
        streams.uninstall()
        assert sys.stdout is out and sys.stderr is err
        streams.uninstall()  # again: nothing to undo
        assert sys.stdout is out


def test_with_no_route_what_is_written_falls_through_to_the_stream() -> None:
    with own_streams() as out:
        streams.install()
        print("plain")
        assert sys.stdout.write("more\n") == 5  # what the stream answers
        sys.stdout.flush()
        assert out.getvalue() == "plain\nmore\n"
        assert out.flushes == 1
        assert sys.stdout.getvalue() == "plain\nmore\n"  # any other attribute is the stream's
        streams.uninstall()


def test_a_diverted_thread_writes_only_to_its_sink_and_the_others_to_the_stream() -> None:
    with own_streams() as out:
        sink: list[str] = []
        entered, printed = threading.Event(), threading.Event()

        def task() -> None:
            with streams.diverted(sink.append):
                entered.set()
                assert printed.wait(10)
                print("the task's")
                sys.stderr.write("its error\n")
                sys.stdout.flush()  # the sink sends on its own schedule
            print("after the block")

        thread = threading.Thread(target=task, name="test-streams-task")
        thread.start()
        assert entered.wait(10)
        assert isinstance(sys.stdout, Router)
        print("the main thread's")  # while the task's thread is diverted
        printed.set()
        thread.join(10)
        assert sink == ["the task's", "\n", "its error\n"]
        assert out.getvalue() == "the main thread's\nafter the block\n"
        assert out.flushes == 0
        assert sys.stdout is out  # nothing holds the router any more: it came off


def test_a_copied_context_keeps_a_copy_in_the_threads_that_run_copies_of_it() -> None:
    with own_streams() as out:
        kept: list[str] = []
        with streams.copied(kept.append):
            print("cell")
            context = contextvars.copy_context()
            in_thread(lambda: context.run(print, "its call"))  # as nb.call runs work
            in_thread(lambda: print("another thread"))  # a context of its own
        print("after")
        assert "".join(kept) == "cell\nits call\n"
        assert out.getvalue() == "cell\nits call\nanother thread\nafter\n"
        assert sys.stdout is out


def test_a_route_inside_a_route_gives_the_thread_back_to_the_outer_sink() -> None:
    with own_streams() as out:
        outer: list[str] = []
        inner: list[str] = []
        with streams.diverted(outer.append):
            with streams.diverted(inner.append):
                sys.stdout.write("a\n")
            sys.stdout.write("b\n")
        sys.stdout.write("c\n")
        copies: list[str] = []
        with streams.copied(outer.append):
            with streams.copied(copies.append):
                sys.stdout.write("d\n")
            sys.stdout.write("e\n")
        assert (inner, outer, copies) == (["a\n"], ["b\n", "e\n"], ["d\n"])
        assert out.getvalue() == "c\nd\ne\n"


def test_a_diverted_thread_in_a_copied_context_writes_to_its_own_sink_only() -> None:
    with own_streams() as out:
        task: list[str] = []
        kept: list[str] = []
        with streams.copied(kept.append), streams.diverted(task.append):
            sys.stdout.write("x\n")
        assert (task, kept, out.getvalue()) == (["x\n"], [], "")


def test_the_router_leaves_a_stream_that_someone_put_there_since() -> None:
    with own_streams() as out:
        err = sys.stderr
        streams.install()
        theirs = io.StringIO()
        sys.stdout = theirs  # as contextlib.redirect_stdout or %%capture does
        sink: list[str] = []
        with streams.diverted(sink.append):  # a route while it is there: it is routed
            assert isinstance(sys.stdout, Router) and sys.stdout.stream is theirs
            print("routed")
        sys.stdout = theirs
        streams.uninstall()
        assert sys.stdout is theirs and sys.stderr is err  # theirs to put back
        assert sink == ["routed", "\n"]
        sys.stdout = out


def test_an_attribute_set_on_the_router_stays_on_it() -> None:
    with own_streams() as out:
        streams.install()
        history: list[str] = []
        own = sys.stdout.write

        def write(text: str) -> Any:  # as IPython's output history wraps write while a cell runs
            history.append(text)
            return own(text)

        sys.stdout.write = write  # type: ignore[method-assign]
        kept: list[str] = []
        with streams.copied(kept.append):
            print("shown")
        sys.stdout.write = own  # type: ignore[method-assign]
        assert history == kept == ["shown", "\n"]
        assert out.getvalue() == "shown\n"
        assert "write" not in vars(out)  # the stream itself untouched
        streams.uninstall()


def test_with_no_stream_what_falls_through_is_dropped_and_a_route_still_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", None)  # pythonw, or a worker started without one
    sink: list[str] = []
    with streams.diverted(sink.append):
        print("routed")
    assert sink == ["routed", "\n"]
    assert sys.stdout is None
    streams.install()
    assert sys.stdout.write("dropped") == 7
    sys.stdout.flush()
    streams.uninstall()
    assert sys.stdout is None


def _stretched(frame: FrameType, event: str, arg: Any) -> Any:
    """A thread's tracer that sleeps a little at each line of the router's bookkeeping (who
    holds it, and the swap of the streams), so that threads meet inside it as they rarely do
    at full speed: without its lock, they then do."""
    code = frame.f_code
    if code.co_filename != streams.__file__ or code.co_name not in ("_hold", "_release"):
        return None

    def each_line(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            time.sleep(0.0001)  # lets go of the GIL: another thread runs here
        return each_line

    return each_line


def test_routes_begun_and_ended_at_once_on_many_threads_each_get_their_own_lines() -> None:
    """Threads that divert, copy and write plainly to both streams at once, their routes begun
    and ended while the others are inside the router's bookkeeping: every line reaches exactly
    where it should, and the streams are as they were at the end. (Without the lock, lines of
    a route that began while the last one ended go to the stream, and lines fall through while
    the counter of holders loses a step.)"""
    with own_streams() as out:
        err = sys.stderr
        rounds, writers = 150, 4
        diverted: dict[int, list[str]] = {i: [] for i in range(writers)}
        copied: dict[int, list[str]] = {i: [] for i in range(writers)}
        start = threading.Barrier(writers + 1)

        def writer(i: int) -> None:
            start.wait()
            for n in range(rounds):
                if i % 2:
                    with streams.diverted(diverted[i].append):
                        sys.stdout.write(f"diverted {i} {n}\n")
                        sys.stderr.write(f"diverted {i} {n}\n")
                else:
                    with streams.copied(copied[i].append):
                        sys.stdout.write(f"copied {i} {n}\n")
                        sys.stderr.write(f"copied {i} {n}\n")

        def plain() -> None:
            start.wait()
            for n in range(rounds):
                sys.stdout.write(f"plain {n}\n")
                sys.stderr.write(f"plain {n}\n")
                time.sleep(0.0002)

        threads = [threading.Thread(target=writer, args=(i,), name=f"test-streams-{i}")
                   for i in range(writers)]
        threads.append(threading.Thread(target=plain, name="test-streams-plain"))
        tracer = threading.gettrace()
        threading.settrace(_stretched)  # the threads started from here on
        try:
            for thread in threads:
                thread.start()
        finally:
            threading.settrace(tracer)  # type: ignore[arg-type]
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        for i in range(writers):
            kind = "diverted" if i % 2 else "copied"
            mine = [f"{kind} {i} {n}\n" for n in range(rounds) for _ in ("out", "err")]
            assert (diverted[i], copied[i]) == ((mine, []) if i % 2 else ([], mine))
        shown = sorted([f"plain {n}\n" for n in range(rounds)]
                       + [line for lines in copied.values() for line in lines[::2]])
        assert sorted(out.getvalue().splitlines(keepends=True)) == shown
        assert sorted(err.getvalue().splitlines(keepends=True)) == shown
        assert sys.stdout is out and sys.stderr is err


def _sets_a_standard_stream(source: str) -> bool:
    """Whether *source* has ``sys.stdout = ...``, ``sys.stderr = ...`` or ``setattr(sys, ...)``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                   and t.value.id == "sys" and t.attr in ("stdout", "stderr") for t in targets):
                return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "setattr" and node.args
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "sys"):
            return True
    return False


def test_only_the_router_sets_the_standard_streams() -> None:
    setters = sorted(str(path.relative_to(PACKAGE.parent))
                     for path in PACKAGE.rglob("*.py")
                     if _sets_a_standard_stream(path.read_text()))
    assert setters == ["nbbudget/core/streams.py"]


def test_the_check_of_who_sets_the_standard_streams_finds_each_way() -> None:
    found = [_sets_a_standard_stream(code) for code in (
        "sys.stdout = x", "sys.stderr: Any = x", "def f():\n    setattr(sys, name, x)",
        "print(sys.stdout)", "self.stdout = x", "setattr(self, 'stdout', x)")]
    assert found == [True, True, True, False, False, False]
