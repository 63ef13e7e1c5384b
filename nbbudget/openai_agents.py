"""Budgets around the OpenAI Agents SDK (the ``openai-agents`` extra): `Budgeted`, the SDK's
``RunHooks`` that put an agent run's model turns, tool calls and handoffs under an nbbudget run.

The public home of `nbbudget.integrations.openai_agents`, where the adapter and its
documentation live::

    from nbbudget.openai_agents import Budgeted
"""

from __future__ import annotations

from .integrations.openai_agents import OPENAI_AGENTS_NEEDED, Budgeted, BudgetRefused

__all__ = ["OPENAI_AGENTS_NEEDED", "BudgetRefused", "Budgeted"]
