"""Google's Gemini API as ``nb.instrument`` reads it: ``generateContent`` and
``streamGenerateContent`` (``POST .../models/{model}:generateContent``), as the ``google-genai``
SDK speaks it to the Gemini API and to Vertex AI.

The model is named in the path, not the body (``models/gemini-2.5-flash``: read as
``gemini-2.5-flash``). The output cap is ``generationConfig.maxOutputTokens``, per candidate:
``generationConfig.candidateCount`` candidates may each write up to it. Usage is the reply's
``usageMetadata``: ``promptTokenCount`` is the whole input, the cached content included
(``cachedContentTokenCount``, charged as cache reads), and ``toolUsePromptTokenCount`` the input
of the provider's own tools (search results), which is input too; the output is
``candidatesTokenCount`` plus ``thoughtsTokenCount`` (thinking). The JSON leaves out a count
that is 0 (proto3's JSON), so only ``promptTokenCount`` must be there; a count that is there
must be a whole number >= 0, and a reply without ``usageMetadata`` is `shapes.Unreadable`.

A stream (``?alt=sse``: server-sent events, each a whole response) reports ``usageMetadata``
in its chunks, as running totals, and the final usage in its last chunk, the one whose
candidate says why it finished (``finishReason``) or whose prompt was blocked
(``promptFeedback.blockReason``); that chunk without ``usageMetadata`` is unreadable usage.
Its text is the candidates' text parts, thoughts left out. A ``streamGenerateContent`` asked
without ``alt=sse`` answers one JSON array instead, which the meter cannot read: under a token
or cost limit that is unreadable usage (N-7), never an unbounded stream.

The SDK sends each request once unless it is given ``HttpOptions(retry_options=...)``, and
passes on an error raised while sending as it is: ``Refused`` and ``Cut`` are its ``APIError``
as well as nbbudget's errors, with no HTTP status (``code`` is nbbudget's error code for a
refusal, else None), so that its retry options never retry them. Its automatic continuation
resumes a stream that failed after a chunk gave it a continuation token, with a new request: a
run that was cut refuses it unsent, and the SDK passes that ``APIError``, raised before any
chunk, on at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:
    from google.genai.errors import APIError as _ApiError
except ImportError:  # the wire format, spoken by another library: nbbudget's errors
    _ApiError = Exception  # type: ignore[assignment,misc]

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import MISSING, Shape, Unreadable, count

__all__ = ["EXTRA", "GENERATE", "PROVIDER", "STREAM", "Cut", "Refused", "Unpriced"]

#: the provider's name in genai-prices (the Gemini API's, whose URLs are googleapis.com's)
PROVIDER = "google"
#: the extra of nbbudget that installs the SDK and genai-prices
EXTRA = "gemini"
_WHERE = "usageMetadata"


class _SdkError(_ApiError):
    """The SDK's ``APIError`` as nbbudget's errors take it on: made as a plain exception (the
    SDK's own constructor wants an HTTP reply there is none of) and pickled as its own class."""

    code: Any = None  # no HTTP status: the SDK's retry options retry none of these
    response: Any = None
    details: Any = None

    def __init__(self, *args: Any) -> None:
        Exception.__init__(self, *args)

    def __reduce__(self) -> Any:
        return Exception.__reduce__(self)

    @property
    def message(self) -> str:  # type: ignore[override]  # the SDK's is the reply's message
        """What happened, as ``str(error)`` says it."""
        return str(self)


class Refused(BudgetExceeded, _SdkError):
    """A request the budget refused before it was sent: nbbudget's `BudgetExceeded` and the
    SDK's ``APIError`` at once (the SDK passes both on unchanged, unretried)."""


class Cut(BudgetCut, _SdkError):
    """A request or stream cut by the budget; ``salvage`` is the text received so far."""

    salvage: str = ""


class Unpriced(ConfigError, _SdkError):
    """A request naming a model with no known price while ``cost_usd`` is limited."""


def _model(path: str, body: dict[str, Any]) -> str | None:
    """The model a request's *path* names: what follows its last ``/models/`` (the Gemini
    API's and Vertex AI's), else its last two segments (``tunedModels/123``)."""
    name = path[:path.rfind(":")]
    at = name.rfind("/models/")
    model = name[at + len("/models/"):] if at >= 0 else "/".join(name.split("/")[-2:])
    return model.strip("/") or None


def _usage(usage: Mapping[str, Any], final: bool = True) -> dict[str, float]:
    """A ``usageMetadata`` as figures. Not *final* (a running total in a stream's chunk), the
    input only where it names one: an input not reported yet is not reported as none."""
    output = count(usage, "candidatesTokenCount", _WHERE, required=False) + count(
        usage, "thoughtsTokenCount", _WHERE, required=False)
    figures: dict[str, float] = {
        "output_tokens": output,
        "cache_read_tokens": count(usage, "cachedContentTokenCount", _WHERE, required=False)}
    if final or "promptTokenCount" in usage:
        figures["input_tokens"] = count(usage, "promptTokenCount", _WHERE) + count(
            usage, "toolUsePromptTokenCount", _WHERE, required=False)
    return figures


def _final(event: Mapping[str, Any]) -> bool:
    """Whether *event* is a stream's last chunk: a candidate says why it finished, or the
    prompt was blocked."""
    candidates = event.get("candidates")
    if type(candidates) is list and any(
            type(c) is dict and c.get("finishReason") for c in candidates):
        return True
    feedback = event.get("promptFeedback")
    return type(feedback) is dict and bool(feedback.get("blockReason"))


def _stream_usage(event: Mapping[str, Any]) -> dict[str, float] | None:
    usage = event.get(_WHERE)
    final = _final(event)
    if usage is None:
        if final:
            raise Unreadable(_WHERE, MISSING if _WHERE not in event else None)
        return None
    if type(usage) is not dict:
        raise Unreadable(_WHERE, usage)
    return _usage(usage, final)


def _text(body: Mapping[str, Any]) -> str:
    """The text of a response (a whole reply, a stream's chunk): its candidates' text parts
    that are not thoughts."""
    candidates = body.get("candidates")
    out: list[str] = []
    for candidate in candidates if type(candidates) is list else ():
        content = candidate.get("content") if type(candidate) is dict else None
        parts = content.get("parts") if type(content) is dict else None
        out += [part["text"] for part in parts if type(part) is dict and not part.get(
            "thought") and type(part.get("text")) is str] if type(parts) is list else []
    return "".join(out)


def _shape(name: str, method: str, streamed: bool) -> Shape:
    return Shape(
        name=name, path=":" + method, cap_keys=("maxOutputTokens",), cap_in="generationConfig",
        choices="candidateCount", usage_in=_WHERE,
        ask_usage=lambda body: False, usage=_usage, stream_usage=_stream_usage,
        settles=_final, final=(b"finishReason", b"blockReason"),
        stream_text=_text, reply_text=_text, hidden=lambda event: False,
        delta_bytes=len('"candidates":[{"content":{"parts":[{"text":"x"}]}}]'),
        model_of=_model, streamed=lambda path, body: streamed)


#: ``generateContent``: a whole reply, for `instrument`
GENERATE = _shape("generate", "generateContent", False)
#: ``streamGenerateContent``: a stream of whole responses, for `instrument`
STREAM = _shape("stream", "streamGenerateContent", True)
