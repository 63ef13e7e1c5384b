"""Time grants: deadlines made absolute on entry, active time only (S4-4, S4-7, S2-6)."""

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


def test_the_clock_starts_when_the_run_is_entered(clock):
    run = nb.budget(time="5s", clock=clock)
    clock.advance("1h")
    assert run.remaining_ms == 5_000
    with run:
        clock.advance("2s")
        assert run.remaining_ms == 3_000
        assert run.consumed == {"run_ms": 2_000}


def test_S4_7_a_spent_time_grant_fails_the_run_with_a_budget_event(clock):
    with pytest.raises(nb.BudgetCut) as info, nb.budget(time="5s", clock=clock) as run:
        clock.advance("4999ms")
        run.step()
        clock.advance("1ms")
        run.step()
    assert info.value.by == "timeout"
    outcome = run.outcome
    assert (outcome.status, outcome.cause, outcome.by, outcome.code) == (
        "failed", "budget-cut", "timeout", "RunTimeBudgetExceeded")
    cuts = [e for e in run.trace.events if e.kind == "cut"]
    assert [(e.payload["by"], e.t_ms) for e in cuts] == [("timeout", 5_000)]


def test_the_deadline_is_a_flag_set_by_the_clock_not_a_read_per_step(clock):
    with pytest.raises(nb.BudgetCut), nb.budget(time="1s", clock=clock) as run:
        assert clock.pending() >= 1
        clock.advance("1s")
        assert run.cancelled  # set by the scheduled callback, before any check
        run.step()


def test_a_block_that_ends_after_its_deadline_without_checking_is_still_cut(clock):
    with pytest.raises(nb.BudgetCut), nb.budget(time="1s", clock=clock) as run:
        clock._now += 2_000  # time passed, no callback ran yet (a busy C call, say)
    assert run.outcome.by == "timeout"


def test_a_finished_run_cancels_its_timers(clock):
    with nb.budget(time="1s", clock=clock) as run:
        pass
    assert clock.pending() == 0
    clock.advance("1h")
    assert run.outcome.status == "completed"


def test_S4_4_time_spent_paused_is_not_counted(clock):
    with nb.budget(time="10s", clock=clock) as run:
        clock.advance("4s")
        with run.paused():
            clock.advance("1h")  # waiting for a person
            assert run.remaining_ms == 6_000
        assert run.remaining_ms == 6_000
        clock.advance("5s")
        run.step()
    assert run.outcome.status == "completed"
    assert run.consumed["run_ms"] == 9_000


def test_S4_4_a_pause_shifts_the_deadline_of_every_grant(clock):
    with nb.budget(time="10s", clock=clock) as run:
        child = run.grant(time="3s")
        with run.paused():
            clock.advance("1h")
        assert child.remaining_ms == 3_000
        clock.advance("3s")
        assert child.cancelled


def test_only_a_run_can_pause(clock):
    with nb.budget(clock=clock) as run, pytest.raises(nb.ConfigError, match="is a grant"), \
            run.grant().paused():
        pass


def test_time_approach_notices_fire_from_the_clock(clock):
    with nb.budget(time="10s", clock=clock) as run:
        clock.advance("7999ms")
        assert run.notice_level == 0
        clock.advance("1ms")
        assert run.notice_level == 1
        clock.advance("1500ms")
        assert run.notice_level == 2
    kinds = [e.payload["budget_kind"] for e in run.trace.events if e.kind == "approach_notice"]
    assert kinds == ["run_ms", "run_ms"]


# -- the real clock, end to end, generous margins ----------------------------------------------
@pytest.mark.realclock
def test_a_busy_loop_is_cut_shortly_after_its_real_deadline():
    started = time.monotonic()
    with pytest.raises(nb.BudgetCut), nb.budget(time="200ms") as run:
        while True:
            run.step()
    late_ms = (time.monotonic() - started) * 1000 - 200
    assert 0 <= late_ms < 150
    assert run.outcome.by == "timeout"


@pytest.mark.realclock
def test_the_timer_thread_ends_when_nothing_is_scheduled():
    with nb.budget(time="1h") as run:
        assert any(t.name == "nbbudget-timer" for t in threading.enumerate())
        run.step()
    deadline = time.monotonic() + 2
    while any(t.name == "nbbudget-timer" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the timer thread did not end"
        time.sleep(0.01)


class _Recording:
    """A `Waitable` never set, that sleeps each timeout it is given and keeps it."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []
        self.woken_ms: list[float] = []  # when each sleep ended, on the monotonic clock

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.timeouts.append(timeout)
        time.sleep(timeout)
        self.woken_ms.append(time.monotonic_ns() / 1e6)
        return False


@pytest.mark.realclock
@pytest.mark.parametrize("interval", [0.005, 0.002])
def test_a_real_wait_wakes_one_switch_interval_early_and_never_answers_before_its_deadline(
        interval):
    """Woken at its deadline while work holds the GIL, a caller waited one switch interval more
    for it (S0-1's lateness); the real clock sleeps until one interval before, then the rest."""
    from nbbudget.core.clock import MonotonicClock

    clock, event = MonotonicClock(), _Recording()
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        until = clock.now_ms() + 60
        assert clock.wait(event, until) is False
        back = clock.now_ms()
    finally:
        sys.setswitchinterval(old)
    assert back >= until
    first = event.timeouts[0]
    assert 0.060 - interval - 0.010 < first <= 0.060 - interval  # an interval early
    # and then the rest, unless the first sleep overslept past the deadline (a loaded machine)
    assert len(event.timeouts) >= 2 or event.woken_ms[0] >= until, event.timeouts


@pytest.mark.realclock
def test_the_timer_thread_never_runs_a_callback_before_its_time_while_python_holds_the_gil():
    from nbbudget.core.clock import MonotonicClock

    clock, fired, stop = MonotonicClock(), [], threading.Event()

    def spin() -> None:  # pure Python: the GIL is taken from it only by a switch request
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, name="test-spinner")
    spinner.start()
    try:
        whens = [clock.now_ms() + 10 * k for k in range(1, 9)]
        done = threading.Event()
        for i, when in enumerate(whens):
            last = i == len(whens) - 1
            clock.call_at(when, lambda when=when, last=last: (
                fired.append((when, clock.now_ms())), last and done.set()))
        assert done.wait(10)
    finally:
        stop.set()
        spinner.join()
    assert [when for when, _ in fired] == whens
    assert all(at >= when for when, at in fired)
