"""``nb.step()``, ``nb.check()`` and ``nb.charge()``: the current run's own, called at module
level (S4-3); outside every run, a `nb.ConfigError` that says how to get a run."""

from __future__ import annotations

import threading

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock


def no_run(name: str) -> str:
    return (f"nb.{name}() found no active run (nb.current() is None here): run it in a cell "
            f"that starts with %%budget, inside `with nb.budget(...):`, or in the work of "
            f"nb.call(...)")


@pytest.mark.parametrize(("name", "call"), [
    ("step", nb.step), ("check", nb.check), ("charge", lambda: nb.charge("tool_calls"))])
def test_outside_every_run_each_says_there_is_none_and_how_to_get_one(name, call) -> None:
    assert nb.current() is None
    with pytest.raises(nb.ConfigError) as info:
        call()
    assert str(info.value) == no_run(name)


def test_they_charge_and_check_the_run_of_the_with_block() -> None:
    with pytest.raises(nb.BudgetExceeded) as info, nb.budget(steps=3, tool_calls=5) as run:
        nb.step()
        nb.charge("tool_calls", 2, target="tool:search")
        nb.charge("steps")
        nb.check()
        assert (run.consumed["steps"], run.consumed["tool_calls"]) == (2, 2)
        nb.charge("steps", 2)  # one left: refused, nothing spent
    assert (info.value.kind, info.value.consumed, info.value.requested) == ("steps", 2, 2)
    assert (run.consumed["steps"], run.consumed["tool_calls"]) == (2, 2)
    assert run.outcome is not None and run.outcome.by == "steps"
    with pytest.raises(nb.ConfigError, match="'run_ms' is not a budget kind"), nb.budget():
        nb.charge("run_ms")  # the clock spends time, not charge()


def test_they_reach_the_innermost_run_a_grant_included() -> None:
    with nb.budget(steps=10) as run, run.grant(steps=1) as grant:
        nb.step()
        with pytest.raises(nb.BudgetExceeded, match="limit of 1"):
            nb.step()
    assert grant.consumed["steps"] == 1 and run.consumed["steps"] == 1


def test_check_raises_once_the_run_is_cancelled_or_out_of_time() -> None:
    with pytest.raises(nb.Cancelled, match="enough"), nb.budget(name="loop") as run:
        nb.check()
        run.cancel("enough")
        nb.check()
    clock = FakeClock()
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(time="1s", clock=clock):
        nb.check()
        clock.advance("1s")
        nb.check()
    assert cut.value.by == "timeout"


def test_in_the_work_of_a_call_they_charge_the_calls_run() -> None:
    def two_steps() -> str:
        nb.step()
        nb.step()
        return "done"

    response = nb.call(two_steps, limits=nb.Limits(steps=1))
    assert not response.ok and response.error["code"] == "StepBudgetExceeded"
    assert nb.call(two_steps, limits=nb.Limits(steps=2)).data == "done"


def test_a_thread_started_in_a_run_has_none_of_its_own() -> None:
    seen: list[BaseException] = []

    def step() -> None:
        try:
            nb.step()
        except nb.ConfigError as exc:
            seen.append(exc)

    with nb.budget(steps=5) as run:
        thread = threading.Thread(target=step)
        thread.start()
        thread.join()
    assert [str(e) for e in seen] == [no_run("step")] and "steps" not in run.consumed


def test_a_kernel_cell_steps_its_run_and_a_plain_cell_is_told_to_use_budget(
        tmp_path_factory) -> None:
    from test_magic_kernel import run, started_kernel

    kernel = started_kernel(tmp_path_factory)
    kc = next(kernel)
    try:
        cut = run(kc, "%%budget --steps 2 --no-widget\nfor row in range(5):\n    nb.step()\n")
        assert cut.status == "error" and cut.reply["content"]["ename"] == "BudgetExceeded"
        assert "limit of 2" in cut.reply["content"]["evalue"]
        plain = run(kc, "nb.step()")
        assert plain.status == "error" and plain.reply["content"]["ename"] == "ConfigError"
        assert plain.reply["content"]["evalue"] == no_run("step")
    finally:
        next(kernel, None)
