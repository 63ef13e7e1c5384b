"""The store under ``NBBUDGET_HOME``: files and folders for their owner only, signed checkpoints
refused unchanged when they fail a check or are put back from earlier (S4-5), a store that lost
what it held answered with ``store_damaged`` and never resumed from nothing, several threads and
kernels at once, lost jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from IPython.core.interactiveshell import InteractiveShell
from stores import execute, rows
from traitlets.config import Config

import nbbudget as nb
from nbbudget.calls import history
from nbbudget.calls import store as store_module
from nbbudget.calls.call import _identity
from nbbudget.calls.store import CHECKPOINT_FORMAT, SQLiteStore, home
from nbbudget.testing import FakeClock

SOON = 5.0
IDENTITY = "fn:" + "ab12" * 16
LEDGER = {"version": "nbbudget-ledger-v1", "counts": {"steps": 3}}


pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")


@pytest.fixture
def folder(home):
    return home


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- files -----------------------------------------------------------------------------------------
def test_the_folder_is_0700_and_its_files_0600(folder):
    old = os.umask(0)  # whatever the umask, the owner alone may read the store
    try:
        s = SQLiteStore(folder)
        s.save_checkpoint(IDENTITY, "state", ledger=LEDGER, first_start=0.0, label="crunch")
        s.record_job("job-1", IDENTITY, "crunch", "running")
    finally:
        os.umask(old)
    assert mode(folder) == 0o700
    assert mode(folder / "nbbudget.db") == 0o600
    assert mode(folder / "secret") == 0o600
    for extra in ("nbbudget.db-wal", "nbbudget.db-shm"):
        if (folder / extra).exists():
            assert mode(folder / extra) == 0o600
    assert {p.name for p in folder.iterdir()} <= {"nbbudget.db", "nbbudget.db-wal",
                                                  "nbbudget.db-shm", "secret"}
    s.close()


def test_an_existing_folder_open_to_others_is_closed_to_them(folder):
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    SQLiteStore(folder).close()
    assert mode(folder) == 0o700


STORE_FILES = ("nbbudget.db", "nbbudget.db-wal", "nbbudget.db-shm", "secret")


def test_existing_files_open_to_others_are_closed_to_them_and_sqlite_remakes_its_own_0600(folder):
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, "state", ledger=LEDGER, first_start=0.0, label="crunch")
    holder = sqlite3.connect(s.path)  # another reader: the -wal and -shm files stay in place
    assert holder.execute("SELECT count(*) FROM checkpoints").fetchone() == (1,)
    s.close()
    old = os.umask(0)
    try:
        for name in STORE_FILES:  # as an older release, or a copy, left them
            os.chmod(folder / name, 0o644)
        SQLiteStore(folder).close()
        assert {name: mode(folder / name) for name in STORE_FILES} == dict.fromkeys(
            STORE_FILES, 0o600)
        holder.close()  # the last connection: SQLite removes its -wal and -shm files
        assert not (folder / "nbbudget.db-wal").exists()
        s = SQLiteStore(folder)
        s.save_checkpoint(IDENTITY, "again", ledger=LEDGER, first_start=0.0, label="crunch")
        assert (folder / "nbbudget.db-wal").exists()  # made again by SQLite, with the db's mode
        assert {name: mode(folder / name) for name in STORE_FILES} == dict.fromkeys(
            STORE_FILES, 0o600)
    finally:
        os.umask(old)
        s.close()


NESTED_HOME = textwrap.dedent("""
    import os
    os.umask(0)  # whatever the umask, every folder made for the store is its owner's alone
    import nbbudget as nb

    def crunch():
        nb.checkpoint("saved")
        return "finished"

    assert nb.call(crunch, resume=True, budget="30s", key="nested").ok
