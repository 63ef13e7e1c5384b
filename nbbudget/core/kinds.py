"""The table of budget kinds: one row drives checking, attribution and messages for each kind."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["KINDS", "KIND_INDEX", "Kind", "kind_index"]


class Kind(NamedTuple):
    """One budget axis.

    ``rank`` is the attribution order when several limits trip at one boundary (S3-3): the
    lowest rank wins. ``integral`` kinds take whole numbers; ``cost_usd`` takes dollars.
    ``flag`` is its option in ``%%budget`` and ``nbbudget run``, ``about`` that option's help.
    """

    name: str
    code: str
    rank: int
    integral: bool
    unit: str
    flag: str
    about: str


KINDS: tuple[Kind, ...] = (
    Kind("tokens", "TokenBudgetExceeded", 0, True, "tokens", "--tokens", "limit on tokens"),
    Kind("output_tokens", "OutputTokenBudgetExceeded", 1, True, "tokens",
         "--output-tokens", "limit on output tokens"),
    Kind("cost_usd", "CostBudgetExceeded", 2, False, "USD", "--cost", "limit on cost, in dollars"),
    Kind("turns", "TurnBudgetExceeded", 3, True, "turns", "--turns", "limit on turns"),
    Kind("steps", "StepBudgetExceeded", 4, True, "steps", "--steps", "limit on steps"),
    Kind("tool_calls", "ToolCallBudgetExceeded", 4, True, "calls",
         "--tool-calls", "limit on tool calls"),
    Kind("agent_invocations", "AgentInvocationBudgetExceeded", 4, True, "invocations",
         "--agent-invocations", "limit on sub-agents"),
    Kind("provider_calls", "ProviderCallBudgetExceeded", 4, True, "calls",
         "--provider-calls", "limit on model calls"),
    Kind("run_ms", "RunTimeBudgetExceeded", 5, True, "ms",
         "--time", "time grant of the run (run_ms): when it is spent the run fails"),
)
KIND_INDEX: dict[str, int] = {k.name: i for i, k in enumerate(KINDS)}
RUN_MS = KIND_INDEX["run_ms"]
STEPS = KIND_INDEX["steps"]
TOOL_CALLS = KIND_INDEX["tool_calls"]
#: the kinds a run charges through ``charge()``; time is spent by the clock, not charged.
CHARGEABLE = tuple(k.name for k in KINDS if k.name != "run_ms")


CHARGE_INDEX: dict[str, int] = {name: KIND_INDEX[name] for name in CHARGEABLE}


def kind_index(kind: object, *, chargeable: bool = False) -> int:
    """The index of *kind* in `KINDS`; a `ConfigError` naming the kind when it is unknown (or,
    with *chargeable*, when it is time, which the clock spends)."""
    table = CHARGE_INDEX if chargeable else KIND_INDEX
    try:
        return table[kind]  # type: ignore[index]
    except (KeyError, TypeError):
        from .errors import ConfigError

        raise ConfigError(
            f"{kind!r} is not a budget kind; use one of: {', '.join(table)}"
        ) from None
