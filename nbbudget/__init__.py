"""nbbudget: budgets for Jupyter and for plain Python.

``import nbbudget as nb``: run limits, step and time grants, cancellation, watched tools and
traces (`budget`, `Limits`, `Trace`). In IPython, ``%load_ext nbbudget``.
"""

from __future__ import annotations

from ._budget import Budget, Grant, Snapshot, budget, current
from ._duration import parse_duration
from ._errors import (
    BudgetCut,
    BudgetError,
    BudgetExceeded,
    Cancelled,
    ConfigError,
    WideningError,
)
from ._limits import Limits, Manifest
from ._outcome import Outcome, Status
from ._tool import ToolContext
from ._trace import Event, Replay, Trace

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "BudgetCut",
    "BudgetError",
    "BudgetExceeded",
    "Cancelled",
    "ConfigError",
    "Event",
    "Grant",
    "Limits",
    "Manifest",
    "Outcome",
    "Replay",
    "Snapshot",
    "Status",
    "ToolContext",
    "Trace",
    "WideningError",
    "budget",
    "current",
    "parse_duration",
]