""")


def test_every_folder_made_for_a_nested_NBBUDGET_HOME_is_0700_whatever_the_umask(
        tmp_path, monkeypatch):
    nested = tmp_path / "a" / "b" / "home"
    monkeypatch.setenv("NBBUDGET_HOME", str(nested))
    os.chmod(tmp_path, 0o755)
    subprocess.run([sys.executable, "-c", NESTED_HOME], check=True, timeout=60,
                   env=dict(os.environ))
    made = [tmp_path / "a", tmp_path / "a" / "b", nested]
    assert {str(p): mode(p) for p in made} == dict.fromkeys(map(str, made), 0o700)
    assert mode(tmp_path) == 0o755  # a folder that was already there is not the store's
    assert {p.name: mode(p) for p in nested.iterdir()} == dict.fromkeys(
        [p.name for p in nested.iterdir()], 0o600)


def test_NBBUDGET_HOME_is_read_at_each_call(tmp_path, monkeypatch):
    def crunch() -> str:
        assert clock.waiting.wait(SOON)
        clock.advance("2s")  # past the budget before the first checkpoint
        nb.checkpoint("saved")
        return "finished"

    identity = _identity(crunch, (), {}, None)
    for name in ("first", "second"):
        monkeypatch.setenv("NBBUDGET_HOME", str(tmp_path / name))
        clock = FakeClock()
        resp = nb.call(crunch, resume=True, budget="1s", clock=clock)
        assert resp.data["state"] == "paused"
        assert nb.store().folder == (tmp_path / name).resolve()
    for name in ("first", "second"):  # each call wrote to its own folder, from scratch
        assert [r[0] for r in rows(tmp_path / name / "nbbudget.db")] == [identity]
        assert json.loads(rows(tmp_path / name / "nbbudget.db")[0][2])["seq"] == 1


def test_the_default_home_is_nbbudget_in_the_jupyter_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("NBBUDGET_HOME")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    assert home() == tmp_path / "jupyter-data" / "nbbudget"
    assert nb.store().folder == (tmp_path / "jupyter-data" / "nbbudget").resolve()
    assert (tmp_path / "jupyter-data" / "nbbudget" / "nbbudget.db").exists()


def test_a_store_that_cannot_be_made_is_a_config_error_naming_the_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(nb.ConfigError, match="set NBBUDGET_HOME to a writable folder") as info:
        SQLiteStore(blocker / "store")
    assert str(blocker / "store") in str(info.value)


def test_stores_opened_at_once_on_a_new_folder_share_one_secret(folder):
    opened: list[SQLiteStore] = []
    start = threading.Barrier(8)

    def open_store() -> None:
        start.wait()
        opened.append(SQLiteStore(folder))

    threads = [threading.Thread(target=open_store) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 8
    first = opened[0]
    first.save_checkpoint(IDENTITY, "shared", ledger=LEDGER, first_start=0.0, label="crunch")
    assert all(s.load_checkpoint(IDENTITY).state == "shared" for s in opened)
    for s in opened:
        s.close()


# -- checkpoints -----------------------------------------------------------------------------------
def test_a_checkpoint_round_trips_and_each_save_increments_its_seq(any_store):
    s = any_store.store
    first = s.save_checkpoint(IDENTITY, {"done": [1, 2]}, ledger=LEDGER, first_start=123.5,
                              label="crunch")
    loaded = s.load_checkpoint(IDENTITY)
    assert loaded == first
    assert (loaded.seq, loaded.state, loaded.ledger, loaded.first_start, loaded.label) == (
        1, {"done": [1, 2]}, LEDGER, 123.5, "crunch")
    assert loaded.id == f"{IDENTITY[:12]}:1"
    second = s.save_checkpoint(IDENTITY, {"done": [1, 2, 3]}, ledger=LEDGER, first_start=123.5,
                               label="crunch")
    assert second.seq == 2
    assert s.load_checkpoint(IDENTITY).state == {"done": [1, 2, 3]}
    assert len(any_store.rows()) == 1  # replaced, not added
    assert s.load_checkpoint("fn:unknown") is None
    assert s.delete_checkpoint(IDENTITY) is True
    assert s.delete_checkpoint(IDENTITY) is False
    assert s.load_checkpoint(IDENTITY) is None


def test_a_saved_state_is_kept_as_it_was_when_saved(any_store):
    state = {"done": [1, 2]}
    any_store.store.save_checkpoint(IDENTITY, state, ledger=LEDGER, first_start=0.0,
                                    label="crunch")
    state["done"].append(3)  # the work goes on changing its object
    loaded = any_store.store.load_checkpoint(IDENTITY)
    assert loaded.state == {"done": [1, 2]}
    loaded.ledger["counts"]["steps"] = 99
    assert any_store.store.load_checkpoint(IDENTITY).ledger == LEDGER


def test_a_large_state_pickled_in_parts_is_stored_whole_and_signed_as_one(folder):
    """A state with large buffers is pickled in parts (its buffers not copied) and stored as
    the one pickle ``pickle.dumps`` would give, under the same signature; a byte changed deep
    in it is refused."""
    state = {"weights": os.urandom(1 << 20),
             "more": [os.urandom(200_000), bytearray(b"x" * 70_000)]}
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, state, ledger=LEDGER, first_start=0.0, label="crunch")
    db_path = folder / "nbbudget.db"
    ((payload,),) = [(r[3],) for r in rows(db_path) if r[0] == IDENTITY]
    assert payload == pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    assert s.load_checkpoint(IDENTITY).state == state
    changed = bytearray(payload)
    changed[len(changed) // 2] ^= 1
    execute(db_path, "UPDATE checkpoints SET payload = ? WHERE identity = ?", bytes(changed),
            IDENTITY)
    with pytest.raises(nb.CheckpointRefused, match="signature does not match"):
        s.load_checkpoint(IDENTITY)
    s.close()


class TouchOnLoad:
    """State whose unpickling creates a file: proof that a payload was (or was not) unpickled."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_unpickling_probe_works_on_a_checkpoint_that_verifies(tmp_path, folder):
    marker = tmp_path / "unpickled"
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, TouchOnLoad(marker), ledger=LEDGER, first_start=0.0,
                      label="crunch")
    assert not marker.exists()
    s.load_checkpoint(IDENTITY).state.close()
    assert marker.exists()
    s.close()
    marker.unlink()
    with pytest.raises(EOFError):  # a truncated probe still runs before the data runs out
        pickle.loads(pickle.dumps(TouchOnLoad(marker), protocol=2)[:-1])
    assert marker.exists()


def _payload(db_path, marker, identity=IDENTITY):
    execute(db_path, "UPDATE checkpoints SET payload = ? WHERE identity = ?",
            pickle.dumps(TouchOnLoad(marker), protocol=2), identity)


