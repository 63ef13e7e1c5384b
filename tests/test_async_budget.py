"""N-6: ``async with nb.budget(...)``. The run is current in the block's task and in every
task it starts (contextvars); its deadline and a cancel cancel the task awaiting in the block,
which ends with the run's error (``nb.BudgetCut``, ``nb.Cancelled``), never
``CancelledError``, as ``asyncio.timeout`` ends with ``TimeoutError``. A cancel that is not the
run's stays a ``CancelledError``. Code that holds the loop without awaiting is stopped on the
main thread by the run's signal, inside the block only; elsewhere its error says how long it
went on.

The injectable clock, moved by another task on the same loop; real threads where a thread is
the point."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock


def arun(coro):
    return asyncio.run(coro)


def test_N_6_the_run_is_current_in_the_block_and_in_every_task_it_starts() -> None:
    async def main():
        async with nb.budget(steps=10) as run:
            async def step():
                await asyncio.sleep(0)
                nb.current().step()
                return nb.current()
            seen = await asyncio.gather(step(), step(), asyncio.create_task(step()))
            assert seen == [run, run, run]
        assert nb.current() is None
        return run

    run = arun(main())
    assert run.consumed["steps"] == 3
    assert run.outcome.status.value == "completed"


def test_N_6_the_deadline_cancels_the_awaiting_task_with_the_runs_error() -> None:
    clock = FakeClock()

    async def main():
        async def later():
            await asyncio.sleep(0)
            clock.advance("2s")
        mover = asyncio.create_task(later())
        with pytest.raises(nb.BudgetCut) as cut:
            async with nb.budget(time="1s", clock=clock):
                await asyncio.Event().wait()
        await mover
        return cut.value

    error = arun(main())
    assert error.by == "timeout"
    assert "time grant of 1000 ms is spent" in str(error)
    assert not isinstance(error.__cause__, nb.BudgetCut)


def test_N_6_a_cancel_from_another_task_ends_the_block_with_cancelled() -> None:
    async def main():
        run = nb.budget()
        asyncio.get_running_loop().call_soon(run.cancel, "enough")
        with pytest.raises(nb.Cancelled, match="was stopped: enough"):
            async with run:
                await asyncio.sleep(30)
        return run

    run = arun(main())
    assert run.outcome.status.value == "stopped"


def test_N_6_a_cancel_from_another_thread_ends_the_block_at_once() -> None:
    run = nb.budget()
    canceller = threading.Timer(0.05, run.cancel, args=("from a thread",))

    async def main():
        canceller.start()
        started = time.monotonic()
        with pytest.raises(nb.Cancelled):
            async with run:
                await asyncio.sleep(30)
        return time.monotonic() - started

    try:
        assert arun(main()) < 5
    finally:
        canceller.join()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is 3.11+")
def test_N_6_the_tasks_cancel_count_is_restored_as_asyncio_timeout_restores_it() -> None:
    async def main():
        run = nb.budget()
        asyncio.get_running_loop().call_soon(run.cancel)
        with pytest.raises(nb.Cancelled):
            async with run:
                await asyncio.sleep(30)
        return asyncio.current_task().cancelling()

    assert arun(main()) == 0


def test_N_6_a_cancel_that_is_not_the_runs_stays_a_cancelled_error() -> None:
    async def main():
        run = nb.budget(time="30s")

        async def block():
            async with run:
                await asyncio.sleep(30)

        task = asyncio.create_task(block())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return run

    run = arun(main())
    assert run.outcome is not None and run.outcome.status.value != "completed"


def test_N_6_a_block_that_swallows_the_cancel_still_ends_with_the_runs_error() -> None:
    clock = FakeClock()

    async def main():
        asyncio.get_running_loop().call_soon(clock.advance, "2s")
        swallowed = []
        with pytest.raises(nb.BudgetCut):
            async with nb.budget(time="1s", clock=clock):
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    swallowed.append(True)
                await asyncio.sleep(0)  # nothing more is thrown in: the cancel came once
        return swallowed

    assert arun(main()) == [True]


def test_N_6_preempt_false_never_cancels_the_task() -> None:
    clock = FakeClock()

    async def main():
        asyncio.get_running_loop().call_soon(clock.advance, "2s")
        with pytest.raises(nb.BudgetCut):
            async with nb.budget(time="1s", clock=clock, preempt=False):
                await asyncio.sleep(0.05)  # not cancelled: the block's end finds the stop
                return "slept"

    arun(main())


def test_N_6_two_tasks_in_two_runs_on_one_loop_are_each_stopped_by_their_own_run() -> None:
    clock = FakeClock()

    async def block(time_grant):
        try:
            async with nb.budget(time=time_grant, clock=clock) as run:
                await asyncio.sleep(30)
        except nb.BudgetCut:
            return run.name, clock.now_ms()

    async def main():
        short = asyncio.create_task(block("1s"))
        long = asyncio.create_task(block("3s"))
        await asyncio.sleep(0)
        clock.advance("1500ms")
        await asyncio.wait({short}, timeout=5)
        assert short.done() and not long.done()
        clock.advance("2s")
        return await short, await long

    (_, short_at), (_, long_at) = arun(main())
    assert (short_at, long_at) == (1500, 3500)


def _hold_the_loop(seconds: float) -> None:
    """Python that never awaits (a function of its own: on 3.13 an interrupt in a `while`
    loop's condition skips the handlers of the loop's own function, CPython issue 130279)."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        pass


