"""Every refusal and every cut, on a run and on a grant, is one traced event with the limit that
was hit and what had been consumed (S2-9, S3-1, S4-7, S4-8, S4-10).

A refusal comes before dispatch (a reservation, a clamped output reserve, a whole-run total, a
window) and is a ``dispatch_refused_budget_exceeded`` event whose figures are the error's. A cut
comes after the fact (spending already done, time spent) and is a ``cut`` event naming the kind,
its limit and what was consumed. A `FakeClock` makes every figure exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock, Reply, ScriptedProvider

#: windows that suspend are kept only by the local ledger
LOCAL_WINDOWS = pytest.mark.ledgers("local", reason="windows that suspend (S3-1) are not kept on a "
                                                   "cluster's ledger")

REFUSED = "dispatch_refused_budget_exceeded"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def events(run: nb.Budget, kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in run.trace.events if e.kind == kind]


def figures(payload: dict[str, Any]) -> tuple[Any, ...]:
    return (payload["budget_kind"], payload["limit_value"], payload["consumed_value"])


@contextmanager
def scope(run: nb.Budget, where: str, **limits: Any) -> Iterator[nb.Budget]:
    """The run itself, or a grant of it with *limits* of its own."""
    if where == "run":
        yield run
    else:
        with run.grant(name="child", **limits) as child:
            yield child


# -- refusals before dispatch -------------------------------------------------------------------
@pytest.mark.parametrize("where", ["run", "grant"])
def test_S4_8_a_refused_reservation_is_traced_with_the_run_limit(clock, where, ledger):
    with nb.budget(steps=2, clock=clock, notices=None, ledger=ledger) as run, \
            scope(run, where) as work:
        work.step()
        work.step()
        with pytest.raises(nb.BudgetExceeded) as info:
            work.step()
    assert [figures(p) for p in events(run, REFUSED)] == [("steps", 2, 2)]
    assert (info.value.limit, info.value.consumed) == (2, 2)


def test_S4_8_a_refused_reservation_on_a_grant_names_the_grant_limit(clock, ledger):
    with nb.budget(steps=10, clock=clock, notices=None, ledger=ledger) as run, \
            run.grant(steps=2) as child:
        child.charge("steps", 2)
        with pytest.raises(nb.BudgetExceeded) as info:
            child.step()
    assert [figures(p) for p in events(run, REFUSED)] == [("steps", 2, 2)]
    assert (info.value.limit, info.value.consumed, info.value.scope) == (2, 2, "grant")


@pytest.mark.parametrize("where", ["run", "grant"])
def test_S2_9_S4_8_a_clamp_with_nothing_left_is_a_traced_refusal_with_the_run_limit(clock,
                                                                                   where, ledger):
    model = ScriptedProvider([Reply("x", output_tokens=100), Reply("y", output_tokens=1)])
    with nb.budget(output_tokens=100, clock=clock, notices=None, ledger=ledger) as run, \
            scope(run, where) as work:
        ask = work.provider(model, name="chat")
        ask("a", max_output_tokens=500)
        with pytest.raises(nb.BudgetExceeded) as info:
            ask("b", max_output_tokens=500)
    assert len(model.calls) == 1  # refused before dispatch
    (payload,) = events(run, REFUSED)
    assert figures(payload) == ("output_tokens", 100, 100)
    assert payload["target_ref"] == "provider:chat"
    error = info.value
    assert (error.kind, error.limit, error.consumed, error.target) == (
        "output_tokens", 100, 100, "provider:chat")
    assert str(error) == ("output_tokens for provider:chat would exceed the run's limit of 100 "
                          "(100 used, 1 more requested); raise the limit or do less work")


def test_S2_9_S4_8_a_clamp_on_a_grant_with_its_own_allowance_names_the_grant_limit(clock, ledger):
    model = ScriptedProvider([Reply("x", output_tokens=40)])
    with nb.budget(output_tokens=1000, clock=clock, notices=None, ledger=ledger) as run, \
            run.grant(output_tokens=40) as child:
        ask = child.provider(model, name="chat")
        ask("a", max_output_tokens=500)
        with pytest.raises(nb.BudgetExceeded) as info:
            ask("b", max_output_tokens=500)
    assert [figures(p) for p in events(run, REFUSED)] == [("output_tokens", 40, 40)]
    assert (info.value.limit, info.value.consumed, info.value.scope) == (40, 40, "grant")


@LOCAL_WINDOWS
@pytest.mark.parametrize("where", ["run", "grant"])
def test_S3_1_S4_8_a_spent_whole_run_total_is_a_traced_refusal_with_the_total(clock, where, ledger):
    with nb.budget(tokens=100, suspend=True, totals=nb.Limits(tokens=150), clock=clock,
                   ledger=ledger) as run:
        run.charge("tokens", 80)
        run.charge("tokens", 40)  # the window of 100 is spent: suspended
    with pytest.raises(nb.BudgetExceeded) as info, \
            nb.Budget.resume(run.state(), clock=clock, ledger=ledger) as second, \
            scope(second, where) as work:
        work.charge("tokens", 40)
        work.charge("tokens", 40)  # 160 > the total of 150
    assert [figures(p) for p in events(second, REFUSED)] == [("tokens", 150, 120)]
    assert (info.value.limit, info.value.consumed) == (150, 120)


@LOCAL_WINDOWS
@pytest.mark.parametrize("where", ["run", "grant"])
def test_S3_1_S4_8_a_spent_window_is_a_traced_refusal_with_the_window(clock, where, ledger):
    with nb.budget(tokens=100, suspend=True, clock=clock, ledger=ledger) as run, \
            scope(run, where) as work:
        work.charge("tokens", 70)
        work.charge("tokens", 40)
    assert [figures(p) for p in events(run, REFUSED)] == [("tokens", 100, 70)]
    assert (run.outcome.status, run.outcome.by) == ("suspended", "tokens")


# -- cuts after the fact ------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["run", "grant"])
def test_S4_10_spending_past_the_run_limit_is_a_traced_cut_with_the_limit(clock, where, ledger):
    model = ScriptedProvider([Reply("long", input_tokens=100, output_tokens=50)])
    with pytest.raises(nb.BudgetCut), nb.budget(tokens=120, clock=clock, ledger=ledger) as run, \
            scope(run, where) as work:
        work.provider(model, name="chat")("a")
    (cut,) = events(run, "cut")
    assert figures(cut) == ("tokens", 120, 150)
    assert cut["by"] == "tokens"


def test_S4_10_spending_past_a_grant_limit_is_a_traced_cut_with_the_grant_limit(clock, ledger):
    model = ScriptedProvider([Reply("long", input_tokens=100, output_tokens=50)])
    with pytest.raises(nb.BudgetCut), nb.budget(tokens=1000, clock=clock, ledger=ledger) as run, \
            run.grant(tokens=120) as child:
        child.provider(model, name="chat")("a")
    (cut,) = events(run, "cut")
    assert figures(cut) == ("tokens", 120, 150)


@pytest.mark.parametrize("where", ["run", "grant"])
def test_S4_7_spent_time_is_a_traced_cut_with_the_time_grant(clock, where, ledger):
    with pytest.raises(nb.BudgetCut), nb.budget(time="5s", clock=clock, ledger=ledger) as run, \
            scope(run, where) as work:
        clock.advance("5s")
        work.step()
    (cut,) = events(run, "cut")
    assert figures(cut) == ("run_ms", 5000, 5000)
    assert cut["by"] == "timeout"


def test_S4_7_a_grant_whose_own_time_is_spent_is_a_traced_cut_with_its_grant(clock, ledger):
    with pytest.raises(nb.BudgetCut), nb.budget(time="5s", clock=clock, ledger=ledger) as run, \
            run.grant(time="2s") as child:
        clock.advance("2s")
        child.step()
    (cut,) = events(run, "cut")
    assert figures(cut) == ("run_ms", 2000, 2000)
