"""The ``nbbudget`` command: ``nbbudget inspect TRACE.json [--json]`` (S4-9).

The real command runs in a subprocess on a trace saved by a real run. It prints the summary as a
table, or as JSON equal to ``Trace.load(path).summary()``; a file it cannot read is exit code 2
with one line on stderr naming the file, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock


def nbbudget_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbbudget", *map(str, args)],
        capture_output=True, text=True, timeout=60, check=False,
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace saved by a run that spends 2 steps and 1 tool call in 12 ms, then is refused a
    second tool call, which ends the run as failed."""
    clock = FakeClock()
    run = nb.budget(steps=5, tool_calls=1, clock=clock, trace="full", notices=None, name="agent")
    with pytest.raises(nb.BudgetExceeded), run:
        run.step()
        run.step()
        run.charge("tool_calls", target="tool:search")
        clock.advance(12)
        run.charge("tool_calls", target="tool:search")
    path = tmp_path_factory.mktemp("cli") / "trace.json"
    run.trace.save(path)
    return path


def test_inspect_prints_the_totals_and_one_row_per_kind_S4_9(trace_path: Path) -> None:
    result = nbbudget_cli("inspect", trace_path)
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == "trace 'agent' (full)"
    assert lines[1] == "  checks 4, consumptions 3, refusals 1"
    assert [line.split() for line in lines[2:6]] == [
        ["kind", "limit", "checks", "consumed", "refused"],
        ["steps", "5", "2", "2", "0"],
        ["tool_calls", "1", "2", "1", "1"],
        ["run_ms", "-", "0", "12", "0"],
    ]
    assert lines[6:] == [
        "  outcome: status=failed, cause=budget-cut, by=tool_calls, code=ToolCallBudgetExceeded",
    ]


def test_inspect_json_prints_the_summary_of_the_trace_S4_9(trace_path: Path) -> None:
    result = nbbudget_cli("inspect", trace_path, "--json")
    assert (result.returncode, result.stderr) == (0, "")
    summary = json.loads(result.stdout)
    assert summary == nb.Trace.load(trace_path).summary()
    assert (summary["checks"], summary["consumptions"], summary["refusals"]) == (4, 3, 1)
    assert summary["kinds"] == ["steps", "tool_calls", "run_ms"]


