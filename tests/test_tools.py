"""Tools: a permit per call, the watchdog, the run's time as a cap, abandoned threads
(S2-5, S2-6, S2-7, S4-3)."""

from __future__ import annotations

import re
import threading
import time

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_each_call_reserves_a_tool_call_permit_before_dispatch(clock):
    calls = []
    with nb.budget(tool_calls=2, clock=clock) as run:
        @run.tool
        def search(q: str) -> str:
            calls.append(q)
            return q.upper()

        assert search("a") == "A"
        assert search("b") == "B"
        with pytest.raises(nb.BudgetExceeded) as info:
            search("c")
    assert calls == ["a", "b"]  # the refused call never ran
    assert info.value.target == "tool:search"
    assert run.consumed == {"tool_calls": 2}


def test_a_tool_runs_on_a_named_worker_thread_in_the_runs_context(clock):
    seen = {}
    with nb.budget(clock=clock) as run:
        @run.tool(name="probe")
        def probe() -> None:
            seen["thread"] = threading.current_thread().name
            seen["current"] = nb.current()

        probe()
    assert re.fullmatch(r"nbbudget-tool-probe-\d+", seen["thread"])
    assert seen["current"] is run


def test_a_tool_error_reaches_the_caller_unchanged(clock):
    with pytest.raises(ZeroDivisionError), nb.budget(clock=clock) as run:
        run.tool(lambda: 1 / 0)()
    assert run.outcome.code == "ZeroDivisionError"


def test_S2_5_a_silent_tool_is_cut_by_the_watchdog(clock):
    release = threading.Event()
    with nb.budget(clock=clock) as run:
        @run.tool(max_silence="2s")
        def fetch(ctx: nb.ToolContext) -> str:
            ctx.progress("connected")
            clock.advance("2s")  # two silent seconds pass inside the tool
            release.wait(5)
            ctx.progress("too late")  # the abandoned thread stops here
            return "never returned"

        with pytest.raises(nb.BudgetCut) as info:
            fetch()
        assert info.value.by == "watchdog"
        run.step()  # a watchdog cut is the tool's, the run goes on
        release.set()
    kinds = [e.kind for e in run.trace.events]
    assert kinds[:3] == ["progress", "watchdog_cut", "tool_abandoned"]
    cut = next(e for e in run.trace.events if e.kind == "watchdog_cut")
    assert cut.payload == {"tool": "fetch", "silent_ms": 2000, "max_silence_ms": 2000}
    assert run.outcome.status == "completed"


def test_S2_5_progress_is_the_heartbeat_that_resets_the_silence_window(clock):
    with nb.budget(clock=clock) as run:
        @run.tool(max_silence="2s")
        def crawl(ctx: nb.ToolContext) -> int:
            for page in range(5):
                clock.advance("1500ms")
                ctx.progress({"page": page})
            return 5

        assert crawl() == 5
    beats = [e.payload["data"] for e in run.trace.events if e.kind == "progress"]
    assert beats == [{"page": p} for p in range(5)]


def test_S2_5_a_watchdog_cut_that_escapes_fails_the_run_by_watchdog(clock):
    release = threading.Event()
    with pytest.raises(nb.BudgetCut), nb.budget(clock=clock) as run:
        @run.tool(max_silence=100)
        def hang(ctx: nb.ToolContext) -> None:
            clock.advance(100)
            release.wait(5)

        try:
            hang()
        finally:
            release.set()
    assert (run.outcome.status, run.outcome.cause, run.outcome.by) == (
        "failed", "budget-cut", "watchdog")


def test_S2_6_the_runs_remaining_time_caps_every_tool_call(clock):
    release = threading.Event()
    names = []
    with pytest.raises(nb.BudgetCut) as info, nb.budget(time="3s", clock=clock) as run:
        @run.tool
        def slow() -> None:
            names.append(threading.current_thread().name)
            clock.advance("10s")
            release.wait(5)

        try:
            slow()
        finally:
            release.set()
    assert info.value.by == "timeout"
    assert run.outcome.by == "timeout"
    abandoned = [e.payload for e in run.trace.events if e.kind == "tool_abandoned"]
    assert abandoned == [{"tool": "slow", "thread": names[0], "by": "timeout"}]


def test_S2_7_the_cut_frees_the_caller_even_when_the_tool_ignores_its_signal(clock):
    stop_ignoring = threading.Event()
    finished = threading.Event()
    with nb.budget(clock=clock) as run:
        @run.tool(max_silence="1s")
        def stubborn() -> None:  # takes no ctx: it cannot even see the signal
            clock.advance("1s")
            stop_ignoring.wait(5)
            finished.set()

        with pytest.raises(nb.BudgetCut):
            stubborn()
        assert not finished.is_set()  # the caller was freed while the work still ran
        stop_ignoring.set()
    assert finished.wait(5)


