"""The history of runs: what the store keeps of each run that ends (``with nb.budget()``, the
work of ``nb.call``, a ``%%budget`` cell, a notebook of ``nbbudget run``), bounded, and how
``nbbudget history`` and ``%budget history`` show it."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import closing

import pandas as pd
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import nbbudget as nb
from nbbudget.calls import history
from nbbudget.run import budget as _budget

pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")


@pytest.fixture
def keeping(monkeypatch):
    monkeypatch.setenv("NBBUDGET_HISTORY", "1")
    history.refresh()  # as importing nbbudget does
    yield
    monkeypatch.delenv("NBBUDGET_HISTORY", raising=False)
    history.refresh()


def rows(home) -> list[tuple]:
    """Every history row of the store in *home*, oldest first, read on a connection of its own."""
    with closing(sqlite3.connect(home / "nbbudget.db")) as db:
        return db.execute("SELECT id, kind, name, status, by FROM history ORDER BY id").fetchall()


def cli(*args: str, env_home, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "NBBUDGET_HOME": str(env_home), **env}
    return subprocess.run([sys.executable, "-m", "nbbudget", *args], capture_output=True,
                          text=True, env=environ, timeout=120)


def test_each_kind_of_run_is_recorded_with_its_outcome_limits_and_consumption(keeping, home):
    with nb.budget(steps=5, name="loop") as run:
        run.step()
        run.step()
    with pytest.raises(nb.BudgetExceeded), nb.budget(steps=1, name="greedy") as run:
        run.step()
        run.step()
    with nb.budget(name="idle"):
        pass

    def used() -> int:
        nb.current().step()
        return 1

    assert nb.call(lambda: 3, detach=True, budget="5s").ok  # its run is never made
    assert nb.call(used, detach=True, budget="5s", limits=nb.Limits(steps=4)).ok

    found = history.entries()
    assert [(e.kind, e.name, e.status, e.by) for e in found] == [
        ("call", "test_each_kind_of_run_is_recorded_with_its_outcome_limits_and_consumption"
                 ".<locals>.used", "completed", None),
        ("call", "test_each_kind_of_run_is_recorded_with_its_outcome_limits_and_consumption"
                 ".<locals>.<lambda>", "completed", None),
        ("run", "idle", "completed", None),
        ("run", "greedy", "failed", "steps"),
        ("run", "loop", "completed", None),
    ]
    loop, greedy = found[4], found[3]
    assert loop.limits == {"steps": 5} and loop.consumed["steps"] == 2
    assert greedy.cause == "budget-cut" and greedy.consumed["steps"] == 1
    assert found[0].limits == {"steps": 4} and found[0].consumed["steps"] == 1
    assert loop.started <= loop.ended <= time.time()
    # the trace is kept: it replays under other limits as the run's own does
    assert greedy.trace().summary()["refusals"] == 1
    assert greedy.trace().outcome["by"] == "steps"
    assert found[2].trace().replay(nb.Limits(steps=1)).refusals == []  # it spent only time
    assert loop.trace().replay(nb.Limits(steps=1)).refusals[0]["consumed_value"] == 2


def test_the_limits_and_consumption_are_stored_as_json_dumps_writes_them(keeping, home):
    with nb.budget(name="idle"):
        pass
    with nb.budget(steps=5, cost_usd=0.5, tokens=2**40, name="spent") as run:
        run.step()
        run.charge("cost_usd", 0.123456789012)  # a float of twelve digits, kept as written
        run.charge("tokens", 7)
    history.flush()
    with closing(sqlite3.connect(home / "nbbudget.db")) as db:
        stored = db.execute("SELECT name, limits, consumed FROM history ORDER BY id").fetchall()
    entries = {e.name: e for e in history.entries()}
    for name, limits, consumed in stored:
        assert limits == json.dumps(entries[name].limits)
        assert consumed == json.dumps(entries[name].consumed)
    assert [(name, limits) for name, limits, _ in stored] == [
        ("idle", "{}"),
        ("spent", '{"steps": 5, "tokens": 1099511627776, "cost_usd": 0.5}')]
    assert '"cost_usd": 0.123456789012' in stored[1][2]


def test_grants_are_part_of_their_run_not_runs_of_their_own(keeping, home):
    with nb.budget(steps=10, name="outer") as run, run.grant(steps=2, name="inner") as grant:
        grant.step()
    assert [e.name for e in history.entries()] == ["outer"]


def test_nothing_is_recorded_when_the_history_is_off_or_never_turned_on(monkeypatch, home):
    monkeypatch.setenv("NBBUDGET_HISTORY", "0")
    history.refresh()
    with nb.budget(steps=2) as run:
        run.step()
    monkeypatch.delenv("NBBUDGET_HISTORY")  # plain Python: kept only when asked
    history.refresh()
    assert _budget._on_end is None  # nothing is called as a run ends
    with nb.budget(steps=2) as run:
        run.step()
    assert history.writer().thread is None
    assert history.entries() == []


def test_the_writer_thread_writes_without_a_flush_and_ends_once_idle(keeping, home):
    with nb.budget(name="alone"):
        pass
    thread = history.writer().thread
    assert thread is not None and thread.name == "nbbudget-history"
    thread.join(timeout=5)
    assert not thread.is_alive() and history.writer().thread is None
    assert rows(home) == [(1, "run", "alone", "completed", None)]  # written by the thread


def test_the_bound_drops_the_oldest_runs_as_rows_are_added(keeping, home, monkeypatch):
    monkeypatch.setattr(history, "KEEP_RUNS", 5)
    for i in range(8):
        with nb.budget(name=f"run {i}"):
            pass
        history.flush()
    assert [r[2] for r in rows(home)] == [f"run {i}" for i in range(3, 8)]
    # a run older than KEEP_DAYS goes too, the next time a row is added
    with closing(sqlite3.connect(home / "nbbudget.db")) as db, db:
        db.execute("UPDATE history SET ended = ? WHERE name = 'run 3'",
                   (time.time() - (history.KEEP_DAYS + 1) * 86400,))
    with nb.budget(name="run 8"):
        pass
    history.flush()
    assert [r[2] for r in rows(home)] == [f"run {i}" for i in range(4, 9)]


def test_a_long_full_trace_is_kept_without_its_charges_and_replays_from_its_totals(
        keeping, home, monkeypatch):
    monkeypatch.setattr(history, "TRACE_EVENTS", 100)
    with nb.budget(steps=1000, name="long", trace="full") as run:
        for _ in range(500):
            run.step()
    (entry,) = history.entries()
    trace = entry.trace()
    assert trace.full is False and len(trace) < 100
    assert trace.stats()["consumed"]["steps"] == 500
    assert trace.replay(nb.Limits(steps=400)).refusals[0]["consumed_value"] == 500


def test_a_store_made_before_the_history_is_given_its_table_as_it_opens(home):
    nb.store()  # made, then its history table taken away as an earlier release made it
    nb.store().close()
    with closing(sqlite3.connect(home / "nbbudget.db")) as db, db:
        db.execute("DROP TABLE history")
    from nbbudget.calls.store import SQLiteStore

    reopened = SQLiteStore(home)
    try:
        assert history.entries(db=reopened) == []
    finally:
        reopened.close()
    assert stat.S_IMODE(os.stat(home / "nbbudget.db").st_mode) == 0o600


def test_the_command_lists_the_runs_newest_first_as_a_table_and_as_json(tmp_path):
    home = tmp_path / "cli-home"
    made = subprocess.run([sys.executable, "-c", textwrap.dedent("""\
        import nbbudget as nb
        with nb.budget(steps=3, name="first") as run:
            run.step()
        try:
            with nb.budget(steps=1, name="second") as run:
                run.step(); run.step()
        except nb.BudgetExceeded:
            pass
        """)], env={**os.environ, "NBBUDGET_HOME": str(home), "NBBUDGET_HISTORY": "1"},
        capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr  # written at exit, by no thread left behind
    listed = cli("history", "--json", env_home=home)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert [(r["id"], r["kind"], r["name"], r["status"], r["by"]) for r in data] == [
        (2, "run", "second", "failed", "steps"), (1, "run", "first", "completed", None)]
    assert data[1]["consumed"]["steps"] == 1 and data[1]["limits"] == {"steps": 3}
    assert data[1]["started"].endswith("Z")
    assert [r["name"] for r in json.loads(cli("history", "--json", "--limit", "1",
                                              env_home=home).stdout)] == ["second"]
    table = cli("history", env_home=home).stdout.splitlines()
    assert table[0].split() == ["id", "kind", "started", "status", "by", "name", "consumed"]
    assert table[1].split()[:2] == ["2", "run"] and "steps=1" in table[1]
    assert "failed" in table[1] and "steps" in table[1].split()
    bad = cli("history", "--limit", "0", env_home=home)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "1 or more" in bad.stderr
    helped = cli("history", "--help", env_home=home).stdout
    assert "1,000 runs" in helped and "30 days" in helped and "NBBUDGET_HISTORY=0" in helped
    empty = cli("history", env_home=tmp_path / "empty")
    assert empty.returncode == 0 and empty.stdout.startswith("no runs in the history of")


LONG_NAMES = """\
import nbbudget as nb
for table in ("orders", "invoices", "refunds"):
    try:
        name = f"cell: for row in rows_of_the_{table}_table: process(row)"
        with nb.budget(steps=1, name=name) as run:
            run.step(); run.step()
    except nb.BudgetExceeded:
        pass
