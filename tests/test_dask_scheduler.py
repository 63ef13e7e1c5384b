"""The ledger on a Dask scheduler (`nbbudget.backends.dask.scheduler`): exactly the limit is ever
granted however many tasks reserve at once, over a run and its grants, all or nothing (S4-3);
a message sent twice charges once; a refusal names its scope, limit and consumption (S4-8);
spending after the fact passes a limit and says which (S4-10); a stop reaches the workers that
listen; installing twice keeps the counters.

Most tests use an in-process cluster; one runs the exactness check on worker processes.
"""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time
from typing import Any

import pytest

pytest.importorskip("distributed")

import cloudpickle
from conftest import dask_cluster
from distributed import get_worker

from nbbudget.backends.dask.scheduler import LISTENER_NAME, Channel, install
from nbbudget.dask import dask_setup

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # worker processes import no tests

_runs = itertools.count(1)


def new_run(client: Any, limits: dict[str, float], **kwargs: Any) -> tuple[Channel, str]:
    install(client)
    channel, run = Channel.of(client), f"test-run-{next(_runs)}-{time.monotonic_ns()}"
    assert channel.call("nbb_open", run=run, scope=run, limits=limits, **kwargs)["ok"]
    return channel, run


def holder(run: str, scope: str, n: int, block: int, tag: str, replay_every: int = 0) -> int:
    """A task taking up to *n* steps one by one from leases of *block*, as a run's pool does;
    every *replay_every*-th request is sent twice. The steps it got."""
    channel, me = Channel.here(), f"{get_worker().address}#{tag}"
    taken = pool = k = 0
    last: str | None = None
    while taken < n:
        if not pool:
            k += 1
            ask = {"run": run, "scope": scope, "items": [["steps", min(block, n - taken)]],
                   "rid": f"{tag}-{k}", "holder": me, "lease": True, "wait_s": 2.0,
                   "settle": [[last, 0]] if last else []}
            reply = channel.call("nbb_reserve", **ask)
            if replay_every and k % replay_every == 0:
                assert channel.call("nbb_reserve", **ask) == reply
            last = None
            if not reply["ok"]:
                break
            pool, last = reply["granted"][0][1], f"{tag}-{k}/steps"
        pool -= 1
        taken += 1
    if last:
        channel.call("nbb_settle", run=run, settle=[[last, pool]])
    return taken


def uneven(run: str, n: int, seed: int) -> tuple[int, list[dict[str, Any]]]:
    """*n* reservations of 1..7 steps each (no lease); what was granted, and the refusals."""
    channel, rng = Channel.here(), random.Random(seed)
    granted, refused = 0, []
    for k in range(n):
        amount = rng.randint(1, 7)
        reply = channel.call("nbb_reserve", run=run, scope=run, items=[["steps", amount]],
                             rid=f"u{seed}-{k}")
        if reply["ok"]:
            granted += amount
        else:
            refused.append(reply)
    return granted, refused


def steps_of(channel: Channel, run: str, scope: str | None = None) -> float:
    snap = channel.call("nbb_snapshot", run=run)
    return float(snap["scopes"][scope or run]["counts"].get("steps", 0))


def refusals(channel: Channel, run: str) -> list[dict[str, Any]]:
    events = channel.call("nbb_journal", run=run)["events"]
    return [e for e in events if e["event"] == "refused"]


def exactly_the_limit(client: Any, tasks: int, per_task: int, limit: int) -> None:
    channel, run = new_run(client, {"steps": limit})
    futures = [client.submit(holder, run, run, per_task, 100, f"t{i}", 10, pure=False)
               for i in range(tasks)]
    taken = client.gather(futures)
    assert sum(taken) == limit == steps_of(channel, run)
    assert channel.call("nbb_snapshot", run=run)["leases"] == 0
    refused = refusals(channel, run)
    assert len(refused) == sum(t < per_task for t in taken) > 0  # each short task was refused
    assert all(r["consumed"] + r["amount"] > r["limit"] for r in refused)
    channel.call("nbb_close", run=run)


def test_eight_tasks_of_ten_thousand_steps_get_exactly_fifty_thousand(dask_client: Any) -> None:
    exactly_the_limit(dask_client, 8, 10_000, 50_000)


