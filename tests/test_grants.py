"""Grants: a child's own allowances, its deadline, and inherited cancellation (S2-1, S2-2, S2-3)."""

from __future__ import annotations

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_S2_1_a_child_deadline_is_the_smaller_of_its_grant_and_the_callers_remaining(clock, ledger):
    """The seed's example: root {steps 8, 30 s}, 10 s later a child {steps 4, 25 s} gets 20 s."""
    with nb.budget(steps=8, time="30s", clock=clock, ledger=ledger) as run:
        clock.advance("10s")
        child = run.grant(steps=4, time="25s")
        assert child.remaining_ms == 20_000
        short = run.grant(time="5s")
        assert short.remaining_ms == 5_000
        with short, child:
            clock.advance("4s")
            assert (short.remaining_ms, child.remaining_ms, run.remaining_ms) == (
                1_000, 16_000, 16_000)


def test_S2_1_a_child_with_a_shorter_grant_fails_alone_and_its_caller_goes_on(clock, ledger):
    with nb.budget(time="30s", clock=clock, ledger=ledger) as run:
        with pytest.raises(nb.BudgetCut) as info, run.grant(time="2s", name="lookup") as child:
            clock.advance("3s")
            child.check()
        assert info.value.by == "timeout"
        assert str(info.value) == ("lookup ran out of time: its time grant of 2000 ms is spent; "
                                   "give it more time or do less work")
        assert (child.outcome.status, child.outcome.cause, child.outcome.by) == (
            "failed", "budget-cut", "timeout")
        run.check()  # the caller still has time
        run.step()
    assert run.outcome.status == "completed"


def test_S2_1_a_grant_never_outlives_its_caller(clock, ledger):
    with pytest.raises(nb.BudgetCut), nb.budget(time="5s", clock=clock, ledger=ledger) as run:
        child = run.grant(time="1h")
        assert child.remaining_ms == 5_000
        with child:
            clock.advance("5s")
            child.step()
    assert run.outcome.by == "timeout"
    assert (child.outcome.status, child.outcome.by, child.outcome.origin) == (
        "failed", "timeout", "run")


def test_S2_2_child_steps_do_not_count_against_the_parents_grant(clock, ledger):
    with nb.budget(clock=clock, ledger=ledger) as run:
        parent = run.grant(steps=3, name="planner")
        with parent:
            parent.step()
            with parent.grant(steps=5, name="worker") as worker:
                for _ in range(5):
                    worker.step()
            parent.step()
            parent.step()
            assert parent.consumed == {"steps": 3}
            assert worker.consumed == {"steps": 5}
    assert run.consumed == {"steps": 8}  # the run's counters count everything (S4-3)


def test_S2_2_run_wide_limits_still_count_every_descendant(clock, ledger):
    with nb.budget(steps=6, clock=clock, ledger=ledger) as run:
        run.step()
        with run.grant(steps=10) as child:
            for _ in range(5):
                child.step()
            assert child.remaining("steps") == 0  # the run has none left
            with pytest.raises(nb.BudgetExceeded) as info:
                child.step()
    assert (info.value.scope, info.value.limit, info.value.consumed) == ("run", 6, 6)
    assert run.consumed == {"steps": 6}


def test_a_grant_refusal_names_the_grant(clock, ledger):
    with nb.budget(clock=clock, ledger=ledger) as run, run.grant(tool_calls=1) as child:
        child.charge("tool_calls", target="tool:fetch")
        with pytest.raises(nb.BudgetExceeded) as info:
            child.charge("tool_calls", target="tool:fetch")
    assert info.value.scope == "grant"
    assert str(info.value) == ("tool_calls for tool:fetch would exceed this grant's limit of 1 "
                               "(1 used, 1 more requested); raise the limit or do less work")
    assert run.consumed == {"tool_calls": 1}


def test_remaining_is_the_smaller_of_the_grant_and_the_run(clock, ledger):
    with nb.budget(steps=10, tokens=100, clock=clock, ledger=ledger) as run:
        run.charge("steps", 7)
        child = run.grant(steps=5, tokens=500)
        assert child.remaining("steps") == 3
        assert child.remaining("tokens") == 100
        assert child.remaining("tool_calls") == float("inf")


def test_S2_3_cancelling_a_run_stops_every_descendant(clock, ledger):
    with pytest.raises(nb.Cancelled), nb.budget(clock=clock, ledger=ledger) as run:
        a = run.grant(name="a")
        b = a.grant(name="b")
        with a, b:
            run.cancel("user pressed stop")
            for g in (a, b):
                assert g.cancelled
            b.step()
    for g in (a, b):
        assert (g.outcome.status, g.outcome.origin) == ("stopped", "run")
    assert run.outcome.status == "stopped"
    assert run.outcome.origin is None


def test_S2_3_a_grant_made_after_the_stop_is_stopped_too(clock, ledger):
    run = nb.budget(clock=clock, ledger=ledger)
    run.cancel()
    assert run.grant().cancelled


def test_S2_3_a_stopped_child_is_reported_to_its_caller_as_stopped_and_the_caller_goes_on(
        clock, ledger):
    attempts = []
    with nb.budget(clock=clock, ledger=ledger) as run:
        child = run.grant(name="search")
        with pytest.raises(nb.Cancelled) as info, child:
            attempts.append(1)
            child.cancel("not needed")
            child.step()
        run.step()
    assert len(attempts) == 1  # never retried
    assert info.value.outcome.status == "stopped"
    assert run.outcome.status == "completed"
    assert not run.cancelled


def test_cancelling_a_child_does_not_stop_its_parent_or_siblings(clock, ledger):
    with nb.budget(clock=clock, ledger=ledger) as run:
        a, b = run.grant(), run.grant()
        a.cancel()
        b.step()
        run.step()
        assert (a.cancelled, b.cancelled, run.cancelled) == (True, False, False)


def test_a_grant_used_without_with_surfaces_its_stop_at_the_caller(clock, ledger):
    with pytest.raises(nb.BudgetCut) as info, \
            nb.budget(time="1h", clock=clock, ledger=ledger) as run:
        child = run.grant(time="1s")
        clock.advance("2s")
        child.step()
    assert info.value.by == "timeout"
    assert run.outcome.origin == child.name


def test_the_trace_records_each_grant_with_its_parent(clock, ledger):
    with nb.budget(clock=clock, name="root", ledger=ledger) as run:
        run.grant(steps=2, time="1s", name="child")
    grants = [e.payload for e in run.trace.events if e.kind == "grant"]
    assert grants == [{"parent": "root", "limits": {"run_ms": 1000, "steps": 2},
                       "time_ms": 1000}]


def test_grants_left_open_end_with_their_parent_and_cancel_their_timers(clock, ledger):
    with nb.budget(clock=clock, name="root", ledger=ledger) as run:
        child = run.grant(time="1h", name="never-entered")
        grandchild = child.grant(time="30m")
    assert clock.pending() == 0
    assert (child.outcome.status, child.outcome.origin) == ("completed", "root")
    assert grandchild.outcome.status == "completed"
