"""The ``nbbudget`` command."""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..calls import history as _history
from ..calls.store import StoreReadOnly, store
from ..core.errors import ConfigError
from ..core.limits import negative_values_joined
from ..core.trace import Trace
from .run import add_commands as add_run_commands

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbbudget",
        description="Budgets for Jupyter: run a notebook under a call budget, list and stop "
                    "the runs that went on in the background, summarise a saved trace, and "
                    "explain a rule of the model.",
        epilog="example: nbbudget inspect trace.json --json",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_inspect(sub)
    _add_explain(sub)
    add_run_commands(sub)
    _add_history(sub)
    for command in sub.choices.values():  # an unknown flag is refused with its command's usage
        command.set_defaults(command_parser=command)
    return parser


def _parsed(words: list[str]) -> argparse.Namespace:
    """The command's arguments. An argument its command does not know is refused as argparse
    refuses it (exit 2), but with that command's usage rather than ``nbbudget``'s, and the flag
    it is most like: ``nbbudget run x --stpes 3`` shows ``run``'s usage and asks about
    ``--steps``."""
    args, unknown = _parser().parse_known_args(words)
    if unknown:
        command: argparse.ArgumentParser = args.command_parser
        command.error(f"unrecognized arguments: {' '.join(unknown)}"
                      f"{_did_you_mean(command, unknown)}")
    return args


def _did_you_mean(command: argparse.ArgumentParser, unknown: list[str]) -> str:
    """`` (did you mean --steps?)`` for the flags among *unknown* that are like one of
    *command*'s (as its usage writes them), else nothing."""
    flags = re.findall(r"--[a-z][a-z0-9-]*", command.format_usage())
    like = [found[0] for word in unknown if word.startswith("--")
            for found in [difflib.get_close_matches(word.split("=")[0], flags, n=1)] if found]
    return f" (did you mean {' or '.join(like)}?)" if like else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad usage, unreadable input or a
    write to a read-only store, 1 when the reader of standard output went away, as in
    ``nbbudget jobs | head -5``; ``nbbudget run`` has codes of its own)."""
    # a negative value after its flag (--budget -1s) is read as its value, and refused as such
    words = negative_values_joined(sys.argv[1:] if argv is None else argv)
    args = _parsed(words)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        code = handler(args)
        sys.stdout.flush()  # a reader that went away is found here, not at exit
    except StoreReadOnly as exc:  # a write the store cannot take (nbbudget cancel, --forget...)
        print(f"nbbudget {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # as Python's documentation says to (the note on SIGPIPE, in the signal module): what
        # is left to flush at exit goes nowhere, and the command ends quietly, with 1
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return code


def _add_inspect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inspect = sub.add_parser(
        "inspect",
        help="summarise a saved trace: budget checks, consumptions and refusals by kind",
        description="Summarise a trace saved with run.trace.save(PATH): the number of budget "
                    "checks, consumptions and refusals, and the kinds involved (see: nbbudget "
                    "explain S4-9).",
        epilog="example: nbbudget inspect trace.json --json",
    )
    inspect.add_argument("trace", metavar="TRACE.json", help="a trace file written by Trace.save")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    inspect.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
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


def _add_explain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = sub.add_parser(
        "explain",
        help="explain a rule that a message cites, with an example that runs as written",
        description="Print a rule of the model: what it says, an example that runs as written "
                    "and what the example prints, and where the documentation explains it. "
                    "Messages cite a rule as (see: nbbudget explain ID). Without an ID, list "
                    "every rule with its title.",
        epilog="example: nbbudget explain S0-10",
    )
    explain.add_argument("rule", metavar="ID", nargs="?",
                         help="the id of a rule, as a message cites it (any case)")
    explain.set_defaults(handler=_explain)


def _explain(args: argparse.Namespace) -> int:
    from ..core import rules as _rules  # the table is read only here

    if args.rule is None:
        print(_rules.index())
        return 0
    try:
        rule = _rules.find(args.rule)
    except LookupError as exc:
        print(f"nbbudget explain: {exc.args[0]}", file=sys.stderr)
        return 2
    text, _, last = _rules.explain(rule).rpartition("\n\n")
    if not last.startswith("Read more: "):  # the rule's own text, whole: nothing to replace
        text = f"{text}\n\n{last}"
    more = textwrap.fill(f"Read more: {_read_more(rule.anchor)}", 88, break_long_words=False,
                         break_on_hyphens=False)
    print(f"{text}\n\n{more}")
    return 0


#: where nbbudget's source and documentation live: the repository the README installs from
_REPOSITORY = "https://github.com/nbbudget/nbbudget"


def _read_more(anchor: str) -> str:
    """Where the documentation explains the rule whose target is *anchor*, as this
    installation can reach it: the Concepts page of the checkout it runs from, by its path, or,
    for an installed package (which has no ``docs/``), that page in the repository."""
    root = Path(__file__).resolve().parents[2]
    page = root / "docs" / "concepts.md"
    if page.is_file() and (root / "pyproject.toml").is_file():
        return f"{page}#{anchor} (the Concepts page of the documentation)"
    return (f"the Concepts page of the documentation, docs/concepts.md in nbbudget's "
            f"repository, {_REPOSITORY}")


def _add_history(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history = sub.add_parser(
        "history",
        help="list the last runs of the store: cells, calls, notebook runs, with blocks",
        description=f"List the last runs the store of NBBUDGET_HOME kept, newest first: id, "
                    f"kind (run, call, cell, notebook), name, when it started (UTC), status, "
                    f"what stopped it (by) and what it consumed. The store keeps the last "
                    f"{_history.KEEP_RUNS:,} runs of at most {_history.KEEP_DAYS} days; "
                    f"NBBUDGET_HISTORY=0 keeps none, NBBUDGET_HISTORY=1 keeps them in plain "
                    f"Python too. nb.suggest_limits() suggests limits from them.",
        epilog="example: nbbudget history --limit 20 --json")
    history.add_argument("--json", action="store_true",
                         help="print the runs as JSON: a list of objects, newest first")
    history.add_argument("--limit", metavar="N", type=int, default=None,
                         help="show at most the N newest runs")
    history.add_argument("--forget", metavar="ID", type=int, default=None,
                         help="remove the run ID from the history (one that cannot be read)")
    history.set_defaults(handler=_history_command)


def _history_command(args: argparse.Namespace) -> int:
    """``nbbudget history``: the store's last runs, as a table or as JSON."""
    if args.limit is not None and args.limit < 1:
        print(f"nbbudget history: --limit {args.limit}: give a number of runs, 1 or more",
              file=sys.stderr)
        return 2
    try:
        db = store()
        if args.forget is not None:
            if not _history.forget(args.forget, db):
                print(f"nbbudget history: there is no run {args.forget} in the history of "
                      f"{db.location}", file=sys.stderr)
                return 2
            print(f"run {args.forget} was removed from the history")
            return 0
        rows = [entry.row() for entry in _history.entries(args.limit, db)]
    except ConfigError as exc:
        print(f"nbbudget history: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no runs in the history of {db.location}")
    else:
        print(_history_table(rows, shutil.get_terminal_size((0, 0)).columns))
    return 0


