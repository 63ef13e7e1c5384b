"""Call budgets (seed 000): a call holds its caller for at most its budget, then the work detaches
to a background job or pauses at its next checkpoint, and the caller gets INCOMPLETE (exit 14).

Rules: S0-1..S0-12, S4-4, S4-5, S4-7. The identity of an invocation is the work itself (the
function and its arguments, or ``key``), never the budget or the timeout (S0-11).

A call is planned, in `call`, into a `_Plan`: frozen, what it was asked to do, checked. The plan
is what every later step carries: the job runner is given it as the call's `Work`, the answer
reads its budget from it. Each start of the work is a `_Call` over the plan: what the work
sees of its call, and where its worker hands over how it ended. The usual call (one that may
detach, with nothing to load or count first) takes a fast path (`_run_direct`), tuned in one
place; every other takes the general one (`_run`, `_start`).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import os
import pickle
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..core import preempt as _preempt
from ..core.clock import Clock, Latch, default_clock
from ..core.duration import flag_duration, parse_duration
from ..core.endings import ENDINGS, envelope_code
from ..core.errors import (
    Cancelled,
    ClusterUnanswered,
    ConfigError,
    RunsPerDayExceeded,
)
from ..core.limits import NO_LIMITS as _NO_LIMITS
from ..core.limits import Limits, Manifest
from ..core.lowlevel import Incomplete, Stop
from ..core.outcome import Status
from ..run.budget import DEFAULT_NOTICES, Budget, Deferred, check_notices, set_ambient
from .clusters import load_calls
from .interactive import is_interactive
from .jobs import Job, JobState
from .response import (
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    Response,
    meta,
)
from .runner import LOCAL, Backend, JobRunner, WallClock, current_backend, jobs, remote_call
from .store import Checkpoint, CheckpointRefused, Store, StoreBusy, StoreDamaged

__all__ = ["CALL_SPELLING", "DEFAULT_BUDGET_MS", "ENV_BUDGET", "FLAG_SPELLING", "Spelling", "call",
           "check_interruption", "checkpoint", "current_call", "resume_state"]

DEFAULT_BUDGET_MS = 30_000
ENV_BUDGET = "AGENT_CALL_BUDGET_MS"

_current_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "nbbudget_call", default=None)


class _Pause(Incomplete):
    """Unwinds work that reached a checkpoint after its call budget ran out (S0-1, S0-2)."""

    def __init__(self, saved: Checkpoint) -> None:
        super().__init__("paused at a checkpoint")
        self.saved = saved


# -- the plan -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, eq=False)
class _Plan:
    """What a call was asked to do, checked: the work, how it may end before the work does,
    and what bounds it. `call` makes it (`_planned`), in one place, from what it was given;
    the fast path and the general path both carry it, and a job runner is given it as the
    call's `Work` (`nbbudget.calls.runner`). Frozen: it is shared by every thread that looks
    at the call (the caller, the worker, the clock's timer, the thread that connects to a
    cluster). Two plans are two calls, equal only to themselves (``eq=False``)."""

    work: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str | None]
    """The function, its positional and keyword arguments, and ``key`` (None, or a non-empty
    string), as `call` was given them."""
    label: str
    """The work's name, as ``nb.jobs`` shows it: the function's ``__nbbudget_label__``, else
    ``key``, else its qualified name."""
    detach: bool
    """The work goes on as a job when the call budget runs out (S0-2). Never with `resume`."""
    resume: bool
    """The work stops at its next checkpoint when the call budget runs out, and the identical
    call continues it (S0-2, S4-4). Never with `detach`."""
    budget_ms: int | None
    """The call budget: how long the caller is held at most (S0-1, S0-3); 0 or None: the
    caller waits for the work (S0-4, S0-5). Positive only with `detach` or `resume` (S0-10)."""
    timeout_ms: int | None
    """The wall-clock limit of the whole work, across every continuation (S0-6): positive, or
    None for none."""
    estimate_ms: int | None
    """What the work says it needs (S0-7): more than `budget_ms` hands it off at once."""
    limits: Limits
    """What the work may spend, as a run (its manifest's limits included)."""
    envelope_bytes: int | None
    """The largest answer the manifest allows, or None."""
    notices: tuple[float, float] | None
    """The run's approach-notice thresholds (S3-5), or None for none."""
    runs_per_day: int | None
    """How many times a day (UTC) the work may start (S4-12), or None for no quota."""
    preempt: bool
    """A stop of the work's run interrupts the thread the work runs on (N-5); False: the work
    stops only at its budget checks."""
    found: list[str]
    """The work's identity once `identity_of` has worked it out (one item; empty before): the
    only thing about a plan found out after it is made, once (two threads that ask at once
    work out the same string)."""

    @property
    def identity(self) -> str:
        """The work's identity (S0-11), worked out when first read: `identity_of`."""
        return self.identity_of()

    def identity_of(self) -> str:
        """The work's identity, worked out the first time something asks (to reattach, to
        detach, or to resume) and kept in `found`: most calls never ask. A `Job` is given it
        as what says, when asked, which work the job does."""
        found = self.found
        if not found:
            found.append(_identity(*self.work))
        return found[0]


class _Draft:
    """A plan while `_planned` writes it: the same slots as `_Plan`, not frozen."""

    __slots__ = _Plan.__slots__


def _planned(work: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str | None],
             label: str, detach: bool, resume: bool, budget_ms: int | None,
             timeout_ms: int | None, estimate_ms: int | None, limits: Limits,
             envelope_bytes: int | None, notices: tuple[float, float] | None,
             runs_per_day: int | None, preempt: bool) -> _Plan:
    """A `_Plan` of these fields, in their order: what `call` makes every call into.

    The hot path, tuned (every call makes a plan): the fields are written into a `_Draft`,
    which has the plan's slots, and the draft then becomes the plan (a ``__class__`` of the same
    layout, as `importlib.util.LazyLoader` turns its module into a plain one), frozen from then
    on. The ``__init__`` a frozen dataclass makes calls ``object.__setattr__`` once a field:
    about 18,000 machine instructions a plan, where this takes about 4,000 (counted under
    valgrind).
    """
    draft: Any = object.__new__(_Draft)  # (Any: the types are the parameters' above)
    draft.work = work
    draft.label = label
    draft.detach = detach
    draft.resume = resume
    draft.budget_ms = budget_ms
    draft.timeout_ms = timeout_ms
    draft.estimate_ms = estimate_ms
    draft.limits = limits
    draft.envelope_bytes = envelope_bytes
    draft.notices = notices
    draft.runs_per_day = runs_per_day
    draft.preempt = preempt
    draft.found = []
    draft.__class__ = _Plan  # frozen from here on
    plan: _Plan = draft
    return plan


