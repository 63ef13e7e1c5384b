"""Branches on a cluster: ``run.map`` and ``run.parallel`` of a run made with ``cluster=`` send
each branch to a worker, where ``nb.current()`` is the run: the same limits, exact across every
worker (S4-3), the time the run had left, and the run's stop, pushed to the workers (S2-3). A
branch whose worker dies is run again, and its steps are charged once; its calls, counted.

In-process cluster for most; worker processes for exactness, cancel, cost and a killed worker.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

import cloudpickle

import nbbudget as nb

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # worker processes import no tests


def steps_until_refused(n: int) -> int:
    run, taken = nb.current(), 0
    assert run is not None
    try:
        for _ in range(n):
            run.step()
            taken += 1
    except nb.BudgetExceeded:
        pass
    return taken


def exactly(client: Any) -> None:
    with nb.budget(steps=50_000, cluster=client) as run:
        taken = run.map(steps_until_refused, [10_000] * 8)
    assert sum(taken) == 50_000 == run.consumed["steps"]
    assert sorted(taken)[-1] == 10_000 and sorted(taken)[0] < 10_000


def test_eight_branches_of_ten_thousand_steps_get_exactly_fifty_thousand(
        dask_client: Any) -> None:
    exactly(dask_client)


def test_eight_branches_on_worker_processes_get_exactly_fifty_thousand(
        dask_process_client: Any) -> None:
    exactly(dask_process_client)


def uneven(seed: int) -> int:
    """Up to 200 tool calls of 1..7 each; what was granted."""
    run, rng, granted = nb.current(), random.Random(seed), 0
    assert run is not None
    for _ in range(200):
        amount = rng.randint(1, 7)
        try:
            run.charge("tool_calls", amount)
            granted += amount
        except nb.BudgetExceeded as refused:
            assert refused.consumed + refused.requested > refused.limit
    return granted


def test_uneven_charges_from_branches_never_pass_the_limit(dask_client: Any) -> None:
    with nb.budget(tool_calls=3_000, cluster=dask_client) as run:
        granted = run.map(uneven, range(8))
    assert sum(granted) == run.consumed["tool_calls"]
    assert 3_000 - 7 < sum(granted) <= 3_000


def test_the_schedulers_journal_of_the_run_is_mirrored_into_its_trace(dask_client: Any) -> None:
    with nb.budget(tool_calls=3_000, cluster=dask_client) as run:
        run.map(uneven, range(4))
    journal = [e.payload for e in run.trace.events if e.kind == "ledger"]
    assert [e["seq"] for e in journal] == list(range(1, len(journal) + 1))
    assert journal[0]["event"] == "run" and journal[0]["limits"] == {"tool_calls": 3_000}
    refused = [e for e in journal if e["event"] == "refused"]  # the branches' refusals, too
    assert refused and all(e["consumed"] + e["amount"] > e["limit"] == 3_000 for e in refused)


def in_a_grant(allowance: int) -> int:
    run = nb.current()
    assert run is not None
    with run.grant(steps=allowance) as grant:
        taken = 0
        try:
            while True:
                grant.step()
                taken += 1
        except nb.BudgetExceeded:
            return taken


def test_grants_in_branches_keep_their_allowance_and_the_run_its_limit(
        dask_client: Any) -> None:
    with nb.budget(steps=5_000, cluster=dask_client) as run:
        taken = run.map(in_a_grant, [700] * 8)  # 8 x 700 = 5,600: the run binds
    assert sum(taken) == 5_000 == run.consumed["steps"]
    assert all(t <= 700 for t in taken)
    with nb.budget(steps=50_000, cluster=dask_client) as run:
        taken = run.map(in_a_grant, [500] * 4)  # the grants bind
    assert taken == [500] * 4 and run.consumed["steps"] == 2_000


def what_the_branch_sees() -> dict[str, Any]:
    run = nb.current()
    assert run is not None
    run.step()
    return {"name": run.name, "limits": run.limits.to_dict(),
            "remaining_ms": run.remaining_ms, "steps_left": run.remaining("steps")}


def test_in_a_branch_the_run_is_current_with_its_limits_and_the_time_it_had_left(
        dask_client: Any) -> None:
    with nb.budget(steps=100, time="20s", name="sweep", cluster=dask_client) as run:
        run.step()
        seen = run.parallel([what_the_branch_sees, what_the_branch_sees])
    for branch in seen:
        assert branch["name"] == "sweep"
        assert branch["limits"]["steps"] == 100
        assert 0 < branch["remaining_ms"] <= 20_000  # shipped as time left, not a deadline
        assert branch["steps_left"] <= 98
    assert run.consumed["steps"] == 3


def interval(_: int) -> tuple[float, float]:
    started = time.monotonic()
    time.sleep(0.05)
    return started, time.monotonic()


def test_max_concurrency_bounds_the_branches_alive_at_once(dask_client: Any) -> None:
    with nb.budget(cluster=dask_client) as run:
        spans = sorted(run.map(interval, range(4), max_concurrency=1))
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    with pytest.raises(nb.ConfigError, match="exceed max_items=2"), \
            nb.budget(cluster=dask_client) as run:
        run.map(interval, range(3), max_items=2)


def spin_until_stopped(_: int) -> float:
    """Step with no limit until the run stops; the wall time when the stop was seen."""
    run = nb.current()
    assert run is not None
    try:
        while True:
            run.step()
    except BaseException:  # the stop, raised at the next step
        return time.time()


def test_a_cancel_reaches_every_branch_on_worker_processes_at_once(
        dask_process_client: Any) -> None:
    """Every branch sees the cancel at its next step, pushed to its worker (it does not wait
    for a lease to run out). The margin is generous: how fast it arrives (the 50 ms goal) is
    measured by ``benchmarks/bench_dask.py``."""
    run, sent = nb.budget(steps=10**9, cluster=dask_process_client), []  # leased steps

    def cancel_soon() -> None:
        time.sleep(0.5)
        sent.append(time.time())
        run.cancel("enough")

    canceller = threading.Thread(target=cancel_soon, name="canceller")
    canceller.start()
    with pytest.raises(nb.Cancelled, match="enough"), run:
        seen = run.map(spin_until_stopped, range(4))
    canceller.join()
    assert len(seen) == 4 and all(0 <= t - sent[0] < 1.0 for t in seen)
    assert run.outcome is not None and run.outcome.status == "stopped"


def step_costs(n: int) -> tuple[float, float]:
    """ns per step of a local run and of this branch's run, best of 3, in this worker."""

    def per_step(run: nb.Budget) -> float:
        step, started = run.step, time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - started) / n * 1e9

    with nb.budget(steps=10**8) as local:
        here = min(per_step(local) for _ in range(3))
    branch = nb.current()
    assert branch is not None
    return here, min(per_step(branch) for _ in range(3))


