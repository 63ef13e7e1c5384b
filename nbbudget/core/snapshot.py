"""A frozen view of a run at one moment, for the panel, the DataFrame and the repr alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .outcome import Outcome

__all__ = ["AxisUsage", "Snapshot"]


@dataclass(frozen=True)
class AxisUsage:
    """One armed axis of a run at one moment."""

    kind: str
    limit: float
    consumed: float
    remaining: float
    fraction: float


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
