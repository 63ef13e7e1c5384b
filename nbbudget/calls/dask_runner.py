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
caller: the name is taken off the scheduler in one step of the scheduler's own (S0-11).
`deliver` unpublishes the name once the result went out, so the next identical call starts
anew.

`distributed` is imported only when a runner is made (``cluster=`` given), never at import.
"""

from __future__ import annotations

import threading
import uuid
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..agents.budget import Budget, join
from ..core.errors import Cancelled, ConfigError
from .jobs import Job, JobState, Jobs
from .runner import Backend, LocalRunner, Work, current_backend, jobs

if TYPE_CHECKING:
    from distributed import Client, Future

    from ..core.dask_ledger import Branch

    from . import workers

__all__ = ["PREFIX", "DaskRunner", "check_on_cluster", "on_cluster_backend", "published_name",
           "run_work", "runner_of", "take_published"]

#: the prefix of the names detached jobs are published under on the scheduler
PREFIX = "nbbudget-job-"

_runners: weakref.WeakKeyDictionary[Client, DaskRunner] = weakref.WeakKeyDictionary()
_runners_lock = threading.Lock()


def published_name(identity: str) -> str:
    """The name the detached job of the work *identity* is published under."""
    return PREFIX + identity


def run_work(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             branch: Branch) -> Any:
    """Runs on a worker: ``fn(*args, **kwargs)`` inside the call's run joined there
    (`nbbudget.agents.budget.join`): its limits and counters on the scheduler, the time it had
    left, and its stop, pushed to the worker when the kernel cancels the job. Its value is the
    task's; its error is raised there, and the future keeps it."""
    try:
        with join(branch):
            return fn(*args, **kwargs)
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
    out = ext.datasets.get(name) if ext is not None else None
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


def check_on_cluster(work: Work) -> None:
    """What a call on a cluster refuses, with what to do instead."""
    if work.resume:
        raise ConfigError("resume=True cannot run on a cluster yet (its checkpoints are kept "
                          "in the kernel's store): use detach=True with cluster=, or "
                          "resume=True without cluster=")
    if work.timeout_ms is not None:
        raise ConfigError("timeout= is not kept on a cluster (the kernel's wall clock cannot "
                          "stop a task on a worker): bound the work's own run instead, "
                          "limits=nb.Limits(run_ms=...), or drop cluster=")


def on_cluster_backend(cluster: object, work: Work) -> Backend:
    """The backend of a call given ``cluster=`` (a ``distributed.Client`` or a scheduler
    address, resolved as ``nb.budget(cluster=...)`` resolves it): its work runs on that
    cluster, its records stay in the store in force."""
    check_on_cluster(work)
    from ..core.dask_ledger import on_cluster

    return Backend(runner_of(on_cluster(cluster).client), current_backend().store)


def runner_of(client: Client) -> DaskRunner:
    """The runner of the calls on *client*'s cluster (one per client, for this process)."""
    with _runners_lock:
        found = _runners.get(client)
        if found is None:
            found = _runners[client] = DaskRunner(client, jobs)
        return found


