"""What a person reads in a real kernel from ``%budget status``, ``%budget trace``,
``run.usage()`` and ``trace.replay()`` (N-4, S4-9): a sentence when there is nothing to show,
whole numbers kept whole, short times, a table for a replay."""

from __future__ import annotations

import re

import pytest
from test_magic_kernel import kernel, run  # noqa: F401 - a module-scoped kernel fixture

pytestmark = pytest.mark.realclock


def test_N_4_status_with_nothing_to_show_says_so_in_a_sentence(kernel):  # noqa: F811
    cell = run(kernel, "%%budget --detach --budget 30s\nx = 1")
    assert cell.status == "ok"
    status = run(kernel, "%budget status")
    assert status.status == "ok"
    assert status.result is None
    assert re.fullmatch(r"The last %%budget cell \(cell: x = 1\) set no limits, so there is no "
                        r"use per limit to show; it ran \d+ ms \(completed\)\.\n",
                        status.stdout), status.stdout


def test_N_4_usage_keeps_whole_limits_whole_beside_a_cost(kernel):  # noqa: F811
    cell = run(kernel, "%%budget --steps 10 --tokens 2000 --cost 0.5 --no-widget\n"
                       "nb.current().charge('steps', 3)\nnb.current().charge('tokens', 150)\n"
                       "nb.current().charge('cost_usd', 0.125)")
    assert cell.status == "ok", cell.reply["content"]
    shown = run(kernel, "%budget status").result
    rows = {line.split()[0]: line.split()[1:] for line in shown.splitlines()[2:]}
    assert {kind: values[:3] for kind, values in rows.items()} == {
        "tokens": ["2000", "150", "1850"], "cost_usd": ["0.5", "0.125", "0.375"],
        "steps": ["10", "3", "7"]}, shown
    assert [float(rows[kind][3]) for kind in ("tokens", "cost_usd", "steps")] == [
        0.075, 0.25, 0.3]


def test_N_4_the_trace_of_the_last_cell_shows_short_times(kernel):  # noqa: F811
    run(kernel, "%%budget --steps 5 --no-widget\nfor _ in range(3):\n    nb.current().step()")
    shown = run(kernel, "print(get_ipython().run_line_magic('budget', 'trace')['t_ms'].tolist())")
    times = [float(t) for t in shown.stdout.strip().strip("[]").split(",")]
    assert times and all(t == round(t, 2) for t in times), shown.stdout


def test_S4_9_a_replay_reads_as_a_table_with_short_times(kernel):  # noqa: F811
    cell = run(kernel, """\
        with nb.budget(trace="full", name="agent") as agent:
            for _ in range(3):
                agent.step()
                agent.charge("tokens", 400, target="model:reply")
        agent.trace.replay(nb.Limits(tokens=1000))
        """)
    assert cell.status == "ok", cell.reply["content"]
    lines = cell.result.splitlines()
    assert lines[0] == "1 charge would have been refused under these limits (replayed charge " \
                       "by charge):"
    assert lines[1].split() == ["index", "t_ms", "budget_kind", "limit_value", "consumed_value",
                                "amount", "target_ref"]
    assert re.fullmatch(r"5\s+\d+\.\d{2}\s+tokens\s+1000\s+800\s+400\s+model:reply",
                        lines[2].strip()), lines
    held = run(kernel, "agent.trace.replay(nb.Limits(tokens=5000))").result
    assert held == "No charge would have been refused under these limits (replayed charge by " \
                   "charge)."
