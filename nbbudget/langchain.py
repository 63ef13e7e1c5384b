"""Budgets around LangChain chat models and LangGraph graphs (the ``langchain`` extra):
`Budgeted`, a LangChain callback handler that puts a call's model calls, tool calls and graph
node runs under an nbbudget run.

The public home of `nbbudget.integrations.langchain`, where the handler and its documentation
live::

    from nbbudget.langchain import Budgeted
"""

from __future__ import annotations

from .integrations.langchain import LANGCHAIN_CORE_NEEDED, Budgeted

__all__ = ["LANGCHAIN_CORE_NEEDED", "Budgeted"]
