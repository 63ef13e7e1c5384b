"""The response envelope of a call (S0-12)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..core.endings import EXIT_CANCELLED, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_STOPPED

__all__ = ["EXIT_CANCELLED", "EXIT_FAILED", "EXIT_INCOMPLETE", "EXIT_OK", "EXIT_STOPPED",
           "Response", "meta"]

def meta(exit_code: int, started: float, budget_ms: int | None,
         timeout_ms: int | None) -> dict[str, Any]:
    """The ``meta`` of an envelope: the exit code, the milliseconds since *started* (a
    `time.monotonic` reading), the call budget in force (none: absent, S0-5, S0-8) and the
    wall-clock limit, when there is one."""
    out: dict[str, Any] = {"exit_code": exit_code,
                           "duration_ms": round((time.monotonic() - started) * 1000)}
    if budget_ms is not None:
        out["budget_ms"] = budget_ms
    if timeout_ms is not None:
        out["timeout_ms"] = timeout_ms
    return out


@dataclass(init=False)
class Response:
    """What a call answers: ``{"ok", "data", "error", "warnings", "meta"}``.

    ``meta`` holds ``exit_code``, ``duration_ms``, ``budget_ms`` (the call budget in force; absent
    when none applies, S0-5, S0-8) and ``timeout_ms`` (when a wall-clock limit is set). Exit codes:
    0 done, 1 failed, 14 INCOMPLETE (the work goes on or is paused), 124 cancelled by the wall
    clock, 130 stopped by a person.
    """

    ok: bool
    data: Any = None
    error: dict[str, str] | None = None
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    #: the manifest's ``transport.envelopeBytes`` in force for this response, if any (S2-8)
    envelope_bytes: int | None = field(default=None, repr=False, compare=False)
    #: the `nb.Job` that ran the work (its exception, traceback and run), when there was one
    #: (made when first read, for a call that ended in time and so made none)
    job: Any = field(default=None, repr=False, compare=False)
    #: the error that refused the call before its work started (a refused checkpoint, a damaged
    #: store, a spent quota of runs per day), when that is how it ended
    refusal: BaseException | None = field(default=None, repr=False, compare=False)

    def __init__(self, ok: bool, data: Any = None, error: dict[str, str] | None = None,
                 warnings: list[str] | None = None, meta: dict[str, Any] | None = None,
                 envelope_bytes: int | None = None, job: Any = None,
                 refusal: BaseException | None = None) -> None:
        self.ok, self.data, self.error = ok, data, error
        self.warnings = [] if warnings is None else warnings
        self.meta = {} if meta is None else meta
        self.envelope_bytes = envelope_bytes
        self._job = job  # a `Job`, None, or what makes one when first read (`job`)
        self.refusal = refusal

    @property
    def exit_code(self) -> int:
        return int(self.meta.get("exit_code", EXIT_OK if self.ok else EXIT_FAILED))

    @property
    def incomplete(self) -> bool:
        """Whether the work is still running (detach) or paused (resume)."""
        return self.exit_code == EXIT_INCOMPLETE

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "data": self.data, "error": self.error,
                "warnings": list(self.warnings), "meta": dict(self.meta)}

    def to_json(self, *, envelope_bytes: int | None = None, indent: int | None = None) -> str:
        """The envelope as JSON. With *envelope_bytes* (S2-8), a response larger than that many
        UTF-8 bytes has its ``data`` cut to a preview, with a warning; it is never sent whole."""
        text = _dump(self.to_dict(), indent)
        if envelope_bytes is None:
            envelope_bytes = self.envelope_bytes
        if envelope_bytes is None or len(text.encode()) <= envelope_bytes:
            return text
        return _truncate(self, len(text.encode()), envelope_bytes, indent)

    def __repr__(self) -> str:
        return (f"Response(ok={self.ok}, exit_code={self.exit_code}, data={_short(self.data)}, "
                f"error={self.error})")


def _read_job(self: Response) -> Any:
    job = self._job
    if callable(job):  # what makes the job of a call that made none: made once, when read
        job = self._job = job()
    return job


def _write_job(self: Response, job: Any) -> None:
    self._job = job


# ``job`` is a field (given to ``__init__``, listed by `dataclasses.fields`) read through this
Response.job = property(_read_job, _write_job,
                        doc="The `nb.Job` that ran the work, when there was one.")


def _dump(obj: Any, indent: int | None) -> str:
    return json.dumps(obj, default=repr, ensure_ascii=False, indent=indent)


def _truncate(resp: Response, size: int, limit: int, indent: int | None) -> str:
    """Cut the envelope to *limit* UTF-8 bytes: first the data (to a preview), then the error's
    message, then the other warnings; the five keys and the error code always stay."""
    warning = (f"the response was {size} bytes, more than envelopeBytes={limit}; "
               f"data was truncated")
    env = resp.to_dict()
    env["warnings"] = [*resp.warnings, warning]
    preview = _dump(resp.data, None)
    env["data"] = {"truncated": True, "bytes": size, "preview": preview}
    cuts = [(env["data"], "preview")]
    if env["error"] is not None:
        env["error"] = dict(env["error"])
        cuts.append((env["error"], "message"))
    for holder, key in cuts:
        text = _fit(env, holder, key, limit, indent)
        if text is not None:
            return text
    env["warnings"] = [warning]
    return _dump(env, indent)  # the smallest envelope there is, even if over a tiny limit


def _fit(env: dict[str, Any], holder: dict[str, Any], key: str, limit: int,
         indent: int | None) -> str | None:
    """Shorten the text ``holder[key]`` to the longest prefix whose envelope fits in *limit*
    UTF-8 bytes (a binary search on characters); None when even "" is too big."""
    full = holder[key]

    def fits(keep: int) -> str | None:
        holder[key] = full[:keep]
        text = _dump(env, indent)
        return text if len(text.encode()) <= limit else None

    if fits(0) is None:
        holder[key] = full
        return None
    low, high = 0, len(full)  # fits(low) holds; find the largest such keep
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid) is not None:
            low = mid
        else:
            high = mid - 1
    return fits(low)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
