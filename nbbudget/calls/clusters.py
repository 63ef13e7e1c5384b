"""What a call needs of a cluster backend: ``nb.call(..., cluster=...)`` runs its work there.

A backend package (``nbbudget.backends.<name>``, loaded by name through
`nbbudget.core.backends.package`) offers it as ``CALLS``, a `ClusterCalls`, beside ``RUNS``
(what a run needs, `nbbudget.core.backends.ClusterRuns`). `nbbudget.calls.call` is the only
caller: it resolves a call's backend on a cluster, hands a call answered ``starting`` to the
connection still being made, and puts that call's work on the cluster once it is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..core.backends import package
from .jobs import Job
from .runner import Backend, JobRunner, Work

__all__ = ["ClusterCalls", "ClusterRunner", "load_calls"]


class ClusterRunner(JobRunner, Protocol):
    """A `JobRunner` whose work runs on a cluster, where the identical work may already be
    running, put there by a call of another process."""

    def follow(self, work: Work, job: Job) -> bool:
        """For a call answered before it could reach the cluster: if *work* is already on the
        cluster, *job* follows it there (its run, its output, its end) and it stays there for
        the caller that comes for it (S0-11); whether it was."""


class ClusterCalls(Protocol):
    """What a call needs of a cluster backend (``CALLS`` of its package, read by
    `load_calls`)."""

    @property
    def exit_wait_s(self) -> float:
        """How long a process that exits waits for a call's work to be put on a cluster still
        connecting (a call answered ``starting`` says so)."""

    def backend(self, cluster: object, within_s: float | None,
                budget_ms: int | None) -> Backend:
        """The backend of a call given *cluster* (what a user gives ``cluster=``): its work
        runs there, its records stay in the store in force. A first connection is waited for
        at most *within_s*, what is left of the call budget *budget_ms*, else
        `nbbudget.core.errors.ClusterUnanswered`."""

    def when_connected(self, address: str, then: Callable[[object, BaseException | None], None],
                       what: str) -> bool:
        """Run *then* on the thread connecting to the cluster at *address*, with its client
        once connected (or the error the connection failed with, and None); False, with
        nothing handed, when no connection to *address* is being made. *what* names the work
        in what an exiting process says."""

    def runner(self, client: object) -> ClusterRunner:
        """The runner of the calls on the cluster of *client* (what `when_connected` handed)."""


def load_calls(name: str) -> ClusterCalls:
    """What a call needs of the backend *name* (its package's ``CALLS``, checked against
    `ClusterCalls` where the package defines it)."""
    calls: ClusterCalls = package(name).CALLS
    return calls
