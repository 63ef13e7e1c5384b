"""Many processes on one store at once, as kernels started together, ``nbbudget run`` runners
and harnesses share ``NBBUDGET_HOME``: each a fresh interpreter that waits until every other is
ready, then makes its calls through the public API at the same instant (S0-2, S0-11, S4-12).
Every call is answered, every checkpoint and job record is kept, and the quota of runs per day
is counted exactly, whether the store is new, made by an earlier release (its checkpoints'
payload not yet the last column) or in use.

The normal run starts each scenario once, 8 processes at a time; ``pytest --stress`` starts them
until 2,000 processes have run (12 minutes on 2 busy cores).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from stores import execute

import nbbudget as nb
from nbbudget.calls.call import _identity
from nbbudget.calls.store import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
PROCESSES = 8  # at once, in each round
STRESS_STARTS = 2000

#: one process: argv is its role (``checkpoint``: one resumable call; ``mixed``: a quota call,
#: a resumable call and a detached job, in an order that turns with its index), its index and
#: the quota of runs per day. It prints ``ready``, waits for a line on stdin, then makes its
#: calls and prints what each answered, as JSON.
CHILD = textwrap.dedent("""
    import json, sys, time
    import nbbudget as nb

    role, index, quota = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def checkpointed():
        step = nb.resume_state({"proc": index, "step": 0})["step"] + 1
        time.sleep(0.02)  # past the budget: the call pauses at this checkpoint
        nb.checkpoint({"proc": index, "step": step})
        return "finished"

    def slept():
        time.sleep(0.2)  # past the budget: the work goes on as a job
        return "slept"

    CALLS = {
        "checkpoint": lambda: nb.call(checkpointed, resume=True, key=f"ckpt-{index}",
                                      budget="10ms"),
        "job": lambda: nb.call(slept, detach=True, key=f"job-{index}", budget="10ms"),
        "quota": lambda: nb.call(lambda: "ran", detach=True, key="quota", budget="60s",
                                 runs_per_day=quota),
    }

    def answered(kind):
        try:
            resp = CALLS[kind]()
            answer = {"kind": kind, "exit_code": resp.exit_code, "data": resp.data,
                      "error": resp.error}
            if kind == "job" and resp.exit_code == 14:
                answer["value"] = nb.jobs[resp.data["job"]].result(timeout=60)
            return answer
        except BaseException as exc:
            return {"kind": kind, "raised": f"{type(exc).__module__}.{type(exc).__name__}: {exc}"}

    kinds = ["checkpoint"] if role == "checkpoint" else ["quota", "checkpoint", "job"]
    kinds = kinds[index % len(kinds):] + kinds[:index % len(kinds)]
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps([answered(kind) for kind in kinds]), flush=True)
""")


def at_once(home: Path, role: str, quota: int = 1) -> list[Any]:
    """What each of `PROCESSES` processes answered, started together on the store *home*: each
    one's list of answers, or a line saying how it failed."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_CALL_BUDGET_MS",)}
    env.update(NBBUDGET_HOME=str(home), NBBUDGET_INTERACTIVE="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, role, str(i), str(quota)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(PROCESSES)]
    try:
        ready = [proc.stdout.readline() == "ready\n" for proc in procs]
        for proc in procs:  # all at the same instant
            proc.stdin.write("go\n")
            proc.stdin.flush()
        answers: list[Any] = []
        for proc, was_ready in zip(procs, ready, strict=True):
            out, err = proc.communicate(timeout=120)
            if not was_ready or proc.returncode != 0 or not out.strip():
                answers.append(f"process {proc.pid} exited {proc.returncode}: {err[-400:]}")
            else:
                answers.append(json.loads(out))
        return answers
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def checkpoints_kept(home: Path, step: int) -> list[str]:
    """What is wrong with the checkpoint of each process (*step* of it saved), opened and
    verified as the next call would; and with the database as a whole."""
    problems = []
    store = SQLiteStore(home)
    try:
        for i in range(PROCESSES):
            try:
                saved = store.load_checkpoint(_identity(None, (), {}, f"ckpt-{i}"))
            except nb.CheckpointRefused as exc:
                problems.append(f"checkpoint of process {i}: {exc}")
                continue
            if saved is None or saved.state != {"proc": i, "step": step}:
                problems.append(f"checkpoint of process {i}: {saved and saved.state}")
    finally:
        store.close()
    with closing(sqlite3.connect(home / "nbbudget.db")) as db:
        for pragma, expected in (("integrity_check", "ok"), ("journal_mode", "wal")):
            found = db.execute(f"PRAGMA {pragma}").fetchone()[0]
            if found != expected:
                problems.append(f"PRAGMA {pragma}: {found}")
    return problems


def unanswered(answers: list[Any], expected: dict[str, Callable[[dict[str, Any]], bool]]
               ) -> list[str]:
    """The processes that failed, and the calls not answered as *expected* (by kind)."""
    problems = []
    for i, answer in enumerate(answers):
        if isinstance(answer, str):
            problems.append(answer)
            continue
        problems += [f"process {i}: {call}" for call in answer if not expected[call["kind"]](call)]
    return problems


def paused(call: dict[str, Any]) -> bool:
    return call.get("exit_code") == 14 and (call.get("data") or {}).get("state") == "paused"


def fresh_store(home: Path) -> list[str]:
    """Processes open a store no one has made yet, each making a resumable call that pauses
    at its checkpoint."""
    problems = unanswered(at_once(home, "checkpoint"), {"checkpoint": paused})
    return problems + checkpoints_kept(home, step=1)


def old_layout(home: Path) -> list[str]:
    """Processes open a store made by an earlier release, with a checkpoint of each one's work
    whose payload is not the last column; the first to open it makes the table again, and each
    call resumes its own checkpoint."""
    with nb.budget() as run:
        ledger = run.state()  # a run's state, as a paused call's checkpoint keeps it
    store = SQLiteStore(home)
    for i in range(PROCESSES):  # each process's work, paused at its first checkpoint
        store.save_checkpoint(_identity(None, (), {}, f"ckpt-{i}"), {"proc": i, "step": 1},
                              ledger=ledger, first_start=time.time(), label=f"ckpt-{i}")
    store.close()
    path = home / "nbbudget.db"
    execute(path, "ALTER TABLE checkpoints RENAME TO later")  # as the earlier release made it
    execute(path, "CREATE TABLE checkpoints (identity TEXT PRIMARY KEY, format TEXT NOT NULL, "
                  "header TEXT NOT NULL, payload BLOB NOT NULL, tag BLOB NOT NULL)")
    execute(path, "INSERT INTO checkpoints SELECT identity, format, header, payload, tag "
                  "FROM later")
    execute(path, "DROP TABLE later")
    problems = unanswered(at_once(home, "checkpoint"), {"checkpoint": paused})
    with closing(sqlite3.connect(path)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(checkpoints)")]
    if columns[-1] != "payload":
        problems.append(f"the checkpoints' columns are still {columns}")
    return problems + checkpoints_kept(home, step=2)


def jobs_checkpoints_and_quota(home: Path) -> list[str]:
    """Processes each count a start against one quota of runs per day (half of them are over
    it), save a checkpoint, and run a job detached: every write at once."""
    quota = PROCESSES // 2
    answers = at_once(home, "mixed", quota)
    problems = unanswered(answers, {
        "checkpoint": paused,
        "job": lambda call: (call.get("exit_code"), call.get("value")) == (14, "slept") or (
            (call.get("exit_code"), call.get("data")) == (0, "slept")),  # (its caller was late)
        "quota": lambda call: (call.get("exit_code"), call.get("data")) == (0, "ran") or (
            call.get("exit_code") == 1
            and (call.get("error") or {}).get("code") == "RunsPerDayExceeded"),
    })
    calls = [call for answer in answers if not isinstance(answer, str) for call in answer]
    started = sum(call["kind"] == "quota" and call.get("exit_code") == 0 for call in calls)
    job_ids = {call["data"]["job"] for call in calls  # the jobs that went on detached
               if call["kind"] == "job" and call.get("exit_code") == 14}
    with closing(sqlite3.connect(home / "nbbudget.db")) as db:
        counted = db.execute("SELECT day, count FROM runs WHERE identity = ?",
                             (_identity(None, (), {}, "quota"),)).fetchall()
        recorded = dict(db.execute("SELECT id, state FROM jobs").fetchall())
    days = len(counted)  # two only if the round ran across midnight (UTC)
    if sum(n for _, n in counted) != started or any(n > quota for _, n in counted) or (
            started != min(PROCESSES, quota * max(days, 1))):
        problems.append(f"{started} starts answered for a quota of {quota}; counted {counted}")
    lost = {job: recorded.get(job) for job in job_ids if recorded.get(job) != "done"}
    if lost:
        problems.append(f"the records of jobs that went on detached, not done: {lost}")
    return problems + checkpoints_kept(home, step=1)


SCENARIOS = {"fresh store": fresh_store, "old layout": old_layout,
             "jobs, checkpoints, quota": jobs_checkpoints_and_quota}


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_processes_started_at_once_on_one_store_are_all_answered_and_nothing_is_lost(
        tmp_path, scenario):
    assert scenario(tmp_path / "home") == []


@pytest.mark.stress
def test_2000_process_starts_at_once_eight_by_eight_are_all_answered_and_nothing_is_lost(
        tmp_path):
    rounds = math.ceil(STRESS_STARTS / (PROCESSES * len(SCENARIOS)))
    problems: list[str] = []
    started = time.monotonic()
    for n in range(rounds):
        for name, scenario in SCENARIOS.items():
            problems += [f"round {n}, {name}: {problem}"
                         for problem in scenario(tmp_path / f"home-{n}-{name[:3]}")]
    took = time.monotonic() - started
    print(f"\n{rounds * len(SCENARIOS) * PROCESSES} process starts ({rounds} rounds of "
          f"{len(SCENARIOS)} scenarios, {PROCESSES} processes at once) in {took:.0f} s: "
          f"{len(problems)} failures")
    assert problems == []
