"""How a run ended: `Outcome`, and the stop reasons that lead to it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["Outcome", "Status"]


class Status(str, enum.Enum):
    """The status of a finished run (S2-4, S3-1, S3-2, S4-7, S0-1)."""

    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"
    INCOMPLETE = "incomplete"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Outcome:
    """The end of a run.

    ``status`` is a `Status`; ``cause`` says why (``"budget-cut"``, ``"user"``, ``"error"``,
    ``"wall-clock"``, ``"window"``); ``by`` names what cut it (``"timeout"``, ``"watchdog"``,
    ``"stream-error"`` or a limit's kind); ``code`` is the error code (``"StepBudgetExceeded"``…);
    ``output`` is what the run had produced when it failed, where there was any (S3-2);
    ``origin`` names the run whose stop this was, when it was inherited from an ancestor (S2-3).
    """

    status: Status
    cause: str | None = None
    by: str | None = None
    code: str | None = None
    message: str | None = None
    output: Any = None
    origin: str | None = None
    degraded: Any = None

    @property
    def ok(self) -> bool:
        return self.status is Status.COMPLETED

    def to_dict(self) -> dict[str, Any]:
        out = {"status": self.status.value, "cause": self.cause, "by": self.by,
               "code": self.code, "message": self.message, "origin": self.origin}
        return {k: v for k, v in out.items() if v is not None}

    def __repr__(self) -> str:
        parts = [f"status={self.status.value!r}"]
        parts += [f"{k}={v!r}" for k, v in self.to_dict().items() if k != "status"]
        return f"Outcome({', '.join(parts)})"
