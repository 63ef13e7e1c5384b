"""The Dask backend (``pip install 'nbbudget[dask]'``): a run's counters kept on a cluster's
scheduler (`ledger`, in the extension of `scheduler`), calls' work run as tasks on its workers
(`runner`), their output, heartbeats and checkpoints shipped to the kernel (`output`), and the
connection to a cluster named by its address (`connect`).

The only modules of nbbudget that import ``distributed``. Loaded by name
(`nbbudget.core.backends.load`), never imported by the layers below.
"""