class DaskRunner(LocalRunner):
    """A `JobRunner` whose work runs as tasks on the cluster of *client*; its detached jobs
    are published futures, kept by identity in this process too (as `LocalRunner` keeps
    them), and found on the scheduler from another kernel."""

    #: the work does not run in this process: the call never runs it in place
    runs_here = False

    def __init__(self, client: Client, jobs: Jobs) -> None:
        super().__init__(jobs)
        self.client = client
        self.in_kernel = _scheduler_here(client)
        self._futures: weakref.WeakKeyDictionary[Job, Future] = weakref.WeakKeyDictionary()
        self._published: weakref.WeakSet[Job] = weakref.WeakSet()  # its name is on the scheduler

    def start(self, work: Work, job: Job, task: workers.Task, *, detachable: bool) -> None:
        """Submit *work* to the cluster (the local closure *task* is not used). Its run is a
        run on the cluster's ledger, begun here and joined by the task: the job's run, so that
        its counters show live here and cancelling the job stops the task at its next check."""
        fn, args, kwargs, _ = work.work
        run = Budget(work.limits, name=work.label, notices=work.notices, cluster=self.client)
        core = run.lowlevel
        core.scope.start()
        job.use_run(run)
        branch = core.ledger.branch(core.account, run.name, core.scope.remaining_ms())
        future = self.client.submit(run_work, fn, args, kwargs, branch,
                                    key=f"nbbudget-call-{uuid.uuid4().hex}", pure=False)
        self._bind(job, future)

    def detach(self, work: Work, job: Job) -> None:
        """Publish the job's future under the work's identity (before the call answers), then
        keep and list it as the local runner does."""
        future = self._futures.get(job)
        if future is not None and job not in self._published:  # (a reattached one already is)
            self.client.publish_dataset(future, name=published_name(work.identity),
                                        override=True)
            self._published.add(job)
        if self.in_kernel and not job.detached:
            warnings.warn(f"the job {job.id} ({work.label}) was detached to a Dask cluster whose "
                          f"scheduler runs in this kernel: it dies with the kernel. Give "
                          f"cluster= an external scheduler (dask scheduler, dask-gateway, "
                          f"Coiled) for a job that outlives it", RuntimeWarning, stacklevel=6)
        super().detach(work, job)

    def reattach(self, work: Work) -> Job | None:
        """This process's job of *work* first; else its published future on the scheduler."""
        job = super().reattach(work)
        if job is not None:
            return job
        name = published_name(work.identity)
        try:
            future = self.client.get_dataset(name, default=None)
            if future is None:
                return None
            taken = self.client.run_on_scheduler(take_published, name, True, self.client.id)
        except Exception:  # noqa: BLE001  (a scheduler that cannot answer: start anew)
            return None
        if taken == "absent":
            return None  # another caller took the ended job: the work is complete
        job = Job(lambda: work.identity, work.label,
                  Budget(work.limits, name=work.label, notices=work.notices),
                  current_backend().store)
        self._bind(job, future)
        if taken == "running":
            self._published.add(job)
        return job

    def deliver(self, work: Work, job: Job) -> None:
        super().deliver(work, job)
        self._futures.pop(job, None)
        self._unpublish(work.identity, job)

    def taken_out(self, identity: str, job: Job) -> None:
        """The result went out through ``nb.jobs[id]``: its name comes off the scheduler too,
        so no kernel takes it again (S0-11)."""
        self._unpublish(identity, job)
        super().taken_out(identity, job)

    def _unpublish(self, identity: str, job: Job) -> None:
        if job in self._published:
            self._published.discard(job)
            try:  # one step on the scheduler (``unpublish_dataset`` first waits ~10 ms for
                # this client's batched messages, which nothing here needs)
                self.client.run_on_scheduler(take_published, published_name(identity))
            except Exception:  # noqa: BLE001  (the scheduler went away: nothing to unpublish)
                pass

    def _bind(self, job: Job, future: Future) -> None:
        """Settle *job* when *future* ends."""
        self._futures[job] = future
        job_ref = weakref.ref(job)
        future.add_done_callback(lambda done: _settle(job_ref, done))


def _settle(job_ref: weakref.ref[Job], future: Future) -> None:
    """The task ended: keep how on the kernel's side, then tell the job's waiters."""
    job = job_ref()
    if job is None or job.done():
        return
    status = future.status
    if status == "finished":
        try:
            job.settle(JobState.DONE, value=future.result())
        except BaseException as exc:  # noqa: BLE001  (its value could not be fetched)
            job.settle(JobState.FAILED, error=exc)
    elif status == "error":
        error = future.exception()
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


def _end_run(job: Job) -> None:
    """End the kernel's side of the job's run as its task ended (its outcome kept)."""
    run = job.run_made()
    if run is None or run.outcome is not None:
        return
    error = job.exception()
    try:
        run.__exit__(type(error) if error is not None else None, error,
                     error.__traceback__ if error is not None else None)
    except BaseException:  # noqa: BLE001,S110  (the task's error: the job keeps it)
        pass


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
