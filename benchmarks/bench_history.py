#!/usr/bin/env python3
"""What the history of runs costs a run: a ``with nb.budget()`` block that charges one step,
timed with the history off (no hook installed: plain Python) and on (the run queued for the
background writer), in interleaved reps; then the hook alone; then the CPU time of the
process a run, the rows written too.

    python benchmarks/bench_history.py            # about 20 s
    python benchmarks/bench_history.py --quick    # about 5 s
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import nbbudget as nb
from nbbudget.calls import history


def block(n: int) -> float:
    """Mean wall time of *n* ``with nb.budget(steps=10) as run: run.step()`` blocks, in us."""
    make = nb.budget
    gc.disable()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with make(steps=10) as run:
            run.step()
    elapsed = time.perf_counter_ns() - t0
    gc.enable()
    return elapsed / n / 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, reps = (5_000, 5) if args.quick else (20_000, 9)
    os.environ["NBBUDGET_HOME"] = tempfile.mkdtemp(prefix="nbbudget-bench-")
    cases = {"history off": "0", "history on": "1"}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(reps):
        names = list(cases)
        names = names[rep % len(names):] + names[:rep % len(names)]
        for name in names:
            os.environ["NBBUDGET_HISTORY"] = cases[name]
            history.refresh()  # as importing nbbudget reads it
            samples[name].append(block(n))
            history.flush()
    base = min(samples["history off"])
    print(f"with nb.budget(steps=10) as run: run.step()   ({reps} reps of {n:,} blocks, "
          f"Python {sys.version.split()[0]})")
    for name, values in samples.items():
        best = min(values)
        print(f"  {name:<12} {best:7.2f} us a block, best rep (median "
              f"{statistics.median(values):.2f})   {best - base:+5.2f} us over off")
    os.environ["NBBUDGET_HISTORY"] = "1"
    history.refresh()
    # what the run's own thread pays when the history is on: the hook alone
    run = nb.budget(steps=10)
    with run:
        run.step()
    add, trace = history.writer().add, run.trace
    t0 = time.perf_counter_ns()
    for _ in range(1000):
        add(run, "run", trace)
    print(f"  the hook queueing a run: {(time.perf_counter_ns() - t0) / 1000 / 1000:.2f} us "
          f"on the run's thread")
    history.flush()
    # the writer's work per run, on another thread: CPU time of the process for blocks + write
    c0 = time.process_time()
    for _ in range(1000):
        with nb.budget(steps=10) as run:
            run.step()
        if len(history.writer().queue) >= 200:
            history.flush()
    history.flush()
    per_run = (time.process_time() - c0) / 1000 * 1e6
    print(f"  history on, the rows written too: {per_run:.1f} us of CPU a run "
          f"(1,000 runs, written 200 to a transaction)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
