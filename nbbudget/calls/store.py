"""The durable store: checkpoints, the runs-per-day quota and job records.

`Store` is the interface the call path uses; `SQLiteStore` is its local implementation, the
store under ``NBBUDGET_HOME`` that `store` opens (`nbbudget.testing.MemoryStore` is another, in
memory, for tests). Every implementation keeps the same rules: an older checkpoint put back, or
one saved and gone, is refused and left as it was (S4-5); a quota of starts is counted exactly,
whatever the threads (S4-12).

The SQLite store is one database file, ``nbbudget.db``, in WAL mode so several kernels of one
user can share it; each thread has its own connection, whose busy timeout (`BUSY_TIMEOUT_S`) is
set as it opens, before its first statement; every write is a ``BEGIN IMMEDIATE`` transaction,
so a write that follows a read in it waits for the lock rather than failing at once. A new
store is switched to WAL by whichever process gets there first (the others try the switch
again, as SQLite's busy handler would, until it is done), and a store made by an earlier release
is brought up to date in the transaction that opens it, so any number of processes may open,
create or migrate one store at once. A store another connection keeps locked past the busy
timeout answers `StoreBusy`, naming the file and, where the system tells, the process that
holds it; nothing is written half. Every folder made for it is 0700 and its files are 0600,
whatever the umask, and files found wider are narrowed when the store opens. Checkpoints are
signed with HMAC-SHA256 using a secret made on first use (``secret``, 0600); nothing is
unpickled before its signature verifies, and a checkpoint that fails a check is refused and
left exactly as it was (S4-5). Each checkpoint's signed header holds its number in its work's
sequence, and the store keeps each work's last number (in ``sequences``, kept when the
checkpoint is deleted), so an older checkpoint put back is refused too.

The store is never started over behind its owner's back: the secret is made only once the
database holds the store's tables, so a secret beside a database that is missing, empty or
without them is a store that lost what it held; that, or a file SQLite reports malformed, raises
`StoreDamaged` and the file is left as it is. A process killed mid-write leaves neither.

A store this user cannot write (its folder or its database read-only: ``chmod 500``, a
read-only file system) is opened to be read as it is: nothing is made, narrowed or brought up to
date, and a table an earlier release did not make reads as empty. Each write raises
`StoreReadOnly`, naming the folder and the fix, until the folder is writable again; the store is
then opened for writing, as it would have been.

The table ``history`` keeps the last runs that ended (`nbbudget.calls.history` writes and reads
it, and keeps it bounded); a store made before it is given it as it opens, as every table is.

Threat model: the signature stops tampering by anyone who cannot read the owner's secret
(copied or downloaded files, shared folders, other users); code running as the same user can
read the secret and is not kept out. A copy of the whole store put back (a backup) is that
earlier store, and resumes as it would have then.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import pickle
import shlex
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..core.errors import ConfigError

__all__ = ["BUSY_TIMEOUT_S", "CHECKPOINT_FORMAT", "KEEP_RUN_DAYS", "Checkpoint",
           "CheckpointRefused", "SQLiteStore", "Store", "StoreBusy", "StoreDamaged",
           "StoreReadOnly", "home",
           "oldest_kept_day", "refuse_unless_last", "store"]

CHECKPOINT_FORMAT = "nbbudget-ckpt-v1"
#: how long a statement on the store waits for a lock another connection holds (SQLite's busy
#: timeout) before the store answers `StoreBusy`, unless the store is made with another
BUSY_TIMEOUT_S = 10.0
KEEP_RUN_DAYS = 7  # the runs-per-day counts of older days are dropped
_PRIVATE_FILES = ("nbbudget.db", "nbbudget.db-wal", "nbbudget.db-shm", "secret")
_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
_HEADER_FIELDS = ("format", "identity", "seq", "created", "ledger", "first_start", "label")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    identity TEXT PRIMARY KEY,
    format   TEXT NOT NULL,
    header   TEXT NOT NULL,
    tag      BLOB NOT NULL,
    payload  BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id         TEXT PRIMARY KEY,
    identity   TEXT NOT NULL,
    label      TEXT NOT NULL,
    state      TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    created    REAL NOT NULL,
    updated    REAL NOT NULL,
    error      TEXT
);
CREATE TABLE IF NOT EXISTS sequences (
    identity TEXT PRIMARY KEY,
    seq      INTEGER NOT NULL,
    live     INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    identity TEXT NOT NULL,
    day      TEXT NOT NULL,
    count    INTEGER NOT NULL,
    PRIMARY KEY (identity, day)
);
CREATE TABLE IF NOT EXISTS history (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    kind     TEXT NOT NULL,
    name     TEXT NOT NULL,
    started  REAL NOT NULL,
    ended    REAL NOT NULL,
    status   TEXT NOT NULL,
    cause    TEXT,
    by       TEXT,
    limits   TEXT NOT NULL,
    consumed TEXT NOT NULL,
    trace    BLOB
);
CREATE INDEX IF NOT EXISTS history_ended ON history (ended);
"""


