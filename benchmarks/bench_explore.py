#!/usr/bin/env python3
"""``Trace.explore()`` on a 100,000-event ``trace="full"`` trace: a slider move (the verdict and
the plot redrawn as a PNG), the verdict alone, and the explorer's making, beside
``Trace.replay`` under the same limits; CPU time of this thread, wall time beside.

    python benchmarks/bench_explore.py [--quick] [--events N]

The trace is one agent run's: half steps, half token charges of 1 to 100 tokens (a target on
every tenth), a tool output (``progress``) every thousand events. Each move sets the step slider
to another value (the redraw interval at 0, so every move draws), alternating between a limit
that refuses the last fifth of the steps and one that holds. The goal: a move redraws in under
200 ms of CPU, so the explorer feels live (wall time beside: on a machine shared with other
work it is longer).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

import nbbudget as nb
from nbbudget.testing import FakeClock

GOAL_MS = 200.0


def record(events: int) -> nb.Trace:
    clock = FakeClock()
    with nb.budget(trace="full", notices=None, clock=clock, name="agent") as run:
        @run.tool
        def search(query: int, ctx) -> int:  # type: ignore[no-untyped-def]  # ctx: any
            ctx.progress({"query": query})
            return query

        for i in range(events // 2):
            clock.advance(1)
            run.step()
            run.charge("tokens", 1 + i % 100, target="model:a" if i % 10 == 0 else None)
            if i % 500 == 499:
                search(i)
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
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    reps = 5 if args.quick else 15
    trace = record(args.events)
    steps = int(trace.stats()["consumed"]["steps"])
    refusing, holding = int(steps * 0.8), steps
    print(f"Trace.explore: Python {sys.version.split()[0]}, {len(trace):,} events "
          f"(trace='full'), median of {reps}, CPU time of this thread (wall beside)")

    cpu, wall = timed(lambda: trace.explore(interval_ms=0), max(3, reps // 3))
    print(f"  {'making the explorer (first drawing)':<40} {cpu:8.1f} ms CPU {wall:8.1f} ms wall")
    explorer = trace.explore(interval_ms=0)
    slider = explorer.sliders["steps"]
    values = iter([refusing, holding] * reps * 2)

    def move() -> None:
        slider.value = next(values)

    move_cpu, move_wall = timed(move, reps)
    print(f"  {'a slider move (verdict + redraw)':<40} {move_cpu:8.1f} ms CPU "
          f"{move_wall:8.1f} ms wall  ({explorer.draws} drawings)")
    limits = nb.Limits(steps=refusing)
    cpu, wall = timed(lambda: explorer.model.verdict(limits), reps)
    print(f"  {'the verdict alone':<40} {cpu:8.3f} ms CPU {wall:8.3f} ms wall")
    verdict = explorer.model.verdict(limits)
    refused = len(trace.replay(limits).refusals)
    cpu, wall = timed(lambda: trace.replay(limits), reps)
    print(f"  {'Trace.replay, same limits':<40} {cpu:8.1f} ms CPU {wall:8.1f} ms wall  "
          f"({refused:,} refusals; the verdict needs the first: event {verdict.event:,})")
    print(f"goal: a move under {GOAL_MS:.0f} ms of CPU: {'met' if move_cpu < GOAL_MS else 'missed'}"
          f" ({move_cpu:.1f} ms, {move_cpu / GOAL_MS:.2f} of the goal; wall {move_wall:.1f} ms, "
          f"which a busy machine stretches)")
    return 0 if move_cpu < GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
