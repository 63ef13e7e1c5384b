"""The seams of the call path: `nb.call` runs its work on the job runner and keeps its records
in the store of the backend in force (`nbbudget.calls.runner`), never on module-level state it
reaches for; the local runner reattaches and delivers exactly once under contention (S0-11)."""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.calls.call import _identity
from nbbudget.calls.runner import LOCAL, Backend, LocalRunner, Work, current_backend, use_backend
from nbbudget.testing import FakeClock, MemoryStore, use_store

SOON = 5.0

pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")


def _pausing(clock: FakeClock):
    """Work that saves a checkpoint past its budget of 1 s, so it pauses there once."""

    def crunch() -> str:
        done = nb.resume_state(0)
        if done == 0:
            assert clock.waiting.wait(SOON)
            clock.advance("2s")
            nb.checkpoint(done + 1)
        return f"finished from {done}"

    return crunch


def test_a_call_on_a_memory_store_keeps_everything_there_and_touches_no_file(home):
    memory = MemoryStore()
    clock = FakeClock()
    crunch = _pausing(clock)
    release = threading.Event()
    with use_store(memory) as in_force:
        assert in_force is memory and current_backend().store() is memory
        first = nb.call(crunch, resume=True, budget="1s", clock=clock, runs_per_day=1)
        assert first.data["state"] == "paused"
        assert memory.load_checkpoint(_identity(crunch, (), {}, None)).state == 1
        final = nb.call(crunch, resume=True, budget="1s", clock=clock, runs_per_day=1)
        assert (final.ok, final.data) == (True, "finished from 1")
        assert memory.checkpoints == {}  # delivered: the checkpoint is gone
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert memory.runs_on(_identity(crunch, (), {}, None), today) == 1
        detached = nb.call(release.wait, SOON, detach=True, budget="20ms")
        assert detached.data["state"] == "running"
        release.set()
        assert detached.job.result(timeout=SOON) is True
        _eventually(lambda: [r["state"] for r in memory.jobs()] == ["done"])
        assert nb.jobs.to_frame().loc[detached.job.id, "state"] == "done"
    assert not home.exists()  # no SQLite store was made for NBBUDGET_HOME
    assert current_backend() is LOCAL
    assert nb.call(crunch, resume=True, budget="1s", clock=FakeClock()).ok  # the SQLite store
    assert home.exists()


def _eventually(check: Any) -> None:
    deadline = time.monotonic() + SOON
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


class RecordingRunner(LocalRunner):
    """The local runner, saying which of its operations the call path used."""

    def __init__(self) -> None:
        super().__init__(nb.jobs)
        self.used: list[str] = []

    def start(self, work: Any, job: nb.Job, task: Any, *, detachable: bool) -> None:
        self.used.append("start")
        super().start(work, job, task, detachable=detachable)

    def detach(self, work: Work, job: nb.Job) -> None:
        self.used.append("detach")
        super().detach(work, job)

    def reattach(self, work: Work) -> nb.Job | None:
        found = super().reattach(work)
        self.used.append("reattach" if found is not None else "reattach: none")
        return found

    def deliver(self, work: Work, job: nb.Job) -> None:
        self.used.append("deliver")
        super().deliver(work, job)


def test_the_call_path_runs_its_work_on_the_runner_it_was_given():
    runner, memory = RecordingRunner(), MemoryStore()
    release = threading.Event()

    def crunch() -> str:
        release.wait(SOON)
        return "crunched"

    with use_backend(Backend(runner, lambda: memory)):
        first = nb.call(crunch, detach=True, budget="20ms")
        assert first.data["state"] == "running"
        assert nb.call(crunch, detach=True, budget="20ms").data["job"] == first.data["job"]
        release.set()
        assert first.job.wait_done(SOON)
        done = nb.call(crunch, detach=True, budget="1s")
    assert (done.ok, done.data) == (True, "crunched")
    assert runner.used == ["reattach: none", "start", "detach",  # the first call
                           "reattach", "detach",  # the identical call, the work still running
                           "reattach", "deliver"]  # and once it ended
    assert LOCAL.runner.reattach(_work_of(crunch)) is None  # the local runner never saw it
    _eventually(lambda: [r["state"] for r in memory.jobs()] == ["done"])


def _work_of(fn: Any) -> Work:
    class Identified:
        identity = _identity(fn, (), {}, None)
        work = (fn, (), {}, None)

    return Identified()


def _in_threads(n: int, fn: Any) -> list[Any]:
    """*fn* called at once in *n* threads, each in a copy of this context (so with the backend
    in force here): what each returned."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def one(i: int) -> None:
        barrier.wait()
        out[i] = fn()

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(one, i),
                                name=f"caller-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SOON * 2)
    return out


class SlowToDeliver(LocalRunner):
    """The local runner, with each caller held a moment before it delivers a result (as a
    thread descheduled there would be), so that every other caller comes in that moment."""

    def __init__(self) -> None:
        super().__init__(nb.jobs)

    def deliver(self, work: Work, job: nb.Job) -> None:
        time.sleep(0.05)
        super().deliver(work, job)


def test_S0_11_sixteen_identical_calls_get_one_job_and_its_result_exactly_once(any_store):
    """16 threads make the identical call to detached work: all attach to its one job; once it
    ended, 16 more get its result exactly once between them, and the others start anew."""
    runs = itertools.count(1)
    release = threading.Event()

    def crunch() -> int:
        run = next(runs)
        if run == 1:
            release.wait(SOON)
        return run

    with use_backend(Backend(SlowToDeliver(), current_backend().store)):
        first = nb.call(crunch, detach=True, budget="20ms")
        assert first.data["state"] == "running"
        waiting = _in_threads(16, lambda: nb.call(crunch, detach=True, budget="20ms"))
        assert {(r.exit_code, r.data["state"], r.data["job"]) for r in waiting} == {
            (14, "running", first.data["job"])}  # one job: none started the work again
        release.set()
        assert first.job.wait_done(SOON)
        after = _in_threads(16, lambda: nb.call(crunch, detach=True, budget="5s"))
        assert all(r.ok for r in after)
        assert sorted(r.data for r in after) == list(range(1, 17))  # the job's result (1) once
        assert nb.call(crunch, detach=True, budget="5s").data == 17  # it starts anew