class _Refused(ConfigError):
    """A refusal of the store: shown by IPython as one line, what happened and what to do."""

    code = ""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class CheckpointRefused(_Refused):
    """A stored checkpoint failed a check (signature, format, a missing field) and was refused;
    it is left unchanged. ``code`` is ``"checkpoint_refused"``."""

    code = "checkpoint_refused"

    def __init__(self, identity: str, where: str, why: str) -> None:
        self.identity = identity
        self.where = where
        self.why = why
        super().__init__(
            f"checkpoint {identity!r} in {where} is refused: {why}; it was left unchanged. "
            f"Delete it with nb.store().delete_checkpoint({identity!r}) to start over"
        )


class StoreDamaged(_Refused):
    """The store's database is damaged: SQLite reports it malformed, or it has lost what it held
    (it is missing, empty or without the store's tables while the secret made after them is
    still there). Nothing was run on it and it was left as it is; ``path`` names it and
    ``code`` is ``"store_damaged"``."""

    code = "store_damaged"

    def __init__(self, path: Path, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(
            f"the nbbudget store {str(path)!r} is damaged: {why}; nothing was run and it was "
            f"left as it is. Restore it from a backup, or move the folder {str(path.parent)!r} "
            f"aside to start an empty store (its paused work then starts over), and restart "
            f"the kernel"
        )


class StoreBusy(_Refused):
    """Another connection kept the store's database locked for longer than its busy timeout (a
    write that hangs, a process stopped in the middle of one). Nothing was written: what was to
    be written in that transaction was rolled back. ``path`` names the file, ``holder`` the
    process that held the lock when the wait ended (`None` when the system does not tell), and
    ``code`` is ``"store_busy"``."""

    code = "store_busy"

    def __init__(self, path: Path, waited_s: float, holder: str | None) -> None:
        self.path = path
        self.waited_s = waited_s
        self.holder = holder
        who = holder or "another connection (this system does not say which)"
        super().__init__(
            f"the nbbudget store {str(path)!r} stayed locked for {waited_s:g} s by {who}; "
            f"nothing was written to it. Make the call again once that process has finished "
            f"its write, or stop it if it hangs (a store on a network file system is not "
            f"supported)"
        )


class StoreReadOnly(_Refused):
    """The store's folder (or its database) cannot be written by this user: a folder made
    read-only (``chmod 500``), a read-only file system, another user's store. What it holds can
    still be read (`SQLiteStore.read_only`); a write is refused and nothing is written.
    ``path`` names the folder and ``code`` is ``"store_read_only"``."""

    code = "store_read_only"

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"the nbbudget store {str(path)!r} is read-only: this user cannot write to it, so "
            f"nothing was written. Make the folder writable (chmod u+w {shlex.quote(str(path))}"
            f"), or set NBBUDGET_HOME to a writable folder"
        )


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: the user's state, the ledger state and when the work first began."""

    identity: str
    seq: int
    state: Any
    ledger: dict[str, Any]
    first_start: float
    created: float
    label: str

    @property
    def id(self) -> str:
        return f"{self.identity[:12]}:{self.seq}"


def home() -> Path:
    """The store's folder: ``NBBUDGET_HOME``, read now, else the IPython layer's
    ``NBBudget.home``, else ``nbbudget`` in Jupyter's data directory."""
    configured = os.environ.get("NBBUDGET_HOME") or (
        _default_home() if _default_home is not None else None)
    if configured:
        return Path(configured).expanduser()
    return Path(_jupyter_data_dir()) / "nbbudget"


_default_home: Callable[[], str | None] | None = None


def set_default_home(provider: Callable[[], str | None] | None) -> None:
    """Install (or remove) where the store's folder comes from after ``NBBUDGET_HOME``."""
    global _default_home
    _default_home = provider


def _jupyter_data_dir() -> str:
    try:
        from jupyter_core.paths import jupyter_data_dir
    except ImportError:
        pass
    else:
        return str(jupyter_data_dir())
    if os.environ.get("JUPYTER_DATA_DIR"):
        return os.environ["JUPYTER_DATA_DIR"]
    if sys.platform == "darwin":
        return os.path.expanduser("~/Library/Jupyter")
    if os.name == "nt":
        return os.path.join(os.environ.get("APPDATA", os.path.expanduser("~")), "jupyter")
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(xdg, "jupyter")


