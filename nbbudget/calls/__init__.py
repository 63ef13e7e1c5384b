"""Call budgets (seed 000): `nb.call`, background jobs, the worker threads, the response
envelope and the durable store of checkpoints and job records.

Imports only `nbbudget.core` and `nbbudget.run`. Internal: users import `nbbudget`.
"""
