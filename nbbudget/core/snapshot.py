"""A frozen view of a run at one moment, for the panel, the DataFrame and the repr alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .outcome import Outcome

__all__ = ["AxisUsage", "ModelUsage", "Snapshot"]


@dataclass(frozen=True)
class AxisUsage:
    """One armed axis of a run at one moment."""

    kind: str
    limit: float
    consumed: float
    remaining: float
    fraction: float


@dataclass(frozen=True)
class ModelUsage:
    """What a run or grant spent on one model at one moment: the model calls it sent (every
    attempt, as ``provider_calls`` counts them, S4-6), the input tokens (cached ones included)
    and output tokens their replies reported, and what they cost (None: no price was known for
    any of them). ``run.usage(by="model")``, the panel and ``%budget status`` show it."""

    provider: str
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None


@dataclass(frozen=True)
class Snapshot:
    """A frozen view of a run, for the panel, the DataFrame and the repr alike."""

    name: str
    status: str
    elapsed_ms: float
    remaining_ms: float | None
    axes: tuple[AxisUsage, ...]
    consumed: Mapping[str, float]
    notice_level: int
    outcome: Outcome | None
    #: what it spent on each model it called, in the order it first called them
    models: tuple[ModelUsage, ...] = ()
