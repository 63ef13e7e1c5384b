#!/usr/bin/env python3
"""``Trace.replay`` of a 1,000,000-event ``trace="full"`` trace under new limits, beside
``Trace.to_frame`` of the same trace, in CPU time of this thread (wall beside).

    python benchmarks/bench_replay.py [--quick] [--events N]

The trace is one run's: half steps, half token charges of 1 to 100 tokens (a target on every
tenth), one every few microseconds of the real clock. Replay runs under three sets of limits:
limits that hold (one pass, no refusal), a step limit that refuses the last tenth of the steps
(50,000 refusals, each a dict) and a time grant at the middle of the run (every later charge
refused). The goal: under 100 ms for a replay that holds or refuses a few, so a slider over the
limits feels live; each refusal is a dict of the result, and those cost what they cost.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

import nbbudget as nb


def record(events: int) -> nb.Trace:
    with nb.budget(trace="full", notices=None) as run:
        for i in range(events // 2):
            run.step()
            run.charge("tokens", 1 + i % 100, target="model:a" if i % 10 == 0 else None)
    return run.trace


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """CPU and wall milliseconds of *fn*: the median over *reps*."""
    samples = []
    for _ in range(reps):
        gc.collect()
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        fn()
        samples.append((time.thread_time_ns() - c0, time.perf_counter_ns() - w0))
    return (statistics.median(c for c, _ in samples) / 1e6,
            statistics.median(w for _, w in samples) / 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    reps = 3 if args.quick else 7
    trace = record(args.events)
    totals = trace.stats()["consumed"]
    steps, run_ms = totals["steps"], totals["run_ms"]
    cases = {
        "replay, limits that hold": nb.Limits(steps=steps, tokens=10**9),
        "replay, last tenth of steps refused": nb.Limits(steps=int(steps * 0.9)),
        "replay, time grant at mid-run": nb.Limits(run_ms=max(1, int(run_ms / 2))),
    }
    print(f"Trace.replay: Python {sys.version.split()[0]}, {len(trace):,} events "
          f"(trace='full'), median of {reps}, CPU time of this thread (wall beside)")
    worst = 0.0
    for name, limits in cases.items():
        cpu, wall = timed(lambda limits=limits: trace.replay(limits), reps)
        refused = len(trace.replay(limits).refusals)
        print(f"  {name:<38} {cpu:9.1f} ms CPU {wall:9.1f} ms wall  ({refused:,} refusals)")
        if name != "replay, time grant at mid-run":
            worst = max(worst, cpu * 1_000_000 / len(trace))
    try:
        import pandas  # noqa: F401
    except ImportError:
        print("  Trace.to_frame                          skipped (needs the frames extra)")
    else:
        cpu, wall = timed(trace.to_frame, reps)
        print(f"  {'Trace.to_frame':<38} {cpu:9.1f} ms CPU {wall:9.1f} ms wall")
    print(f"goal: under 100 ms CPU for 1,000,000 events: "
          f"{'met' if worst < 100 else 'missed'} ({worst:.1f} ms, scaled to 10^6 events)")
    return 0 if worst < 100 else 1


if __name__ == "__main__":
    sys.exit(main())
