"""Where a call's work runs, and where its durable records are kept: the job runner and the
store of a call, resolved once per call as its `Backend`.

`JobRunner` is the interface of the runner: start the work, hold the caller until it ends or a
time on the run's clock, detach it under the work's identity, reattach to it by that identity,
and deliver its result once (S0-2, S0-11). A job it runs is a `Job`: cancel, pause and output
are the job's (`Job.cancel`, `Job.pause`, `Job.output`), and the runner's ``jobs`` lists the
detached ones. `LocalRunner` is the local implementation: the pre-started worker threads of
`nbbudget.core.workers` and a map of detached jobs by identity, in this process. A runner on a
cluster (futures published under the work's identity) is another implementation: it settles
the same `Job` when its future ends, and its reattach finds the work from a restarted kernel.

`Backend` pairs a runner with the store (`nbbudget.calls.store.Store`) of the calls that use
it; `current_backend` is the one in force: the one `use_backend` put in force in this context,
else `LOCAL` (this process's threads, and the SQLite store of ``NBBUDGET_HOME``, which is read
when the call first needs its store, as at every call).
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..core import workers
from ..core.clock import default_clock
from .jobs import Job, Jobs
from .store import Store, store

if TYPE_CHECKING:
    from ..core.limits import Limits
    from .store import Checkpoint

__all__ = ["LOCAL", "Backend", "Checkpoints", "DetachedJobs", "JobRunner", "LocalRunner",
           "RemoteCall", "WallClock", "Work", "current_backend", "jobs", "kind_of", "remote_call",
           "use_backend"]


class Work(Protocol):
    """A piece of work as a runner sees it: its identity (worked out only when it is read), the
    call itself, its name and what bounds it, for a runner that runs the work somewhere else
    than the closure it is given (a cluster's). The call path gives every runner method the
    call's plan (frozen, made once per call by `nbbudget.calls.call.call`), on its fast path and
    its general path alike; a runner reads it and never changes it."""

    @property
    def identity(self) -> str: ...

    @property
    def work(self) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str | None]:
        """The function, its positional and keyword arguments, and the call's ``key``."""

    @property
    def label(self) -> str:
        """The work's name, as ``nb.jobs`` shows it."""

    @property
    def limits(self) -> Limits:
        """The run's limits."""

    @property
    def notices(self) -> tuple[float, float] | None:
        """The run's approach-notice thresholds."""

    @property
    def timeout_ms(self) -> int | None:
        """The wall-clock limit of the whole work, across continuations."""

    @property
    def detach(self) -> bool:
        """The work goes on as a job when its caller's budget runs out."""

    @property
    def resume(self) -> bool:
        """The work pauses at its next checkpoint when its caller's budget runs out."""

    @property
    def budget_ms(self) -> int | None:
        """The call's budget (None or 0: none)."""

    @property
    def preempt(self) -> bool:
        """A stop of the work's run interrupts the thread that runs the work (N-5)."""

    @property
    def estimate_ms(self) -> int | None:
        """What the work says it needs (S0-7), or None."""


class Checkpoints(Protocol):
    """A resumable call's checkpoints, for a runner whose work runs elsewhere (S0-2, S4-4):
    *loaded* is the checkpoint the work continues from (None: it starts fresh), and `save`
    keeps a state the work checkpointed, signed in the call's store with *ledger* (the run's
    state as `nb.Budget.state` gives it), as a checkpoint made here is."""

    @property
    def loaded(self) -> Checkpoint | None: ...

    def save(self, state: Any, ledger: dict[str, Any] | None = None) -> Checkpoint: ...


@dataclass(frozen=True)
class WallClock:
    """The wall-clock limit of the whole work (S0-6), for a runner whose work runs elsewhere:
    the time it has left when it starts (a duration: clocks differ between machines) and the
    message its stop says. The call's own timer keeps it too, in this process (the first stop
    of the run wins)."""

    left_ms: float
    message: str


class RemoteCall(Protocol):
    """The call whose work runs in this context on behalf of a kernel elsewhere (a task on a
    cluster's worker): what ``nb.checkpoint`` and ``nb.resume_state`` do there."""

    def checkpoint(self, state: Any) -> None: ...

    def resume_state(self, default: Any) -> Any: ...


#: where a runner that runs work elsewhere puts the call of the work running in this context
remote_call: contextvars.ContextVar[RemoteCall | None] = contextvars.ContextVar(
    "nbbudget_remote_call", default=None)


class JobRunner(Protocol):
    """What the call path needs of the place a call's work runs (S0-1, S0-2, S0-11).

    `start` runs *work* as *task* (a closure that runs it here, settles the call where it runs
    and returns what announces its end); *job* is the call's `Job`, or None for a runner that
    runs its work here (``runs_here``): the usual call makes its job only if it needs one.
    *detachable*: the work may be detached, so the runner keeps room to write its record then;
    *checkpoints*: the work is resumable, and a runner whose work runs elsewhere continues it
    from, and saves its checkpoints through, them (a closure run here has them already);
    *wall_clock*: the whole work's wall-clock limit, which a runner whose work runs elsewhere
    keeps there too, so that it holds without this process (a closure run here is stopped by
    the call's own timer). The runner settles the job (or the call) when the work ends, and the
    caller waits on it (`Job.wait_woken`). `detach` keeps a job that outlived its caller's
    budget under its work's identity and lists it in ``jobs``; `reattach` finds it for the
    identical call, and gives an ended job to exactly one caller; `deliver` forgets it once its
    result went out, so the next identical call starts anew.
    A runner whose work runs in another process says so with ``runs_here = False``: the call
    then never runs the work in place, even when nothing can end its wait early.
    """

    jobs: Jobs
    runs_here: bool

    def start(self, work: Work, job: Job | None, task: workers.Task, *, detachable: bool,
              checkpoints: Checkpoints | None = None,
              wall_clock: WallClock | None = None) -> None: ...

    def detach(self, work: Work, job: Job) -> None: ...

    def reattach(self, work: Work) -> Job | None: ...

    def deliver(self, work: Work, job: Job) -> None: ...


class DetachedJobs:
    """The detached jobs of a runner, kept by identity in this process for the identical call
    until their result is delivered (S0-2, S0-11). Every caller waiting on a job when it ends
    gets its result; once it has ended, exactly one identical call takes it, and the next one
    starts anew. A job whose result was taken through ``nb.jobs[id]`` waits for that call only
    while something still holds it (the response, a variable): nothing keeps it alive for a
    call that never comes. `LocalRunner` holds one; so does a runner on a cluster (a backend's,
    `nbbudget.backends`), which keeps its jobs on the scheduler too."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self._attached: dict[str, Job] = {}  # detached work by identity, until delivered
        self._taken: dict[str, weakref.ref[Job]] = {}  # its result read: kept while held
        self._lock = threading.RLock()  # a job freed while it is held calls `_gone` at once
        # the kinds of work kept (`kind_of`), each with how many identities: a call of a kind
        # none is kept under works out no identity (most calls, even while a job is kept)
        self._kinds: dict[object, int] = {}
        self._kind_of: dict[str, object] = {}

    def keep(self, work: Work, job: Job, taken_out: Callable[[str, Job], None]) -> None:
        """*job* goes on as a background job (S0-2): listed in ``jobs`` and kept by *work*'s
        identity. Its record is written off the caller's path, so a busy store never delays
        the caller. *taken_out* (the runner's) is called when its result is taken through
        ``nb.jobs[id]``."""
        job.detached = True
        self.jobs.add(job)
        # written by a worker, handed the job from the clock's timer thread a moment later:
        # a handoff lets go of the GIL (`workers.submit`), and the work going on would take it
        # then, for a whole switch interval, before its caller could answer; and a job that
        # ends within the moment is recorded once, as it ended (`Job.notify_done`)
        clock, held = default_clock(), weakref.ref(job)  # (the timer does not keep it alive)
        clock.call_at(clock.now_ms() + RECORD_AFTER_MS, lambda: _record_running(held))
        identity = work.identity
        with self._lock:
            self._attached[identity] = job
            if identity not in self._kind_of:
                kind = self._kind_of[identity] = kind_of(work)
                self._kinds[kind] = self._kinds.get(kind, 0) + 1
        job.on_collect(lambda: taken_out(identity, job))

    def find(self, work: Work) -> Job | None:
        """The job kept for *work*'s identity, if any; an ended one goes to this caller alone
        (it is forgotten here)."""
        if not self._attached and not self._taken:  # no need to work out the identity
            return None
        kind = kind_of(work)
        if kind is not None and kind not in self._kinds:  # nothing of its kind is kept
            return None
        identity = work.identity
        with self._lock:
            job = self._attached.get(identity)
            if job is None and identity in self._taken:
                job = self._taken[identity]()
            if job is not None and job.done():  # its result goes to this caller alone
                self._drop(identity, job)
            return job

    def delivered(self, work: Work, job: Job) -> None:
        """*job*'s result went out to its caller: a detached one is forgotten."""
        if job.detached:
            job.on_collect(None)
            with self._lock:
                self._drop(work.identity, job)
            self.jobs.collected(job)

    def count(self) -> int:
        """How many detached jobs are kept by identity for the identical call."""
        with self._lock:
            return len(self._attached) + len(self._taken)

    def taken_out(self, identity: str, job: Job) -> None:
        """*job*'s result was taken through ``nb.jobs[id]``: from now on it is kept for the
        identical call only while something else holds it."""
        with self._lock:
            if self._attached.get(identity) is job:
                self._attached.pop(identity, None)
                self._taken[identity] = weakref.ref(job, lambda ref: self._gone(identity, ref))
        self.jobs.collected(job)

    def _gone(self, identity: str, ref: weakref.ref[Job]) -> None:
        """A job whose result was read is no longer held by anything: forget it."""
        with self._lock:
            if self._taken.get(identity) is ref:
                self._taken.pop(identity, None)
                self._forget(identity)

    def _drop(self, identity: str, job: Job) -> None:
        """Forget *job* by *identity* (lock held)."""
        if self._attached.get(identity) is job:
            del self._attached[identity]
        taken = self._taken.get(identity)
        if taken is not None and taken() in (job, None):
            self._taken.pop(identity, None)
        self._forget(identity)

    def _forget(self, identity: str) -> None:
        """*identity* may be kept no more (lock held): once it is not, its kind counts one
        less."""
        if identity in self._attached or identity in self._taken:
            return
        kind = self._kind_of.pop(identity, _NOT_KEPT)
        if kind is _NOT_KEPT:
            return
        left = self._kinds[kind] - 1
        if left:
            self._kinds[kind] = left
        else:
            del self._kinds[kind]


class LocalRunner:
    """The local `JobRunner`: work runs on this process's worker threads, and detached jobs are
    kept by identity in memory until their result is delivered (its `DetachedJobs`: lost with
    the process, as the threads are)."""

    #: the work runs in this process: a call that nothing can end early runs it in place, in
    #: its caller's thread (a runner whose work runs elsewhere says False)
    runs_here = True

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.detached = DetachedJobs(jobs)

    def start(self, work: Work, job: Job | None, task: workers.Task, *, detachable: bool,
              checkpoints: Checkpoints | None = None,
              wall_clock: WallClock | None = None) -> None:
        """Run *task* on a worker thread (one idle kept to write the job record if it
        detaches)."""
        workers.submit(task, spare=1 if detachable else 0)

    def detach(self, work: Work, job: Job) -> None:
        """The work goes on as a background job (S0-2), kept by its identity."""
        self.detached.keep(work, job, self.taken_out)

    def reattach(self, work: Work) -> Job | None:
        """The detached job of the identical work, if one is kept (S0-11)."""
        return self.detached.find(work)

    def deliver(self, work: Work, job: Job) -> None:
        """*job*'s result went out: a detached one is forgotten."""
        self.detached.delivered(work, job)

    def attached(self) -> int:
        """How many detached jobs are kept by identity for the identical call."""
        return self.detached.count()

    def taken_out(self, identity: str, job: Job) -> None:
        """*job*'s result was taken through ``nb.jobs[id]``: from now on it is kept for the
        identical call only while something else holds it."""
        self.detached.taken_out(identity, job)


_NOT_KEPT = object()

#: how long after a job detached its record says it is running (it says how it ended, after)
RECORD_AFTER_MS = 100


def _record_running(held: weakref.ref[Job]) -> None:
    """On the clock's timer thread: have a worker write the record of the job *held*, if it
    is still running (one nothing holds any more has ended: its work held it)."""
    job = held()
    if job is not None and not job.done():
        workers.submit(job.record)


def kind_of(work: Work) -> object:
    """What a call's identity is certain to share with every identical call's, and cheap to
    tell: its ``key``, or its function's module and qualified name (a function defined again
    by a re-run cell keeps them); None for a callable without a name (each such call works
    out its identity)."""
    fn, _, _, key = work.work
    if key is not None:
        return ("key", key)
    name = getattr(fn, "__qualname__", None)
    return None if name is None else (getattr(fn, "__module__", None), name)


@dataclass(frozen=True)
class Backend:
    """Where the calls that use it run (*runner*) and keep their durable records: *store* opens
    the store when a call first needs it (a call that needs none opens none)."""

    runner: JobRunner
    store: Callable[[], Store]


def _records() -> list[dict[str, Any]]:
    return current_backend().store().jobs()


#: the background jobs of this process (``nb.jobs``), with the records of the store in force
jobs = Jobs(_records)
#: this process's worker threads, and the SQLite store of ``NBBUDGET_HOME``
LOCAL = Backend(LocalRunner(jobs), store)
_backend: contextvars.ContextVar[Backend] = contextvars.ContextVar("nbbudget_backend",
                                                                   default=LOCAL)


def current_backend() -> Backend:
    """The backend of the calls made now, in this context: `LOCAL` unless `use_backend` put
    another in force."""
    return _backend.get()


@contextmanager
def use_backend(backend: Backend) -> Iterator[Backend]:
    """Within the block, calls made in this context (and the work they run, which inherits it)
    use *backend*: ``with use_backend(Backend(LOCAL.runner, lambda: memory)):``. A thread
    started in the block has a context of its own, as with every context variable, unless it
    runs in a copy of this one (``contextvars.copy_context().run``)."""
    token = _backend.set(backend)
    try:
        yield backend
    finally:
        _backend.reset(token)