def the_nightly_report_of_the_sales_team_for_the_region_north(): pass
def the_nightly_report_of_the_sales_team_for_the_region_south(): pass
nb.call(the_nightly_report_of_the_sales_team_for_the_region_north)
nb.call(the_nightly_report_of_the_sales_team_for_the_region_south)
"""


def test_the_table_keeps_long_names_that_share_a_prefix_telling_apart(tmp_path):
    home = tmp_path / "names"
    made = subprocess.run([sys.executable, "-c", LONG_NAMES], capture_output=True, text=True,
                          env={**os.environ, "NBBUDGET_HOME": str(home),
                               "NBBUDGET_HISTORY": "1"}, timeout=120)
    assert made.returncode == 0, made.stderr
    names = [r["name"] for r in json.loads(cli("history", "--json", env_home=home).stdout)]
    # written to a pipe, a name is whole, and its column as wide as the widest
    whole = cli("history", env_home=home).stdout.splitlines()
    assert [line for line in whole[1:] if not any(name in line for name in names)] == []
    assert len({line.index("consumed") if i == 0 else None for i, line in enumerate(whole)}) == 2
    # in a terminal of 100 columns each line fits, and each name is shortened in its middle,
    # keeping its start and where it differs from the others: its end, or what follows it
    narrow = cli("history", env_home=home, COLUMNS="100").stdout.splitlines()
    assert max(map(len, narrow)) <= 100
    shown = [line.split("  ")[-2].strip() for line in narrow[1:]]
    assert shown == ["the_nightly_re...e_region_south", "the_nightly_re...e_region_north",
                     "cell: for...he_refunds_table...", "cell: for...he_invoices_tabl...",
                     "cell: for...he_orders_table:..."]


def test_the_by_column_says_what_ended_a_run_when_no_limit_did(tmp_path):
    home = tmp_path / "causes"
    made = subprocess.run([sys.executable, "-c", textwrap.dedent("""\
        import nbbudget as nb
        try:
            with nb.budget(name="broken"):
                1 / 0
        except ZeroDivisionError:
            pass
        with nb.budget(name="fine"):
            pass
        """)], env={**os.environ, "NBBUDGET_HOME": str(home), "NBBUDGET_HISTORY": "1"},
        capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    table = [line.split() for line in cli("history", env_home=home).stdout.splitlines()]
    assert [(row[1], row[3], row[4], row[5]) for row in table[1:]] == [
        ("run", "completed", "-", "fine"), ("run", "failed", "error", "broken")]


def test_a_damaged_row_is_refused_in_one_line_and_can_be_forgotten(keeping, home):
    for name in ("good", "bad"):
        with nb.budget(name=name):
            pass
    history.flush()
    with closing(sqlite3.connect(home / "nbbudget.db")) as db, db:
        db.execute("UPDATE history SET consumed = '{not json' WHERE name = 'bad'")
    with pytest.raises(nb.ConfigError, match=r"run 2 of the history in .* cannot be read "
                                             r".*Remove it with: nbbudget history --forget 2"):
        history.entries()
    refused = cli("history", env_home=home)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "nbbudget history --forget 2" in refused.stderr
    forgot = cli("history", "--forget", "2", env_home=home)
    assert forgot.returncode == 0, forgot.stderr
    assert [e.name for e in history.entries()] == ["good"]
    # a trace that does not decompress is refused the same way when the traces are read
    with closing(sqlite3.connect(home / "nbbudget.db")) as db, db:
        db.execute("UPDATE history SET trace = x'00ff' WHERE name = 'good'")
    with nb.budget(steps=1, name="traced") as run:
        run.step()
    history.flush()
    with closing(sqlite3.connect(home / "nbbudget.db")) as db, db:
        db.execute("UPDATE history SET trace = x'00ff' WHERE name = 'traced'")
    with pytest.raises(nb.ConfigError, match=r"run 3 of the history .*its trace: .*--forget 3"):
        history.traces()


WRITER = """\
import sys
import nbbudget as nb
for i in range(int(sys.argv[1])):
    with nb.budget(steps=2, name=f"{sys.argv[2]}-{i}") as run:
        run.step()
