"""The table of budget kinds: one row drives checking, attribution and messages for each kind."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["KINDS", "KIND_INDEX", "Kind", "kind_index"]


class Kind(NamedTuple):
    """One budget axis.

    ``rank`` is the attribution order when several limits trip at one boundary (S3-3): the
    lowest rank wins. ``integral`` kinds take whole numbers; ``cost_usd`` takes dollars.
    """

    name: str
    code: str
    rank: int
    integral: bool
    unit: str


KINDS: tuple[Kind, ...] = (
    Kind("tokens", "TokenBudgetExceeded", 0, True, "tokens"),
    Kind("output_tokens", "OutputTokenBudgetExceeded", 1, True, "tokens"),
    Kind("cost_usd", "CostBudgetExceeded", 2, False, "USD"),
    Kind("turns", "TurnBudgetExceeded", 3, True, "turns"),
    Kind("steps", "StepBudgetExceeded", 4, True, "steps"),
    Kind("tool_calls", "ToolCallBudgetExceeded", 4, True, "calls"),
    Kind("agent_invocations", "AgentInvocationBudgetExceeded", 4, True, "invocations"),
    Kind("provider_calls", "ProviderCallBudgetExceeded", 4, True, "calls"),
    Kind("run_ms", "RunTimeBudgetExceeded", 5, True, "ms"),
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
        from ._errors import ConfigError

        raise ConfigError(
            f"{kind!r} is not a budget kind; use one of: {', '.join(table)}"
        ) from None
