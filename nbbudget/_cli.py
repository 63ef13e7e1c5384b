"""The ``nbbudget`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ._errors import ConfigError
from ._run_cli import add_commands as add_run_commands
from ._trace import Trace

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbbudget",
        description="Budgets for Jupyter: inspect what a budgeted run consumed and refused.",
        epilog="example: nbbudget inspect trace.json --json",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    inspect = sub.add_parser(
        "inspect",
        help="summarise a saved trace: budget checks, consumptions and refusals by kind",
        description="Summarise a trace saved with run.trace.save(PATH): the number of budget "
                    "checks, consumptions and refusals, and the kinds involved (S4-9).",
        epilog="example: nbbudget inspect trace.json --json",
    )
    inspect.add_argument("trace", metavar="TRACE.json", help="a trace file written by Trace.save")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_run_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad usage or unreadable trace;
    ``nbbudget run`` has codes of its own)."""
    args = _parser().parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args, list(sys.argv[1:] if argv is None else argv)))
    try:
        summary = Trace.load(args.trace).summary()
    except ConfigError as exc:
        print(f"nbbudget inspect: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(format_summary(summary))
    return 0


def format_summary(summary: dict[str, object]) -> str:
    """The summary as a small text table."""
    lines = [
        f"trace {summary['run']!r} ({summary['mode']})",
        f"  checks {summary['checks']}, consumptions {summary['consumptions']}, "
        f"refusals {summary['refusals']}",
    ]
    by_kind = summary["by_kind"]
    limits = summary["limits"]
    assert isinstance(by_kind, dict) and isinstance(limits, dict)
    if by_kind:
        lines.append(f"  {'kind':<18}{'limit':>12}{'checks':>10}{'consumed':>12}{'refused':>9}")
        for kind, row in by_kind.items():
            limit = limits.get(kind, "-")
            lines.append(f"  {kind:<18}{limit!s:>12}{row['checks']!s:>10}"
                         f"{row['consumed']!s:>12}{row['refusals']!s:>9}")
    outcome = summary.get("outcome")
    if isinstance(outcome, dict):
        detail = ", ".join(f"{k}={v}" for k, v in outcome.items() if k != "message")
        lines.append(f"  outcome: {detail}")
    return "\n".join(lines)
