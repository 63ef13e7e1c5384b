"""Budgets around pydantic-ai agents (the ``pydantic-ai`` extra): `Budgeted`, a pydantic-ai
capability that puts an agent run's model requests and tool calls under an nbbudget run.

The public home of `nbbudget.integrations.pydantic_ai`, where the adapter and its documentation
live::

    from nbbudget.pydantic_ai import Budgeted
"""

from __future__ import annotations

from .integrations.pydantic_ai import PYDANTIC_AI_NEEDED, Budgeted, UsageLimitCut, UsageLimitRefused

__all__ = ["PYDANTIC_AI_NEEDED", "Budgeted", "UsageLimitCut", "UsageLimitRefused"]