class Store(Protocol):
    """What the call path, ``nb.jobs`` and ``nbbudget run`` need of the place their durable
    records are kept. ``location`` names it in messages (a refused checkpoint says where it is).

    Checkpoints: each save of a work's state numbers it one past the last number saved for that
    work, deleted or not; a load gives the last one saved, `None` when there is none, and
    refuses with `CheckpointRefused` (changing nothing) one that is not the last saved, or one
    saved and gone (S4-5). Runs per day: `take_run` counts a start only while the day's count
    is under the quota, atomically (S4-12). Job records: one per detached job, by its id.
    """

    @property
    def location(self) -> str: ...

    def save_checkpoint(self, identity: str, state: Any, *, ledger: dict[str, Any],
                        first_start: float, label: str) -> Checkpoint: ...

    def load_checkpoint(self, identity: str) -> Checkpoint | None: ...

    def delete_checkpoint(self, identity: str) -> bool: ...

    def take_run(self, identity: str, day: str, quota: int) -> int | None: ...

    def runs_on(self, identity: str, day: str) -> int: ...

    def record_job(self, job_id: str, identity: str, label: str, state: str,
                   error: str | None = None, *, created: float | None = None,
                   ended: float | None = None) -> None: ...

    def jobs(self) -> list[dict[str, Any]]: ...

    def mark_lost_jobs(self) -> int: ...


_STORES: dict[Path, SQLiteStore] = {}
_BY_SETTING: dict[str, SQLiteStore] = {}  # by the NBBUDGET_HOME text, to skip resolving the path
_STORES_LOCK = threading.Lock()


def store() -> SQLiteStore:
    """The store of the current ``NBBUDGET_HOME`` (one object per folder, made on first use)."""
    configured = os.environ.get("NBBUDGET_HOME", "")
    if not os.path.isabs(configured):  # a relative folder depends on the working directory
        configured = ""
    found = _BY_SETTING.get(configured) if configured else None
    if found is not None:
        return found
    folder = home().resolve()
    with _STORES_LOCK:
        found = _STORES.get(folder)
        if found is None:
            found = _STORES[folder] = SQLiteStore(folder)
        _BY_SETTING[configured] = found
        return found