def test_exact_on_worker_processes(dask_process_client: Any) -> None:
    exactly_the_limit(dask_process_client, 8, 10_000, 50_000)


def test_uneven_amounts_never_pass_the_limit_and_every_refusal_is_genuine(
        dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 20_000})
    results = dask_client.gather([dask_client.submit(uneven, run, 1_000, seed, pure=False)
                                  for seed in range(8)])
    granted = sum(g for g, _ in results)
    assert granted == steps_of(channel, run)
    assert 20_000 - 7 < granted <= 20_000
    refused = [r for _, rs in results for r in rs]
    assert refused and all(r["consumed"] + r["amount"] > r["limit"] for r in refused)
    assert {(r["scope"], r["kind"], r["limit"]) for r in refused} == {(run, "steps", 20_000)}


@pytest.mark.parametrize(("run_limit", "grant_total", "run_total"),
                         [(50_000, 7_000, 28_000), (20_000, None, 20_000)])
def test_grants_and_their_run_bind_exactly(dask_client: Any, run_limit: int,
                                           grant_total: int | None, run_total: int) -> None:
    channel, run = new_run(dask_client, {"steps": run_limit})
    grants = [f"{run}/g{i}" for i in range(4)]
    for name in grants:
        channel.call("nbb_open", run=run, scope=name, parent=run, limits={"steps": 7_000})
    futures = [dask_client.submit(holder, run, name, 10_000, 50, f"{name}-{j}", pure=False)
               for name in grants for j in range(2)]
    taken = dask_client.gather(futures)
    per_grant = [taken[2 * i] + taken[2 * i + 1] for i in range(4)]
    assert per_grant == [steps_of(channel, run, name) for name in grants]
    assert sum(taken) == run_total == steps_of(channel, run)
    if grant_total is not None:
        assert per_grant == [grant_total] * 4
    assert all(g <= 7_000 for g in per_grant)


def test_a_reservation_is_all_or_nothing_and_a_refusal_names_its_scope(
        dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 5, "tool_calls": 2})
    grant = f"{run}/g"
    channel.call("nbb_open", run=run, scope=grant, parent=run, limits={"steps": 3})
    reply = channel.call("nbb_reserve", run=run, scope=grant, items=[["steps", 4]], rid="a")
    assert reply == {"ok": False, "scope": grant, "grant": True, "kind": "steps", "limit": 3,
                     "consumed": 0, "amount": 4, "leased": 0, "final": True}
    assert channel.call("nbb_reserve", run=run, scope=grant, items=[["steps", 3]],
                        rid="b")["ok"]
    reply = channel.call("nbb_reserve", run=run, scope=run,
                         items=[["tool_calls", 1], ["steps", 3]], rid="c")
    assert (reply["scope"], reply["grant"], reply["kind"], reply["limit"], reply["consumed"]) \
        == (run, False, "steps", 5, 3)
    snap = channel.call("nbb_snapshot", run=run)["scopes"]
    assert snap[run]["counts"] == {"steps": 3}  # the tool call was not kept
    assert snap[grant]["counts"] == {"steps": 3}


def test_a_message_sent_again_charges_once_and_gets_the_first_answer(dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 10, "cost_usd": 1.0})
    ask = {"run": run, "scope": run, "items": [["steps", 6]], "rid": "same"}
    first = channel.call("nbb_reserve", **ask)
    assert first["ok"] and channel.call("nbb_reserve", **ask) == first
    assert steps_of(channel, run) == 6
    spent = {"run": run, "scope": run, "items": [["cost_usd", 0.75]], "rid": "spent"}
    assert channel.call("nbb_spend", **spent) == channel.call("nbb_spend", **spent)
    counts = channel.call("nbb_snapshot", run=run)["scopes"][run]["counts"]
    assert counts == {"steps": 6, "cost_usd": 0.75}


