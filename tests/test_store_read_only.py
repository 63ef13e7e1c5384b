"""A store this user cannot write (a folder made read-only, a read-only file system): what it
holds is read as it is, and nothing in it is made, changed or narrowed; each write is refused
with ``store_read_only``, naming the folder and the fix; the commands that read (``nbbudget
history``, ``nbbudget jobs``, ``%budget jobs``) show what is there, and a kernel's own jobs are
listed with it. Root writes into read-only folders, so as root a folder is made immutable
instead (Linux's ``chattr +i``), or the test is skipped where it cannot be."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.calls import history
from nbbudget.calls.store import SQLiteStore

pytestmark = pytest.mark.usefixtures("quick_idle_workers")

IDENTITY = "fn:" + "cd34" * 16
LEDGER = {"version": "nbbudget-ledger-v1", "counts": {"steps": 3}}


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """*folder* made read-only for this user while the block runs: ``chmod 500``, or for root,
    who writes into any folder, the immutable attribute (skipped where it cannot be set)."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o500)
        try:
            yield
        finally:
            os.chmod(folder, 0o700)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)],
                                        capture_output=True).returncode != 0:
        pytest.skip("root writes into read-only folders, and this system cannot make a folder "
                    "immutable")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(folder)], check=True)


#: ipykernel 7 or newer: what a job's thread writes after its cell reaches a cell
_IPYKERNEL_7 = int(version("ipykernel").split(".")[0]) >= 7


def refusal(folder: Path) -> str:
    return (f"the nbbudget store {str(folder)!r} is read-only: this user cannot write to it, so "
            f"nothing was written. Make the folder writable (chmod u+w "
            f"{shlex.quote(str(folder))}), or set NBBUDGET_HOME to a writable folder")


MADE = """\
import json
import time
import nbbudget as nb
from nbbudget.calls import history
from nbbudget.calls.run_store import Runs
store = nb.store()
store.save_checkpoint({identity!r}, {{"rows": 7}}, ledger={ledger!r}, first_start=1.0,
                      label="etl")
store.record_job("9-1", "job:etl", "etl", "done", created=time.time() - 5)
store.record_job("9-2", "job:train", "train", "running", created=time.time() - 3)
with store.transaction() as db:  # the job of a process that died: running, its pid gone
    db.execute("UPDATE jobs SET pid = 999999999 WHERE id = '9-2'")
with nb.budget(steps=4, name="a block") as run:
    run.step()
Runs(store)  # the table of nbbudget run, and a run whose runner never started, long ago
with store.transaction() as db:
    spec = json.dumps({{"notebook": "x.ipynb", "output": "out.ipynb", "mode": "detach"}})
    db.execute("INSERT INTO notebook_runs (id, identity, spec, state, created, updated) "
               "VALUES ('run-1', 'nb:x', ?, 'starting', ?, ?)",
               (spec, time.time() - 600, time.time() - 600))
history.flush()
"""


def made_store(folder: Path) -> None:
    """A store in *folder* with a checkpoint, two job records, a run in its history and a
    notebook run, made by a process that has ended (its connections are closed)."""
    code = MADE.format(identity=IDENTITY, ledger=LEDGER)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NBBUDGET_HOME": str(folder),
                                            "NBBUDGET_HISTORY": "1"})
    assert done.returncode == 0, done.stderr


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file of *folder* with its mode and size, and the folder's own mode."""
    found = {p.name: (stat.S_IMODE(p.stat().st_mode), p.stat().st_size)
             for p in folder.iterdir()}
    return {".": (stat.S_IMODE(folder.stat().st_mode), 0), **found}


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbbudget", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "NBBUDGET_HOME": str(home)})


def stream(cell: Any, name: str) -> str:
    """What a kernel's cell wrote to its standard output or error (*name*)."""
    return "".join(o["content"]["text"] for o in cell.outputs
                   if o["msg_type"] == "stream" and o["content"]["name"] == name)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "store"
    made_store(made)
    return made


def test_a_read_only_store_is_read_as_it_is_and_each_write_says_it_is_read_only(folder):
    with read_only(folder):
        before = listing(folder)
        store = SQLiteStore(folder)
        try:
            assert store.read_only
            loaded = store.load_checkpoint(IDENTITY)
            assert loaded is not None and loaded.state == {"rows": 7}
            jobs = {rec["id"]: rec["state"] for rec in store.jobs()}
            assert jobs == {"9-1": "done", "9-2": "lost"}  # its process died: shown lost
            assert [e.name for e in history.entries(db=store)] == ["a block"]
            writes = {
                "save": lambda: store.save_checkpoint(IDENTITY, 8, ledger=LEDGER,
                                                      first_start=1.0, label="etl"),
                "delete": lambda: store.delete_checkpoint(IDENTITY),
                "record": lambda: store.record_job("9-3", "job:x", "x", "running"),
                "quota": lambda: store.take_run("job:x", "2026-12-07", 3),
                "forget": lambda: history.forget(1, store),
            }
            for write in writes.values():
                with pytest.raises(nb.StoreReadOnly) as info:
                    write()
                assert str(info.value) == refusal(folder)
                assert info.value.code == "store_read_only" and info.value.path == folder
                assert isinstance(info.value, nb.ConfigError)
        finally:
            store.close()
        assert listing(folder) == before  # nothing made, written or narrowed
    with closing_store(folder) as writable:  # and all of it is still there
        assert {rec["id"]: rec["state"] for rec in writable.jobs()} == {"9-1": "done",
                                                                        "9-2": "lost"}


