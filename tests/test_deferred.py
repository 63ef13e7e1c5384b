"""A run made on first use (`nbbudget.run.budget.Deferred`): the run of a call whose work
never uses it costs nothing, and is the same run as an entered one would be once anything
reads it."""

from __future__ import annotations

import threading

import pytest

import nbbudget as nb
from nbbudget.core.clock import default_clock
from nbbudget.run.budget import Deferred
from nbbudget.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def deferred(clock: FakeClock, **fields: object) -> Deferred:
    return Deferred(nb.Limits(**fields), clock=clock, name="work")  # type: ignore[arg-type]


def test_work_that_never_uses_its_run_makes_none_and_the_run_read_later_has_its_times(clock):
    d = deferred(clock, steps=5)
    with d:
        clock.advance(250)
    assert d.made() is None  # nothing was built for it
    run = d.run
    assert run.outcome == nb.Outcome(nb.Status.COMPLETED)
    assert run.snapshot().status == "completed"
    assert run.snapshot().elapsed_ms == pytest.approx(250)
    assert run.consumed == {"run_ms": 250}
    assert d.run is run  # made once


def test_current_inside_the_work_makes_the_run_begun_when_the_work_began(clock):
    d = deferred(clock, steps=3)
    assert nb.current() is None
    with d:
        clock.advance(100)
        run = nb.current()
        assert run is not None and run is d.run and run is nb.current()
        run.step()
        run.step()
        clock.advance(50)
    assert nb.current() is None
    assert run.outcome == nb.Outcome(nb.Status.COMPLETED)
    assert run.consumed["steps"] == 2
    assert run.snapshot().elapsed_ms == pytest.approx(150)


def test_a_stop_in_the_work_leaves_as_the_public_error_with_the_runs_outcome(clock):
    d = deferred(clock, steps=1)
    with pytest.raises(nb.BudgetExceeded) as caught, d:
        nb.current().step()
        nb.current().step()
    assert caught.value.outcome is d.run.outcome
    assert d.run.outcome.status is nb.Status.FAILED and d.run.outcome.by == "steps"


def test_an_error_of_the_work_fails_the_run_even_if_the_work_never_used_it(clock):
    d = deferred(clock)
    with pytest.raises(ValueError), d:
        raise ValueError("boom")
    assert d.made() is not None
    assert d.run.outcome.status is nb.Status.FAILED


def test_a_run_whose_time_is_limited_is_made_at_once_and_its_clock_runs_from_its_start(clock):
    d = deferred(clock, run_ms=1000)
    assert d.made() is not None
    with d:
        clock.advance(400)
        assert nb.current().remaining_ms == pytest.approx(600)
    assert d.run.outcome == nb.Outcome(nb.Status.COMPLETED)


def test_a_run_read_from_another_thread_while_the_work_ends_is_made_once_and_ends_once():
    """The race of `Deferred.end` (the work's thread) and `Deferred.run` (the caller's, say on
    an interrupt), over many rounds: whichever comes first, one run, completed once."""
    def reader(d: Deferred, go: threading.Barrier, seen: list[nb.Budget]) -> None:
        go.wait()
        seen.append(d.run)

    for _ in range(300):
        d = Deferred(nb.Limits(steps=10), clock=default_clock(), name="race")
        go = threading.Barrier(2)
        seen: list[nb.Budget] = []
        t = threading.Thread(target=reader, args=(d, go, seen), name="deferred-reader")
        t.start()
        d.begin()
        go.wait()
        d.end(None)
        t.join()
        run = d.run
        assert seen == [run]
        assert run.outcome == nb.Outcome(nb.Status.COMPLETED)
        assert [e.kind for e in run.trace.events].count("outcome") == 1


def test_a_call_whose_work_never_uses_its_run_makes_none_until_its_job_is_asked():
    resp = nb.call(lambda: 42, detach=True, budget="30s")
    assert resp.ok and resp.data == 42
    assert resp.job.run_made() is None
    assert resp.job.run.outcome == nb.Outcome(nb.Status.COMPLETED)


def test_a_call_whose_work_uses_its_run_sees_its_limits():
    def work() -> int:
        run = nb.current()
        run.step()
        return run.limits.steps

    resp = nb.call(work, detach=True, budget="30s", limits=nb.Limits(steps=4))
    assert resp.ok and resp.data == 4
    assert resp.job.run_made() is not None
    assert resp.job.run.consumed["steps"] == 1
