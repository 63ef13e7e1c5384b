"""The usual call that may detach (S0-1, S0-2, S0-11): one object is its plan, its run (made on
first use) and the slot its worker hands the result to; its job is made only when something
needs one. These tests hold that it is still exactly the call of the rules: the result goes out
once, to the caller or to the job; the job, whenever it is made, is one job that says how the
work ended; and ``nb.current()`` in the work is the call's run."""

from __future__ import annotations

import contextvars
import gc
import threading
import time

import pytest

import nbbudget as nb
from nbbudget.calls.call import current_call
from nbbudget.calls.jobs import JobState
from nbbudget.calls.runner import LOCAL

pytestmark = pytest.mark.usefixtures("home", "quick_idle_workers")

SOON = 10.0


def test_a_call_that_ended_in_time_gives_a_job_when_asked_that_says_how_it_ended():
    resp = nb.call(lambda: 42, detach=True, budget="30s")
    assert resp.ok and resp.data == 42 and resp.exit_code == 0
    assert resp.meta["budget_ms"] == 30_000 and resp.meta["duration_ms"] >= 0
    job = resp.job  # made now, from the call
    assert job is resp.job  # once
    assert job.done() and job.wait_done(0) and job.state is JobState.DONE
    assert job.result(timeout=0) == 42 and job.exception() is None
    assert job.run.outcome == nb.Outcome(nb.Status.COMPLETED)
    assert job not in list(nb.jobs)  # it never detached: nothing to list


def test_each_result_goes_out_exactly_once_when_the_work_ends_as_its_budget_runs_out():
    """The budget (1 ms) and the work (0.6 to 1.4 ms) race: the caller detaches the work while the
    worker hands its result over. Each value reaches exactly one taker: the caller, or the job
    the caller was answered with; no job is left kept for an identical call."""
    def work(i: int) -> int:  # from 0.6 to 1.4 ms (off the GIL): some end before the budget
        time.sleep(0.0006 + (i % 9) * 0.0001)
        return i

    kept = LOCAL.runner.attached()  # what earlier work left kept, if anything
    direct = detached = 0
    resp = job = None
    for i in range(300):
        resp = nb.call(work, i, detach=True, budget=1)
        if resp.ok:
            assert resp.data == i and resp.job.result(timeout=0) == i
            direct += 1
        else:
            assert resp.exit_code == 14 and resp.data["state"] == "running"
            job = nb.jobs[resp.data["job"]]
            assert job is resp.job
            assert job.result(timeout=SOON) == i and job.state is JobState.DONE
            detached += 1
    assert direct + detached == 300
    del resp, job  # a job whose result was taken is kept only while something holds it
    gc.collect()
    assert LOCAL.runner.attached() <= kept


def test_threads_of_the_work_asking_for_its_job_at_once_get_one_job_the_response_carries():
    seen: list[object] = []
    lock = threading.Lock()

    def work() -> str:
        call = current_call()
        assert call is not None
        go = threading.Barrier(8)

        def ask() -> None:
            go.wait(SOON)
            job = call.job
            with lock:
                seen.append(job)

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(ask,),
                                    name=f"asker-{k}") for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SOON)
        return "done"

    resp = nb.call(work, detach=True, budget="30s")
    assert resp.ok and resp.data == "done"
    assert len(seen) == 8 and all(job is seen[0] for job in seen)
    assert resp.job is seen[0] and resp.job.state is JobState.DONE
    assert resp.job.result(timeout=0) == "done"


def test_a_job_made_while_the_work_runs_is_settled_by_the_work_when_it_ends():
    calls: list = []
    started = threading.Event()
    go_on = threading.Event()

    def work() -> int:
        calls.append(current_call())
        started.set()
        go_on.wait(SOON)
        return 7

    outcome: list[nb.Response] = []
    caller = threading.Thread(target=lambda: outcome.append(
        nb.call(work, detach=True, budget="30s")), name="caller")
    caller.start()
    assert started.wait(SOON)
    job = calls[0].job  # made from another thread while the work runs
    assert not job.done() and job.state is JobState.RUNNING
    go_on.set()
    caller.join(SOON)
    assert job.wait_done(SOON) and job.state is JobState.DONE and job.result() == 7
    assert outcome and outcome[0].ok and outcome[0].data == 7 and outcome[0].job is job


def test_an_error_of_the_work_is_answered_with_its_code_and_kept_with_its_traceback():
    def work() -> None:
        raise ValueError("bad input 3")

    resp = nb.call(work, detach=True, budget="30s")
    assert not resp.ok and resp.exit_code == 1
    assert resp.error is not None and resp.error["message"] == "bad input 3"
    assert isinstance(resp.job.exception(), ValueError)
    assert "bad input 3" in resp.job.traceback and resp.job.state is JobState.FAILED


def test_current_in_the_work_is_the_calls_run_in_its_threads_and_around_nested_runs():
    seen: dict[str, object] = {}

    def work() -> None:
        run = nb.current()
        seen["run"] = run
        with nb.budget(nb.Limits(steps=2), name="inner") as inner:
            seen["inner"] = nb.current() is inner
        seen["after"] = nb.current()
        t = threading.Thread(target=contextvars.copy_context().run,
                             args=(lambda: seen.__setitem__("thread", nb.current()),),
                             name="work-thread")
        t.start()
        t.join(SOON)
        run.step()

    resp = nb.call(work, detach=True, budget="30s", limits=nb.Limits(steps=5))
    assert resp.ok
    run = seen["run"]
    assert isinstance(run, nb.Budget) and run.limits.steps == 5
    assert seen["inner"] is True and seen["after"] is run and seen["thread"] is run
    assert resp.job.run is run and run.consumed["steps"] == 1
    assert nb.current() is None  # nothing leaks into the caller's context


class _Counted:
    """An argument that counts how often it is pickled: a call pickles its arguments only to
    work out its identity."""

    pickled = 0

    def __reduce__(self):
        _Counted.pickled += 1
        return (_Counted, ())


def test_a_kept_job_makes_only_calls_of_its_own_kind_work_out_their_identity():
    """While a detached job waits for its identical call, a call of another function works
    out no identity (hashing every call's arguments would cost each of them); a call of the
    same function does, and finds the job when it is the identical call (S0-11)."""
    gate = threading.Event()

    def kept(n: int) -> int:
        gate.wait(SOON)
        return n

    def other(arg: object) -> str:
        return "other"

    first = nb.call(kept, 1, detach=True, budget=1)
    assert first.exit_code == 14
    _Counted.pickled = 0
    assert nb.call(other, _Counted(), detach=True, budget="5s").data == "other"
    assert _Counted.pickled == 0  # another kind: no identity worked out
    gate.set()
    again = nb.call(kept, 1, detach=True, budget="5s")  # the identical call: reattaches
    assert again.ok and again.data == 1 and again.job is first.job
    gate.clear()
    assert nb.call(kept, 2, detach=True, budget=1).exit_code == 14  # kept again, as `kept`
    assert nb.call(kept, _Counted(), detach=True, budget="5s").exit_code in (0, 14)
    assert _Counted.pickled >= 1  # its own kind: its identity is worked out to compare
    gate.set()