class SQLiteStore:
    """The local `Store`: job records and signed checkpoints in one SQLite file under *folder*
    (the module's docstring says how it keeps them). A statement waits at most
    *busy_timeout_s* (default `BUSY_TIMEOUT_S`) for a lock another connection holds."""

    def __init__(self, folder: str | os.PathLike[str], *,
                 busy_timeout_s: float | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "nbbudget.db"
        self.busy_timeout_s = BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
        self._local = threading.local()
        self._read_only = False
        self._generation = 0  # counts the store's reopenings: a connection of an earlier one goes
        self._reopening = threading.Lock()
        self._make_folder()
        try:
            if not self._read_only:
                self._init_schema()
            self._secret = self._load_secret()  # after the tables: see `_check_held`
            if not self._read_only:
                self.mark_lost_jobs()
        except BaseException:
            self.close()
            raise

    # -- files ----------------------------------------------------------------------------------
    def _make_folder(self) -> None:
        """The folder and its files, for their owner only: each folder made here is 0700 whatever
        the umask, and files left wider (by an older release, a copy) are closed to others, so
        SQLite, which gives its -wal and -shm files the database's mode, makes them 0600 too.
        A store that held records and lost them is left as it is (`StoreDamaged`). A store this
        user cannot write is opened to be read (`read_only`), and left exactly as it is."""
        try:
            self._read_only = _cannot_write(self.folder, self.path)
            if not self._read_only:
                _make_private_folders(self.folder)
            if (self.folder / "secret").exists():
                self._check_held()
            if self._read_only:
                if not self.path.exists():
                    self._nothing_to_read()
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
            for name in _PRIVATE_FILES:
                _chmod_if_there(self.folder / name, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot create the nbbudget store {str(self.folder)!r} "
                              f"({exc.strerror}); set NBBUDGET_HOME to a writable folder") from None

    def _nothing_to_read(self) -> None:
        """A read-only folder with no store in it: nothing to read, and none can be made."""
        folder = str(self.folder)
        raise ConfigError(f"cannot create the nbbudget store in {folder!r}: the folder is "
                          f"read-only and holds none. Make it writable (chmod u+w "
                          f"{shlex.quote(folder)}), or set NBBUDGET_HOME to a writable folder")

    @property
    def read_only(self) -> bool:
        """Whether this user cannot write the store (its folder or its database): it is read as
        it is, and every write raises `StoreReadOnly`. The records of ``nbbudget run``
        (`nbbudget.calls.run_store`) read it so too."""
        return self._read_only

    def _reopen(self) -> None:
        """Before a write to a read-only store: if its folder has been made writable since it
        opened, open it as a new store opens (its folder and files narrowed to their owner, its
        tables brought up to date, its secret made if need be), and have each thread connect
        anew; else `StoreReadOnly`."""
        with self._reopening:
            if not self._read_only:
                return
            if _cannot_write(self.folder, self.path):
                raise StoreReadOnly(self.folder)
            self._make_folder()
            self._generation += 1
            self._init_schema()
            self._secret = self._load_secret()

    def _check_held(self) -> None:
        """The secret is made once the database holds the store's tables, so beside a secret a
        database that is missing, empty or without them has lost what it held."""
        self._check_file()
        with self._errors_named(), closing(self._connect()) as db:
            tables = {name for (name,) in db.execute(_TABLES)}
        if "checkpoints" not in tables:
            raise StoreDamaged(self.path, "it has none of the store's tables, though the secret "
                                          "beside it shows it had them")

    def _check_file(self) -> None:
        """`StoreDamaged` if the database of a store that held records is gone or empty."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            raise StoreDamaged(self.path, "it is missing, though the secret beside it shows it "
                                          "held records") from None
        if size == 0:
            raise StoreDamaged(self.path, "it is empty (0 bytes), though the secret beside it "
                                          "shows it held records")

    def _load_secret(self) -> bytes:
        """The store's signing key: made once, written whole to a temporary file and linked into
        place, so no process ever reads a partial secret; a second process reads the first's."""
        path = self.folder / "secret"
        if not path.exists() and self._read_only:
            return b""  # none was made: no checkpoint was signed, none is there to verify
        if not path.exists():
            tmp = self.folder / f".secret.{os.getpid()}.{threading.get_ident()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(os.urandom(32).hex().encode())
                    fh.flush()
                    os.fsync(fh.fileno())
                os.link(tmp, path)  # fails if another process got there first: use its secret
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        data = path.read_bytes()
        if len(data) != 64:
            raise ConfigError(f"the store's secret {str(path)!r} is damaged; remove it (every "
                              f"checkpoint signed with it will then be refused)")
        return bytes.fromhex(data.decode())

    # -- connections ------------------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        """This thread's connection, made on first use: its busy timeout is set as it opens,
        before its first statement, then the database is put in WAL mode (`_switch_to_wal`)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None and self._local.generation != self._generation:
            self.close()  # the store became writable: this read-only connection goes
            db = None
        if db is None:
            db = self._connect()
            try:
                if self._read_only:
                    _tables_to_read(db)
                else:
                    _switch_to_wal(db, self.busy_timeout_s)
                    db.execute("PRAGMA synchronous=FULL")
            except BaseException:
                db.close()
                raise
            self._local.db = db
            self._local.generation = self._generation
        return db

    def _connect(self) -> sqlite3.Connection:
        """A new connection to the database; on a read-only store, one that only reads: SQLite's
        read-only mode, or, where that cannot open a WAL database (its ``-shm`` file is not
        there and the folder is not writable, so none can be made), the file as immutable (no
        process can be writing it: none can make the files a write needs)."""
        if not self._read_only:
            return sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        uri = self.path.resolve().as_uri()
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=self.busy_timeout_s,
                             isolation_level=None)
        try:
            db.execute(_TABLES).fetchall()
        except sqlite3.OperationalError:
            db.close()
            db = sqlite3.connect(f"{uri}?immutable=1", uri=True, timeout=self.busy_timeout_s,
                                 isolation_level=None)
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        if self._read_only:
            self._reopen()
        with self._transaction("BEGIN IMMEDIATE") as db:
            yield db

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """Several reads that see one moment of the store."""
        with self._transaction("BEGIN") as db:
            yield db

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """A transaction on this thread's connection: all of it is written, or none (an error
        in it, or a COMMIT that failed, rolls it back)."""
        with self._errors_named():
            db = self._db()
            db.execute(begin)
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @contextmanager
    def _errors_named(self) -> Iterator[None]:
        """SQLite's errors about the file become the store's, naming it: its word that the file
        is damaged (corrupt, not a database: exactly `sqlite3.DatabaseError`) `StoreDamaged`;
        a lock held by another connection past the busy timeout `StoreBusy`, with who holds it;
        its word that the file cannot be written (a folder or file made read-only since the
        store opened) `StoreReadOnly`. Others (a full disk) pass as they are."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if _read_only_error(exc):  # made read-only since it opened
                raise StoreReadOnly(self.folder) from None
            if not _busy(exc):
                raise
            raise StoreBusy(self.path, self.busy_timeout_s, _holder(self.path)) from None
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:
                raise
            raise StoreDamaged(self.path, f"SQLite reports {str(exc)!r}") from None

    def _init_schema(self) -> None:
        with self._write() as db:
            tables = {name for (name,) in db.execute(_TABLES)}
            if "checkpoints" in tables:
                _payload_last(db)
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            if "sequences" not in tables:
                _seed_sequences(db)

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``, rolled back on an exception) on this
        thread's connection, for modules that keep a table of their own in the store
        (`nbbudget.calls.run_store`); SQLite's errors are the store's (`StoreBusy`...)."""
        return self._write()

    def read_transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """Reads that see one moment of the store, on this thread's connection, for the same
        modules as `transaction`."""
        return self._read()

    def close(self) -> None:
        """Close this thread's connection."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    @property
    def location(self) -> str:
        """The database file."""
        return str(self.path)

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, identity: str, state: Any, *, ledger: dict[str, Any],
                        first_start: float, label: str) -> Checkpoint:
        """Sign and store *state* for *identity*, replacing its previous checkpoint atomically.
        Its sequence number follows the last one the store saved for *identity*, deleted or
        not, and is kept as that work's last."""
        parts = _pickled(state)  # outside the write lock; large buffers are not copied
        with self._write() as db:
            row = db.execute("SELECT seq FROM sequences WHERE identity = ?",
                             (identity,)).fetchone()
            seq = row[0] + 1 if row else 1
            created = time.time()
            header = json.dumps({
                "format": CHECKPOINT_FORMAT, "identity": identity, "seq": seq,
                "created": created, "ledger": ledger, "first_start": first_start,
                "label": label,
            }, sort_keys=True, separators=(",", ":"))
            tag = self._sign(header.encode(), *parts)
            _insert_checkpoint(db, (identity, CHECKPOINT_FORMAT, header, tag), parts)
            db.execute("INSERT OR REPLACE INTO sequences VALUES (?, ?, 1)", (identity, seq))
        return Checkpoint(identity, seq, state, ledger, first_start, created, label)

    def load_checkpoint(self, identity: str) -> Checkpoint | None:
        """The verified checkpoint of *identity*, `None` when there is none; raises
        `CheckpointRefused` (and changes nothing) when it fails a check, when it is not the
        last one the store saved for *identity* (one put back from earlier), or when that one
        is gone; raises `StoreDamaged` when the store has lost what it held."""
        self._check_file()  # emptied under this process, whose connections may not see it yet
        with self._read() as db:
            row = db.execute("SELECT format, header, payload, tag FROM checkpoints "
                             "WHERE identity = ?", (identity,)).fetchone()
            last = db.execute("SELECT seq, live FROM sequences WHERE identity = ?",
                              (identity,)).fetchone()
        if row is None:
            refuse_unless_last(identity, self.location, None, last)
            return None
        header = self._verified_header(identity, row)
        refuse_unless_last(identity, self.location, header["seq"], last)
        state = pickle.loads(row[2])  # noqa: S301  (only after the signature verified)
        return Checkpoint(identity, header["seq"], state, header["ledger"],
                          header["first_start"], header["created"], header["label"])

    def _verified_header(self, identity: str, row: tuple[Any, ...]) -> dict[str, Any]:
        """The header of a stored checkpoint row, once its format, signature and fields check
        out; else `CheckpointRefused`."""
        where = str(self.path)
        fmt, header_text, payload, tag = row
        if fmt != CHECKPOINT_FORMAT:
            raise CheckpointRefused(identity, where, f"its format {fmt!r} is not "
                                                     f"{CHECKPOINT_FORMAT!r}")
        if not isinstance(tag, bytes) or not isinstance(payload, bytes) or not hmac.compare_digest(
                tag, self._sign(str(header_text).encode(), payload)):
            raise CheckpointRefused(identity, where, "its signature does not match (it was "
                                                     "changed, truncated or signed elsewhere)")
        header: dict[str, Any] = json.loads(header_text)
        missing = [f for f in _HEADER_FIELDS if f not in header]
        if missing:
            raise CheckpointRefused(identity, where, f"it lacks {', '.join(missing)}")
        if header["format"] != CHECKPOINT_FORMAT:
            raise CheckpointRefused(identity, where, f"its header says format "
                                                     f"{header['format']!r}")
        if header["identity"] != identity:
            raise CheckpointRefused(identity, where, f"it was saved for another piece of work "
                                                     f"({header['identity'][:15]}...)")
        return header

    def delete_checkpoint(self, identity: str) -> bool:
        """Remove the checkpoint of *identity*; whether there was one. The store keeps its
        sequence number, so that checkpoint put back later is refused."""
        with self._write() as db:
            db.execute("UPDATE sequences SET live = 0 WHERE identity = ?", (identity,))
            return db.execute("DELETE FROM checkpoints WHERE identity = ?",
                              (identity,)).rowcount > 0

    def _sign(self, header: bytes, *payload: bytes) -> bytes:
        """The tag of a checkpoint: its header, then its payload (given in parts: the same tag
        as the parts joined)."""
        mac = hmac.new(self._secret, CHECKPOINT_FORMAT.encode() + b"\0", hashlib.sha256)
        mac.update(header)
        mac.update(b"\0")
        for part in payload:
            mac.update(part)
        return mac.digest()

    # -- runs per day (S4-12) ---------------------------------------------------------------------
    def take_run(self, identity: str, day: str, quota: int) -> int | None:
        """Count one start of *identity* on *day* (``YYYY-MM-DD``, UTC) if fewer than *quota*
        have started that day, atomically across processes: the number of this start, or
        `None` (nothing counted) when the quota is spent."""
        with self._write() as db:
            row = db.execute("SELECT count FROM runs WHERE identity = ? AND day = ?",
                             (identity, day)).fetchone()
            count = row[0] if row is not None else 0
            if count >= quota:
                return None
            db.execute("INSERT INTO runs VALUES (?, ?, 1) ON CONFLICT(identity, day) "
                       "DO UPDATE SET count = count + 1", (identity, day))
            db.execute("DELETE FROM runs WHERE day < ?", (oldest_kept_day(day),))
            return count + 1

    def runs_on(self, identity: str, day: str) -> int:
        """How many times *identity* started on *day* (UTC)."""
        with self._read() as db:
            row = db.execute("SELECT count FROM runs WHERE identity = ? AND day = ?",
                             (identity, day)).fetchone()
        return int(row[0]) if row is not None else 0

    # -- job records ------------------------------------------------------------------------------
    def record_job(self, job_id: str, identity: str, label: str, state: str,
                   error: str | None = None, *, created: float | None = None,
                   ended: float | None = None) -> None:
        """Insert or update the record of a job of this process, with the job's own times (now,
        when not given): when it was *created* and, once it has, when it *ended* (kept as
        ``updated``), so that every kernel lists it with the times the one that runs it shows."""
        now = time.time()
        created = now if created is None else created
        updated = now if ended is None else ended
        with self._write() as db:
            db.execute(
                "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE "
                "SET state = excluded.state, updated = excluded.updated, error = excluded.error",
                (job_id, identity, label, state, os.getpid(), created, updated, error))

    def jobs(self) -> list[dict[str, Any]]:
        """Every job record, newest first."""
        with self._read() as db:
            cur = db.execute("SELECT id, identity, label, state, pid, created, updated, error "
                             "FROM jobs ORDER BY created DESC")
            names = [d[0] for d in cur.description]
            found = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        if self._read_only:  # told lost here; the store marks them when it can be written
            for rec in found:
                if rec["state"] == "running" and rec["pid"] != os.getpid() and \
                        not _alive(rec["pid"]):
                    rec["state"] = "lost"
        return found

    def mark_lost_jobs(self) -> int:
        """Mark ``lost`` the running jobs whose process has died; how many were marked."""
        with self._read() as db:
            running = db.execute("SELECT id, pid FROM jobs WHERE state = 'running'").fetchall()
        dead = [job_id for job_id, pid in running if pid != os.getpid() and not _alive(pid)]
        if dead:
            with self._write() as db:
                db.executemany("UPDATE jobs SET state = 'lost', updated = ? WHERE id = ? "
                               "AND state = 'running'", [(time.time(), j) for j in dead])
        return len(dead)