# -- one start of the work ----------------------------------------------------------------------
#: a result not handed over yet
_PENDING: Any = object()
#: makes a call's job once, whichever thread asks first, and settles it once
_MAKING = threading.Lock()


class _Call:
    """One start of the work of a plan: what the work sees of its call (`current_call`,
    `checkpoint`, `resume_state`), and where its worker hands over how the work ended
    (`returned`, else `_ended_early` on its `job`). Made by the call path for each start, on
    the fast path and the general path alike.

    Its `Job` is made only when something needs one: the budget ran out and the work goes on
    (S0-2), the work failed or was cancelled, its runner runs it elsewhere, the general path
    waits on it, or the work, its panel or the response asks for it. Work that ends in time
    with a value, on the fast path, makes none: its worker keeps the value in `value` and sets
    `ended`, which the caller waits on."""

    __slots__ = ("ended", "first_start", "held", "loaded", "made_job", "plan", "records",
                 "store", "value")

    def __init__(self, plan: _Plan, held: Budget | Deferred, records: Callable[[], Store],
                 job: Job | None, store: Store | None, loaded: Checkpoint | None,
                 first_start: float | None) -> None:
        self.plan = plan
        #: what the work runs in: its run, or the `Deferred` that makes it on first use (a job
        #: made for the call is given the same)
        self.held = held
        #: opens the store the job's record is written to, if it detaches (its backend's)
        self.records = records
        #: the call's job once made (given, for a call answered ``starting`` before it ran)
        self.made_job = job
        #: a resumable call's store, opened, where its checkpoints go; else None
        self.store = store
        #: the checkpoint the work continues from (S4-4), or None: it starts fresh
        self.loaded = loaded
        #: when the work first started (``time.time()``), across continuations: what its
        #: wall-clock limit counts from (S0-6) and what its checkpoints keep; None on the fast
        #: path, which has neither
        self.first_start = first_start
        #: what the work returned, once it has (`_PENDING` before)
        self.value: Any = _PENDING
        #: set when the work ends: the caller's wait, and its job's once made
        self.ended = Latch()

    @property
    def job(self) -> Job:
        """The call's job, made now if nothing has made it (settled, if the work returned)."""
        job = self.made_job
        if job is not None:
            return job
        with _MAKING:
            job = self.made_job
            if job is None:
                plan = self.plan
                job = self.made_job = Job(plan.identity_of, plan.label, self.held, self.records,
                                          done=self.ended)
                if self.value is not _PENDING:  # the work returned before anyone asked
                    job.settle(JobState.DONE, value=self.value)
        return job

    def make_job(self) -> Job:
        """`job`, as a method: what the response is given to make it when first read."""
        return self.job

    @property
    def run(self) -> Budget:
        """The work's run (made now if nothing has used it): its job's, once there is a job
        (a runner whose work runs elsewhere gives the job the run it charges there)."""
        job = self.made_job
        if job is not None:
            return job.run
        held = self.held
        return held.run if isinstance(held, Deferred) else held

    def returned(self, value: Any) -> Callable[[], None]:
        """The work returned *value*: keep it for the caller, or settle the job if one was
        made; what tells the waiters (run once the worker is free again)."""
        self.value = value  # written before the job is read: a maker after this settles it
        job = self.made_job
        if job is None:
            return self.ended.releaser()
        with _MAKING:
            if job.ended is None:  # its maker did not see the value
                job.settle(JobState.DONE, value=value)
        job.cancel_timers()  # the work has ended: its wall clock no longer matters
        return job.notify_done

    def save(self, state: Any, ledger: dict[str, Any] | None = None) -> Checkpoint:
        """Keep *state* durably (signed, atomically) with the run's counters and active time
        (*ledger*, else the run's state now), as the work's checkpoint: for `checkpoint`, and
        for a runner whose work runs elsewhere and ships its checkpoints here
        (`nbbudget.calls.runner.Checkpoints`)."""
        assert self.store is not None and self.first_start is not None, (
            "only a resumable call saves checkpoints")
        plan = self.plan
        ledger = self.run.state() if ledger is None else ledger
        saved = self.store.save_checkpoint(plan.identity, state, ledger=ledger,
                                           first_start=self.first_start, label=plan.label)
        self.run.lowlevel.record("checkpoint_saved", {"checkpoint": saved.id})
        return saved


