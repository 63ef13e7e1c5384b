#!/usr/bin/env python3
"""Lateness of a stop on code that never checks, against stopit and func-timeout in one run.

    python benchmarks/bench_preempt.py            # about four minutes on 2 cores
    python benchmarks/bench_preempt.py --quick    # smoke mode, under 20 s
    python benchmarks/bench_preempt.py --json benchmarks/results/preempt.json

1. Lateness (N-5): a block given a deadline runs work that never calls nbbudget; the figure is
   the time from the deadline (the moment before the block is entered, plus its time) to the
   moment the ``except`` after the block is reached. Three works: a pure-Python loop, a
   ``time.sleep`` and a ``recv`` on a socket pair with nothing sent, each on the main thread
   and on another thread; a work that nothing stops ends by itself ``--overrun`` past the
   deadline. The peers, on the same works:

   - ``with nb.budget(time=...)``, which ends with ``nb.BudgetCut``;
   - ``stopit.ThreadingTimeout``: a ``threading.Timer`` raises an exception in the thread at
     its next bytecode;
   - ``stopit.SignalTimeout``, on the main thread only: ``SIGALRM`` from ``signal.alarm``,
     which takes whole seconds, so its deadline is 1 s where the others' is ``--deadline``;
   - ``func_timeout.func_timeout``, which runs the work on a thread of its own, raises
     ``FunctionTimedOut`` in the caller once its wait for that thread times out, and raises an
     exception in the work's thread as it goes. Its caller so reaches its ``except`` even
     when the work goes on;
   - a floor on the main thread, at the same deadline as nbbudget: ``signal.setitimer``'s
     ``SIGALRM`` and a handler that raises (the kernel's timer; no thread to wake).

   Whether a try stopped the work is read from the work's own ``finally``: it left before it
   would have ended by itself. One try of each peer in turn for each case, the order rotated
   every round (a burst of load from elsewhere hits every peer alike); the cyclic garbage
   collector off during a try; the threads a try started (the peers' timers and workers,
   nbbudget's timer) joined before the next. Per case and peer: the median, p90 and p99 over
   the tries, how many stopped the work, and the median CPU time of the whole process
   (``time.process_time``, every thread) and wall time of a try, from entering the block to
   its ``except``. A ratio is nbbudget's median (p90) over the peer's, given where both
   stopped the work in more than half their tries (goal: at most 1.0x; the floor's is
   reported only).
2. What preemption adds to an empty block: ``with nb.budget(time="5s"): pass`` and
   ``with nb.budget(): pass`` on the main thread, in CPU time of the process per block, this
   checkout against the code before preemption (``--before``; by default the parent of the
   commit that added ``nbbudget/core/preempt.py``, written out with ``git archive``), in
   fresh processes alternating between the two, the order swapped every rep; in each process
   the cases run interleaved in blocks, this checkout's with ``preempt=False`` beside. A
   ratio is the median of the per-rep ratios (goal: the block with a time at most 1.5x).

Absolute figures drift with the load of a shared machine; the ratios of the same run are what
to compare. Exit status 0 when the run completed (goals may be MISSed), 1 when a section raised
or a thread was left running.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import nbbudget as nb

pc = time.perf_counter
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the works, and where they run
WORKS = ("python", "sleep", "recv")
THREADS = ("main", "thread")
CASE_NAMES = {"python": "pure-Python loop", "sleep": "time.sleep", "recv": "socket recv"}
#: the peers, in the order of the table; SignalTimeout and the floor run on the main thread only
PEERS = ("nbbudget", "stopit.ThreadingTimeout", "stopit.SignalTimeout", "func_timeout",
         "floor: setitimer")
MAIN_ONLY = ("stopit.SignalTimeout", "floor: setitimer")


@dataclass
class Box:
    """What a work says about itself."""

    until: float = 0.0  # pc() when it ends by itself
    # pc() when its frame was left; None when the stop landed on the very clock read that
    # stamps it (an exception raised in a thread lands after a C call returns)
    left: float | None = None


@dataclass
class Try:
    """One try of one peer on one case, in ms from its deadline."""

    late_ms: float  # the except (or the end of the block) reached
    left_ms: float  # the work's frame left (its stamp lost: by the except, or the join)
    stopped: bool  # the work was stopped before it ended by itself
    caught: str  # what the except caught ("" when the block ended without an exception)
    cpu_ms: float  # CPU time of the process from entering the block to the except
    wall_ms: float  # wall time of the same


@dataclass
class Case:
    work: str
    thread: str
    tries: dict[str, list[Try]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        where = "main thread" if self.thread == "main" else "another thread"
        return f"{CASE_NAMES[self.work]}, {where}"


# -- the works ----------------------------------------------------------------------------

def make_work(kind: str, box: Box,
              pair: tuple[socket.socket, socket.socket] | None) -> Callable[[], None]:
    """A work of *kind* that never checks and ends by itself at ``box.until`` (``pc()``, set
    by the runner as it takes its start)."""
    if kind == "python":
        def work() -> None:
            until = box.until
            n = 0
            try:
                while pc() < until:
                    n += 1
            finally:
                box.left = pc()
    elif kind == "sleep":
        def work() -> None:
            try:
                time.sleep(max(0.0, box.until - pc()))
            finally:
                box.left = pc()
    else:
        assert pair is not None
        reader = pair[0]

        def work() -> None:
            try:
                reader.settimeout(max(0.001, box.until - pc()))
                with contextlib.suppress(TimeoutError):  # socket.timeout: the read's own end
                    reader.recv(1)
            finally:
                box.left = pc()
    return work


# -- the peers: each runs *work* under a deadline *seconds* away, and returns (t0, t_except,
# caught); *start* takes t0 just before the block is entered (and sets when the work ends) --

def run_nbbudget(seconds: float, work: Callable[[], None], start: Callable[[], float]
                 ) -> tuple[float, float, str]:
    spec = f"{seconds * 1000:g}ms"
    t0 = start()
    try:
        with nb.budget(time=spec):
            work()
    except nb.BudgetCut:
        return t0, pc(), "BudgetCut"
    return t0, pc(), ""


def run_threading(seconds: float, work: Callable[[], None], start: Callable[[], float]
                  ) -> tuple[float, float, str]:
    import stopit

    t0 = start()
    try:
        with stopit.ThreadingTimeout(seconds, swallow_exc=False):
            work()
    except stopit.TimeoutException:
        return t0, pc(), "TimeoutException"
    return t0, pc(), ""


def run_signal(seconds: float, work: Callable[[], None], start: Callable[[], float]
               ) -> tuple[float, float, str]:
    import stopit

    t0 = start()
    try:
        with stopit.SignalTimeout(seconds, swallow_exc=False):
            work()
    except stopit.TimeoutException:
        return t0, pc(), "TimeoutException"
    return t0, pc(), ""


def run_func_timeout(seconds: float, work: Callable[[], None], start: Callable[[], float]
                     ) -> tuple[float, float, str]:
    from func_timeout import FunctionTimedOut, func_timeout

    t0 = start()
    try:
        func_timeout(seconds, work)
    except FunctionTimedOut:
        return t0, pc(), "FunctionTimedOut"
    return t0, pc(), ""


Runner = Callable[[float, Callable[[], None], Callable[[], float]], tuple[float, float, str]]
class _Alarm(BaseException):
    """What the floor's handler raises."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Alarm


