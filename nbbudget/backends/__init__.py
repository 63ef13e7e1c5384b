"""Where a run's counters and a call's work can live besides this process: one folder per
backend (`nbbudget.backends.dask`: a Dask cluster), loaded by name when a run or a call is given
a cluster (`nbbudget.core.backends.load`), the way anyio loads its event-loop backends.

A backend implements the seams of `nbbudget.core` and `nbbudget.calls` in full; nothing outside
its folder imports its modules or names its classes. Internal: users import `nbbudget` (and
`nbbudget.dask` for a scheduler's ``--preload``).
"""
