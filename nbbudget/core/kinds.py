"""The table of budget kinds: one row per kind, from which everything per kind follows.

A row gives a kind's `Limits` field and JSON keys (``steps``, ``max_steps``), its flag in
``%%budget`` and ``nbbudget run``, its error code, its attribution rank, whether it is counted
in whole numbers, whether it is a window with ``suspend=True`` (S3-1) and whether the run's clock
spends it rather than ``charge()``; the docs' table of kinds is rendered from it at build time.
Adding a kind is one row here, its field in `Limits` (checked against the table at import) and
its tests.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CHARGEABLE", "KINDS", "KIND_INDEX", "POOLED", "RUN_MS", "WINDOWS", "Kind",
           "kind_index"]


class Kind(NamedTuple):
    """One budget axis.

    ``rank`` is the attribution order when several limits trip at one boundary (S3-3): the
    lowest rank wins. ``integral`` kinds take whole numbers; ``cost_usd`` takes dollars.
    ``flag`` is its option in ``%%budget`` and ``nbbudget run``, ``about`` that option's help,
    ``counts`` what it counts (Markdown, for the docs' table). ``window``: with ``suspend=True``
    the run's limit of this kind is a window, which suspends the run when spent (S3-1).
    ``clock``: the run's clock spends it (the time grant), ``charge()`` does not.
    """

    name: str
    code: str
    rank: int
    integral: bool
    unit: str
    flag: str
    about: str
    counts: str
    window: bool = False
    clock: bool = False

    @property
    def key(self) -> str:
        """Its key in run limits JSON with the prefix (``max_steps``); the bare name works too."""
        return f"max_{self.name}"

    @property
    def pooled(self) -> bool:
        """Whether the run leases permits of it ahead into a pool (whole numbers, charged)."""
        return self.integral and not self.clock


#: every kind, in the attribution order: `Limits`, the ledgers, the trace, the frames and the
#: panel each go through it, and the docs render their table of kinds from it
KINDS: tuple[Kind, ...] = (
    Kind("tokens", "TokenBudgetExceeded", 0, True, "tokens", "--tokens", "limit on tokens",
         "the tokens of model replies, input and output (`run.provider`)", window=True),
    Kind("output_tokens", "OutputTokenBudgetExceeded", 1, True, "tokens", "--output-tokens",
         "limit on output tokens",
         "the output tokens of model replies; a request asks for at most what is left"),
    Kind("cost_usd", "CostBudgetExceeded", 2, False, "USD", "--cost", "limit on cost, in dollars",
         "dollars spent on model replies (their `cost_usd`, or from `prices=`)", window=True),
    Kind("turns", "TurnBudgetExceeded", 3, True, "turns", "--turns", "limit on turns",
         "the turns of an agent loop (the pydantic-ai adapter counts each)"),
    Kind("steps", "StepBudgetExceeded", 4, True, "steps", "--steps", "limit on steps",
         "steps: each `run.step()`"),
    Kind("tool_calls", "ToolCallBudgetExceeded", 4, True, "calls", "--tool-calls",
         "limit on tool calls", "calls of tools wrapped by `run.tool`"),
    Kind("agent_invocations", "AgentInvocationBudgetExceeded", 4, True, "invocations",
         "--agent-invocations", "limit on sub-agents", "sub-agents started with `run.agent`"),
    Kind("provider_calls", "ProviderCallBudgetExceeded", 4, True, "calls", "--provider-calls",
         "limit on model calls", "model calls, each attempt and retry"),
    Kind("run_ms", "RunTimeBudgetExceeded", 5, True, "ms", "--time",
         "time grant of the run (run_ms): when it is spent the run fails",
         "the run's active time, paused time not counted: its time grant",
         window=True, clock=True),
)
#: a kind's name to its index in `KINDS`, the index every per-kind tuple of the ledgers, the
#: trace and the run's counters is kept by
KIND_INDEX: dict[str, int] = {k.name: i for i, k in enumerate(KINDS)}
#: the one kind the run's clock spends (its time grant)
(RUN_MS,) = (i for i, k in enumerate(KINDS) if k.clock)
#: the index of ``steps``, which ``run.step()`` and a Dask branch's lease charge without a look-up
STEPS = KIND_INDEX["steps"]
#: the index of ``tool_calls``, which a tool call charges without a look-up (`nbbudget.run.tools`)
TOOL_CALLS = KIND_INDEX["tool_calls"]
#: the kinds a run charges through ``charge()``; time is spent by the clock, not charged.
CHARGEABLE = tuple(k.name for k in KINDS if not k.clock)
#: the kinds whose run limit is a window with ``suspend=True`` (S3-1), by index
WINDOWS = frozenset(i for i, k in enumerate(KINDS) if k.window)
#: per kind index: whether the run leases permits of it into a pool
POOLED = tuple(k.pooled for k in KINDS)


#: `KIND_INDEX` of the chargeable kinds only: ``run.charge()`` refuses time through it
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