# -- planning and running -----------------------------------------------------------------------
def call(fn: Callable[..., Any], *args: Any, detach: bool = False, resume: bool = False,
         budget: int | str | None = None, timeout: int | str | None = None,
         key: str | None = None, estimate_ms: int | str | None = None,
         limits: Limits | None = None, manifest: str | os.PathLike[str] | Manifest | None = None,
         clock: Clock | None = None, notices: tuple[float, float] | None = DEFAULT_NOTICES,
         runs_per_day: int | None = None, cluster: Any = None, preempt: bool = True,
         **kwargs: Any) -> Response:
    """Run ``fn(*args, **kwargs)`` under a call budget and answer with a `Response`.

    A call that declares interruption (``detach=True`` or ``resume=True``) holds its caller at
    most its budget: ``budget=`` first, then ``AGENT_CALL_BUDGET_MS``, then 30 s (S0-3); ``0``
    turns it off (S0-4); a person working interactively gets no default budget (S0-5). When it
    runs out, ``detach`` leaves the work running as a job in ``nb.jobs``, and ``resume`` stops it
    at its next `checkpoint`; either way the response is INCOMPLETE (exit code 14) and says how
    to continue: make the identical call again (S0-11). ``timeout=`` bounds the whole work,
    across every continuation (S0-6). ``estimate_ms=`` lets a call that knows it cannot finish in
    time hand off at once (S0-7). ``limits=`` and ``manifest=`` bound the work as a run, and
    ``notices=`` sets its approach-notice thresholds (S3-5). ``runs_per_day=`` is a quota of
    starts of this work (by identity: ``key``, or the function and its arguments) per calendar
    day, UTC, kept in the store across kernel restarts; a continuation is not a new start, and a
    start over the quota fails with the code ``RunsPerDayExceeded`` and runs nothing (S4-12).
    ``cluster=`` (a ``distributed.Client`` or a scheduler address; in IPython,
    ``NBBudget.cluster`` when not given) runs the work as a task on that Dask cluster, where a
    detached one survives the kernel; a cluster named by its address that is not connected
    within the budget answers INCOMPLETE, state ``starting``, and the work goes there once it
    is (a resumable call answers ``cluster_unanswered``: call again); ``cluster=False`` keeps it
    here whatever the default. ``preempt=True`` (the default): the run's time, the wall clock
    and a cancel interrupt the work even where it never calls nbbudget (N-5); ``False`` stops
    it only at its budget checks, for work that must not be interrupted mid-way.

    Keyword arguments with the names above are nbbudget's (pass such arguments to *fn* with
    `functools.partial`). The work runs, and its records are kept, on the backend in force.
    """
    started = time.monotonic()
    clock = clock if clock is not None else default_clock()
    t0_ms = clock.now_ms()  # the call budget counts from the call, store work included
    work = (fn, args, kwargs, key)
    # -- the usual call, tuned: one that may detach, with nothing to load or count before it
    # starts (no checkpoint, no quota), no wall clock and no manifest. A few comparisons check
    # it, and `_run_direct` hands it to its runner at once. Anything else, or anything to
    # refuse, takes the general path below, which checks everything and says what is wrong.
    if (detach is True and resume is False and timeout is None and estimate_ms is None
            and manifest is None and runs_per_day is None
            and (preempt is True or preempt is False)):
        budget_ms = resolve_budget(budget, declares=True)
        if (budget_ms and callable(fn) and (key is None or (key.__class__ is str and key))
                and (limits is None or limits.__class__ is Limits)):
            if notices is not DEFAULT_NOTICES and notices is not None:
                notices = check_notices(notices)
            return _run_direct(_planned(work, _label(fn, key), True, False, budget_ms, None,
                                        None, _NO_LIMITS if limits is None else limits, None,
                                        notices, None, preempt), cluster, clock, t0_ms, started)
    # -- the general path: every option checked, then planned
    if not callable(fn):
        raise ConfigError(f"nb.call() takes a function first, not {fn!r}")
    check_interruption(detach, resume, budget)
    loaded = manifest if isinstance(manifest, Manifest) or manifest is None else Manifest.load(
        manifest)
    budget_ms = resolve_budget(budget, declares=detach or resume)
    timeout_ms = None if timeout is None else _positive(timeout, "timeout", CALL_SPELLING)
    if loaded is not None:
        budget_ms, timeout_ms = _turn_ceiling(loaded, detach or resume, budget_ms, timeout_ms)
    _check_key_and_quota(key, runs_per_day, CALL_SPELLING)
    plan = _planned(
        work, _label(fn, key), detach, resume, budget_ms, timeout_ms,
        None if estimate_ms is None else parse_duration(estimate_ms, field="estimate_ms"),
        _NO_LIMITS if limits is None and loaded is None else _limits(limits, loaded),
        loaded.envelope_bytes if loaded is not None else None, notices, runs_per_day,
        _preempt.checked(preempt))
    # (the wall clock of a first start counts from here, S0-6)
    return _run(plan, cluster, clock, t0_ms, started, _wall())


def _unanswered(exc: ClusterUnanswered, started: float) -> Response:
    """The answer of a resumable call whose cluster did not answer within its budget: nothing
    ran (its checkpoints are saved by its caller, who must be there while it runs)."""
    return Response(False, None, {"code": exc.code, "message": str(exc)}, None,
                    meta(EXIT_FAILED, started, exc.budget_ms, None), refusal=exc)


def _backend(cluster: Any, clock: Clock, t0_ms: float, budget_ms: int | None) -> Backend:
    """Where the call runs: the backend in force, or the cluster *cluster* names (given, or
    the default one; ``False``: here, whatever the default). A first connection to a cluster
    named by its address is waited for at most what is left of the call budget *budget_ms*
    (counted from *t0_ms* on *clock*; none or 0: as long as it takes), else
    `ClusterUnanswered`."""
    if cluster is None and _default_cluster is not None:
        cluster = _default_cluster()
    if cluster is None or cluster is False:
        return current_backend()
    within_s = (t0_ms + budget_ms - clock.now_ms()) / 1000 if budget_ms else None
    return load_calls("dask").backend(cluster, within_s, budget_ms)


def _run(plan: _Plan, cluster: Any, clock: Clock, t0_ms: float, started: float,
         started_wall: float) -> Response:
    """The general path: reattach to the identical detached work, or start it where *cluster*
    says (`_backend`) with its checkpoint, its quota and its wall clock (`_start`); then hold
    the caller until it ends or its budget runs out. *t0_ms* is when the call began on the
    run's clock, *started* on the monotonic clock and *started_wall* on the wall clock."""
    if cluster is not None or _default_cluster is not None:
        backend = _on_cluster(plan, cluster, clock, t0_ms, started, started_wall)
        if isinstance(backend, Response):
            return backend
    else:
        backend = current_backend()
    runner = backend.runner
    job = runner.reattach(plan) if plan.detach else None
    db = None
    if job is None:
        try:
            ctx, job = _start(plan, backend, clock, started_wall)
        except (CheckpointRefused, StoreDamaged, StoreBusy,
                RunsPerDayExceeded) as exc:  # nothing started
            return _respond(plan, started, ok=False, exit_code=EXIT_FAILED, refusal=exc,
                            error={"code": exc.code, "message": str(exc)})
        if ctx is None:  # the wall clock had already run out before this continuation
            return _stopped(plan, started, Status.CANCELLED, _timeout_message(plan), None)
        db = ctx.store
    _await(job, plan, runner, clock, t0_ms)
    return _answer(job, plan, started, runner, db)


