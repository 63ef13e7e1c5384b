"""Anthropic's Messages API as ``nb.instrument`` reads it (``POST /v1/messages``).

The output cap is ``max_tokens`` (always given: the API requires it). Usage: ``input_tokens``
counts only the input read neither from nor into the cache, so the input is ``input_tokens +
cache_read_input_tokens + cache_creation_input_tokens``; ``output_tokens`` includes thinking. A
stream reports the input in ``message_start`` and the output, cumulative, in ``message_delta``;
its text comes in ``content_block_delta`` events of type ``text_delta``. Token counts are whole
numbers >= 0; anything else, or a message or ``message_delta`` without them, is
`shapes.Unreadable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:
    from anthropic import AnthropicError as _SdkError
except ImportError:  # the wire format, spoken by another library: nbbudget's errors
    _SdkError = Exception  # type: ignore[assignment,misc]

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import MISSING, Shape, Unreadable, count

__all__ = ["MESSAGES", "PROVIDER", "Cut", "Refused", "Unpriced"]

#: the provider's name in genai-prices
PROVIDER = "anthropic"


class Refused(BudgetExceeded, _SdkError):
    """A request the budget refused before it was sent: nbbudget's `BudgetExceeded` and the
    SDK's `AnthropicError` at once (the SDK would take any other error raised while sending for
    a connection error, and retry it)."""


class Cut(BudgetCut, _SdkError):
    """A request or stream cut by the budget; ``salvage`` is the text received so far."""

    salvage: str = ""


class Unpriced(ConfigError, _SdkError):
    """A request naming a model with no known price while ``cost_usd`` is limited."""


def _usage(usage: Mapping[str, Any]) -> dict[str, float]:
    """A message's usage (a reply's, ``message_start``'s): every figure it reports."""
    read = count(usage, "cache_read_input_tokens", required=False)
    written = count(usage, "cache_creation_input_tokens", required=False)
    return {"output_tokens": count(usage, "output_tokens"),
            "input_tokens": count(usage, "input_tokens") + read + written,
            "cache_read_tokens": read, "cache_write_tokens": written}


def _delta_usage(usage: Mapping[str, Any]) -> dict[str, float]:
    """``message_delta``'s usage: the output so far, and the input where it reports it."""
    if "input_tokens" in usage or usage.get("cache_read_input_tokens") or usage.get(
            "cache_creation_input_tokens"):
        return _usage(usage)
    return {"output_tokens": count(usage, "output_tokens")}


def _stream_usage(event: Mapping[str, Any]) -> dict[str, float] | None:
    kind = event.get("type")
    if kind == "message_start":
        message = event.get("message")
        usage = message.get("usage") if type(message) is dict else None
        read = _usage
    elif kind == "message_delta":
        usage, read = event.get("usage"), _delta_usage
    else:
        return None
    if type(usage) is not dict:
        raise Unreadable("usage", MISSING if usage is None else usage)
    return read(usage)


def _text(event: Mapping[str, Any]) -> str:
    delta = event.get("delta") if event.get("type") == "content_block_delta" else None
    if isinstance(delta, dict) and delta.get("type") == "text_delta":
        return str(delta.get("text") or "")
    return ""


def _reply_text(body: Mapping[str, Any]) -> str:
    return "".join(block.get("text") or "" for block in body.get("content") or ()
                   if block.get("type") == "text")


#: Messages (``POST /v1/messages``), for `instrument`
MESSAGES = Shape(
    name="messages", path="/messages", cap_keys=("max_tokens",),
    ask_usage=lambda body: False, usage=_usage, stream_usage=_stream_usage,
    settles=lambda event: event.get("type") == "message_delta", final=(b"message_delta",),
    stream_text=_text,
    reply_text=_reply_text, hidden=lambda event: False,
    delta_bytes=len('"type":"content_block_delta""type":"text_delta""text":"x"'))
