"""The Dask backend (``pip install 'nbbudget[dask]'``): a run's counters kept on a cluster's
scheduler (`ledger`, in the extension of `scheduler`), a run's branches sent to its workers
(`branches`), calls' work run as tasks there (`runner`), their output, heartbeats and
checkpoints shipped to the kernel (`output`), and the connection to a cluster named by its
address (`connect`).

The only modules of nbbudget that import ``distributed``, and only once a cluster is given.
Loaded by name, never imported by the layers below: a run reads ``RUNS`` (a
`nbbudget.core.backends.ClusterRuns`, through `nbbudget.core.backends.load`), a call reads
``CALLS`` (a `nbbudget.calls.clusters.ClusterCalls`, through
`nbbudget.calls.clusters.load_calls`); both are the one `DaskBackend`, and the annotations below
are where ``mypy --strict`` checks that it implements each in full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...calls.clusters import ClusterCalls
from ...calls.runner import Backend, current_backend
from ...core.backends import ClusterRuns
from ...core.ledger import Branch, LedgerFactory
from .branches import DaskCluster

if TYPE_CHECKING:
    from .runner import DaskRunner

__all__ = ["BACKEND", "CALLS", "RUNS", "DaskBackend"]


class DaskBackend:
    """The Dask backend as a run and a call reach it: one object, stateless (the clients, the
    ledger factories and the runners are kept per client by the modules that make them)."""

    @property
    def exit_wait_s(self) -> float:
        """How long an exiting process waits for a call's work to reach a cluster still
        connecting (`connect.EXIT_WAIT_S`)."""
        from .connect import EXIT_WAIT_S

        return EXIT_WAIT_S

    # -- what a run needs (`ClusterRuns`) -------------------------------------------------------
    def cluster(self, cluster: object) -> DaskCluster:
        """The cluster *cluster* names: a ``distributed.Client``, or a scheduler address (one
        client per address, kept for this process), its ledger installed on the scheduler."""
        from .ledger import on_cluster

        return DaskCluster(on_cluster(cluster))

    def joining(self, branch: Branch) -> LedgerFactory:
        """The ledger factory of a branch's run in a task on a worker (`ledger.joining`)."""
        from .ledger import joining

        return joining(branch)

    # -- what a call needs (`ClusterCalls`) -----------------------------------------------------
    def backend(self, cluster: object, within_s: float | None,
                budget_ms: int | None) -> Backend:
        """The backend of a call given ``cluster=``: its work runs as a task on that cluster
        (the runner of its client), its records stay in the store in force."""
        from .ledger import on_cluster
        from .runner import runner_of

        return Backend(runner_of(on_cluster(cluster, within_s, budget_ms).client),
                       current_backend().store)

    def when_connected(self, address: str, then: Callable[[object, BaseException | None], None],
                       what: str) -> bool:
        """Hand *then* to the connection being made to *address* (`connect.when_connected`)."""
        from .connect import when_connected

        return when_connected(address, then, what)

    def runner(self, client: object) -> DaskRunner:
        """The runner of the calls on *client*'s cluster (one per client, `runner.runner_of`)."""
        from .connect import client_class
        from .runner import runner_of

        if not isinstance(client, client_class()):
            raise TypeError(f"a Dask runner is made of a distributed.Client, not "
                            f"{type(client).__name__}")
        return runner_of(client)


BACKEND = DaskBackend()
#: the backend as a run reaches it (`nbbudget.core.backends.load`)
RUNS: ClusterRuns = BACKEND
#: the backend as a call reaches it (`nbbudget.calls.clusters.load_calls`)
CALLS: ClusterCalls = BACKEND