def _run_direct(plan: _Plan, cluster: Any, clock: Clock, t0_ms: float,
                started: float) -> Response:
    """The fast path, tuned (every call that may detach takes it, see `call`): reattach to
    the identical detached work, or hand the work to its runner (where *cluster* says) at
    once; the caller waits at most its budget. Its run is made only if the work uses it (a
    `Deferred` begun with the call, S0-1), and its job only if something needs it (`_Call`):
    work that ends in time with a value is answered with neither made."""
    budget_ms = plan.budget_ms
    assert budget_ms, "a call on the fast path has a budget"
    if cluster is not None or _default_cluster is not None:
        backend = _on_cluster(plan, cluster, clock, t0_ms, started, _wall())
        if isinstance(backend, Response):
            return backend
    else:
        backend = current_backend()
    runner = backend.runner
    job = runner.reattach(plan)
    if job is not None:
        _await(job, plan, runner, clock, t0_ms)
        return _answer(job, plan, started, runner, None)
    held = Deferred(plan.limits, clock=clock, name=plan.label, notices=plan.notices,
                    began=t0_ms, preempt=plan.preempt)
    ctx = _Call(plan, held, backend.store, None, None, None, None)
    # a run not made needs no entering: `nb.current` finds it through the call (`_ambient_run`)
    runner.start(plan, None if runner.runs_here else ctx.job,
                 functools.partial(_prepared(ctx, held.made() is not None).run, _work, ctx),
                 detachable=True)
    try:
        clock.wait(ctx.ended, t0_ms + budget_ms)
    except KeyboardInterrupt:  # the person interrupted the call: stop the work, then re-raise
        ctx.job.run.cancel("interrupted")
        raise
    job, value = ctx.made_job, ctx.value
    if job is None and value is not _PENDING:  # it ended in time: nothing else to build
        return Response(True, value, None, None, meta(EXIT_OK, started, budget_ms, None),
                        None, ctx.make_job)  # (`_respond`, without its keywords)
    job = ctx.job
    if not job.done():
        return _unfinished(job, plan, started, runner, None)
    if job.exception() is None:  # nothing to deliver: the job was never detached
        return _respond(plan, started, ok=True, exit_code=EXIT_OK, data=job.result(), job=job)
    return _answer(job, plan, started, runner, None)


# -- a cluster named by its address, still connecting ---------------------------------------
class _Placing:
    """A call answered ``starting``: its cluster, named by its address, was not connected when
    its budget ran out, and its start was handed to the connection (`_place`). `placed` is set
    once that has run: the work is then on the cluster, its job kept by the cluster's runner
    (no longer here), or it could not be put there, and its job, ended, waits here for the
    identical call."""

    __slots__ = ("job", "placed")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.placed = Latch()


#: the calls answered ``starting`` in this process, by identity, until their work is on the
#: cluster or the identical call took what stopped it
_placing: dict[str, _Placing] = {}
_placing_lock = threading.Lock()


def _on_cluster(work: _Plan, cluster: Any, clock: Clock, t0_ms: float, started: float,
                started_wall: float) -> Backend | Response:
    """The backend of a call that may run on a cluster (`_backend`), or its answer when its
    cluster, named by its address, is not connected within its budget (S0-1): a call that may
    detach answers INCOMPLETE, state ``starting``, and its work goes to the cluster once the
    connection is made (S0-2, `_starting`); a resumable one answers ``cluster_unanswered``, as
    its caller must be there while it runs. The identical call answered ``starting`` in this
    process is waited for first, within the budget."""
    unanswered = None
    for _ in range(3):  # again when the connection ended just after the wait for it
        try:
            backend = _backend(cluster, clock, t0_ms, work.budget_ms)
        except ClusterUnanswered as exc:
            if not work.detach:
                return _unanswered(exc, started)
            answer = _starting(work, exc.address, clock, started, started_wall)
            if answer is not None:
                return answer
            unanswered = exc
            continue
        placing = _placing.get(work.identity) if _placing else None
        if placing is None:
            return backend
        return _when_placed(placing, work, backend, clock, t0_ms, started)
    assert unanswered is not None
    return _unanswered(unanswered, started)  # connections that end as soon as they begin


def _starting(work: _Plan, address: str, clock: Clock, started: float,
              started_wall: float) -> Response | None:
    """The answer of a call whose cluster at *address* is still connecting: INCOMPLETE, its job
    ``starting``, its start handed to the connection (the identical call's, if one was answered
    so before it in this process); or, when the work could not be put on the cluster, what
    stopped it. None when the connection ended since the wait for it: the caller uses it."""
    identity = work.identity
    with _placing_lock:
        placing = _placing.get(identity)
        made = placing is None
        if placing is None:
            placing = _placing[identity] = _Placing(_starting_job(work, clock))
    job = placing.job
    on_cluster = load_calls("dask")
    if made and not on_cluster.when_connected(address, functools.partial(
            _place, work, placing, current_backend().store, clock, started_wall),
            f"job {job.id} ({work.label})"):
        with _placing_lock:
            del _placing[identity]
        return None
    if placing.placed.is_set():  # what stopped it, or None: it is on the cluster now
        return _taken(placing, work, started, LOCAL.runner)
    return _respond(work, started, ok=False, exit_code=EXIT_INCOMPLETE, job=job,
                    data={"state": "starting", "job": job.id,
                          "next": f"make the identical call again to wait for the result: the "
                                  f"work goes to the cluster at {address!r} as soon as this "
                                  f"process is connected to it (a process that exits first "
                                  f"waits for that, up to {on_cluster.exit_wait_s:g} s)"})


def _starting_job(work: _Plan, clock: Clock) -> Job:
    """The job of a call answered ``starting``, listed in ``nb.jobs`` from now on: its work
    starts as that job once the cluster is connected (`_place`)."""
    job = Job(work.identity_of, work.label, _open_run(work, None, None, clock),
              current_backend().store, starting=True)
    jobs.add(job)
    return job


def _when_placed(placing: _Placing, work: _Plan, backend: Backend, clock: Clock,
                 t0_ms: float, started: float) -> Backend | Response:
    """The identical call was answered ``starting`` in this process: wait, within the budget,
    until its work is on the cluster (then reattach to it there, on *backend*), or answer
    ``starting`` again, or with what stopped it."""
    budget_ms = work.budget_ms
    if not clock.wait(placing.placed, t0_ms + budget_ms if budget_ms else None):
        return _respond(work, started, ok=False, exit_code=EXIT_INCOMPLETE, job=placing.job,
                        data={"state": "starting", "job": placing.job.id,
                              "next": "make the identical call again to wait for the result: "
                                      "the work is being sent to the cluster"})
    answer = _taken(placing, work, started, backend.runner)
    return backend if answer is None else answer


