"""Sub-agents and parallel branches: shared counters, bounds, and cuts that spare the other
branches (S2-1, S2-3, S2-5, S4-3, S4-8, S4-11)."""

from __future__ import annotations

import functools
import threading
import time

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_S4_3_sixteen_branches_racing_for_the_last_ten_permits_get_exactly_ten(clock):
    """1000 rounds: each round, exactly 10 of 16 branches get a tool call; the other 6 are
    refused with the S4-8 payload."""
    def branch(run: nb.Budget, barrier: threading.Barrier) -> bool:
        barrier.wait()
        try:
            run.charge("tool_calls", target="tool:search")
            return True
        except nb.BudgetExceeded:
            return False

    for _ in range(1000):
        with nb.budget(tool_calls=10, clock=clock, notices=None) as run:
            barrier = threading.Barrier(16)
            granted = run.parallel([functools.partial(branch, run, barrier)] * 16)
        assert granted.count(True) == 10
        refusals = [e.payload for e in run.trace.events
                    if e.kind == "dispatch_refused_budget_exceeded"]
        assert refusals == [{"budget_kind": "tool_calls", "limit_value": 10,
                             "consumed_value": 10, "target_ref": "tool:search",
                             "runtime_error_code": "ToolCallBudgetExceeded"}] * 6


def test_S4_11_max_concurrency_bounds_the_branches_alive_at_once(clock):
    alive, peak = [0], [0]
    lock = threading.Lock()

    def branch() -> None:
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
        time.sleep(0.02)
        with lock:
            alive[0] -= 1

    with nb.budget(clock=clock) as run:
        run.parallel([branch] * 12, max_concurrency=3)
    assert peak[0] == 3


def test_S4_11_max_items_bounds_how_many_branches_a_group_may_have(clock):
    with nb.budget(clock=clock) as run:
        assert run.map(lambda x: x * 2, range(4), max_items=4) == [0, 2, 4, 6]
        with pytest.raises(nb.ConfigError, match="5 branches exceed max_items=4"):
            run.map(lambda x: x, range(5), max_items=4)
        with pytest.raises(nb.ConfigError, match="max_concurrency=0 must be a positive"):
            run.parallel([], max_concurrency=0)


def test_every_branch_sees_the_run_and_results_keep_their_order(clock):
    with nb.budget(clock=clock) as run:
        seen = run.parallel([lambda i=i: (i, nb.current() is run) for i in range(8)])
    assert seen == [(i, True) for i in range(8)]


def test_the_first_error_is_raised_after_every_branch_ended_or_returned_on_request(clock):
    ended = []

    def ok() -> str:
        time.sleep(0.05)
        ended.append(1)
        return "ok"

    def boom() -> str:
        raise ValueError("branch failed")

    with nb.budget(clock=clock) as run:
        with pytest.raises(ValueError, match="branch failed"):
            run.parallel([boom, ok])
        assert ended == [1]
        results = run.parallel([ok, boom], return_exceptions=True)
    assert results[0] == "ok" and isinstance(results[1], ValueError)


def test_S2_1_a_sub_agent_counts_one_invocation_and_opens_its_own_grant(clock):
    with nb.budget(agent_invocations=2, time="30s", clock=clock) as run:
        clock.advance("10s")
        with run.agent("researcher", steps=4, time="25s") as researcher:
            assert researcher.remaining_ms == 20_000
            researcher.step()
        assert researcher.name == "researcher"
        run.agent("writer")
        with pytest.raises(nb.BudgetExceeded) as info:
            run.agent("critic")
    assert (info.value.kind, info.value.target) == ("agent_invocations", "agent:critic")
    assert run.consumed["agent_invocations"] == 2


def test_S2_3_a_stopped_sub_agent_reports_stopped_and_is_never_retried(clock):
    attempts = []
    with nb.budget(clock=clock) as run:
        with pytest.raises(nb.Cancelled), run.agent("search") as child:
            attempts.append(1)
            child.cancel("enough")
            child.step()
        assert child.outcome.status == "stopped"
    assert attempts == [1]
    assert run.outcome.status == "completed"


@pytest.mark.realclock
def test_S2_5_a_silent_tool_is_cut_by_the_watchdog_while_the_other_branches_go_on():
    with nb.budget(tool_calls=10) as run:
        @run.tool(max_silence="100ms")
        def silent(ctx: nb.ToolContext) -> str:
            ctx.signal.wait(5)
            return "never"

        @run.tool(max_silence="1s")
        def busy(ctx: nb.ToolContext) -> str:
            for _ in range(5):
                time.sleep(0.05)
                ctx.progress()
            return "done"

        results = run.parallel([silent, busy, busy], return_exceptions=True)
    assert isinstance(results[0], nb.BudgetCut) and results[0].by == "watchdog"
    assert results[1:] == ["done", "done"]
    assert run.outcome.status == "completed"