def _truncate(db_path, marker, identity=IDENTITY):
    # an unframed pickle without its final STOP: unpickling it would still call open()
    payload = pickle.dumps(TouchOnLoad(marker), protocol=2)[:-1]
    execute(db_path, "UPDATE checkpoints SET payload = ? WHERE identity = ?", payload, identity)


def _header(db_path, marker, identity=IDENTITY):
    (header,) = [r[2] for r in rows(db_path) if r[0] == identity]
    changed = json.loads(header)
    changed["ledger"] = {**changed["ledger"], "counts": {"steps": 0}}  # a budget reset
    execute(db_path, "UPDATE checkpoints SET header = ? WHERE identity = ?",
            json.dumps(changed, sort_keys=True, separators=(",", ":")), identity)


def _old_format(db_path, marker, identity=IDENTITY):
    execute(db_path, "UPDATE checkpoints SET format = 'nbbudget-ckpt-v0' WHERE identity = ?",
            identity)


TAMPERINGS = {
    "tampered payload": _payload,
    "truncated payload": _truncate,
    "changed header": _header,
    "old format": _old_format,
}


@pytest.mark.parametrize("tamper", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_S4_5_a_checkpoint_that_fails_a_check_is_refused_unchanged_and_never_unpickled(
        tmp_path, folder, tamper):
    marker = tmp_path / "unpickled"
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, TouchOnLoad(marker), ledger=LEDGER, first_start=0.0,
                      label="crunch")
    db_path = folder / "nbbudget.db"
    tamper(db_path, marker)
    before = rows(db_path)
    for _ in range(2):  # refused every time, never migrated, reset or rewritten
        with pytest.raises(nb.CheckpointRefused) as info:
            s.load_checkpoint(IDENTITY)
        assert rows(db_path) == before
    err = info.value
    assert isinstance(err, nb.ConfigError)
    assert err.code == "checkpoint_refused"
    assert repr(IDENTITY) in str(err)
    assert str(db_path) in str(err)
    assert "left unchanged" in str(err)
    assert not marker.exists()
    s.close()


def test_S4_5_the_old_format_is_named_in_the_refusal(folder):
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, 1, ledger=LEDGER, first_start=0.0, label="crunch")
    _old_format(folder / "nbbudget.db", None)
    with pytest.raises(nb.CheckpointRefused, match="'nbbudget-ckpt-v0' is not "
                                                   f"'{CHECKPOINT_FORMAT}'"):
        s.load_checkpoint(IDENTITY)
    s.close()


def test_S4_5_a_checkpoint_signed_with_another_secret_is_refused_unchanged(tmp_path, folder):
    marker = tmp_path / "unpickled"
    mine = SQLiteStore(folder)
    mine.save_checkpoint(IDENTITY, TouchOnLoad(marker), ledger=LEDGER, first_start=0.0,
                         label="crunch")
    theirs = SQLiteStore(tmp_path / "elsewhere")  # another store: another secret
    (row,) = rows(folder / "nbbudget.db")
    execute(theirs.path, "INSERT INTO checkpoints (identity, format, header, payload, tag) "
            "VALUES (?, ?, ?, ?, ?)", *row)
    before = rows(theirs.path)
    with pytest.raises(nb.CheckpointRefused, match="signature") as info:
        theirs.load_checkpoint(IDENTITY)
    assert str(theirs.path) in str(info.value)
    assert rows(theirs.path) == before == [row]
    assert not marker.exists()
    mine.close()
    theirs.close()


def test_S4_5_a_signed_row_moved_to_another_identity_is_refused_unchanged(tmp_path, folder):
    marker = tmp_path / "unpickled"
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, TouchOnLoad(marker), ledger=LEDGER, first_start=0.0,
                      label="crunch")
    (row,) = rows(s.path)
    other = "fn:" + "cd34" * 16
    execute(s.path, "INSERT INTO checkpoints (identity, format, header, payload, tag) "
            "VALUES (?, ?, ?, ?, ?)", other, *row[1:])
    before = rows(s.path)
    with pytest.raises(nb.CheckpointRefused) as info:
        s.load_checkpoint(other)
    assert repr(other) in str(info.value)
    assert rows(s.path) == before
    assert not marker.exists()
    s.close()


def test_S4_5_a_signed_header_that_lacks_a_field_is_refused_unchanged(tmp_path, folder):
    """As an older writer with the same secret would have left it."""
    marker = tmp_path / "unpickled"
    s = SQLiteStore(folder)
    header = json.dumps({"format": CHECKPOINT_FORMAT, "identity": IDENTITY, "seq": 1,
                         "created": 0.0, "ledger": LEDGER, "first_start": 0.0},
                        sort_keys=True, separators=(",", ":"))  # no "label"
    payload = pickle.dumps(TouchOnLoad(marker))
    execute(s.path, "INSERT INTO checkpoints (identity, format, header, payload, tag) "
            "VALUES (?, ?, ?, ?, ?)", IDENTITY,
            CHECKPOINT_FORMAT, header, payload, s._sign(header.encode(), payload))
    before = rows(s.path)
    with pytest.raises(nb.CheckpointRefused, match="lacks label"):
        s.load_checkpoint(IDENTITY)
    assert rows(s.path) == before
    assert not marker.exists()
    s.close()