_HISTORY_COLUMNS = ("id", "kind", "started", "status", "by", "name", "consumed")
_NAME_MIN = 24  # a name is never shortened to fewer characters than this


def _history_table(rows: list[dict[str, Any]], columns: int = 0) -> str:
    """The runs of ``nbbudget history --json`` as a table for a person: each column as wide as
    what it holds; ``by`` says what stopped a run (its limit's kind, ``timeout``...), else why
    it ended (its cause), ``-`` when it ran to its end. A name too long for a terminal of
    *columns* characters (0: not a terminal, names are written whole) is shortened in the
    middle, keeping where it differs from the others shown (`_shortened`)."""
    cells = [{"id": str(row["id"]), "kind": row["kind"], "started": row["started"],
              "status": row["status"], "name": row["name"],
              "by": row["by"] or (row["cause"] if row["status"] != "completed" else None) or "-",
              "consumed": ", ".join(f"{k}={v:g}" for k, v in row["consumed"].items())}
             for row in rows]
    widths = {c: max(len(c), *(len(cell[c]) for cell in cells)) for c in _HISTORY_COLUMNS}
    if columns:
        room = columns - sum(widths[c] + 2 for c in _HISTORY_COLUMNS[:5]) - 2 - widths["consumed"]
        widths["name"] = min(widths["name"], max(room, _NAME_MIN))
        differs = _differs_at([cell["name"] for cell in cells])
        for cell in cells:
            cell["name"] = _shortened(cell["name"], widths["name"], differs[cell["name"]])
    lines = ["  ".join(cell[c].rjust(widths[c]) if c == "id" else cell[c].ljust(widths[c])
                       for c in _HISTORY_COLUMNS).rstrip()
             for cell in [dict(zip(_HISTORY_COLUMNS, _HISTORY_COLUMNS, strict=True)), *cells]]
    return "\n".join(lines)


def _differs_at(names: list[str]) -> dict[str, int]:
    """For each of *names*, where it first differs from the name most like it: the longest
    prefix it shares with another name (its neighbours in sorted order hold it)."""
    ordered = sorted(set(names))
    shared = [_shared(a, b) for a, b in itertools.pairwise(ordered)]
    return {name: max(shared[i - 1] if i else 0, shared[i] if i < len(shared) else 0)
            for i, name in enumerate(ordered)}


def _shared(a: str, b: str) -> int:
    """How many characters *a* and *b* share from their start."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _shortened(name: str, width: int, differs_at: int) -> str:
    """*name* on at most *width* characters: its start, ``...`` and its end, where the cut
    keeps the character at *differs_at* (the first that tells it from another name), with a
    second ``...`` after it when neither end holds it."""
    if len(name) <= width:
        return name
    keep = width - 3
    for head in (keep // 2, keep // 3):
        tail = keep - head
        if differs_at < head or differs_at >= len(name) - tail:
            return name[:head] + "..." + name[len(name) - tail:]
    start = max(differs_at - 3, head)
    return name[:head] + "..." + name[start:start + width - head - 6] + "..."


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