class _Parts(list):  # type: ignore[type-arg]
    """A file that keeps what is written to it, in parts (what `_pickled` writes to)."""

    def write(self, data: bytes) -> int:
        self.append(data)
        return len(data)


def _pickled(state: Any) -> list[bytes]:
    """*state* pickled, in parts: a large buffer (the bytes of an array, say) is kept as it
    is, where ``pickle.dumps`` would copy it into its result (twice the memory, and most of
    a large checkpoint's time)."""
    parts = _Parts()
    pickle.Pickler(parts, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return parts


_INSERT = "INSERT OR REPLACE INTO checkpoints (identity, format, header, tag, payload) VALUES "


def _insert_checkpoint(db: sqlite3.Connection, fields: tuple[str, str, str, bytes],
                       parts: list[bytes]) -> None:
    """Store a checkpoint row: *fields*, then the payload pickled in *parts*, written into the
    row in place (SQLite's incremental blob I/O, Python 3.11 and later) where joining them
    would make a copy as large as the state, and SQLite a second one to bind it; each is new
    memory for a large state, most of its save's time after the commit itself. The payload is
    the row's last column, so SQLite keeps the placeholder it is written into unexpanded."""
    if len(parts) < 2 or not hasattr(db, "blobopen"):
        db.execute(_INSERT + "(?, ?, ?, ?, ?)", (*fields, b"".join(parts)))
        return
    row = db.execute(_INSERT + "(?, ?, ?, ?, zeroblob(?))",
                     (*fields, sum(map(len, parts)))).lastrowid
    assert row is not None
    with db.blobopen("checkpoints", "payload", row) as blob:
        for part in parts:
            blob.write(part)


def _payload_last(db: sqlite3.Connection) -> None:
    """A store made when the payload was not the last column of its checkpoints (before
    `_insert_checkpoint` wrote it in place): the table is made again with it last, its rows
    copied as they are, in the transaction that opens the store. Signatures cover the header
    and payload, never the column order, so every checkpoint still verifies."""
    columns = [name for (_, name, *_) in db.execute("PRAGMA table_info(checkpoints)")]
    if columns[-1:] == ["payload"]:
        return
    db.execute("ALTER TABLE checkpoints RENAME TO checkpoints_before")
    db.execute(_SCHEMA.split(";")[0])
    db.execute("INSERT INTO checkpoints (identity, format, header, tag, payload) "
               "SELECT identity, format, header, tag, payload FROM checkpoints_before")
    db.execute("DROP TABLE checkpoints_before")


def refuse_unless_last(identity: str, where: str, seq: int | None,
                       last: tuple[int, int | bool] | None) -> None:
    """S4-5, for every store: refuse (`CheckpointRefused`) the held checkpoint numbered *seq* of
    *identity* (`None`: none is held) unless it is the last one saved for that work and still
    live; *last* is the store's record of that work's last number and whether it is live (not
    deleted since), `None` when it never saved one. *where* names the store."""
    if seq is None:
        if last is not None and last[1]:
            raise CheckpointRefused(identity, where, f"checkpoint {last[0]} of this work was "
                                                     f"saved and is no longer in the store")
        return
    if last is None or seq != last[0] or not last[1]:
        raise CheckpointRefused(identity, where, _not_the_last(seq, last))


def _not_the_last(seq: int, last: tuple[int, int | bool] | None) -> str:
    """Why a signed checkpoint numbered *seq* is not its work's last one saved."""
    if last is None:
        said = f"the store has no record of saving checkpoint {seq} of this work"
    else:
        said = (f"it is checkpoint {seq} of this work, but the last one saved was {last[0]}"
                f"{'' if last[1] else ' and then deleted'}")
    return f"{said} (a checkpoint put back from earlier is never resumed)"


def _seed_sequences(db: sqlite3.Connection) -> None:
    """A store made before it kept sequences: each checkpoint it holds is its work's last (its
    header, checked at load, says which)."""
    for identity, header in db.execute("SELECT identity, header FROM checkpoints").fetchall():
        with suppress(ValueError, KeyError, TypeError):
            db.execute("INSERT INTO sequences VALUES (?, ?, 1)",
                       (identity, int(json.loads(header)["seq"])))


def _switch_to_wal(db: sqlite3.Connection, timeout_s: float) -> None:
    """Put the database of *db* in WAL mode, which the file then keeps. The switch reads the
    file's header and then writes it; two connections switching a new store at once would
    each hold the read while asking for the write, and SQLite answers one of them busy at
    once, without its busy timeout (that wait could never end). Once the other has switched
    there is nothing left to write, so the switch is tried again, after the pauses SQLite's own
    busy handler makes, for at most *timeout_s*."""
    deadline = time.monotonic() + timeout_s
    tries = 0
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            pause = _PAUSES_S[min(tries, len(_PAUSES_S) - 1)]
            if not _busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        tries += 1


#: the pauses between tries of SQLite's busy handler (sqliteDefaultBusyCallback), in seconds
_PAUSES_S = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.025, 0.025, 0.05, 0.05, 0.1)
_SQLITE_BUSY = 5  # SQLite's primary result code for a lock another connection holds
#: SQLite's codes for a database this user cannot write: SQLITE_READONLY, and its extended
#: codes READONLY_CANTLOCK, READONLY_CANTINIT and READONLY_DIRECTORY
_READ_ONLY_CODES = frozenset({8, 8 | 2 << 8, 8 | 5 << 8, 8 | 6 << 8})


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite answered *exc* because another connection holds a lock (``SQLITE_BUSY``,
    or one of its extended codes); Python before 3.11 gives only its message."""
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == _SQLITE_BUSY
    return str(exc) == "database is locked"


def _read_only_error(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite answered *exc* because this user cannot write the database or its folder
    (``SQLITE_READONLY``, or its extended codes for a lock or a ``-shm`` file it cannot make);
    not for a file moved or deleted under the store, nor for a journal to recover."""
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code in _READ_ONLY_CODES
    return str(exc).startswith("attempt to write a readonly database")