def test_S4_5_an_older_checkpoint_of_the_same_work_put_back_is_refused_unchanged(tmp_path,
                                                                                 any_store):
    marker = tmp_path / "unpickled"
    s = any_store.store
    s.save_checkpoint(IDENTITY, TouchOnLoad(marker), ledger=LEDGER, first_start=0.0,
                      label="crunch")
    older = any_store.row(IDENTITY)  # validly signed (on SQLite), by this store, for this work
    s.save_checkpoint(IDENTITY, "later", ledger=LEDGER, first_start=0.0, label="crunch")
    any_store.put_back(older)
    before = any_store.rows()
    for _ in range(2):
        with pytest.raises(nb.CheckpointRefused) as info:
            s.load_checkpoint(IDENTITY)
        assert any_store.rows() == before
    assert str(info.value) == (
        f"checkpoint {IDENTITY!r} in {s.location} is refused: it is checkpoint 1 of this work, "
        f"but the last one saved was 2 (a checkpoint put back from earlier is never resumed); "
        f"it was left unchanged. Delete it with nb.store().delete_checkpoint({IDENTITY!r}) to "
        f"start over")
    assert not marker.exists()


def test_S4_5_a_checkpoint_put_back_after_its_work_completed_is_refused(any_store):
    s = any_store.store
    s.save_checkpoint(IDENTITY, "first", ledger=LEDGER, first_start=0.0, label="crunch")
    older = any_store.row(IDENTITY)
    assert s.delete_checkpoint(IDENTITY)  # the work delivered its result
    any_store.put_back(older)
    with pytest.raises(nb.CheckpointRefused, match="it is checkpoint 1 of this work, but the "
                                                   "last one saved was 1 and then deleted"):
        s.load_checkpoint(IDENTITY)
    assert any_store.rows() == [older]
    assert s.delete_checkpoint(IDENTITY)  # the way out the refusal names
    again = s.save_checkpoint(IDENTITY, "anew", ledger=LEDGER, first_start=0.0, label="crunch")
    assert again.seq == 2  # the work starts anew and its checkpoints go on counting
    assert s.load_checkpoint(IDENTITY).state == "anew"


def test_a_checkpoint_removed_behind_the_stores_back_is_refused_not_started_over(any_store):
    s = any_store.store
    s.save_checkpoint(IDENTITY, "state", ledger=LEDGER, first_start=0.0, label="crunch")
    any_store.remove_all()
    with pytest.raises(nb.CheckpointRefused, match="checkpoint 1 of this work was saved and is "
                                                   "no longer in the store"):
        s.load_checkpoint(IDENTITY)
    assert s.delete_checkpoint(IDENTITY) is False  # nothing to delete, and now it starts over
    assert s.load_checkpoint(IDENTITY) is None


def test_a_store_made_before_it_kept_sequences_resumes_its_checkpoints(folder):
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, "state", ledger=LEDGER, first_start=0.0, label="crunch")
    s.close()
    execute(s.path, "DROP TABLE sequences")  # as the previous release left its store
    s = SQLiteStore(folder)
    assert s.load_checkpoint(IDENTITY).state == "state"
    assert s.save_checkpoint(IDENTITY, "next", ledger=LEDGER, first_start=0.0,
                             label="crunch").seq == 2
    s.close()



def test_a_store_whose_payload_column_was_not_last_keeps_and_resumes_its_checkpoints(folder):
    """The payload is written into its row in place, which wants it as the last column; a
    store made with it before the tag is made again that way as it opens, every row kept."""
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, "state", ledger=LEDGER, first_start=0.0, label="crunch")
    big = os.urandom(300_000)
    s.save_checkpoint("fn:" + "cd34" * 16, big, ledger=LEDGER, first_start=0.0, label="big")
    s.close()
    before = sorted(rows(s.path))
    execute(s.path, "ALTER TABLE checkpoints RENAME TO later")  # as the earlier release made it
    execute(s.path, "CREATE TABLE checkpoints (identity TEXT PRIMARY KEY, format TEXT NOT NULL, "
                    "header TEXT NOT NULL, payload BLOB NOT NULL, tag BLOB NOT NULL)")
    execute(s.path, "INSERT INTO checkpoints SELECT identity, format, header, payload, tag "
                    "FROM later")
    execute(s.path, "DROP TABLE later")
    s = SQLiteStore(folder)
    with sqlite3.connect(s.path) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(checkpoints)")]
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert columns == ["identity", "format", "header", "tag", "payload"]
    assert "checkpoints_before" not in tables
    assert sorted(rows(s.path)) == before
    assert s.load_checkpoint(IDENTITY).state == "state"
    assert s.load_checkpoint("fn:" + "cd34" * 16).state == big
    assert s.save_checkpoint(IDENTITY, "next", ledger=LEDGER, first_start=0.0,
                             label="crunch").seq == 2
    s.close()

# -- S4-5 through nb.call --------------------------------------------------------------------------
def _resumable(runs: list[object], clock: FakeClock):
    def crunch() -> str:
        runs.append(nb.resume_state("fresh"))
        assert clock.waiting.wait(SOON)
        clock.advance("2s")
        nb.checkpoint("half way")  # past the budget: it pauses here
        return "finished"

    return crunch


