"""A call's work as a task on a Dask cluster: ``nb.call(fn, ..., detach=True, cluster=client)``.

`DaskRunner` is a `JobRunner` (`nbbudget.calls.runner`). It submits the work to the cluster as
a task, under a key of its own per attempt. The job's run is a run on the cluster's ledger,
begun in the kernel and joined by the task (`run_work`), so ``nb.current()`` is that run on the
worker, its counters show live in the kernel, and cancelling the job is pushed to the worker.
When the task's future ends, a done-callback ends the kernel's side of the run, settles the
`Job` and tells its waiters, so the call path waits on it as on a local one.

When the call's budget runs out, `detach` publishes the future on the scheduler under a name
made from the work's identity (``nbbudget-job-<identity>``) before the call answers INCOMPLETE:
a published future outlives the kernel that submitted it, while an unpublished one is released
when its kernel dies. The job is kept by identity in this process too, and listed in
``nb.jobs``, as the local runner does. `reattach` looks in this process first, then on the
scheduler (from a restarted kernel); a job that has already ended there goes to exactly one
caller: the name is taken off the scheduler in one step of the scheduler's own (S0-11). The
future is published with its run's place on the ledger (its `Branch`), so the job a restarted
kernel finds has the task's run, joined from there (`nbbudget.backends.dask.ledger.watching`): its
counters show there, and cancelling it reaches the task. Each runner lists in its
``nb.jobs.to_frame()`` the jobs published on its cluster that this process holds no job of
(`DaskRunner.published_jobs`): a restarted kernel sees the jobs its predecessor left running.
`deliver` unpublishes the name once the result went out, so the next identical call starts
anew.

What the task's thread prints, its heartbeat and its checkpoints go to the kernel as events of
the scheduler (`nbbudget.backends.dask.output`): the kernel listens from before it submits the
task, and a kernel that reattaches replays what the scheduler kept first, so ``job.output``
holds everything the task printed, and ``job.last_heartbeat`` when it was last heard from.

A resumable call (``resume=True``) runs as a task too (`TaskCall` is its call on the worker).
Its run continues from the loaded checkpoint's counters (S4-4); its task carries the
checkpoint's state (``nb.resume_state()`` there) and the caller's budget as a duration
(`Shipped`). ``nb.checkpoint(state)`` on the worker ships the state with the counters the task
took; the kernel saves it in its store, signed, as it arrives
(`nbbudget.backends.dask.output.Saver`). Once the budget has run out, the task ends at its
next checkpoint with a `PausedAt` as its value, and the kernel answers with the checkpoint it
saved there (S0-2). Its caller never detaches: it is there while the task runs.

The whole work's ``timeout=`` (S0-6) is kept on the scheduler's clock: `DaskRunner.start` opens
the run there with the time the work has left (a `WallClock`: a duration, counted from its
first start, never a deadline), and the scheduler stops the run when it runs out, with the
call's own ending (cancelled, by the wall clock, with the timeout's message). The stop is
pushed to the task's worker, which raises `Cancelled` at its next check, and to this kernel;
the call's own timer here frees a waiting caller too (the first stop wins). A detached job is
thus cancelled at its limit even when its kernel has gone, and a kernel that reattaches to it
later takes the stop from the scheduler, and answers as the call would have.

`distributed` is imported only when a runner is made (``cluster=`` given), never at import.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...calls.jobs import Job, Jobs, JobState
from ...calls.runner import (
    Checkpoints,
    DetachedJobs,
    WallClock,
    Work,
    current_backend,
    jobs,
    remote_call,
)
from ...core.errors import Cancelled, ConfigError
from ...core.limits import Limits
from ...core.lowlevel import Incomplete, Stop
from ...core.outcome import Status
from ...run.budget import Budget, join
from .output import Feed, Saver, TaskOutput, beat_topic, forget, output_topic

if TYPE_CHECKING:
    from distributed import Client, Future

    from ...calls.clusters import ClusterRunner
    from ...calls.runner import JobRunner
    from ...core import workers
    from ...core.ledger import Branch

__all__ = ["PREFIX", "DaskRunner", "PausedAt", "Shipped", "TaskCall", "published_name",
           "published_states", "run_work", "runner_of", "take_published"]

#: the prefix of the names detached jobs are published under on the scheduler
PREFIX = "nbbudget-job-"

_runners: weakref.WeakKeyDictionary[Client, DaskRunner] = weakref.WeakKeyDictionary()
_runners_lock = threading.Lock()


def published_name(identity: str) -> str:
    """The name the detached job of the work *identity* is published under."""
    return PREFIX + identity


@dataclass(frozen=True)
class Shipped:
    """What a call's task carries besides its work: its key (its topics are named after it),
    and for a resumable call the state it continues from (``(state,)``, or ``()`` to start
    fresh) and how long after it starts it pauses at its next checkpoint (the caller's budget
    as a duration: clocks do not compare across machines; None: never)."""

    key: str
    resume: bool = False
    loaded: tuple[Any, ...] = ()
    pause_after_ms: float | None = None


@dataclass(frozen=True)
class PausedAt:
    """The value of a task that paused at its checkpoint *number* (of its *attempt*): the
    kernel saved that checkpoint when it arrived, and answers with it."""

    attempt: str
    number: int


class _Pause(Incomplete):
    """Unwinds a task's work at the checkpoint where it pauses."""

    def __init__(self, where: PausedAt) -> None:
        super().__init__("paused at a checkpoint")
        self.where = where


