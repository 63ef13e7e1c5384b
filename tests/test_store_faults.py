"""The store under faults: killed writers, a locked database (S0-1, S0-2, S4-5).

A checkpoint is saved durably (S0-2): a process killed at any moment leaves a store that opens,
whose checkpoint is the last one committed, and from which the identical call continues
exactly where the work was, neither repeating nor skipping a step.
"""

from __future__ import annotations

import os
import random
import select
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time

import pytest

import nbbudget as nb
from nbbudget.calls.call import _identity
from nbbudget.calls.store import SQLiteStore

pytestmark = pytest.mark.slow

KILLS = 100
SEED = 20240607

#: the work of the killed process: each printed number is a checkpoint already committed
CHILD = textwrap.dedent("""
    import nbbudget as nb

    def work():
        i = nb.resume_state(0)
        while True:
            i += 1
            nb.checkpoint(i)
            print(i, flush=True)

    nb.call(work, resume=True, budget=0, key="faults")
""")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _assert_private(home) -> None:
    """The folder is the owner's alone, and so is every file in it."""
    assert _mode(home) == 0o700
    names = sorted(os.listdir(home))
    assert {"nbbudget.db", "secret"} <= set(names), names
    for name in names:
        assert _mode(home / name) == 0o600, f"{name} is {oct(_mode(home / name))}"


def _first_line(proc: subprocess.Popen[str], errors) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        proc.wait()
        pytest.fail(f"the child printed nothing; its stderr:\n{errors.read_text()}")
    return line


def test_S0_2_a_checkpoint_survives_100_kills_at_random_moments(tmp_path):
    home = tmp_path / "home"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    errors = tmp_path / "stderr.txt"
    env = {**os.environ, "NBBUDGET_HOME": str(home), "NBBUDGET_INTERACTIVE": "0"}
    env.pop("AGENT_CALL_BUDGET_MS", None)
    identity = _identity(None, (), {}, "faults")  # with a key, the function does not matter
    rng = random.Random(SEED)

    expected_first = 1
    secret = None
    one_more = 0  # kills that came after a commit and before its print
    started = time.monotonic()
    for cycle in range(KILLS):
        with errors.open("w") as err:
            proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                    stderr=err, env=env, text=True)
        first = _first_line(proc, errors)
        time.sleep(rng.uniform(0.05, 0.4))
        proc.kill()
        rest = proc.stdout.read()
        proc.stdout.close()
        assert proc.wait() == -signal.SIGKILL, errors.read_text()

        lines = (first + rest).split("\n")
        complete = [int(n) for n in lines[:-1]]  # the last piece has no newline: not counted
        context = f"kill {cycle + 1}: printed {complete[0]}..{complete[-1]}"
        assert complete == list(range(expected_first, complete[-1] + 1)), context
        last = complete[-1]

        _assert_private(home)  # as the killed process left it
        if secret is None:
            secret = (home / "secret").read_bytes()
        assert (home / "secret").read_bytes() == secret, context

        db = SQLiteStore(home)  # it always opens
        try:
            saved = db.load_checkpoint(identity)  # and verifies (S4-5)
        finally:
            db.close()
        assert saved is not None, context
        assert last <= saved.state <= last + 1, f"{context}, saved {saved.state}"
        one_more += saved.state == last + 1
        with sqlite3.connect(home / "nbbudget.db") as check:
            assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",), context
            assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",), context
        check.close()
        _assert_private(home)
        expected_first = saved.state + 1  # the next run continues from exactly there

    took = time.monotonic() - started
    print(f"\n{KILLS} kills in {took:.1f} s ({took / KILLS * 1000:.0f} ms per cycle); "
          f"{one_more} of them after a commit and before its print; "
          f"the last checkpoint was {expected_first - 1}")


def test_S0_1_a_locked_store_does_not_hold_a_detach_call_past_its_budget(tmp_path, monkeypatch):
    """Another process of the same user holds the store's write lock (a kernel sharing
    ``NBBUDGET_HOME`` in the middle of a write, a slow network disk). The caller must still get
    its INCOMPLETE within the budget; the job record is written once the lock is free."""
    monkeypatch.setenv("NBBUDGET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "0")
    path = nb.store().path
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sqlite3, time
        db = sqlite3.connect({str(path)!r}, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        print("locked", flush=True)
        time.sleep(2)
        db.execute("COMMIT")
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"

        def one_second() -> str:
            run = nb.current()
            for _ in range(10):
                time.sleep(0.1)
                run.step()
            return "done"

        started = time.monotonic()
        resp = nb.call(one_second, detach=True, budget="300ms", key="locked-store")
        took = time.monotonic() - started
        print(f"\ndetach with the store locked by another process: returned after "
              f"{took * 1000:.0f} ms (budget 300 ms)")
        assert resp.exit_code == 14
        assert nb.jobs[resp.data["job"]].result(timeout=10) == "done"
        assert nb.call(one_second, detach=True, budget="300ms", key="locked-store").ok
        assert took < 0.3 + 0.1
    finally:
        holder.stdout.close()
        holder.wait(timeout=10)
    job_id = resp.data["job"]
    deadline = time.monotonic() + 5
    while _recorded_state(job_id) != "done":
        assert time.monotonic() < deadline, f"job record: {_recorded_state(job_id)!r}"
        time.sleep(0.02)


def _recorded_state(job_id: str) -> str | None:
    states = [r["state"] for r in nb.store().jobs() if r["id"] == job_id]
    return states[0] if states else None


#: the killed process of the next test: it dies just before, or just after, the store's secret
#: is linked into place (the unluckiest moments of a store's first use)
DIES_CREATING_THE_SECRET = textwrap.dedent("""
    import os, signal, sys
    real_link = os.link
    when = sys.argv[1]

    def link_then_die(src, dst, *args, **kwargs):
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        real_link(src, dst, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    os.link = link_then_die
    import nbbudget as nb
    nb.call(lambda: None, resume=True, budget=0, key="faults")
""")


@pytest.mark.parametrize("when", ["before", "after"])
def test_S0_2_a_process_killed_while_creating_the_store_leaves_a_store_that_opens(tmp_path, when):
    """The secret is written whole to a temporary file and linked into place: a kill before the
    link leaves no secret (the next process makes one), a kill after it leaves a whole one. It is
    made once the database holds the store's tables, so that a secret beside a database without
    them means a store that lost what it held (`StoreDamaged`): neither kill leaves that."""
    home = tmp_path / "home"
    env = {**os.environ, "NBBUDGET_HOME": str(home), "NBBUDGET_INTERACTIVE": "0"}
    child = subprocess.run([sys.executable, "-c", DIES_CREATING_THE_SECRET, when], env=env,
                           capture_output=True, text=True, timeout=30)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert (home / "secret").exists() == (when == "after")
    if when == "after":
        assert len((home / "secret").read_bytes()) == 64
    with sqlite3.connect(home / "nbbudget.db") as check:
        tables = {name for (name,) in check.execute("SELECT name FROM sqlite_master")}
    check.close()
    assert "checkpoints" in tables  # made before the secret

    db = SQLiteStore(home)  # it always opens
    try:
        assert db.load_checkpoint(_identity(None, (), {}, "faults")) is None
    finally:
        db.close()
    _assert_private(home)