def _cannot_write(folder: Path, db_path: Path) -> bool:
    """Whether this user cannot write the store in *folder*: the folder is there and cannot
    take a new file (the journal a write makes), or its database is there and cannot be
    written. (A folder not there yet is made, or fails to be, as a new store is.)"""
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        return True
    return db_path.exists() and not os.access(db_path, os.W_OK)


def _tables_to_read(db: sqlite3.Connection) -> None:
    """On a connection to a read-only store: each table of the store its file lacks (a store
    made by an earlier release, which cannot be brought up to date) is made, empty, in the
    connection's temporary schema, so a read of it finds nothing rather than failing."""
    tables = {name for (name,) in db.execute(_TABLES)}
    for statement in _SCHEMA.split(";"):
        words = statement.split()
        if words[:2] == ["CREATE", "TABLE"] and words[5] not in tables:
            db.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))


def _holder(db_path: Path) -> str | None:
    """The processes that hold a write lock on the database *db_path* (on its WAL index, the
    ``-shm`` file, where a writer takes its lock, or on the file itself), as ``process 4242
    (python train.py)``, read from Linux's ``/proc/locks`` (nothing is opened or locked: a
    file descriptor of the database closed here would drop this process's own SQLite locks);
    `None` where it cannot be told (another system, a process in another PID namespace, a lock
    let go since)."""
    files = set()
    for name in (db_path, db_path.with_name(db_path.name + "-shm")):
        with suppress(OSError):
            st = os.stat(name)
            files.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    pids: list[int] = []
    for line in lines:  # "1: POSIX  ADVISORY  WRITE 4242 fe:00:2163371 120 120"; waiters "->"
        fields = line.split()
        if (len(fields) >= 8 and fields[1] != "->" and fields[3] == "WRITE"
                and fields[5] in files and fields[4].isdigit()):
            pid = int(fields[4])
            if pid > 0 and pid not in pids:
                pids.append(pid)
    return ", ".join(map(_process_named, pids)) or None