def run_floor(seconds: float, work: Callable[[], None], start: Callable[[], float]
              ) -> tuple[float, float, str]:
    """The floor on the main thread: the kernel's own timer at the deadline (``SIGALRM`` from
    ``signal.setitimer``, to the microsecond), a handler that raises; no thread involved."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        t0 = start()
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                work()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Alarm:
            return t0, pc(), "SIGALRM"
        return t0, pc(), ""
    finally:
        signal.signal(signal.SIGALRM, previous)


RUNNERS: dict[str, Runner] = {
    "nbbudget": run_nbbudget, "stopit.ThreadingTimeout": run_threading,
    "stopit.SignalTimeout": run_signal, "func_timeout": run_func_timeout,
    "floor: setitimer": run_floor}


def available() -> list[str]:
    """The peers installed here (nbbudget always)."""
    found = ["nbbudget"]
    if hasattr(signal, "setitimer"):
        found.append("floor: setitimer")
    try:
        import stopit  # noqa: F401
    except ImportError:
        pass
    else:
        found += ["stopit.ThreadingTimeout", "stopit.SignalTimeout"]
    try:
        import func_timeout  # noqa: F401
    except ImportError:
        pass
    else:
        found.append("func_timeout")
    return [p for p in PEERS if p in found]


def deadline_of(peer: str, deadline: float) -> float:
    """SignalTimeout's ``signal.alarm`` takes whole seconds: its deadline is 1 s at least."""
    return max(1.0, float(round(deadline))) if peer == "stopit.SignalTimeout" else deadline