def test_S4_5_a_tampered_checkpoint_fails_the_identical_call_loudly(folder):
    runs: list[object] = []
    clock = FakeClock()
    crunch = _resumable(runs, clock)
    identity = _identity(crunch, (), {}, None)
    first = nb.call(crunch, resume=True, budget="1s", clock=clock)
    assert first.data["state"] == "paused"
    db_path = folder / "nbbudget.db"
    execute(db_path, "UPDATE checkpoints SET payload = ? WHERE identity = ?",
            pickle.dumps("another state"), identity)
    before = rows(db_path)
    for _ in range(2):  # it never resumes, and never silently starts over
        resp = nb.call(crunch, resume=True, budget="1s", clock=clock)
        assert resp.ok is False
        assert resp.exit_code == 1
        assert resp.error["code"] == "checkpoint_refused"
        assert repr(identity) in resp.error["message"]
        assert str(db_path) in resp.error["message"]
        assert set(json.loads(resp.to_json())) == {"ok", "data", "error", "warnings", "meta"}
        assert resp.meta["budget_ms"] == 1000
    assert runs == ["fresh"]  # the work did not run again
    assert rows(db_path) == before


def test_S4_5_a_checkpoint_whose_ledger_lacks_its_state_fails_the_call_as_refused(any_store):
    runs: list[object] = []
    clock = FakeClock()
    crunch = _resumable(runs, clock)
    identity = _identity(crunch, (), {}, None)
    any_store.store.save_checkpoint(identity, "half way",
                                    ledger={"version": "nbbudget-ledger-v0"}, first_start=0.0,
                                    label="crunch")
    before = any_store.rows()
    try:
        resp = nb.call(crunch, resume=True, budget="1s", clock=clock)
    finally:
        assert runs == []
        assert any_store.rows() == before
    assert resp.error["code"] == "checkpoint_refused"
    assert repr(identity) in resp.error["message"]
    assert any_store.store.location in resp.error["message"]


def _pausing(runs: list[object], clock: FakeClock):
    """Work that pauses at each of its checkpoints: one step per identical call."""

    def crunch() -> str:
        done = nb.resume_state(0)
        runs.append(done)
        assert clock.waiting.wait(SOON)
        clock.advance("2s")  # past the budget of 1 s
        nb.checkpoint(done + 1)
        return "finished"

    return crunch


def test_S4_5_the_identical_call_refuses_an_older_checkpoint_put_back_and_runs_nothing(
        any_store):
    runs: list[object] = []
    clock = FakeClock()
    crunch = _pausing(runs, clock)
    identity = _identity(crunch, (), {}, None)
    assert nb.call(crunch, resume=True, budget="1s", clock=clock).data["state"] == "paused"
    older = any_store.row(identity)
    clock.waiting.clear()
    second = nb.call(crunch, resume=True, budget="1s", clock=clock)
    assert second.data["checkpoint"] == f"{identity[:12]}:2"
    any_store.put_back(older)  # a copy kept from the first pause
    before = any_store.rows()
    resp = nb.call(crunch, resume=True, budget="1s", clock=clock)
    assert (resp.ok, resp.exit_code, resp.error["code"]) == (False, 1, "checkpoint_refused")
    assert ("it is checkpoint 1 of this work, but the last one saved was 2"
            in resp.error["message"])
    assert runs == [0, 1]  # the work did not run from the older state
    assert any_store.rows() == before


# -- a store that lost what it held ----------------------------------------------------------------
def _truncated(db_path) -> None:
    os.truncate(db_path, 0)


def _deleted(db_path) -> None:
    db_path.unlink()


def _replaced(db_path) -> None:
    db_path.unlink()
    execute(db_path, "CREATE TABLE notes (text TEXT)")


def _malformed(db_path) -> None:
    with open(db_path, "r+b") as fh:
        fh.seek(100)  # the first page's b-tree header, just after the file header
        fh.write(b"\xff" * 8)


def _not_a_database(db_path) -> None:
    with open(db_path, "r+b") as fh:
        fh.write(b"not a database!!")  # over the file's magic header


