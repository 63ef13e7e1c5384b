#!/usr/bin/env python3
"""What the history of runs costs a run: a ``with nb.budget()`` block that charges one step,
timed with no hook installed (the run layer alone), with the history's hook installed and the
history off (plain Python), and with it on (the run queued for the background writer), in
interleaved reps; the CPU time of the writer per run is the process's CPU time over the
block's, measured with the writer draining.

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
from nbbudget.run import budget as _budget


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
    cases = {
        "no hook": (None, "0"),
        "history off": (history.writer().add, "0"),
        "history on": (history.writer().add, "1"),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(reps):
        names = list(cases)
        names = names[rep % len(names):] + names[:rep % len(names)]
        for name in names:
            hook, setting = cases[name]
            _budget.set_on_end(hook)
            os.environ["NBBUDGET_HISTORY"] = setting
            samples[name].append(block(n))
            history.flush()
    _budget.set_on_end(history.writer().add)
    base = min(samples["no hook"])
    print(f"with nb.budget(steps=10) as run: run.step()   ({reps} reps of {n:,} blocks, "
          f"Python {sys.version.split()[0]})")
    for name, values in samples.items():
        best = min(values)
        print(f"  {name:<12} {best:7.2f} us a block, best rep (median "
              f"{statistics.median(values):.2f})   {best - base:+5.2f} us over no hook")
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
    os.environ["NBBUDGET_HISTORY"] = "1"
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