class Leftover(RuntimeError):
    """A thread a try started was still running after its join."""


def one_try(peer: str, kind: str, thread: str, deadline: float, overrun: float) -> Try:
    """One try of *peer* on work *kind* run on *thread*; every thread it started joined."""
    seconds = deadline_of(peer, deadline)
    before = set(threading.enumerate())
    pair = socket.socketpair() if kind == "recv" else None
    box = Box()
    got: list[tuple[float, float, str, float, float]] = []
    failed: list[BaseException] = []

    def start() -> float:
        t0 = pc()
        box.until = t0 + seconds + overrun  # the work ends by itself *overrun* past its deadline
        return t0

    def attempt() -> None:
        try:
            work = make_work(kind, box, pair)
            cpu0 = time.process_time()
            t0, t1, caught = RUNNERS[peer](seconds, work, start)
            got.append((t0, t1, caught, cpu0, time.process_time()))
        except BaseException as exc:  # what escaped a peer is raised after the joins
            failed.append(exc)

    gc.collect()
    gc.disable()
    try:
        if thread == "main":
            attempt()
        else:
            runner = threading.Thread(target=attempt, name="bench-preempt-try")
            runner.start()
            runner.join()
    finally:
        gc.enable()
    # the peers' timers and workers, and nbbudget's timer (it stays for LATE_MS after a stop);
    # then the socket pair (closing it would end a read still waiting, func_timeout's)
    try:
        for other in set(threading.enumerate()) - before:
            other.join(seconds + overrun + 5.0)
            if other.is_alive():
                raise Leftover(f"{peer}, {kind} on the {thread} thread: {other.name} still runs")
    finally:
        if pair is not None:
            for end in pair:
                end.close()
    joined = pc()
    if failed:
        raise failed[0]
    t0, t1, caught, cpu0, cpu1 = got[0]
    due = t0 + seconds
    # the work's stamp lost to the stop landing on it: it left by the except (by the join of
    # its thread, func_timeout's)
    left = box.left if box.left is not None else joined if peer == "func_timeout" else t1
    # stopped: it left before its own end (a margin for the clock reads)
    stopped = left < box.until - min(0.005, overrun / 10)
    return Try(late_ms=(t1 - due) * 1000, left_ms=(left - due) * 1000, stopped=stopped,
               caught=caught, cpu_ms=(cpu1 - cpu0) * 1000, wall_ms=(t1 - t0) * 1000)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def lateness(tries: int, deadline: float, overrun: float, signal_tries: int,
             peers: list[str]) -> list[Case]:
    """Section 1: every case, *tries* rounds of one try of each peer in turn, the order
    rotated every round (SignalTimeout in the first *signal_tries* rounds only)."""
    cases = [Case(work, thread) for thread in THREADS for work in WORKS]
    for case in cases:
        case.tries = {p: [] for p in peers
                      if not (p in MAIN_ONLY and case.thread != "main")}
    for rnd in range(tries):
        for case in cases:
            names = [p for p in case.tries
                     if p != "stopit.SignalTimeout" or rnd < signal_tries]
            k = rnd % len(names)
            for peer in names[k:] + names[:k]:
                case.tries[peer].append(one_try(peer, case.work, case.thread, deadline,
                                                overrun))
        print(f"  round {rnd + 1} of {tries} done", file=sys.stderr)
    return cases


