#!/usr/bin/env python3
"""A run on a Dask cluster, measured in one run: the ledger's reservation round trip against
Dask's own ``Semaphore`` acquire+release, the cost of a step with leases against a local
``run.step()``, the time a cancel takes to reach every branch, and exactness of 8 branches x
10,000 steps against 50,000, on an in-process cluster and on worker processes.

    python benchmarks/bench_dask.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import cloudpickle
from distributed import Client, LocalCluster, Semaphore

import nbbudget as nb
from nbbudget.backends.dask.scheduler import Channel, install

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def round_trips(n: int) -> tuple[float, float]:
    """p50 µs, from a task: one ledger reservation, and one Semaphore acquire+release."""
    channel, run = Channel.here(), f"bench-{uuid.uuid4().hex}"
    channel.call("nbb_open", run=run, scope=run, limits={"steps": 10**9})
    semaphore = Semaphore(max_leases=1, name=f"bench-{run}")
    ledger, dask = [], []
    for k in range(n):
        started = time.perf_counter()
        channel.call("nbb_reserve", run=run, scope=run, items=[["steps", 1]], rid=str(k))
        ledger.append(time.perf_counter() - started)
        started = time.perf_counter()
        semaphore.acquire()
        semaphore.release()
        dask.append(time.perf_counter() - started)
    channel.call("nbb_close", run=run)
    semaphore.close()
    return statistics.median(ledger) * 1e6, statistics.median(dask) * 1e6


def step_costs(n: int) -> tuple[float, float]:
    """ns per step, best of 3 in this worker: a local run, and this branch's run."""

    def per_step(run: nb.Budget) -> float:
        step, started = run.step, time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - started) / n * 1e9

    with nb.budget(steps=10**9) as local:
        here = min(per_step(local) for _ in range(3))
    branch = nb.current()
    assert branch is not None
    return here, min(per_step(branch) for _ in range(3))


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


def spin(_: int) -> float:
    run = nb.current()
    assert run is not None
    try:
        while True:
            run.step()
    except BaseException:
        return time.time()


def cancel_ms(client: Client) -> float:
    run, sent = nb.budget(steps=10**9, cluster=client), []

    def cancel() -> None:
        time.sleep(0.5)
        sent.append(time.time())
        run.cancel("bench")

    thread = threading.Thread(target=cancel)
    thread.start()
    seen: list[float] = []
    try:
        with run:
            seen = run.map(spin, range(4))
    except nb.Cancelled:
        pass
    thread.join()
    return (max(seen) - sent[0]) * 1000


def measure(client: Client, quick: bool) -> dict[str, Any]:
    install(client)
    ledger_us, semaphore_us = client.submit(round_trips, 300 if quick else 2_000,
                                            pure=False).result()
    with nb.budget(steps=10**9, cluster=client) as run:
        costs = run.map(step_costs, [100_000 if quick else 1_000_000] * 2)
    with nb.budget(steps=50_000, cluster=client) as run:
        taken = run.map(steps_until_refused, [10_000] * 8)
    return {"reserve_us": ledger_us, "semaphore_us": semaphore_us,
            "reserve_vs_semaphore": ledger_us / semaphore_us,
            "local_step_ns": min(c[0] for c in costs), "lease_step_ns": min(c[1] for c in costs),
            "step_ratio": min(c[1] / c[0] for c in costs),
            "cancel_ms": cancel_ms(client), "granted": sum(taken),
            "ledger_consumed": run.consumed["steps"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for processes in (False, True):
        with LocalCluster(processes=processes, n_workers=2, threads_per_worker=2,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            figures = measure(client, args.quick)
        print(f"{'processes' if processes else 'in-process'}:")
        for name, value in figures.items():
            print(f"  {name:22} {value:.3f}" if isinstance(value, float) else
                  f"  {name:22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
