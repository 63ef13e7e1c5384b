"""The call workers: pre-started threads, handed a task each through a raw lock."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

import pytest

from nbbudget.core import workers
from nbbudget.core.clock import Latch

pytestmark = pytest.mark.usefixtures("quick_idle_workers")

SOON = 5.0


def _workers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("nbbudget-worker-")]


def test_a_worker_is_idle_again_before_what_its_task_returns_runs():
    """The caller is told only once the worker is back on the idle stack, so a caller that
    submits again at once finds it idle: the next task runs on the same thread, no new one."""
    ran_on: list[str] = []
    told = Latch()

    def second() -> Callable[[], None]:
        ran_on.append(threading.current_thread().name)
        return told.set

    def first() -> Callable[[], None]:
        ran_on.append(threading.current_thread().name)
        return lambda: workers.submit(second)  # as a caller woken by it would, at once

    workers.submit(first)
    assert told.wait(SOON)
    assert len(ran_on) == 2 and ran_on[0] == ran_on[1]


def test_every_task_runs_once_when_many_threads_submit_at_once():
    ran: list[int] = []
    lock = threading.Lock()
    count = 400
    done = threading.Semaphore(0)

    def task_of(i: int) -> workers.Task:
        def task() -> Callable[[], object]:
            with lock:
                ran.append(i)
            return done.release

        return task

    def submitter(k: int) -> None:
        for i in range(k * 100, (k + 1) * 100):
            workers.submit(task_of(i))

    threads = [threading.Thread(target=submitter, args=(k,), name=f"submitter-{k}")
               for k in range(count // 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SOON)
    for _ in range(count):
        assert done.acquire(timeout=SOON)
    assert sorted(ran) == list(range(count))


def test_idle_workers_end_after_idle_seconds():
    workers.ensure_idle(3)
    assert len(_workers_alive()) >= 3
    deadline = time.monotonic() + SOON
    while _workers_alive():
        assert time.monotonic() < deadline, "idle workers never ended"
        time.sleep(0.01)
    assert workers.idle_count() == 0
    done = Latch()
    workers.submit(lambda: done.set)  # a worker is started again when none is idle
    assert done.wait(SOON)


def test_a_latch_frees_every_waiter_and_stays_set():
    latch = Latch()
    assert not latch.wait(0.01)
    freed: list[bool] = []
    waiters = [threading.Thread(target=lambda: freed.append(latch.wait(SOON)),
                                name=f"waiter-{i}") for i in range(8)]
    for t in waiters:
        t.start()
    latch.set()
    latch.set()  # idempotent
    for t in waiters:
        t.join(SOON)
    assert freed == [True] * 8
    assert latch.is_set() and latch.wait(0)


def _open_fds() -> int:
    """The pipes this process holds open (what a worker opens: two ends each), not every
    descriptor: another test's leftovers (a socket collected late) come and go meanwhile."""
    pipes = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            pipes += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return pipes


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_worker_that_leaves_closes_its_pipe():
    """Each worker waits on a pipe of its own; one that ends after its idle spell closes it,
    so workers coming and going leave no descriptor open."""
    deadline = time.monotonic() + SOON
    while _workers_alive():
        assert time.monotonic() < deadline, "idle workers never ended"
        time.sleep(0.01)
    before = _open_fds()
    for _ in range(3):
        workers.ensure_idle(4)
        assert _open_fds() >= before + 8  # two ends of a pipe each
        while _workers_alive():
            assert time.monotonic() < deadline, "idle workers never ended"
            time.sleep(0.01)
        assert _open_fds() == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_child_made_by_fork_starts_workers_of_its_own():
    """The parent's idle workers do not exist in a child made by ``os.fork``: a call there
    must run on a worker of the child's, within its budget (not wait for one that never
    wakes), and its wall-clock timer must fire on a timer thread of the child's."""
    import nbbudget as nb

    workers.ensure_idle(2)
    assert workers.idle_count() >= 2
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never through pytest
        code = 1
        try:
            resp = nb.call(lambda: 41 + 1, detach=True, budget="5s")
            late = nb.call(time.sleep, 5, detach=True, budget="5s", timeout="200ms")
            code = 0 if resp.ok and resp.data == 42 and late.exit_code == 124 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_submit_keeps_its_spare_workers_idle():
    """``spare=1``: besides the worker given the task, one stays idle (to write a job's record
    when the call detaches), started if there was none."""
    release = threading.Event()
    done = Latch()

    def task() -> Callable[[], None]:
        release.wait(SOON)
        return done.set

    deadline = time.monotonic() + SOON
    while workers.idle_count():  # start from no idle worker at all
        assert time.monotonic() < deadline, "idle workers never ended"
        time.sleep(0.01)
    workers.submit(task, spare=1)
    assert workers.idle_count() == 1
    release.set()
    assert done.wait(SOON)


def test_a_latch_set_through_its_releaser_is_set_at_once_and_wakes_its_waiters_once_released():
    latch = Latch()
    freed: list[bool] = []
    waiter = threading.Thread(target=lambda: freed.append(latch.wait(SOON)), name="waiter")
    waiter.start()
    time.sleep(0.05)  # blocked on the latch by now (a later one would find it set at once)
    release = latch.releaser()
    assert latch.is_set() and latch.wait(0)  # set already: a waiter that looks does not block
    latch.set()  # a second setter does nothing: the lock is released once, by `release`
    release()
    waiter.join(SOON)
    assert freed == [True]