def test_N_6_on_the_main_thread_code_that_holds_the_loop_is_stopped_inside_the_block() -> None:
    async def main():
        started = time.monotonic()
        with pytest.raises(nb.BudgetCut):
            async with nb.budget(time="200ms"):
                _hold_the_loop(10)
        return time.monotonic() - started

    assert threading.current_thread() is threading.main_thread()
    assert arun(main()) < 5


def test_N_6_a_with_block_in_a_coroutine_is_stopped_at_its_await() -> None:
    async def main():
        started = time.monotonic()
        with pytest.raises(nb.BudgetCut), nb.budget(time="200ms"):
            await asyncio.sleep(10)
        await asyncio.sleep(0)  # the loop goes on: nothing was raised into it
        return time.monotonic() - started

    assert arun(main()) < 5


def test_N_7_off_the_main_thread_a_block_that_never_awaits_says_how_long_it_went_on() -> None:
    out: list[BaseException] = []

    async def main():
        started = time.monotonic()
        try:
            async with nb.budget(time="100ms"):
                while time.monotonic() - started < 0.6:
                    pass
                await asyncio.sleep(0)  # the cancel lands here
        except nb.BudgetCut as cut:
            out.append(cut)

    thread = threading.Thread(target=arun, args=(main(),), name="async-budget-loop")
    thread.start()
    thread.join()
    assert "without awaiting: off the main thread, a coroutine stops only at an await" \
        in str(out[0])


def test_N_6_a_cancel_as_the_async_block_ends_is_raised_in_it_or_not_at_all() -> None:
    """A thread cancels the run at every moment around the async block's end: the block ends
    with `nb.Cancelled` or completes, and no `CancelledError` reaches the code after it."""
    outcomes: dict[str, int] = {}

    async def rounds() -> None:
        for i in range(200):
            run = nb.budget()
            go = threading.Event()

            def cancel(run: nb.Budget = run, go: threading.Event = go) -> None:
                go.wait()
                run.cancel("race")

            canceller = threading.Thread(target=cancel, name=f"test-async-race-{i}")
            canceller.start()
            try:
                async with run:
                    go.set()
                    for _ in range(i % 20 * 50):
                        pass
                    await asyncio.sleep(0)
            except nb.Cancelled:
                pass
            canceller.join()
            await asyncio.sleep(0)  # the code after the block: no cancel may land here
            await asyncio.sleep(0.0005)
            status = run.outcome.status.value
            outcomes[status] = outcomes.get(status, 0) + 1
        if sys.version_info >= (3, 11):
            assert asyncio.current_task().cancelling() == 0

    arun(rounds())
    assert set(outcomes) <= {"stopped", "completed"}
    assert sum(outcomes.values()) == 200