def test_spending_after_the_fact_passes_the_grant_then_the_run(dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"tokens": 100})
    grant = f"{run}/g"
    channel.call("nbb_open", run=run, scope=grant, parent=run, limits={"tokens": 50})
    reply = channel.call("nbb_spend", run=run, scope=grant, items=[["tokens", 120]], rid="s")
    assert reply["passed"] == [[grant, "tokens", 50, 120], [run, "tokens", 100, 120]]
    passed = [e for e in channel.call("nbb_journal", run=run)["events"] if e["event"] == "passed"]
    assert [(e["scope"], e["limit"]) for e in passed] == [(grant, 50), (run, 100)]


def test_leases_stop_short_of_each_approach_notice(dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 100}, notices=[0.8, 0.95])
    sizes, levels = [], []
    for k in range(7):
        reply = channel.call("nbb_reserve", run=run, scope=run, items=[["steps", 1_000]],
                             rid=f"l{k}", holder="kernel#1", lease=True)
        sizes.append(reply["granted"][0][1])
        levels.append(reply["notice_level"])
    # a fair share of what is free (half, with no other holder), cut at 79 and 94 of 100
    assert sizes == [50, 25, 4, 1, 10, 4, 1]
    assert levels == [0, 0, 0, 1, 1, 1, 2]
    notices = [e for e in channel.call("nbb_journal", run=run)["events"]
               if e["event"] == "approach_notice"]
    assert [(e["level"], e["threshold"]) for e in notices] == [(1, 0.8), (2, 0.95)]


def test_a_refusal_waits_for_another_holders_lease_to_come_back(dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 10})
    first = channel.call("nbb_reserve", run=run, scope=run, items=[["steps", 10]], rid="a",
                         holder="kernel#a", lease=True)
    assert first["granted"] == [["steps", 5]]  # half of what is free, with no other holder
    settle = threading.Timer(0.2, channel.call, ("nbb_settle",),
                             {"run": run, "settle": [["a/steps", 4]]})
    settle.start()
    started = time.monotonic()
    reply = channel.call("nbb_reserve", run=run, scope=run, items=[["steps", 8]], rid="b",
                         holder="kernel#b", wait_s=5.0)
    settle.join()
    assert reply["ok"] and 0.15 < time.monotonic() - started < 4
    assert steps_of(channel, run) == 1 + 8


def watch_for_stop(run: str, wait_s: float) -> float:
    """Wait in a task for the ledger's push of a stop of *run*; seconds from its send time."""
    arrived: list[float] = []
    got = threading.Event()
    listener = get_worker().plugins[LISTENER_NAME]
    unwatch = listener.watch(run, lambda scope, stop: (arrived.append(time.time()), got.set()))
    try:
        assert got.wait(wait_s)
    finally:
        unwatch()
    return arrived[0]


def test_a_cancel_reaches_the_listening_workers_and_refuses_what_follows(
        dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 10})
    futures = [dask_client.submit(watch_for_stop, run, 10, pure=False, workers=[w])
               for w in dask_client.scheduler_info()["workers"]]
    time.sleep(0.3)  # the tasks are watching
    sent = time.time()
    assert channel.call("nbb_cancel", run=run, scope=run, reason="enough")["ok"]
    arrivals = dask_client.gather(futures)
    assert all(a - sent < 0.05 for a in arrivals)
    reply = channel.call("nbb_reserve", run=run, scope=run, items=[["steps", 1]], rid="late")
    assert reply["stopped"] == {"cause": "cancel", "reason": "enough", "how": None, "scope": run}


def test_the_whole_work_timeout_stops_the_run_on_the_schedulers_clock(
        dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 10}, timeout_ms=50)
    time.sleep(0.2)
    stopped = channel.call("nbb_snapshot", run=run)["scopes"][run]["stopped"]
    assert stopped == {"cause": "timeout", "reason": None, "how": None, "scope": run}


def test_installing_again_keeps_the_counters(dask_client: Any) -> None:
    channel, run = new_run(dask_client, {"steps": 10})
    channel.call("nbb_reserve", run=run, scope=run, items=[["steps", 7]], rid="x")
    install(dask_client)
    assert steps_of(channel, run) == 7


def test_a_scheduler_started_with_the_preload_has_the_ledger() -> None:
    with dask_cluster(processes=False,
                      scheduler_kwargs={"preload": ["nbbudget.dask"]}) as client:
        assert Channel.of(client).call("nbb_ping") == {"ok": True}
    assert callable(dask_setup)
