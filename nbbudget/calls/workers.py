"""Pre-started worker threads for calls, so the timed path never pays ``Thread.start()``.

An idle worker blocks on a lock of its own; `submit` takes the last idle worker off the idle
stack, hands it the task and releases its lock (one futex wake, no queue and no Condition). A
worker whose task runs past its caller's budget simply keeps running it (the caller has gone),
and the pool starts another when a task finds no idle worker. A task returns what should happen
once the worker is free again (typically: wake the caller): the worker puts itself back on the
idle stack first, so a caller that submits again at once always finds an idle worker. Idle
workers end after ``IDLE_SECONDS``: an idle process holds no thread.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable

__all__ = ["IDLE_SECONDS", "Task", "ensure_idle", "idle_count", "submit"]

IDLE_SECONDS = 1.0

#: a task runs on a worker and returns what to do once that worker is counted idle (or None)
Task = Callable[[], Callable[[], object] | None]


class _Worker:
    """One worker thread: its lock is held while it has no task; `submit` releases it."""

    __slots__ = ("task", "wake")

    def __init__(self, task: Task | None) -> None:
        self.task = task
        self.wake = threading.Lock()
        self.wake.acquire()


_idle: list[_Worker] = []  # a stack: list.append, list.pop and list.remove are atomic
_names = itertools.count(1)


def submit(task: Task, spare: int = 0) -> None:
    """Run *task* on a worker thread (an idle one if there is one), keeping *spare* workers
    idle besides (`ensure_idle`)."""
    if len(_idle) <= spare:
        ensure_idle(spare + 1)
    try:
        worker = _idle.pop()
    except IndexError:
        _start(_Worker(task))
        return
    worker.task = task
    worker.wake.release()


def ensure_idle(n: int) -> None:
    """Start workers until *n* are idle, so that tasks submitted later (when a busy thread may
    hold the GIL) only hand over: ``Thread.start()`` waits for the new thread, which costs a GIL
    switch interval or more each time the GIL is contended."""
    while len(_idle) < n:
        worker = _Worker(None)
        _idle.append(worker)  # counted idle from now: it will wait on its lock
        _start(worker)


def idle_count() -> int:
    """How many workers are idle now."""
    return len(_idle)


def _start(worker: _Worker) -> None:
    threading.Thread(target=_work, args=(worker,), name=f"nbbudget-worker-{next(_names)}",
                     daemon=True).start()


def _work(worker: _Worker) -> None:
    _as_batch()
    wake = worker.wake
    while True:
        task, worker.task = worker.task, None
        if task is not None:
            then = task()
            # an idle worker holds nothing of its last task (its job, its run): freed before its
            # caller is told, which waits for this thread to block before it can go on
            del task
            _idle.append(worker)  # idle before its caller is told: the next call finds it
            if then is not None:
                then()
                then = None
        if not wake.acquire(True, IDLE_SECONDS) and _leave(worker):  # (positional: faster)
            return


def _as_batch() -> None:
    """Mark this worker thread as batch work for the operating system's scheduler (Linux's
    ``SCHED_BATCH``; elsewhere, or where it is refused, nothing changes). Waking such a thread
    never preempts the thread that woke it: a caller handing over a task still holds the GIL,
    so a worker run at once could only wait for the GIL and switch back, two more thread
    switches per handoff (most of a trivial call's cost, measured pinned to one core). Its
    share of the processor is the same; only a wake-up waits for the running thread's turn to
    end. Threads the work starts inherit the policy, as threads do."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused (a sandbox): as it was
        pass


def _leave(worker: _Worker) -> bool:
    """After an idle spell: leave, unless a task was handed over meanwhile (then wait for it)."""
    try:
        _idle.remove(worker)
    except ValueError:  # submit took it off the stack: its task is coming
        worker.wake.acquire()
        return False
    return True