def summary(values: list[Try]) -> dict[str, Any]:
    late = [t.late_ms for t in values]
    stopped = [t for t in values if t.stopped]
    went_on = [t.left_ms for t in values if not t.stopped]
    return {"tries": len(values), "median_ms": statistics.median(late),
            "p90_ms": percentile(late, 0.90), "p99_ms": percentile(late, 0.99),
            "stopped": len(stopped),
            # when the work left, in the tries where nothing stopped it
            "went_on_ms": statistics.median(went_on) if went_on else None,
            "cpu_ms": statistics.median(t.cpu_ms for t in values),
            "wall_ms": statistics.median(t.wall_ms for t in values),
            "caught": sorted({t.caught or "(nothing)" for t in values})}


def print_lateness(cases: list[Case], deadline: float, overrun: float
                   ) -> tuple[list[dict[str, Any]], list[tuple[str, bool, str]]]:
    """The table of section 1, and its goals: nbbudget's median at most 1.0x each peer's
    where both stopped the work (in more than half their tries; the count is beside)."""
    rows: list[dict[str, Any]] = []
    goals: list[tuple[str, bool, str]] = []
    print(f"\n1. lateness: ms from the deadline ({deadline * 1000:g} ms; SignalTimeout's 1 s) "
          f"to the except; a work nothing stops ends by itself {overrun * 1000:g} ms past it")
    print(f"  {'case / peer':<34}{'median':>8}{'p90':>8}{'p99':>8}  {'stopped':<8}"
          f"{'CPU ms':>8}{'wall ms':>9}  nbbudget / peer (median, p90)")
    for case in cases:
        print(f"  {case.name}")
        ours = summary(case.tries["nbbudget"])
        for peer, values in case.tries.items():
            s = summary(values)
            row = {"case": case.name, "work": case.work, "thread": case.thread, "peer": peer,
                   **s}
            stopped = f"{s['stopped']}/{s['tries']}"
            ratio = ""
            if peer != "nbbudget":
                both = 2 * ours["stopped"] > ours["tries"] and 2 * s["stopped"] > s["tries"]
                if both and s["median_ms"] > 0 and s["p90_ms"] > 0:
                    med = ours["median_ms"] / s["median_ms"]
                    p90 = ours["p90_ms"] / s["p90_ms"]
                    row["ratio_median"], row["ratio_p90"] = med, p90
                    ratio = f"{med:.2f}x, {p90:.2f}x"
                    if not peer.startswith("floor"):
                        goals.append((f"{case.name}: <= 1.0x {peer} (median)", med <= 1.0,
                                      f"{med:.2f}"))
                elif both:
                    ratio = "the peer at or before its deadline"
                elif 2 * ours["stopped"] > ours["tries"]:
                    ratio = "only nbbudget stopped the work"
                elif 2 * s["stopped"] > s["tries"]:
                    ratio = "only the peer stopped the work"
                else:
                    ratio = "neither stopped the work"
            print(f"    {peer:<32}{s['median_ms']:8.2f}{s['p90_ms']:8.2f}{s['p99_ms']:8.2f}  "
                  f"{stopped:<8}{s['cpu_ms']:8.1f}{s['wall_ms']:9.1f}  {ratio}")
            if s["went_on_ms"] is not None:
                print(f"    {'':<32}{s['tries'] - s['stopped']} did not stop until the call "
                      f"returned, {s['went_on_ms']:.1f} ms past the deadline (median)")
                if peer == "func_timeout":
                    print(f"    {'':<32}(its except is reached all the same: the work goes on "
                          f"in func_timeout's thread)")
            rows.append(row)
    return rows, goals


# -- section 2: an empty block, before preemption and now ----------------------------------

CHILD = r"""
import gc, json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import nbbudget as nb
assert nb.__file__.startswith(sys.argv[1]), nb.__file__
n, blocks = int(sys.argv[2]), int(sys.argv[3])

def timed():
    with nb.budget(time="5s"):
        pass

def plain():
    with nb.budget():
        pass

def cpu_us(fn, count):
    gc.collect()
    gc.disable()
    try:
        c, w = time.process_time(), time.perf_counter()
        for _ in range(count):
            fn()
        return (time.process_time() - c) / count * 1e6, (time.perf_counter() - w) / count * 1e6
    finally:
        gc.enable()

cases = {"time": timed, "plain": plain}
if "preempt" in __import__("inspect").signature(nb.Budget).parameters:
    def timed_coop():
        with nb.budget(time="5s", preempt=False):
            pass

    def plain_coop():
        with nb.budget(preempt=False):
            pass

    cases.update({"time_coop": timed_coop, "plain_coop": plain_coop})
for fn in cases.values():
    for _ in range(min(n // 10, 500)):
        fn()
got = {k: [] for k in cases}
names = list(cases)
for rep in range(blocks):
    for name in names[rep % len(names):] + names[:rep % len(names)]:
        # a block with a time starts the clock's timer thread: ten times dearer
        got[name].append(cpu_us(cases[name], n // 10 if name.startswith("time") else n))
print(json.dumps({k: [statistics.median(c for c, _ in v), statistics.median(w for _, w in v)]
                  for k, v in got.items()}))
"""


