"""A run on a cluster (``nb.budget(..., cluster=client)``, `nbbudget.backends.dask.ledger`): its
pool is a lease from the scheduler, refilled by one round trip, so a step costs what a local one
does; a stop made elsewhere reaches it; what cannot be kept there is refused with a fix.

The rules themselves run over the Dask ledger in the semantic suite (``LEDGERS`` in conftest);
these tests cover what only a cluster has.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("distributed")

import nbbudget as nb
from nbbudget.backends.dask.ledger import DaskLedger, on_cluster
from nbbudget.backends.dask.scheduler import Channel
from nbbudget.core.kinds import STEPS


def ledger_of(run: nb.Budget) -> DaskLedger:
    ledger = run.lowlevel.ledger
    assert isinstance(ledger, DaskLedger)
    return ledger


def per_step_ns(run: nb.Budget, n: int) -> float:
    step = run.step
    started = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - started) / n * 1e9


def test_a_step_on_a_cluster_costs_what_a_local_step_does(dask_client: Any) -> None:
    """The pool is the lease: its blocks grow while they last under 20 ms, so a million steps
    take a handful of round trips (best of 3 against the local run, to stay clear of noise)."""
    best = []
    for _ in range(3):
        with nb.budget(steps=10**7) as local:
            here = per_step_ns(local, 200_000)
        with nb.budget(steps=10**7, cluster=dask_client) as run:
            there = per_step_ns(run, 200_000)
            blocks = ledger_of(run).home.block[STEPS]
        best.append(there / here)
    assert min(best) <= 2.0
    assert blocks > 10_000
    assert run.consumed["steps"] == 200_000


def test_the_counters_are_on_the_scheduler_and_a_run_that_ends_gives_back_its_lease(
        dask_client: Any) -> None:
    with nb.budget(steps=1_000, tool_calls=5, cluster=dask_client) as run:
        for _ in range(10):
            run.step()
        run.charge("tool_calls", 2)
        ledger = ledger_of(run)
        scopes = Channel.of(dask_client).call("nbb_snapshot", run=ledger.key)["scopes"]
        held = len(ledger.home.pools[STEPS])
        assert scopes[ledger.key]["counts"] == {"steps": 10 + held, "tool_calls": 2}
        assert scopes[ledger.key]["leased"]["steps"] == 10 + held
    assert run.consumed == {"steps": 10, "tool_calls": 2, "run_ms": run.consumed["run_ms"]}
    assert Channel.of(dask_client).call("nbb_snapshot", run=ledger.key) == {"ok": False}


def test_a_refusal_has_the_schedulers_figures_and_is_traced(dask_client: Any) -> None:
    with nb.budget(tool_calls=3, cluster=dask_client) as run:
        grant = run.grant(tool_calls=2, name="search")
        grant.charge("tool_calls", 2)
        with pytest.raises(nb.BudgetExceeded) as own:
            grant.charge("tool_calls")
        run.charge("tool_calls")
        with pytest.raises(nb.BudgetExceeded) as runs:
            run.charge("tool_calls", 2)
    assert (own.value.scope, own.value.limit, own.value.consumed) == ("grant", 2, 2)
    assert (runs.value.scope, runs.value.limit, runs.value.consumed,
            runs.value.requested) == ("run", 3, 3, 2)
    refused = [e.payload for e in run.trace.events if e.kind ==
               "dispatch_refused_budget_exceeded"]
    assert [(p["limit_value"], p["consumed_value"]) for p in refused] == [(2, 2), (3, 3)]


def test_a_cancel_from_another_client_stops_the_run(dask_client: Any) -> None:
    run, other = nb.budget(steps=10**6, cluster=dask_client), Channel.of(dask_client)
    key, checks = ledger_of(run).key, []
    cancel = threading.Timer(0.1, other.call, ("nbb_cancel",),  # what another kernel sends
                             {"run": key, "scope": key, "reason": "from elsewhere"})
    with pytest.raises(nb.Cancelled, match="from elsewhere"), run:
        run.step()
        cancel.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            run.check()
            checks.append(1)
            time.sleep(0.001)
    cancel.join()
    assert run.outcome is not None and run.outcome.status == "stopped"
    assert checks  # it ran until the stop arrived


def test_a_cancel_here_stops_the_run_on_the_scheduler_too(dask_client: Any) -> None:
    run, channel = nb.budget(steps=10, cluster=dask_client), Channel.of(dask_client)
    with pytest.raises(nb.Cancelled), run:
        run.step()
        run.cancel("enough")
        key = ledger_of(run).key
        reply = channel.call("nbb_reserve", run=key, scope=key, items=[["steps", 1]],
                             rid="from-a-branch")
        assert reply["stopped"]["cause"] == "cancel"  # every other holder is refused
        assert channel.call("nbb_snapshot", run=key)["scopes"][key]["leased"] == {"steps": 0}
        run.step()


def test_a_scheduler_address_is_a_cluster_too(dask_client: Any) -> None:
    address = dask_client.scheduler.address
    with nb.budget(steps=3, cluster=address) as run:
        run.step()
    factory = on_cluster(address)
    try:
        assert run.consumed["steps"] == 1
        assert on_cluster(address) is factory  # one connection per address
    finally:
        factory.client.close()


def test_what_a_cluster_does_not_keep_is_refused_with_the_fix(dask_client: Any) -> None:
    with pytest.raises(nb.ConfigError, match="suspend=True is not kept on a cluster"):
        nb.budget(tokens=10, suspend=True, cluster=dask_client)
    with pytest.raises(nb.ConfigError, match="cluster= or ledger=, not both"):
        nb.budget(steps=1, cluster=dask_client, ledger=lambda *a, **k: None)
    with pytest.raises(nb.ConfigError, match=r"a distributed\.Client or a scheduler address"):
        nb.budget(steps=1, cluster=42)


def test_a_run_on_a_cluster_resumes_from_its_state_with_its_counters(dask_client: Any) -> None:
    with nb.budget(steps=10, tool_calls=3, cluster=dask_client) as first:
        for _ in range(4):
            first.step()
        first.charge("tool_calls", 2)
        state = first.state()
    assert state["counts"] == {"steps": 4, "tool_calls": 2}
    with nb.Budget.resume(state, cluster=dask_client) as second:
        second.step()
        with pytest.raises(nb.BudgetExceeded) as refused:
            second.charge("tool_calls", 2)
    assert (refused.value.limit, refused.value.consumed) == (3, 2)
    assert second.consumed["steps"] == 5


def take(n: int) -> int:
    run = nb.current()
    assert run is not None
    for _ in range(n):
        run.step()
    return n


def test_the_panel_of_a_cluster_run_shows_what_its_branches_spent(dask_client: Any) -> None:
    pytest.importorskip("ipywidgets")
    from nbbudget.jupyter.panel import Panel, summary

    panel = Panel(nb.Limits(steps=100), widgets=True)
    with nb.budget(steps=100, name="cell", cluster=dask_client) as run:
        panel.attach(run)
        run.map(take, [10, 20])  # on the workers: the kernel's run took none itself
        snap = run.snapshot()
        panel._draw(snap, summary(snap))
        assert panel._view.labels["steps"].value == "30 / 100"
    panel.end_cell()