def _process_named(pid: int) -> str:
    """``process 4242 (python train.py)``: its pid and, where ``/proc`` tells, its command (on
    one line, at most 60 characters)."""
    if pid == os.getpid():
        return f"this process (pid {pid}, another of its threads)"
    try:
        command = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(
            errors="replace").replace("\0", " ").split())
    except OSError:
        command = ""
    if len(command) > 60:
        command = command[:57] + "..."
    return f"process {pid} ({command})" if command else f"process {pid}"


def _make_private_folders(folder: Path) -> None:
    """Make *folder* and each missing folder above it 0700, whatever the umask; *folder* itself
    is made 0700 even if it was there (the folders above it that were there are left alone)."""
    for made in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
        with suppress(FileExistsError):  # another process made it at the same moment
            made.mkdir(mode=0o700)
        os.chmod(made, 0o700)
    os.chmod(folder, 0o700)


def _chmod_if_there(path: Path, mode: int) -> None:
    with suppress(FileNotFoundError):
        os.chmod(path, mode)


def oldest_kept_day(day: str) -> str:
    """The oldest day (``YYYY-MM-DD``) whose runs-per-day count a store keeps on *day*: older
    counts are dropped."""
    return (datetime.date.fromisoformat(day) - datetime.timedelta(days=KEEP_RUN_DAYS)).isoformat()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
