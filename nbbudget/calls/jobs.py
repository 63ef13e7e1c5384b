"""Background jobs: work that outlived its caller's budget (S0-2, S0-11).

``nb.jobs`` lists them: ``nb.jobs[id]`` is a `Job` of this process (one whose result went out
stays listed while something else holds it); ``nb.jobs.to_frame()`` adds
the records of other kernels sharing the store (a job whose kernel died is ``lost``). The job
runner that starts, detaches and reattaches them is `nbbudget.calls.runner`.
"""

from __future__ import annotations

import enum
import itertools
import os
import sqlite3
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..core.clock import Latch
from ..core.errors import ConfigError
from ..run.budget import Deferred
from .store import StoreBusy

if TYPE_CHECKING:
    import pandas as pd

    from ..core.clock import Clock, Scheduled
    from ..run.budget import Budget
    from .store import Store

__all__ = ["Job", "JobState", "Jobs"]


class JobState(str, enum.Enum):
    """Where a job is, in the words every listing of jobs uses (``nb.jobs``, ``%budget jobs``,
    ``nbbudget jobs``): ``starting`` (a notebook run whose kernel is starting, or a call whose
    work waits for its cluster to be connected), ``running``, ``paused`` (a notebook run of
    ``--resume`` waiting at a cell boundary for the identical command), then ``done``,
    ``failed``, ``cancelled`` (stopped by a person or by its wall-clock limit) or ``lost`` (what
    ran it died)."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"

    def __str__(self) -> str:
        return self.value

    @property
    def final(self) -> bool:
        """Whether the job has ended."""
        return self not in (JobState.STARTING, JobState.RUNNING, JobState.PAUSED)


_ids = itertools.count(1)
_RECORD_TRIES = 3


class Job:
    """One piece of work running (or run) on a worker thread.

    Python threads cannot be killed: `cancel` asks the work to stop at its next budget check
    (``run.step()``, ``run.check()``, a tool call, ``nb.checkpoint``), and the job stays
    ``running`` until the work ends. Work that reaches a check stops there: the job settles
    ``cancelled`` and `cancel_status` is ``"stopped"``. Work that never reaches one runs to its
    end: the job settles ``done`` (or ``failed``) with its result (or its error) kept, and
    `cancel_status` is ``"not honoured"``.

    The methods under "for the runner" are what a job runner (`nbbudget.calls.runner`) and the
    call path use: settle and announce the end, arm the wall clock, ask for a pause.
    """

    # what most jobs never change, read from the class until set
    ended: float | None = None
    traceback: str | None = None
    detached = False
    paused = False  # the work stopped at a checkpoint (a resumable call)
    #: when `cancel` was first asked (``time.time()``), or None
    cancel_requested: float | None = None
    #: after a cancel of its run: True when the work stopped at a budget check, False when
    #: it ended anyway; None before the work ends, or when no cancel was in force
    cancel_honoured: bool | None = None
    #: when its work last said it is alive (``time.time()`` here), for work that runs in
    #: another process (a task on a cluster); None when nothing has said so
    last_heartbeat: float | None = None
    _value: Any = None
    _error: BaseException | None = None
    _collected: Callable[[], None] | None = None  # its runner's, once detached
    _timers: tuple[Scheduled, ...] | list[Scheduled] = ()
    _pause = False
    _pause_at: float | None = None

    def __init__(self, identity: Callable[[], str], label: str, run: Budget | Deferred,
                 store: Callable[[], Store], *, done: Latch | None = None,
                 starting: bool = False) -> None:
        self._identity = identity
        self.label = label
        self._run = run  # a `Deferred` is made when first used
        self.created = time.time()
        self._store = store  # opened when the job is first recorded, off the caller's path
        self._state = JobState.STARTING if starting else JobState.RUNNING
        #: set when it ends (*done*: the latch its caller already waits on); its waiters look
        #: again when it is set (and when it is nudged, `add_timer`)
        self._done = self._wake = done if done is not None else Latch()
        self.output: list[str] = []

    @property
    def run(self) -> Budget:
        """The job's run (made now if its work never used it)."""
        run = self._run
        if isinstance(run, Deferred):
            return run.run
        return run

    def use_run(self, run: Budget) -> None:
        """For a runner whose work runs elsewhere: *run* (a run on a cluster's ledger, begun)
        is the run the work charges there, in place of the one the call made for it. Given
        when the work starts, before anything has used the job's run."""
        self._run = run

    def run_made(self) -> Budget | None:
        """The job's run if anything has used it, else None (nothing to look at)."""
        run = self._run
        if isinstance(run, Deferred):
            return run.made()
        return run

    def note(self, kind: str, payload: dict[str, Any]) -> None:
        """Add an event of *kind* to the job's run's trace, stamped with the time now, without
        making a run its work never used (`Deferred.note`: traced if the run is ever made). The
        call path says so when the job detaches (``detached``), which leaves the run unmade."""
        run = self._run
        if isinstance(run, Deferred):
            run.note(kind, payload)
        else:
            run.lowlevel.record(kind, payload)

    @property
    def held_run(self) -> Budget | Deferred:
        """What the work runs in: its run, or the `Deferred` that makes it on first use."""
        return self._run

    @property
    def id(self) -> str:
        """The job's id, as ``nb.jobs[id]`` takes it: this process's, then a count."""
        made: str | None = self.__dict__.get("_id")
        if made is None:  # the first thread to ask sets it: setdefault is atomic
            made = self.__dict__.setdefault("_id", f"{os.getpid():x}-{next(_ids)}")
        return made

    @property
    def identity(self) -> str:
        """The work this job does (worked out when first needed)."""
        return self._identity()

    @property
    def output_text(self) -> str:
        """Everything the job printed (kept for drivers that drop late output)."""
        return "".join(self.output)

    # -- for the runner -------------------------------------------------------------------------
    def settle(self, state: JobState, value: Any = None, error: BaseException | None = None,
               *, honoured: bool | None = None) -> None:
        """Keep how the work ended (where it ran, before anyone is told), and, when a cancel
        was in force, whether the work *honoured* it."""
        self._value, self._error = value, error
        self.cancel_honoured = honoured
        if error is not None:
            self.traceback = "".join(traceback.format_exception(error))
        self._state = state
        self.ended = time.time()

    def started(self) -> None:
        """The work of a job made *starting* was handed to where it runs: it is running."""
        if self._state is JobState.STARTING:
            self._state = JobState.RUNNING

    def notify_done(self) -> None:
        """Once settled: tell the store (if the job was detached), then its waiters, that the
        job ended."""
        if self.detached:
            self.record()
        self._done.set()
        if self._wake is not self._done:
            self._wake.set()

    def nudge(self) -> None:
        """Wake the job's waiters to look at its run again: its wall clock (`add_timer`)
        cancelled it, which frees them for good (a wake-up stays: every later wait returns at
        once)."""
        assert self._wake is not self._done, "a job is nudged by a timer it was given"
        self._wake.set()

    def wait_woken(self, clock: Clock, until_ms: float | None) -> bool:
        """Wait until the job ends or is nudged, or *clock* reaches *until_ms* (None: no
        limit); whether it was woken."""
        return clock.wait(self._wake, until_ms)

    def add_timer(self, timer: Scheduled) -> None:
        """*timer* (the wall clock of the work) matters only while the job runs. Given before
        the work starts; from then on `nudge` (the timer firing) also wakes the job's
        waiters."""
        if self._wake is self._done:
            self._wake = Latch()
        if not isinstance(self._timers, list):
            self._timers = []
        self._timers.append(timer)

    def cancel_timers(self) -> None:
        """The work has ended, or its result went out: its timers no longer matter."""
        for timer in self._timers:
            timer.cancel()

    def on_collect(self, fn: Callable[[], None] | None) -> None:
        """Call *fn* once, when the job's result (or error) first goes out through `result`:
        its runner forgets it then, so the next identical call starts anew (S0-11)."""
        self._collected = fn

    def pause(self, at_ms: float | None = None) -> None:
        """Ask resumable work to stop at its next checkpoint (S0-1, S0-2): now, or once its
        run's clock reaches *at_ms* (its caller's budget ran out then). Work that did not
        declare ``resume`` never pauses."""
        if at_ms is None:
            self._pause = True
        else:
            self._pause_at = at_ms

    def pause_due(self, now_ms: float) -> bool:
        """Whether the work should stop at the checkpoint it reached at *now_ms*."""
        return self._pause or (self._pause_at is not None and now_ms >= self._pause_at)

    def record(self) -> None:
        """Write the job's current state to the store (the latest write always holds the
        latest state: the state is read under the same lock as the write). A store locked by
        another process past its busy timeout is tried again a few times, then reported."""
        lock = self.__dict__.get("_record_lock")
        if lock is None:  # made by the first thread to write a record: setdefault is atomic
            lock = self.__dict__.setdefault("_record_lock", threading.Lock())
        with lock:
            for attempt in range(_RECORD_TRIES):
                try:
                    self._store().record_job(self.id, self.identity, self.label,
                                             self._state.value, self.traceback,
                                             created=self.created, ended=self.ended)
                    return
                except (StoreBusy, sqlite3.OperationalError) as exc:  # a full disk may clear
                    if attempt == _RECORD_TRIES - 1:
                        self._unrecorded(exc)
                        return
                    time.sleep(1.0)
                except ConfigError as exc:  # the store cannot be used (damaged): no retry helps
                    self._unrecorded(exc)
                    return

    def _unrecorded(self, why: Exception) -> None:
        """Say that the job's record could not be written; the job itself goes on here."""
        warnings.warn(f"nbbudget could not record job {self.id} ({self._state.value}) in its "
                      f"store: {why}; the job goes on in this process (nb.jobs[{self.id!r}])",
                      RuntimeWarning, stacklevel=2)

    # -- public -------------------------------------------------------------------------------
    @property
    def state(self) -> JobState:
        return self._state

    def done(self) -> bool:
        return self._done.is_set()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait until the job ends, at most *timeout* seconds; whether it ended."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The job's value once it ends. A failed job raises its exception (its traceback is in
        ``job.traceback``); a cancelled one raises `nb.Cancelled`; `TimeoutError` if it has not
        ended within *timeout* seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.id} ({self.label}) is still running after "
                               f"{timeout} s; wait longer or call .cancel()")
        collected, self._collected = self._collected, None
        if collected is not None:
            collected()
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self) -> BaseException | None:
        """The exception the job ended with, if any (does not wait)."""
        return self._error

    @property
    def cancel_status(self) -> str | None:
        """What became of a cancel: ``"requested"`` (the work has not reached a budget check
        yet), ``"stopped"`` (it stopped at one), ``"not honoured"`` (it ended without reaching
        one); None when no cancel was asked."""
        if self.cancel_honoured is not None:
            return "stopped" if self.cancel_honoured else "not honoured"
        if self.cancel_requested is None:
            return None
        return "not honoured" if self.done() else "requested"

    def cancel(self, reason: Any = "cancelled from nb.jobs", *, wait: float = 0.0) -> str | None:
        """Ask the work to stop at its next budget check; idempotent. Waits at most *wait*
        seconds for the work to end, then returns `cancel_status`: ``"stopped"``,
        ``"requested"`` (it is still running), ``"not honoured"`` (it ended anyway), or None
        when the job had already ended (there was nothing to stop)."""
        if not self.done():
            if self.cancel_requested is None:
                self.cancel_requested = time.time()
            self.run.cancel(reason)
            self._done.wait(wait)
        return self.cancel_status

    def __repr__(self) -> str:
        cancel = f", cancel {self.cancel_status}" if self.cancel_status else ""
        return f"<Job {self.id} {self.label!r} {self._state.value}{cancel}>"


