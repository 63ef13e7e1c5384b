#!/usr/bin/env python3
"""Speed benchmark of call budgets (``nb.call``), as ratios against peers measured in the same run.

    python benchmarks/bench_call.py            # about a minute on 2 cores
    python benchmarks/bench_call.py --quick    # smoke mode

1. INCOMPLETE lateness: how long after its budget a ``detach`` call whose work is CPU-bound
   returns, median and p99 over N calls, against the lateness of ``stopit.ThreadingTimeout``
   around the same work, one call of each in turn (goal: at most 1.0x). The same with the work
   blocked in C
   (``time.sleep``): goal within 2 ms of the budget. Under load the GIL and the scheduler can hold
   a caller past its budget for long enough that CPU-bound work finishes first (150-370 ms were
   seen, for stopit too): such a call is counted, not asserted INCOMPLETE.
2. Handoff: ``nb.call`` on a trivial function (with a budget, so it runs on a worker; and with
   none, so it runs in place) against ``ThreadPoolExecutor(1).submit(f).result()``
   (goal: at most 1.0x, in CPU time). Wall-clock ratios swing from 0.3x to 6x on a shared
   machine; the CPU time of the whole process (``time.process_time``, every thread) holds, so
   the goal is judged on it. The peer runs interleaved with the calls in this process, in
   blocks, the order rotated every rep; medians are printed with the spread (min..max). The
   section runs in a fresh process of its own (so no worker or core placement is left from
   section 1), as the scheduler places its threads; then again with every thread on one core
   (``taskset -c 0``, where it exists), and with the caller on one core and every other thread
   on another (``os.sched_setaffinity``): a handoff to a thread on the caller's own core costs
   less than half of one that wakes another core, and the scheduler chooses between them.
3. Checkpoint save of a 1 KB and a 1 MB state against a bare durable SQLite commit of the same
   bytes (WAL, synchronous=FULL, BEGIN IMMEDIATE), in interleaved rounds (goal: at most 2x).

Exit status 0 when the run completed (goals may be MISSed), 1 when a section raised.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import nbbudget as nb
from nbbudget.calls.store import SQLiteStore
from nbbudget.core import workers

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


def late_nb(budget_s: float, work: Callable[[], object], i: int) -> tuple[float, bool]:
    """How late one call came back after its budget, and whether it finished in place (held
    past its budget by the GIL and the scheduler until the work itself was done)."""
    start = pc()
    response = nb.call(work, detach=True, budget=f"{round(budget_s * 1000)}ms",
                       key=f"lateness-{id(work)}-{i}")  # a new piece of work each time
    late = (pc() - start - budget_s) * 1000
    if response.exit_code == 14:
        nb.jobs[response.data["job"]].wait_done(10)
        return late, False
    return late, True


def late_stopit(budget_s: float, work: Callable[[], object]) -> float:
    import stopit

    start = pc()
    with stopit.ThreadingTimeout(budget_s):
        work()
    return (pc() - start - budget_s) * 1000


def cpu_us(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """CPU time of the whole process (every thread) and wall time per call, in us, over *n*
    calls with the garbage collector off."""
    gc.collect()
    gc.disable()
    try:
        cpu, wall = time.process_time(), pc()
        for _ in range(n):
            fn()
        return (time.process_time() - cpu) / n * 1e6, (pc() - wall) / n * 1e6
    finally:
        gc.enable()


def interleaved(cases: dict[str, Callable[[], object]], n: int, reps: int,
                before: Callable[[], None] = lambda: None) -> dict[str, list[tuple[float, float]]]:
    """(CPU, wall) us per call of each case, one block of *n* calls of each in turn per rep,
    the order rotated every rep, after a warm-up of each; *before* runs before each block."""
    names = list(cases)
    for fn in cases.values():
        for _ in range(min(200, n)):
            fn()
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            before()
            out[name].append(cpu_us(cases[name], n))
    return out


def spread(values: list[float], digits: int = 1) -> str:
    """The median, and the min..max beside it."""
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}..{max(values):.{digits}f})")


#: where section 2 runs its threads: each placement in a process of its own
PLACEMENTS = {
    "placed": "as the scheduler places the threads",
    "one-core": "every thread on one core (taskset -c 0)",
    "two-cores": "the caller on one core, every other thread on another",
}


def handoff(n: int, reps: int, placement: str = "placed"
            ) -> tuple[list[tuple[str, str, str]], dict[str, list[float]]]:
    """Section 2 in this process: rows to print, and the per-rep CPU ratios of each nb.call
    case to the executor. With *placement* ``two-cores``, this thread runs on the first core
    it may use and every other thread (the executor's, the workers) on the second, set again
    before each block (a thread started since would run beside the caller)."""
    def trivial() -> int:
        return 1

    before = (lambda: None) if placement != "two-cores" else _split_cores()
    pool = ThreadPoolExecutor(1)
    try:
        got = interleaved({
            "tpe": lambda: pool.submit(trivial).result(),
            "worker": lambda: nb.call(trivial, detach=True, budget="30s"),
            "inline": lambda: nb.call(trivial)}, n, reps, before)
    finally:
        pool.shutdown()
    names = {"tpe": "ThreadPoolExecutor(1).submit(f).result()",
             "worker": "nb.call(f, detach=True, budget='30s')",
             "inline": "nb.call(f) (no budget: runs in place)"}
    rows = []
    for key, name in names.items():
        rows.append((f"{name}, CPU", spread([c for c, _ in got[key]]), "us/call med (min..max)"))
        rows.append((f"{name}, wall", spread([w for _, w in got[key]]), "us/call med (min..max)"))
    ratios = {key: [c / t for (c, _), (t, _) in zip(got[key], got["tpe"], strict=True)]
              for key in ("worker", "inline")}
    for key in ratios:
        rows.append((f"{names[key]} / executor, CPU", spread(ratios[key], 2),
                     "x med (min..max)"))
    return rows, ratios


def _split_cores() -> Callable[[], None]:
    """What puts this thread on the first core it may use and every other thread of the
    process on the second."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    me = threading.get_native_id()
    workers.IDLE_SECONDS = 3600.0  # no idle worker ends, so none starts again beside the caller

    def split() -> None:
        os.sched_setaffinity(0, {first})
        for thread in threading.enumerate():
            if thread.native_id not in (None, me):
                with contextlib.suppress(OSError):  # it ended meanwhile
                    os.sched_setaffinity(thread.native_id, {second})
    return split


def placed_handoff(n: int, reps: int, placement: str
                   ) -> tuple[list[tuple[str, str, str]], dict[str, list[float]]] | None:
    """Section 2 in a fresh process with *placement* (so no thread or core is left from
    another section): its rows and ratios, or None where the placement cannot be made."""
    command = [sys.executable, __file__, "--handoff-only", "--placement", placement,
               "--handoffs", str(n), "--reps", str(reps)]
    if placement == "one-core":
        if shutil.which("taskset") is None:
            return None
        command = ["taskset", "-c", "0", *command]
    elif placement == "two-cores" and (not hasattr(os, "sched_setaffinity")
                                       or len(os.sched_getaffinity(0)) < 2):
        return None
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return [tuple(row) for row in found["rows"]], found["ratios"]


def bare_commit(path: str, blob: bytes) -> tuple[Callable[[], None], Callable[[], None]]:
    """One bare durable SQLite commit of *blob* (WAL, synchronous=FULL, BEGIN IMMEDIATE), and
    what closes its connection."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v BLOB)")

    def once() -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", ("k", blob))
        db.execute("COMMIT")

    return once, db.close


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small N, for a smoke run")
    parser.add_argument("--calls", type=int, default=100,
                        help="calls per CPU-bound lateness case (half as many blocked in C)")
    parser.add_argument("--handoffs", type=int, default=None, help="calls per handoff block")
    parser.add_argument("--reps", type=int, default=None, help="interleaved handoff reps")
    parser.add_argument("--handoff-only", action="store_true",
                        help="only section 2, in this process, its last line its results as JSON")
    parser.add_argument("--placement", choices=list(PLACEMENTS), default="placed",
                        help="with --handoff-only: where its threads run")
    args = parser.parse_args()
    calls = 10 if args.quick else args.calls
    handoffs = args.handoffs or (300 if args.quick else 1000)
    reps = args.reps or (3 if args.quick else 9)
    saves = 50 if args.quick else 300
    home = tempfile.mkdtemp(prefix="nbbudget-bench-")
    os.environ["NBBUDGET_HOME"] = home
    os.environ["NBBUDGET_INTERACTIVE"] = "0"
    if args.handoff_only:
        found, ratios = handoff(handoffs, reps, args.placement)
        print(json.dumps({"rows": found, "ratios": ratios}))
        return 0
    rows: list[tuple[str, str, str]] = []
    goals: list[tuple[str, bool, str]] = []
    print(f"nbbudget call benchmark: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"switchinterval {sys.getswitchinterval()} s, {calls} calls per lateness case, "
          f"{reps} x {handoffs} handoffs per case, load {os.getloadavg()[0]:.2f}")
    lateness(calls, rows, goals)
    placed = placed_handoff(handoffs, reps, "placed")
    assert placed is not None
    rows += placed[0]
    ratios = placed[1]
    for placement in ("one-core", "two-cores"):
        other = placed_handoff(handoffs, reps, placement)
        rows.append((f"the same with {PLACEMENTS[placement]}, CPU ratio",
                     spread(other[1]["worker"], 2) if other is not None else "skipped",
                     "x med (min..max)"))
    for key, what in (("worker", "with a budget"), ("inline", "without a budget")):
        med = statistics.median(ratios[key])
        goals.append((f"nb.call {what} <= 1.0x ThreadPoolExecutor (CPU)", med <= 1.0,
                      f"{med:.2f}"))
    checkpoints(home, saves, rows, goals)
    width = max(len(r[0]) for r in rows) + 2
    print()
    for name, value, unit in rows:
        print(f"{name:<{width}}{value:>22}  {unit}")
    print("\ngoals" + (" (quick mode: indicative only)" if args.quick else ""))
    for name, ok, value in goals:
        print(f"  {'PASS' if ok else 'MISS'}  {name:<58}{value:>10}")
    return 0


def lateness(calls: int, rows: list[tuple[str, str, str]],
             goals: list[tuple[str, bool, str]]) -> None:
    """Section 1: INCOMPLETE lateness, CPU-bound against stopit one call each in turn (the
    order swapped every pair), then blocked in C."""
    budget_s = 0.05
    cpu_work = lambda: busy(budget_s * 4)  # noqa: E731 - a value for both runners
    try:
        import stopit
    except ImportError:
        stopit = None
    ours: list[float] = []
    theirs: list[float] = []
    finished = 0
    for i in range(calls):
        if stopit is not None and i % 2:
            theirs.append(late_stopit(budget_s, cpu_work))
        late, in_place = late_nb(budget_s, cpu_work, i)
        ours.append(late)
        finished += in_place
        if stopit is not None and not i % 2:
            theirs.append(late_stopit(budget_s, cpu_work))
    blocked = [late_nb(budget_s, lambda: time.sleep(budget_s * 4), i)[0]
               for i in range(calls // 2)]
    for name, values in (("nb.call detach, CPU-bound", ours),
                         ("stopit.ThreadingTimeout, CPU-bound", theirs),
                         ("nb.call detach, blocked in C", blocked)):
        if values:
            rows.append((name, f"{statistics.median(values):.2f} / "
                               f"{percentile(values, 0.99):.2f}", "ms late (median / p99)"))
        else:
            rows.append((name, "skipped", "pip install -e '.[bench]'"))
    rows.append(("CPU-bound calls held until their work ended", f"{finished} of {calls}",
                 "(load: not a failure)"))
    if theirs:
        med = statistics.median(ours) / statistics.median(theirs)
        p99 = percentile(ours, 0.99) / percentile(theirs, 0.99)
        goals.append(("INCOMPLETE lateness <= 1.0x stopit (median)", med <= 1.0, f"{med:.2f}"))
        goals.append(("INCOMPLETE lateness <= 1.0x stopit (p99)", p99 <= 1.0, f"{p99:.2f}"))
    goals.append(("blocked in C: back within 2 ms of the budget (median)",
                  statistics.median(blocked) <= 2.0, f"{statistics.median(blocked):.2f} ms"))


def checkpoints(home: str, saves: int, rows: list[tuple[str, str, str]],
                goals: list[tuple[str, bool, str]]) -> None:
    """Section 3: checkpoint saves against a bare durable SQLite commit of the same bytes,
    interleaved: five rounds, each a block of saves and a block of commits in turn, the order
    swapped every round (a disk's slow moments hit both alike); the ratio is the median of
    the rounds' ratios."""
    store = SQLiteStore(os.path.join(home, "store"))
    ledger = nb.Budget(steps=10).state()
    for size, label in ((1024, "1 KB"), (1024 * 1024, "1 MB")):
        blob = os.urandom(size)
        n = max(4, (saves if size < 100_000 else max(20, saves // 10)) // 5)
        bare, close = bare_commit(os.path.join(home, f"bare-{size}.db"), blob)
        cases = {"ours": lambda blob=blob: store.save_checkpoint(
            "bench", blob, ledger=ledger, first_start=0.0, label="bench"), "bare": bare}
        try:
            got = {name: [wall for _, wall in pairs] for name, pairs in
                   interleaved(cases, n, 5).items()}  # a disk's time is wall time
        finally:
            close()
        ratios = [o / b for o, b in zip(got["ours"], got["bare"], strict=True)]
        rows += [(f"checkpoint save, {label}", spread(got["ours"]), "us med (min..max)"),
                 (f"bare durable SQLite commit, {label}", spread(got["bare"]),
                  "us med (min..max)")]
        ratio = statistics.median(ratios)
        goals.append((f"checkpoint save {label} <= 2x a bare commit", ratio <= 2.0,
                      f"{ratio:.2f} ({min(ratios):.2f}..{max(ratios):.2f})"))


if __name__ == "__main__":
    raise SystemExit(main())