@contextlib.contextmanager
def closing_store(folder: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(folder)
    try:
        yield store
    finally:
        store.close()


def test_a_read_only_store_made_before_a_table_existed_reads_it_as_empty(folder):
    with contextlib.closing(sqlite3.connect(folder / "nbbudget.db")) as db, db:
        db.execute("DROP TABLE history")  # as a release before the history made the store
    with read_only(folder), closing_store(folder) as store:
        assert store.read_only and history.entries(db=store) == []
    with contextlib.closing(sqlite3.connect(folder / "nbbudget.db")) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert "history" not in tables  # left as it was


def test_a_read_only_store_takes_writes_again_once_its_folder_is_writable(folder):
    with read_only(folder):
        store = SQLiteStore(folder)
        with pytest.raises(nb.StoreReadOnly):
            store.save_checkpoint(IDENTITY, 8, ledger=LEDGER, first_start=1.0, label="etl")
    try:  # the same store object, as a kernel holds it: the fix works without a restart
        saved = store.save_checkpoint(IDENTITY, 8, ledger=LEDGER, first_start=1.0, label="etl")
        assert not store.read_only and saved.seq == 2
        loaded = store.load_checkpoint(IDENTITY)
        assert loaded is not None and loaded.state == 8
    finally:
        store.close()


def test_a_read_only_folder_with_no_store_says_none_can_be_made_there(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    with read_only(empty), pytest.raises(nb.ConfigError) as info:
        SQLiteStore(empty)
    assert str(info.value) == (
        f"cannot create the nbbudget store in {str(empty)!r}: the folder is read-only and holds "
        f"none. Make it writable (chmod u+w {shlex.quote(str(empty))}), or set NBBUDGET_HOME "
        f"to a writable folder")
    assert list(empty.iterdir()) == []


def test_the_commands_read_a_read_only_store_and_a_write_says_it_is_read_only(folder):
    with read_only(folder):
        before = listing(folder)
        runs = cli("history", "--json", home=folder)
        assert runs.returncode == 0, runs.stderr
        assert [r["name"] for r in json.loads(runs.stdout)] == ["a block"]
        jobs = cli("jobs", "--json", home=folder)
        assert jobs.returncode == 0, jobs.stderr
        assert [(r["id"], r["state"]) for r in json.loads(jobs.stdout)] == [("run-1", "lost")]
        forget = cli("history", "--forget", "1", home=folder)
        assert (forget.returncode, forget.stdout) == (2, "")
        assert forget.stderr == f"nbbudget history: {refusal(folder)}\n"
        assert listing(folder) == before
    again = cli("history", "--json", home=folder)  # nothing was removed
    assert [r["name"] for r in json.loads(again.stdout)] == ["a block"]


def test_a_kernel_on_a_read_only_store_lists_its_own_jobs_with_the_stores(
        folder, tmp_path_factory):
    from test_magic_kernel import run, started_kernel

    with read_only(folder):
        before = listing(folder)
        kernel = started_kernel(tmp_path_factory, NBBUDGET_HOME=str(folder))
        kc = next(kernel)
        try:
            started = run(kc, "%%budget --detach --budget 200ms --no-widget\n"
                              "import time\ntime.sleep(4)\n'trained'\n")
            assert started.envelope is not None and started.envelope["data"]["state"] == "running"
            job = started.envelope["data"]["job"]
            shown = run(kc, "table = %budget jobs\nprint(repr(table))")
            assert shown.status == "ok", shown.outputs
            rows = {line.split()[0]: line for line in stream(shown, "stdout").splitlines()[1:]}
            assert set(rows) == {job, "9-1", "9-2"}
            assert rows[job].endswith(" this") and " running " in rows[job]
            assert " done " in rows["9-1"] and " lost " in rows["9-2"]
            done = run(kc, f"nb.jobs[{job!r}].result(timeout=20)")
            assert done.status == "ok", done.outputs
            # where a write was needed, the kernel said why it could not be made
            warned = "".join(stream(cell, "stderr") for cell in (started, shown, done))
            if _IPYKERNEL_7:  # on 6.29 a job thread's warning reaches no cell (see the docs'
                assert f"nbbudget could not record job {job}" in warned  # ipykernel table)
                assert refusal(folder) in warned
        finally:
            next(kernel, None)
        assert listing(folder) == before


def test_budget_jobs_lists_the_kernels_own_jobs_when_the_store_cannot_be_read(
        tmp_path, monkeypatch):
    from nbbudget.calls.jobs_frame import jobs_table

    monkeypatch.setenv("NBBUDGET_HOME", str(tmp_path / "store"))
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "0")
    started = nb.call(time.sleep, 0.5, detach=True, budget="50ms")
    job = nb.jobs[started.data["job"]]
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    with read_only(empty):
        monkeypatch.setenv("NBBUDGET_HOME", str(empty))  # no store there, and none can be made
        table = jobs_table(nb.jobs)
    assert job.wait_done(20) and job.result() is None
    lines = repr(table).splitlines()
    assert lines[0].split()[:3] == ["id", "label", "state"]
    assert job.id in [line.split()[0] for line in lines[1:-1]]  # with any other test's jobs
    assert lines[-1] == (f"(the store's jobs are not listed: cannot create the nbbudget store in "
                         f"{str(empty)!r}: the folder is read-only and holds none. Make it "
                         f"writable (chmod u+w {shlex.quote(str(empty))}), or set "
                         f"NBBUDGET_HOME to a writable folder)")
    assert lines[-1] in table._repr_html_().replace("&#x27;", "'")