class TaskCall:
    """On a worker, the call whose task runs there (`nbbudget.calls.runner.RemoteCall`):
    ``nb.checkpoint(state)`` ships *state* to the kernel, which saves it in its store (signed,
    with the run's counters), then pauses the work once the caller's budget has run out;
    ``nb.resume_state()`` is the state it continues from. In work that declared only
    ``detach``, ``nb.checkpoint`` does nothing, as on the kernel's threads."""

    def __init__(self, shipped: Shipped, run: Budget, output: TaskOutput) -> None:
        self.shipped, self.run, self.output = shipped, run, output
        after = shipped.pause_after_ms
        self._pause_at = None if after is None else time.monotonic() + after / 1000
        self._count = 0

    def checkpoint(self, state: Any) -> None:
        if not self.shipped.resume:
            return
        self.run.check()
        self._count += 1
        ledger = self.run.state()  # what this task counted: its unused permits left out
        self.output.send({"checkpoint": _pickled(state), "id": self._count,
                          "counts": ledger["counts"], "notice_level": ledger["notice_level"]})
        if self._pause_at is not None and time.monotonic() >= self._pause_at:
            raise _Pause(PausedAt(self.output.attempt, self._count))

    def resume_state(self, default: Any) -> Any:
        return self.shipped.loaded[0] if self.shipped.loaded else default


def _pickled(state: Any) -> bytes:
    """*state* pickled on a worker for the kernel: its classes by their names (the kernel has
    them: a class shipped to the worker by value is the kernel's own there, not a copy, so that
    the kernel's store can pickle the state again), what has no name by value (cloudpickle)."""
    import cloudpickle  # type: ignore[import-untyped]  # untyped

    class ByName(cloudpickle.Pickler):  # type: ignore[misc]  # untyped base
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, type) and "<locals>" not in obj.__qualname__:
                return _named, (obj.__module__, obj.__qualname__)
            return super().reducer_override(obj)

    out = io.BytesIO()
    ByName(out, protocol=5).dump(state)
    return out.getvalue()


