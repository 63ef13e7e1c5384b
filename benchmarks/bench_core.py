#!/usr/bin/env python3
"""Speed benchmark of the nbbudget core, as ratios against peers measured in the same run.

    python benchmarks/bench_core.py                 # full run (about 2-3 minutes on 2 cores)
    python benchmarks/bench_core.py --quick         # smoke mode with small N (under 20 s)
    python benchmarks/bench_core.py --json out.json # also write every sample as JSON

Absolute numbers drift by 10-40% between runs on a shared machine, so each figure is reported as
a ratio against a peer or a floor measured in the same run. Cases that are compared run
interleaved (one rep of each in turn, the order rotated every rep; section 1 also interleaves
blocks of steps within each rep); a ratio is the median of the per-rep ratios. Timed loops run
with the garbage collector disabled and bound methods hoisted; the clock is
``time.perf_counter_ns``.

Sections: 1. ``run.step()`` against pydantic-ai's per-step check and a lock+clock floor;
2. ``charge()`` under contention (4 threads against 1) with an exactness check, beside the same
   ratio of a floor (a list of permits popped, an exception raised on a refusal);
3. the full trace: events/s, bytes/event, ``to_frame()``; 4. the overhead of ``@run.tool``.

Exit status: 0 when the run completed (goals may be MISSed), 1 when a correctness check failed
(permits granted != limit) or a section raised.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
import tracemalloc
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import nbbudget as nb

pc = time.perf_counter_ns
INSTALL_HINT = "pip install -e '.[bench]'"
MIN_REPS = 3


# -- configuration -----------------------------------------------------------------------------
@dataclass
class Config:
    reps: int
    quick: bool
    steps: int  # steps per rep in section 1
    step_blocks: int  # each rep of section 1 runs in this many interleaved blocks
    threads: int  # threads in the contended case of section 2
    attempts: int  # total charge attempts per rep in section 2 (shared by the threads)
    limit: int  # tool_calls limit in section 2 (< attempts)
    trace_events: int  # steps per rep in full-trace mode, and the size of the to_frame trace
    mem_events: int  # steps measured under tracemalloc
    tool_calls: int  # calls per rep in section 4
    section_budget_s: float  # a section stops adding reps past this (never below MIN_REPS)


def make_config(args: argparse.Namespace) -> Config:
    quick = args.quick
    budget = args.section_budget
    return Config(
        reps=args.reps or (3 if quick else 7),
        quick=quick,
        steps=50_000 if quick else 1_000_000,
        step_blocks=5 if quick else 10,
        threads=4,
        attempts=100_000 if quick else 1_000_000,
        limit=60_000 if quick else 600_000,
        trace_events=50_000 if quick else 1_000_000,
        mem_events=20_000 if quick else 100_000,
        tool_calls=200 if quick else 2_000,
        section_budget_s=budget if budget is not None else (4.0 if quick else 40.0),
    )


# -- results ----------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    unit: str
    samples: list[float] = field(default_factory=list)
    info: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass
class Ratio:
    name: str
    values: list[float]
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)


@dataclass
class Goal:
    name: str
    value: float | None
    op: str  # "<=", ">=", "<", "==" or "ok"
    target: float | None
    status: str  # PASS, MISS, FAIL, OK, SKIP, ERROR
    note: str = ""


@dataclass
class Report:
    cases: dict[str, Case] = field(default_factory=dict)
    ratios: dict[str, Ratio] = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reps_used: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    failed: bool = False

    def goal(self, name: str, value: float | None, op: str, target: float,
             note: str = "") -> None:
        if value is None:
            status = "SKIP"
        elif op == "<=":
            status = "PASS" if value <= target else "MISS"
        elif op == "<":
            status = "PASS" if value < target else "MISS"
        else:
            status = "PASS" if value >= target else "MISS"
        self.goals.append(Goal(name, value, op, target, status, note))


def paired(a: Case, b: Case) -> list[float]:
    return [x / y for x, y in zip(a.samples, b.samples, strict=True) if y]


# -- running ----------------------------------------------------------------------------------
class NoGC:
    """Disable the cyclic garbage collector inside a timed region."""

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()


Sample = tuple[float, dict[str, Any] | None]


def run_interleaved(section: str, cases: dict[str, Callable[[], Sample]], cfg: Config,
                    report: Report) -> None:
    """One rep of each case in turn, order rotated each rep. After the first round, the number of
    reps is capped so the section fits in ``cfg.section_budget_s`` (but never below MIN_REPS)."""
    names = list(cases)
    target = cfg.reps
    started = time.monotonic()
    rep = 0
    while rep < target:
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            gc.collect()
            value, info = cases[name]()
            report.cases[name].samples.append(value)
            if info:
                report.cases[name].info.append(info)
        rep += 1
        if rep == 1 and cfg.section_budget_s > 0:
            per_rep = max(time.monotonic() - started, 1e-9)
            fits = int(cfg.section_budget_s / per_rep)
            target = max(min(cfg.reps, fits), min(cfg.reps, MIN_REPS))
    report.reps_used[section] = rep


# -- 1. step() ----------------------------------------------------------------------------------
# Each factory sets a case up inside *stack* and returns a block runner: ``block(k)`` runs k
# iterations and returns the elapsed ns. A rep runs every case in blocks, interleaved.
Block = Callable[[int], int]


def step_block(stack: ExitStack, **kwargs: Any) -> Block:
    run = stack.enter_context(nb.budget(steps=10**9, **kwargs))

    def block(k: int, step: Callable[[], None] = run.step) -> int:
        t0 = pc()
        for _ in range(k):
            step()
        return pc() - t0
    return block


def pydantic_block(stack: ExitStack) -> Block:
    from pydantic_ai.usage import RunUsage, UsageLimits

    limits = UsageLimits(request_limit=10**9)
    usage = RunUsage()

    def block(k: int, check: Callable[[Any], None] = limits.check_before_request,
              usage: Any = usage) -> int:
        t0 = pc()
        for _ in range(k):
            check(usage)
            usage.requests += 1
        return pc() - t0
    return block


def floor_block(stack: ExitStack) -> Block:
    lock = threading.Lock()

    def block(k: int, acquire: Callable[[], Any] = lock.acquire,
              release: Callable[[], None] = lock.release,
              monotonic_ns: Callable[[], int] = time.monotonic_ns) -> int:
        count = 0
        t0 = pc()
        for _ in range(k):
            acquire()
            count += 1  # noqa: SIM113 (the floor's counter, as a charge would keep it)
            release()
            monotonic_ns()
        return pc() - t0
    return block


def bare_block(stack: ExitStack) -> Block:
    def block(k: int) -> int:
        t0 = pc()
        for _ in range(k):
            pass
        return pc() - t0
    return block


def run_blocked(section: str, cases: dict[str, Callable[[ExitStack], Block]], n: int,
                blocks: int, cfg: Config, report: Report) -> None:
    """Like `run_interleaved`, but each rep of n iterations per case is cut into *blocks*
    interleaved blocks (order rotated each block), so a burst of load hits every case alike."""
    names = list(cases)
    k = max(1, n // blocks)
    target = cfg.reps
    started = time.monotonic()
    rep = 0
    while rep < target:
        gc.collect()
        totals = dict.fromkeys(names, 0)
        with ExitStack() as stack:
            runners = {name: make(stack) for name, make in cases.items()}
            with NoGC():
                for b in range(blocks):
                    r = (rep + b) % len(names)
                    for name in names[r:] + names[:r]:
                        totals[name] += runners[name](k)
        for name in names:
            report.cases[name].samples.append(totals[name] / (k * blocks))
        rep += 1
        if rep == 1 and cfg.section_budget_s > 0:
            per_rep = max(time.monotonic() - started, 1e-9)
            fits = int(cfg.section_budget_s / per_rep)
            target = max(min(cfg.reps, fits), min(cfg.reps, MIN_REPS))
    report.reps_used[section] = rep


def section_step(cfg: Config, report: Report) -> None:
    n = cfg.steps
    names = {
        "step": "nbbudget run.step(), steps=1e9",
        "step_time": "nbbudget run.step(), steps=1e9, time='1h'",
        "pyd": "pydantic-ai check_before_request + requests += 1",
        "floor": "floor: lock acquire/+=1/release + monotonic_ns()",
        "bare": "bare loop (for _ in range(N): pass)",
    }
    cases: dict[str, Callable[[ExitStack], Block]] = {
        names["step"]: step_block,
        names["step_time"]: lambda stack: step_block(stack, time="1h"),
    }
    for key in names.values():
        report.cases[key] = Case(key, "ns/step")
    try:
        import pydantic_ai.usage  # noqa: F401
    except ImportError:
        report.cases[names["pyd"]].skipped = f"skipped ({INSTALL_HINT})"
    else:
        cases[names["pyd"]] = pydantic_block
    cases[names["floor"]] = floor_block
    cases[names["bare"]] = bare_block
    run_blocked("step", cases, n, cfg.step_blocks, cfg, report)

    step, step_time = report.cases[names["step"]], report.cases[names["step_time"]]
    pyd, floor = report.cases[names["pyd"]], report.cases[names["floor"]]
    r = report.ratios
    if pyd.skipped is None:
        r["step / pydantic-ai"] = Ratio("step / pydantic-ai", paired(step, pyd))
        r["step time='1h' / pydantic-ai"] = Ratio("step time='1h' / pydantic-ai",
                                                  paired(step_time, pyd))
    r["step / floor"] = Ratio("step / floor", paired(step, floor))
    r["step time='1h' / floor"] = Ratio("step time='1h' / floor", paired(step_time, floor))
    r["step time='1h' / step"] = Ratio("step time='1h' / step", paired(step_time, step),
                                       "1.0 = no per-step clock cost")
    if pyd.skipped is None:
        report.goal("step() <= 1.0x pydantic-ai per-step check", r["step / pydantic-ai"].median,
                    "<=", 1.0)
        report.goal("step() with time='1h' <= 1.0x pydantic-ai",
                    r["step time='1h' / pydantic-ai"].median, "<=", 1.0)
    else:
        report.goal("step() <= 1.0x pydantic-ai per-step check", None, "<=", 1.0,
                    f"skipped ({INSTALL_HINT})")
        report.goal("step() with time='1h' <= 1.0x pydantic-ai", None, "<=", 1.0,
                    f"skipped ({INSTALL_HINT})")
    report.goal("time='1h' costs the same as no time grant (ratio <= 1.10)",
                r["step time='1h' / step"].median, "<=", 1.10)


# -- 2. contention ---------------------------------------------------------------------------
class _FloorRefused(Exception):
    """The refusal of `FloorRun`."""


class FloorRun:
    """The floor of a lock-free charge: a list of permits popped, and on a refusal an exception
    made without its ``__init__`` and raised. What threads contending for it lose against one
    thread is what the machine and the GIL take from this pattern, whatever the charge does."""

    refused = _FloorRefused

    def __init__(self, limit: int) -> None:
        self.pool = list(range(limit))
        self.limit = limit

    def charge(self, kind: str) -> None:
        try:
            self.pool.pop()
            return
        except IndexError:
            pass
        raise _FloorRefused.__new__(_FloorRefused, kind, self.limit)

    @property
    def consumed(self) -> dict[str, int]:
        return {"tool_calls": self.limit - len(self.pool)}

    def __enter__(self) -> FloorRun:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def contention_case(threads: int, attempts: int, limit: int,
                    floor: bool = False) -> Callable[[], Sample]:
    per_thread = attempts // threads

    def worker(charge: Callable[[str], None], exceeded: type[BaseException],
               barrier: threading.Barrier, out: list[Any], idx: int) -> None:
        granted = refused = 0
        barrier.wait()
        t0 = pc()
        for _ in range(per_thread):
            try:
                charge("tool_calls")
                granted += 1
            except exceeded:
                refused += 1
        out[idx] = (t0, pc(), granted, refused)

    def one() -> Sample:
        run = FloorRun(limit) if floor else nb.budget(tool_calls=limit)
        exceeded = FloorRun.refused if floor else nb.BudgetExceeded
        with run:
            out: list[Any] = [None] * threads
            barrier = threading.Barrier(threads)
            workers = [threading.Thread(target=worker,
                                        args=(run.charge, exceeded, barrier, out, i))
                       for i in range(threads)]
            with NoGC():
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                cyclic = gc.collect()  # before the collector is re-enabled and runs by itself
            consumed = run.consumed.get("tool_calls", 0)
        wall_ns = max(o[1] for o in out) - min(o[0] for o in out)
        granted = sum(o[2] for o in out)
        refused = sum(o[3] for o in out)
        exact = consumed == limit and granted == limit and refused == per_thread * threads - limit
        permits_per_s = granted / (wall_ns / 1e9)
        return permits_per_s, {"wall_ns": wall_ns, "consumed": consumed, "granted": granted,
                               "refused": refused, "exact": exact,
                               "ns_per_attempt": wall_ns / (per_thread * threads),
                               "gc_objects_per_refusal": cyclic / refused if refused else 0.0}
    return one


def section_contention(cfg: Config, report: Report) -> None:
    t, n, lim = cfg.threads, cfg.attempts, cfg.limit
    many = f"charge('tool_calls'): {t} threads x {n // t:,}, limit {lim:,}"
    one = f"charge('tool_calls'): 1 thread x {n:,}, limit {lim:,}"
    floor_many, floor_one = f"floor (a list popped): {t} threads", "floor (a list popped): 1 thread"
    for name in (many, one, floor_many, floor_one):
        report.cases[name] = Case(name, "permits/s")
    run_interleaved("contention", {many: contention_case(t, n, lim),
                                   one: contention_case(1, n, lim),
                                   floor_many: contention_case(t, n, lim, floor=True),
                                   floor_one: contention_case(1, n, lim, floor=True)},
                    cfg, report)
    a, b = report.cases[many], report.cases[one]
    ratio = Ratio(f"permits/s {t} threads / 1 thread", paired(a, b))
    report.ratios[ratio.name] = ratio
    floor = Ratio(f"the floor's permits/s, {t} threads / 1 thread",
                  paired(report.cases[floor_many], report.cases[floor_one]))
    report.ratios[floor.name] = floor
    report.goal(f"permits/s with {t} threads >= 0.8x 1 thread", ratio.median, ">=", 0.8,
                f"the floor's: {floor.median:.2f}")
    exact = [i["exact"] for c in (a, b) for i in c.info]
    ok = all(exact)
    granted = sorted({i["consumed"] for c in (a, b) for i in c.info})
    report.goals.append(Goal(f"exactly {lim:,} permits granted in every rep", None, "ok", lim,
                             "OK" if ok else "FAIL",
                             f"{sum(exact)}/{len(exact)} reps exact; granted {granted}"))
    if not ok:
        report.failed = True
    ns_a = statistics.median(i["ns_per_attempt"] for i in a.info)
    ns_b = statistics.median(i["ns_per_attempt"] for i in b.info)
    report.notes.append(f"contention: {ns_a:,.0f} ns per attempt with {t} threads, {ns_b:,.0f} ns "
                        f"with 1 thread (wall time over all threads / attempts)")
    cyc = statistics.median(i["gc_objects_per_refusal"] for c in (a, b) for i in c.info)
    report.notes.append(
        f"refusals leave {cyc:.1f} objects per refusal for the cyclic garbage collector "
        f"(collected after each rep, outside the timed region)")


# -- 3. traces --------------------------------------------------------------------------------
def trace_arrays(trace: Any) -> list[array[Any]]:
    """The `array.array` columns found on the trace object (instance dict or slots)."""
    attrs = getattr(trace, "__dict__", None) or {
        name: getattr(trace, name, None) for name in getattr(type(trace), "__slots__", ())}
    return [v for v in attrs.values() if isinstance(v, array)]


def trace_storage_bytes(trace: Any) -> tuple[int, int, int]:
    """(array bytes, payload-list bytes, events): the arrays found on the trace object, and the
    payload list with the dicts it holds."""
    arrays = trace_arrays(trace)
    array_bytes = sum(a.itemsize * len(a) for a in arrays)
    payloads = getattr(trace, "_payloads", [])
    payload_bytes = sys.getsizeof(payloads) + sum(sys.getsizeof(p) for p in payloads)
    return array_bytes, payload_bytes, len(trace)


def full_trace_case(n: int, keep: list[Any]) -> Callable[[], Sample]:
    def one() -> Sample:
        keep.clear()
        gc.collect()
        run = nb.budget(steps=10**9, trace="full")
        with run:
            step = run.step
            before = len(run.trace)
            with NoGC():
                t0 = pc()
                for _ in range(n):
                    step()
                t1 = pc()
            events = len(run.trace) - before
        keep.append(run)
        return events / ((t1 - t0) / 1e9), {"ns_per_event": (t1 - t0) / events,
                                            "events": events}
    return one


def trace_memory_growth(n: int) -> tuple[float, int]:
    """Bytes allocated (and still held) per full-trace event, as tracemalloc sees it."""
    run = nb.budget(steps=10**9, trace="full")
    with run:
        step = run.step
        step()
        gc.collect()
        with NoGC():
            tracemalloc.start()
            try:
                mem0, n0 = tracemalloc.get_traced_memory()[0], len(run.trace)
                for _ in range(n):
                    step()
                mem1, n1 = tracemalloc.get_traced_memory()[0], len(run.trace)
            finally:
                tracemalloc.stop()
    return (mem1 - mem0) / (n1 - n0), n1 - n0


def section_trace(cfg: Config, report: Report) -> None:
    n = cfg.trace_events
    full = f"full trace: run.step() x {n:,}"
    report.cases[full] = Case(full, "events/s")
    keep: list[Any] = []
    run_interleaved("trace", {full: full_trace_case(n, keep)}, cfg, report)
    ev_s = report.cases[full].median
    ns_ev = statistics.median(i["ns_per_event"] for i in report.cases[full].info)
    counts_name = "nbbudget run.step(), steps=1e9"
    if counts_name in report.cases and report.cases[counts_name].samples:
        report.ratios["full-trace step / counts-mode step"] = Ratio(
            "full-trace step / counts-mode step",
            [ns_ev / report.cases[counts_name].median],
            "ratio of medians; counts mode is the default (section 1)")
    report.goal("full trace >= 1,000,000 events/s", ev_s, ">=", 1e6,
                f"{ns_ev:,.0f} ns/event")

    run = keep[0]
    array_bytes, payload_bytes, events = trace_storage_bytes(run.trace)
    per_event = (array_bytes + payload_bytes) / events
    arrays_desc = "+".join(f"{a.typecode}:{a.itemsize}" for a in trace_arrays(run.trace))
    b_arr = Case("full trace: array storage per event", "bytes/event", [per_event],
                 [{"array_bytes": array_bytes, "payload_bytes": payload_bytes, "events": events,
                   "arrays": arrays_desc}])
    report.cases[b_arr.name] = b_arr
    report.goal("full trace <= 64 bytes/event (arrays + payloads)", per_event, "<=", 64,
                f"arrays {arrays_desc}; payloads {payload_bytes:,} B in all")

    growth, measured = trace_memory_growth(cfg.mem_events)
    b_mem = Case(f"full trace: tracemalloc growth per event ({measured:,} events)",
                 "bytes/event", [growth])
    report.cases[b_mem.name] = b_mem
    report.goal("full trace <= 64 bytes/event (tracemalloc growth)", growth, "<=", 64)

    frame_name = f"trace.to_frame() on {events:,} events"
    frame = Case(frame_name, "s")
    report.cases[frame_name] = frame
    try:
        import pandas  # noqa: F401
    except ImportError:
        frame.skipped = f"skipped ({INSTALL_HINT})"
        report.goal("to_frame() on 1,000,000 events < 1 s", None, "<", 1.0,
                    f"skipped ({INSTALL_HINT})")
        return
    trace = run.trace
    trace.to_frame()  # warm-up: first-use imports
    reps = report.reps_used.get("trace", cfg.reps)
    for _ in range(max(reps, MIN_REPS)):
        gc.collect()
        t0 = pc()
        df = trace.to_frame()
        t1 = pc()
        assert len(df) == events
        del df
        frame.samples.append((t1 - t0) / 1e9)
    scaled = frame.median * 1_000_000 / events
    report.goal("to_frame() on 1,000,000 events < 1 s", scaled, "<", 1.0,
                "" if events >= 1_000_000 else f"scaled from {events:,} events")
    keep.clear()


# -- 4. tools --------------------------------------------------------------------------------
def trivial() -> int:
    return 1


def tool_case(n: int) -> Callable[[], Sample]:
    def one() -> Sample:
        run = nb.budget(tool_calls=10**9)
        with run:
            call = run.tool(trivial)
            with NoGC():
                t0 = pc()
                for _ in range(n):
                    call()
                t1 = pc()
        return (t1 - t0) / n, None
    return one


def bare_call_case(n: int) -> Callable[[], Sample]:
    def one() -> Sample:
        call = trivial
        with NoGC():
            t0 = pc()
            for _ in range(n):
                call()
            t1 = pc()
        return (t1 - t0) / n, None
    return one


def pool_case(n: int, pool: ThreadPoolExecutor) -> Callable[[], Sample]:
    submit = pool.submit

    def one() -> Sample:
        with NoGC():
            t0 = pc()
            for _ in range(n):
                submit(trivial).result()
            t1 = pc()
        return (t1 - t0) / n, None
    return one


def thread_case(n: int) -> Callable[[], Sample]:
    def one() -> Sample:
        thread = threading.Thread
        with NoGC():
            t0 = pc()
            for _ in range(n):
                t = thread(target=trivial)
                t.start()
                t.join()
            t1 = pc()
        return (t1 - t0) / n, None
    return one


def section_tool(cfg: Config, report: Report) -> None:
    n = cfg.tool_calls
    tool = f"@run.tool trivial function, {n:,} calls"
    bare = "trivial function called bare"
    pool = "ThreadPoolExecutor(1).submit(f).result() (warm pool)"
    thread = "fresh Thread(target=f).start() + join()"
    for name in (tool, bare, pool, thread):
        report.cases[name] = Case(name, "ns/call")
    with ThreadPoolExecutor(1) as ex:
        ex.submit(trivial).result()
        run_interleaved("tool", {tool: tool_case(n), bare: bare_call_case(n),
                                 pool: pool_case(n, ex), thread: thread_case(n)},
                        cfg, report)
    t = report.cases[tool]
    for other, label in ((bare, "bare call"), (pool, "ThreadPoolExecutor submit+result"),
                         (thread, "fresh Thread start+join")):
        name = f"@run.tool / {label}"
        report.ratios[name] = Ratio(name, paired(t, report.cases[other]))


# -- output -----------------------------------------------------------------------------------
def fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f}"
    if unit in ("permits/s", "events/s"):
        return f"{value / 1e6:.3f}M" if value >= 1e6 else f"{value / 1e3:,.1f}k"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def print_report(cfg: Config, meta: dict[str, Any], report: Report) -> None:
    w = 62
    print(f"nbbudget core benchmark  {meta['when']}")
    print(f"  nbbudget {meta['nbbudget']} ({meta['git']}), Python {meta['python']} "
          f"({meta['implementation']}{', GIL' if meta['gil'] else ', free-threaded'}), "
          f"{meta['platform']}, {meta['cpus']} CPUs, switchinterval {meta['switchinterval']} s")
    print(f"  pydantic-ai {meta['pydantic_ai'] or 'not installed'}, "
          f"pandas {meta['pandas'] or 'not installed'}; load average {meta['load_start']} -> "
          f"{meta['load_end']}; {meta['elapsed_s']:.0f} s")
    mode = "QUICK (small N; goals indicative only)" if cfg.quick else "full"
    print(f"  mode {mode}; reps per section: "
          + ", ".join(f"{k} {v}" for k, v in report.reps_used.items())
          + f" (target {cfg.reps}, capped at {cfg.section_budget_s:g} s per section, "
            f"min {MIN_REPS})")
    print()
    print(f"{'case':{w}} {'median':>10} {'min..max':>21}  unit")
    for case in report.cases.values():
        if case.skipped:
            print(f"{case.name:{w}} {case.skipped}")
            continue
        if not case.samples:
            continue
        lo, hi = min(case.samples), max(case.samples)
        span = f"{fmt(lo, case.unit)}..{fmt(hi, case.unit)}" if len(case.samples) > 1 else ""
        print(f"{case.name:{w}} {fmt(case.median, case.unit):>10} {span:>21}  {case.unit}")
    if any(r.values for r in report.ratios.values()):
        print()
        print(f"{'ratio (median of per-rep ratios)':{w}} {'median':>10} {'min..max':>21}")
    for ratio in report.ratios.values():
        if not ratio.values:
            continue
        span = (f"{min(ratio.values):.2f}..{max(ratio.values):.2f}"
                if len(ratio.values) > 1 else "")
        note = f"  {ratio.note}" if ratio.note else ""
        print(f"{ratio.name:{w}} {ratio.median:10.2f} {span:>21}{note}")
    if report.notes:
        print()
        for note in report.notes:
            print(f"note: {note}")
    for err in report.errors:
        print(f"ERROR: {err}")
    print()
    print("goals" + (" (quick mode: indicative only)" if cfg.quick else "")
          + ("" if report.goals else ": none in the sections run"))
    for g in report.goals:
        if g.op == "ok":
            value = ""
        elif g.value is None:
            value = "-"
        elif g.target is not None and g.target >= 1e5:
            value = f"{g.value:,.0f}"
        else:
            value = f"{g.value:.2f}"
        note = f"  ({g.note})" if g.note else ""
        print(f"  {g.status:5} {g.name:{w - 4}} {value:>12}{note}")


def load_avg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def version_of(module: str, dist: str) -> str | None:
    """The installed version of *dist*, or `None` when *module* cannot be imported."""
    try:
        __import__(module)
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def git_rev() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True,
                               timeout=5).stdout.strip()
        return (rev or "no commit") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "no git"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=None,
                        help="repetitions per case (default 7; 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="small N, for a fast smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--section-budget", type=float, default=None, metavar="SECONDS",
                        help="stop adding reps to a section past this many seconds "
                             f"(never below {MIN_REPS}); 0 = always run --reps "
                             "(default 40; 4 with --quick)")
    parser.add_argument("--only", action="append", choices=["step", "contention", "trace", "tool"],
                        help="run only these sections (repeatable)")
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    cfg = make_config(args)
    started = time.monotonic()
    meta: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nbbudget": getattr(nb, "__version__", "?"), "git": git_rev(),
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "gil": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "platform": f"{platform.system()} {platform.machine()}", "cpus": os.cpu_count(),
        "switchinterval": sys.getswitchinterval(),
        "pydantic_ai": version_of("pydantic_ai.usage", "pydantic-ai-slim")
        or version_of("pydantic_ai.usage", "pydantic-ai"),
        "pandas": version_of("pandas", "pandas"), "load_start": load_avg(),
    }
    report = Report()
    sections = [("step", section_step), ("contention", section_contention),
                ("trace", section_trace), ("tool", section_tool)]
    for key, fn in sections:
        if args.only and key not in args.only:
            continue
        try:
            fn(cfg, report)
        except Exception as exc:
            report.failed = True
            report.errors.append(f"section {key}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            report.goals.append(Goal(f"section {key} ran", None, "ok", None, "ERROR", str(exc)))
        finally:
            gc.enable()
            gc.collect()
    meta["load_end"] = load_avg()
    meta["elapsed_s"] = time.monotonic() - started
    print_report(cfg, meta, report)
    if args.json:
        data = {
            "meta": meta,
            "config": vars(cfg),
            "cases": {k: {"unit": c.unit, "median": c.median if c.samples else None,
                          "samples": c.samples, "info": c.info, "skipped": c.skipped}
                      for k, c in report.cases.items()},
            "ratios": {k: {"median": r.median if r.values else None, "values": r.values,
                           "note": r.note} for k, r in report.ratios.items()},
            "goals": [vars(g) for g in report.goals],
            "notes": report.notes,
            "errors": report.errors,
            "reps_used": report.reps_used,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str)
        print(f"\nwrote {args.json}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