def _taken(placing: _Placing, work: _Plan, started: float,
           runner: JobRunner) -> Response | None:
    """The answer with what stopped the work of a call answered ``starting`` before it reached
    the cluster (its connection failed, a quota, a cancel), given to this caller alone; None
    when the work is on the cluster (its runner keeps its job)."""
    with _placing_lock:
        if _placing.get(work.identity) is not placing:
            return None
        del _placing[work.identity]
    answer = _answer(placing.job, work, started, runner, None)
    jobs.collected(placing.job)  # its end went out: listed while something holds it
    return answer


def _place(work: _Plan, placing: _Placing, store: Callable[[], Store], clock: Clock,
           started_wall: float, client: Any, error: BaseException | None) -> None:
    """On the thread that connected to the cluster of a call answered ``starting``: put its work
    there, as a job detached at once (the identical call reattaches to it, S0-11): follow the
    work if a call of another process already put it there, else start it. What stops it (the
    connection's *error*, a quota, a cancel asked meanwhile) ends its job, kept for the
    identical call, and is raised again, for a process that exits to say so."""
    job = placing.job
    try:
        if job.cancel_requested is not None:
            raise Cancelled(f"{work.label} was cancelled before it reached the cluster")
        if error is not None:
            raise error
        runner = load_calls("dask").runner(client)
        backend = Backend(runner, store)
        # the work a call of another process put there, followed; else this call's, started
        if not runner.follow(work, job) and _start(work, backend, clock, started_wall,
                                                   job)[0] is None:
            return  # its wall clock had run out: it ended cancelled, kept here
        job.started()
        runner.detach(work, job)
        job.note("detached", {"job": job.id})
        with _placing_lock:
            del _placing[work.identity]
    except BaseException as exc:
        if not job.done():
            job.settle(JobState.CANCELLED if isinstance(exc, Cancelled) else JobState.FAILED,
                       error=exc)
            job.notify_done()
        raise
    finally:
        placing.placed.set()


# -- the checks a plan is made with -------------------------------------------------------------
def _label(fn: Callable[..., Any], key: str | None) -> str:
    """The work's name, as ``nb.jobs`` shows it."""
    return (getattr(fn, "__nbbudget_label__", None) or key or getattr(fn, "__qualname__", None)
            or repr(fn))


def _turn_ceiling(manifest: Manifest | None, declares: bool, budget_ms: int | None,
                  timeout_ms: int | None) -> tuple[int | None, int | None]:
    """S2-8: the manifest's ``turn.wallClock`` is the longest a caller may be held. It caps the
    call budget of a call that can detach or pause (a budget of 0 too; a person working
    interactively has none, S0-5), and the wall-clock limit of a call that cannot."""
    wall = manifest.wall_clock_ms if manifest is not None else None
    if wall is None:
        return budget_ms, timeout_ms
    if not declares:
        return budget_ms, wall if timeout_ms is None else min(timeout_ms, wall)
    if budget_ms is None:
        return None, timeout_ms
    return (wall if budget_ms == 0 else min(budget_ms, wall)), timeout_ms


class Spelling(NamedTuple):
    """How a caller writes the flags of a call, so that an error names them as it wrote them."""

    detach: str
    resume: str
    budget: str  #: the budget with its value, a format string
    budget_flag: str  #: the budget alone, to drop it
    flags: bool = False  #: written as a command line's flags (``--timeout 5s``)

    def field(self, name: str) -> str:
        """The option *name* as the caller writes it: ``timeout``, or ``--timeout``."""
        return "--" + name.replace("_", "-") if self.flags else name

    def given(self, name: str, value: object) -> str:
        """The option *name* given *value*: ``timeout=0``, or ``--timeout 0``."""
        if self.flags:
            return f"{self.field(name)} {shlex.quote(str(value))}"
        return f"{name}={value!r}"

    def unset(self, name: str) -> str:
        """How the caller asks for none of the option *name*: ``use None``, or ``leave
        --timeout out``."""
        return f"leave {self.field(name)} out" if self.flags else "use None"


#: `nb.call`'s keywords
CALL_SPELLING = Spelling("detach=True", "resume=True", "budget={!r}", "budget=")
#: ``%%budget``'s and ``nbbudget run``'s flags
FLAG_SPELLING = Spelling("--detach", "--resume", "--budget {}", "--budget", flags=True)


