"""The table of endings (``nbbudget.core.endings``) is what every layer does: for each status, a
run or a call driven to it has the row's cause and code, stops with the row's error class and
trace event, and a call that ends so answers the row's envelope code and exit code.

Rules: S0-12 (exit codes), S2-3 (a cancel requested, then observed), S2-4 (a cut fails the run),
S3-1 (a window suspends it), S4-7 (the wall clock cancels a call), S4-8 (stops are traced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.core.endings import ENDINGS, envelope_code
from nbbudget.testing import FakeClock

pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")

SOON = 10.0


@dataclass
class Ended:
    """What one scenario observed: the run's outcome, its stop's public error (if it stopped),
    the kinds of its trace events, and the call's response (if it ran as a call)."""

    outcome: nb.Outcome
    error: BaseException | None
    events: list[str]
    response: nb.Response | None = None


def _ended(run: nb.Budget, response: nb.Response | None = None) -> Ended:
    assert run.outcome is not None
    stop = run.lowlevel.scope.stop
    return Ended(run.outcome, stop.error() if stop is not None else None,
                 [e.kind for e in run.trace.events], response)


def _called(fn: Any, clock: FakeClock, **options: Any) -> Ended:
    resp = nb.call(fn, clock=clock, **options)
    job = resp.job
    assert job is not None
    job.wait_done(SOON)
    return _ended(job.run, resp)


def completed(clock: FakeClock) -> Ended:
    return _called(lambda: nb.current().step(), clock, detach=True, budget="1s")


def incomplete(clock: FakeClock) -> Ended:
    def work() -> None:
        clock.advance("2s")
        nb.checkpoint({"done": 1})

    return _called(work, clock, resume=True, budget="1s")


def failed(clock: FakeClock) -> Ended:
    def work() -> None:
        clock.advance("2s")
        nb.current().check()

    return _called(work, clock, detach=True, budget="10s", limits=nb.Limits(run_ms=1000))


def suspended(clock: FakeClock) -> Ended:
    with nb.budget(tokens=100, suspend=True, clock=clock) as run:
        for _ in range(5):
            run.charge("tokens", 60)
    return _ended(run)


def stopped(clock: FakeClock) -> Ended:
    def work() -> None:
        nb.current().cancel("enough")
        nb.current().check()

    return _called(work, clock, detach=True, budget="1s")


def cancelled(clock: FakeClock) -> Ended:
    def work() -> None:
        clock.advance("2s")
        nb.current().check()

    return _called(work, clock, detach=True, budget="10s", timeout="1s")


SCENARIOS = {nb.Status.COMPLETED: completed, nb.Status.INCOMPLETE: incomplete,
             nb.Status.FAILED: failed, nb.Status.SUSPENDED: suspended,
             nb.Status.STOPPED: stopped, nb.Status.CANCELLED: cancelled}


def test_every_status_has_its_row_and_a_scenario() -> None:
    assert set(ENDINGS) == set(nb.Status) == set(SCENARIOS)
    assert all(row.status is status for status, row in ENDINGS.items())


@pytest.mark.parametrize("status", list(nb.Status), ids=str)
def test_a_run_driven_to_each_ending_does_what_its_row_says(status: nb.Status) -> None:
    row = ENDINGS[status]
    ended = SCENARIOS[status](FakeClock())
    assert ended.outcome.status is status
    assert ended.outcome.cause == row.cause
    if row.code is not None:
        assert ended.outcome.code == row.code
    if row.error is None:
        assert ended.error is None
    else:
        assert type(ended.error) is row.error
    if row.event is not None:
        assert row.event in ended.events
    assert "outcome" in ended.events


@pytest.mark.parametrize("status", [s for s in nb.Status if s is not nb.Status.SUSPENDED],
                         ids=str)
def test_a_call_that_ends_each_way_answers_its_rows_code_and_exit_code(status: nb.Status) -> None:
    row = ENDINGS[status]
    ended = SCENARIOS[status](FakeClock())
    resp = ended.response
    assert resp is not None
    assert resp.exit_code == row.exit_code
    assert resp.ok is (status is nb.Status.COMPLETED)
    if resp.ok or row.exit_code == 14:
        assert resp.error is None
    else:
        assert resp.error is not None
        expected = row.envelope or envelope_code(resp.job.exception())
        assert resp.error["code"] == expected


def test_S3_1_only_a_suspended_run_ends_its_own_block_quietly() -> None:
    assert [s for s, row in ENDINGS.items() if not row.raises] == [nb.Status.SUSPENDED]
    assert suspended(FakeClock()).outcome.status is nb.Status.SUSPENDED  # its block returned
    with pytest.raises(nb.BudgetCut), nb.budget(time="1s", clock=FakeClock()) as run:
        run.lowlevel.clock.advance("2s")
        run.check()
    assert run.outcome.status is nb.Status.FAILED


def test_envelope_code_names_a_cut_by_what_cut_it_and_other_errors_by_their_code() -> None:
    assert envelope_code(nb.BudgetCut("timeout", "out of time")) == "budget_cut_timeout"
    assert envelope_code(nb.BudgetCut("stream-error", "x")) == "budget_cut_stream_error"
    assert envelope_code(nb.RunsPerDayExceeded("spent")) == "RunsPerDayExceeded"
    assert envelope_code(nb.BudgetExceeded("steps", 1, 1, code="StepBudgetExceeded")) == (
        "StepBudgetExceeded")
    assert envelope_code(KeyError("k")) == "KeyError"