def test_inspect_a_missing_file_exits_2_with_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "missing.json"
    result = nbbudget_cli("inspect", path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (f"nbbudget inspect: cannot read trace {str(path)!r}: No such file "
                             f"or directory\n")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", " is not valid JSON: "),
        ('{"format": "something-else"}', ": not an nbbudget trace (format 'something-else', "),
        ('{"format": "nbbudget-trace-v1"}', ": a field is missing or malformed ("),
    ],
    ids=["invalid-json", "foreign-format", "missing-field"],
)
def test_inspect_a_malformed_file_exits_2_with_one_line_naming_it(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = nbbudget_cli("inspect", path, "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"nbbudget inspect: trace {str(path)!r}{problem}")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_help_describes_the_command_and_lists_inspect() -> None:
    result = nbbudget_cli("--help")
    assert (result.returncode, result.stderr) == (0, "")
    text = one_line(result.stdout)
    assert text.startswith("usage: nbbudget ")
    assert ("Budgets for Jupyter: run a notebook under a call budget, list and stop the runs "
            "that went on in the background, summarise a saved trace, and explain a rule of the "
            "model.") in text
    assert "inspect summarise a saved trace: budget checks, consumptions and refusals by kind" in (
        text
    )


def test_help_shows_an_example() -> None:
    assert "example: nbbudget inspect trace.json" in one_line(nbbudget_cli("--help").stdout)


def test_inspect_help_describes_the_command_and_shows_an_example_S4_9() -> None:
    result = nbbudget_cli("inspect", "--help")
    assert (result.returncode, result.stderr) == (0, "")
    text = one_line(result.stdout)
    assert text.startswith("usage: nbbudget inspect [-h] [--json] TRACE.json")
    assert (
        "Summarise a trace saved with run.trace.save(PATH): the number of budget checks, "
        "consumptions and refusals, and the kinds involved (see: nbbudget explain S4-9)."
    ) in text
    assert "--json print the summary as JSON" in text
    assert text.endswith("example: nbbudget inspect trace.json --json")


def test_no_command_is_a_usage_error() -> None:
    result = nbbudget_cli()
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "nbbudget: error: the following arguments are required: COMMAND"
    )


# -- nbbudget explain ------------------------------------------------------------------------------
def console_script(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``nbbudget`` command that installing the package puts beside this Python."""
    script = Path(sys.executable).with_name("nbbudget")
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_explain_prints_the_rule_its_example_what_it_prints_and_where_to_read_more() -> None:
    from nbbudget.core.rules import find

    rule = find("S0-10")
    result = console_script("explain", "S0-10")
    assert (result.returncode, result.stderr) == (0, "")
    text = result.stdout
    assert text.startswith("S0-10: no budget without a way to stop early\n\n")
    assert one_line(rule.text) in one_line(text)
    example = "\n".join(f"    {line}" if line else "" for line in rule.example.splitlines())
    assert f"Example:\n\n{example}\n" in text
    assert "It prints:\n\n    budget='2s' needs detach=True or resume=True" in text
    # run from this checkout: its own Concepts page, by a path that exists
    page = Path(__file__).resolve().parent.parent / "docs" / "concepts.md"
    assert page.is_file()
    more = text.rsplit("\n\n", 1)[1]
    assert one_line(more) == f"Read more: {page}#s0-10 (the Concepts page of the documentation)"


def test_explain_installed_without_the_repository_points_at_the_documentation_online(
        tmp_path: Path) -> None:
    """A package installed by pip has no ``docs/`` beside it: ``explain`` names the page and the
    repository the README installs from, never a path the user lacks."""
    import shutil

    site = tmp_path / "site-packages"
    shutil.copytree(Path(nb.__file__).parent, site / "nbbudget",
                    ignore=shutil.ignore_patterns("__pycache__", "labextension"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import nbbudget; print(nbbudget.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip() == str(site / "nbbudget" / "__init__.py")  # the copy runs
    result = subprocess.run([sys.executable, "-m", "nbbudget", "explain", "S0-10"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("S0-10: no budget without a way to stop early\n\n")
    more = result.stdout.rsplit("\n\n", 1)[1]
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    repository = re.search(r"git\+(https://github\.com/[\w.-]+/[\w.-]+)'", readme)[1]
    assert one_line(more) == (f"Read more: the Concepts page of the documentation, "
                              f"docs/concepts.md in nbbudget's repository, {repository}")
    assert all(len(line) <= 88 for line in more.splitlines())


def test_explain_takes_an_id_in_any_case() -> None:
    lower = nbbudget_cli("explain", "s0-10")
    assert (lower.returncode, lower.stderr) == (0, "")
    assert lower.stdout.startswith("S0-10: ")
    assert lower.stdout == console_script("explain", "S0-10").stdout


def test_explain_shows_a_cell_example_as_a_cell_and_links_as_their_words() -> None:
    result = nbbudget_cli("explain", "N-2")
    assert result.returncode == 0
    assert "Example, a notebook cell once %load_ext nbbudget has run:\n\n    %%budget --detach" in (
        result.stdout)
    assert "It prints" not in result.stdout
    assert "(on the ipykernel versions listed in Limits)" in one_line(result.stdout)


def test_explain_alone_lists_every_rule_with_its_title() -> None:
    from rules import ALL_RULE_IDS

    result = console_script("explain")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == "The rules of the model; nbbudget explain ID shows one with an example:"
    rows = [line.split(maxsplit=1) for line in lines[1:]]
    assert [row[0] for row in rows] == ALL_RULE_IDS
    assert ["S0-10", "no budget without a way to stop early"] in rows


def test_explain_an_unknown_id_exits_2_naming_it_and_the_known_ids() -> None:
    result = console_script("explain", "S9-1")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("nbbudget explain: no rule 'S9-1'; the rules are S0-1, S0-2, ")
    assert result.stderr.endswith(", N-3, N-4, N-5, N-6, N-7\n")
    assert result.stderr.count("\n") == 1


def test_explain_help_describes_the_command_and_shows_an_example() -> None:
    result = nbbudget_cli("explain", "--help")
    assert (result.returncode, result.stderr) == (0, "")
    text = one_line(result.stdout)
    assert text.startswith("usage: nbbudget explain [-h] [ID]")
    assert "example: nbbudget explain S0-10" in text


def test_help_lists_explain() -> None:
    text = one_line(nbbudget_cli("--help").stdout)
    assert "explain explain a rule that a message cites, with an example that runs as written" in (
        text)


# -- a reader that goes away -----------------------------------------------------------------------
@pytest.mark.parametrize("args", [["jobs"], ["explain", "s0-10"], ["explain"]],
                         ids=" ".join)
def test_a_reader_that_went_away_ends_the_command_quietly_with_1(
        args: list[str], tmp_path: Path) -> None:
    """As ``nbbudget jobs | head -5`` once ``head`` has read its lines: standard output is a
    pipe whose reader is gone, so every write fails with EPIPE. The command ends as Python's
    documentation says to (its note on SIGPIPE): no traceback, exit code 1."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes anything
    try:
        done = subprocess.run([str(Path(sys.executable).with_name("nbbudget")), *args],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**os.environ, "NBBUDGET_HOME": str(tmp_path / "home")},
                              check=False)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, "")


def test_a_pipe_into_head_shows_the_first_lines_and_nothing_else(tmp_path: Path) -> None:
    import os

    script = Path(sys.executable).with_name("nbbudget")
    done = subprocess.run(["sh", "-c", f"'{script}' explain s0-10 | head -3"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "NBBUDGET_HOME": str(tmp_path / "home")})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0].startswith("S0-10: ")
