"""Runs for agents: the `Budget` facade users hold, and the helpers it makes (tools, providers,
sub-agents and parallel branches), built on `nbbudget.core.lowlevel`.

Imports only `nbbudget.core`. Internal: users import `nbbudget`.
"""
