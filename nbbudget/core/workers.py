"""Pre-started worker threads for calls and tools, so a timed path never pays
``Thread.start()``.

An idle worker blocks reading a pipe of its own; `submit` takes the last idle worker off the
idle stack, hands it the task and writes one byte to its pipe (no queue and no Condition). The
write is the handoff because it lets go of the GIL: the worker wakes to a free GIL, where a
woken thread that found its waker still holding the GIL could only wait for it and switch back
(two more thread switches per handoff, most of a trivial call's cost). On Linux a pipe's
wake-up also tells the scheduler that the writer is about to wait, so the worker runs on the
writer's core rather than waking an idle one.

A worker whose task runs past its caller's budget simply keeps running it (the caller has
gone), and the pool starts another when a task finds no idle worker. A task returns what should
happen once the worker is free again (typically: wake the caller): the worker puts itself back
on the idle stack first, so a caller that submits again at once always finds an idle worker.
Idle workers end after ``IDLE_SECONDS`` (a timer on the process's clock takes them off the idle
stack and tells them to leave): an idle process holds no thread. In a child made by
``os.fork`` the parent's workers do not exist: the child forgets them and starts its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable

from .clock import Scheduled, default_clock

__all__ = ["IDLE_SECONDS", "Task", "ensure_idle", "idle_count", "submit"]

IDLE_SECONDS = 1.0

#: a task runs on a worker and returns what to do once that worker is counted idle (or None)
Task = Callable[[], Callable[[], object] | None]

_WAKE = b"\0"


class _Worker:
    """One worker thread: it blocks reading its pipe while it has no task; `submit` writes
    to it. *leaving*: the reaper took it off the idle stack, and it ends when woken."""

    __slots__ = ("idle_since", "leaving", "read", "task", "write")

    def __init__(self, task: Task | None) -> None:
        self.task = task
        self.leaving = False
        self.idle_since = 0.0
        self.read, self.write = os.pipe()


_idle: list[_Worker] = []  # a stack: list.append, list.pop and list.remove are atomic
_names = itertools.count(1)
_reaping = threading.Lock()  # arms the reaper once
_reaper: Scheduled | None = None


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
    os.write(worker.write, _WAKE)


def ensure_idle(n: int) -> None:
    """Start workers until *n* are idle, so that tasks submitted later (when a busy thread may
    hold the GIL) only hand over: ``Thread.start()`` waits for the new thread, which costs a GIL
    switch interval or more each time the GIL is contended."""
    while len(_idle) < n:
        worker = _Worker(None)
        worker.idle_since = time.monotonic()
        _idle.append(worker)  # counted idle from now: it will wait on its pipe
        _start(worker)
        _arm_reaper()


def idle_count() -> int:
    """How many workers are idle now."""
    return len(_idle)


def _start(worker: _Worker) -> None:
    threading.Thread(target=_work, args=(worker,), name=f"nbbudget-worker-{next(_names)}",
                     daemon=True).start()


def _work(worker: _Worker) -> None:
    read = worker.read
    try:
        while True:
            task, worker.task = worker.task, None
            if task is not None:
                then = task()
                # an idle worker holds nothing of its last task (its job, its run): freed before
                # its caller is told, which waits for this thread to block before it can go on
                del task
                worker.idle_since = time.monotonic()
                _idle.append(worker)  # idle before its caller is told: the next call finds it
                if _reaper is None:
                    _arm_reaper()
                if then is not None:
                    then()
                    then = None
            elif worker.leaving:
                return
            os.read(read, 1)  # until handed a task, or told to leave
    finally:
        os.close(worker.read)
        os.close(worker.write)


def _arm_reaper() -> None:
    """Make sure a timer will end the workers that stay idle for ``IDLE_SECONDS``."""
    global _reaper
    with _reaping:
        if _reaper is None and _idle:
            _reaper = default_clock().call_at(default_clock().now_ms() + IDLE_SECONDS * 1000,
                                              _reap)


def _reap() -> None:
    """On the clock's timer thread: tell each worker idle for ``IDLE_SECONDS`` to leave (one
    `submit` took meanwhile is not idle any more), then look again when the next one would be
    due, or stop looking when none is idle."""
    global _reaper
    now = time.monotonic()
    for worker in list(_idle):
        if now - worker.idle_since >= IDLE_SECONDS and _leave(worker):
            worker.leaving = True
            os.write(worker.write, _WAKE)
    with _reaping:
        _reaper = None
        if _idle:
            due = min((w.idle_since for w in list(_idle)), default=now) + IDLE_SECONDS
            _reaper = default_clock().call_at(
                default_clock().now_ms() + max(0.0, due - time.monotonic()) * 1000, _reap)


def _leave(worker: _Worker) -> bool:
    """Take *worker* off the idle stack; False when `submit` took it first (its task is
    coming)."""
    try:
        _idle.remove(worker)
    except ValueError:
        return False
    return True


def _forget_after_fork() -> None:
    """In a child made by ``os.fork``: the parent's workers (and its reaper's timer) do not
    exist here; their pipes are closed, and the child starts workers of its own."""
    global _reaper
    for worker in _idle:
        for fd in (worker.read, worker.write):
            with contextlib.suppress(OSError):  # closed already
                os.close(fd)
    _idle.clear()
    _reaper = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