class Jobs:
    """The background jobs of this process, by id: ``nb.jobs[id]``, ``list(nb.jobs)``.

    *records* gives the store's job records (every kernel's that shares it), for `to_frame`.
    """

    def __init__(self, records: Callable[[], list[dict[str, Any]]]) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}  # their result has not gone out yet
        self._collected: weakref.WeakValueDictionary[str, Job] = weakref.WeakValueDictionary()
        self.records = records
        self._elsewhere: list[weakref.WeakMethod[Callable[[], list[dict[str, Any]]]]] = []

    def list_elsewhere(self, source: Callable[[], list[dict[str, Any]]]) -> None:
        """`to_frame` also lists the records *source* (a bound method: while its object lives)
        gives, ahead of the store's: the jobs a cluster keeps for any kernel."""
        with self._lock:
            self._elsewhere.append(weakref.WeakMethod(source))

    def all_records(self) -> list[dict[str, Any]]:
        """The records of jobs not in this process: those kept elsewhere, then the store's."""
        with self._lock:
            self._elsewhere = [ref for ref in self._elsewhere if ref() is not None]
            sources = [ref() for ref in self._elsewhere]
        found = [rec for source in sources if source is not None for rec in source()]
        return [*found, *self.records()]

    def add(self, job: Job) -> None:
        """List *job* here (its runner detached it)."""
        with self._lock:
            self._jobs[job.id] = job

    def collected(self, job: Job) -> None:
        """*job*'s result went out: it stays listed while something else holds it (a response,
        a variable), and its record stays in the store."""
        with self._lock:
            if self._jobs.pop(job.id, None) is not None:
                self._collected[job.id] = job

    def __getitem__(self, job_id: str) -> Job:
        with self._lock:
            found = self._jobs.get(job_id) or self._collected.get(job_id)
        if found is None:
            known = ", ".join(j.id for j in self) or "none"
            raise KeyError(f"no job {job_id!r} in this process (jobs here: {known}); "
                           f"nb.jobs.to_frame() also lists the store's records")
        return found

    def __iter__(self) -> Iterator[Job]:
        with self._lock:
            listed = {**self._collected, **self._jobs}
        return iter(sorted(listed.values(), key=lambda job: job.created))

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs) + len(self._collected)

    def running(self) -> list[Job]:
        return [j for j in self if j.state is JobState.RUNNING]

    def to_frame(self) -> pd.DataFrame:
        """Every job, this process's and the store's records, as a pandas DataFrame."""
        from .jobs_frame import jobs_frame

        return jobs_frame(self)
