"""Anthropic's Messages API as ``nb.instrument`` reads it (``POST /v1/messages``).

The output cap is ``max_tokens`` (always given: the API requires it). Usage: ``input_tokens``
counts only the input read neither from nor into the cache, so the input is ``input_tokens +
cache_read_input_tokens + cache_creation_input_tokens``; ``output_tokens`` includes thinking. A
stream reports the input in ``message_start`` and the output, cumulative, in ``message_delta``;
its text comes in ``content_block_delta`` events of type ``text_delta``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anthropic import AnthropicError

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import Shape

__all__ = ["MESSAGES", "PROVIDER", "Cut", "Refused", "Unpriced"]

#: the provider's name in genai-prices
PROVIDER = "anthropic"


class Refused(BudgetExceeded, AnthropicError):
    """A request the budget refused before it was sent: nbbudget's `BudgetExceeded` and the
    SDK's `AnthropicError` at once (the SDK would take any other error raised while sending for
    a connection error, and retry it)."""


class Cut(BudgetCut, AnthropicError):
    """A request or stream cut by the budget; ``salvage`` is the text received so far."""

    salvage: str = ""


class Unpriced(ConfigError, AnthropicError):
    """A request naming a model with no known price while ``cost_usd`` is limited."""


def _usage(usage: Mapping[str, Any]) -> dict[str, int]:
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    out = int(usage.get("output_tokens") or 0)
    if "input_tokens" in usage or read or written:
        return {"output_tokens": out,
                "input_tokens": int(usage.get("input_tokens") or 0) + read + written,
                "cache_read_tokens": read, "cache_write_tokens": written}
    return {"output_tokens": out}


def _stream_usage(event: Mapping[str, Any]) -> dict[str, int] | None:
    kind = event.get("type")
    if kind == "message_start":
        usage = (event.get("message") or {}).get("usage")
    elif kind == "message_delta":
        usage = event.get("usage")
    else:
        return None
    return _usage(usage) if isinstance(usage, dict) else None


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
    ask_usage=lambda body: False, usage=_usage, stream_usage=_stream_usage, stream_text=_text,
    reply_text=_reply_text, hidden=lambda event: False,
    text_marker=b'"type":"text_delta"')