def test_S2_7_well_behaved_tools_watch_ctx_signal(clock):
    saw_signal = threading.Event()
    with nb.budget(clock=clock) as run:
        @run.tool(max_silence="1s")
        def polite(ctx: nb.ToolContext) -> None:
            clock.advance("1s")
            if ctx.signal.wait(5):
                saw_signal.set()

        with pytest.raises(nb.BudgetCut):
            polite()
    assert saw_signal.wait(5)


def test_cancelling_the_run_frees_a_caller_waiting_on_a_tool(clock):
    entered = threading.Event()
    with pytest.raises(nb.Cancelled), nb.budget(clock=clock) as run:
        @run.tool
        def wait_for_ever(ctx: nb.ToolContext) -> None:
            entered.set()
            ctx.signal.wait(5)

        canceller = threading.Thread(target=lambda: (entered.wait(5), run.cancel("stop")),
                                     name="canceller")
        canceller.start()
        try:
            wait_for_ever()
        finally:
            canceller.join()
    assert run.outcome.status == "stopped"


def test_bad_tool_arguments_are_config_errors(clock):
    run = nb.budget(clock=clock)
    with pytest.raises(nb.ConfigError, match="max_silence=0 would cut every call"):
        run.tool(lambda: None, max_silence=0)
    with pytest.raises(nb.ConfigError, match="max_silence='soon' is not a duration"):
        run.tool(lambda: None, max_silence="soon")
    with pytest.raises(nb.ConfigError, match="decorates a function"):
        run.tool(42)


@pytest.mark.realclock
def test_a_tool_blocked_in_c_is_cut_on_time_by_the_real_watchdog():
    with nb.budget() as run:
        @run.tool(max_silence="100ms")
        def sleepy() -> None:
            time.sleep(0.5)

        started = time.monotonic()
        with pytest.raises(nb.BudgetCut):
            sleepy()
        assert (time.monotonic() - started) < 0.4


# -- S2-7: abandonment is recorded only for a tool still running after a short grace -------------
def test_S2_7_tools_that_stop_within_milliseconds_of_their_cut_are_not_abandoned(clock):
    with nb.budget(clock=clock) as run:
        @run.tool(max_silence="1s")
        def tidy(ctx: nb.ToolContext) -> None:
            clock.advance("1s")  # the watchdog cuts the call here
            ctx.signal.wait(5)
            time.sleep(0.01)  # closes its connection, then returns

        for _ in range(50):
            with pytest.raises(nb.BudgetCut):
                tidy()
    kinds = [e.kind for e in run.trace.events]
    assert kinds.count("watchdog_cut") == 50
    assert kinds.count("tool_abandoned") == 0


@pytest.mark.realclock
def test_S2_7_many_real_cuts_of_well_behaved_tools_record_no_abandonment():
    with nb.budget() as run:
        @run.tool(max_silence="20ms")
        def watcher(ctx: nb.ToolContext) -> None:
            ctx.signal.wait(5)

        for _ in range(100):
            with pytest.raises(nb.BudgetCut):
                watcher()
    kinds = [e.kind for e in run.trace.events]
    assert kinds.count("watchdog_cut") == 100
    assert kinds.count("tool_abandoned") == 0



def test_tool_calls_run_on_a_pre_started_worker_named_for_each_call_while_it_runs(clock):
    threads, names = [], []
    with nb.budget(clock=clock) as run:
        @run.tool(name="probe")
        def probe() -> None:
            threads.append(threading.current_thread())
            names.append(threading.current_thread().name)

        probe()
        probe()
    assert threads[0] is threads[1]  # one worker, idle again between the calls: none started
    assert names[0] != names[1]  # each call's own name
    assert not threads[0].name.startswith("nbbudget-tool-")  # its own name given back

def test_S2_7_a_tool_still_running_after_the_grace_is_abandoned_by_its_thread_name(clock):
    release = threading.Event()
    names = []
    with nb.budget(clock=clock) as run:
        @run.tool(max_silence="1s")
        def stubborn() -> None:
            names.append(threading.current_thread().name)
            clock.advance("1s")
            release.wait(5)

        started = time.monotonic()
        with pytest.raises(nb.BudgetCut):
            stubborn()
        freed_after = time.monotonic() - started
        release.set()
    assert freed_after < 1.0  # the grace is short: the caller is still freed
    abandoned = [e.payload for e in run.trace.events if e.kind == "tool_abandoned"]
    assert abandoned == [{"tool": "stubborn", "thread": names[0], "by": "watchdog"}]


def test_tool_thread_names_are_unique_across_runs(clock):
    names = []
    for _ in range(3):
        with nb.budget(clock=clock) as run:
            @run.tool(name="probe")
            def probe() -> None:
                names.append(threading.current_thread().name)

            probe()
            probe()
    assert len(set(names)) == 6
    assert all(re.fullmatch(r"nbbudget-tool-probe-\d+", name) for name in names)
