"""Runs: the ledger, refusals, outcomes and notices (S2-4, S3-2, S3-3, S3-5, S4-3, S4-8, S4-10)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_a_run_that_stays_within_its_limits_completes(clock, ledger):
    with nb.budget(steps=5, tool_calls=2, clock=clock, ledger=ledger) as run:
        for _ in range(5):
            run.step()
        run.charge("tool_calls", 2)
    assert run.outcome == nb.Outcome(nb.Status.COMPLETED)
    assert run.consumed == {"steps": 5, "tool_calls": 2}


def test_S4_3_a_refused_charge_raises_and_leaves_every_counter_as_it_was(clock, ledger):
    with nb.budget(steps=3, tool_calls=5, clock=clock, ledger=ledger) as run:
        run.charge("steps", 2)
        run.charge("tool_calls", 1)
        with pytest.raises(nb.BudgetExceeded) as info:
            run.charge("steps", 2, target="node:parse")
        assert run.consumed == {"steps": 2, "tool_calls": 1}
        assert run.remaining("steps") == 1
        run.step()  # the last permit is still there
    err = info.value
    assert (err.kind, err.limit, err.consumed, err.requested, err.target) == (
        "steps", 3, 2, 2, "node:parse")
    assert err.code == "StepBudgetExceeded"
    assert str(err) == ("steps for node:parse would exceed the run's limit of 3 (2 used, 2 more "
                        "requested); raise the limit or do less work")


def test_S4_8_every_refusal_is_a_trace_event_with_the_seed_payload(clock, ledger):
    with nb.budget(tool_calls=1, clock=clock, ledger=ledger) as run:
        run.charge("tool_calls", target="tool:search")
        with pytest.raises(nb.BudgetExceeded):
            run.charge("tool_calls", target="tool:search")
    refusals = [e for e in run.trace.events if e.kind == "dispatch_refused_budget_exceeded"]
    assert [e.payload for e in refusals] == [{
        "budget_kind": "tool_calls", "limit_value": 1, "consumed_value": 1,
        "target_ref": "tool:search", "runtime_error_code": "ToolCallBudgetExceeded",
    }]


def test_S3_2_an_exhausted_limit_that_escapes_the_run_fails_it_loudly_with_the_output_so_far(
        clock, ledger):
    with pytest.raises(nb.BudgetExceeded) as info, \
            nb.budget(steps=2, clock=clock, ledger=ledger) as run:
        for i in range(5):
            run.step()
            run.set_output(f"{i + 1} items done")
    outcome = run.outcome
    assert (outcome.status, outcome.cause, outcome.by, outcome.code) == (
        "failed", "budget-cut", "steps", "StepBudgetExceeded")
    assert outcome.output == "2 items done"
    assert info.value.outcome is outcome


def test_S4_10_a_refusal_never_undoes_work_already_done(clock, ledger):
    effects = []
    with pytest.raises(nb.BudgetExceeded), nb.budget(steps=2, clock=clock, ledger=ledger) as run:
        for i in range(3):
            run.step()
            effects.append(i)
    assert effects == [0, 1]
    assert run.consumed["steps"] == 2


def test_an_error_in_the_work_fails_the_run_and_propagates_unchanged(clock, ledger):
    with pytest.raises(KeyError), nb.budget(clock=clock, ledger=ledger) as run:
        raise KeyError("x")
    assert (run.outcome.status, run.outcome.cause, run.outcome.code) == ("failed", "error",
                                                                        "KeyError")


def test_S3_3_when_several_limits_trip_at_one_boundary_tokens_win_over_cost_and_turns(clock,
                                                                                     ledger):
    with nb.budget(tokens=100, cost_usd=0.01, turns=1, clock=clock, ledger=ledger) as run:
        run.charge("turns")
        with pytest.raises(nb.BudgetExceeded) as info:
            run.charge_many({"turns": 1, "cost_usd": 0.02, "tokens": 500})
        assert info.value.kind == "tokens"
        with pytest.raises(nb.BudgetExceeded) as info:
            run.charge_many({"turns": 1, "cost_usd": 0.02})
        assert info.value.kind == "cost_usd"
        with pytest.raises(nb.BudgetExceeded) as info:
            run.charge_many({"steps": 1, "turns": 1})
        assert info.value.kind == "turns"
        assert run.consumed == {"turns": 1}


def test_charge_many_is_all_or_nothing(clock, ledger):
    with nb.budget(tokens=100, cost_usd=1.0, clock=clock, ledger=ledger) as run:
        run.charge_many({"tokens": 60, "cost_usd": 0.25})
        with pytest.raises(nb.BudgetExceeded):
            run.charge_many({"tokens": 50, "cost_usd": 0.25})
        assert run.consumed == {"tokens": 60, "cost_usd": 0.25}


def test_unbounded_kinds_are_counted_but_never_refused(clock, ledger):
    with nb.budget(clock=clock, ledger=ledger) as run:
        run.charge("provider_calls", 10**6)
    assert run.consumed == {"provider_calls": 10**6}
    assert run.remaining("provider_calls") == float("inf")


@pytest.mark.parametrize("kind, n, message", [
    ("stepz", 1, "'stepz' is not a budget kind; use one of: tokens, output_tokens, cost_usd, "
                 "turns, steps, tool_calls, agent_invocations, provider_calls"),
    ("run_ms", 1, "'run_ms' is not a budget kind; use one of: tokens, output_tokens, cost_usd, "
                  "turns, steps, tool_calls, agent_invocations, provider_calls"),
    ("steps", -1, "charge('steps', -1): the amount must be a finite number >= 0"),
    ("steps", 1.5, "charge('steps', 1.5): steps are counted in whole numbers"),
    ("steps", True, "charge('steps', True): the amount must be a finite number >= 0"),
    ("cost_usd", float("nan"), "charge('cost_usd', nan): the amount must be a finite number >= 0"),
])
def test_a_bad_charge_is_a_config_error_naming_the_value(clock, kind, n, message, ledger):
    run = nb.budget(clock=clock, ledger=ledger)
    with pytest.raises(nb.ConfigError) as info:
        run.charge(kind, n)
    assert str(info.value) == message


def test_bad_budget_arguments_are_config_errors(clock):
    with pytest.raises(nb.ConfigError, match="unknown limit 'stpes'"):
        nb.budget(stpes=3)
    with pytest.raises(nb.ConfigError, match="steps=0 must be greater than 0"):
        nb.budget(steps=0)
    with pytest.raises(nb.ConfigError, match="time='soon' is not a duration"):
        nb.budget(time="soon")
    with pytest.raises(nb.ConfigError, match="time=0 is not a time grant"):
        nb.budget(time=0)
    with pytest.raises(nb.ConfigError, match="trace='all'"):
        nb.budget(trace="all")
    with pytest.raises(nb.ConfigError, match=r"limits must be nb\.Limits, not dict"):
        nb.budget({"steps": 3})
    with pytest.raises(nb.ConfigError, match="totals= only applies with suspend=True"):
        nb.budget(totals=nb.Limits(tokens=5))


def test_limits_given_several_ways_combine_by_minimum(clock, ledger):
    run = nb.budget(nb.Limits(steps=10, tokens=50), steps=20, time="2s", run_ms=5000, clock=clock,
                    ledger=ledger)
    assert run.limits == nb.Limits(steps=10, tokens=50, run_ms=2000)


def test_current_is_the_innermost_active_budget(clock, ledger):
    assert nb.current() is None
    with nb.budget(clock=clock, ledger=ledger) as outer:
        assert nb.current() is outer
        with outer.grant(steps=2) as child:
            assert nb.current() is child
        assert nb.current() is outer
    assert nb.current() is None


def test_current_is_per_thread(clock, ledger):
    seen = []
    with nb.budget(clock=clock, ledger=ledger):
        t = threading.Thread(target=lambda: seen.append(nb.current()), name="probe")
        t.start()
        t.join()
    assert seen == [None]


def test_a_finished_run_cannot_be_entered_again(clock, ledger):
    with nb.budget(clock=clock, ledger=ledger) as run:
        pass
    with pytest.raises(nb.ConfigError, match="has already ended"), run:
        pass


# -- S2-4: stops ---------------------------------------------------------------------------------
def test_S2_4_a_user_stop_settles_as_stopped_and_raises_cancelled_at_the_block_end(clock, ledger):
    with pytest.raises(nb.Cancelled, match="run was stopped: enough") as info, \
            nb.budget(clock=clock, ledger=ledger) as run:
        run.cancel("enough")
        try:
            run.step()
        except Exception:  # a stop is not an Exception: user code cannot swallow it
            pytest.fail("the stop was swallowed by `except Exception`")
    assert (run.outcome.status, run.outcome.cause) == ("stopped", "user")
    assert info.value.reason == "enough"
    assert info.value.outcome is run.outcome


def test_cancel_is_idempotent_and_the_first_reason_wins(clock, ledger):
    run = nb.budget(clock=clock, ledger=ledger)
    run.cancel("first")
    run.cancel("second")
    with pytest.raises(nb.Cancelled, match="first"), run:
        pass
    assert [e.kind for e in run.trace.events].count("cancel_requested") == 1


def test_S2_3_the_trace_records_a_cancel_when_requested_and_when_the_work_observes_it(clock,
                                                                                      ledger):
    run = nb.budget(clock=clock, ledger=ledger)
    with pytest.raises(nb.Cancelled), run:
        clock.advance(10)
        run.cancel("enough")
        clock.advance(5)
        for _ in range(3):  # every check raises again; the trace notes the first one
            with pytest.raises(BaseException) as info:
                run.step()
            assert not isinstance(info.value, Exception)
    cancels = [(e.kind, e.t_ms) for e in run.trace.events if e.kind.startswith("cancel")]
    assert cancels == [("cancel_requested", 10.0), ("cancel_observed", 15.0)]
    assert next(e for e in run.trace.events if e.kind == "cancel_requested").payload == {
        "status": "stopped", "cause": "user", "by": None, "code": "Stopped",
        "message": "run was stopped: enough"}


def test_S2_3_a_cancel_the_work_never_reaches_is_requested_and_never_observed(clock, ledger):
    run = nb.budget(clock=clock, ledger=ledger)
    with pytest.raises(nb.Cancelled), run:
        run.cancel()
    kinds = [e.kind for e in run.trace.events]
    assert "cancel_requested" in kinds
    assert "cancel_observed" not in kinds


def test_cancellation_is_level_triggered_every_later_check_raises_again(clock, ledger):
    with pytest.raises(nb.Cancelled), nb.budget(clock=clock, ledger=ledger) as run:
        run.cancel()
        for _ in range(3):
            with pytest.raises(BaseException) as info:
                run.check()
            assert not isinstance(info.value, Exception)


def test_cancel_from_another_thread_stops_a_busy_loop(clock, ledger):
    started = threading.Event()
    with pytest.raises(nb.Cancelled), nb.budget(clock=clock, ledger=ledger) as run:
        t = threading.Thread(target=lambda: (started.wait(), run.cancel("from ui")), name="ui")
        t.start()
        try:
            started.set()
            while True:
                run.step()
        finally:
            t.join()
    assert run.outcome.status == "stopped"


def test_a_keyboard_interrupt_settles_as_stopped(clock, ledger):
    with pytest.raises(KeyboardInterrupt), nb.budget(clock=clock, ledger=ledger) as run:
        raise KeyboardInterrupt
    assert (run.outcome.status, run.outcome.cause) == ("stopped", "interrupt")


# -- S4-3: contention ----------------------------------------------------------------------------
def test_S4_3_eight_threads_racing_get_exactly_the_limit(clock, ledger):
    """8 threads x 10**5 reservations against a limit of 300,000: exactly the limit is granted,
    and refusals are raised outside the lock (no convoy), with a tiny switch interval."""
    limit, per_thread = 300_000, 100_000
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        with nb.budget(tool_calls=limit, clock=clock, notices=None, ledger=ledger) as run:
            granted = [0] * 8
            barrier = threading.Barrier(8)

            def worker(k: int) -> None:
                charge = run.charge
                barrier.wait()
                for _ in range(per_thread):
                    try:
                        charge("tool_calls")
                        granted[k] += 1
                    except nb.BudgetExceeded:
                        pass

            threads = [threading.Thread(target=worker, args=(k,), name=f"racer-{k}")
                       for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(old)
    assert sum(granted) == limit
    assert run.consumed["tool_calls"] == limit
    stats = run.trace.stats()
    assert stats["refusals"]["tool_calls"] == 8 * per_thread - limit
    assert stats["checks"]["tool_calls"] == 8 * per_thread


def test_S4_3_racing_for_the_last_permits_grants_each_exactly_once(clock, ledger):
    def branch(run: nb.Budget, barrier: threading.Barrier, wins: list[int]) -> None:
        barrier.wait()
        try:
            run.charge("tool_calls")
            wins.append(1)
        except nb.BudgetExceeded:
            pass

    for _ in range(200):
        with nb.budget(tool_calls=10, clock=clock, notices=None, ledger=ledger) as run:
            wins: list[int] = []
            barrier = threading.Barrier(16)
            threads = [threading.Thread(target=branch, args=(run, barrier, wins), name="branch")
                       for _ in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert len(wins) == 10
        assert run.trace.stats()["refusals"]["tool_calls"] == 6


# -- S3-5: approach notices ----------------------------------------------------------------------
def test_S3_5_two_one_shot_notices_when_the_highest_ratio_crosses_each_threshold(clock, ledger):
    with nb.budget(steps=100, tokens=1000, clock=clock, ledger=ledger) as run:
        run.charge("tokens", 500)
        for _ in range(79):
            run.step()
        assert run.notice_level == 0
        run.step()  # 80 steps: 0.8 of the step limit
        assert run.notice_level == 1
        run.charge("tokens", 460)  # 0.96 of the token limit
        assert run.notice_level == 2
        for _ in range(15):
            run.step()
    notices = [e.payload for e in run.trace.events if e.kind == "approach_notice"]
    assert [(n["level"], n["threshold"], n["budget_kind"], n["advice"]) for n in notices] == [
        (1, 0.8, "steps", "start converging"), (2, 0.95, "tokens", "deliver now")]
    assert run.outcome.status == "completed"  # advisory: they never stop the run


def test_S3_5_notice_thresholds_can_be_set_and_a_jump_fires_both_at_once(clock, ledger):
    with nb.budget(steps=10, notices=(0.5, 0.6), clock=clock, ledger=ledger) as run:
        run.charge("steps", 7)
    levels = [e.payload["level"] for e in run.trace.events if e.kind == "approach_notice"]
    assert levels == [1, 2]


def test_S3_5_notices_can_be_turned_off(clock, ledger):
    with nb.budget(steps=10, notices=None, clock=clock, ledger=ledger) as run:
        run.charge("steps", 10)
    assert run.notice_level == 0
    assert not [e for e in run.trace.events if e.kind == "approach_notice"]


@pytest.mark.parametrize("notices", [(0.9, 0.8), (0, 0.5), (0.5, 1.5), (0.5,), "0.8", (True, 1)])
def test_S3_5_bad_notice_thresholds_are_refused(notices):
    with pytest.raises(nb.ConfigError, match="notices="):
        nb.budget(steps=10, notices=notices)


# -- reading -------------------------------------------------------------------------------------
def test_usage_is_a_frame_with_one_row_per_armed_axis(clock, ledger):
    with nb.budget(steps=10, tokens=100, clock=clock, ledger=ledger) as run:
        run.charge("steps", 4)
        run.charge("tokens", 25)
        run.charge("provider_calls", 3)  # not armed: no row
        frame = run.usage()
    assert list(frame.columns) == ["limit", "consumed", "remaining", "fraction"]
    assert frame.to_dict("index") == {
        "steps": {"limit": 10, "consumed": 4, "remaining": 6, "fraction": 0.4},
        "tokens": {"limit": 100, "consumed": 25, "remaining": 75, "fraction": 0.25},
    }


def test_usage_keeps_whole_numbers_whole_beside_a_cost_in_dollars(clock, ledger):
    with nb.budget(steps=10, cost_usd=1.0, time="5s", clock=clock, ledger=ledger) as run:
        run.charge("steps", 4)
        run.charge("cost_usd", 0.25)
        clock.advance("1s")
        frame = run.usage()
    assert frame.to_dict("index") == {
        "run_ms": {"limit": 5000, "consumed": 1000, "remaining": 4000, "fraction": 0.2},
        "steps": {"limit": 10, "consumed": 4, "remaining": 6, "fraction": 0.4},
        "cost_usd": {"limit": 1.0, "consumed": 0.25, "remaining": 0.75, "fraction": 0.25},
    }
    assert [type(v) for v in frame["limit"]] == [int, int, float]
    assert frame.to_string().splitlines()[2].split() == ["run_ms", "5000", "1000", "4000", "0.20"]
    assert str(frame["fraction"].dtype) == "float64"


def test_the_repr_shows_the_state_and_every_armed_axis(clock, ledger):
    run = nb.budget(steps=10, name="etl", clock=clock, ledger=ledger)
    assert repr(run) == "<Budget 'etl' ready: steps 0/10>"
    with run:
        run.charge("steps", 3)
        assert repr(run) == "<Budget 'etl' running: steps 3/10>"
    assert repr(run) == "<Budget 'etl' completed: steps 3/10>"


# -- permit pools: the lock-free fast path stays exact -------------------------------------------
def test_S4_3_permits_waiting_in_the_pool_are_never_refused_to_a_larger_charge(clock, ledger):
    with nb.budget(steps=1000, clock=clock, notices=None, ledger=ledger) as run:
        run.step()  # the run reserves a block of permits for later steps
        run.charge("steps", 999)  # needs every permit, those in the pool included
        assert run.remaining("steps") == 0
        with pytest.raises(nb.BudgetExceeded):
            run.step()
    assert run.consumed == {"steps": 1000}


def test_S4_3_a_grant_can_use_permits_reserved_by_its_run(clock, ledger):
    with nb.budget(steps=300, clock=clock, notices=None, ledger=ledger) as run:
        run.step()
        with run.grant(steps=500) as child:
            child.charge("steps", 299)
            with pytest.raises(nb.BudgetExceeded) as info:
                child.step()
    assert info.value.scope == "run"
    assert run.consumed == {"steps": 300}


def test_S4_3_mixed_amounts_racing_never_exceed_and_leave_less_than_one_charge(clock, ledger):
    """4 threads charge 1 at a time and 4 charge 7 at a time until refused: the run ends with
    exactly what was granted, never more than the limit, and less than 7 left over."""
    limit = 50_000
    granted = [0] * 8
    with nb.budget(tool_calls=limit, clock=clock, ledger=ledger) as run:
        def worker(k: int, amount: int) -> None:
            misses = 0
            while misses < 50:
                try:
                    run.charge("tool_calls", amount)
                    granted[k] += amount
                except nb.BudgetExceeded:
                    misses += 1

        threads = [threading.Thread(target=worker, args=(k, 1 if k < 4 else 7), name=f"mix-{k}")
                   for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert run.consumed["tool_calls"] == sum(granted)
        assert 0 <= limit - sum(granted) < 1  # ones keep taking until the very last permit
    notices = [e.payload["level"] for e in run.trace.events if e.kind == "approach_notice"]
    assert notices == [1, 2]


def test_the_fast_path_still_gives_each_notice_at_its_threshold(clock, ledger):
    with nb.budget(steps=1000, clock=clock, ledger=ledger) as run:
        for _ in range(799):
            run.step()
        assert run.notice_level == 0
        run.step()
        assert run.notice_level == 1
        for _ in range(149):
            run.step()
        assert run.notice_level == 1
        run.step()
        assert run.notice_level == 2


def test_a_stop_empties_the_pools_so_the_next_step_raises(clock, ledger):
    with pytest.raises(nb.Cancelled), nb.budget(steps=10**6, clock=clock, ledger=ledger) as run:
        run.step()  # a block of permits is now reserved
        run.cancel()
        run.step()
    assert run.consumed == {"steps": 1}


def test_a_pool_never_holds_more_than_one_block_whatever_the_charges(clock, ledger):
    """Charges of other amounts take the locked path; they must not pile up reserved permits
    (an unbounded kind would otherwise grow its pool without end)."""
    with nb.budget(clock=clock, ledger=ledger) as run:
        run.charge("tokens")  # the pool of tokens gets its block
        for _ in range(1000):
            run.charge("tokens", 7)
        assert len(run._pools[0]) <= 256
        assert run.consumed["tokens"] == 1 + 7000


# -- the ledger, chosen (low-level API) ------------------------------------------------------------
def test_the_ledger_keyword_chooses_the_ledger_of_the_run_its_grants_and_its_resume(clock,
                                                                                   ledger):
    """``ledger=`` is a factory: it is called once per run with the run's name, limits, clock and
    settings, the run, its grants and a run resumed with it keep their counters there."""
    made, calls = [], []

    def factory(*args, **kwargs):
        calls.append((args[:2], sorted(kwargs)))
        made.append(ledger(*args, **kwargs))
        return made[-1]

    with nb.budget(steps=5, name="etl", clock=clock, ledger=factory) as run:
        run.step()
        with run.grant(steps=2) as child:
            child.step()
    assert calls == [(("etl", nb.Limits(steps=5)),
                      ["clock", "elapsed", "full", "lock", "notices", "suspend", "totals"])]
    assert run.lowlevel.ledger is child.lowlevel.ledger is made[0]
    assert made[0].root is run.lowlevel.account
    with nb.Budget.resume(run.state(), clock=clock, ledger=factory) as later:
        later.step()
    assert later.lowlevel.ledger is made[1]
    assert later.consumed == {"steps": 3}


def test_a_ledger_that_is_not_a_factory_is_a_config_error():
    with pytest.raises(nb.ConfigError) as info:
        nb.budget(steps=5, ledger="local")
    assert str(info.value) == "ledger must be a ledger factory such as LocalLedger, not str"


# -- a run built on first use --------------------------------------------------------------------
def _run_for(clock: FakeClock, *, built_first: bool, step_at: int | None = None) -> nb.Budget:
    """A run entered, held 30 ms (stepping once at *step_at*), and left; its parts built before
    it was entered, or when first needed."""
    run = nb.budget(steps=5, clock=clock)
    if built_first:
        assert run.lowlevel is not None
    with run:
        if step_at is not None:
            clock.advance(step_at)
            run.step()
        clock.advance(30 - (step_at or 0))
    return run


@pytest.mark.parametrize("step_at", [None, 10])
def test_a_run_built_on_first_use_reads_as_one_built_up_front(step_at):
    """Used for nothing, or first charged halfway: its outcome, its snapshot, its time and its
    trace (the outcome event at 30 ms) are those of a run whose parts were built at once."""
    late, early = (_run_for(FakeClock(), built_first=first, step_at=step_at)
                   for first in (False, True))
    assert late.outcome == early.outcome == nb.Outcome(nb.Status.COMPLETED)
    assert late.snapshot() == early.snapshot()  # read before its parts are built, if unused
    assert late.consumed == early.consumed
    assert late.snapshot().elapsed_ms == 30
    assert list(late.trace) == list(early.trace)
    assert late.trace.latest("outcome").t_ms == 30
    assert late.trace.summary() == early.trace.summary()
    assert late.snapshot() == early.snapshot()  # and after


def test_a_run_used_for_nothing_builds_no_parts_and_cannot_be_entered_again(monkeypatch):
    from nbbudget.core.lowlevel import Core

    built = []
    real = Core.run
    monkeypatch.setattr(Core, "run", lambda *a, **k: built.append(1) or real(*a, **k))
    clock = FakeClock()
    with nb.budget(steps=5, clock=clock) as run:
        run.check()
        assert not run.cancelled and run.remaining_ms is None
        assert nb.current() is run
    assert built == []
    with pytest.raises(nb.ConfigError, match="has already ended"), run:
        pass
    assert run.snapshot().status == "completed"
    assert built == []
    assert run.trace.latest("outcome") is not None  # reading its trace builds it, as it was
    assert built == [1]


def test_a_run_traced_in_full_is_built_at_once_and_a_timed_one_as_it_is_entered(monkeypatch):
    from nbbudget.core.lowlevel import Core

    clock = FakeClock()
    built: list[float] = []
    real = Core.run

    def run(*a, **k):
        built.append(clock.now_ms())
        clock.advance(7)  # building takes time: it counts inside the run's time
        return real(*a, **k)

    monkeypatch.setattr(Core, "run", run)
    nb.budget(trace="full", clock=clock)
    assert built == [0]
    timed = nb.budget(time="1s", steps=3, clock=clock)
    assert built == [0]
    assert timed.remaining_ms == 1000  # not entered: its time grant in full
    assert timed.snapshot().remaining_ms == 1000
    clock.advance(100)
    with timed:
        assert built == [0, 107]
        assert timed.lowlevel.scope.started_ms == 107  # taken before it was built
        assert timed.remaining_ms == 993
    assert timed.outcome is not None and timed.outcome.status.value == "completed"


def test_threads_that_first_use_a_run_at_once_share_its_one_set_of_parts():
    run = nb.budget(steps=10**6, clock=FakeClock())
    barrier = threading.Barrier(8)
    seen: list[object] = []

    def stepper() -> None:
        barrier.wait()
        for _ in range(1000):
            run.step()
        seen.append(run.lowlevel)

    with run:
        threads = [threading.Thread(target=stepper, name=f"stepper-{i}") for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
    assert len({id(core) for core in seen}) == 1
    assert run.consumed == {"steps": 8000}


class _YieldingClock(FakeClock):
    """A fake clock that, read by the thread that made it, first gives the other threads 1 ms:
    a run entered or left reads its clock before it writes the time, so another thread runs
    exactly there."""

    def __init__(self) -> None:
        super().__init__()
        self._owner = threading.current_thread()

    def now_ms(self) -> float:
        if threading.current_thread() is self._owner:
            time.sleep(0.001)
        return super().now_ms()


def _build_when(go: threading.Barrier, run: nb.Budget) -> None:
    go.wait()
    assert run.lowlevel is not None  # reading it builds the run's parts


@pytest.mark.parametrize("leaving", [False, True])
def test_a_run_built_by_another_thread_while_it_is_entered_or_left_keeps_its_times(leaving):
    """Entering and leaving a run not built write their times without a lock while another
    thread builds its parts (here: while the entering or leaving thread reads the clock). The
    run started when it was entered, and ended (traced once) when it was left."""
    for _ in range(20):
        clock = _YieldingClock()
        run = nb.budget(steps=5, clock=clock)
        go = threading.Barrier(2)
        thread = threading.Thread(target=_build_when, args=(go, run), name="builder")
        thread.start()
        if not leaving:
            go.wait()  # the builder races the entry
        with run:
            clock.advance(30)
            if leaving:
                go.wait()  # the builder races the exit
        thread.join(5)
        assert run.outcome == nb.Outcome(nb.Status.COMPLETED)
        assert [e.t_ms for e in run.trace.events if e.kind == "outcome"] == [30]
        assert run.snapshot().elapsed_ms == 30


class _LibraryError(Exception):
    """What a library raises for any error it meets, as LiteLLM raises InternalServerError."""


def _library_call(run: nb.Budget) -> None:
    try:
        run.charge("provider_calls")
    except Exception as exc:
        raise _LibraryError("the model call failed") from exc


def test_a_library_error_raised_for_a_refusal_ends_the_block_as_the_refusal() -> None:
    """N-7: a refusal that reaches the caller as a library's own error still ends the run as
    the refusal it was (never completed, never a plain error), and the block raises nbbudget's
    error, whose outcome says what the caller got."""
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(provider_calls=1) as run:
        _library_call(run)
        _library_call(run)
    assert refused.value.kind == "provider_calls"
    outcome = run.outcome
    assert (outcome.status.value, outcome.by, outcome.code) == (
        "failed", "provider_calls", refused.value.code)
    assert outcome.message.endswith("(the caller got it as test_budget._LibraryError)")
    assert refused.value.outcome is outcome
    assert isinstance(refused.value.__context__, _LibraryError)


def test_a_library_error_with_no_budget_cause_is_left_as_it_is() -> None:
    with pytest.raises(_LibraryError), nb.budget(provider_calls=5) as run:
        try:
            raise ValueError("a bad reply")
        except ValueError as exc:
            raise _LibraryError("the model call failed") from exc
    assert (run.outcome.status.value, run.outcome.code) == ("failed", "_LibraryError")


def test_a_refusal_the_work_caught_and_wrapped_then_handled_completes() -> None:
    with nb.budget(provider_calls=1) as run:
        _library_call(run)
        with pytest.raises(_LibraryError):
            _library_call(run)
    assert run.outcome.status.value == "completed"


def _library_stream(run: nb.Budget) -> None:
    """A stream whose reply passes the run's limit, cut as a model client cuts it (its own
    error, raised for the run's stop, with the text received so far), which the library then
    raises its own error for, as LiteLLM raises MidStreamFallbackError."""
    from nbbudget.core.lowlevel import Unwind
    from nbbudget.run.providers import spend_reply

    try:
        try:
            spend_reply(run.lowlevel, 1, 3, None, "m", "provider:m")
        except Unwind as signal:
            cut = nb.BudgetCut(signal.stop.by or "budget", signal.stop.message)
            cut.salvage = "a b c "  # type: ignore[attr-defined]
            cut.reports = signal.stop
            raise cut from None
    except Exception as exc:
        raise _LibraryError("the stream failed") from exc


def test_a_library_error_raised_for_a_cut_ends_the_block_with_that_cut_S3_9() -> None:
    """The block raises the cut the library's error was raised for, as it would have had that
    cut reached it (with its salvage), not the stop's own error; its outcome says what the
    caller got."""
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=2) as run:
        _library_stream(run)
    assert cut.value.salvage == "a b c "  # type: ignore[attr-defined]
    assert isinstance(cut.value.__context__, _LibraryError)
    outcome = run.outcome
    assert (outcome.status.value, outcome.by) == ("failed", "output_tokens")
    assert outcome.message.endswith("(the caller got it as test_budget._LibraryError)")
    assert cut.value.outcome is outcome
