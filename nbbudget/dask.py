"""nbbudget on a Dask cluster (``pip install 'nbbudget[dask]'``).

The ledger of every run on a cluster lives on its scheduler (`nbbudget.backends.dask.scheduler`).
It is installed on first use, idempotently, or ahead of time when the scheduler starts::

    dask scheduler --preload nbbudget.dask

`install` does the same from a client; a second installation keeps every counter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .backends.dask.scheduler import LedgerExtension, install

if TYPE_CHECKING:
    from distributed import Scheduler

__all__ = ["dask_setup", "install"]


def dask_setup(scheduler: Scheduler) -> None:
    """The ``--preload`` entry point: add the ledger to *scheduler* before it starts."""
    scheduler.add_plugin(LedgerExtension(), idempotent=True)
