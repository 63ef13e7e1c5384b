"""A short headless demo: an agent-like loop under a budget, then what it used and why it stopped.

Run it with ``python -m nbbudget.demo`` (``--trace PATH`` also saves the trace for
``nbbudget inspect``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import nbbudget as nb
from nbbudget.cli.main import format_summary


def research(run: nb.Budget) -> list[str]:
    """A loop that plans, calls tools and delegates, until a limit refuses the next call."""

    @run.tool(max_silence="500ms")
    def search(query: str, ctx: nb.ToolContext) -> str:
        for page in range(3):
            time.sleep(0.01)
            ctx.progress({"query": query, "page": page})
        return f"results for {query!r}"

    notes: list[str] = []
    for topic in ["budgets", "grants", "watchdogs", "traces", "replay", "windows"]:
        run.step()
        with run.grant(steps=2, time="1s", name=f"summarise:{topic}") as child:
            child.step()
            notes.append(search(topic))
        run.set_output(list(notes))
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbbudget.demo", description=__doc__)
    parser.add_argument("--trace", metavar="PATH", help="also save the trace to PATH")
    args = parser.parse_args(argv)

    run = nb.budget(steps=20, tool_calls=4, time="10s", name="research", trace="full")
    try:
        with run:
            research(run)
    except nb.BudgetExceeded as exc:
        print(f"stopped: {exc}")
    print(f"outcome: {run.outcome}")
    print(f"kept output: {run.outcome.output if run.outcome else None}\n")
    try:
        print(run.usage().to_string(), "\n")
    except ImportError as exc:
        print(f"(usage table skipped: {exc})\n")
    print(format_summary(run.trace.summary()))
    print(f"\nunder tool_calls=2 the same run would have been refused at: "
          f"{run.trace.replay(nb.Limits(tool_calls=2)).first}")
    if args.trace:
        run.trace.save(args.trace, overwrite=True)
        print(f"\ntrace saved to {args.trace}; inspect it with: nbbudget inspect {args.trace}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
