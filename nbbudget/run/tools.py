"""Tools: calls that reserve a permit, run on a pre-started worker thread (`core.workers`, named
for the call while it runs it), and are cut when the run's time runs out (S2-6) or when they go
silent past ``max_silence`` (S2-5). The caller is freed at the cut even when the tool ignores
its signal (S2-7): it waits at most `_ABANDON_GRACE_S` for the tool to end, and a tool still
running then is abandoned, named in the trace by its thread's name, and stops at its next
``ctx`` call, if it ever makes one (its worker is not idle again until it ends).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core import preempt, workers
from ..core.clock import Latch, Scheduled
from ..core.duration import parse_duration
from ..core.endings import by_in_words
from ..core.errors import BudgetCut, ConfigError
from ..core.kinds import TOOL_CALLS

if TYPE_CHECKING:
    from ..core.lowlevel import Run, Stop

__all__ = ["ToolContext", "make_tool"]

#: how long a cut call's caller waits for the tool's thread to end before it abandons it
_ABANDON_GRACE_S = 0.1
_thread_seq = itertools.count(1)  # tool thread names stay unique across runs


class ToolContext:
    """What a tool sees: ``signal`` (a `threading.Event` set when the call is cut),
    `progress` (the heartbeat) and `check` (raise if cut)."""

    def __init__(self, run: Run, name: str, thread_name: str) -> None:
        self.run = run
        self.name = name
        self.thread_name = thread_name
        self.signal = threading.Event()
        self.cut_by: str | None = None
        self.last_beat_ms = run.lowlevel.clock.now_ms()

    def progress(self, data: Any = None) -> None:
        """Report progress: emits a ``progress`` event and resets the silence window (S2-5)."""
        self.check()
        core = self.run.lowlevel
        self.last_beat_ms = core.clock.now_ms()
        core.record("progress", {"tool": self.name, "data": data})

    def check(self) -> None:
        """Raise `BudgetCut` if this call has been cut; well-behaved tools call it in loops."""
        if self.signal.is_set():
            by = self.cut_by or "timeout"
            raise BudgetCut(by, f"tool {self.name} was cut ({by_in_words(by)})")

    def _cut(self, by: str) -> bool:
        if self.signal.is_set():
            return False
        self.cut_by = by
        self.signal.set()
        return True


def make_tool(run: Run, fn: Callable[..., Any], name: str | None,
              max_silence: int | str | None) -> Callable[..., Any]:
    """*fn* as a tool of *run*: what `Budget.tool` (``nbbudget.run.budget``) returns, kept here
    with the machinery of a tool call (a worker thread, its signal, the watchdog). Each call
    reserves a ``tool_calls`` permit, then runs *fn* on a worker thread, capped by the run's
    time (S2-6) and by *max_silence* (S2-5)."""
    if not callable(fn):
        raise ConfigError(f"tool() decorates a function, not {fn!r}")
    tool_name: str = name or getattr(fn, "__name__", None) or "tool"
    silence = None if max_silence is None else parse_duration(max_silence, field="max_silence")
    if silence == 0:
        raise ConfigError("max_silence=0 would cut every call at once; use None for no watchdog")
    wants_ctx = "ctx" in inspect.signature(fn).parameters

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        run.lowlevel.charge(TOOL_CALLS, 1, f"tool:{tool_name}")
        run.check()
        return _ToolCall(run, tool_name, silence).invoke(fn, args, kwargs, wants_ctx)

    return call


class _ToolCall:
    """One call of a tool: a pre-started worker thread (named for the call while it runs it),
    a wake-up event, and the ways it can be cut."""

    def __init__(self, run: Run, name: str, silence_ms: int | None) -> None:
        self.run = run
        self.silence_ms = silence_ms
        self.thread_name = f"nbbudget-tool-{name}-{next(_thread_seq)}"
        self.ctx = ToolContext(run, name, self.thread_name)
        self.wake = Latch()  # set by the tool's end, a stop of the run or the watchdog
        self.ended = Latch()  # the tool's work ended (returned or raised)
        self.result: Any = None
        self.error: BaseException | None = None
        self.timer: Scheduled | None = None

    def invoke(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
            wants_ctx: bool) -> Any:
        if wants_ctx:
            kwargs = {**kwargs, "ctx": self.ctx}
        context = contextvars.copy_context()
        scope = self.run.lowlevel.scope
        scope.add_listener(self._on_run_stop)
        self._arm_watchdog()
        workers.submit(functools.partial(self._task, context, fn, args, kwargs))
        try:
            scope.clock.wait(self.wake, None)
        finally:
            scope.remove_listener(self._on_run_stop)  # bound methods compare equal
            if self.timer is not None:
                self.timer.cancel()
        return self._finish()

    def _task(self, context: contextvars.Context, fn: Callable[..., Any],
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], None]:
        """On a worker: the tool, in the caller's context, under the call's thread name; what
        wakes the caller, once the worker is idle again."""
        thread = threading.current_thread()
        name, thread.name = thread.name, self.thread_name
        try:
            context.run(self._work, fn, args, kwargs)
        finally:
            thread.name = name
        return self.wake.set

    def _work(self, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> None:
        entry = self.run.interrupt_here()  # N-5: the run's stop is raised in the tool's thread
        try:
            self.result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised in the caller
            self.error = exc
        finally:
            if entry is not None:
                self.run.interrupt_done(entry)
            self.ended.set()

    def _finish(self) -> Any:
        """The call's result, or its cut: a call cut before it finished raises the cut even if
        it finishes a moment later (what it returns after its signal is not trusted). A tool
        still running after the grace is abandoned (S2-7): its worker runs on with it."""
        if not self.ctx.signal.is_set():
            if self.error is not None:
                raise self.error
            return self.result
        by = self.ctx.cut_by or "timeout"
        core = self.run.lowlevel
        if not self.ended.wait(_ABANDON_GRACE_S):
            core.record("tool_abandoned", {"tool": self.ctx.name, "thread": self.thread_name,
                                           "by": by})
        stop = core.scope.stop
        if stop is not None:
            raise stop.signal()
        raise BudgetCut(by, f"tool {self.ctx.name} was silent for more than {self.silence_ms} ms "
                            f"and was cut by the watchdog; call ctx.progress() more often or "
                            f"raise max_silence")

    def _on_run_stop(self, stop: Stop) -> None:
        if not self.ended.is_set() and self.ctx._cut(stop.by or stop.status.value):
            self.wake.set()

    def _arm_watchdog(self) -> None:
        if self.silence_ms is None:
            return
        self.timer = self.run.lowlevel.clock.call_at(self.ctx.last_beat_ms + self.silence_ms,
                                                     self._on_silence)

    def _on_silence(self) -> None:
        if self.ended.is_set():
            return
        core = self.run.lowlevel
        silent_for = core.clock.now_ms() - self.ctx.last_beat_ms
        assert self.silence_ms is not None
        if silent_for < self.silence_ms:
            self._arm_watchdog()
            return
        if self.ctx._cut("watchdog"):
            core.record("watchdog_cut", {"tool": self.ctx.name,
                                         "silent_ms": round(silent_for, 3),
                                         "max_silence_ms": self.silence_ms})
            self.wake.set()


# N-5: the caller waiting for its tool is woken by the run's stop and raises it itself (after
# the grace in which an abandoned tool is traced): no interrupt lands in that wait
preempt.guard(_ToolCall.invoke.__code__)