def test_a_step_in_a_branch_on_a_worker_process_is_taken_from_its_lease(
        dask_process_client: Any) -> None:
    """A step in a branch costs about what a local one does, not a round trip to the scheduler
    (which is thousands of times more): the bound is generous, and the 2x goal is measured by
    ``benchmarks/bench_dask.py``."""
    with nb.budget(steps=10**8, cluster=dask_process_client) as run:
        costs = run.map(step_costs, [200_000] * 2)
    assert min(there / here for here, there in costs) <= 20.0


def dies_once(marker: str, kind: str) -> str:
    """1,000 charges of *kind*; on its first attempt the worker process dies after 500."""
    run = nb.current()
    assert run is not None
    for i in range(1_000):
        run.charge(kind)
        if i == 499 and not os.path.exists(marker):
            Path(marker).touch()
            os._exit(1)
    return "done"


@pytest.mark.parametrize(("kind", "once"), [("steps", True), ("tool_calls", False)])
def test_a_branch_whose_worker_dies_runs_again_and_its_steps_are_charged_once(
        dask_process_client: Any, tmp_path: Path, kind: str, once: bool) -> None:
    marker = str(tmp_path / "died")
    with nb.budget(cluster=dask_process_client) as run:
        result = run.parallel([lambda: dies_once(marker, kind)])
    assert result == ["done"] and os.path.exists(marker)
    if once:  # the retry sent the first attempt's ids again: its steps were not charged twice
        assert run.consumed[kind] == 1_000
    else:  # the dead attempt's calls were real, and the permits it held count as spent
        assert run.consumed[kind] >= 1_500
    dask_process_client.wait_for_workers(2, timeout=30)


_reached = threading.Barrier(3)  # two branches and the test, on an in-process cluster
_release = threading.Event()


def steps_then_wait(_: int) -> int:
    run = nb.current()
    assert run is not None
    for _ in range(30):
        run.step()
    _reached.wait(10)
    _release.wait(10)
    return 30


def test_a_panel_shows_a_cluster_runs_counters_while_its_branches_run(dask_client: Any) -> None:
    """The panel's snapshot reads the scheduler's counters: what the branches spent on their
    workers shows while they still run, not only when they end."""
    from nbbudget.jupyter.panel import Panel, summary

    _reached.reset()
    _release.clear()
    limits = nb.Limits(steps=1_000)
    panel = Panel(limits, widgets=True)
    with nb.budget(limits, cluster=dask_client, name="sweep") as run:
        panel.attach(run)
        done: list[list[int]] = []
        mapper = threading.Thread(target=lambda: done.append(run.map(steps_then_wait, range(2))),
                                  name="sweep-map")
        mapper.start()
        try:
            _reached.wait(10)
            snap = run.snapshot()
            panel._draw(snap, summary(snap))
            used = snap.consumed["steps"]
            label = panel._view.labels["steps"].value
        finally:
            _release.set()
            mapper.join(20)
    assert done == [[30, 30]]
    assert 60 <= used <= 1_000 and label == f"{used:g} / 1000"
    panel.end_cell()
    assert run.consumed["steps"] == 60
