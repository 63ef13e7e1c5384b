"""Windows that suspend, frozen totals, and the ledger state a checkpoint holds
(S3-1, S3-5, S4-4, S4-5)."""

from __future__ import annotations

import json

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock

#: windows that suspend are kept only by the local ledger
LOCAL_WINDOWS = pytest.mark.ledgers("local", reason="windows that suspend (S3-1) are not kept on a "
                                                   "cluster's ledger")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@LOCAL_WINDOWS
def test_S3_1_an_exhausted_window_suspends_the_run_instead_of_failing_it(clock, ledger):
    done = []
    with nb.budget(tokens=100, suspend=True, clock=clock, ledger=ledger) as run:
        for i in range(10):
            run.charge("tokens", 30)
            done.append(i)
    assert done == [0, 1, 2]
    assert (run.outcome.status, run.outcome.cause, run.outcome.by) == (
        "suspended", "window", "tokens")
    assert run.consumed == {"tokens": 90}


@LOCAL_WINDOWS
def test_S3_1_a_resume_gets_the_next_window_of_the_same_size_and_keeps_the_counters(clock, ledger):
    with nb.budget(tokens=100, suspend=True, totals=nb.Limits(tokens=250), clock=clock,
                   ledger=ledger) as run:
        while True:
            run.charge("tokens", 30)
    state = json.loads(json.dumps(run.state()))  # a checkpoint survives JSON
    with nb.Budget.resume(state, clock=clock, ledger=ledger) as second:
        assert second.remaining("tokens") == 100
        for _ in range(4):
            second.charge("tokens", 30)  # the fourth would pass the second window
    assert second.outcome.status == "suspended"
    assert second.consumed == {"tokens": 180}


@LOCAL_WINDOWS
def test_S3_1_whole_run_totals_are_frozen_and_fail_loudly_when_spent(clock, ledger):
    state = None
    with nb.budget(tokens=100, suspend=True, totals=nb.Limits(tokens=150), clock=clock,
                   ledger=ledger) as run:
        while True:
            run.charge("tokens", 40)
    state = run.state()
    with pytest.raises(nb.BudgetExceeded) as info, \
            nb.Budget.resume(state, clock=clock, ledger=ledger) as second:
        second.charge("tokens", 40)
        second.charge("tokens", 40)  # 160 > the total of 150
    assert (info.value.limit, info.value.consumed) == (150, 120)
    assert (second.outcome.status, second.outcome.by) == ("failed", "tokens")


@LOCAL_WINDOWS
def test_S3_1_a_time_window_suspends_and_the_resume_gets_a_fresh_one(clock, ledger):
    with nb.budget(time="10s", suspend=True, clock=clock, ledger=ledger) as run:
        clock.advance("10s")
        run.step()
    assert (run.outcome.status, run.outcome.by) == ("suspended", "run_ms")
    with nb.Budget.resume(run.state(), clock=clock, ledger=ledger) as second:
        assert second.remaining_ms == 10_000
        clock.advance("9s")
        second.step()
    assert second.outcome.status == "completed"
    assert second.consumed["run_ms"] == 19_000


@LOCAL_WINDOWS
def test_S3_1_windows_never_refresh_count_limits(clock, ledger):
    with nb.budget(steps=5, tokens=10, suspend=True, clock=clock, ledger=ledger) as run:
        run.charge("steps", 3)
        run.charge("tokens", 10)
        run.charge("tokens", 1)
    with pytest.raises(nb.BudgetExceeded), \
            nb.Budget.resume(run.state(), clock=clock, ledger=ledger) as second:
        second.charge("steps", 3)  # steps are not a window: 6 > 5
    assert second.outcome.status == "failed"


@LOCAL_WINDOWS
def test_S3_5_notices_never_fire_on_a_window_that_suspends(clock, ledger):
    with nb.budget(tokens=100, steps=10, suspend=True, clock=clock, ledger=ledger) as run:
        run.charge("tokens", 99)
        run.charge("steps", 10)
    notices = [e.payload["budget_kind"] for e in run.trace.events if e.kind == "approach_notice"]
    assert notices == ["steps", "steps"]


def test_S4_4_resuming_never_resets_a_budget(clock, ledger):
    with nb.budget(steps=10, time="10s", clock=clock, ledger=ledger) as run:
        run.charge("steps", 6)
        clock.advance("4s")
    with nb.Budget.resume(run.state(), clock=clock, ledger=ledger) as second:
        assert second.remaining("steps") == 4
        assert second.remaining_ms == 6_000
        assert second.consumed == {"steps": 6, "run_ms": 4_000}


def test_S4_4_saved_and_current_limits_combine_by_minimum(clock, ledger):
    with nb.budget(steps=10, tool_calls=5, clock=clock, ledger=ledger) as run:
        run.charge("steps", 6)
    # removing or raising a limit gives nothing; lowering one takes effect
    second = nb.Budget.resume(run.state(), nb.Limits(steps=100, tool_calls=3), clock=clock,
                              ledger=ledger)
    assert second.limits == nb.Limits(steps=10, tool_calls=3)
    assert second.remaining("steps") == 4


def test_S4_4_the_state_holds_counters_active_time_limits_and_notices(clock, ledger):
    with nb.budget(steps=10, time="10s", name="etl", clock=clock, ledger=ledger) as run:
        run.charge("steps", 9)
        clock.advance("2s")
        with run.paused():
            clock.advance("1h")
    assert run.state() == {
        "version": "nbbudget-ledger-v1", "name": "etl",
        "limits": {"run_ms": 10_000, "steps": 10}, "totals": {}, "suspend": False,
        "counts": {"steps": 9}, "active_ms": 2_000, "notice_level": 1,
        "notices": [0.8, 0.95],
    }


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.pop("counts"), "ledger state lacks counts; it is refused unchanged"),
    (lambda s: s.update(version="nbbudget-ledger-v0"),
     "ledger state version 'nbbudget-ledger-v0' is not 'nbbudget-ledger-v1'"),
    (lambda s: s.pop("version"), "ledger state version None is not"),
])
def test_S4_5_a_state_without_the_complete_ledger_is_refused_unchanged(clock, damage, message,
                                                                       ledger):
    with nb.budget(steps=10, clock=clock, ledger=ledger) as run:
        run.step()
    state = run.state()
    damage(state)
    before = json.dumps(state, sort_keys=True)
    with pytest.raises(nb.ConfigError, match=message):
        nb.Budget.resume(state, clock=clock, ledger=ledger)
    assert json.dumps(state, sort_keys=True) == before


def test_a_grant_has_no_state_of_its_own(clock, ledger):
    with nb.budget(clock=clock, ledger=ledger) as run, \
            pytest.raises(nb.ConfigError, match="is a grant"):
        run.grant().state()


def test_a_resumed_run_says_so_in_its_trace(clock, ledger):
    with nb.budget(steps=10, clock=clock, ledger=ledger) as run:
        run.charge("steps", 2)
    second = nb.Budget.resume(run.state(), clock=clock, ledger=ledger)
    assert [e.kind for e in second.trace.events] == ["resumed"]
