"""What a call is planned into, as a job runner sees it, and the run a detached call leaves
unmade (S0-1, S0-2, S0-6, S0-7, S0-11).

A call is planned once into a frozen plan, which the job runner is given as the call's work
(`nbbudget.calls.runner.Work`) whichever way the call runs: the usual call that may detach, a
resumable one, one with a wall clock. Detaching says so in the run's trace (``detached``)
without making a run the work never used: the event is traced, at the time the job detached,
if anything makes the run later.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.calls.call import _identity
from nbbudget.calls.jobs import Job
from nbbudget.calls.runner import Backend, LocalRunner, Work, jobs, use_backend
from nbbudget.core import workers
from nbbudget.testing import FakeClock, MemoryStore

SOON = 5.0

pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")


class _Recording(LocalRunner):
    """The local runner, keeping the work each start was given (what a second backend sees)."""

    def __init__(self) -> None:
        super().__init__(jobs)
        self.started: list[Work] = []

    def start(self, work: Work, job: Job | None, task: workers.Task, *, detachable: bool,
              **options: Any) -> None:
        self.started.append(work)
        super().start(work, job, task, detachable=detachable, **options)


def _work(x: int, *, y: int) -> int:
    return x + y


@pytest.mark.parametrize(("options", "expected"), [
    ({"detach": True, "budget": "5s"},
     {"detach": True, "resume": False, "budget_ms": 5000, "timeout_ms": None,
      "estimate_ms": None}),
    ({"detach": True, "budget": "5s", "timeout": "9s", "estimate_ms": 100},
     {"detach": True, "resume": False, "budget_ms": 5000, "timeout_ms": 9000,
      "estimate_ms": 100}),
    ({"resume": True, "budget": "4s"},
     {"detach": False, "resume": True, "budget_ms": 4000, "timeout_ms": None,
      "estimate_ms": None}),
], ids=["the-usual-call", "with-a-wall-clock", "resumable"])
def test_S0_11_the_runner_is_given_the_calls_plan_frozen_whichever_way_it_runs(options, expected):
    runner = _Recording()
    limits = nb.Limits(steps=7)
    with use_backend(Backend(runner, lambda: MemoryStore())):
        resp = nb.call(_work, 1, y=2, key="planned", limits=limits, notices=(0.5, 0.9),
                       **options)
    assert resp.ok and resp.data == 3
    (work,) = runner.started
    assert {name: getattr(work, name) for name in expected} == expected
    assert work.work == (_work, (1,), {"y": 2}, "planned")
    assert work.label == "planned" and work.limits == limits and work.notices == (0.5, 0.9)
    assert work.identity == _identity(_work, (1,), {"y": 2}, "planned")
    with pytest.raises(dataclasses.FrozenInstanceError):
        work.budget_ms = 1  # type: ignore[misc]  # what the runner is given cannot be changed


def test_S0_2_a_detached_call_leaves_the_run_its_work_never_used_unmade():
    clock = FakeClock()
    release = threading.Event()

    def crunch() -> str:
        assert clock.waiting.wait(SOON), "the caller never started waiting"
        clock.advance("2s")  # past its budget of 1 s: the caller detaches it
        release.wait(SOON)
        return "crunched"

    resp = nb.call(crunch, detach=True, budget="1s", clock=clock)
    assert resp.exit_code == 14 and resp.data["state"] == "running"
    job = nb.jobs[resp.data["job"]]
    assert job.run_made() is None  # detaching made no run
    release.set()
    assert job.result(timeout=SOON) == "crunched"
    assert job.run_made() is None  # nor did the work's end
    # read now, the run says what happened, at the times it happened
    events = [(event.kind, event.payload, event.t_ms) for event in job.run.trace]
    assert events[0] == ("detached", {"job": job.id}, 2000.0)
    assert [kind for kind, _, _ in events] == ["detached", "outcome"]
    assert job.run.outcome == nb.Outcome(nb.Status.COMPLETED)


def test_S0_2_work_that_uses_its_run_after_it_detached_finds_detached_first_in_its_trace():
    clock = FakeClock()
    release = threading.Event()

    def crunch() -> int:
        assert clock.waiting.wait(SOON), "the caller never started waiting"
        clock.advance("2s")
        release.wait(SOON)
        clock.advance("500ms")
        run = nb.current()  # made now, after it detached
        assert run is not None
        with pytest.raises(nb.BudgetExceeded):
            run.charge("tool_calls", 2)  # refused: one tool call is all it may make
        return 1

    resp = nb.call(crunch, detach=True, budget="1s", clock=clock,
                   limits=nb.Limits(tool_calls=1))
    assert resp.exit_code == 14
    job = nb.jobs[resp.data["job"]]
    release.set()
    assert job.result(timeout=SOON) == 1
    events = [(event.kind, event.t_ms) for event in job.run.trace]
    assert events == [("detached", 2000.0), ("dispatch_refused_budget_exceeded", 2500.0),
                      ("outcome", 2500.0)]