"""


def test_many_processes_add_history_to_one_store_at_once(tmp_path):
    home = tmp_path / "shared"
    env = {**os.environ, "NBBUDGET_HOME": str(home), "NBBUDGET_HISTORY": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, "150", f"p{n}"], env=env,
                              stderr=subprocess.PIPE, text=True) for n in range(6)]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        assert err == ""  # nothing dropped, no warning
    found = rows(home)
    assert len(found) == 900
    assert sorted(r[2] for r in found) == sorted(f"p{n}-{i}" for n in range(6)
                                                 for i in range(150))
    for n in range(6):  # each process's runs in the order they ended
        mine = [int(r[2].split("-")[1]) for r in found if r[2].startswith(f"p{n}-")]
        assert mine == sorted(mine)


def test_threads_ending_runs_at_once_are_each_recorded_once(keeping, home):
    def work(n: int) -> None:
        for i in range(100):
            with nb.budget(name=f"t{n}-{i}"):
                pass

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [e.name for e in history.entries()]
    assert sorted(names) == sorted(f"t{n}-{i}" for n in range(4) for i in range(100))


# -- %budget history -------------------------------------------------------------------------
@pytest.fixture
def shell(monkeypatch):
    monkeypatch.delenv("NBBUDGET_HISTORY", raising=False)  # the extension's setting decides
    config = Config()
    config.HistoryManager.enabled = False
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "nbbudget")
    yield ip
    ip.run_line_magic("unload_ext", "nbbudget")
    ip.config.pop("NBBudget", None)


def test_budget_history_shows_the_cells_and_calls_of_the_kernel_as_a_frame(shell):
    assert shell.run_line_magic("budget", "history") is None  # nothing yet: a sentence
    shell.user_ns["nb"] = nb
    shell.run_cell_magic("budget", "--steps 5 --no-widget", "nb.current().step()\n")
    shell.run_cell_magic("budget", "--detach --budget 5s --no-widget", "x = 1\n")
    shell.user_ns["nb"] = nb
    shell.run_cell("with nb.budget(name='block'):\n    pass\n")
    frame = shell.run_line_magic("budget", "history")
    assert isinstance(frame, pd.DataFrame)
    assert list(frame["kind"]) == ["run", "cell", "cell"]
    assert list(frame["name"]) == ["block", "cell: x = 1", "cell: nb.current().step()"]
    assert list(frame["status"]) == ["completed"] * 3
    assert frame.iloc[2]["consumed.steps"] == 1
    assert list(frame.index) == sorted(frame.index, reverse=True)
    assert len(shell.run_line_magic("budget", "history --limit 1")) == 1
    with pytest.raises(UsageError, match="1 or more"):
        shell.run_line_magic("budget", "history --limit 0")


def test_the_history_setting_turns_the_kernels_history_off(shell):
    shell.run_line_magic("config", "NBBudget.history = False")
    shell.run_cell_magic("budget", "--steps 5 --no-widget", "pass\n")
    assert history.entries() == []


def test_budget_history_help_names_history_and_suggest(shell):
    text = shell.find_line_magic("budget").__doc__  # what %budget? shows
    assert "%budget history --suggest" in text
    assert "{jobs,wait,cancel,status,trace,history}" in text
    assert "(nb.suggest_limits())" in text and "--limit N" in text


def test_a_damaged_row_is_a_usage_error_in_the_magic(shell, home):
    shell.run_cell_magic("budget", "--no-widget", "pass\n")
    history.flush()
    with closing(sqlite3.connect(home / "nbbudget.db")) as db, db:
        db.execute("UPDATE history SET limits = '[]'")
    with pytest.raises(UsageError, match="nbbudget history --forget 1"):
        shell.run_line_magic("budget", "history")


# -- a real kernel ---------------------------------------------------------------------------
def test_a_kernel_keeps_its_cells_in_the_history_that_the_command_lists(tmp_path_factory):
    from test_magic_kernel import run, started_kernel

    kernel = started_kernel(tmp_path_factory)
    kc = next(kernel)
    try:
        assert run(kc, "%%budget --steps 3 --no-widget\nnb.current().step()\n").status == "ok"
        failed = run(kc, "%%budget --steps 1 --no-widget\nnb.current().step()\n"
                         "nb.current().step()\n")
        assert failed.status == "error"
        shown = run(kc, "h = %budget history\nprint(h[['kind', 'status', 'by']]"
                        ".to_json(orient='records'))")
        assert shown.status == "ok", shown.outputs
        assert json.loads(shown.stdout) == [
            {"kind": "cell", "status": "failed", "by": "steps"},
            {"kind": "cell", "status": "completed", "by": None}]
        home = run(kc, "import os; print(os.environ['NBBUDGET_HOME'])").stdout.strip()
    finally:
        next(kernel, None)
    listed = cli("history", "--json", env_home=home)
    assert [(r["kind"], r["status"]) for r in json.loads(listed.stdout)] == [
        ("cell", "failed"), ("cell", "completed")]


# -- nbbudget run ------------------------------------------------------------------------------
def test_a_notebook_run_is_one_run_of_the_history_with_its_status_and_consumption(tmp_path):
    from test_run import REPO, write_notebook

    home = tmp_path / "home-run"
    notebook = write_notebook(
        tmp_path / "steps.ipynb",
        "import nbbudget as nb\nfor _ in range(3):\n    nb.current().step()",
        "%%budget --steps 5 --no-widget\nfor _ in range(3):\n    nb.current().step()",
        "print('never')")
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGENT_CALL_BUDGET_MS", "NBBUDGET_INTERACTIVE", "NBBUDGET_HISTORY")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["NBBUDGET_HOME"] = str(home)
    done = subprocess.run([sys.executable, "-m", "nbbudget", "run", notebook.name, "--steps",
                           "4", "--budget", "60s"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr  # the run's budget stopped it
    listed = json.loads(cli("history", "--json", env_home=home).stdout)
    (run,) = [r for r in listed if r["kind"] == "notebook"]
    assert run["name"] == str(notebook) and run["status"] == "failed"
    assert run["cause"] == "StepBudgetExceeded" and run["by"] == "steps"
    assert run["limits"] == {"steps": 4} and run["consumed"]["steps"] == 4
    assert [r["kind"] for r in listed] == ["notebook"]  # its cell's grant is part of it
    table = cli("history", env_home=home).stdout.splitlines()
    assert table[1].split()[1:5] == ["notebook", run["started"], "failed", "steps"]


def test_a_notebook_run_recorded_without_its_by_reads_it_from_its_cause(keeping, home):
    with nb.budget(name="a block"):
        pass
    history.flush()
    with closing(sqlite3.connect(home / "nbbudget.db")) as db, db:  # as an earlier release
        for path, status, cause in (("cut.ipynb", "failed", "StepBudgetExceeded"),
                                    ("slow.ipynb", "failed", "RunTimeBudgetExceeded"),
                                    ("late.ipynb", "cancelled", "cancelled"),
                                    ("bug.ipynb", "failed", "cell_error")):
            db.execute("INSERT INTO history (kind, name, started, ended, status, cause, by, "
                       "limits, consumed) VALUES ('notebook', ?, 0, ?, ?, ?, NULL, '{}', '{}')",
                       (path, time.time(), status, cause))
    assert [(e.name, e.by) for e in history.entries()] == [
        ("bug.ipynb", None), ("late.ipynb", "wall-clock"), ("slow.ipynb", "timeout"),
        ("cut.ipynb", "steps"), ("a block", None)]


def test_a_store_that_cannot_take_the_history_leaves_the_runs_out_and_they_go_on(
        keeping, home, tmp_path, monkeypatch):
    nb.store()
    damaged = tmp_path / "damaged"
    damaged.mkdir(mode=0o700)
    (damaged / "nbbudget.db").write_bytes(b"this is not a database" * 100)
    monkeypatch.setenv("NBBUDGET_HOME", str(damaged))
    before = history.writer().dropped
    with nb.budget(steps=2, name="goes on") as run:
        run.step()
    assert run.outcome is not None and run.outcome.ok
    assert history.flush() == 0 and history.writer().dropped == before + 1
    monkeypatch.setenv("NBBUDGET_HOME", str(home))
    assert history.entries() == []  # written nowhere else
    refused = cli("history", env_home=damaged)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "is damaged" in refused.stderr and "Traceback" not in refused.stderr


def test_suggest_limits_reads_the_stores_traces_when_given_none(keeping, home):
    made = []
    for steps in (2, 3, 4):
        with nb.budget(steps=10, name=f"used {steps}") as run:
            for _ in range(steps):
                run.step()
        made.append(run.trace)
    with pytest.raises(nb.BudgetExceeded), nb.budget(steps=1, name="cut") as run:
        run.step()
        run.step()
    made.append(run.trace)
    from_history = nb.suggest_limits()
    # nearest rank: the 3rd smallest of the 3 finished runs (4 steps), plus 20 %, rounded up
    assert from_history.limits.steps == 5
    assert (from_history.runs, from_history.finished) == (4, 3)
    assert from_history.limits == nb.suggest_limits(made).limits
    assert nb.suggest_limits(margin=0.5, quantile=0.5).limits.steps == 5  # 3 steps * 1.5


def test_budget_history_suggest_shows_the_suggestion_from_the_history(shell):
    shell.user_ns["nb"] = nb
    for _ in range(2):
        shell.run_cell_magic("budget", "--steps 5 --no-widget",
                             "nb.current().step()\nnb.current().step()\n")
    shown = shell.run_line_magic("budget", "history --suggest")
    assert isinstance(shown, nb.Suggestion)
    assert shown.limits.steps == 3 and shown.runs == 2  # 2 steps, plus 20 %, rounded up


def test_an_empty_history_suggests_nothing_and_says_so(shell):
    with pytest.raises(nb.ConfigError):
        nb.suggest_limits()
    with pytest.raises(UsageError):
        shell.run_line_magic("budget", "history --suggest")