def _cut_in_half(db_path) -> None:
    os.truncate(db_path, os.path.getsize(db_path) // 2)


DAMAGES = {
    "truncated to zero bytes": _truncated,
    "deleted": _deleted,
    "replaced by another database": _replaced,
    "malformed": _malformed,
    "not a database": _not_a_database,
    "cut in half": _cut_in_half,
}


def snapshot(folder) -> dict[str, bytes]:
    """The bytes of each file in the store's folder."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_damaged(message: str, folder) -> None:
    assert f"the nbbudget store {str(folder / 'nbbudget.db')!r} is damaged" in message
    assert "nothing was run and it was left as it is" in message
    assert f"move the folder {str(folder)!r} aside to start an empty store" in message


def test_a_new_folder_and_a_store_killed_before_it_made_its_secret_open_as_new_stores(folder):
    SQLiteStore(folder).close()  # a brand-new folder
    for name in ("secret", "nbbudget.db-wal", "nbbudget.db-shm"):
        (folder / name).unlink(missing_ok=True)
    _truncated(folder / "nbbudget.db")  # its database made, no secret yet
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, "state", ledger=LEDGER, first_start=0.0, label="crunch")
    assert s.load_checkpoint(IDENTITY).state == "state"
    s.close()


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_a_store_that_lost_what_it_held_is_damaged_and_left_as_it_is(folder, damage):
    s = SQLiteStore(folder)
    s.save_checkpoint(IDENTITY, "state", ledger=LEDGER, first_start=0.0, label="crunch")
    s.close()  # the last connection: everything is in nbbudget.db
    damage(folder / "nbbudget.db")
    before = snapshot(folder)
    for _ in range(2):  # damaged every time, never made over
        with pytest.raises(nb.StoreDamaged) as info:
            SQLiteStore(folder)
        assert snapshot(folder) == before
    err = info.value
    assert isinstance(err, nb.ConfigError)
    assert err.code == "store_damaged"
    assert err.path == folder / "nbbudget.db"
    assert_damaged(str(err), folder)


#: the first call, paused, in a process of its own (the kernel is restarted after it)
PAUSE = textwrap.dedent("""
    import sys, time
    import nbbudget as nb

    def crunch():
        time.sleep(0.5)  # past the budget
        nb.checkpoint("half way")
        return "finished"

    resp = nb.call(crunch, resume=True, budget="100ms", key="damaged")
    assert resp.data["state"] == "paused", resp.to_json()
""")


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_the_identical_call_after_a_restart_on_a_damaged_store_fails_and_runs_nothing(
        folder, damage):
    subprocess.run([sys.executable, "-c", PAUSE], check=True, timeout=60, env=dict(os.environ))
    damage(folder / "nbbudget.db")
    before = snapshot(folder)
    runs: list[object] = []

    def crunch() -> str:
        runs.append(nb.resume_state("fresh"))
        return "finished"

    for _ in range(2):  # it never resumes, and never silently starts over
        resp = nb.call(crunch, resume=True, budget="30s", key="damaged")
        assert (resp.ok, resp.exit_code, resp.error["code"]) == (False, 1, "store_damaged")
        assert_damaged(resp.error["message"], folder)
        assert resp.meta["budget_ms"] == 30_000
        assert snapshot(folder) == before
    assert runs == []


@pytest.mark.parametrize("damage", [_truncated, _deleted], ids=["truncated", "deleted"])
def test_the_identical_call_in_the_same_process_on_an_emptied_store_fails_and_runs_nothing(
        folder, damage):
    runs: list[object] = []
    clock = FakeClock()
    crunch = _pausing(runs, clock)
    assert nb.call(crunch, resume=True, budget="1s", clock=clock).data["state"] == "paused"
    damage(folder / "nbbudget.db")
    for _ in range(2):
        resp = nb.call(crunch, resume=True, budget="1s", clock=clock)
        assert (resp.ok, resp.exit_code, resp.error["code"]) == (False, 1, "store_damaged")
        assert_damaged(resp.error["message"], folder)
    assert runs == [0]
    assert not (folder / "nbbudget.db").exists() or os.path.getsize(folder / "nbbudget.db") == 0


@pytest.fixture
def shell(monkeypatch):
    config = Config()
    config.HistoryManager.enabled = False  # no history thread: every test ends with no thread
    ip = InteractiveShell.instance(config=config)
    # nor nbbudget's history of runs: the store is damaged under it here, and its writer would
    # wait on the damaged file up to the store's busy timeout (10 s) before it drops the run.
    # Said by the environment, which the extension reads as it loads: the shell is IPython's
    # singleton, so a config given here is ignored when another module made it first
    monkeypatch.setenv("NBBUDGET_HISTORY", "0")
    ip.run_line_magic("load_ext", "nbbudget")
    assert not history.keeping()
    ip.run_cell("import nbbudget as nb")
    yield ip
    ip.run_line_magic("unload_ext", "nbbudget")


def test_a_resume_cell_on_a_store_emptied_after_its_pause_stops_and_runs_nothing(shell, folder):
    import builtins

    cell = ("%%budget --resume --budget 100ms --no-widget\n"
            "import builtins, time\n"
            "builtins.ran_here += 1\n"
            "time.sleep(0.5)\n"
            "nb.checkpoint('half way')\n")
    builtins.ran_here = 0
    try:
        assert type(shell.run_cell(cell).error_in_exec).__name__ == "Incomplete"
        _truncated(folder / "nbbudget.db")
        result = shell.run_cell(cell)
        assert builtins.ran_here == 1
    finally:
        del builtins.ran_here
    assert type(result.error_in_exec) is nb.StoreDamaged
    assert result.error_in_exec._render_traceback_() == [f"StoreDamaged: {result.error_in_exec}"]
    assert_damaged(str(result.error_in_exec), folder)
    assert nb.last_response.error["code"] == "store_damaged"


# -- concurrency -----------------------------------------------------------------------------------
def _hammer(stores: list[SQLiteStore], threads: int, per_thread: int) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def writer(n: int) -> None:
        s = stores[n % len(stores)]
        try:
            start.wait()
            for i in range(per_thread):
                s.save_checkpoint(f"t{n}-{i}", {"n": n, "i": i}, ledger=LEDGER,
                                  first_start=0.0, label=f"t{n}")
                if i % 20 == 0:
                    s.record_job(f"job-{n}-{i}", f"t{n}-{i}", f"t{n}", "running")
                    s.record_job(f"job-{n}-{i}", f"t{n}-{i}", f"t{n}", "done")
        except BaseException as exc:  # collected: the test reports them all
            errors.append(exc)
        finally:
            s.close()

    workers = [threading.Thread(target=writer, args=(n,), name=f"writer-{n}")
               for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return errors


def test_eight_threads_write_to_one_store_without_locking_errors(folder):
    s = SQLiteStore(folder)
    errors = _hammer([s], threads=8, per_thread=200)
    assert errors == []
    assert len(rows(s.path)) == 8 * 200
    assert s.load_checkpoint("t7-199").state == {"n": 7, "i": 199}
    jobs = s.jobs()
    assert len(jobs) == 8 * 10
    assert {j["state"] for j in jobs} == {"done"}
    s.close()


def test_two_stores_on_one_folder_write_concurrently(folder):
    """Two SQLiteStore objects, two connections each, as two kernels of one user would have."""
    first, second = SQLiteStore(folder), SQLiteStore(folder)
    errors = _hammer([first, second], threads=4, per_thread=100)
    assert errors == []
    assert len(rows(first.path)) == 4 * 100
    assert second.load_checkpoint("t0-99").state == {"n": 0, "i": 99}  # written by `first`
    assert first.load_checkpoint("t1-99").state == {"n": 1, "i": 99}  # written by `second`
    first.close()
    second.close()


# -- a store another process holds -----------------------------------------------------------------
#: another process in the middle of a write: it holds the write lock of the database argv[1]
#: for argv[2] seconds, then commits (it writes nothing)
HOLDS_THE_LOCK = textwrap.dedent("""
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    db.execute("COMMIT")
""")


@contextlib.contextmanager
def held(path, seconds: float):
    """Another process holds the write lock of the database *path* for *seconds* (ended when
    the block ends, if it still runs); yields that process."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_THE_LOCK, str(path), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        yield holder
    finally:
        holder.kill()
        holder.stdout.close()
        holder.wait(timeout=30)


def holder_named(holder: subprocess.Popen[str]) -> str:
    """How `nb.StoreBusy` names the process *holder*: its pid and its command line."""
    command = " ".join(" ".join(holder.args).split())
    return f"process {holder.pid} ({command[:57]}...)"


def busy_message(folder, waited: str, holder: subprocess.Popen[str]) -> str:
    return (f"the nbbudget store {str(folder / 'nbbudget.db')!r} stayed locked for {waited} by "
            f"{holder_named(holder)}; nothing was written to it. Make the call again once "
            f"that process has finished its write, or stop it if it hangs (a store on a "
            f"network file system is not supported)")


def _pauses_at_its_checkpoint() -> str:
    time.sleep(0.05)  # past the budget of 10 ms
    nb.checkpoint({"step": nb.resume_state({"step": 0})["step"] + 1})
    return "finished"


def test_a_new_store_opened_while_another_process_writes_it_waits_then_switches_to_wal(folder):
    """A new store is switched to WAL, which reads the file's header and then writes it; a
    connection that asks for that write while another process holds the write lock is answered
    busy at once by SQLite, whatever its busy timeout. The store tries the switch again until
    the other has finished, and the call is answered as if the store had been free."""
    folder.mkdir(mode=0o700)
    (folder / "nbbudget.db").touch(mode=0o600)  # as the first process to open the store makes it
    with held(folder / "nbbudget.db", seconds=1.0):
        resp = nb.call(_pauses_at_its_checkpoint, resume=True, key="fresh", budget="10ms")
    assert (resp.exit_code, resp.data["state"]) == (14, "paused")
    assert nb.store().load_checkpoint(_identity(None, (), {}, "fresh")).state == {"step": 1}
    with contextlib.closing(sqlite3.connect(folder / "nbbudget.db")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_call_on_a_store_locked_past_the_busy_timeout_answers_store_busy_and_runs_nothing(
        folder, monkeypatch):
    SQLiteStore(folder).close()  # a store this process has not opened since
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.5)
    ran: list[int] = []
    with held(folder / "nbbudget.db", seconds=60) as holder:
        started = time.monotonic()
        resp = nb.call(ran.append, 1, resume=True, key="busy", budget="5s")
        took = time.monotonic() - started
        assert (resp.ok, resp.exit_code, resp.error["code"]) == (False, 1, "store_busy")
        assert resp.error["message"] == busy_message(folder, "0.5 s", holder)
        assert type(resp.refusal) is nb.StoreBusy
        assert resp.refusal.path == folder / "nbbudget.db"
        assert resp.refusal.holder == holder_named(holder)
    assert ran == []
    assert 0.5 <= took < 0.5 + 3.0
    assert nb.call(ran.append, 1, resume=True, key="busy", budget="5s").ok  # once it is free
    assert ran == [1]


WRITES = {
    "checkpoint": lambda s: s.save_checkpoint(IDENTITY, "second", ledger=LEDGER, first_start=0.0,
                                              label="crunch"),
    "quota": lambda s: s.take_run(IDENTITY, "2024-06-07", 5),
    "job record": lambda s: s.record_job("job-1", IDENTITY, "crunch", "done"),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_a_write_the_store_cannot_make_in_time_raises_store_busy_and_changes_nothing(
        folder, write):
    s = SQLiteStore(folder, busy_timeout_s=0.3)
    s.save_checkpoint(IDENTITY, "first", ledger=LEDGER, first_start=0.0, label="crunch")
    s.take_run(IDENTITY, "2024-06-07", 5)
    s.record_job("job-1", IDENTITY, "crunch", "running")
    before = (rows(s.path), s.runs_on(IDENTITY, "2024-06-07"), s.jobs())
    with held(s.path, seconds=60) as holder:
        with pytest.raises(nb.StoreBusy) as info:
            write(s)
        assert str(info.value) == busy_message(folder, "0.3 s", holder)
        assert info.value.code == "store_busy"
        assert isinstance(info.value, nb.ConfigError)
        assert (rows(s.path), s.runs_on(IDENTITY, "2024-06-07"), s.jobs()) == before
    write(s)  # the same connection writes once the lock is let go: nothing was left open
    assert s.load_checkpoint(IDENTITY).state in ("first", "second")
    s.close()


def test_a_resume_cell_on_a_locked_store_ends_with_store_busy_in_one_line(shell, folder,
                                                                        monkeypatch):
    SQLiteStore(folder).close()
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.3)
    with held(folder / "nbbudget.db", seconds=60) as holder:
        result = shell.run_cell("%%budget --resume --budget 1s --no-widget\n"
                                "ran_here = True\n")
        error = result.error_in_exec
        assert type(error) is nb.StoreBusy
        assert error._render_traceback_() == [f"StoreBusy: {busy_message(folder, '0.3 s', holder)}"]
    assert nb.last_response.error["code"] == "store_busy"
    assert "ran_here" not in shell.user_ns


#: ``nbbudget`` as its console script runs it, with the store's busy timeout at 0.3 s
NBBUDGET_BUSY_AFTER_300MS = textwrap.dedent("""
    import sys
    import nbbudget.calls.store
    nbbudget.calls.store.BUSY_TIMEOUT_S = 0.3
    from nbbudget.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_nbbudget_run_on_a_locked_store_exits_2_naming_it_and_its_holder(folder, tmp_path):
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("open('ran.txt', 'a').write('ran')")]
    nbformat.write(notebook, tmp_path / "good.ipynb")
    SQLiteStore(folder).close()
    with held(folder / "nbbudget.db", seconds=60) as holder:
        for args in (["run", "good.ipynb"], ["jobs"]):
            done = subprocess.run([sys.executable, "-c", NBBUDGET_BUSY_AFTER_300MS, *args],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                  env=dict(os.environ), check=False)
            assert (done.returncode, done.stdout) == (2, "")
            assert done.stderr == f"nbbudget {args[0]}: {busy_message(folder, '0.3 s', holder)}\n"
    assert not (tmp_path / "ran.txt").exists()
    assert not list(tmp_path.glob("*.out.ipynb"))


# -- lost jobs -------------------------------------------------------------------------------------
def test_a_running_job_whose_process_died_is_marked_lost(folder):
    s = nb.store()
    s.record_job("mine", "fn:mine", "mine", "running")  # this process is alive
    code = ("import nbbudget as nb; "
            "nb.store().record_job('theirs', 'fn:theirs', 'crunch', 'running')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=dict(os.environ))
    assert {j["id"]: j["state"] for j in s.jobs()} == {"mine": "running", "theirs": "running"}
    assert s.mark_lost_jobs() == 1
    assert s.mark_lost_jobs() == 0
    states = {j["id"]: j for j in s.jobs()}
    assert states["theirs"]["state"] == "lost"
    assert states["theirs"]["label"] == "crunch"
    assert states["mine"]["state"] == "running"
    frame = nb.jobs.to_frame()
    assert frame.loc["theirs", "state"] == "lost"


def test_opening_a_store_marks_the_lost_jobs(folder):
    code = ("import nbbudget as nb; "
            "nb.store().record_job('theirs', 'fn:theirs', 'crunch', 'running')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=dict(os.environ))
    s = SQLiteStore(folder)
    assert [(j["id"], j["state"]) for j in s.jobs()] == [("theirs", "lost")]
    s.close()


def test_a_detached_job_on_a_damaged_store_warns_and_still_delivers(tmp_path, monkeypatch,
                                                                    quick_idle_workers):
    import warnings

    folder = tmp_path / "damaged"
    folder.mkdir()
    (folder / "secret").write_text("0" * 64)  # a store that held records...
    (folder / "nbbudget.db").write_bytes(b"")  # ...and lost them
    monkeypatch.setenv("NBBUDGET_HOME", str(folder))
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "0")
    release = threading.Event()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        resp = nb.call(release.wait, 5, detach=True, budget="50ms")
        assert resp.exit_code == 14
        said: list[str] = []
        deadline = time.monotonic() + 5
        for writes in (1, 2):  # running (written a moment after it detached), then done
            if writes == 2:
                release.set()
                assert resp.job.result(timeout=5) is True
            while len(said) < writes and time.monotonic() < deadline:
                time.sleep(0.01)
                said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 2 and all(f"nbbudget could not record job {resp.job.id}" in m for m in said)
    assert "is damaged" in said[-1] and f"nb.jobs[{resp.job.id!r}]" in said[-1]
    assert (folder / "nbbudget.db").read_bytes() == b""  # left as it is
