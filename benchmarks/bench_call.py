#!/usr/bin/env python3
"""Speed benchmark of call budgets (``nb.call``), as ratios against peers measured in the same run.

    python benchmarks/bench_call.py            # about a minute on 2 cores
    python benchmarks/bench_call.py --quick    # smoke mode

1. INCOMPLETE lateness: how long after its budget a ``detach`` call whose work is CPU-bound
   returns, median and p99 over N calls, against the lateness of ``stopit.ThreadingTimeout``
   around the same work (goal: at most 1.0x). The same with the work blocked in C
   (``time.sleep``): goal within 2 ms of the budget.
2. Handoff: ``nb.call`` on a trivial function (with a budget, so it runs on a worker; and with
   none, so it runs in place) against ``ThreadPoolExecutor(1).submit(f).result()``
   (goal: at most 1.0x).
3. Checkpoint save of a 1 KB and a 1 MB state against a bare durable SQLite commit of the same
   bytes (WAL, synchronous=FULL, BEGIN IMMEDIATE) (goal: at most 2x).

Exit status 0 when the run completed (goals may be MISSed), 1 when a section raised.
"""

from __future__ import annotations

import argparse
import gc
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import nbbudget as nb
from nbbudget.calls.store import SQLiteStore

pc = time.perf_counter


def busy(seconds: float) -> int:
    """Pure-Python CPU work for about *seconds*, checking nothing."""
    end = pc() + seconds
    n = 0
    while pc() < end:
        n += 1
    return n


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def lateness_nb(budget_s: float, work: Callable[[], object], n: int) -> list[float]:
    out = []
    for i in range(n):
        start = pc()
        response = nb.call(work, detach=True, budget=f"{round(budget_s * 1000)}ms",
                           key=f"lateness-{id(work)}-{i}")  # a new piece of work each time
        out.append((pc() - start - budget_s) * 1000)
        assert response.exit_code == 14, response
        nb.jobs[response.data["job"]].wait_done(10)
    return out


def lateness_stopit(budget_s: float, work: Callable[[], object], n: int) -> list[float]:
    import stopit

    out = []
    for _ in range(n):
        start = pc()
        with stopit.ThreadingTimeout(budget_s):
            work()
        out.append((pc() - start - budget_s) * 1000)
    return out


def per_call_us(fn: Callable[[], object], n: int) -> float:
    for _ in range(min(200, n)):
        fn()
    gc.collect()
    gc.disable()
    try:
        start = pc()
        for _ in range(n):
            fn()
        return (pc() - start) / n * 1e6
    finally:
        gc.enable()


def bare_commit(path: str, blob: bytes, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v BLOB)")

    def once() -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", ("k", blob))
        db.execute("COMMIT")

    try:
        return per_call_us(once, n)
    finally:
        db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small N, for a smoke run")
    parser.add_argument("--calls", type=int, default=50, help="calls per lateness case")
    args = parser.parse_args()
    calls = 10 if args.quick else args.calls
    handoffs = 500 if args.quick else 3000
    saves = 50 if args.quick else 300
    home = tempfile.mkdtemp(prefix="nbbudget-bench-")
    os.environ["NBBUDGET_HOME"] = home
    os.environ["NBBUDGET_INTERACTIVE"] = "0"
    budget_s = 0.05
    rows: list[tuple[str, str, str]] = []
    goals: list[tuple[str, bool, str]] = []
    print(f"nbbudget call benchmark: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"switchinterval {sys.getswitchinterval()} s, {calls} calls per lateness case")

    # 1. lateness
    cpu_work = lambda: busy(budget_s * 4)  # noqa: E731 - a value for both runners
    ours = lateness_nb(budget_s, cpu_work, calls)
    try:
        theirs = lateness_stopit(budget_s, cpu_work, calls)
    except ImportError:
        theirs = []
    blocked = lateness_nb(budget_s, lambda: time.sleep(budget_s * 4), calls)
    for name, values in (("nb.call detach, CPU-bound", ours),
                         ("stopit.ThreadingTimeout, CPU-bound", theirs),
                         ("nb.call detach, blocked in C", blocked)):
        if values:
            rows.append((name, f"{statistics.median(values):.2f} / "
                               f"{percentile(values, 0.99):.2f}", "ms late (median / p99)"))
        else:
            rows.append((name, "skipped", "pip install -e '.[bench]'"))
    if theirs:
        med = statistics.median(ours) / statistics.median(theirs)
        p99 = percentile(ours, 0.99) / percentile(theirs, 0.99)
        goals.append(("INCOMPLETE lateness <= 1.0x stopit (median)", med <= 1.0, f"{med:.2f}"))
        goals.append(("INCOMPLETE lateness <= 1.0x stopit (p99)", p99 <= 1.0, f"{p99:.2f}"))
    goals.append(("blocked in C: back within 2 ms of the budget (median)",
                  statistics.median(blocked) <= 2.0, f"{statistics.median(blocked):.2f} ms"))

    # 2. handoff
    def trivial() -> int:
        return 1

    pool = ThreadPoolExecutor(1)
    try:
        tpe = per_call_us(lambda: pool.submit(trivial).result(), handoffs)
        worker = per_call_us(lambda: nb.call(trivial, detach=True, budget="30s"), handoffs)
        inline = per_call_us(lambda: nb.call(trivial), handoffs)
    finally:
        pool.shutdown()
    rows += [("ThreadPoolExecutor(1).submit(f).result()", f"{tpe:.1f}", "us/call"),
             ("nb.call(f, detach=True, budget='30s')", f"{worker:.1f}", "us/call"),
             ("nb.call(f) (no budget: runs in place)", f"{inline:.1f}", "us/call")]
    goals.append(("nb.call with a budget <= 1.0x ThreadPoolExecutor", worker / tpe <= 1.0,
                  f"{worker / tpe:.2f}"))
    goals.append(("nb.call without a budget <= 1.0x ThreadPoolExecutor", inline / tpe <= 1.0,
                  f"{inline / tpe:.2f}"))

    # 3. checkpoint saves
    store = SQLiteStore(os.path.join(home, "store"))
    ledger = nb.Budget(steps=10).state()
    for size, label in ((1024, "1 KB"), (1024 * 1024, "1 MB")):
        blob = os.urandom(size)
        n = saves if size < 100_000 else max(20, saves // 10)
        ours_us = per_call_us(lambda blob=blob: store.save_checkpoint(
            "bench", blob, ledger=ledger, first_start=0.0, label="bench"), n)
        bare_us = bare_commit(os.path.join(home, f"bare-{size}.db"), blob, n)
        rows += [(f"checkpoint save, {label}", f"{ours_us:.0f}", "us"),
                 (f"bare durable SQLite commit, {label}", f"{bare_us:.0f}", "us")]
        goals.append((f"checkpoint save {label} <= 2x a bare commit", ours_us / bare_us <= 2.0,
                      f"{ours_us / bare_us:.2f}"))

    width = max(len(r[0]) for r in rows) + 2
    print()
    for name, value, unit in rows:
        print(f"{name:<{width}}{value:>18}  {unit}")
    print("\ngoals" + (" (quick mode: indicative only)" if args.quick else ""))
    for name, ok, value in goals:
        print(f"  {'PASS' if ok else 'MISS'}  {name:<58}{value:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
