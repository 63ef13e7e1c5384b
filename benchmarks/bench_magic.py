#!/usr/bin/env python3
"""Speed benchmark of ``%%budget`` through a real kernel, as ratios measured in the same run.

    python benchmarks/bench_magic.py           # about a minute
    python benchmarks/bench_magic.py --quick

1. Per-cell overhead: ``%%budget --no-widget`` on a trivial cell against what ``%%time`` adds to
   the same cell (goal: at most 1.0x), and what the panel adds on top.
2. The panel's updater: the CPU it uses while a cell calls ``step()`` a million times, as a share
   of one core (goal: under 5%).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from jupyter_client.manager import start_new_kernel


def execute(kc, code: str) -> dict:
    msg_id = kc.execute(code, allow_stdin=False, stop_on_error=False)
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            break
    reply = kc.get_shell_msg(timeout=120)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=120)
    return reply


def per_cell_ms(kc, code: str, n: int) -> float:
    for _ in range(5):
        execute(kc, code)
    start = time.perf_counter()
    for _ in range(n):
        execute(kc, code)
    return (time.perf_counter() - start) / n * 1000


def value(kc, expr: str) -> str:
    msg_id = kc.execute(f"print({expr})", allow_stdin=False)
    out = ""
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return out.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n = 50 if args.quick else 200
    reps = 2 if args.quick else args.reps
    env = {**os.environ, "NBBUDGET_HOME": tempfile.mkdtemp(prefix="nbbudget-bench-")}
    env.pop("NBBUDGET_INTERACTIVE", None)
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        execute(kc, "%load_ext nbbudget\nimport nbbudget as nb")
        cases = {"plain": "pass", "time": "%%time\npass",
                 "budget": "%%budget --no-widget\npass", "panel": "%%budget\npass"}
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for rep in range(reps):
            order = list(cases)[rep % 4:] + list(cases)[:rep % 4]
            for name in order:
                samples[name].append(per_cell_ms(kc, cases[name], n))
        med = {k: statistics.median(v) for k, v in samples.items()}
        time_over = med["time"] - med["plain"]
        budget_over = med["budget"] - med["plain"]
        panel_over = med["panel"] - med["budget"]
        print(f"%%budget through a real kernel: Python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs, {n} cells x {reps} reps per case")
        for name in cases:
            print(f"  {cases[name]!r:<32} {med[name]:8.3f} ms/cell")
        print(f"  %%time adds {time_over * 1000:.0f} us; %%budget --no-widget adds "
              f"{budget_over * 1000:.0f} us; the panel adds {panel_over * 1000:.0f} us more")

        steps = "import time\nfor _ in range(10**6):\n    nb.current().step()\n" \
                "    if _ % 1000 == 0: time.sleep(0)"
        execute(kc, f"%%budget --steps 2000000\n{steps}")
        panel = "get_ipython().magics_manager.registry['BudgetMagics'].last_panel"
        execute(kc, f"{panel}._thread.join(5)")
        cpu = float(value(kc, f"{panel}.cpu_seconds"))
        run = "get_ipython().magics_manager.registry['BudgetMagics'].last_run"
        wall = float(value(kc, f"{run}.snapshot().elapsed_ms")) / 1000
        share = cpu / wall
        print(f"  a cell stepping 10**6 times for {wall:.2f} s: the panel's updater thread used "
              f"{cpu * 1000:.1f} ms of CPU, {share * 100:.1f}% of one core")
        ratio = budget_over / time_over
        print("\ngoals" + (" (quick mode: indicative only)" if args.quick else ""))
        print(f"  {'PASS' if ratio <= 1.0 else 'MISS'}  %%budget --no-widget overhead <= 1.0x "
              f"%%time's {ratio:10.2f}")
        print(f"  {'PASS' if share < 0.05 else 'MISS'}  panel updater < 5% of one core"
              f"{share * 100:17.1f}%")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