def check_interruption(detach: object, resume: object, budget: object, *,
                       spelling: Spelling = CALL_SPELLING) -> None:
    """How a call may end before its work does, checked in one place for `nb.call` and
    ``%%budget``: *detach* and *resume* are booleans that exclude each other, and a budget needs
    one of them (S0-10). A `ConfigError` names the flags as *spelling* writes them."""
    if type(detach) is bool and type(resume) is bool and not (detach and resume) and (
            budget is None or detach or resume):
        return  # the usual case, checked at every call
    for name, flag in (("detach", detach), ("resume", resume)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{name}={flag!r}: use True or False")
    if detach and resume:
        raise ConfigError(f"{spelling.detach} and {spelling.resume} exclude each other: choose "
                          f"how the work outlives its budget")
    if budget is not None and not (detach or resume):
        raise ConfigError(
            f"{spelling.budget.format(budget)} needs {spelling.detach} or {spelling.resume}: "
            f"only a call that can detach or pause can return before its work ends; drop "
            f"{spelling.budget_flag} or declare one of them (see: nbbudget explain S0-10)")


def check_options(budget: object, timeout: object, key: object, runs_per_day: object, *,
                  spelling: Spelling = CALL_SPELLING) -> None:
    """A call's budget, wall-clock limit, key and quota of runs per day, checked as `call`
    checks them, for ``%%budget``, which checks its flags before its cell runs: a
    `ConfigError` names them as *spelling* writes them."""
    if budget is not None:
        _duration(budget, "budget", spelling)
    if timeout is not None:
        _positive(timeout, "timeout", spelling)
    _check_key_and_quota(key, runs_per_day, spelling)


def _check_key_and_quota(key: object, runs_per_day: object, spelling: Spelling) -> None:
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError(f"{spelling.given('key', key)}: use a non-empty string that names the "
                          f"work")
    if runs_per_day is not None and (isinstance(runs_per_day, bool) or not isinstance(
            runs_per_day, int) or not 0 < runs_per_day <= 1_000_000):
        raise ConfigError(f"{spelling.given('runs_per_day', runs_per_day)}: use a whole number "
                          f"from 1 to 1000000; {spelling.unset('runs_per_day')} for no quota")


def resolve_budget(budget: int | str | None, *, declares: bool,
                   interactive: bool | None = None) -> int | None:
    """The call budget in force, in ms, or `None` when none applies (S0-3, S0-5, S0-10).

    *interactive* defaults to `is_interactive()`, decided now.
    """
    if not declares:
        check_interruption(False, False, budget)  # a budget needs detach or resume (S0-10)
        return None
    if budget is not None:
        return parse_duration(budget, field="budget")
    if is_interactive() if interactive is None else interactive:
        return None
    env = os.environ.get(ENV_BUDGET)
    if env is not None and env.strip():
        return parse_duration(env.strip(), field=ENV_BUDGET)
    configured = _default_budget() if _default_budget is not None else None
    return DEFAULT_BUDGET_MS if configured is None else int(configured)


_default_budget: Callable[[], int | None] | None = None


def set_default_budget(provider: Callable[[], int | None] | None) -> None:
    """Install (or remove) where the default budget comes from after the environment: the
    IPython layer's ``NBBudget.default_budget_ms``."""
    global _default_budget
    _default_budget = provider


_default_cluster: Callable[[], Any] | None = None


def set_default_cluster(provider: Callable[[], Any] | None) -> None:
    """Install (or remove) where a call without ``cluster=`` finds its cluster: the IPython
    layer's ``NBBudget.cluster`` (None from it: the calls run here)."""
    global _default_cluster
    _default_cluster = provider


def _duration(value: object, field: str, spelling: Spelling) -> int:
    """A duration as the caller gave it: on a flag it carries its unit (`flag_duration`)."""
    if spelling.flags and isinstance(value, str):
        return flag_duration(value, spelling.field(field))
    return parse_duration(value, field=spelling.field(field))


def _positive(value: object, field: str, spelling: Spelling) -> int:
    ms = _duration(value, field, spelling)
    if ms == 0:
        raise ConfigError(f"{spelling.given(field, 0)} would cancel the work at once; "
                          f"{spelling.unset(field)} for no limit")
    return ms


def _limits(limits: Limits | None, manifest: Manifest | None) -> Limits:
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError(f"limits= takes nb.Limits, not {type(limits).__name__}")
    out = limits or _NO_LIMITS
    if manifest is not None:
        out = out.restrict(manifest.limits)
    return out


def _identity(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              key: str | None) -> str:
    """The same work gives the same identity: ``key``, or the function and its arguments."""
    if key is not None:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    code = getattr(fn, "__code__", None)  # two lambdas of one scope differ by their code
    parts = (_code_digest(code) if code is not None else b"", args, sorted(kwargs.items()))
    try:
        blob = pickle.dumps(parts, protocol=4)
    except Exception:  # noqa: BLE001 - what cannot be pickled is identified by its repr
        blob = repr(parts).encode()
    return "fn:" + hashlib.sha256(name.encode() + b"\0" + blob).hexdigest()


def _code_digest(code: Any) -> bytes:
    """What a function does, stable across re-runs of a cell and kernel restarts: its bytecode,
    names and constants (nested code hashed the same way), not where or when it was defined.
    Closures are state, not identity."""
    digest = hashlib.sha256(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        digest.update(_code_digest(const) if hasattr(const, "co_code") else repr(const).encode())
    return digest.digest()


# -- starting -----------------------------------------------------------------------------------
def _start(plan: _Plan, backend: Backend, clock: Clock, started_wall: float,
           job: Job | None = None) -> tuple[_Call | None, Job]:
    """The general path's start: the work of *plan* on *backend* (as its *job*, when the call
    was answered ``starting`` and made it), with its checkpoint, its quota and its wall clock;
    None for its call when the wall clock had already run out (the job ended cancelled)."""
    db = backend.store() if plan.resume else None
    loaded = db.load_checkpoint(plan.identity) if db is not None else None
    first_start = loaded.first_start if loaded is not None else started_wall
    if plan.runs_per_day is not None and loaded is None:  # a start, not a continuation
        take_run(db if db is not None else backend.store(), plan.identity, plan.label,
                 plan.runs_per_day, started_wall)
    held = _open_run(plan, loaded, db, clock) if job is None else job.held_run
    ctx = _Call(plan, held, backend.store, job, db, loaded, first_start)
    job = ctx.job  # the general path waits on its job
    left = _timeout_left(plan, first_start)
    if left is not None and left <= 0:  # out before it started (its cluster connected late)
        _wall_clock_out(job, plan)
        job.settle(JobState.CANCELLED, error=Cancelled(_timeout_message(plan)))
        job.notify_done()
        if db is not None:
            db.delete_checkpoint(plan.identity)
        return None, job
    if left is not None:
        job.add_timer(clock.call_at(clock.now_ms() + left, lambda: _wall_clock(job, plan)))
    context = _prepared(ctx, True)
    if plan.budget_ms is None and left is None and backend.runner.runs_here:
        # nothing can end the wait early (no budget, no wall clock): run it here, synchronously
        context.run(_work, ctx)()
    else:
        backend.runner.start(plan, job, functools.partial(context.run, _work, ctx),
                             detachable=plan.detach, checkpoints=ctx if plan.resume else None,
                             wall_clock=None if left is None
                             else WallClock(left, _timeout_message(plan)))
    return ctx, job


def _open_run(plan: _Plan, loaded: Checkpoint | None, db: Store | None,
              clock: Clock) -> Budget | Deferred:
    """The work's run: a new one, or the paused one continued from its checkpoint (S4-4)."""
    if loaded is None:  # made when the work first uses it: most work never does
        return Deferred(plan.limits, clock=clock, name=plan.label, notices=plan.notices,
                        preempt=plan.preempt)
    try:
        return Budget.resume(loaded.ledger, plan.limits, clock=clock, preempt=plan.preempt)
    except ConfigError as exc:  # a signed checkpoint whose ledger lacks its state (S4-5)
        assert db is not None
        raise CheckpointRefused(plan.identity, db.location, str(exc)) from None


#: the wall clock: dates a start for its day's quota, and a first start for its timeout
_wall = time.time


def take_run(db: Store, identity: str, label: str, quota: int, now: float) -> None:
    """S4-12: count a start of the work *identity* (named *label*) at *now* against its quota
    for the day (UTC), or refuse it with `RunsPerDayExceeded`."""
    day = time.strftime("%Y-%m-%d", time.gmtime(now))
    if db.take_run(identity, day, quota) is None:
        raise RunsPerDayExceeded(
            f"{label} has already started {quota} time{'s' if quota != 1 else ''} on "
            f"{day} (UTC), its quota of runs_per_day={quota}; nothing was run. Try again "
            f"after 00:00 UTC, or raise runs_per_day")


def _timeout_left(plan: _Plan, first_start: float) -> float | None:
    if plan.timeout_ms is None:
        return None
    return plan.timeout_ms - (_wall() - first_start) * 1000


def _timeout_message(plan: _Plan) -> str:
    return (f"{plan.label} was cancelled: its wall-clock limit of {plan.timeout_ms} ms, counted "
            f"from its first start across every continuation, ran out")


def _wall_clock_out(job: Job, plan: _Plan) -> bool:
    """Stop the run of *job* as its wall-clock limit does (S4-7): ``cancelled``, by the wall
    clock, so every caller answers so (`_wall_clocked`), also for work it stops before it
    started; whether this was the run's first stop."""
    scope = job.run.lowlevel.scope
    return scope.halt(Stop.of(Status.CANCELLED, _timeout_message(plan), scope, by="wall-clock"))


def _wall_clock(job: Job, plan: _Plan) -> None:
    """The wall-clock limit fired: cancel the work, across every continuation (S0-6, S4-7), and
    free its callers (a run stopped before keeps its stop, and its callers keep waiting, unless
    that stop was this limit's, kept where the work runs and heard here first)."""
    if _wall_clock_out(job, plan) or _wall_clocked(job):
        job.nudge()


def _prepared(ctx: _Call, enter: bool) -> contextvars.Context:
    """The context the work of *ctx* runs in: a copy of the caller's, with the call visible and,
    if *enter*, its run entered (as a ``with`` block would enter it). On the fast path a run
    not made yet, begun with the call, is not entered: `nb.current` finds it through the call
    (`_ambient_run`) and makes it then. Made by the caller, so that the worker, which runs cold
    after its thread switch, does only the work and its end."""
    context = contextvars.copy_context()
    context.run(_current_call.set, ctx)
    if enter:
        context.run(ctx.held.enter_for)
    return context


def _ambient_run() -> Budget | None:
    """The run of the call whose work runs in this context, where no run was entered."""
    ctx = _current_call.get()
    return ctx.run if ctx is not None else None


set_ambient(_ambient_run)


def _work(ctx: _Call) -> Callable[[], None]:
    """Runs where the runner runs it, in the context `_prepared` made: the work, then the end
    of its run (as leaving its ``with`` block). Settles the call, and returns what tells its
    waiters, run once the worker is free again."""
    fn, args, kwargs, _ = ctx.plan.work
    entry = ctx.held.interrupt_here()  # N-5: a stop of the run is raised in this thread
    try:
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - kept, with its traceback: never dropped
            return _raised(ctx, exc)
        try:
            ctx.held.__exit__(None, None, None)
        except BaseException as exc:  # noqa: BLE001 - its run's end: a cancel, say
            return _ended_early(ctx.job, exc, True, value)
        return ctx.returned(value)
    finally:
        if entry is not None:  # closed by the run's end; here whatever happened (a worker
            _preempt.leave(entry)  # thread outlives its task: nothing may be raised in it later)


# N-5: a stop that would land in a call's own ending (after its work, before its run's end)
# waits: the run's end reads it
_preempt.shield(_work.__code__)


def _raised(ctx: _Call, exc: BaseException) -> Callable[[], None]:
    """The work raised *exc*: its run ends as its ``with`` block would end (which may turn a
    stop into the public error it stands for, or keep a suspended run's resumable point)."""
    try:
        if ctx.held.__exit__(type(exc), exc, exc.__traceback__):
            return ctx.returned(None)  # the run kept it: left at a resumable point
    except BaseException as raised:  # noqa: BLE001 - what its block raises in its place
        exc = raised
    return _ended_early(ctx.job, exc, False, None)


def _ended_early(job: Job, exc: BaseException, returned: bool, value: Any) -> Callable[[], None]:
    """The work ended with *exc* (after it *returned* *value*, when its run's end raised):
    settle *job* as that ending says; what tells its waiters. An interrupt, which ends only
    work run in place, in its caller's thread, is raised again once the job is settled."""
    if isinstance(exc, _Pause):
        job.paused = True
        job.settle(JobState.DONE, value=exc.saved)
    elif isinstance(exc, Cancelled):
        _settle_cancelled(job, exc, returned, value)
    elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
        job.settle(JobState.CANCELLED, error=exc)
        job.notify_done()
        raise exc
    else:
        job.settle(JobState.FAILED, error=exc)
    job.cancel_timers()  # the work has ended: its wall clock no longer matters
    return job.notify_done


def _settle_cancelled(job: Job, exc: Cancelled, returned: bool, value: Any) -> None:
    """The work ended under a cancel. It stopped at a budget check (the cancel was honoured),
    or it ended without reaching one: then its value, or its own error (the cause of the
    `Cancelled` its run raised at the end), is kept and the cancel was not honoured."""
    if not job.run.cancelled:  # a Cancelled of the work's own, not of this job's run
        job.settle(JobState.CANCELLED, error=exc)
    elif returned:
        job.settle(JobState.DONE, value=value, honoured=False)
    elif exc.__cause__ is not None:
        job.settle(JobState.FAILED, error=exc.__cause__, honoured=False)
    else:
        job.settle(JobState.CANCELLED, error=exc, honoured=True)


# -- waiting and answering -----------------------------------------------------------------------
def _await(job: Job, plan: _Plan, runner: JobRunner, clock: Clock,
           t0_ms: float) -> None:
    """Hold the caller until the work ends, or its budget runs out (then a detached call
    returns, and a resumable one waits for the pause at the next checkpoint), or the wall clock
    cancels it. The wait itself is the budget's timer: no thread is woken to end it."""
    budget_ms = plan.budget_ms
    out = bool(budget_ms and plan.estimate_ms is not None and plan.estimate_ms > budget_ms)
    if out:
        job.pause()  # S0-7: it cannot finish in time: hand off or checkpoint now
    deadline = t0_ms + budget_ms if budget_ms else None
    if deadline is not None and plan.resume:  # work that did not declare resume never pauses
        job.pause(at_ms=deadline)  # a checkpoint past it pauses, even before the caller wakes
    try:
        while not job.done() and not (plan.detach and out):
            if _wall_clocked(job):
                break  # the wall clock fired: the caller is freed even if the work ignores it
            until = None if out else deadline
            if not job.wait_woken(clock, until) and until is not None:
                out = True
                job.pause()  # a resumable work stops at its next checkpoint
    except KeyboardInterrupt:  # the person interrupted the call: stop the work, then re-raise
        job.run.cancel("interrupted")
        raise


def _wall_clocked(job: Job) -> bool:
    """Whether the wall clock cancelled *job*'s run (a run never stopped is not asked)."""
    run = job.run_made()
    if run is None or not run.cancelled:
        return False
    stop = run.lowlevel.scope.stop
    return stop is not None and stop.status is Status.CANCELLED


def _answer(job: Job, plan: _Plan, started: float, runner: JobRunner,
            db: Store | None) -> Response:
    if not job.done():
        return _unfinished(job, plan, started, runner, db)
    if job.paused:
        saved: Checkpoint = job.result()
        return _respond(plan, started, ok=False, exit_code=EXIT_INCOMPLETE,
                        job=job,
                        data={"state": "paused", "checkpoint": saved.id,
                              "next": "make the identical call again to continue from "
                                      f"checkpoint {saved.id}"})
    _deliver(job, plan, runner, db)
    error = job.exception()
    if error is None:
        return _respond(plan, started, ok=True, exit_code=EXIT_OK, data=job.result(),
                        job=job)
    if isinstance(error, Cancelled):
        ended = job.run.outcome
        wall = (ended is not None and ended.status is Status.CANCELLED) or _wall_clocked(job)
        return _stopped(plan, started, Status.CANCELLED if wall else Status.STOPPED,
                        str(error), job)
    return _respond(plan, started, ok=False, exit_code=EXIT_FAILED, job=job,
                    error={"code": envelope_code(error), "message": str(error)})


def _stopped(plan: _Plan, started: float, status: Status, message: str,
             job: Job | None) -> Response:
    """A call its run's stop ended: a person's (``stopped``) or the wall clock's
    (``cancelled``), answered with its ending's state, code and exit code."""
    ending = ENDINGS[status]
    assert ending.envelope is not None
    data = {"state": ending.envelope} if job is None else {"state": ending.envelope, "job": job.id}
    return _respond(plan, started, ok=False, exit_code=ending.exit_code, data=data, job=job,
                    error={"code": ending.envelope, "message": message})


def _unfinished(job: Job, plan: _Plan, started: float, runner: JobRunner,
                db: Store | None) -> Response:
    """The caller is let go before the work ended: the wall clock cancelled it, or its budget
    ran out and it goes on as a job (S0-2)."""
    if _wall_clocked(job):
        _deliver(job, plan, runner, db)
        return _stopped(plan, started, Status.CANCELLED, _timeout_message(plan), job)
    runner.detach(plan, job)
    job.note("detached", {"job": job.id})  # in its run's trace, if its run is ever made
    return _respond(plan, started, ok=False, exit_code=EXIT_INCOMPLETE,
                    job=job,
                    data={"state": "running", "job": job.id,
                          "next": f"make the identical call again to wait for the result "
                                  f"(or nb.jobs[{job.id!r}].result())"})


def _deliver(job: Job, plan: _Plan, runner: JobRunner, db: Store | None) -> None:
    """The final result goes out: the work is complete, the next identical call starts anew."""
    runner.deliver(plan, job)
    job.cancel_timers()
    if plan.resume and db is not None:
        db.delete_checkpoint(plan.identity)


def _respond(plan: _Plan, started: float, *, ok: bool, exit_code: int, data: Any = None,
             error: dict[str, str] | None = None, job: Job | None = None,
             refusal: BaseException | None = None) -> Response:
    return Response(ok, data, error, [],
                    meta(exit_code, started, plan.budget_ms, plan.timeout_ms),
                    plan.envelope_bytes, job, refusal)


# -- inside the work ----------------------------------------------------------------------------
def current_call() -> _Call | None:
    """The call whose work runs in this context (a worker of `call`), or None: for the work
    itself and what runs it for a cell (``%%budget``'s magic gives its panel the call, whose
    job Pause asks to stop at the next checkpoint)."""
    return _current_call.get()


def checkpoint(state: Any) -> None:
    """Inside work that declared ``resume``: save *state* durably (signed, atomically) with the
    run's counters and active time; when the call budget has run out, stop here: the call
    returns INCOMPLETE (``paused``) and the identical call continues from this state (S0-2).

    In work that declared only ``detach`` it does nothing: that work never pauses. In a task
    on a cluster the state goes to the kernel, which saves it (`nbbudget.backends.dask.runner`).
    """
    ctx = _current_call.get()
    if ctx is None:
        remote = remote_call.get()
        if remote is not None:
            remote.checkpoint(state)
            return
        raise ConfigError("nb.checkpoint() works inside nb.call(fn, ..., resume=True) (or a "
                          "%%budget --resume cell); outside one there is nothing to resume")
    if not ctx.plan.resume or ctx.store is None:
        return
    ctx.run.check()
    saved = ctx.save(state)
    if ctx.job.pause_due(ctx.run.lowlevel.clock.now_ms()):
        raise _Pause(saved)


def resume_state(default: Any = None) -> Any:
    """Inside work that declared ``resume``: the state of this invocation's last checkpoint,
    or *default* when it starts fresh."""
    ctx = _current_call.get()
    if ctx is None:
        remote = remote_call.get()
        if remote is not None:
            return remote.resume_state(default)
        raise ConfigError("nb.resume_state() works inside nb.call(fn, ..., resume=True) (or a "
                          "%%budget --resume cell)")
    return ctx.loaded.state if ctx.loaded is not None else default

