"""The core: kinds, limits, clocks, the ledger, the scope, the trace and the low-level run.

Pure standard library (pandas and matplotlib only when a frame or a plot is asked for). It
imports nothing from the layers above it: `nbbudget.run`, `nbbudget.calls`,
`nbbudget.jupyter`, `nbbudget.cli`. Internal: users import `nbbudget`.
"""