def _named(module: str, qualname: str) -> Any:
    """The object *qualname* of *module*, where a pickle is loaded (a class, by its name)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def run_work(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             branch: Branch, shipped: Shipped) -> Any:
    """Runs on a worker: ``fn(*args, **kwargs)`` inside the call's run joined there
    (`nbbudget.run.budget.join`): its limits and counters on the scheduler, the time it had
    left, and its stop, pushed to the worker when the kernel cancels the job. What its thread
    prints goes to the kernel, with a heartbeat (`nbbudget.backends.dask.output.TaskOutput`), all
    of it before the task ends. Its value is the task's (a `PausedAt` when it paused at a
    checkpoint); its error is raised there, and the future keeps it."""
    from distributed import get_worker

    try:
        with TaskOutput(shipped.key, get_worker().log_event) as output:
            run = join(branch)
            token = remote_call.set(TaskCall(shipped, run, output))
            try:
                with run:
                    return fn(*args, **kwargs)
            finally:
                remote_call.reset(token)
    except _Pause as paused:
        return paused.where
    except Cancelled as exc:  # its reason and its context hold the worker's stop (and locks)
        said = str(exc)
    raise Cancelled(said)  # raised here, with no context, so that it pickles back as itself


def take_published(name: str, ended_only: bool = False, client: str | None = None,
                   dask_scheduler: Any = None) -> str:
    """Runs on the scheduler, in one step of its event loop: unpublish *name* and say
    ``"taken"``; with *ended_only*, only if its task has ended (else ``"running"``, and it stays
    published); ``"absent"`` if it is not published. The one caller that takes an ended job
    delivers it (S0-11); *client* (that caller's id) keeps its result alive once unpublished."""
    ext = dask_scheduler.extensions.get("publish") if dask_scheduler is not None else None
    if ext is None:
        return "absent"
    out = ext.datasets.get(name)
    if out is None:
        return "absent"
    tasks = dask_scheduler.tasks
    if ended_only and any(key in tasks and tasks[key].state not in ("memory", "erred")
                          for key in out["keys"]):
        return "running"
    if client is not None:
        dask_scheduler.client_desires_keys(out["keys"], client)
    del ext.datasets[name]
    dask_scheduler.client_releases_keys(out["keys"], f"published-{name}")
    return "taken"


def published_states(prefix: str, dask_scheduler: Any = None) -> dict[str, tuple[str, Any]]:
    """Runs on the scheduler: for each job published under a name that starts with *prefix*,
    its state (``done``: its result waits in memory, ``failed``, ``lost``: its task is gone,
    else ``running``) and how many seconds ago its task last said it is alive (or None)."""
    ext = dask_scheduler.extensions.get("publish") if dask_scheduler is not None else None
    out: dict[str, tuple[str, Any]] = {}
    now = time.time()
    for name, entry in (ext.datasets.items() if ext is not None else ()):
        if not str(name).startswith(prefix):
            continue
        tasks, keys = dask_scheduler.tasks, entry["keys"]
        states = [tasks[key].state if key in tasks else "forgotten" for key in keys]
        heard = [t for key in keys for topic in (beat_topic(str(key)), output_topic(str(key)))
                 for t, _ in dask_scheduler.get_events(topic)[-1:]]
        out[str(name)] = ("failed" if "erred" in states else "lost" if "forgotten" in states
                          else "done" if all(s == "memory" for s in states) else "running",
                          now - max(heard) if heard else None)
    return out


def runner_of(client: Client) -> DaskRunner:
    """The runner of the calls on *client*'s cluster (one per client, for this process)."""
    with _runners_lock:
        found = _runners.get(client)
        if found is None:
            found = _runners[client] = DaskRunner(client, jobs)
        return found


class DaskRunner:
    """A `JobRunner` (a `nbbudget.calls.clusters.ClusterRunner`) whose work runs as tasks on
    the cluster of *client*; its detached jobs are published futures, kept by identity in this
    process too (its `DetachedJobs`, as `LocalRunner` holds one), and found on the scheduler
    from another kernel. Made per client by `runner_of`, or by a test with a `Jobs` of its
    own."""

    #: the work does not run in this process: the call never runs it in place
    runs_here = False

    def __init__(self, client: Client, jobs: Jobs) -> None:
        self.jobs = jobs
        self.detached = DetachedJobs(jobs)
        self.client = client
        self.in_kernel = _scheduler_here(client)
        self._futures: weakref.WeakKeyDictionary[Job, Future[Any]] = (
            weakref.WeakKeyDictionary())
        self._published: weakref.WeakSet[Job] = weakref.WeakSet()  # its name is on the scheduler
        self._feeds: weakref.WeakKeyDictionary[Job, Feed] = weakref.WeakKeyDictionary()
        self._branches: weakref.WeakKeyDictionary[Job, Branch] = weakref.WeakKeyDictionary()
        #: the jobs of this process by their published name: not listed again from the cluster
        self._here: weakref.WeakValueDictionary[str, Job] = weakref.WeakValueDictionary()
        jobs.list_elsewhere(self.published_jobs)

    def start(self, work: Work, job: Job | None, task: workers.Task, *, detachable: bool,
              checkpoints: Checkpoints | None = None,
              wall_clock: WallClock | None = None) -> None:
        """Submit *work* to the cluster (the local closure *task* is not used). Its run is a
        run on the cluster's ledger, begun here and joined by the task: the job's run, so that
        its counters show live here and cancelling the job stops the task at its next check.
        A resumable call's run continues from its loaded checkpoint (S4-4), its task carries
        the checkpoint's state and its budget, and the checkpoints it ships are saved through
        *checkpoints*. What the task prints and its heartbeats are heard from before it is
        submitted. The whole work's *wall_clock* is kept on the scheduler's clock: the run is
        opened there with the time the work has left, and stopped there when it runs out
        (cancelled, by the wall clock), which reaches the task and this kernel."""
        assert job is not None, "the call path makes the job of work that runs elsewhere"
        fn, args, kwargs, _ = work.work
        loaded = checkpoints.loaded if checkpoints is not None else None
        if loaded is not None:
            run = Budget.resume(loaded.ledger, work.limits, cluster=self.client)
        else:
            run = Budget(work.limits, name=work.label, notices=work.notices, cluster=self.client,
                         preempt=work.preempt)
        core = run.lowlevel
        core.scope.start()
        job.use_run(run)
        cluster = core.ledger.cluster  # what its ledger does on the cluster
        if cluster is None:
            raise ConfigError(f"{run.name} keeps its counters in this process, not on the "
                              f"cluster its task runs on")
        if wall_clock is not None:
            cluster.stop_after(wall_clock.left_ms, Stop.of(
                Status.CANCELLED, wall_clock.message, core.scope, by="wall-clock"))
        branch = cluster.branch(core.account, run.name, core.scope.remaining_ms())
        key = f"nbbudget-call-{uuid.uuid4().hex}"
        shipped = Shipped(key) if checkpoints is None else Shipped(
            key, True, () if loaded is None else (loaded.state,), _pause_after(work))
        feed = Feed(self.client, key, job,
                    None if checkpoints is None else Saver(checkpoints, run))
        feed.listen()
        future = self.client.submit(run_work, fn, args, kwargs, branch, shipped, key=key,
                                    pure=False)
        self._branches[job] = branch
        self._bind(job, future, feed)

    def detach(self, work: Work, job: Job) -> None:
        """Publish the job's future under the work's identity (before the call answers), then
        keep and list it as the local runner does."""
        future = self._futures.get(job)
        if future is not None and job not in self._published:  # (a reattached one already is)
            # with its run's place on the ledger, so that a kernel that finds it can stop it,
            # and what lists it in any kernel's nb.jobs.to_frame()
            listed = {"id": job.id, "label": job.label, "created": job.created,
                      "pid": os.getpid()}
            self.client.publish_dataset(
                {"future": future, "branch": self._branches.get(job), "job": listed},
                name=published_name(work.identity), override=True)
            self._published.add(job)
        self._here[published_name(work.identity)] = job
        if self.in_kernel and not job.detached:
            warnings.warn(f"the job {job.id} ({work.label}) was detached to a Dask cluster whose "
                          f"scheduler runs in this kernel: it dies with the kernel. Give "
                          f"cluster= an external scheduler (dask scheduler, dask-gateway, "
                          f"Coiled) for a job that outlives it", RuntimeWarning, stacklevel=6)
        self.detached.keep(work, job, self.taken_out)

    def reattach(self, work: Work) -> Job | None:
        """This process's job of *work* first; else its published future on the scheduler."""
        job = self.detached.find(work)
        if job is not None:
            return job
        name = published_name(work.identity)
        try:
            found = self.client.get_dataset(name, default=None)
            if found is None:
                return None
            taken = self.client.run_on_scheduler(  # type: ignore[no-untyped-call]  # untyped
                take_published, name, True, self.client.id)
        except Exception:  # noqa: BLE001 - a scheduler that cannot answer: start anew
            return None
        if taken == "absent":
            return None  # another caller took the ended job: the work is complete
        job = Job(lambda: work.identity, work.label, self._joined(work, found["branch"]),
                  current_backend().store)
        self._follow(job, name, found["future"], published=taken == "running")
        return job

    def follow(self, work: Work, job: Job) -> bool:
        """For a call answered before it could reach the cluster (its start handed to the
        connection, `nbbudget.calls.call`): if the identical work is already published there
        (a call of another process put it there), *job* follows it, its run the task's, and it
        stays published, for the caller that comes for it to take (S0-11); whether it was."""
        name = published_name(work.identity)
        found = self.client.get_dataset(name, default=None)
        if found is None:
            return False
        job.use_run(self._joined(work, found["branch"]))
        self._follow(job, name, found["future"], published=True)
        return True

    def _follow(self, job: Job, name: str, future: Future[Any], published: bool) -> None:
        """*job* follows *future*, found published under *name* (and still published, or
        taken off the scheduler by this caller): what its task printed so far, then what it
        prints, and its end."""
        feed = Feed(self.client, str(future.key), job)
        feed.listen(replaying=True)
        feed.replay()  # what it printed so far, then what it prints from now on
        self._bind(job, future, feed)
        self._here[name] = job
        if published:
            self._published.add(job)

    def published_jobs(self) -> list[dict[str, Any]]:
        """The jobs published on this cluster (by any kernel) that this process holds no job
        of, as the store's records read (``nb.jobs.to_frame()`` lists them); none when the
        scheduler cannot answer."""
        if self.client.status != "running":
            return []
        try:
            states = self.client.run_on_scheduler(  # type: ignore[no-untyped-call]  # untyped
                published_states, PREFIX)
        except Exception:  # noqa: BLE001 - a scheduler that cannot answer lists nothing
            return []
        out, now = [], time.time()
        for name, (state, age) in sorted(states.items()):
            if name in self._here:
                continue
            try:
                found = self.client.get_dataset(name, default=None)
            except Exception:  # noqa: BLE001, S112 - taken meanwhile, or unreadable here
                continue
            listed = found.get("job") if isinstance(found, dict) else None
            if listed is not None:
                out.append({**listed, "state": state, "updated": None, "error": None,
                            "heartbeat": None if age is None else now - age})
        return out

    def _joined(self, work: Work, branch: Branch | None) -> Budget:
        """The run of a job found on the scheduler: its task's run there, joined from here, so
        that its counters show here and cancelling the job reaches the task (a run of its own
        when the job was published without its run)."""
        if branch is None:
            return Budget(work.limits, name=work.label, notices=work.notices,
                          preempt=work.preempt)
        from .ledger import watching

        return Budget(Limits.from_json(branch.limits), name=branch.name, notices=branch.notices,
                      ledger=watching(self.client, branch), preempt=False)

    def deliver(self, work: Work, job: Job) -> None:
        """*job*'s result went out: it is forgotten here, and on the scheduler (what its task
        sent, its published name), so the next identical call starts anew."""
        self.detached.delivered(work, job)
        self._futures.pop(job, None)
        self._forget_output(job)
        self._unpublish(work.identity, job)

    def taken_out(self, identity: str, job: Job) -> None:
        """The result went out through ``nb.jobs[id]``: its name comes off the scheduler too,
        so no kernel takes it again (S0-11)."""
        self._forget_output(job)
        self._unpublish(identity, job)
        self.detached.taken_out(identity, job)

    def _unpublish(self, identity: str, job: Job) -> None:
        if job in self._published:
            self._published.discard(job)
            # one step on the scheduler (``unpublish_dataset`` first waits ~10 ms for this
            # client's batched messages, which nothing here needs); a scheduler that went away
            # has nothing to unpublish
            with contextlib.suppress(Exception):
                self.client.run_on_scheduler(  # type: ignore[no-untyped-call]  # untyped
                    take_published, published_name(identity))

    def _forget_output(self, job: Job) -> None:
        """The job's result went out: the scheduler no longer keeps what its task sent."""
        feed = self._feeds.pop(job, None)
        if feed is not None:
            _forget(feed)

    def _bind(self, job: Job, future: Future[Any], feed: Feed) -> None:
        """Settle *job* when *future* ends (once *feed* has heard all its task sent)."""
        self._futures[job] = future
        self._feeds[job] = feed
        job_ref = weakref.ref(job)
        future.add_done_callback(  # type: ignore[no-untyped-call]  # untyped in Dask
            lambda done: _settle(job_ref, done, feed))


def _forget(feed: Feed) -> None:
    """Drop what the scheduler keeps of what *feed*'s task sent."""
    with contextlib.suppress(Exception):  # a scheduler that went away keeps nothing
        feed.client.run_on_scheduler(forget, feed.topics)  # type: ignore[no-untyped-call]


def _pause_after(work: Work) -> float | None:
    """How long after its start a resumable task pauses at its next checkpoint: at once when it
    says it cannot finish in its budget (S0-7), else after the budget (None: no budget)."""
    budget = work.budget_ms
    if not budget:
        return None
    return 0.0 if work.estimate_ms is not None and work.estimate_ms > budget else float(budget)


def _settle(job_ref: weakref.ref[Job], future: Future[Any], feed: Feed) -> None:
    """The task ended: keep how on the kernel's side, then tell the job's waiters. What the
    task sent arrived before its end did: the feed stops listening."""
    feed.close()
    job = job_ref()
    if job is None or job.done():
        return
    status = future.status
    if status == "finished":
        _finished(job, future, feed)
    elif status == "error":
        error = future.exception()  # type: ignore[no-untyped-call]  # untyped in Dask
        if isinstance(error, Cancelled):  # the task stopped at a check: a cancel was honoured
            job.settle(JobState.CANCELLED, error=error,
                       honoured=True if job.cancel_requested is not None else None)
        else:
            job.settle(JobState.FAILED, error=error)
    elif status == "cancelled":
        job.settle(JobState.CANCELLED,
                   error=Cancelled(f"{job.label}: its task was cancelled on the cluster"))
    else:
        job.settle(JobState.FAILED, error=RuntimeError(
            f"{job.label}: its task on the cluster ended as {status!r}"))
    _end_run(job)
    job.notify_done()


def _finished(job: Job, future: Future[Any], feed: Feed) -> None:
    """Keep the value of a task that returned: its result, or the checkpoint it paused at."""
    try:
        value = future.result()
        if isinstance(value, PausedAt):
            assert feed.saver is not None, "only a resumable call's task pauses"
            value = feed.saver.saved(value.attempt, value.number)
            job.paused = True
        job.settle(JobState.DONE, value=value)
    except BaseException as exc:  # noqa: BLE001 - its value could not be fetched, or saved
        job.paused = False  # (not saved: the run stopped first)
        job.settle(JobState.CANCELLED if isinstance(exc, Cancelled) else JobState.FAILED,
                   error=exc)
    if job.paused:  # the continuation is a task of its own: what this one sent (its
        _forget(feed)  # checkpoints among it) is no longer needed on the scheduler


def _end_run(job: Job) -> None:
    """End the kernel's side of the job's run as its task ended (its outcome kept; a paused
    one ends ``incomplete``, as on the kernel's threads)."""
    run = job.run_made()
    if run is None or run.outcome is not None:
        return
    error: BaseException | None = job.exception()
    if job.paused:
        error = Incomplete("paused at a checkpoint")
    with contextlib.suppress(BaseException):  # the task's error: the job keeps it
        run.__exit__(type(error) if error is not None else None, error,
                     error.__traceback__ if error is not None else None)


def _scheduler_here(client: Client) -> bool:
    """Whether *client*'s scheduler runs in this process (an in-kernel ``LocalCluster``)."""
    from distributed import LocalCluster, Scheduler

    if isinstance(getattr(client, "cluster", None), LocalCluster):
        return True  # made from a cluster object of this process: its scheduler runs here
    address = getattr(getattr(client, "scheduler", None), "address", None)
    # a client of an address: is a scheduler of this process listening there? (distributed
    # keeps no public list of them; without its private one, nothing is said)
    schedulers = getattr(Scheduler, "_instances", ())
    return any(s.address == address for s in list(schedulers)
               if s.status.name not in ("closed", "closing"))


if TYPE_CHECKING:  # checked by mypy --strict: a DaskRunner is a JobRunner, one on a cluster
    _RUNNER: type[JobRunner] = DaskRunner
    _ON_CLUSTER: type[ClusterRunner] = DaskRunner
