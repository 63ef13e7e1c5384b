"""Budgets around the Claude Agent SDK (the ``claude-agent`` extra): `Budgeted`, which passes an
nbbudget run's limits to Claude Code as its own, counts its tool uses through its hooks, charges
what it reports and stops it when the run stops.

The public home of `nbbudget.integrations.claude_agent`, where the adapter and its
documentation live::

    from nbbudget.claude_agent import Budgeted
"""

from __future__ import annotations

from .integrations.claude_agent import CLAUDE_AGENT_NEEDED, Budgeted

__all__ = ["CLAUDE_AGENT_NEEDED", "Budgeted"]