def spread(values: list[float], digits: int = 1) -> str:
    """The median, and the min..max beside it."""
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}..{max(values):.{digits}f})")


def before_ref() -> str:
    """The parent of the commit that added ``nbbudget/core/preempt.py``."""
    added = subprocess.run(
        ["git", "-C", ROOT, "log", "--diff-filter=A", "--format=%H", "--",
         "nbbudget/core/preempt.py"], capture_output=True, text=True, check=True).stdout.split()
    return f"{added[-1]}^"


def checkout(ref: str, into: str) -> str:
    """The ``nbbudget`` package at *ref*, written under *into* with ``git archive`` (no work
    tree or index of the repository is touched); the commit's short id."""
    short = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", ref],
                           capture_output=True, text=True, check=True).stdout.strip()
    data = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", ref, "nbbudget"],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)  # Python before 3.10.12: our own repository's files
    return short


def empty_block(reps: int, n: int, blocks: int, ref: str
                ) -> tuple[dict[str, Any], list[tuple[str, bool, str]]]:
    """Section 2: fresh processes, alternating between this checkout and *ref*."""
    home = tempfile.mkdtemp(prefix="nbbudget-bench-before-")
    env = {**os.environ, "NBBUDGET_INTERACTIVE": "0"}
    trees = {"now": ROOT, "before": home}
    got: dict[str, list[dict[str, list[float]]]] = {k: [] for k in trees}
    try:
        short = checkout(ref, home)
        for rep in range(reps):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for which in order:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, trees[which], str(n), str(blocks)],
                    capture_output=True, text=True, env=env, check=True, cwd=home)
                got[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    labels = {"time": 'with nb.budget(time="5s"): pass', "plain": "with nb.budget(): pass"}
    result: dict[str, Any] = {"before": short, "reps": reps, "blocks": blocks, "n": n}
    goals = []
    print(f"\n2. an empty block on the main thread, CPU us per block of the process (wall "
          f"beside), this checkout against {short} (before preemption): {reps} fresh processes "
          f"each, alternating, {blocks} x {n} blocks per case in each ({n // 10} with a time), "
          f"interleaved")
    for key, label in labels.items():
        now = [r[key][0] for r in got["now"]]
        coop = [r[key + "_coop"][0] for r in got["now"]]
        then = [r[key][0] for r in got["before"]]
        ratios = [a / b for a, b in zip(now, then, strict=True)]
        coop_ratios = [a / b for a, b in zip(coop, then, strict=True)]
        added = [a / b for a, b in zip(now, coop, strict=True)]
        wall = {which: statistics.median(r[k][1] for r in got[which])
                for which, k in (("now", key), ("before", key))}
        med = statistics.median(ratios)
        print(f"  {label}")
        print(f"    now                  {spread(now, 2):>24} us   wall {wall['now']:7.2f} us")
        print(f"    now, preempt=False   {spread(coop, 2):>24} us")
        print(f"    before               {spread(then, 2):>24} us   wall {wall['before']:7.2f} us")
        print(f"    now / before         {spread(ratios, 2):>24} x")
        print(f"    now, preempt=False / before {spread(coop_ratios, 2):>17} x")
        print(f"    now / now, preempt=False {spread(added, 2):>20} x  (what preemption adds, "
              f"same process)")
        result[key] = {"now_us": now, "now_cooperative_us": coop, "before_us": then,
                       "ratios": ratios, "cooperative_ratios": coop_ratios,
                       "preempt_added": added, "wall_now_us": wall["now"],
                       "wall_before_us": wall["before"]}
        if key == "time":
            goals.append((f"{label} <= 1.5x before preemption (CPU)", med <= 1.5,
                          f"{med:.2f}"))
        else:
            goals.append((f"{label}: now / before, CPU (reported)", True, f"{med:.2f}"))
    return result, goals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few tries, for a smoke run")
    parser.add_argument("--tries", type=int, default=None,
                        help="tries per case and peer (default 20; 2 with --quick)")
    parser.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                        help="the blocks' time (default 0.2; 0.05 with --quick)")
    parser.add_argument("--overrun", type=float, default=None, metavar="SECONDS",
                        help="how long past the deadline a work ends by itself "
                             "(default 0.15; 0.06 with --quick)")
    parser.add_argument("--before", default=None, metavar="REF",
                        help="the code to compare section 2 with (default: the parent of the "
                             "commit that added nbbudget/core/preempt.py)")
    parser.add_argument("--only", choices=["lateness", "empty"], help="one section")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    tries = args.tries or (2 if args.quick else 20)
    deadline = args.deadline or (0.05 if args.quick else 0.2)
    overrun = args.overrun or (0.06 if args.quick else 0.15)
    signal_tries = 1 if args.quick else tries  # 1 s each: one per case in a smoke run
    os.environ.setdefault("NBBUDGET_HOME", tempfile.mkdtemp(prefix="nbbudget-bench-"))
    os.environ["NBBUDGET_INTERACTIVE"] = "0"
    peers = available()
    started = pc()
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(),
            "switchinterval": sys.getswitchinterval(), "load_start": os.getloadavg()[0],
            "tries": tries, "deadline_s": deadline, "overrun_s": overrun, "peers": peers}
    print(f"nbbudget preemption benchmark: Python {meta['python']}, {meta['cpus']} CPUs, "
          f"switchinterval {meta['switchinterval']} s, {tries} tries per case and peer, "
          f"peers {', '.join(peers[1:]) or 'none installed (pip install -e .[bench])'}, "
          f"load {meta['load_start']:.2f}")
    goals: list[tuple[str, bool, str]] = []
    data: dict[str, Any] = {"meta": meta}
    failed = False
    if args.only in (None, "lateness"):
        began = pc()
        try:
            cases = lateness(tries, deadline, overrun, signal_tries, peers)
            rows, more = print_lateness(cases, deadline, overrun)
            goals += more
            data["lateness"] = rows
            data["tries"] = {c.name: {p: [asdict(t) for t in v] for p, v in c.tries.items()}
                             for c in cases}
        except Exception as exc:
            failed = True
            traceback.print_exc()
            data["lateness_error"] = f"{type(exc).__name__}: {exc}"
        meta["lateness_s"] = pc() - began
    if args.only in (None, "empty"):
        began = pc()
        try:
            reps = 2 if args.quick else 8
            found, more = empty_block(reps, 2000 if args.quick else 10000, 3 if args.quick else 5,
                                      args.before or before_ref())
            goals += more
            data["empty_block"] = found
        except Exception as exc:
            failed = True
            traceback.print_exc()
            data["empty_block_error"] = f"{type(exc).__name__}: {exc}"
        meta["empty_block_s"] = pc() - began
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    with contextlib.suppress(Exception):
        meta["load_end"] = os.getloadavg()[0]
    meta["elapsed_s"] = pc() - started
    print("\ngoals" + (" (quick mode: indicative only)" if args.quick else ""))
    for name, ok, value in goals:
        print(f"  {'PASS' if ok else 'MISS'}  {name:<66}{value:>8}")
    if left:
        failed = True
        print(f"threads left running: {', '.join(left)}")
    sections = ", ".join(f"{k[:-2].replace('_', ' ')} {meta[k]:.0f} s"
                         for k in ("lateness_s", "empty_block_s") if k in meta)
    print(f"({meta['elapsed_s']:.0f} s: {sections}; load {meta['load_start']:.2f} -> "
          f"{meta.get('load_end', 0):.2f})")
    if args.json:
        data["goals"] = [{"goal": g, "pass": ok, "value": v} for g, ok, v in goals]
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
