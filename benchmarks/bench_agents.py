#!/usr/bin/env python3
"""Overhead of ``run.provider`` and ``run.tool`` around a trivial function, against calling it
bare and against pydantic-ai's own usage-limit check, measured in one run.

    python benchmarks/bench_agents.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

import nbbudget as nb


def per_call_ns(fn: Callable[[], object], n: int, reps: int) -> float:
    samples = []
    for _ in range(reps):
        for _ in range(min(n, 200)):
            fn()
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter_ns()
            for _ in range(n):
                fn()
            samples.append((time.perf_counter_ns() - start) / n)
        finally:
            gc.enable()
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, reps = (2_000, 3) if args.quick else (20_000, 5)
    reply = {"usage": {"input_tokens": 10, "output_tokens": 5}}

    def model() -> dict:
        return reply

    def tool() -> int:
        return 1

    run = nb.budget(provider_calls=10**9, tokens=10**12, tool_calls=10**9)
    with run:
        inline = run.provider(model, guardrail=0)
        guarded = run.provider(model)
        budgeted_tool = run.tool(tool)
        rows = [("bare call", per_call_ns(model, n, reps)),
                ("run.provider, guardrail off (in place)", per_call_ns(inline, n, reps)),
                ("run.provider, 1 h guardrail (a thread per call)",
                 per_call_ns(guarded, n // 10, reps)),
                ("run.tool (a thread per call)", per_call_ns(budgeted_tool, n // 10, reps))]
    try:
        from pydantic_ai.usage import RunUsage, UsageLimits

        limits = UsageLimits(request_limit=10**9)
        usage = RunUsage()

        def pydantic_check() -> dict:
            limits.check_before_request(usage)
            usage.requests += 1
            result = model()
            usage.input_tokens += 10
            usage.output_tokens += 5
            limits.check_tokens(usage)
            return result

        rows.append(("pydantic-ai check_before_request + counts + check_tokens",
                     per_call_ns(pydantic_check, n, reps)))
    except ImportError:
        rows.append(("pydantic-ai check (skipped: pip install -e '.[bench]')", float("nan")))
    bare = rows[0][1]
    print(f"agent overheads: Python {sys.version.split()[0]}, {n} calls x {reps} reps")
    for name, ns in rows:
        print(f"  {name:<58}{ns:>12,.0f} ns/call  {ns / bare:8.1f}x bare")
    if rows[-1][1] == rows[-1][1]:  # not NaN
        print(f"\n  run.provider (in place) / pydantic-ai check: {rows[1][1] / rows[-1][1]:.2f}")
    agent_runs(20 if args.quick else 200, reps)
    return 0


def agent_runs(n: int, reps: int) -> None:
    """A whole offline pydantic-ai agent run (three tool calls, then an answer): bare, with
    pydantic-ai's own `UsageLimits`, and with `nbbudget.pydantic_ai.Budgeted`."""
    try:
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel
        from pydantic_ai.usage import RequestUsage, UsageLimits

        from nbbudget.pydantic_ai import Budgeted
    except ImportError:
        print("\n  agent runs skipped: pip install -e '.[bench]'")
        return

    def model(messages: list, info: object) -> ModelResponse:
        used = RequestUsage(input_tokens=10, output_tokens=5)
        if len(messages) > 6:
            return ModelResponse(parts=[TextPart("done")], usage=used)
        return ModelResponse(parts=[ToolCallPart("lookup", {"q": "x"})], usage=used)

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def lookup(q: str) -> str:
        return q

    limits = UsageLimits(request_limit=100, tool_calls_limit=100, total_tokens_limit=10**9)

    def bare() -> object:
        return agent.run_sync("go")

    def usage_limits() -> object:
        return agent.run_sync("go", usage_limits=limits)

    def budgeted() -> object:
        with nb.budget(provider_calls=100, tool_calls=100, tokens=10**9) as run:
            return agent.run_sync("go", capabilities=[Budgeted(run)])

    assert bare().output == usage_limits().output == budgeted().output == "done"
    base = per_call_ns(bare, n, reps)
    own = per_call_ns(usage_limits, n, reps)
    ours = per_call_ns(budgeted, n, reps)
    print(f"\npydantic-ai agent run (4 model requests, 3 tool calls), {n} runs x {reps} reps")
    print(f"  {'bare agent.run_sync':<58}{base / 1e3:>12,.0f} us/run")
    print(f"  {'with UsageLimits (its own check)':<58}{own / 1e3:>12,.0f} us/run  "
          f"+{(own - base) / 1e3:,.0f} us")
    print(f"  {'with Budgeted(run) (a new run each time)':<58}{ours / 1e3:>12,.0f} us/run  "
          f"+{(ours - base) / 1e3:,.0f} us")
    print(f"  Budgeted / UsageLimits, whole run: {ours / own:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
